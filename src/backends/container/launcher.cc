#include "backends/container/launcher.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/securebits.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

#include "base/fd_passing.h"
#include "base/file_util.h"
#include "base/strings.h"
#include "sys/raw_syscall.h"
#include "sys/syscalls.h"

namespace dsec::backends::container {

namespace {

constexpr size_t kStackSize = 64 * 1024;

// Everything the child needs, written by the parent before the clone and only read after.
struct ChildArgs {
  int agent_memfd;
  int channel_fd;
  int go_r;
  bool userns;
  char* argv[2];
  char* envp[1];
  char arg0[16];
};

// Runs in the CLONE_VM child: raw syscalls only, on its own stack.
int ChildMain(void* p) {
  using sys::RawSyscall;
  const auto* a = static_cast<const ChildArgs*>(p);
  char c;
  long n;
  do {
    n = RawSyscall(SYS_read, a->go_r, reinterpret_cast<long>(&c), 1);
  } while (n == -EINTR);
  if (n != 1) return 120;  // the parent gave up on us
  // The launcher thread's SECBIT_NO_SETUID_FIXUP (see Run) is not the agent's: with it, a uid
  // or fsuid change would keep capabilities (a file op "as the sandbox user" would still have
  // CAP_DAC_OVERRIDE).
  if (RawSyscall(SYS_prctl, PR_SET_SECUREBITS, 0, 0, 0, 0) < 0) return 119;
  if (a->userns) {
    // Root of the new user namespace: its maps are written now.
    if (RawSyscall(SYS_setresgid, 0, 0, 0) < 0 || RawSyscall(SYS_setresuid, 0, 0, 0) < 0 ||
        RawSyscall(SYS_setgroups, 0, 0) < 0)
      return 121;
  }
  long exe = RawSyscall(SYS_fcntl, a->agent_memfd, F_DUPFD_CLOEXEC, 10);
  long chan = RawSyscall(SYS_fcntl, a->channel_fd, F_DUPFD_CLOEXEC, 10);
  if (exe < 0 || chan < 0) return 122;
  if (RawSyscall(SYS_dup3, chan, 3, 0) < 0) return 123;
  long null =
      RawSyscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/dev/null"), O_RDWR | O_CLOEXEC);
  if (null < 0) return 124;
  for (int fd = 0; fd < 3; ++fd)
    if (RawSyscall(SYS_dup3, null, fd, 0) < 0) return 125;
  // Everything else (the edge's sockets, files, the memfd copy) closes at exec.
  if (RawSyscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) < 0) return 126;
  RawSyscall(SYS_execveat, exe, reinterpret_cast<long>(""), reinterpret_cast<long>(a->argv),
             reinterpret_cast<long>(a->envp), AT_EMPTY_PATH);
  return 127;
}

struct MountEntry {
  std::string point;
  int depth;
};

// Leaves this thread's (private) mount namespace with only what new sandboxes need.
Status TrimMounts(const std::vector<std::string>& keep) {
  if (mount("", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
    return ErrnoError("make-rprivate /");
  DSEC_ASSIGN_OR_RETURN(std::string info, ReadFileToString("/proc/thread-self/mountinfo", 4 << 20));
  std::vector<MountEntry> mounts;
  std::istringstream in(info);
  std::string line;
  while (std::getline(in, line)) {
    auto f = SplitString(line, ' ');
    if (f.size() < 5) continue;
    std::string point(f[4]);
    mounts.push_back({point, static_cast<int>(std::count(point.begin(), point.end(), '/'))});
  }
  auto under = [](const std::string& path, const std::string& dir) {
    return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                           (dir == "/" || path[dir.size()] == '/'));
  };
  auto needed = [&](const std::string& point) {
    if (point == "/" || point == "/dev" || under(point, "/proc")) return true;
    for (const auto& k : keep)
      if (under(k, point)) return true;  // the mount holding k, or one above it
    return false;
  };
  std::sort(mounts.begin(), mounts.end(),
            [](const MountEntry& a, const MountEntry& b) { return a.depth > b.depth; });
  for (const auto& m : mounts) {
    if (needed(m.point)) continue;
    (void)umount2(m.point.c_str(), MNT_DETACH);  // best effort: a busy or gone mount is fine
  }
  return OkStatus();
}

// A child cloned on the launcher thread; its fds are in that thread's fd table.
struct Launched {
  pid_t pid = -1;
  UniqueFd pidfd, go;
  void* stack = nullptr;
};

StatusOr<Launched> LaunchHere(const LaunchRequest& req) {
  int go[2];
  if (pipe2(go, O_CLOEXEC) < 0) return ErrnoError("pipe2");
  UniqueFd go_r(go[0]), go_w(go[1]);
  void* stack = mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) return ErrnoError("mmap launch stack");
  auto* args = static_cast<ChildArgs*>(stack);  // bottom of the region; the stack grows down
  args->agent_memfd = req.agent_memfd;
  args->channel_fd = req.channel_fd;
  args->go_r = go_r.get();
  args->userns = req.userns;
  strcpy(args->arg0, "dsec-agent");
  args->argv[0] = args->arg0;
  args->argv[1] = nullptr;
  args->envp[0] = nullptr;

  clone_args ca{};
  int pidfd = -1;
  ca.flags = CLONE_VM | CLONE_PIDFD | CLONE_CLEAR_SIGHAND | CLONE_NEWNS | CLONE_NEWPID |
             CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP | (req.netns_fd >= 0 ? 0 : CLONE_NEWNET);
  if (req.userns) ca.flags |= CLONE_NEWUSER;
  if (req.cgroup_fd >= 0) {
    ca.flags |= CLONE_INTO_CGROUP;
    ca.cgroup = static_cast<uint64_t>(req.cgroup_fd);
  }
  ca.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  ca.exit_signal = SIGCHLD;
  ca.stack = reinterpret_cast<uint64_t>(stack);
  ca.stack_size = kStackSize;

  // A user namespace created by the clone cannot join a network namespace owned by the initial
  // one, so this thread joins it and the child inherits it.
  UniqueFd own_netns;
  if (req.netns_fd >= 0) {
    own_netns.Reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!own_netns || setns(req.netns_fd, CLONE_NEWNET) < 0) {
      munmap(stack, kStackSize);
      return ErrnoError("setns sandbox netns");
    }
  }
  // The user namespace's owner is the cloning thread's effective uid. A raw setresuid changes
  // this thread's credentials only (glibc's would change every thread's), and with
  // SECBIT_NO_SETUID_FIXUP (set in Run) the thread keeps its capabilities meanwhile.
  bool as_owner = req.userns && req.userns_owner != 0;
  int dumpable = as_owner ? prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) : -1;
  if (as_owner && sys::RawSyscall(SYS_setresuid, -1, req.userns_owner, -1) < 0) {
    munmap(stack, kStackSize);
    if (own_netns) (void)setns(own_netns.get(), CLONE_NEWNET);
    return ErrnoError("setresuid(-1, " + std::to_string(req.userns_owner) + ", -1)");
  }
  long pid = sys::dsec_clone3_run(&ca, sizeof ca, ChildMain, args);
  if (as_owner) {
    // No safe way on as anyone but root.
    if (sys::RawSyscall(SYS_setresuid, -1, 0, -1) < 0) abort();
    // Changing the euid made the (shared) address space non-dumpable; the edge stays as it was.
    if (dumpable >= 0) (void)prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0);
  }
  // Sockets made on this thread later must not land in the sandbox's namespace; there is no
  // safe way on if we cannot get back.
  if (own_netns && setns(own_netns.get(), CLONE_NEWNET) < 0) abort();
  if (pid < 0) {
    munmap(stack, kStackSize);
    return ErrnoStatus(static_cast<int>(-pid), "clone3 sandbox namespaces");
  }
  Launched l;
  l.pid = static_cast<pid_t>(pid);
  l.pidfd.Reset(pidfd);
  l.go = std::move(go_w);
  l.stack = stack;
  return l;
}

// The request's fds, in a fixed order, for the trip to the launcher thread's fd table.
std::vector<int> RequestFds(const LaunchRequest& req) {
  std::vector<int> fds = {req.agent_memfd, req.channel_fd};
  if (req.cgroup_fd >= 0) fds.push_back(req.cgroup_fd);
  if (req.netns_fd >= 0) fds.push_back(req.netns_fd);
  return fds;
}

// What the edge thread gets back through the promise: no fds (those are numbers in the
// launcher thread's table; the edge's copies come over the socket).
struct LaunchedChild {
  pid_t pid;
  void* stack;
};

// On the launcher thread: takes the request's fds off the socket, clones the child and sends
// its pidfd and go pipe back.
StatusOr<LaunchedChild> LaunchFromSocket(int sock, const LaunchRequest& req) {
  size_t want = RequestFds(req).size();
  std::string bytes;
  std::vector<UniqueFd> fds;
  DSEC_ASSIGN_OR_RETURN(size_t n, RecvWithFds(sock, 16, want, &bytes, &fds));
  if (n == 0 || fds.size() != want) return InternalError("launcher: request fds missing");
  LaunchRequest mine = req;
  size_t i = 0;
  mine.agent_memfd = fds[i++].get();
  mine.channel_fd = fds[i++].get();
  if (req.cgroup_fd >= 0) mine.cgroup_fd = fds[i++].get();
  if (req.netns_fd >= 0) mine.netns_fd = fds[i++].get();
  DSEC_ASSIGN_OR_RETURN(Launched l, LaunchHere(mine));
  if (Status s = SendWithFds(sock, "L", {l.pidfd.get(), l.go.get()}); !s.ok()) {
    (void)sys::PidfdSendSignal(l.pidfd.get(), SIGKILL);
    siginfo_t si;
    (void)waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(l.pidfd.get()), &si, WEXITED);
    munmap(l.stack, kStackSize);
    return s;
  }
  return LaunchedChild{l.pid, l.stack};  // l's fds close here, in this thread's table
}

}  // namespace

PendingAgent::PendingAgent(PendingAgent&& o) noexcept
    : pid_(std::move(o.pid_)),
      child_pid_(std::exchange(o.child_pid_, -1)),
      go_(std::move(o.go_)),
      stack_(o.stack_),
      stack_size_(o.stack_size_) {
  o.stack_ = nullptr;
}

PendingAgent::~PendingAgent() {
  // The stack is shared with a child that may still run on it until it execs or dies.
  if (stack_) Abort();
}

void PendingAgent::DropPidfd() {
  if (!pid_.valid()) return;
  child_pid_ = pid_.pid();
  pid_ = PidFd();
}

void PendingAgent::FreeStack() {
  if (stack_) munmap(stack_, stack_size_);
  stack_ = nullptr;
}

Status PendingAgent::Release() {
  if (write(go_.get(), "g", 1) != 1) return ErrnoError("release agent");
  go_.Reset();
  return OkStatus();
}

void PendingAgent::Abort() {
  go_.Reset();
  if (pid_.valid()) {
    (void)pid_.SendSignal(SIGKILL);
    (void)pid_.Wait();
    pid_ = PidFd();
  } else if (child_pid_ > 0) {
    kill(child_pid_, SIGKILL);
    while (waitpid(child_pid_, nullptr, __WALL) < 0 && errno == EINTR) {
    }
    child_pid_ = -1;
  }
  FreeStack();  // the child is gone: nothing runs on the stack any more
}

StatusOr<std::unique_ptr<Launcher>> Launcher::Start(const std::vector<std::string>& keep) {
  std::unique_ptr<Launcher> l(new Launcher());
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
    return ErrnoError("socketpair for the launcher");
  l->sock_.Reset(sp[0]);
  l->thread_sock_ = sp[1];
  std::promise<Status> ready;
  auto fut = ready.get_future();
  l->thread_ = std::thread(&Launcher::Run, l.get(), keep, &ready);
  Status s = fut.get();
  // The thread has its own copy of its end by now (or has returned).
  close(sp[1]);
  if (!s.ok()) return s;  // the thread has returned; ~Launcher joins it
  return l;
}

void Launcher::Run(std::vector<std::string> keep, std::promise<Status>* ready) {
  // Children start with every signal blocked (they share our memory until exec); the agent
  // sets its own mask.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // A private fd table: each clone copies the cloning thread's table (and the child closes
  // it all again at exec), so cloning from the edge's own table, which grows by ~7 fds per
  // live sandbox, would make every create O(live sandboxes). This one holds only the socket
  // the edge passes each launch's fds over (and stdin/out/err).
  if (unshare(CLONE_FS | CLONE_FILES) < 0 || unshare(CLONE_NEWNS) < 0) {
    ready->set_value(ErrnoError("unshare launcher mount namespace and fd table"));
    return;
  }
  // This thread's credentials only (prctl is not broadcast to other threads): an effective
  // uid switch for a launch (LaunchRequest::userns_owner) keeps every capability.
  if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0) {
    ready->set_value(ErrnoError("prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP)"));
    return;
  }
  int sock = thread_sock_;
  if ((sock > 3 && sys::CloseRange(3, static_cast<unsigned>(sock) - 1, 0) < 0) ||
      sys::CloseRange(static_cast<unsigned>(sock) + 1, ~0U, 0) < 0) {
    ready->set_value(ErrnoError("close the launcher's copy of the edge's fds"));
    return;
  }
  Status s = TrimMounts(keep);
  ready->set_value(s);
  if (!s.ok()) return;
  while (true) {
    std::function<void()> task;
    {
      MutexLock lk(mu_);
      cv_.Wait(lk, [&]() DSEC_REQUIRES(mu_) { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

Launcher::~Launcher() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

StatusOr<PendingAgent> Launcher::Launch(const LaunchRequest& req) {
  // One launch's fds on the socket at a time (the thread runs one launch at a time anyway).
  MutexLock one(launch_mu_);
  DSEC_RETURN_IF_ERROR(SendWithFds(sock_.get(), "R", RequestFds(req)));
  std::promise<StatusOr<LaunchedChild>> done;
  auto fut = done.get_future();
  int thread_sock = thread_sock_;
  {
    MutexLock lk(mu_);
    // (A stopping launcher never reads what was just sent; the socket goes with it.)
    if (stop_) return Unavailable("launcher is stopping");
    tasks_.push_back(
        [&done, &req, thread_sock] { done.set_value(LaunchFromSocket(thread_sock, req)); });
  }
  cv_.NotifyOne();
  StatusOr<LaunchedChild> launched = fut.get();
  if (!launched.ok()) return launched.status();  // the thread took (and closed) the fds
  std::string bytes;
  std::vector<UniqueFd> fds;
  StatusOr<size_t> n = RecvWithFds(sock_.get(), 16, 2, &bytes, &fds);
  if (!n.ok() || fds.size() != 2) {
    // Our child (not reaped), so the pid is still its own.
    kill(launched->pid, SIGKILL);
    while (waitpid(launched->pid, nullptr, __WALL) < 0 && errno == EINTR) {
    }
    munmap(launched->stack, kStackSize);
    return n.ok() ? InternalError("launcher: pidfd missing") : n.status();
  }
  return PendingAgent(PidFd(launched->pid, std::move(fds[0])), std::move(fds[1]), launched->stack,
                      kStackSize);
}

StatusOr<UniqueFd> SealAgentBinary(const std::string& path) {
  UniqueFd src(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src) return ErrnoError("open agent binary \"" + path + "\"");
  struct stat st;
  if (fstat(src.get(), &st) < 0) return ErrnoError("stat \"" + path + "\"");
  UniqueFd mem(memfd_create("dsec-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!mem) return ErrnoError("memfd_create");
  off_t off = 0;
  while (off < st.st_size) {
    ssize_t n = sendfile(mem.get(), src.get(), &off, static_cast<size_t>(st.st_size - off));
    if (n < 0) return ErrnoError("copy agent binary");
    if (n == 0) break;
  }
  if (fchmod(mem.get(), 0555) < 0) return ErrnoError("fchmod agent memfd");
  // F_SEAL_WRITE is EBUSY while a page of the file is still pinned (the copy's pages can be
  // for a moment, seen once in a CI run under ASan): a few tries before it is an error.
  for (int attempt = 0;; ++attempt) {
    if (fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) ==
        0)
      break;
    if (errno != EBUSY || attempt >= 50) return ErrnoError("seal agent memfd");
    usleep(20000);
  }
  return mem;
}

}  // namespace dsec::backends::container
