#include "agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "agent/capture.h"
#include "agent/exec.h"
#include "agent/files.h"
#include "agent/jobs.h"
#include "agent/port.h"
#include "agent/shell.h"
#include "base/clock.h"
#include "sys/syscalls.h"

namespace dsec::agent {

using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

namespace {
constexpr int kAuthTimeoutMs = 5000;
constexpr size_t kMaxShells = 256;
constexpr int64_t kPortRetryMs = 20;

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}
}  // namespace

class Agent::ConnHandler : public EventHandler {
 public:
  ConnHandler(Agent* a, bool pending) : a_(a), pending_(pending) {}
  void OnEvent(uint32_t ev) override {
    if (pending_) {
      a_->OnPendingReadable();
      return;
    }
    if (ev & EPOLLOUT) a_->OnConnWritable();
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) a_->OnConnReadable();
  }

 private:
  Agent* a_;
  bool pending_;
};

class Agent::ListenHandler : public EventHandler {
 public:
  explicit ListenHandler(Agent* a) : a_(a) {}
  void OnEvent(uint32_t) override { a_->OnAccept(); }

 private:
  Agent* a_;
};

class Agent::SignalHandler : public EventHandler {
 public:
  explicit SignalHandler(Agent* a) : a_(a) {}
  void OnEvent(uint32_t) override { a_->OnSigchld(); }

 private:
  Agent* a_;
};

Agent::Agent(AgentConfig cfg, UniqueFd conn, UniqueFd listen)
    : cfg_(std::move(cfg)),
      conn_(std::move(conn)),
      listen_(std::move(listen)),
      jobs_(std::make_unique<Jobs>(this)) {}

Agent::~Agent() = default;

void Agent::SetZygote(pid_t pid, UniqueFd control) {
  zygote_control_ = std::move(control);
  zygote_pidfd_.Reset(sys::PidfdOpen(pid, 0));
}

bool Agent::ZygoteAlive() const {
  if (!zygote_control_ || !zygote_pidfd_) return false;
  pollfd p{zygote_pidfd_.get(), POLLIN, 0};
  return poll(&p, 1, 0) == 0;  // a pidfd turns readable when the process exits
}

std::string Agent::NextCgroupName(char prefix) {
  std::string name(1, prefix);
  name += std::to_string(++cgroup_seq_);
  return name;
}

void Agent::ReapLingeringCgroups() {
  for (auto it = lingering_.begin(); it != lingering_.end();) {
    if (RemoveCgroup(*this, *it)) {
      it = lingering_.erase(it);
    } else {
      ++it;
    }
  }
}

void Agent::RetireDrain(EventHandler* d) {
  for (auto it = drains_.begin(); it != drains_.end(); ++it) {
    if (it->get() == d) {
      retired_drains_.push_back(std::move(*it));
      drains_.erase(it);
      return;
    }
  }
}

void Agent::Send(FrameType type, uint8_t flags, uint32_t channel, std::string_view payload) {
  if (!conn_) return;
  if (!protocol::EncodeFrame(type, flags, channel, payload, &out_).ok()) return;
  // Large bursts go out at once; small frames are batched until the end of the loop round.
  if (out_.size() - out_pos_ >= 256 * 1024) OnConnWritable();
}

void Agent::SendJson(FrameType type, uint32_t channel, const Json& j) {
  std::string payload = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (payload.size() > protocol::kMaxPayload) {
    // The edge waits for a response: it must get one, even if not this one.
    payload = protocol::ErrorJson(TooLarge("response of " + std::to_string(payload.size()) +
                                           " bytes does not fit in a frame"))
                  .dump();
  }
  Send(type, 0, channel, payload);
}

void Agent::Finish(Op* op, const Json& response) {
  SendJson(FrameType::kResponse, op->channel(), response);
  Retire(op);
}

void Agent::FinishWithError(Op* op, const Status& s) { Finish(op, protocol::ErrorJson(s)); }

void Agent::SetDeadline(Op* op, int64_t deadline_ms) {
  if (deadline_ms == 0) {
    deadlines_.erase(op);
  } else {
    deadlines_[op] = deadline_ms;
  }
}

void Agent::Retire(Op* op) {
  room_waiters_.erase(op);
  deadlines_.erase(op);
  for (auto it = children_.begin(); it != children_.end();) {
    it = it->second == op ? children_.erase(it) : std::next(it);
  }
  auto it = ops_.find(op->channel());
  if (it != ops_.end() && it->second.get() == op) {
    retired_.push_back(std::move(it->second));
    ops_.erase(it);
  }
}

void Agent::RetireOwned(std::unique_ptr<Op> op) {
  if (!op) return;
  room_waiters_.erase(op.get());
  deadlines_.erase(op.get());
  for (auto it = children_.begin(); it != children_.end();) {
    it = it->second == op.get() ? children_.erase(it) : std::next(it);
  }
  retired_.push_back(std::move(op));
}

void Agent::FlushRetired() {
  jobs_->Flush();
  retired_.clear();
  retired_drains_.clear();
}

void Agent::UpdateConnInterest() {
  if (!conn_) return;
  bool want = out_pos_ < out_.size();
  if (want == want_write_) return;
  want_write_ = want;
  loop_.Modify(conn_.get(), EPOLLIN | (want ? uint32_t{EPOLLOUT} : 0u), conn_handler_.get());
}

void Agent::OnConnWritable() {
  while (conn_ && out_pos_ < out_.size()) {
    // write(), not send(): a microVM's connection is a virtio-serial port (O_NONBLOCK is set
    // on it and SIGPIPE is ignored, which is all MSG_DONTWAIT | MSG_NOSIGNAL added).
    ssize_t n = write(conn_.get(), out_.data() + out_pos_, out_.size() - out_pos_);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      DropConnection(std::string("send: ") + strerror(errno));
      return;
    }
    out_pos_ += static_cast<size_t>(n);
  }
  if (out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  } else if (out_pos_ > (1 << 20)) {
    out_.erase(0, out_pos_);
    out_pos_ = 0;
  }
  UpdateConnInterest();
  if (out_.size() - out_pos_ < kLowWater && !room_waiters_.empty()) {
    auto waiters = std::move(room_waiters_);
    room_waiters_.clear();
    for (Op* op : waiters) op->OnRoom();
  }
}

void Agent::OnConnReadable() {
  char buf[64 * 1024];
  for (int round = 0; round < 8 && conn_; ++round) {
    ssize_t n = read(conn_.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      DropConnection(std::string("recv: ") + strerror(errno));
      return;
    }
    if (n == 0) {
      DropConnection("edge closed the connection");
      return;
    }
    if (!decoder_.Feed(std::string_view(buf, static_cast<size_t>(n))).ok()) {
      DropConnection("malformed frame");
      return;
    }
    Frame f;
    while (conn_ && decoder_.Next(&f)) HandleFrame(f);
    if (conn_ && decoder_.failed()) {
      DropConnection("malformed frame");
      return;
    }
  }
}

void Agent::DropConnection(const std::string& why) {
  (void)why;
  if (conn_) {
    loop_.Remove(conn_.get());
    if (cfg_.guest_port) {
      WaitForHost(std::move(conn_), /*needs_hangup=*/false);
    } else {
      conn_.Reset();
    }
  }
  out_.clear();
  out_pos_ = 0;
  want_write_ = false;
  decoder_ = protocol::FrameDecoder();
  // Channel-bound work has no one to report to; shells stay for a reconnecting edge.
  std::vector<Op*> ops;
  for (auto& [ch, op] : ops_) ops.push_back(op.get());
  for (Op* op : ops) {
    op->Cancel();
    Retire(op);
  }
  room_waiters_.clear();
  if (cfg_.orphan_timeout_ms >= 0) orphan_deadline_ = MonotonicMs() + cfg_.orphan_timeout_ms;
}

void Agent::OnAccept() {
  int fd = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  UniqueFd c(fd);
  // Only a process outside this sandbox's pid namespace (the edge) shows up with pid 0.
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid != 0) return;
  if (pending_) loop_.Remove(pending_.get());
  pending_ = std::move(c);
  pending_decoder_ = protocol::FrameDecoder(4096);
  pending_deadline_ = MonotonicMs() + kAuthTimeoutMs;
  if (!pending_handler_) pending_handler_ = std::make_unique<ConnHandler>(this, true);
  if (!loop_.Add(pending_.get(), EPOLLIN, pending_handler_.get()).ok()) pending_.Reset();
}

void Agent::WaitForHost(UniqueFd port, bool needs_hangup) {
  port_ = std::move(port);
  port_needs_hangup_ = needs_hangup;
  port_retry_ms_ = MonotonicMs() + kPortRetryMs;
}

// A virtio-serial port polls EPOLLHUP for as long as no host end is connected, so it cannot
// sit in the epoll set meanwhile: it is looked at every kPortRetryMs instead.
void Agent::CheckPort() {
  if (!port_ || MonotonicMs() < port_retry_ms_) return;
  pollfd p{port_.get(), POLLIN, 0};
  int polled = poll(&p, 1, 0);
  bool hung_up = polled >= 0 && (p.revents & POLLHUP);
  // Bytes waiting after a refusal: a host end is there and talking. (A new one that connected
  // between two looks, its predecessor's hang-up never seen, sends its auth.)
  bool talking = polled > 0 && (p.revents & POLLIN);
  if (hung_up) port_needs_hangup_ = false;
  if (hung_up || (port_needs_hangup_ && !talking)) {
    port_retry_ms_ = MonotonicMs() + kPortRetryMs;
    return;
  }
  // A host end is connected again (an edge that restarted): it must authenticate first.
  if (pending_) loop_.Remove(pending_.get());
  pending_ = std::move(port_);
  port_retry_ms_ = 0;
  pending_decoder_ = protocol::FrameDecoder(4096);
  pending_deadline_ = MonotonicMs() + kAuthTimeoutMs;
  if (!pending_handler_) pending_handler_ = std::make_unique<ConnHandler>(this, true);
  if (!loop_.Add(pending_.get(), EPOLLIN, pending_handler_.get()).ok())
    WaitForHost(std::move(pending_), true);
}

void Agent::OnPendingReadable() {
  char buf[4096];
  ssize_t n = read(pending_.get(), buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  Frame f;
  bool ok = n > 0 && pending_decoder_.Feed(std::string_view(buf, static_cast<size_t>(n))).ok();
  if (ok && !pending_decoder_.Next(&f)) return;  // wait for the whole auth frame
  bool authed = false;
  Status identity;
  if (ok && f.type == FrameType::kAuth) authed = Authentic(f);
  if (authed) identity = TakeIdentity(f);
  loop_.Remove(pending_.get());
  UniqueFd c = std::move(pending_);
  pending_deadline_ = 0;
  if (!authed || !identity.ok()) {
    std::string err = authed ? ErrorFrame(identity) : BadSecretFrame();
    (void)!write(c.get(), err.data(), err.size());
    // A port stays ours: the next edge gets it once this one hung up.
    if (cfg_.guest_port) WaitForHost(std::move(c), true);
    return;
  }
  // The newest authenticated edge wins: a restarted edge replaces a dead connection.
  DropConnection("replaced by a reconnecting edge");
  orphan_deadline_ = 0;
  conn_ = std::move(c);
  if (!loop_.Add(conn_.get(), EPOLLIN, conn_handler_.get()).ok()) {
    conn_.Reset();
    return;
  }
  SendHello();
}

void Agent::OnSigchld() {
  signalfd_siginfo si;
  while (read(sigfd_.get(), &si, sizeof si) == sizeof si) {
  }
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    auto it = children_.find(pid);
    if (it == children_.end()) continue;  // an orphan re-parented to us: just reaped
    Op* op = it->second;
    children_.erase(it);
    op->OnChildExit(pid, status);
  }
}

void Agent::HandleFrame(Frame& f) {
  switch (f.type) {
    case FrameType::kRequest:
      HandleRequest(f.channel, f.payload);
      return;
    case FrameType::kData: {
      auto it = ops_.find(f.channel);
      if (it != ops_.end()) it->second->OnData(f);
      return;
    }
    case FrameType::kControl: {
      auto it = ops_.find(f.channel);
      auto j = protocol::ParseJson(f.payload);
      if (it != ops_.end() && j.ok() && j->is_object()) it->second->OnControl(*j);
      return;
    }
    case FrameType::kAuth:
      // A microVM's port: a new host end (a restarted edge) may connect before the guest saw
      // the old one go, so its auth arrives on the connection that is already serving.
      if (cfg_.guest_port) TakeOverPort(f);
      return;
    default:
      return;  // nothing else is meaningful from the edge once serving
  }
}

void Agent::TakeOverPort(const Frame& f) {
  bool authed = Authentic(f);
  Status identity = authed ? TakeIdentity(f) : OkStatus();
  if (!authed || !identity.ok()) {
    std::string err = authed ? ErrorFrame(identity) : BadSecretFrame();
    (void)!write(conn_.get(), err.data(), err.size());
    loop_.Remove(conn_.get());
    UniqueFd port = std::move(conn_);
    DropConnection("bad secret on the port");
    WaitForHost(std::move(port), /*needs_hangup=*/true);
    return;
  }
  // What was queued or running for the previous edge goes, as when a connection drops.
  UniqueFd port = std::move(conn_);
  loop_.Remove(port.get());
  DropConnection("replaced by a reconnecting edge");
  port_.Reset();
  port_retry_ms_ = 0;
  orphan_deadline_ = 0;
  conn_ = std::move(port);
  if (!loop_.Add(conn_.get(), EPOLLIN, conn_handler_.get()).ok()) {
    WaitForHost(std::move(conn_), true);
    return;
  }
  SendHello();
}

bool Agent::Authentic(const Frame& f) const {
  auto j = protocol::ParseJson(f.payload);
  if (!j.ok()) return false;
  auto auth = protocol::DecodeAs<protocol::Auth>(*j);
  return auth.ok() && !cfg_.secret.empty() && ConstantTimeEquals(auth->secret, cfg_.secret);
}

Status Agent::TakeIdentity(const Frame& f) {
  auto j = protocol::ParseJson(f.payload);
  if (!j.ok()) return j.status();
  auto auth = protocol::DecodeAs<protocol::Auth>(*j);
  if (!auth.ok()) return auth.status();
  if (!auth->identity) return OkStatus();
  if (!cfg_.apply_identity)
    return FailedPrecondition("an identity is for a microVM's agent to take");
  DSEC_RETURN_IF_ERROR(cfg_.apply_identity(*auth->identity));
  cfg_.secret = auth->identity->secret;
  return OkStatus();
}

std::string Agent::ErrorFrame(const Status& st) {
  return protocol::EncodeFrameOrDie(FrameType::kError, 0, 0, protocol::ErrorJson(st).dump());
}

std::string Agent::BadSecretFrame() {
  return ErrorFrame(Status(StatusCode::kUnauthenticated, "bad secret"));
}

void Agent::SendHello() {
  protocol::Hello hello{protocol::kProtocolVersion, getpid(), {}};
  for (const auto& [id, s] : shells_)
    if (s->alive()) hello.shells.push_back(id);
  SendJson(FrameType::kHello, 0, protocol::Encode(hello));
}

namespace {

// The process operations; the file operations are in files.cc.

StatusOr<Reply> HandleExec(Agent* agent, uint32_t ch, protocol::ExecRequest req) {
  Status err;
  std::unique_ptr<Op> op = StartExec(agent, ch, std::move(req.spec), &err);
  if (!op) return err;
  return Reply(std::move(op));
}

StatusOr<Reply> HandleShellOpen(Agent* agent, uint32_t, protocol::ShellOpenRequest req) {
  if (agent->shells().size() >= kMaxShells) return ResourceExhausted("too many shell sessions");
  std::string id = agent->NextShellId();
  DSEC_ASSIGN_OR_RETURN(auto shell, ShellSession::Open(agent, id, req.spec));
  agent->shells()[id] = std::move(shell);
  return Reply(protocol::Encode(protocol::ShellOpenResponse{id}));
}

StatusOr<Reply> HandleShellRun(Agent* agent, uint32_t ch, protocol::ShellRunRequest req) {
  auto it = agent->shells().find(req.shell_id);
  if (it == agent->shells().end()) return NotFound("shell " + req.shell_id + " not found");
  DSEC_ASSIGN_OR_RETURN(auto op,
                        it->second->Run(ch, req.command, req.timeout_ms, req.max_output_bytes));
  return Reply(std::move(op));
}

StatusOr<Reply> HandleShellClose(Agent* agent, uint32_t, protocol::ShellCloseRequest req) {
  auto it = agent->shells().find(req.shell_id);
  if (it == agent->shells().end()) return NotFound("shell " + req.shell_id + " not found");
  agent->shells().erase(it);
  return Reply(protocol::Encode(protocol::OkResponse{}));
}

StatusOr<Reply> HandleSignalAll(Agent* agent, uint32_t, protocol::SignalAllRequest req) {
  int n = SignalAllUserProcesses(*agent, req.signal);
  if (n < 0) return Unimplemented("signal_all needs cgroup2");
  return Reply(protocol::Encode(protocol::SignalAllResponse{n}));
}

StatusOr<Reply> HandlePing(Agent* agent, uint32_t, protocol::PingRequest) {
  return Reply(protocol::Encode(protocol::PingResponse{getpid(), agent->active_processes()}));
}

// One entry per operation: its name, and its request's parser bound to its handler.
struct OpEntry {
  std::string_view name;
  StatusOr<Reply> (*run)(Agent* agent, uint32_t channel, const Json& request);
};

template <class Req, StatusOr<Reply> (*Handler)(Agent*, uint32_t, Req)>
constexpr OpEntry Entry() {
  return {Req::kOp, [](Agent* agent, uint32_t ch, const Json& j) -> StatusOr<Reply> {
            DSEC_ASSIGN_OR_RETURN(Req req, protocol::DecodeAs<Req>(j));
            return Handler(agent, ch, std::move(req));
          }};
}

constexpr OpEntry kOps[] = {
    Entry<protocol::ExecRequest, HandleExec>(),
    Entry<protocol::ShellOpenRequest, HandleShellOpen>(),
    Entry<protocol::ShellRunRequest, HandleShellRun>(),
    Entry<protocol::ShellCloseRequest, HandleShellClose>(),
    Entry<protocol::JobStartRequest, HandleJobStart>(),
    Entry<protocol::JobReadRequest, HandleJobRead>(),
    Entry<protocol::JobKillRequest, HandleJobKill>(),
    Entry<protocol::JobListRequest, HandleJobList>(),
    Entry<protocol::SignalAllRequest, HandleSignalAll>(),
    Entry<protocol::PingRequest, HandlePing>(),
    Entry<protocol::PortConnectRequest, HandlePortConnect>(),
    Entry<protocol::ReadFileRequest, HandleReadFile>(),
    Entry<protocol::WriteFileRequest, HandleWriteFile>(),
    Entry<protocol::ListDirRequest, HandleListDir>(),
    Entry<protocol::StatRequest, HandleStat>(),
    Entry<protocol::WatchDirRequest, HandleWatchDir>(),
    Entry<protocol::CaptureLayerRequest, HandleCaptureLayer>(),
    Entry<protocol::MakeDirRequest, HandleMakeDir>(),
    Entry<protocol::RemoveRequest, HandleRemove>(),
    Entry<protocol::TarExtractRequest, HandleTarExtract>(),
    Entry<protocol::TarCreateRequest, HandleTarCreate>(),
};

}  // namespace

std::string Agent::NextShellId() { return "sh" + std::to_string(++cgroup_seq_); }

void Agent::HandleRequest(uint32_t channel, const std::string& payload) {
  auto fail = [&](const Status& s) {
    SendJson(FrameType::kResponse, channel, protocol::ErrorJson(s));
  };
  if (channel == 0 || ops_.count(channel)) return fail(InvalidArgument("channel id in use"));
  auto parsed = protocol::ParseJson(payload);
  if (!parsed.ok() || !parsed->is_object())
    return fail(InvalidArgument("request must be a JSON object"));
  auto opname = protocol::GetString(*parsed, "op");
  if (!opname.ok()) return fail(opname.status());
  const OpEntry* entry = nullptr;
  for (const OpEntry& e : kOps)
    if (e.name == *opname) entry = &e;
  if (!entry) return fail(InvalidArgument("unknown operation \"" + *opname + "\""));
  StatusOr<Reply> reply = entry->run(this, channel, *parsed);
  if (!reply.ok()) return fail(reply.status());
  if (auto* response = std::get_if<Json>(&*reply))
    return SendJson(FrameType::kResponse, channel, *response);
  std::unique_ptr<Op> started = std::move(std::get<std::unique_ptr<Op>>(*reply));
  Op* raw = started.get();
  ops_[channel] = std::move(started);
  raw->Begin();
}

int Agent::NextTimeoutMs() {
  int64_t next = 0;
  for (const auto& [op, d] : deadlines_)
    if (next == 0 || d < next) next = d;
  if (pending_deadline_ && (next == 0 || pending_deadline_ < next)) next = pending_deadline_;
  if (orphan_deadline_ && (next == 0 || orphan_deadline_ < next)) next = orphan_deadline_;
  if (port_retry_ms_ && (next == 0 || port_retry_ms_ < next)) next = port_retry_ms_;
  if (!lingering_.empty()) {
    int64_t soon = MonotonicMs() + 500;
    if (next == 0 || soon < next) next = soon;
  }
  if (next == 0) return -1;
  return static_cast<int>(std::max<int64_t>(0, next - MonotonicMs()));
}

void Agent::RunDeadlines() {
  int64_t now = MonotonicMs();
  std::vector<Op*> due;
  for (const auto& [op, d] : deadlines_)
    if (d <= now) due.push_back(op);
  for (Op* op : due) {
    deadlines_.erase(op);
    op->OnDeadline();
  }
  if (pending_deadline_ && pending_deadline_ <= now) {
    loop_.Remove(pending_.get());
    if (cfg_.guest_port) {
      WaitForHost(std::move(pending_), true);
    } else {
      pending_.Reset();
    }
    pending_deadline_ = 0;
  }
  CheckPort();
  ReapLingeringCgroups();
}

int Agent::Run() {
  if (!loop_.Init().ok()) return 1;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigfd_.Reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd_) return 1;
  conn_handler_ = std::make_unique<ConnHandler>(this, false);
  signal_handler_ = std::make_unique<SignalHandler>(this);
  if (!loop_.Add(sigfd_.get(), EPOLLIN, signal_handler_.get()).ok()) return 1;
  if (conn_) {
    fcntl(conn_.get(), F_SETFL, O_NONBLOCK);
    if (!loop_.Add(conn_.get(), EPOLLIN, conn_handler_.get()).ok()) return 1;
  }
  if (listen_) {
    listen_handler_ = std::make_unique<ListenHandler>(this);
    fcntl(listen_.get(), F_SETFL, O_NONBLOCK);
    if (!loop_.Add(listen_.get(), EPOLLIN, listen_handler_.get()).ok()) return 1;
  }
  OnSigchld();  // children that exited before the signalfd existed
  while (true) {
    if (!conn_ && !listen_ && !port_ && !pending_) return 0;  // nobody can ever talk to us again
    // Orphaned for too long: end the sandbox (PID 1 exiting takes everything with it).
    if (!conn_ && orphan_deadline_ && MonotonicMs() >= orphan_deadline_) return 0;
    if (!loop_.RunOnce(NextTimeoutMs()).ok()) return 1;
    RunDeadlines();
    if (conn_ && out_pos_ < out_.size()) OnConnWritable();
    FlushRetired();
  }
}

}  // namespace dsec::agent
