#include "agent/shell.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <set>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"

namespace dsec::agent {

using protocol::FrameType;

namespace {

constexpr char kBootstrap[] =
    "while IFS= builtin read -r -d '' __dsec_cmd <&3 && "
    "IFS= builtin read -r -d '' __dsec_mark <&3; do\n"
    "  builtin eval \"$__dsec_cmd\" </dev/null 3<&- 4>&-\n"
    "  __dsec_rc=$?\n"
    "  builtin printf '%s' \"$__dsec_mark\"\n"
    "  builtin printf '%s' \"$__dsec_mark\" >&2\n"
    "  builtin printf '%s %s\\n' \"$__dsec_mark\" \"$__dsec_rc\" >&4\n"
    "done\n";

// The same loop for a POSIX sh (an image without bash): `read` has no NUL delimiter there, so
// each command comes as one line with every byte but a few safe ones as a \0ooo escape
// (EncodeForSh), which printf %b turns back (the "." keeps trailing newlines through $(...)).
// `command` keeps a function the user defines from standing in for a builtin.
constexpr char kShBootstrap[] =
    "while IFS= command read -r __dsec_cmd <&3 && IFS= command read -r __dsec_mark <&3; do\n"
    "  __dsec_cmd=$(command printf '%b.' \"$__dsec_cmd\")\n"
    "  eval \"${__dsec_cmd%.}\" </dev/null 3<&- 4>&-\n"
    "  __dsec_rc=$?\n"
    "  command printf '%s' \"$__dsec_mark\"\n"
    "  command printf '%s' \"$__dsec_mark\" >&2\n"
    "  command printf '%s %s\\n' \"$__dsec_mark\" \"$__dsec_rc\" >&4\n"
    "done\n";

std::string EncodeForSh(const std::string& s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    if (c != 0 && (isalnum(c) || strchr(" _./,:=+-@%^", c) != nullptr)) {
      out.push_back(static_cast<char>(c));
    } else {
      char esc[8];
      snprintf(esc, sizeof esc, "\\0%03o", c);
      out += esc;
    }
  }
  return out;
}

constexpr int kStuckGraceMs = 2000;

// The parent of `pid` (field 4 of /proc/PID/stat, after the parenthesized name), 0 if gone.
pid_t ParentOf(pid_t pid) {
  auto st = ReadFileToString("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!st.ok()) return 0;
  size_t close = st->rfind(')');
  if (close == std::string::npos) return 0;
  auto fields = SplitString(std::string_view(*st).substr(close + 1), ' ', true);
  if (fields.size() < 2) return 0;
  return static_cast<pid_t>(ParseInt64(fields[1]).value_or(0));
}

// The processes of the session that the running command made: not bash, not one that was there
// before the command started (an earlier command's background job), nor a descendant of one.
// The cgroup is frozen while this runs, so the tree holds still.
std::vector<pid_t> CommandPids(const std::vector<pid_t>& now, const std::set<pid_t>& before,
                               pid_t bash) {
  std::set<pid_t> in_session(now.begin(), now.end());
  std::vector<pid_t> out;
  for (pid_t p : now) {
    if (p == bash) continue;
    bool earlier = false;
    pid_t cur = p;
    for (int depth = 0; depth < 4096 && cur > 0 && cur != bash && in_session.count(cur); ++depth) {
      if (before.count(cur)) {
        earlier = true;
        break;
      }
      cur = ParentOf(cur);
    }
    if (!earlier) out.push_back(p);
  }
  return out;
}

}  // namespace

// Bound to the channel of one running command.
class ShellRunOp : public Op {
 public:
  ShellRunOp(Agent* agent, uint32_t channel, ShellSession* s, uint64_t max_output,
             std::set<pid_t> before)
      : Op(agent, channel),
        session_(s),
        max_output_(max_output),
        start_ms_(MonotonicUs() / 1000.0),
        before_(std::move(before)) {}
  ~ShellRunOp() override {
    if (session_) session_->DetachRun();
  }

  void Deliver(uint8_t stream, std::string_view data) {
    uint64_t& total = stream == protocol::kStderr ? err_bytes_ : out_bytes_;
    bool& trunc = stream == protocol::kStderr ? err_trunc_ : out_trunc_;
    size_t keep = total >= max_output_ ? 0 : std::min<uint64_t>(data.size(), max_output_ - total);
    total += data.size();
    if (keep < data.size()) trunc = true;
    for (size_t off = 0; off < keep; off += protocol::kDataChunk)
      agent_->Send(FrameType::kData, stream, channel_,
                   data.substr(off, std::min(protocol::kDataChunk, keep - off)));
  }

  void Complete(int exit_code, bool session_ended) {
    agent_->SetDeadline(this, 0);
    protocol::ExecResult r;
    r.exit_code = exit_code;
    if (exit_code > 128 && session_ended) r.signal = exit_code - 128;
    r.timed_out = timed_out_;
    r.stdout_truncated = out_trunc_;
    r.stderr_truncated = err_trunc_;
    r.stdout_bytes = out_bytes_;
    r.stderr_bytes = err_bytes_;
    r.duration_ms = MonotonicUs() / 1000.0 - start_ms_;
    if (session_) session_->DetachRun();
    session_ = nullptr;
    agent_->Finish(this, protocol::Encode(protocol::ShellRunResponse{r, session_ended}));
  }

  void OnDeadline() override {
    if (!session_) return;
    if (!timed_out_) {
      timed_out_ = true;
      // Kill the command's processes, not bash and not what earlier commands left running in
      // the background; bash then reports and carries on. Frozen first, so nothing can fork
      // past the kill.
      FreezeCgroup(*agent_, session_->proc_.cgroup, true);
      for (pid_t p :
           CommandPids(CgroupPids(*agent_, session_->proc_.cgroup), before_, session_->proc_.pid))
        kill(p, SIGKILL);
      FreezeCgroup(*agent_, session_->proc_.cgroup, false);
      agent_->SetDeadline(this, MonotonicMs() + kStuckGraceMs);
      return;
    }
    // bash itself is busy (a builtin loop): end the session.
    session_->Close();
  }

  void Cancel() override {
    agent_->SetDeadline(this, 0);
    if (session_) session_->DetachRun();  // the command finishes unobserved
    session_ = nullptr;
  }

 private:
  ShellSession* session_;
  uint64_t max_output_;
  double start_ms_;
  std::set<pid_t> before_;  // the session's processes when the command started
  bool timed_out_ = false;
  uint64_t out_bytes_ = 0, err_bytes_ = 0;
  bool out_trunc_ = false, err_trunc_ = false;
};

class ShellSession::Reader : public EventHandler {
 public:
  Reader(ShellSession* s, UniqueFd fd, int which) : s_(s), fd_(std::move(fd)), which_(which) {}
  ~Reader() override {
    if (fd_) s_->agent_->loop().Remove(fd_.get());
  }
  void OnEvent(uint32_t) override { s_->OnReadable(which_); }
  UniqueFd& fd() { return fd_; }

 private:
  ShellSession* s_;
  UniqueFd fd_;
  int which_;  // 0 stdout, 1 stderr, 2 status
};

// Watches the bash process for the session (bash exits -> session ends).
class ShellSession::ExitWatcher : public Op {
 public:
  ExitWatcher(Agent* agent, ShellSession* s) : Op(agent, 0), s_(s) {}
  void Cancel() override {}
  void OnChildExit(pid_t, int status) override { s_->OnExit(status); }

 private:
  ShellSession* s_;
};

StatusOr<std::unique_ptr<ShellSession>> ShellSession::Open(Agent* agent, std::string id,
                                                           const protocol::ExecSpec& spec) {
  if (agent->active_processes() >= static_cast<int>(agent->config().max_execs))
    return ResourceExhausted("too many concurrent execs and shells in this sandbox");
  // bash where the image has it, else its POSIX sh.
  bool posix = access("/bin/bash", X_OK) != 0;
  if (posix && access("/bin/sh", X_OK) != 0)
    return FailedPrecondition("shell sessions need /bin/bash or /bin/sh in the sandbox image");
  std::unique_ptr<ShellSession> s(new ShellSession(agent, std::move(id)));
  s->posix_ = posix;
  int p[2];
  UniqueFd pipes[8];
  for (int i = 0; i < 4; ++i) {
    if (pipe2(p, O_CLOEXEC) < 0) return ErrnoError("pipe2");
    pipes[2 * i].Reset(p[0]);
    pipes[2 * i + 1].Reset(p[1]);
  }
  // 0: stdout, 1: stderr, 2: commands (bash fd 3), 3: status (bash fd 4)
  SpawnRequest req;
  if (posix)
    req.argv = {"/bin/sh", "-c", kShBootstrap, "dsec-shell"};
  else
    req.argv = {"/bin/bash", "--noprofile", "--norc", "-c", kBootstrap, "dsec-shell"};
  req.env = spec.env;
  req.cwd = spec.cwd;
  req.uid = spec.uid;
  req.gid = spec.gid;
  req.root_caps = spec.root_caps;
  req.stdout_fd = pipes[1].get();
  req.stderr_fd = pipes[3].get();
  req.extra_fds = {pipes[4].get(), pipes[7].get()};
  req.cgroup_prefix = 's';
  DSEC_ASSIGN_OR_RETURN(s->proc_, Spawn(*agent, req));
  agent->AdjustActive(1);
  s->cmd_w_ = std::move(pipes[5]);
  // Commands are written without blocking PID 1: room for large ones, and a shell that stops
  // reading its commands (code in it can get at the pipe) ends instead of wedging the agent.
  fcntl(s->cmd_w_.get(), F_SETPIPE_SZ, 1 << 20);
  fcntl(s->cmd_w_.get(), F_SETFL, O_NONBLOCK);
  s->out_ = std::make_unique<Reader>(s.get(), std::move(pipes[0]), 0);
  s->err_ = std::make_unique<Reader>(s.get(), std::move(pipes[2]), 1);
  s->status_ = std::make_unique<Reader>(s.get(), std::move(pipes[6]), 2);
  for (Reader* r : {s->out_.get(), s->err_.get(), s->status_.get()}) {
    fcntl(r->fd().get(), F_SETFL, O_NONBLOCK);
    DSEC_RETURN_IF_ERROR(agent->loop().Add(r->fd().get(), EPOLLIN, r));
  }
  s->watcher_ = std::make_unique<ExitWatcher>(agent, s.get());
  agent->WatchChild(s->proc_.pid, s->watcher_.get());
  return s;
}

ShellSession::ShellSession(Agent* agent, std::string id) : agent_(agent), id_(std::move(id)) {}

ShellSession::~ShellSession() {
  if (run_) run_->Complete(128 + SIGKILL, true);  // closed while a command ran
  if (alive_) {
    // OnExit will not run for us any more: account for the session here. bash is reaped by
    // the agent's generic reaper; its cgroup goes once empty.
    Close();
    alive_ = false;
    agent_->AdjustActive(-1);
    if (!RemoveCgroup(*agent_, proc_.cgroup)) agent_->AddLingeringCgroup(proc_.cgroup);
  }
  if (proc_.pid > 0) agent_->UnwatchChild(proc_.pid);
}

void ShellSession::Close() {
  if (!alive_) return;
  if (proc_.pid > 0) KillCgroup(*agent_, proc_.cgroup);
}

StatusOr<std::unique_ptr<Op>> ShellSession::Run(uint32_t channel, const std::string& command,
                                                int64_t timeout_ms, uint64_t max_output) {
  if (!alive_) return FailedPrecondition("shell " + id_ + " has exited");
  if (run_) return FailedPrecondition("shell " + id_ + " is busy with another command");
  if (command.find('\0') != std::string::npos)
    return InvalidArgument("command must not contain NUL bytes");
  marker_ = "__DSEC_" + RandomHex(16) + "__";
  for (int i = 0; i < 2; ++i) {
    // Output produced while idle belongs to no command.
    tail_[i].clear();
    marker_seen_[i] = false;
  }
  status_seen_ = false;
  status_buf_.clear();
  // What runs in the session before this command: left alone by its timeout.
  std::set<pid_t> before;
  for (pid_t p : CgroupPids(*agent_, proc_.cgroup))
    if (p != proc_.pid) before.insert(p);
  std::string msg = posix_ ? EncodeForSh(command) : command;
  msg.push_back(posix_ ? '\n' : '\0');
  msg += marker_;
  msg.push_back(posix_ ? '\n' : '\0');
  if (msg.size() > (1 << 20) - 4096) return TooLarge("shell commands are limited to 1 MiB");
  ssize_t n;
  do {
    n = write(cmd_w_.get(), msg.data(), msg.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(msg.size())) {
    // The pipe was emptied after every command; if it has no room now, something in the
    // session took it over. End the session rather than block.
    Close();
    return FailedPrecondition("shell " + id_ + " stopped reading commands; it was ended");
  }
  auto op = std::make_unique<ShellRunOp>(agent_, channel, this, max_output, std::move(before));
  run_ = op.get();
  if (timeout_ms > 0) agent_->SetDeadline(op.get(), MonotonicMs() + timeout_ms);
  return std::unique_ptr<Op>(std::move(op));
}

void ShellSession::OnReadable(int which) {
  Reader* r = which == 0 ? out_.get() : which == 1 ? err_.get() : status_.get();
  char buf[65536];
  for (int i = 0; i < 16; ++i) {
    ssize_t n = read(r->fd().get(), buf, sizeof buf);
    if (n > 0) {
      Feed(which, buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    agent_->loop().Remove(r->fd().get());  // EOF: bash is exiting
    return;
  }
}

void ShellSession::Feed(int which, const char* data, size_t n) {
  if (which == 2) {
    status_buf_.append(data, n);
    if (status_buf_.size() > 4096) status_buf_.erase(0, status_buf_.size() - 4096);
    auto pos = marker_.empty() ? std::string::npos : status_buf_.find(marker_ + " ");
    if (pos != std::string::npos) {
      auto nl = status_buf_.find('\n', pos);
      if (nl != std::string::npos) {
        auto code =
            ParseInt64(status_buf_.substr(pos + marker_.size() + 1, nl - pos - marker_.size() - 1));
        status_code_ = static_cast<int>(code.value_or(-1));
        status_seen_ = true;
        status_buf_.erase(0, nl + 1);
      }
    }
    CheckDone();
    return;
  }
  if (marker_.empty() || marker_seen_[which]) return;  // idle: discard
  std::string& tail = tail_[which];
  tail.append(data, n);
  auto pos = tail.find(marker_);
  std::string_view forward;
  if (pos != std::string::npos) {
    forward = std::string_view(tail).substr(0, pos);
    marker_seen_[which] = true;
  } else {
    // Keep back what could be the start of a marker split across reads.
    size_t keep = std::min(tail.size(), marker_.size() - 1);
    forward = std::string_view(tail).substr(0, tail.size() - keep);
  }
  if (run_) run_->Deliver(which == 0 ? protocol::kStdout : protocol::kStderr, forward);
  if (marker_seen_[which]) {
    tail.clear();
  } else {
    tail.erase(0, forward.size());
  }
  CheckDone();
}

void ShellSession::CheckDone() {
  if (!(status_seen_ && marker_seen_[0] && marker_seen_[1])) return;
  int code = status_code_;
  marker_.clear();
  status_seen_ = false;
  if (run_) run_->Complete(code, false);
}

void ShellSession::OnExit(int status) {
  alive_ = false;
  agent_->AdjustActive(-1);
  agent_->UnwatchChild(proc_.pid);
  proc_.pid = -1;
  // Flush what is buffered, then report the end of the session to a running command.
  for (int w = 0; w < 3; ++w) OnReadable(w);
  for (int w = 0; w < 2; ++w)
    if (run_ && !marker_seen_[w] && !tail_[w].empty())
      run_->Deliver(w == 0 ? protocol::kStdout : protocol::kStderr, tail_[w]);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  KillCgroup(*agent_, proc_.cgroup);
  if (run_) run_->Complete(code, true);
  if (!RemoveCgroup(*agent_, proc_.cgroup)) agent_->AddLingeringCgroup(proc_.cgroup);
}

}  // namespace dsec::agent
