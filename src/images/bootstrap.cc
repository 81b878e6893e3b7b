#include "images/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>

#include "base/clock.h"
#include "base/unique_fd.h"

namespace dsec::images {

namespace {

bool DebianName(std::string_view s, size_t min_len) {
  if (s.size() < min_len || s.size() > 100) return false;
  if (!islower(static_cast<unsigned char>(s[0])) && !isdigit(static_cast<unsigned char>(s[0])))
    return false;
  for (char c : s)
    if (!islower(static_cast<unsigned char>(c)) && !isdigit(static_cast<unsigned char>(c)) &&
        c != '+' && c != '.' && c != '-')
      return false;
  return true;
}

bool VersionOrRelease(std::string_view s) {
  if (s.empty() || s.size() > 100) return false;
  for (char c : s)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '.' && c != '-' && c != '~' &&
        c != ':')
      return false;
  return true;
}

// mmdebstrap's command line: a tar of the root on stdout.
std::vector<std::string> BootstrapArgv(const BootstrapOptions& o) {
  std::vector<std::string> argv = {o.mmdebstrap, "--mode=unshare", "--format=tar",
                                   "--variant=" + o.variant};
  if (!o.packages.empty()) {
    std::string inc = "--include=";
    for (size_t i = 0; i < o.packages.size(); ++i) inc += (i ? "," : "") + o.packages[i];
    argv.push_back(inc);
  }
  argv.push_back(o.suite);
  argv.push_back("-");
  if (!o.mirror.empty()) argv.push_back(o.mirror);
  return argv;
}

// Starts mmdebstrap in a process group of its own, stdout and stderr into the pipes.
StatusOr<pid_t> SpawnBootstrap(std::vector<std::string> argv, int out_wr, int err_wr) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(out_wr, 1);
    dup2(err_wr, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // either side may win; both set the same group
  return pid;
}

// What mmdebstrap's exit status `st` says about the build.
Status BootstrapExit(const BootstrapOptions& o, int st) {
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return OkStatus();
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
    return FailedPrecondition(o.mmdebstrap + " is not installed (Debian: mmdebstrap)");
  return InternalError(o.mmdebstrap +
                       (WIFEXITED(st) ? " exited with status " + std::to_string(WEXITSTATUS(st))
                                      : " was killed by signal " + std::to_string(WTERMSIG(st))) +
                       " (see the build log)");
}

}  // namespace

Status ValidateBootstrap(const BootstrapOptions& o) {
  if (o.suite.empty() || o.suite.size() > 32)
    return InvalidArgument("a Debian suite is 1-32 letters (bookworm, trixie, ...)");
  for (char c : o.suite)
    if (!islower(static_cast<unsigned char>(c)) && c != '-')
      return InvalidArgument("Debian suite \"" + o.suite + "\": expected letters (bookworm, ...)");
  if (o.variant != "minbase" && o.variant != "apt" && o.variant != "essential" &&
      o.variant != "required" && o.variant != "important" && o.variant != "standard")
    return InvalidArgument("variant \"" + o.variant +
                           "\": expected minbase, apt, essential, required, important or standard");
  if (o.packages.size() > 256) return InvalidArgument("at most 256 packages");
  for (const auto& p : o.packages) {
    size_t cut = p.find_first_of("=/");
    std::string_view name = std::string_view(p).substr(0, cut);
    if (!DebianName(name, 2) ||
        (cut != std::string::npos && !VersionOrRelease(std::string_view(p).substr(cut + 1))))
      return InvalidArgument("package \"" + p +
                             "\": expected a Debian package name ([a-z0-9][a-z0-9+.-]+, "
                             "optionally =VERSION or /RELEASE)");
  }
  if (!o.mirror.empty() && o.mirror.rfind("http://", 0) != 0 &&
      o.mirror.rfind("https://", 0) != 0 && o.mirror.rfind("file://", 0) != 0)
    return InvalidArgument("the mirror must be an http://, https:// or file:// URL");
  return OkStatus();
}

Status Bootstrap(const BootstrapOptions& o, const std::function<Status(std::string_view)>& on_tar,
                 const std::function<void(std::string_view)>& on_log,
                 const std::atomic<bool>* cancel) {
  DSEC_RETURN_IF_ERROR(ValidateBootstrap(o));
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) < 0) return ErrnoError("pipe");
  UniqueFd out_rd(out_pipe[0]), out_wr(out_pipe[1]);
  if (pipe2(err_pipe, O_CLOEXEC) < 0) return ErrnoError("pipe");
  UniqueFd err_rd(err_pipe[0]), err_wr(err_pipe[1]);
  DSEC_ASSIGN_OR_RETURN(pid_t pid, SpawnBootstrap(BootstrapArgv(o), out_wr.get(), err_wr.get()));
  out_wr.Reset();
  err_wr.Reset();

  Status result;
  std::string line;
  bool out_open = true, err_open = true, killed = false;
  std::vector<char> buf(1 << 20);
  auto kill_tool = [&] {
    if (!killed) kill(-pid, SIGKILL);
    killed = true;
  };
  while (out_open || err_open) {
    if (cancel && cancel->load() && !killed) {
      kill_tool();
      result = Status(StatusCode::kAborted, "canceled");
    }
    if (o.deadline_ms > 0 && MonotonicMs() > o.deadline_ms && !killed) {
      kill_tool();
      result = DeadlineExceeded(o.mmdebstrap + " ran past the build's timeout");
    }
    pollfd fds[2] = {{out_open ? out_rd.get() : -1, POLLIN, 0},
                     {err_open ? err_rd.get() : -1, POLLIN, 0}};
    int n = poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) {
      kill_tool();
      if (result.ok()) result = ErrnoError("poll");
      break;
    }
    if (n <= 0) continue;
    if (fds[0].revents) {
      ssize_t r = read(out_rd.get(), buf.data(), buf.size());
      if (r > 0 && result.ok()) {
        if (Status s = on_tar(std::string_view(buf.data(), static_cast<size_t>(r))); !s.ok()) {
          result = s;
          kill_tool();
        }
      }
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) out_open = false;
    }
    if (fds[1].revents) {
      ssize_t r = read(err_rd.get(), buf.data(), buf.size());
      if (r > 0) on_log(std::string_view(buf.data(), static_cast<size_t>(r)));
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) err_open = false;
    }
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!result.ok()) return result;
  return BootstrapExit(o, st);
}

}  // namespace dsec::images
