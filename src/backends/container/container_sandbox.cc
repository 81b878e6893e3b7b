#include "backends/container/container_sandbox.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <tuple>

#include "backends/container/container_backend.h"
#include "base/clock.h"
#include "base/fd_passing.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "images/capture.h"
#include "isolation/disk_image.h"
#include "isolation/host_image.h"
#include "isolation/userns.h"
#include "protocol/agent_ops.h"
#include "sys/syscalls.h"

namespace dsec::backends::container {

using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

namespace {

constexpr uint64_t kStdinWindow = 1 << 20;
constexpr uint64_t kMaxPendingStdin = 16 << 20;
constexpr uint64_t kMaxOutputCap = 256ull << 20;
constexpr size_t kInlineStdinMax = 256 * 1024;

Status ReadFrameTimeout(int fd, int timeout_ms, protocol::FrameDecoder* dec, Frame* f) {
  int64_t deadline = MonotonicMs() + timeout_ms;
  char buf[64 * 1024];
  while (!dec->Next(f)) {
    if (dec->failed()) return InternalError("agent sent a malformed frame");
    int64_t left = deadline - MonotonicMs();
    if (left <= 0)
      return DeadlineExceeded("agent did not answer within " + std::to_string(timeout_ms) + " ms");
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno != EINTR) return ErrnoError("poll agent");
    if (r <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return ErrnoError("recv from agent");
    if (n == 0) return Unavailable("agent exited during setup");
    DSEC_RETURN_IF_ERROR(dec->Feed(std::string_view(buf, static_cast<size_t>(n))));
  }
  return OkStatus();
}

// The agent's hello, in a version this edge speaks.
StatusOr<protocol::Hello> DecodeHello(const Frame& f) {
  DSEC_ASSIGN_OR_RETURN(Json j, protocol::ParseJson(f.payload));
  DSEC_ASSIGN_OR_RETURN(auto hello, protocol::DecodeAs<protocol::Hello>(j));
  DSEC_RETURN_IF_ERROR(protocol::CheckVersion(hello));
  return hello;
}

void SetEnv(std::vector<std::string>* env, const std::string& k, const std::string& v) {
  for (auto& e : *env) {
    if (e.size() > k.size() && e.compare(0, k.size(), k) == 0 && e[k.size()] == '=') {
      e = k + "=" + v;
      return;
    }
  }
  env->push_back(k + "=" + v);
}

class ExecHandleImpl : public ExecHandle {
 public:
  ExecHandleImpl(std::weak_ptr<AgentClient> client, uint32_t channel)
      : client_(std::move(client)), channel_(channel) {}

  Status WriteStdin(std::string data) override {
    std::lock_guard<std::mutex> l(mu_);
    if (eof_requested_) return FailedPrecondition("stdin is closed");
    if (pending_.size() + data.size() > kMaxPendingStdin)
      return ResourceExhausted("too much stdin buffered; the command is not reading it");
    pending_ += data;
    PumpLocked();
    return OkStatus();
  }
  void CloseStdin() override {
    std::lock_guard<std::mutex> l(mu_);
    eof_requested_ = true;
    PumpLocked();
  }
  void OnAck(uint64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    inflight_ -= std::min(inflight_, n);
    PumpLocked();
  }
  void Signal(int sig) override { Control({{"signal", sig}}); }
  void Resize(uint16_t cols, uint16_t rows) override { Control({{"resize", {cols, rows}}}); }
  void Kill() override { Control({{"kill", true}}); }

 private:
  void Control(const Json& j) {
    if (auto c = client_.lock()) c->SendControl(channel_, j);
  }
  void PumpLocked() {
    auto c = client_.lock();
    if (!c) return;
    while (inflight_ < kStdinWindow && !pending_.empty()) {
      size_t n =
          std::min<uint64_t>({kStdinWindow - inflight_, pending_.size(), protocol::kDataChunk});
      c->SendData(channel_, protocol::kStdin, pending_.substr(0, n), false);
      pending_.erase(0, n);
      inflight_ += n;
    }
    if (pending_.empty() && eof_requested_ && !eof_sent_) {
      c->SendData(channel_, protocol::kStdin, "", true);
      eof_sent_ = true;
    }
  }

  std::weak_ptr<AgentClient> client_;
  uint32_t channel_;
  std::mutex mu_;
  std::string pending_;
  uint64_t inflight_ = 0;
  bool eof_requested_ = false, eof_sent_ = false;
};

// Relays one exec's (or shell command's) frames to its observer.
class ExecCall : public AgentClient::Call {
 public:
  ExecCall(std::shared_ptr<ExecObserver> obs, std::shared_ptr<OomTracker> oom)
      : obs_(std::move(obs)), oom_(std::move(oom)) {}
  // The call keeps the stdin state alive until the command finishes: a caller may drop its
  // handle right after starting (buffered Exec does) while stdin is still being streamed.
  void set_handle(std::shared_ptr<ExecHandleImpl> h) { handle_ = std::move(h); }

  void OnEvent(const Json& e) override {
    if (auto it = e.find("started"); it != e.end() && it->is_object())
      obs_->OnStart(it->value("pid", 0));
    if (auto it = e.find("stdin_ack"); it != e.end() && it->is_number_unsigned() && handle_)
      handle_->OnAck(it->get<uint64_t>());
  }
  void OnData(uint8_t stream, std::string_view data) override { obs_->OnOutput(stream, data); }
  void OnResponse(StatusOr<Json> r) override {
    handle_.reset();
    if (!r.ok()) return obs_->OnExit(r.status());
    auto res = protocol::ExecResultFromJson(*r);
    if (res.ok() && res->signal == SIGKILL && oom_) res->oom_killed = oom_->CheckNewKill();
    obs_->OnExit(res);
  }

 private:
  std::shared_ptr<ExecObserver> obs_;
  std::shared_ptr<OomTracker> oom_;
  std::shared_ptr<ExecHandleImpl> handle_;
};

}  // namespace

bool OomTracker::CheckNewKill() {
  auto n = cgroup->OomKills();
  if (!n.ok()) return false;
  return *n > seen.exchange(*n);
}

ContainerSandbox::ContainerSandbox(ContainerBackend* backend, SandboxSpec spec)
    : backend_(backend), spec_(std::move(spec)) {
  if (spec_.hostname.empty()) spec_.hostname = spec_.id;
  dir_ = JoinPath(backend_->sandboxes_dir_, spec_.id);
}

ContainerSandbox::~ContainerSandbox() { (void)Destroy(); }

std::string ContainerSandbox::reason() const {
  std::lock_guard<std::mutex> l(mu_);
  return reason_;
}

void ContainerSandbox::MarkFailed(const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  SandboxState s = state_.load();
  if (s == SandboxState::kRunning || s == SandboxState::kPaused) {
    state_ = SandboxState::kFailed;
    reason_ = why;
  }
}

Status ContainerSandbox::Start() {
  std::lock_guard<std::mutex> l(mu_);
  return StartLocked();
}

Status ContainerSandbox::StartLocked() {
  ContainerBackend& b = *backend_;
  // The directory appears under its final name only once its owner lock is held, so orphan
  // cleanup in another process can never take a sandbox that is being created.
  std::string tmp = JoinPath(b.sandboxes_dir_, ".tmp-" + spec_.id);
  if (mkdir(tmp.c_str(), 0700) < 0) {
    if (errno == EEXIST)
      return Status(StatusCode::kAlreadyExists, "sandbox " + spec_.id + " is being created");
    return ErrnoError("mkdir \"" + tmp + "\"");
  }
  tmp_created_ = true;
  lock_fd_.Reset(open(JoinPath(tmp, "owner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd_ || flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0)
    return ErrnoError("lock sandbox dir");
  if (rename(tmp.c_str(), dir_.c_str()) < 0) {
    Status s = errno == EEXIST || errno == ENOTEMPTY
                   ? Status(StatusCode::kAlreadyExists, "sandbox " + spec_.id + " already exists")
                   : ErrnoError("rename \"" + tmp + "\"");
    (void)RemoveTree(tmp);
    tmp_created_ = false;
    dir_.clear();  // not ours: Destroy must not touch it
    return s;
  }
  tmp_created_ = false;

  if (spec_.image == "host") {
    stack_.base = "host";
  } else {
    std::vector<std::string> names;
    for (auto n : SplitString(spec_.image, ',', /*skip_empty=*/true)) names.emplace_back(n);
    DSEC_ASSIGN_OR_RETURN(stack_, b.opts_.image_store->Acquire(names, spec_.id));
    holds_image_ = true;
    // The image's environment, under what the caller asked for.
    for (const auto& kv : stack_.config.env) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      spec_.env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
    }
  }

  bool userns = b.features_.userns;
  uint32_t root_uid = 0;
  if (userns) {
    // A host-wide lease: no other edge on this host gives its sandboxes these ids.
    DSEC_ASSIGN_OR_RETURN(isolation::UidLease lease, b.uid_ranges_->Acquire());
    uid_slot_ = lease.slot;
    uid_lease_ = std::move(lease.fd);
    root_uid = lease.first_id;
    id_base_ = root_uid;
  }

  // Big writable layers are disk images; smaller ones a tmpfs, whose pages count as memory.
  disk_image_ = spec_.disk_mb > b.opts_.tmpfs_disk_max_mb;
  isolation::CgroupLimits limits;
  limits.memory_bytes = (spec_.memory_mb + (disk_image_ ? 0 : spec_.disk_mb)) << 20;
  limits.pids = spec_.pids;
  limits.cpus = spec_.cpus;
  DSEC_ASSIGN_OR_RETURN(auto cg, b.cgroups_->CreateSandbox(spec_.id, limits));
  cgroup_ = std::move(cg);
  oom_ = std::make_shared<OomTracker>();
  oom_->cgroup = cgroup_;
  if (userns) DSEC_RETURN_IF_ERROR(cgroup_->Delegate(root_uid, root_uid));
  // Before any process is in the cgroup: every socket of the sandbox is counted.
  if (b.socket_budget_ && cgroup_->CloneIntoFd() >= 0) {
    uint64_t limit = std::max<uint64_t>(
        256, static_cast<uint64_t>(limits.memory_bytes >> 20) * b.opts_.sockets_per_mb);
    DSEC_RETURN_IF_ERROR(b.socket_budget_->Attach(cgroup_->CloneIntoFd(), limit));
  }

  if (b.netns_) {
    DSEC_ASSIGN_OR_RETURN(netns_, b.netns_->Acquire());
  }
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) return ErrnoError("socketpair");
  UniqueFd conn(sp[0]), child_end(sp[1]);
  LaunchRequest lr;
  lr.agent_memfd = b.agent_memfd_.get();
  lr.channel_fd = child_end.get();
  lr.userns = userns;
  // The user namespace's owner: the last id of the sandbox's own range, not root, so the
  // budgets the kernel charges to a namespace's owner (pending signals, message queues,
  // inotify instances, namespaces) are this sandbox's alone, never the edge's or a neighbour's.
  if (userns) lr.userns_owner = root_uid + (b.uid_ranges_->options().size - 1);
  bool clone_into = b.features_.clone_into_cgroup && cgroup_->CloneIntoFd() >= 0;
  lr.cgroup_fd = clone_into ? cgroup_->CloneIntoFd() : -1;
  lr.netns_fd = netns_.ns.get();
  DSEC_ASSIGN_OR_RETURN(PendingAgent pending, b.launcher_->Launch(lr));
  agent_ = std::make_unique<PendingAgent>(std::move(pending));
  agent_pid_ = agent_->pid();
  child_end.Reset();

  UniqueFd userns_fd;
  if (userns) {
    DSEC_RETURN_IF_ERROR(isolation::WriteIdMaps(agent_pid_, {root_uid, 65536}));
    DSEC_ASSIGN_OR_RETURN(userns_fd, isolation::OpenUserns(agent_pid_));
  }
  DSEC_RETURN_IF_ERROR(cgroup_->AddProcess(agent_pid_, clone_into));
  // Keep the agent from being the OOM victim. Best effort: some hosts refuse negative
  // values even to root; user processes start at +500 (spawn.cc) so they go first anyway.
  (void)WriteStringToFile("/proc/" + std::to_string(agent_pid_) + "/oom_score_adj", "-1000");
  DSEC_RETURN_IF_ERROR(agent_->Release());
  DSEC_RETURN_IF_ERROR(Handshake(conn.get(), userns_fd.get()));

  StartClient(std::move(conn));
  state_ = SandboxState::kRunning;
  // Running now: what only the start needed goes (each is a descriptor per live sandbox).
  agent_->DropPidfd();
  cgroup_->ReleaseCloneFd();
  return OkStatus();
}

void ContainerSandbox::StartClient(UniqueFd conn) {
  client_ = AgentClient::Create(backend_->io_->io(), std::move(conn));
  std::weak_ptr<ContainerSandbox> weak = weak_from_this();
  client_->Start([weak](const Status&) {
    auto self = weak.lock();
    if (!self) return;
    // The agent is PID 1: if it is gone, so is everything else. Tell an OOM kill apart.
    bool oom = self->oom_ && self->oom_->cgroup->OomKills().value_or(0) > self->oom_->seen.load();
    self->MarkFailed(oom ? "oom" : "agent exited");
  });
}

Status ContainerSandbox::Adopt(const std::string& handle) {
  std::lock_guard<std::mutex> l(mu_);
  return AdoptLocked(handle);
}

Status ContainerSandbox::AdoptLocked(const std::string& handle) {
  ContainerBackend& b = *backend_;
  DSEC_ASSIGN_OR_RETURN(Json h, protocol::ParseJson(handle));
  DSEC_ASSIGN_OR_RETURN(secret_, protocol::GetString(h, "secret"));
  DSEC_ASSIGN_OR_RETURN(int64_t slot, protocol::GetInt(h, "uid_slot", -1, -1, INT32_MAX));
  if (secret_.empty()) return InvalidArgument("adoption handle has no secret");

  lock_fd_.Reset(open(JoinPath(dir_, "owner.lock").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock_fd_) {
    Status s = ErrnoError("open \"" + JoinPath(dir_, "owner.lock") + "\"");
    dir_.clear();  // nothing of ours to clean up here
    return s;
  }
  if (flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0) {
    lock_fd_.Reset();
    dir_.clear();  // another live process owns it: hands off
    return Status(StatusCode::kAlreadyExists,
                  "sandbox " + spec_.id + " is owned by another process");
  }
  if (slot >= 0) {
    if (!b.uid_ranges_) return FailedPrecondition("user namespaces are off on this edge");
    // The agent holds the lease (a sandbox from an edge before leases: we hold it now).
    DSEC_ASSIGN_OR_RETURN(uid_lease_, b.uid_ranges_->Claim(static_cast<uint32_t>(slot)));
    uid_slot_ = slot;
  }
  // What snapshots need (absent in handles of older edges: those sandboxes cannot snapshot).
  layer_fd_ = static_cast<int>(h.value("layer_fd", -1));
  id_base_ = h.value("id_base", uint32_t{0});
  disk_image_ = h.value("disk_image", false);
  if (auto it = h.find("overlays"); it != h.end() && it->is_array())
    for (const auto& t : *it)
      if (t.is_string()) overlay_targets_.push_back(t.get<std::string>());
  stack_.base = "host";
  if (auto it = h.find("stack"); it != h.end() && it->is_object()) {
    stack_.base = it->value("base", "host");
    if (b.opts_.image_store)
      for (const auto& d : it->value("layers", Json::array()))
        if (d.is_string())
          if (auto l = b.opts_.image_store->GetLayer(d.get<std::string>()); l.ok())
            stack_.layers.push_back(*l);
    holds_image_ = !stack_.layers.empty();
  }
  DSEC_ASSIGN_OR_RETURN(auto cg, b.cgroups_->OpenSandbox(spec_.id));
  cgroup_ = std::move(cg);
  oom_ = std::make_shared<OomTracker>();
  oom_->cgroup = cgroup_;
  oom_->seen = cgroup_->OomKills().value_or(0);
  // A frozen agent cannot answer: thaw for the handshake, freeze again after.
  bool frozen = cgroup_->IsFrozen().value_or(false);
  if (frozen) DSEC_RETURN_IF_ERROR(cgroup_->Thaw());

  DSEC_ASSIGN_OR_RETURN(UniqueFd dirfd, OpenDir(dir_, O_PATH));
  UniqueFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!conn) return ErrnoError("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/agent.sock", dirfd.get());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("connect to the agent of " + spec_.id);
  // Whoever listens there must be this sandbox's agent: PID 1 of a pid namespace, in its cgroup.
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0)
    return ErrnoError("SO_PEERCRED agent.sock");
  if (!InOwnCgroup(cred.pid))
    return FailedPrecondition("the process behind agent.sock is not in sandbox " + spec_.id);
  // (No pidfd is kept for it: one descriptor less per sandbox. Destroy opens one and checks
  // the process again.)
  adopted_ = true;
  agent_pid_ = cred.pid;

  std::string auth;
  DSEC_RETURN_IF_ERROR(
      protocol::EncodeFrame(FrameType::kAuth, 0, 0, Json({{"secret", secret_}}).dump(), &auth));
  DSEC_RETURN_IF_ERROR(SendWithFds(conn.get(), auth, {}));
  protocol::FrameDecoder dec;
  Frame f;
  DSEC_RETURN_IF_ERROR(ReadFrameTimeout(conn.get(), b.opts_.setup_timeout_ms, &dec, &f));
  if (f.type != FrameType::kHello)
    return Status(StatusCode::kUnauthenticated, "the agent refused the secret");
  DSEC_ASSIGN_OR_RETURN(protocol::Hello hello, DecodeHello(f));
  shells_.insert(hello.shells.begin(), hello.shells.end());
  // Frames the agent sent right after hello stay in `dec`; there are none before our first
  // request, so the client can start on the bare connection.
  StartClient(std::move(conn));
  state_ = SandboxState::kRunning;
  if (frozen) {
    DSEC_RETURN_IF_ERROR(cgroup_->Freeze());
    state_ = SandboxState::kPaused;
  }
  return OkStatus();
}

std::string ContainerSandbox::AdoptionHandle() const {
  return Json({{"secret", secret_},
               {"uid_slot", uid_slot_},
               {"layer_fd", layer_fd_},
               {"overlays", overlay_targets_},
               {"id_base", id_base_},
               {"disk_image", disk_image_},
               {"stack",
                [&] {
                  Json l = Json::array();
                  for (const auto& x : stack_.layers) l.push_back(x.digest);
                  return Json({{"base", stack_.base}, {"layers", l}});
                }()}})
      .dump();
}

std::vector<std::string> ContainerSandbox::ListShells() {
  std::lock_guard<std::mutex> l(mu_);
  return {shells_.begin(), shells_.end()};
}

void ContainerSandbox::Detach() {
  std::lock_guard<std::mutex> l(mu_);
  if (state_.load() == SandboxState::kDestroyed) return;
  state_ = SandboxState::kDestroyed;
  // The agent sees its edge go and waits (orphan timeout) for the next one to reconnect.
  if (client_) client_->Close();
  // Still in use by the agent: never back into the pool.
  netns_ = {};
  agent_.reset();  // already exec'd: nothing is killed
  adopted_ = false;
  lock_fd_.Reset();
  dir_.clear();
  cgroup_.reset();
  if (uid_slot_ >= 0) {
    backend_->uid_ranges_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  uid_lease_.Reset();
}

Status ContainerSandbox::Handshake(int conn, int userns_fd) {
  ContainerBackend& b = *backend_;
  protocol::FrameDecoder dec;
  Frame f;
  DSEC_RETURN_IF_ERROR(ReadFrameTimeout(conn, b.opts_.setup_timeout_ms, &dec, &f));
  if (f.type != FrameType::kHello) return InternalError("agent did not say hello");
  DSEC_RETURN_IF_ERROR(DecodeHello(f).status());
  agent_->Execd();

  DSEC_ASSIGN_OR_RETURN(UniqueFd dirfd, OpenDir(dir_, O_PATH));
  // A restarted edge reconnects here; binding through /proc/self/fd avoids sun_path limits.
  UniqueFd listen_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd) return ErrnoError("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/agent.sock", dirfd.get());
  if (bind(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("bind agent.sock");
  if (fchmodat(dirfd.get(), "agent.sock", 0600, 0) < 0) return ErrnoError("chmod agent.sock");
  // The agent calls listen(), so that SO_PEERCRED on a reconnect names it (see Adopt).

  // Opened through the agent's root so the fd names the agent's (private) copy of the
  // directory: move_mount only attaches onto mounts in the caller's namespace.
  DSEC_ASSIGN_OR_RETURN(
      UniqueFd mount_dir,
      OpenDir("/proc/" + std::to_string(agent_pid_) + "/root" + b.root_mount_dir_, O_PATH));
  DSEC_ASSIGN_OR_RETURN(UniqueFd cg_user, cgroup_->OpenUserDir());
  std::vector<UniqueFd> layers;
  // `idmap`: the layer's owners are the sandbox's own (image layers, the host image's mask).
  // The host's own directories are not idmapped: their files keep host owners, none of which
  // the sandbox's user namespace maps, so root inside is a stranger to them and may read
  // exactly what any unprivileged host user may read, whenever the file appeared or was
  // chmod-ed (the mask only hides names, and may be older than the host's tree).
  auto add_layer = [&](const std::string& path, int dirfd, bool idmap = true) -> StatusOr<int> {
    StatusOr<UniqueFd> m = userns_fd >= 0 && idmap
                               ? isolation::MakeIdmappedMount(path, userns_fd, dirfd)
                               : isolation::MakeReadonlyBind(path, dirfd);
    if (!m.ok()) return m.status().WithContext("layer \"" + path + "\"");
    layers.push_back(std::move(*m));
    return static_cast<int>(layers.size() - 1);
  };
  std::vector<isolation::OverlaySpec> overlays;
  if (stack_.base == "host") {
    DSEC_ASSIGN_OR_RETURN(isolation::HostImage image, b.CurrentHostImage());
    for (const auto& layer : image.layers) {
      const std::string& path = layer.mount ? std::string() : layer.host_path;
      DSEC_RETURN_IF_ERROR(
          add_layer(path, layer.mount ? layer.mount->get() : AT_FDCWD, layer.mount != nullptr)
              .status());
    }
    overlays = image.overlays;
  } else {
    overlays.push_back({"/", {}});
  }
  // Image layers go above the host image's, topmost first; an overlay on a sub-path (a host
  // directory on another filesystem) gets the layers' subtrees there.
  std::string passwd, group;
  bool passwd_found = false, group_found = false;
  std::vector<long> inserted(overlays.size(), 0);
  for (size_t k = stack_.layers.size(); k-- > 0;) {
    DSEC_ASSIGN_OR_RETURN(images::LayerSource src,
                          b.opts_.image_store->Source(stack_.layers[k], stack_.base == "host"));
    UniqueFd root(src.mount_fd >= 0 ? fcntl(src.mount_fd, F_DUPFD_CLOEXEC, 3)
                                    : open(src.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) return ErrnoError("open layer " + stack_.layers[k].digest);
    std::string path = src.mount_fd >= 0 ? std::string() : src.path;
    int dirfd = src.mount_fd >= 0 ? src.mount_fd : AT_FDCWD;
    DSEC_ASSIGN_OR_RETURN(int idx, add_layer(path, dirfd));
    overlays[0].lower_fds.insert(overlays[0].lower_fds.begin() + inserted[0]++, idx);
    for (size_t o = 1; o < overlays.size(); ++o) {
      std::string rel = overlays[o].target.substr(1);
      struct stat st;
      if (fstatat(root.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
        continue;
      DSEC_ASSIGN_OR_RETURN(int sub, add_layer(src.mount_fd >= 0 ? rel : path + "/" + rel, dirfd));
      overlays[o].lower_fds.insert(overlays[o].lower_fds.begin() + inserted[o]++, sub);
    }
    // Without the host image, the sandbox user is added to the image's own passwd and group.
    if (stack_.base != "host") {
      for (auto [file, out, found] : {std::tuple{"etc/passwd", &passwd, &passwd_found},
                                      std::tuple{"etc/group", &group, &group_found}}) {
        if (*found) continue;
        struct stat st;
        if (fstatat(root.get(), file, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        *found = true;  // a whiteout or anything else hides the layers below
        if (!S_ISREG(st.st_mode)) continue;
        int fd = sys::Openat2(root.get(), file, O_RDONLY | O_CLOEXEC, 0,
                              RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
        if (fd < 0) continue;
        UniqueFd f(fd);
        if (auto text = ReadFdToString(f.get(), file, 1 << 20); text.ok()) *out = *text;
      }
    }
  }

  protocol::SetupSpec s;
  s.sandbox_id = spec_.id;
  s.hostname = spec_.hostname;
  secret_ = RandomHex(32);
  s.secret = secret_;
  auto& r = s.rootfs;
  r.size_bytes = static_cast<uint64_t>(spec_.disk_mb) << 20;
  r.inodes = std::max<uint64_t>(4096, static_cast<uint64_t>(spec_.disk_mb) * b.opts_.inodes_per_mb);
  r.userns = userns_fd >= 0;
  r.overlays = overlays;
  r.pty_max = b.opts_.pty_max;
  // SysV shared memory nobody has attached goes with its last user instead of living (charged
  // to the sandbox, invisible to its processes' accounting) until the sandbox is deleted.
  r.sysctls = {{"kernel/shm_rmid_forced", "1"}};
  overlay_targets_.clear();
  for (const auto& o : overlays) overlay_targets_.push_back(o.target);
  // The host image hides every top-level entry it does not allow; these are the sandbox's own.
  r.dirs = {{"/tmp", 01777, 0, 0},
            {"/var", 0755, 0, 0},
            {"/var/tmp", 01777, 0, 0},
            {"/run", 0755, 0, 0},
            {"/home", 0755, 0, 0},
            {"/root", 0700, 0, 0},
            {"/mnt", 0755, 0, 0},
            {"/sys", 0555, 0, 0},
            {"/proc", 0555, 0, 0},
            {"/dev", 0755, 0, 0},
            {"/workspace", 0755, 1000, 1000}};
  // The workdir belongs to the sandbox's user (an image's or the caller's), so it can write
  // there; a user the node cannot resolve was refused before.
  uint32_t wd_uid = 1000, wd_gid = 1000;
  if (auto u = ResolveUser(spec_.user); u.ok()) wd_uid = u->uid, wd_gid = u->gid;
  bool listed = false;
  for (auto& d : r.dirs)
    if (d.path == spec_.workdir) {
      listed = true;
      d.uid = wd_uid;
      d.gid = wd_gid;
    }
  if (!listed) r.dirs.push_back({spec_.workdir, 0755, wd_uid, wd_gid});
  r.files = {{"/etc/hostname", spec_.hostname + "\n", 0644, 0, 0},
             {"/etc/hosts",
              "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" +
                  spec_.hostname + "\n",
              0644, 0, 0}};
  if (stack_.base != "host") {
    r.files.push_back({"/etc/passwd",
                       isolation::PasswdWithSandboxUser(passwd, 1000, 1000, "/bin/sh"), 0644, 0,
                       0});
    r.files.push_back({"/etc/group", isolation::GroupWithSandboxUser(group, 1000), 0644, 0, 0});
  }
  s.rlimits = b.opts_.rlimits;
  if (s.rlimits.fsize == 0) s.rlimits.fsize = r.size_bytes;
  // An fncall worker's own layer is small; its calls write to their own (bigger) tmpfs.
  if (spec_.worker && s.rlimits.fsize < (static_cast<uint64_t>(spec_.worker->call_disk_mb) << 20))
    s.rlimits.fsize = static_cast<uint64_t>(spec_.worker->call_disk_mb) << 20;
  s.seccomp = b.seccomp_;
  s.agent_caps = isolation::RootCapabilities() | isolation::CapMask({CAP_DAC_READ_SEARCH});
  if (spec_.worker) {
    // The zygote mounts each call's tmpfs and makes its namespaces: CAP_SYS_ADMIN, which only
    // means something inside the sandbox's own user namespace.
    if (userns_fd < 0)
      return FailedPrecondition("fncall workers need user namespaces (userns is off or missing)");
    if (!b.zygote_memfd_)
      return FailedPrecondition("dsec-zygote not found at \"" + b.opts_.zygote_path + "\"");
    const WorkerSpec& w = *spec_.worker;
    protocol::ZygoteSpec z;
    z.args = {"--runtime=" + w.runtime, "--workdir=" + spec_.workdir,
              "--tmpfs-mb=" + std::to_string(w.call_disk_mb),
              "--inodes=" + std::to_string(std::max<int64_t>(4096, w.call_disk_mb * 256))};
    if (!w.preload.empty()) z.args.push_back("--preload=" + JoinStrings(w.preload, ","));
    DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(spec_.user));
    z.args.push_back("--uid=" + std::to_string(u.uid));
    z.args.push_back("--gid=" + std::to_string(u.gid));
    if (w.runtime == "exec") {
      z.args.push_back("--");
      for (const auto& a : w.command) z.args.push_back(a);
    }
    z.env = BaseEnv(u, false);
    for (const auto& [k, v] : spec_.env) SetEnv(&z.env, k, v);
    z.call_seccomp = b.seccomp_;
    z.caps = isolation::RootCapabilities() | isolation::CapMask({CAP_SYS_ADMIN});
    s.agent_caps |= z.caps;
    s.seccomp = b.zygote_seccomp_;
    s.zygote = std::move(z);
  }
  s.cgroup_kill = b.features_.cgroup_kill;
  s.max_execs = b.opts_.max_execs_per_sandbox;
  s.orphan_timeout_ms = b.opts_.orphan_timeout_ms;
  std::vector<int> fds = {mount_dir.get(), listen_fd.get()};
  s.fds.mount_dir = 0;
  s.fds.listen = 1;
  if (cg_user) {
    s.fds.cgroup_user = static_cast<int>(fds.size());
    fds.push_back(cg_user.get());
  }
  UniqueFd disk;
  if (disk_image_) {
    isolation::DiskImageSpec d;
    d.dir = b.disk_dir_;
    d.name = spec_.id;
    d.bytes = r.size_bytes;
    d.inodes = r.inodes;
    d.owner = d.group = id_base_;  // the sandbox's root (0 without a user namespace)
    d.preallocate = b.opts_.disk_preallocate;
    DSEC_ASSIGN_OR_RETURN(disk, isolation::MakeDiskImageMount(d));
    s.fds.disk = static_cast<int>(fds.size());
    fds.push_back(disk.get());
  }
  if (uid_lease_) {
    s.fds.uid_lease = static_cast<int>(fds.size());
    fds.push_back(uid_lease_.get());
  }
  s.fds.first_layer = static_cast<int>(fds.size());
  s.fds.layer_count = static_cast<int>(layers.size());
  for (const auto& l : layers) fds.push_back(l.get());
  if (spec_.worker) {
    s.fds.zygote_binary = static_cast<int>(fds.size());
    fds.push_back(b.zygote_memfd_.get());
  }

  std::string frame;
  DSEC_RETURN_IF_ERROR(
      protocol::EncodeFrame(FrameType::kSetup, 0, 0, protocol::ToJson(s).dump(), &frame));
  DSEC_RETURN_IF_ERROR(SendWithFds(conn, frame, fds));
  DSEC_RETURN_IF_ERROR(ReadFrameTimeout(conn, b.opts_.setup_timeout_ms, &dec, &f));
  if (f.type == FrameType::kError) {
    auto j = protocol::ParseJson(f.payload);
    Status st = j.ok() ? protocol::StatusFromJson(*j) : InternalError("agent setup failed");
    return st.ok() ? InternalError("agent setup failed") : st;
  }
  if (f.type != FrameType::kReady)
    return InternalError("agent sent an unexpected frame during setup");
  // The agent holds the uid range's lease from here on; one fd less for the edge per sandbox.
  uid_lease_.Reset();
  if (auto j = protocol::ParseJson(f.payload); j.ok() && j->is_object())
    if (auto it = j->find("layer_fd"); it != j->end() && it->is_number_integer())
      layer_fd_ = it->get<int>();
  return OkStatus();
}

StatusOr<std::shared_ptr<AgentClient>> ContainerSandbox::Ready() {
  if (state_.load() == SandboxState::kPaused) DSEC_RETURN_IF_ERROR(Resume());
  std::lock_guard<std::mutex> l(mu_);
  SandboxState st = state_.load();
  if (st != SandboxState::kRunning)
    return FailedPrecondition("sandbox " + spec_.id + " is " + std::string(SandboxStateName(st)) +
                              (reason_.empty() ? "" : " (" + reason_ + ")"));
  return client_;
}

std::vector<std::string> ContainerSandbox::BaseEnv(const UserIds& u, bool tty) const {
  std::vector<std::string> env = {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=" + u.home,
      "USER=" + u.name,
      "LOGNAME=" + u.name,
      "SHELL=/bin/bash",
      "LANG=C.UTF-8",
      "HOSTNAME=" + spec_.hostname};
  if (tty) env.push_back("TERM=xterm-256color");
  return env;
}

namespace {
Status ValidateEnv(const std::map<std::string, std::string>& env) {
  for (const auto& [k, v] : env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return InvalidArgument("env names must be non-empty without '=' or NUL, values without NUL");
  return OkStatus();
}

// Sends a body-carrying request: from memory, or streamed from a spooled file.
Status Upload(AgentClient& client, const Json& request, const UploadBody& body) {
  if (body.fd >= 0) return client.CallSyncUpload(request, body.fd, body.size).status();
  return client.CallSync(request, body.data, nullptr, 0, /*has_upload=*/true).status();
}
}  // namespace

StatusOr<protocol::ExecSpec> ContainerSandbox::BuildExecSpec(const ExecRequest& req) {
  protocol::ExecSpec s;
  if (req.fncall) {
    if (!spec_.worker) return InvalidArgument("sandbox " + spec_.id + " is not an fncall worker");
    s.fncall = req.fncall;
  } else if (req.shell) {
    s.argv = {"/bin/sh", "-c", *req.shell};
  } else {
    if (req.cmd.empty() || req.cmd[0].empty()) return InvalidArgument("cmd must not be empty");
    s.argv = req.cmd;
  }
  for (const auto& a : s.argv)
    if (a.find('\0') != std::string::npos) return InvalidArgument("cmd must not contain NUL bytes");
  UserIds u;
  if (req.grader) {
    if (!req.user.empty())
      return InvalidArgument("a grader exec runs as its own user: no \"user\"");
    u.uid = u.gid = kGraderUid;
    u.name = "grader";
    u.home = "/";
  } else {
    DSEC_ASSIGN_OR_RETURN(u, ResolveUser(req.user.empty() ? spec_.user : req.user));
  }
  s.uid = u.uid;
  s.gid = u.gid;
  s.root_caps = u.root;
  s.cwd = req.cwd.empty() ? spec_.workdir : req.cwd;
  if (s.cwd[0] != '/' || s.cwd.find('\0') != std::string::npos)
    return InvalidArgument("cwd must be an absolute path");
  DSEC_RETURN_IF_ERROR(ValidateEnv(req.env));
  s.env = BaseEnv(u, req.tty);
  if (!req.grader)
    for (const auto& [k, v] : spec_.env) SetEnv(&s.env, k, v);
  for (const auto& [k, v] : req.env) SetEnv(&s.env, k, v);
  if (req.timeout_ms < 0) return InvalidArgument("timeout_ms must not be negative");
  s.timeout_ms = req.timeout_ms;
  if (req.max_output_bytes > kMaxOutputCap)
    return InvalidArgument("max_output_bytes must be at most " + std::to_string(kMaxOutputCap));
  s.max_output_bytes = req.max_output_bytes;
  s.tty = req.tty;
  s.cols = req.cols;
  s.rows = req.rows;
  s.stdin_stream = req.stdin_stream;
  return s;
}

StatusOr<std::shared_ptr<ExecHandle>> ContainerSandbox::StartExec(
    const ExecRequest& req, std::shared_ptr<ExecObserver> observer) {
  DSEC_ASSIGN_OR_RETURN(protocol::ExecSpec spec, BuildExecSpec(req));
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  if (req.grader) DSEC_RETURN_IF_ERROR(KillEveryUserProcess());
  bool stream_stdin = req.stdin_data.size() > kInlineStdinMax;
  if (stream_stdin) {
    spec.stdin_stream = true;
  } else {
    spec.stdin_data = req.stdin_data;
  }
  Json j = protocol::Encode(protocol::ExecRequest{std::move(spec)});
  // One request frame to the agent: command, environment, inline stdin and an fncall's code
  // and files (base64) must fit.
  std::string payload = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (payload.size() > protocol::kMaxPayload)
    return TooLarge("the request is too large for one agent frame (" +
                    std::to_string(payload.size()) + " bytes encoded, at most " +
                    std::to_string(protocol::kMaxPayload) + ")");
  auto call = std::make_shared<ExecCall>(std::move(observer), oom_);
  uint32_t ch = client->StartCall(std::move(payload), call);
  auto handle = std::make_shared<ExecHandleImpl>(client, ch);
  call->set_handle(handle);
  if (stream_stdin) {
    DSEC_RETURN_IF_ERROR(handle->WriteStdin(req.stdin_data));
    handle->CloseStdin();
  }
  exec_count_++;
  return std::shared_ptr<ExecHandle>(handle);
}

StatusOr<protocol::RunAs> ContainerSandbox::RunAsUser(const std::string& user) const {
  // The agent has no default user: a user that does not resolve is an error here too.
  DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(user.empty() ? spec_.user : user));
  return protocol::RunAs{u.uid, u.gid};
}

StatusOr<std::string> ContainerSandbox::OpenShell(const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(user.empty() ? spec_.user : user));
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  protocol::ExecSpec s;
  s.argv = {"/bin/bash"};
  s.uid = u.uid;
  s.gid = u.gid;
  s.root_caps = u.root;
  s.cwd = spec_.workdir;
  s.env = BaseEnv(u, false);
  for (const auto& [k, v] : spec_.env) SetEnv(&s.env, k, v);
  DSEC_ASSIGN_OR_RETURN(Json r, client->CallSync(protocol::Encode(protocol::ShellOpenRequest{s})));
  DSEC_ASSIGN_OR_RETURN(auto opened, protocol::DecodeAs<protocol::ShellOpenResponse>(r));
  std::lock_guard<std::mutex> l(mu_);
  shells_.insert(opened.shell_id);
  return opened.shell_id;
}

StatusOr<std::shared_ptr<ExecHandle>> ContainerSandbox::RunInShell(
    const std::string& shell_id, const std::string& command, int64_t timeout_ms,
    uint64_t max_output_bytes, std::shared_ptr<ExecObserver> observer) {
  if (timeout_ms < 0) return InvalidArgument("timeout_ms must not be negative");
  if (max_output_bytes > kMaxOutputCap) return InvalidArgument("max_output_bytes is too large");
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  auto call = std::make_shared<ExecCall>(std::move(observer), oom_);
  protocol::ShellRunRequest req{shell_id, command, timeout_ms, max_output_bytes};
  uint32_t ch = client->StartCall(protocol::Encode(req), call);
  auto handle = std::make_shared<ExecHandleImpl>(client, ch);
  call->set_handle(handle);
  exec_count_++;
  return std::shared_ptr<ExecHandle>(handle);
}

Status ContainerSandbox::CloseShell(const std::string& shell_id) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  Status s = client->CallSync(protocol::Encode(protocol::ShellCloseRequest{shell_id})).status();
  if (s.ok() || s.code() == StatusCode::kNotFound) {
    std::lock_guard<std::mutex> l(mu_);
    shells_.erase(shell_id);
  }
  return s;
}

StatusOr<std::string> ContainerSandbox::ReadFile(const std::string& path, uint64_t max_bytes) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  protocol::ReadFileRequest req{as, path, max_bytes, 0};
  std::string data;
  DSEC_RETURN_IF_ERROR(client->CallSync(protocol::Encode(req), {}, &data, max_bytes).status());
  return data;
}

Status ContainerSandbox::WriteFile(const std::string& path, const UploadBody& data, uint32_t mode) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  protocol::WriteFileRequest req{as, path, mode, true, false};
  return Upload(*client, protocol::Encode(req), data);
}

StatusOr<std::vector<FileEntry>> ContainerSandbox::ListDir(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  protocol::ListDirRequest req{as, path, 10000};
  DSEC_ASSIGN_OR_RETURN(Json r, client->CallSync(protocol::Encode(req)));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::ListDirResponse>(r));
  return std::move(resp.entries);
}

StatusOr<FileEntry> ContainerSandbox::Stat(const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  DSEC_ASSIGN_OR_RETURN(Json r,
                        client->CallSync(protocol::Encode(protocol::StatRequest{as, path})));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::StatResponse>(r));
  return std::move(resp.entry);
}

Status ContainerSandbox::MakeDir(const std::string& path, uint32_t mode) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  return client->CallSync(protocol::Encode(protocol::MakeDirRequest{as, path, mode, true}))
      .status();
}

Status ContainerSandbox::Remove(const std::string& path, bool recursive) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  return client->CallSync(protocol::Encode(protocol::RemoveRequest{as, path, recursive})).status();
}

Status ContainerSandbox::ExtractTar(const std::string& dir, const UploadBody& tar) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  protocol::TarExtractRequest req{as, dir, static_cast<uint64_t>(spec_.disk_mb) << 20};
  return Upload(*client, protocol::Encode(req), tar);
}

StatusOr<std::string> ContainerSandbox::CreateTar(const std::string& dir, uint64_t max_bytes) {
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  // The agent stops at this bound too, instead of streaming the rest for nothing (a sparse 1 TB
  // file would keep it busy until the call timed out).
  protocol::TarCreateRequest req{as, dir, max_bytes};
  std::string data;
  DSEC_RETURN_IF_ERROR(client->CallSync(protocol::Encode(req), {}, &data, max_bytes).status());
  if (data.size() >= max_bytes)
    return TooLarge("archive is larger than " + std::to_string(max_bytes) + " bytes");
  return data;
}

bool ContainerSandbox::InOwnCgroup(pid_t pid) const {
  auto cgroups = ReadFileToString("/proc/" + std::to_string(pid) + "/cgroup");
  return cgroups.ok() && cgroups->find("/" + spec_.id + "\n") != std::string::npos;
}

Status ContainerSandbox::KillEveryUserProcess() {
  DSEC_RETURN_IF_ERROR(SignalAll(SIGKILL).status());
  // Until only the agent is left (a process in uninterruptible sleep may take a moment).
  for (int i = 0; i < 400; ++i) {
    auto st = cgroup_->Stats();
    if (st.ok() && st->pids_current <= 1) return OkStatus();
    usleep(i < 20 ? 500 : 5000);
  }
  return Unavailable("sandbox " + spec_.id +
                     ": processes survived SIGKILL; the grader did not start");
}

StatusOr<int> ContainerSandbox::SignalAll(int sig) {
  if (sig <= 0 || sig >= 65) return InvalidArgument("bad signal number");
  DSEC_ASSIGN_OR_RETURN(auto client, Ready());
  DSEC_ASSIGN_OR_RETURN(Json r,
                        client->CallSync(protocol::Encode(protocol::SignalAllRequest{sig})));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::SignalAllResponse>(r));
  return resp.processes;
}

Status ContainerSandbox::Pause() {
  std::lock_guard<std::mutex> l(mu_);
  SandboxState st = state_.load();
  if (st == SandboxState::kPaused) return OkStatus();
  if (st != SandboxState::kRunning)
    return FailedPrecondition("sandbox " + spec_.id + " is " + std::string(SandboxStateName(st)));
  DSEC_RETURN_IF_ERROR(cgroup_->Freeze());
  state_ = SandboxState::kPaused;
  return OkStatus();
}

Status ContainerSandbox::Resume() {
  std::lock_guard<std::mutex> l(mu_);
  if (state_.load() != SandboxState::kPaused) return OkStatus();
  DSEC_RETURN_IF_ERROR(cgroup_->Thaw());
  state_ = SandboxState::kRunning;
  return OkStatus();
}

Status ContainerSandbox::SetMemoryLimit(int64_t bytes) {
  if (!cgroup_) return FailedPrecondition("sandbox " + spec_.id + " has no cgroup");
  isolation::CgroupLimits limits;
  limits.memory_bytes = bytes;
  limits.pids = spec_.pids;
  limits.cpus = spec_.cpus;
  return cgroup_->SetLimits(limits);
}

StatusOr<SandboxStats> ContainerSandbox::Stats() {
  std::shared_ptr<isolation::Cgroup> cg;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (state_.load() == SandboxState::kDestroyed || !cgroup_)
      return FailedPrecondition("sandbox is destroyed");
    cg = cgroup_;
  }
  DSEC_ASSIGN_OR_RETURN(isolation::CgroupStats c, cg->Stats());
  SandboxStats s;
  s.memory_current = c.memory_current;
  s.memory_peak = c.memory_peak;
  s.memory_limit = static_cast<uint64_t>(spec_.memory_mb + (disk_image_ ? 0 : spec_.disk_mb)) << 20;
  s.cpu_usage_us = c.cpu_usage_us;
  s.pids = c.pids_current;
  s.oom_kills = c.oom_kills;
  s.disk_used = c.shmem;
  if (disk_image_) {
    DSEC_ASSIGN_OR_RETURN(s.disk_used, DiskImageUsed());
    s.disk_kind = "image";
  }
  s.disk_limit = static_cast<uint64_t>(spec_.disk_mb) << 20;
  s.exec_count = exec_count_.load();
  return s;
}

StatusOr<uint64_t> ContainerSandbox::DiskImageUsed() {
  if (layer_fd_ < 0) return FailedPrecondition("sandbox " + spec_.id + " has no writable layer fd");
  std::string fd = "/proc/" + std::to_string(agent_pid_) + "/fd/" + std::to_string(layer_fd_);
  struct statfs sfs;
  if (statfs(fd.c_str(), &sfs) < 0) return ErrnoError("statfs the writable layer of " + spec_.id);
  if (sfs.f_type != EXT4_SUPER_MAGIC)
    return FailedPrecondition("the writable layer of " + spec_.id + " is not its disk image");
  return static_cast<uint64_t>(sfs.f_blocks - sfs.f_bfree) * static_cast<uint64_t>(sfs.f_bsize);
}

Status ContainerSandbox::Destroy() {
  std::lock_guard<std::mutex> l(mu_);
  if (state_.load() == SandboxState::kDestroyed) return OkStatus();
  state_ = SandboxState::kDestroyed;
  if (client_) client_->Close();
  Status result;
  if (cgroup_) (void)cgroup_->KillAll();
  // Killing PID 1 of the pid namespace takes every process in it along; reap it.
  if (agent_) agent_->Abort();
  if (adopted_ && agent_pid_ > 0) {
    // Not our child: init reaps it. The cgroup kill above already took it; this is for hosts
    // where that failed, and only if the pid is still a process of this sandbox.
    if (auto p = PidFd::Open(agent_pid_); p.ok() && InOwnCgroup(agent_pid_)) {
      (void)p->SendSignal(SIGKILL);
      (void)p->WaitReadable(2000);
    }
    adopted_ = false;
  }
  // Nothing runs in the network namespace any more (the agent, PID 1 of the only pid
  // namespace in it, is reaped), so it can serve another sandbox.
  if (netns_.ns && backend_->netns_) backend_->netns_->Release(std::move(netns_));
  netns_ = {};
  if (cgroup_) result = cgroup_->Destroy();
  if (!dir_.empty()) {
    // The directory holds exactly these (and "mnt" if an older edge made it); anything else
    // falls back to the tree walk.
    for (const char* f : {"agent.sock", "owner.lock"}) (void)unlink(JoinPath(dir_, f).c_str());
    if (rmdir(dir_.c_str()) < 0 && errno != ENOENT) {
      Status s = RemoveTree(dir_);
      if (result.ok()) result = s;
    }
  }
  if (tmp_created_) (void)RemoveTree(JoinPath(backend_->sandboxes_dir_, ".tmp-" + spec_.id));
  lock_fd_.Reset();
  if (uid_slot_ >= 0) {
    backend_->uid_ranges_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  uid_lease_.Reset();
  if (holds_image_ && backend_->opts_.image_store) {
    holds_image_ = false;
    backend_->opts_.image_store->Release(spec_.id);
    if (auto n = backend_->opts_.image_store->Collect(); !n.ok())
      DSEC_LOG_WARN("image store: collect: {}", n.status().ToString());
  }
  return result;
}

StatusOr<std::vector<std::string>> ContainerSandbox::CaptureStack(bool keep_setuid) {
  images::ImageStore* store = backend_->opts_.image_store;
  if (!store) return FailedPrecondition("this node has no image store");
  std::lock_guard<std::mutex> l(mu_);
  SandboxState st = state_.load();
  if (st != SandboxState::kRunning && st != SandboxState::kPaused)
    return FailedPrecondition("sandbox " + spec_.id + " is " + std::string(SandboxStateName(st)));
  if (layer_fd_ < 0 || overlay_targets_.empty())
    return FailedPrecondition("sandbox " + spec_.id +
                              " was started by an older agent and cannot be snapshotted");
  // The agent holds the writable layer's tmpfs (or disk image); through its fd table we reach
  // the very mount (nothing inside the sandbox can). It must be that filesystem, with the upper
  // dirs the setup made.
  UniqueFd tmpfs(
      open(("/proc/" + std::to_string(agent_pid_) + "/fd/" + std::to_string(layer_fd_)).c_str(),
           O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!tmpfs) return ErrnoError("open the writable layer of " + spec_.id);
  struct statfs sfs;
  if (fstatfs(tmpfs.get(), &sfs) < 0 ||
      sfs.f_type != (disk_image_ ? EXT4_SUPER_MAGIC : TMPFS_MAGIC))
    return FailedPrecondition("the writable layer of " + spec_.id + " is not its " +
                              (disk_image_ ? "disk image" : "tmpfs"));
  std::vector<UniqueFd> uppers;
  std::vector<images::CaptureSource> sources;
  for (size_t i = 0; i < overlay_targets_.size(); ++i) {
    std::string rel = "up/" + std::to_string(i);
    int fd = sys::Openat2(
        tmpfs.get(), rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
    if (fd < 0) return ErrnoError("open upper dir " + rel + " of " + spec_.id);
    uppers.emplace_back(fd);
    sources.push_back({fd, overlay_targets_[i]});
  }
  images::CaptureOptions co;
  co.id_base = id_base_;
  // Per-sandbox files the edge writes at every create, and mount points.
  co.skip = {"/etc/hostname", "/etc/hosts"};
  co.empty = {"/proc", "/sys", "/dev"};
  co.keep_setuid = keep_setuid;
  co.max_apparent_bytes = store->options().max_layer_bytes;

  images::ImageStore::Lease lease(store);
  DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer());
  // Frozen while read, so the layer is one consistent state (a paused sandbox stays paused).
  bool thaw = st == SandboxState::kRunning;
  if (thaw) DSEC_RETURN_IF_ERROR(cgroup_->Freeze());
  Status captured = images::WriteLayerTar(
      sources, co, [&](std::string_view d) { return builder->Feed(d); }, nullptr);
  if (thaw) {
    if (Status s = cgroup_->Thaw(); !s.ok()) {
      DSEC_LOG_ERROR("thaw {} after snapshot: {}", spec_.id, s.ToString());
      if (captured.ok()) captured = s;
    }
  }
  DSEC_RETURN_IF_ERROR(captured.WithContext("capture the writable layer of " + spec_.id));
  DSEC_ASSIGN_OR_RETURN(images::LayerInfo layer, builder->Commit());
  std::vector<std::string> out;
  if (stack_.base == "host") out.push_back("host");
  for (const auto& x : stack_.layers) out.push_back(x.digest);
  if (std::find(out.begin(), out.end(), layer.digest) == out.end()) out.push_back(layer.digest);
  return out;
}

}  // namespace dsec::backends::container
