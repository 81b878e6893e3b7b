#include "isolation/jail.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/mount.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/strings.h"
#include "base/unique_fd.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

namespace {

// What the child was doing when it failed; it reports {step, errno} on the error pipe.
enum Step : int {
  kWait,
  kFds,
  kPrivate,
  kOpenTree,
  kSetattr,
  kTmpfs,
  kMkdir,
  kBind,
  kProc,
  kReadonly,
  kPivot,
  kSession,
  kRlimit,
  kIds,
  kNoNewPrivs,
  kExec,
};
constexpr const char* kStepNames[] = {
    "wait for the edge", "map descriptors", "make mounts private", "open a host path",
    "make it read-only", "make the root",   "make a mount point",  "bind a host path",
    "mount /proc",       "seal the root",   "pivot_root",          "setsid",
    "set rlimits",       "set credentials", "set no_new_privs",    "exec",
};

// One host path in the jail's root.
struct Bind {
  std::string path;  // absolute, as on the host
  std::string rel;   // without the leading '/'
  bool dir = false;
  bool device = false;
};

// Everything the child needs, prepared before the clone: it allocates nothing.
struct Plan {
  const JailSpec* spec = nullptr;
  std::vector<char*> argv, envp;
  std::vector<int> targets, sources;
  int high = 3;
  std::vector<std::string> dirs;  // to create in the root, parents first
  std::vector<Bind> binds;
  int go = -1, err = -1;
  std::vector<rlimit> limits;
};

[[noreturn]] void Fail(const Plan& p, Step step) {
  int msg[2] = {step, errno};
  (void)!write(p.err, msg, sizeof msg);
  _exit(126);
}

// The minimal root, attached over spec.root_at and pivoted into.
void BuildRoot(const Plan& p) {
  const JailSpec& s = *p.spec;
  if (mount("", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) Fail(p, kPrivate);
  int trees[64];
  const size_t n = std::min<size_t>(p.binds.size(), 64);
  for (size_t i = 0; i < n; ++i) {
    const Bind& b = p.binds[i];
    trees[i] = sys::OpenTree(AT_FDCWD, b.path.c_str(),
                             OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (b.dir ? AT_RECURSIVE : 0));
    if (trees[i] < 0) Fail(p, kOpenTree);
    mount_attr a{};
    a.attr_set = MOUNT_ATTR_NOSUID | (b.device ? 0 : MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV);
    if (sys::MountSetattr(trees[i], "", AT_EMPTY_PATH | (b.dir ? AT_RECURSIVE : 0), &a) < 0)
      Fail(p, kSetattr);
  }
  int fs = sys::FsOpen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0 || sys::FsConfig(fs, FSCONFIG_SET_STRING, "size", "1m", 0) < 0 ||
      sys::FsConfig(fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
      sys::FsConfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    Fail(p, kTmpfs);
  int root = sys::FsMount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  if (root < 0) Fail(p, kTmpfs);
  for (const auto& d : p.dirs)
    if (mkdirat(root, d.c_str(), 0755) < 0 && errno != EEXIST) Fail(p, kMkdir);
  for (size_t i = 0; i < n; ++i) {
    const Bind& b = p.binds[i];
    if (!b.dir) {
      int f = openat(root, b.rel.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (f < 0) Fail(p, kMkdir);
      close(f);
    }
    if (sys::MoveMount(trees[i], "", root, b.rel.c_str(), MOVE_MOUNT_F_EMPTY_PATH) < 0)
      Fail(p, kBind);
  }
  if (s.proc && (s.namespaces & CLONE_NEWPID)) {
    // Mounted from inside the new pid namespace: it shows that namespace's processes, and
    // (subset=pid) nothing of the node's.
    int pfs = sys::FsOpen("proc", FSOPEN_CLOEXEC);
    if (pfs < 0 || sys::FsConfig(pfs, FSCONFIG_SET_STRING, "subset", "pid", 0) < 0 ||
        sys::FsConfig(pfs, FSCONFIG_SET_STRING, "hidepid", "invisible", 0) < 0 ||
        sys::FsConfig(pfs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
      Fail(p, kProc);
    int m = sys::FsMount(pfs, FSMOUNT_CLOEXEC,
                         MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    if (m < 0 || sys::MoveMount(m, "", root, "proc", MOVE_MOUNT_F_EMPTY_PATH) < 0) Fail(p, kProc);
  }
  mount_attr ro{};
  ro.attr_set = MOUNT_ATTR_RDONLY;
  if (sys::MountSetattr(root, "", AT_EMPTY_PATH, &ro) < 0) Fail(p, kReadonly);
  if (sys::MoveMount(root, "", AT_FDCWD, s.root_at.c_str(), MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
      chdir(s.root_at.c_str()) < 0 || sys::PivotRoot(".", ".") < 0 ||
      umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
    Fail(p, kPivot);
}

// The child, right after clone3: async-signal-safe calls only, and raw syscalls for the
// credentials (glibc's wrappers would try to reach the parent's threads).
[[noreturn]] void Child(const Plan& p) {
  const JailSpec& s = *p.spec;
  // Started with every signal blocked (SpawnJailed): the edge's handlers must not run here.
  // Every disposition goes back to the default (an ignored one would survive the exec), and
  // nothing stays blocked once it runs.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    (void)sigaction(sig, &dfl, nullptr);  // (glibc's internal signals refuse: fine)
  }
  char c;
  if (read(p.go, &c, 1) != 1) Fail(p, kWait);  // the edge gave up on this start
  int copies[64];
  const size_t nfds = std::min<size_t>(p.sources.size(), 64);
  for (size_t i = 0; i < nfds; ++i) {
    copies[i] = fcntl(p.sources[i], F_DUPFD_CLOEXEC, p.high);
    if (copies[i] < 0) Fail(p, kFds);
  }
  for (size_t i = 0; i < nfds; ++i)
    if (dup2(copies[i], p.targets[i]) < 0) Fail(p, kFds);
  // Everything but the map and the error pipe (close-on-exec) goes: the gaps below the
  // highest target, and all above it.
  for (size_t i = 0; i < nfds; ++i) close(copies[i]);
  for (int fd = 0; fd < p.high; ++fd) {
    bool mapped = false;
    for (size_t i = 0; i < nfds && !mapped; ++i) mapped = p.targets[i] == fd;
    if (!mapped) close(fd);
  }
  sys::CloseRange(static_cast<unsigned>(p.high), static_cast<unsigned>(p.err - 1), 0);
  sys::CloseRange(static_cast<unsigned>(p.err + 1), ~0U, 0);
  if (s.namespaces & CLONE_NEWNS) BuildRoot(p);
  if (setsid() < 0) Fail(p, kSession);
  for (size_t i = 0; i < s.rlimits.size() && i < p.limits.size(); ++i)
    if (setrlimit(s.rlimits[i].first, &p.limits[i]) < 0) Fail(p, kRlimit);
  if (s.uid) {
    if (syscall(SYS_setgroups, s.groups.size(), s.groups.data()) < 0 ||
        syscall(SYS_setresgid, s.gid, s.gid, s.gid) < 0 ||
        syscall(SYS_setresuid, *s.uid, *s.uid, *s.uid) < 0)
      Fail(p, kIds);
  }
  if (s.no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Fail(p, kNoNewPrivs);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(s.exe.c_str(), p.argv.data(), p.envp.data());
  Fail(p, kExec);
}

// "usr/share" -> {"usr", "usr/share"}
void AddDirs(const std::string& rel, bool include_last, std::vector<std::string>* dirs) {
  auto parts = SplitString(rel, '/', true);
  std::string at;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i + 1 == parts.size() && !include_last) break;
    at += (at.empty() ? "" : "/") + std::string(parts[i]);
    if (std::find(dirs->begin(), dirs->end(), at) == dirs->end()) dirs->push_back(at);
  }
}

StatusOr<Plan> MakePlan(const JailSpec& s) {
  Plan p;
  p.spec = &s;
  if (s.exe.empty() || s.exe[0] != '/') return InvalidArgument("jail: exe must be absolute");
  if (s.argv.empty()) return InvalidArgument("jail: argv is empty");
  for (const auto& a : s.argv) p.argv.push_back(const_cast<char*>(a.c_str()));
  p.argv.push_back(nullptr);
  for (const auto& e : s.env) p.envp.push_back(const_cast<char*>(e.c_str()));
  p.envp.push_back(nullptr);
  if (s.fds.size() > 64) return InvalidArgument("jail: more than 64 descriptors");
  for (const auto& [target, source] : s.fds) {
    if (target < 0 || source < 0) return InvalidArgument("jail: a negative descriptor");
    p.targets.push_back(target);
    p.sources.push_back(source);
    p.high = std::max(p.high, target + 1);
  }
  if (s.namespaces & CLONE_NEWNS) {
    struct stat st;
    if (s.root_at.empty() || stat(s.root_at.c_str(), &st) < 0 || !S_ISDIR(st.st_mode))
      return InvalidArgument("jail: root_at must be an existing directory");
    auto add = [&](const std::string& path, bool device) -> Status {
      if (path.size() < 2 || path[0] != '/' || path.find("/..") != std::string::npos)
        return InvalidArgument("jail: bad path \"" + path + "\"");
      struct stat ps;
      if (stat(path.c_str(), &ps) < 0) return OkStatus();  // not on this host: skipped
      if (device != (S_ISCHR(ps.st_mode) || S_ISBLK(ps.st_mode)))
        return InvalidArgument("jail: \"" + path + "\" is " + (device ? "not " : "") + "a device");
      Bind b{path, path.substr(1), S_ISDIR(ps.st_mode), device};
      AddDirs(b.rel, b.dir, &p.dirs);
      p.binds.push_back(std::move(b));
      return OkStatus();
    };
    for (const auto& path : s.ro_paths) DSEC_RETURN_IF_ERROR(add(path, false));
    for (const auto& path : s.devices) DSEC_RETURN_IF_ERROR(add(path, true));
    if (p.binds.size() > 64) return InvalidArgument("jail: more than 64 host paths");
    if (s.proc) AddDirs("proc", true, &p.dirs);
  }
  for (const auto& [res, v] : s.rlimits) p.limits.push_back(rlimit{v, v});
  return p;
}

}  // namespace

StatusOr<std::string> FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (name[0] == '/' && access(name.c_str(), X_OK) == 0) return name;
    return NotFound("\"" + name + "\" is not an executable at an absolute path");
  }
  const char* path = getenv("PATH");
  for (std::string_view dir : SplitString(path ? path : "/usr/bin:/bin", ':', true)) {
    if (dir.empty() || dir[0] != '/') continue;
    std::string cand = std::string(dir) + "/" + name;
    if (access(cand.c_str(), X_OK) == 0) return cand;
  }
  return NotFound("\"" + name + "\" is not on PATH");
}

StatusOr<PidFd> SpawnJailed(const JailSpec& spec) {
  DSEC_ASSIGN_OR_RETURN(Plan p, MakePlan(spec));
  int go[2], err[2];
  if (pipe2(go, O_CLOEXEC) < 0) return ErrnoError("pipe");
  UniqueFd go_read(go[0]), go_write(go[1]);
  if (pipe2(err, O_CLOEXEC) < 0) return ErrnoError("pipe");
  UniqueFd err_read(err[0]), err_write(err[1]);
  // Above every target and every copy the child makes of a source: nothing lands on it.
  err_write.Reset(fcntl(err[1], F_DUPFD_CLOEXEC, p.high + 64));  // (closes err[1])
  if (!err_write) return ErrnoError("dup the jail's error pipe");
  p.go = go_read.get();
  p.err = err_write.get();

  int pidfd = -1;
  clone_args args{};
  args.flags = static_cast<uint64_t>(spec.namespaces) | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = sys::Clone3(&args);
  if (pid == 0) Child(p);
  int clone_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    errno = clone_errno;
    return ErrnoError("clone3 " + spec.exe);
  }
  PidFd proc(static_cast<pid_t>(pid), UniqueFd(pidfd));
  go_read.Reset();
  err_write.Reset();
  auto abort = [&](Status s) -> Status {
    (void)proc.SendSignal(SIGKILL);
    (void)proc.Wait();
    return s;
  };
  if (spec.before_exec) {
    if (Status s = spec.before_exec(static_cast<pid_t>(pid)); !s.ok()) return abort(s);
  }
  if (write(go_write.get(), "g", 1) != 1) return abort(ErrnoError("start " + spec.exe));
  // The error pipe closes at the exec; a report before it says what failed.
  int msg[2] = {0, 0};
  ssize_t got;
  do {
    got = read(err_read.get(), msg, sizeof msg);
  } while (got < 0 && errno == EINTR);
  if (got == sizeof msg) {
    int step = std::clamp(msg[0], 0, static_cast<int>(kExec));
    errno = msg[1];
    Status s = ErrnoError("jail of " + spec.exe + ": " + kStepNames[step]);
    (void)proc.Wait();
    return s;
  }
  return proc;
}

}  // namespace dsec::isolation
