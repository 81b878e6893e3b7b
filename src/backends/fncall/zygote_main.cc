// dsec-zygote; see zygote.h for the process structure and messages.
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "backends/fncall/zygote.h"
#include "backends/fncall/zygote_python.h"
#include "base/base64.h"
#include "base/fd_passing.h"
#include "base/file_util.h"
#include "base/status.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "isolation/credentials.h"
#include "isolation/rootfs.h"
#include "protocol/messages.h"
#include "sys/syscalls.h"

extern char** environ;

namespace dsec::fncall {
namespace {

using Json = nlohmann::json;

struct Options {
  std::string runtime = "exec";  // python | exec
  std::vector<std::string> preload;
  std::vector<std::string> command;  // exec: the code is appended as the last argument
  uid_t uid = 1000;
  gid_t gid = 1000;
  std::string workdir = "/workspace";
  uint64_t tmpfs_mb = 64;
  uint64_t inodes = 16384;
};

struct InitMsg {
  std::vector<std::string> seccomp;
  isolation::Rlimits rlimits;
};

// Exit codes of the call init before it has a call, which tell the zygote what happened.
// A call message is tiny (its request travels in a memfd): no big buffer to fill per call.
constexpr size_t kMaxCallMessage = 1024;
constexpr int kExitControlClosed = 3;
constexpr int kExitSetupFailed = 4;

void SendJson(int fd, const Json& j) {
  std::string s = j.dump();
  (void)!send(fd, s.data(), s.size(), MSG_NOSIGNAL);
}

[[noreturn]] void Fatal(int control, const std::string& what) {
  SendJson(control, {{"error", what}});
  _exit(1);
}

StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    auto eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos)
      return InvalidArgument("bad argument \"" + a + "\"");
    std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    if (k == "runtime") {
      o.runtime = v;
    } else if (k == "preload") {
      for (auto m : SplitString(v, ',', true)) o.preload.emplace_back(m);
    } else if (k == "uid" || k == "gid" || k == "tmpfs-mb" || k == "inodes") {
      auto n = ParseInt64(v);
      if (!n || *n < 0) return InvalidArgument("bad value for --" + k);
      if (k == "uid") o.uid = static_cast<uid_t>(*n);
      if (k == "gid") o.gid = static_cast<gid_t>(*n);
      if (k == "tmpfs-mb") o.tmpfs_mb = static_cast<uint64_t>(*n);
      if (k == "inodes") o.inodes = static_cast<uint64_t>(*n);
    } else if (k == "workdir") {
      o.workdir = v;
    } else {
      return InvalidArgument("unknown option --" + k);
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.runtime != "python" && o.runtime != "exec")
    return InvalidArgument("unknown runtime \"" + o.runtime + "\"");
  if (o.runtime == "exec" && o.command.empty())
    return InvalidArgument("the exec runtime needs a command after --");
  if (o.workdir.empty() || o.workdir[0] != '/' || o.workdir == "/")
    return InvalidArgument("bad --workdir");
  return o;
}

StatusOr<InitMsg> ReceiveInit(int control) {
  std::string buf;
  std::vector<UniqueFd> fds;
  DSEC_ASSIGN_OR_RETURN(size_t n, RecvWithFds(control, kMaxControlMessage, 0, &buf, &fds));
  if (n == 0) return Unavailable("agent closed the control socket");
  Json j = Json::parse(buf, nullptr, false);
  if (j.is_discarded() || !j.contains("init") || !j["init"].is_object())
    return InvalidArgument("expected an init message");
  const Json& in = j["init"];
  InitMsg m;
  if (auto it = in.find("seccomp"); it != in.end() && it->is_array()) {
    for (const auto& p : *it) {
      if (!p.is_string()) return InvalidArgument("seccomp programs must be strings");
      auto dec = Base64Decode(p.get<std::string>());
      if (!dec) return InvalidArgument("seccomp program is not base64");
      m.seccomp.push_back(std::move(*dec));
    }
  }
  if (m.seccomp.empty()) return InvalidArgument("init carries no seccomp profile for calls");
  if (auto it = in.find("rlimits"); it != in.end() && it->is_object()) {
    m.rlimits.nofile = it->value("nofile", m.rlimits.nofile);
    m.rlimits.fsize = it->value("fsize", m.rlimits.fsize);
    m.rlimits.core = it->value("core", m.rlimits.core);
    m.rlimits.stack = it->value("stack", m.rlimits.stack);
  }
  return m;
}

Status MountTmpfs(const std::string& path, const std::string& opts) {
  if (mount("tmpfs", path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) < 0)
    return ErrnoError("mount tmpfs on " + path);
  return OkStatus();
}

// "\040" etc. in /proc/self/mountinfo fields.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Every mount of the sandbox read-only in the call's namespace (each keeps its nosuid, nodev,
// noexec and atime flags), except /proc and /dev, which get their own treatment.
Status RemountAllReadonly() {
  DSEC_ASSIGN_OR_RETURN(std::string info, ReadFileToString("/proc/self/mountinfo", 4 << 20));
  for (auto line : SplitString(info, '\n', true)) {
    auto f = SplitString(line, ' ', false);
    if (f.size() < 6) continue;
    std::string target = Unescape(f[4]);
    auto under = [&](const char* dir) {
      size_t n = strlen(dir);
      return target.compare(0, n, dir) == 0 && (target.size() == n || target[n] == '/');
    };
    if (under("/proc") || under("/dev")) continue;
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
    for (auto o : SplitString(f[5], ',', true)) {
      if (o == "nosuid") flags |= MS_NOSUID;
      if (o == "nodev") flags |= MS_NODEV;
      if (o == "noexec") flags |= MS_NOEXEC;
      if (o == "noatime") flags |= MS_NOATIME;
      if (o == "nodiratime") flags |= MS_NODIRATIME;
      if (o == "relatime") flags |= MS_RELATIME;
    }
    if (mount(nullptr, target.c_str(), nullptr, flags, nullptr) < 0 && errno != ENOENT)
      return ErrnoError("remount " + target + " read-only");
  }
  return OkStatus();
}

// The sandbox's /proc masks, on the call's own /proc (classic mount(2): the zygote profile
// allows nothing newer).
Status MaskProc() {
  // (Not the agent's own entries: PID 1 here is the call's init, root-owned and
  // non-dumpable, out of the code's reach anyway.)
  for (const auto& rel : isolation::ProcMaskedPaths()) {
    std::string path = "/proc/" + rel;
    struct stat st;
    if (lstat(path.c_str(), &st) < 0) continue;  // not on this kernel
    if (S_ISDIR(st.st_mode)) {
      if (mount("tmpfs", path.c_str(), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "size=4k,nr_inodes=1,mode=0555") < 0)
        return ErrnoError("mask " + path);
      continue;
    }
    if (mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr) < 0 ||
        mount(nullptr, path.c_str(), nullptr,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC, nullptr) < 0)
      return ErrnoError("mask " + path);
  }
  for (const auto& rel : isolation::ProcReadonlyPaths()) {
    std::string path = "/proc/" + rel;
    struct stat st;
    if (lstat(path.c_str(), &st) < 0) continue;
    if (mount(path.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) < 0 ||
        mount(nullptr, path.c_str(), nullptr,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
      return ErrnoError("read-only " + path);
  }
  return OkStatus();
}

// The call's view of the sandbox: every mount read-only, then fresh writable dirs and a /proc
// of its own pid namespace (masked like the sandbox's), so no call can leave a file behind
// for the next.
Status PrepareMounts(const Options& o) {
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
    return ErrnoError("make mounts private");
  DSEC_RETURN_IF_ERROR(RemountAllReadonly());
  std::string size =
      "size=" + std::to_string(o.tmpfs_mb) + "m,nr_inodes=" + std::to_string(o.inodes);
  DSEC_RETURN_IF_ERROR(MountTmpfs(o.workdir, size + ",mode=0755,uid=" + std::to_string(o.uid) +
                                                 ",gid=" + std::to_string(o.gid)));
  if (o.workdir != "/tmp") DSEC_RETURN_IF_ERROR(MountTmpfs("/tmp", size + ",mode=1777"));
  struct stat st;
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode))
    DSEC_RETURN_IF_ERROR(MountTmpfs("/dev/shm", size + ",mode=1777"));
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    return ErrnoError("mount /proc");
  return MaskProc();
}

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p.size() > 4096 || p[0] == '/') return false;
  for (auto part : SplitString(p, '/', false))
    if (part.empty() || part == "." || part == "..") return false;
  return p.find('\0') == std::string::npos;
}

Status WriteCallFiles(const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [name, data] : files) {
    if (!SafeRelativePath(name)) return InvalidArgument("bad file name \"" + name + "\"");
    // Parents first (the tree is a fresh tmpfs owned by the call's user; no symlinks yet).
    for (size_t pos = name.find('/'); pos != std::string::npos; pos = name.find('/', pos + 1)) {
      std::string dir = name.substr(0, pos);
      if (mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) return ErrnoError("mkdir " + dir);
    }
    UniqueFd fd(open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd) return ErrnoError("create " + name);
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = write(fd.get(), data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("write " + name);
      off += static_cast<size_t>(n);
    }
  }
  return OkStatus();
}

[[noreturn]] void UserFail(const std::string& msg) {
  std::string line = "dsec: " + msg + "\n";
  (void)!write(2, line.data(), line.size());
  _exit(126);
}

StatusOr<protocol::FnCallSpec> ReadRequest(int memfd) {
  // The agent wrote it through the same open file: its offset is at the end.
  if (lseek(memfd, 0, SEEK_SET) < 0) return ErrnoError("seek request");
  DSEC_ASSIGN_OR_RETURN(std::string buf, ReadFdToString(memfd, "fncall request", kMaxRequestBytes));
  DSEC_ASSIGN_OR_RETURN(auto j, protocol::ParseJson(buf));
  return protocol::FnCallSpecFromJson(j);
}

// The user process, forked ahead of its call: it becomes the call's user at once, then waits
// for the call on the control socket, runs it, and (python) reports its exit code on `sock`
// before exiting, so the call's end does not wait for the teardown of a whole interpreter.
[[noreturn]] void UserMain(const Options& o, int control, int sock, int rc_pipe) {
  if (o.runtime == "python") PythonAfterForkChild();
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    (void)!write(oom, "1000", 4);  // the call dies first when the worker runs out of memory
    close(oom);
  }
  if (setgroups(0, nullptr) < 0 || setresgid(o.gid, o.gid, o.gid) < 0 ||
      setresuid(o.uid, o.uid, o.uid) < 0)
    _exit(kExitSetupFailed);
  if (!isolation::SetCapabilities(0).ok()) _exit(kExitSetupFailed);
  // The uid change made the process non-dumpable, which would leave its /proc/self owned by
  // root; a process that never exec'd must reset it.
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  umask(022);
  if (chdir(o.workdir.c_str()) < 0) _exit(kExitSetupFailed);

  // The call: [call socket, request memfd, stdin, stdout, stderr]. The call socket goes to
  // the init at once (it reports the outcome and owns the call's lifetime); this process
  // keeps neither it nor the control socket.
  std::string buf;
  std::vector<UniqueFd> fds;
  auto n = RecvWithFds(control, kMaxCallMessage, 5, &buf, &fds);
  if (!n.ok() || *n == 0) _exit(kExitControlClosed);
  close(control);
  if (fds.size() != 5) _exit(kExitSetupFailed);
  // The agent counts the call as started from here, before any of its code runs: a call
  // socket that closes without this (a zygote killed with the call still queued on its
  // control socket) never ran, and the pool gives it to another worker.
  SendJson(fds[0].get(), {{"taken", true}});
  if (!SendWithFds(sock, "{}", {fds[0].get()}).ok()) _exit(kExitSetupFailed);
  fds[0].Reset();
  close(sock);  // nothing but the exit code goes to the init, and only through a pipe
  for (int target = 0; target < 3; ++target)
    if (dup2(fds[2 + static_cast<size_t>(target)].get(), target) < 0) UserFail("dup2 stdio");
  auto req = ReadRequest(fds[1].get());
  fds.clear();
  if (!req.ok()) UserFail("fncall request: " + req.status().message());
  int keep = rc_pipe;
  if (o.runtime == "python") {
    // Only the exit code pipe stays, above everything the code might open first. A pipe
    // carries no fds: the code can write to it, but never hand its init anything to hold.
    keep = fcntl(rc_pipe, F_DUPFD_CLOEXEC, 1000);
    if (keep < 0) keep = rc_pipe;
  }
  sys::CloseRange(3, static_cast<unsigned>(keep) - 1, 0);
  sys::CloseRange(static_cast<unsigned>(keep) + 1, ~0U, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (Status s = WriteCallFiles(req->files); !s.ok()) UserFail(s.message());
  if (o.runtime == "python") {
    std::string filename = req->filename.empty() ? "<fncall>" : req->filename;
    const pid_t me = getpid();
    int rc = PythonRunInChild(req->code, filename);
    if (getpid() == me) {  // not a child the code forked and let run to the end
      std::string msg = Json{{"rc", rc}}.dump();
      (void)!write(keep, msg.data(), msg.size());
    }
    _exit(rc);
  }
  close(keep);
  // The zygote ignores SIGPIPE; an exec'd runtime starts with every signal at its default.
  for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  std::vector<std::string> args = o.command;
  args.push_back(req->code);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvpe(argv[0], argv.data(), environ);
  int err = errno;
  std::string line = "dsec: execve \"" + args[0] + "\": " + strerror(err) + "\n";
  (void)!write(2, line.data(), line.size());
  _exit(err == ENOENT ? 127 : 126);
}

// PID 1 of the call's pid namespace. Its exit ends every process of the call.
[[noreturn]] void CallInit(const Options& o, const InitMsg& init, int control) {
  // Signals wait in a signalfd; as the namespace's init it gets no default actions anyway.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  if (Status s = PrepareMounts(o); !s.ok()) Fatal(control, s.message());
  // Keep only what the user process needs to become the call's user, then the full profile.
  uint64_t keep = isolation::CapMask({CAP_SETUID, CAP_SETGID});
  Status s = isolation::DropBoundingSet(keep);
  if (s.ok()) s = isolation::ApplyRlimits(init.rlimits);
  if (s.ok()) s = isolation::SetCapabilities(keep);
  if (s.ok()) s = isolation::SetNoNewPrivs();
  if (s.ok()) s = isolation::InstallSeccompPrograms(init.seccomp);
  if (!s.ok()) {
    SendJson(control, {{"error", "call setup: " + s.message()}});
    _exit(kExitSetupFailed);
  }
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // the call's user cannot ptrace or read its init
  int up[2], rc[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, up) < 0) _exit(kExitSetupFailed);
  if (pipe2(rc, O_CLOEXEC) < 0) _exit(kExitSetupFailed);
  pid_t user = fork();
  if (user < 0) _exit(kExitSetupFailed);
  if (user == 0) {
    close(up[0]);
    close(rc[0]);
    UserMain(o, control, up[1], rc[1]);
  }
  close(up[1]);
  close(rc[1]);
  close(control);
  UniqueFd to_user(up[0]), rc_read(rc[0]);
  fcntl(rc_read.get(), F_SETFL, O_NONBLOCK);

  // The user process hands over the call socket once its call arrived.
  std::string buf;
  std::vector<UniqueFd> fds;
  auto n = RecvWithFds(to_user.get(), 256, 1, &buf, &fds);
  if (!n.ok() || *n == 0 || fds.size() != 1) {
    int st = 0;
    while (waitpid(user, &st, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : kExitSetupFailed);
  }
  UniqueFd call = std::move(fds[0]);
  to_user.Reset();  // the only message it carries (with its one fd) has arrived
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  pollfd p[3] = {{call.get(), POLLIN, 0}, {sfd, POLLIN, 0}, {rc_read.get(), POLLIN, 0}};
  while (true) {
    // Reap everything (orphans reparent to us); the user process decides the outcome.
    int status;
    pid_t r;
    while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
      if (r == user) {
        SendJson(call.get(), {{"status", status}});
        _exit(0);
      }
    }
    if (poll(p, 3, -1) < 0 && errno != EINTR) _exit(0);
    if (p[0].revents) _exit(0);  // the agent ended the call (or went away)
    if (p[1].revents) {
      signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {
      }
    }
    if (p[2].revents) {
      // The code's exit code, reported before the interpreter's teardown (or EOF once it
      // exec'd or exited: then its wait status decides).
      char buf[256];
      ssize_t m = read(rc_read.get(), buf, sizeof buf);
      if (m > 0) {
        Json j = Json::parse(std::string_view(buf, static_cast<size_t>(m)), nullptr, false);
        if (!j.is_discarded() && j.contains("rc") && j["rc"].is_number_integer()) {
          SendJson(call.get(), {{"status", (j["rc"].get<int>() & 0xff) << 8}});
          _exit(0);
        }
      }
      p[2].fd = -1;
    }
  }
}

int Main(int argc, char** argv) {
  const int control = kZygoteControlFd;
  auto opts = ParseArgs(argc, argv);
  if (!opts.ok()) Fatal(control, opts.status().message());
  auto init = ReceiveInit(control);
  if (!init.ok()) Fatal(control, init.status().message());
  if (opts->runtime == "python") {
    if (Status s = PythonInit(opts->preload); !s.ok()) Fatal(control, s.message());
  }
  signal(SIGPIPE, SIG_IGN);
  SendJson(control, {{"ready", {{"pid", getpid()}}}});
  int failures = 0;
  while (true) {
    // The call's init, straight into fresh pid, mount and ipc namespaces. A raw clone leaves
    // libc's cached thread id stale in the child; the init never uses it (no raise, abort or
    // pthread calls) and its own children come from fork(), which sets theirs right.
    if (opts->runtime == "python") PythonBeforeFork();
    pid_t init_pid =
        static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | SIGCHLD,
                                   nullptr, nullptr, nullptr, nullptr));
    if (opts->runtime == "python") PythonAfterForkParent();
    if (init_pid < 0) {
      if (++failures > 20) Fatal(control, std::string("clone: ") + strerror(errno));
      usleep(50000);  // e.g. the pids limit while a call's fork bomb is being torn down
      continue;
    }
    if (init_pid == 0) CallInit(*opts, *init, control);
    int st;
    while (waitpid(init_pid, &st, 0) < 0 && errno == EINTR) {
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    if (code == kExitControlClosed || code == 1) return 0;  // agent gone, or reported fatal
    if (code == kExitSetupFailed) {
      if (++failures > 5) Fatal(control, "call setup keeps failing");
      usleep(10000);
      continue;
    }
    failures = 0;
  }
}

}  // namespace
}  // namespace dsec::fncall

int main(int argc, char** argv) { return dsec::fncall::Main(argc, argv); }
