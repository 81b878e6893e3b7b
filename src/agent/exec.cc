#include "agent/exec.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstring>

#include "agent/zygote_link.h"
#include "base/clock.h"
#include "base/fd_passing.h"

namespace dsec::agent {

using protocol::FrameType;
using protocol::Json;

namespace {

constexpr size_t kReadChunk = 64 * 1024;
// The edge keeps at most this much stdin unacknowledged; more is a protocol violation.
constexpr size_t kStdinLimit = 4 << 20;
// How long a killed exec waits for its processes to be gone before it answers anyway.
constexpr int64_t kSettleMs = 2000;

class ExecOp;

class OutStream : public EventHandler {
 public:
  OutStream(ExecOp* op, UniqueFd fd, uint8_t stream)
      : op_(op), fd_(std::move(fd)), stream_(stream) {}
  void OnEvent(uint32_t events) override;
  // Reads what is available now (up to `budget` reads); false at EOF.
  bool ReadAvailable(int budget);
  UniqueFd& fd() { return fd_; }
  bool eof = false;
  bool paused = false;

 private:
  ExecOp* op_;
  UniqueFd fd_;
  uint8_t stream_;
};

class StdinWriter : public EventHandler {
 public:
  explicit StdinWriter(ExecOp* op) : op_(op) {}
  void OnEvent(uint32_t) override;

 private:
  ExecOp* op_;
};

// The call socket of an fncall (zygote_link.h): the call's end result.
class CallReader : public EventHandler {
 public:
  explicit CallReader(ExecOp* op) : op_(op) {}
  void OnEvent(uint32_t) override;

 private:
  ExecOp* op_;
};

class ExecOp : public Op {
 public:
  ExecOp(Agent* agent, uint32_t channel, protocol::ExecSpec spec, ExecSink* sink = nullptr)
      : Op(agent, channel),
        spec_(std::move(spec)),
        sink_(sink),
        stdin_writer_(this),
        call_reader_(this) {}
  pid_t pid() const { return child_.pid; }

  ~ExecOp() override {
    EndCall();
    for (auto* s : {out_.get(), err_.get()})
      if (s && s->fd()) agent_->loop().Remove(s->fd().get());
    if (stdin_w_) agent_->loop().Remove(stdin_w_.get());
  }

  Status Start() {
    if (agent_->active_processes() >= static_cast<int>(agent_->config().max_execs))
      return ResourceExhausted("too many concurrent execs in this sandbox (max " +
                               std::to_string(agent_->config().max_execs) + ")");
    SpawnRequest req;
    req.argv = spec_.argv;
    req.env = spec_.env;
    req.cwd = spec_.cwd;
    req.uid = spec_.uid;
    req.gid = spec_.gid;
    req.root_caps = spec_.root_caps;
    UniqueFd child_in, child_out, child_err;
    if (spec_.tty) {
      DSEC_RETURN_IF_ERROR(OpenPty(&child_in));
      req.stdin_fd = req.stdout_fd = req.stderr_fd = child_in.get();
      req.controlling_tty = true;
    } else {
      int p[2];
      if (pipe2(p, O_CLOEXEC) < 0) return ErrnoError("pipe2");
      child_out.Reset(p[1]);
      out_ = std::make_unique<OutStream>(this, UniqueFd(p[0]), protocol::kStdout);
      if (pipe2(p, O_CLOEXEC) < 0) return ErrnoError("pipe2");
      child_err.Reset(p[1]);
      err_ = std::make_unique<OutStream>(this, UniqueFd(p[0]), protocol::kStderr);
      req.stdout_fd = child_out.get();
      req.stderr_fd = child_err.get();
      if (spec_.stdin_stream || !spec_.stdin_data.empty()) {
        if (pipe2(p, O_CLOEXEC) < 0) return ErrnoError("pipe2");
        child_in.Reset(p[0]);
        stdin_w_.Reset(p[1]);
        req.stdin_fd = child_in.get();
        stdin_buf_ = std::move(spec_.stdin_data);
        stdin_eof_ = !spec_.stdin_stream;
      }
    }
    start_ms_ = MonotonicUs() / 1000.0;
    if (spec_.fncall) {
      if (spec_.tty) return InvalidArgument("an fncall has no terminal");
      DSEC_ASSIGN_OR_RETURN(call_, SendZygoteCall(*agent_, protocol::ToJson(*spec_.fncall).dump(),
                                                  req.stdin_fd, req.stdout_fd, req.stderr_fd));
      DSEC_RETURN_IF_ERROR(agent_->loop().Add(call_.get(), EPOLLIN, &call_reader_));
    } else {
      DSEC_ASSIGN_OR_RETURN(child_, Spawn(*agent_, req));
      agent_->WatchChild(child_.pid, this);
    }
    agent_->AdjustActive(1);
    counted_ = true;
    for (auto* s : {out_.get(), err_.get()}) {
      if (!s) continue;
      fcntl(s->fd().get(), F_SETFL, O_NONBLOCK);
      DSEC_RETURN_IF_ERROR(agent_->loop().Add(s->fd().get(), EPOLLIN, s));
    }
    if (stdin_w_) {
      fcntl(stdin_w_.get(), F_SETFL, O_NONBLOCK);
      DSEC_RETURN_IF_ERROR(agent_->loop().Add(stdin_w_.get(), EPOLLOUT, &stdin_writer_));
      stdin_registered_ = true;
      PumpStdin();
    }
    if (spec_.timeout_ms > 0) agent_->SetDeadline(this, MonotonicMs() + spec_.timeout_ms);
    // An fncall has started once its call's init took it (OnCallEvent).
    if (!sink_ && !spec_.fncall)
      agent_->SendJson(FrameType::kEvent, channel_, {{"started", {{"pid", child_.pid}}}});
    return OkStatus();
  }

  // --- output ---
  void Deliver(uint8_t stream, const char* data, size_t n) {
    uint64_t& total = stream == protocol::kStderr ? err_bytes_ : out_bytes_;
    bool& trunc = stream == protocol::kStderr ? err_trunc_ : out_trunc_;
    uint64_t cap = spec_.max_output_bytes;
    size_t keep = total >= cap ? 0 : static_cast<size_t>(std::min<uint64_t>(n, cap - total));
    total += n;
    if (keep < n) trunc = true;
    if (sink_) {
      if (keep) sink_->OnOutput(stream, std::string_view(data, keep));
      return;
    }
    for (size_t off = 0; off < keep; off += protocol::kDataChunk) {
      size_t len = std::min(protocol::kDataChunk, keep - off);
      agent_->Send(FrameType::kData, stream, channel_, std::string_view(data + off, len));
    }
  }

  void OnStreamEvent(OutStream* s) {
    if (s->eof) return;
    if (!sink_ && !agent_->OutputHasRoom() && !child_exited_) {
      // Backpressure: stop reading until the edge drained the outgoing queue.
      agent_->loop().Modify(s->fd().get(), 0, s);
      s->paused = true;
      agent_->WaitForRoom(this);
      return;
    }
    if (!s->ReadAvailable(4)) StreamEof(s);
  }

  void StreamEof(OutStream* s) {
    s->eof = true;
    agent_->loop().Remove(s->fd().get());
    s->fd().Reset();
  }

  void OnRoom() override {
    for (auto* s : {out_.get(), err_.get()}) {
      if (s && s->paused && !s->eof) {
        s->paused = false;
        agent_->loop().Modify(s->fd().get(), EPOLLIN, s);
      }
    }
  }

  // --- stdin ---
  void OnData(const protocol::Frame& f) override {
    if (!stdin_w_ && !stdin_eof_) return;
    if (f.stream() != protocol::kStdin) return;
    if (!stdin_closed_) {
      if (stdin_buf_.size() + f.payload.size() > kStdinLimit) {
        agent_->Send(FrameType::kLog, 0, channel_, "stdin window exceeded; stdin closed");
        CloseStdin();
        return;
      }
      stdin_buf_ += f.payload;
    }
    if (f.eof()) stdin_eof_ = true;
    PumpStdin();
  }

  void PumpStdin() {
    if (!stdin_w_) return;
    size_t written = 0;
    while (!stdin_buf_.empty()) {
      ssize_t n =
          write(stdin_w_.get(), stdin_buf_.data(), std::min<size_t>(stdin_buf_.size(), 65536));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        CloseStdin();  // EPIPE: the command closed its stdin; the rest is discarded
        return;
      }
      stdin_buf_.erase(0, static_cast<size_t>(n));
      written += static_cast<size_t>(n);
    }
    if (written && spec_.stdin_stream && agent_->connected())
      agent_->SendJson(FrameType::kEvent, channel_, {{"stdin_ack", written}});
    if (stdin_buf_.empty() && stdin_eof_) {
      // A terminal has no end of file, only the EOF character (^D) a reader in canonical mode
      // takes as one; send it once when the caller's input ended (not when none was asked for).
      if (pty_ && spec_.stdin_stream) (void)!write(stdin_w_.get(), "\x04", 1);
      CloseStdin();
    } else if (stdin_registered_) {
      agent_->loop().Modify(stdin_w_.get(), stdin_buf_.empty() ? 0u : uint32_t{EPOLLOUT},
                            &stdin_writer_);
    }
  }

  void CloseStdin() {
    if (stdin_w_) {
      agent_->loop().Remove(stdin_w_.get());
      stdin_w_.Reset();
    }
    stdin_buf_.clear();
    stdin_closed_ = true;
  }

  // --- control ---
  void OnControl(const Json& j) override {
    if (auto it = j.find("signal"); it != j.end() && it->is_number_integer()) {
      int sig = it->get<int>();
      if (sig > 0 && sig < 65 && !child_exited_ && child_.pid > 0) kill(-child_.pid, sig);
    }
    if (j.contains("kill") && !child_exited_) {
      killed_ = true;
      KillTree();
    }
    if (auto it = j.find("resize"); it != j.end() && it->is_array() && it->size() == 2 && pty_) {
      winsize ws{};
      ws.ws_col = static_cast<unsigned short>((*it)[0].get<int>());
      ws.ws_row = static_cast<unsigned short>((*it)[1].get<int>());
      ioctl(out_->fd().get(), TIOCSWINSZ, &ws);
    }
    if (j.contains("stdin_close")) {
      stdin_eof_ = true;
      PumpStdin();
    }
  }

  // An fncall ends when its call socket closes: the call's init exits, and with it every
  // process in the call's pid namespace.
  void EndCall() {
    if (!call_) return;
    agent_->loop().Remove(call_.get());
    call_.Reset();
  }

  void OnCallEvent() {
    std::string buf;
    std::vector<UniqueFd> fds;
    auto n = RecvWithFds(call_.get(), 1024, 0, &buf, &fds);
    if (!n.ok() && (n.status().code() == StatusCode::kUnavailable)) return;
    if (n.ok() && *n > 0 && !taken_) {
      auto j = protocol::ParseJson(buf);
      if (j.ok() && j->contains("taken")) {
        taken_ = true;
        if (!sink_) agent_->SendJson(FrameType::kEvent, channel_, {{"started", {{"pid", 0}}}});
        return;
      }
    }
    EndCall();
    int status = SIGKILL;  // gone without a word: killed (the edge checks for an OOM kill)
    if (n.ok() && *n == 0) {
      // The zygote may have said why it could not serve the call before it went away.
      std::string why = ZygoteError(*agent_);
      if (!why.empty()) {
        std::string msg = "dsec: fncall worker: " + why + "\n";
        Deliver(protocol::kStderr, msg.data(), msg.size());
      } else if (!taken_ && !sink_ && out_bytes_ == 0 && err_bytes_ == 0) {
        // No call process ever had it (its zygote died with the call still queued, or the
        // pre-forked process failed before taking it): nothing ran. An error before "started"
        // tells the pool to give the call to another worker.
        Release();
        agent_->FinishWithError(this,
                                Unavailable("the fncall worker lost the call before it started"));
        return;
      }
    }
    if (n.ok() && *n > 0) {
      auto j = protocol::ParseJson(buf);
      if (j.ok() && j->contains("status") && (*j)["status"].is_number_integer()) {
        status = (*j)["status"].get<int>();
      } else if (j.ok() && j->contains("error") && (*j)["error"].is_string()) {
        std::string msg = "dsec: fncall: " + (*j)["error"].get<std::string>() + "\n";
        Deliver(protocol::kStderr, msg.data(), msg.size());
        status = 126 << 8;
      }
    }
    OnChildExit(0, status);
  }

  void KillTree() {
    if (spec_.fncall) {
      EndCall();
      if (!child_exited_ && !cancelled_) OnChildExit(0, SIGKILL);
      return;
    }
    if (child_.pid <= 0) return;  // never started: kill(-1) would hit every process
    if (!child_.cgroup.empty()) KillCgroup(*agent_, child_.cgroup);
    // Also by pid while it is unreaped (so the pid is still ours): a kill that lands before
    // the child moved itself into its cgroup finds that cgroup empty. Until it has exec'd it
    // cannot have forked, so the process (and its group, once it made one) is all there is.
    if (!child_exited_) {
      kill(-child_.pid, SIGKILL);
      kill(child_.pid, SIGKILL);
    }
  }

  void OnDeadline() override {
    if (settling_) {
      Settle();
      return;
    }
    timed_out_ = true;
    KillTree();
  }

  void Cancel() override {
    cancelled_ = true;
    agent_->SetDeadline(this, 0);
    if (spec_.fncall) KillTree();
    if (!child_exited_ && child_.pid > 0) {
      KillTree();
      agent_->UnwatchChild(child_.pid);  // the loop's generic reaper collects it
    }
    Release();
  }

  void OnChildExit(pid_t, int status) override {
    if (child_exited_) return;
    child_exited_ = true;
    status_ = status;
    agent_->SetDeadline(this, 0);
    if (timed_out_) KillTree();  // anything still in the exec's cgroup goes with it
    if (timed_out_ || killed_) {
      settle_until_ = MonotonicMs() + kSettleMs;
      settling_ = true;
      Settle();
      return;
    }
    Complete();
  }

  // A killed command answers once every process of its cgroup has exited and been reaped, so
  // that nothing of it is left when the exec returns: a process can take a while to act on its
  // SIGKILL (one throttled by the sandbox's CPU quota runs again only in the next period).
  // Checked every 2 ms for at most kSettleMs; a process stuck beyond that (uninterruptible
  // sleep) is left to the lingering-cgroup sweep.
  void Settle() {
    int64_t now = MonotonicMs();
    if (now < settle_until_ && CgroupPopulated(*agent_, child_.cgroup)) {
      agent_->SetDeadline(this, now + 2);
      return;
    }
    settling_ = false;
    agent_->ReapChildren();  // they were re-parented to the agent: collect them before answering
    Complete();
  }

  void Complete() {
    int status = status_;
    // What the command wrote before exiting is in the pipes; take it all, then answer.
    for (auto* s : {out_.get(), err_.get()})
      if (s && !s->eof && !s->ReadAvailable(64)) StreamEof(s);
    std::string err = ReadSpawnError(child_.err_pipe.get());
    if (!err.empty()) Deliver(protocol::kStderr, err.data(), err.size());
    protocol::ExecResult r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
      r.signal = WTERMSIG(status);
      r.exit_code = 128 + r.signal;
    }
    r.timed_out = timed_out_;
    r.stdout_truncated = out_trunc_;
    r.stderr_truncated = err_trunc_;
    r.stdout_bytes = out_bytes_;
    r.stderr_bytes = err_bytes_;
    r.duration_ms = MonotonicUs() / 1000.0 - start_ms_;
    r.pid = std::max(0, static_cast<int>(child_.pid));
    Release();
    if (sink_) return sink_->OnExit(r);
    agent_->Finish(this, protocol::ToJson(r));
  }

 private:
  friend class OutStream;
  friend class StdinWriter;
  friend class CallReader;

  Status OpenPty(UniqueFd* slave) {
    UniqueFd master(open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master) return ErrnoError("open /dev/ptmx");
    int unlock = 0;
    if (ioctl(master.get(), TIOCSPTLCK, &unlock) < 0) return ErrnoError("TIOCSPTLCK");
    int s = ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (s < 0) return ErrnoError("TIOCGPTPEER");
    slave->Reset(s);
    // The command must own its terminal to reopen /dev/tty.
    if (fchown(s, spec_.uid, spec_.gid) < 0) return ErrnoError("fchown pty");
    winsize ws{};
    ws.ws_col = spec_.cols;
    ws.ws_row = spec_.rows;
    ioctl(s, TIOCSWINSZ, &ws);
    // Input goes to the same master: a second descriptor so stdin has its own epoll entry.
    int w = fcntl(master.get(), F_DUPFD_CLOEXEC, 0);
    if (w < 0) return ErrnoError("dup pty master");
    stdin_w_.Reset(w);
    stdin_buf_ = std::move(spec_.stdin_data);
    stdin_eof_ = !spec_.stdin_stream;
    out_ = std::make_unique<OutStream>(this, std::move(master), protocol::kStdout);
    pty_ = true;
    return OkStatus();
  }

  // Hands still-open pipes to drains, frees the concurrency slot, cleans the cgroup.
  void Release() {
    if (released_) return;
    released_ = true;
    if (counted_) agent_->AdjustActive(-1);
    CloseStdin();
    std::string cg = child_.cgroup;
    bool handed = false;
    for (auto* s : {out_.get(), err_.get()}) {
      if (!s || s->eof || !s->fd()) continue;
      agent_->loop().Remove(s->fd().get());
      if (cancelled_) {
        s->fd().Reset();
        continue;
      }
      agent_->AdoptDrain(std::make_unique<Drain>(agent_, std::move(s->fd()), handed ? "" : cg));
      handed = true;
    }
    if (!handed && !cg.empty() && !RemoveCgroup(*agent_, cg)) agent_->AddLingeringCgroup(cg);
  }

  protocol::ExecSpec spec_;
  ExecSink* sink_;
  Spawned child_;
  std::unique_ptr<OutStream> out_, err_;
  UniqueFd stdin_w_;
  StdinWriter stdin_writer_;
  CallReader call_reader_;
  UniqueFd call_;  // fncall: the call socket
  std::string stdin_buf_;
  bool stdin_eof_ = false, stdin_closed_ = false, stdin_registered_ = false;
  bool pty_ = false, child_exited_ = false, timed_out_ = false, cancelled_ = false;
  bool counted_ = false, released_ = false;
  bool killed_ = false, settling_ = false;
  bool taken_ = false;  // fncall: the call's init has the call
  int status_ = 0;
  int64_t settle_until_ = 0;
  uint64_t out_bytes_ = 0, err_bytes_ = 0;
  bool out_trunc_ = false, err_trunc_ = false;
  double start_ms_ = 0;
};

void OutStream::OnEvent(uint32_t) { op_->OnStreamEvent(this); }

bool OutStream::ReadAvailable(int budget) {
  char buf[kReadChunk];
  for (int i = 0; i < budget; ++i) {
    ssize_t n = read(fd_.get(), buf, sizeof buf);
    if (n > 0) {
      op_->Deliver(stream_, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    return false;  // EOF, or EIO on a pty whose last writer closed
  }
  return true;
}

void StdinWriter::OnEvent(uint32_t) { op_->PumpStdin(); }

void CallReader::OnEvent(uint32_t) { op_->OnCallEvent(); }

}  // namespace

std::unique_ptr<Op> StartExec(Agent* agent, uint32_t channel, protocol::ExecSpec spec,
                              Status* error) {
  auto op = std::make_unique<ExecOp>(agent, channel, std::move(spec));
  *error = op->Start();
  if (!error->ok()) {
    op->Cancel();
    return nullptr;
  }
  return op;
}

std::unique_ptr<Op> StartDetachedExec(Agent* agent, protocol::ExecSpec spec, ExecSink* sink,
                                      int* pid, Status* error) {
  spec.stdin_stream = false;
  auto op = std::make_unique<ExecOp>(agent, 0, std::move(spec), sink);
  *error = op->Start();
  if (!error->ok()) {
    op->Cancel();
    return nullptr;
  }
  *pid = op->pid();
  return op;
}

void KillDetachedExec(Op* op) { op->OnControl(Json{{"kill", true}}); }

Drain::Drain(Agent* agent, UniqueFd fd, std::string cgroup)
    : agent_(agent), fd_(std::move(fd)), cgroup_(std::move(cgroup)) {
  if (!agent_->loop().Add(fd_.get(), EPOLLIN, this).ok()) fd_.Reset();
}

Drain::~Drain() {
  if (fd_) agent_->loop().Remove(fd_.get());
}

void Drain::OnEvent(uint32_t) {
  if (!fd_) return;
  char buf[kReadChunk];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = read(fd_.get(), buf, sizeof buf);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    break;
  }
  agent_->loop().Remove(fd_.get());
  fd_.Reset();
  if (!cgroup_.empty() && !RemoveCgroup(*agent_, cgroup_)) agent_->AddLingeringCgroup(cgroup_);
  agent_->RetireDrain(this);
}

}  // namespace dsec::agent
