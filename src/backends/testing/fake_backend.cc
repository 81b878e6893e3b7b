#include "backends/testing/fake_backend.h"

#include <sys/socket.h>

namespace dsec::backends::testing {

struct FakeBackend::State {
  mutable Mutex mu;
  std::map<std::string, UniqueFd> agents DSEC_GUARDED_BY(mu);  // far ends of live streams
  std::set<std::string> detached DSEC_GUARDED_BY(mu);
  std::optional<Status> fail_next DSEC_GUARDED_BY(mu);
  int created DSEC_GUARDED_BY(mu) = 0;
  int destroyed DSEC_GUARDED_BY(mu) = 0;
  int orphans DSEC_GUARDED_BY(mu) = 0;
};

namespace {

class FakeInstance : public Instance {
 public:
  FakeInstance(std::shared_ptr<FakeBackend::State> state, SandboxSpec spec)
      : state_(std::move(state)), spec_(std::move(spec)) {
    if (spec_.hostname.empty()) spec_.hostname = spec_.id;
  }

  Kind kind() const override { return Kind::kContainer; }
  const SandboxSpec& spec() const override { return spec_; }

  StatusOr<AgentLink> Start() override {
    {
      MutexLock l(state_->mu);
      if (state_->fail_next) {
        Status s = *state_->fail_next;
        state_->fail_next.reset();
        return s;
      }
    }
    return Connect(/*adopting=*/false);
  }

  StatusOr<AgentLink> Adopt(const std::string& handle) override {
    {
      MutexLock l(state_->mu);
      if (handle != "fake:" + spec_.id || !state_->detached.erase(spec_.id))
        return NotFound("no detached fake sandbox " + spec_.id);
    }
    return Connect(/*adopting=*/true);
  }

  std::string AdoptionHandle() const override { return "fake:" + spec_.id; }
  OomCounter OomKills() override {
    return [] { return uint64_t{0}; };
  }
  Status Pause() override { return OkStatus(); }
  Status Resume() override { return OkStatus(); }
  StatusOr<SandboxStats> Stats() override {
    SandboxStats s;
    s.pids = 1;  // the agent
    s.memory_limit = static_cast<uint64_t>(spec_.resources.memory_mb) << 20;
    s.disk_limit = static_cast<uint64_t>(spec_.resources.disk_mb) << 20;
    return s;
  }
  Status SetMemoryLimit(int64_t bytes) override {
    if (bytes <= 0) return InvalidArgument("memory limit must be positive");
    return OkStatus();
  }
  StatusOr<std::vector<std::string>> CaptureStack(bool, bool, const CaptureProgress&,
                                                  AgentSession*) override {
    return Unimplemented("fake sandboxes have no writable layer to capture");
  }
  net::SandboxNet* Network() override { return nullptr; }  // caps: no network, no port proxy

  Status Destroy() override {
    MutexLock l(state_->mu);
    if (!live_) return OkStatus();
    live_ = false;
    state_->agents.erase(spec_.id);
    state_->destroyed++;
    return OkStatus();
  }

  void Detach() override {
    MutexLock l(state_->mu);
    if (!live_) return;
    live_ = false;
    state_->agents.erase(spec_.id);
    state_->detached.insert(spec_.id);
  }

 private:
  StatusOr<AgentLink> Connect(bool adopting) {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) return ErrnoError("socketpair");
    AgentLink link;
    link.stream.Reset(sp[0]);
    MutexLock l(state_->mu);
    state_->agents[spec_.id].Reset(sp[1]);
    if (!adopting) state_->created++;
    live_ = true;
    return link;
  }

  std::shared_ptr<FakeBackend::State> state_;
  SandboxSpec spec_;
  bool live_ DSEC_GUARDED_BY(state_->mu) = false;
};

}  // namespace

FakeBackend::FakeBackend()
    : state_(std::make_shared<State>()), io_(std::make_unique<IoRunner>(1)) {}

FakeBackend::~FakeBackend() = default;

StatusOr<std::shared_ptr<Sandbox>> FakeBackend::Create(const SandboxSpec& spec) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  return Sandbox::Start(std::make_unique<FakeInstance>(state_, spec), *io_);
}

StatusOr<std::shared_ptr<Sandbox>> FakeBackend::Adopt(const SandboxSpec& spec,
                                                      const std::string& handle) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  return Sandbox::Adopt(std::make_unique<FakeInstance>(state_, spec), *io_, handle);
}

StatusOr<int> FakeBackend::CleanupOrphans() {
  MutexLock l(state_->mu);
  int n = static_cast<int>(state_->detached.size());
  state_->detached.clear();
  state_->orphans += n;
  return n;
}

void FakeBackend::FailNextCreate(Status s) {
  MutexLock l(state_->mu);
  state_->fail_next = std::move(s);
}

void FakeBackend::KillAgent(const std::string& id) {
  MutexLock l(state_->mu);
  state_->agents.erase(id);
}

int FakeBackend::created() const {
  MutexLock l(state_->mu);
  return state_->created;
}

int FakeBackend::destroyed() const {
  MutexLock l(state_->mu);
  return state_->destroyed;
}

size_t FakeBackend::alive() const {
  MutexLock l(state_->mu);
  return state_->agents.size();
}

}  // namespace dsec::backends::testing
