#include "backends/container/launcher.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

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
  int self_join_count;
  int self_join_fds[8];
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
  // Join the sandbox's v1 cgroups: before the exec, so the agent's memory is charged there.
  for (int i = 0; i < a->self_join_count; ++i) {
    do {
      n = RawSyscall(SYS_write, a->self_join_fds[i], reinterpret_cast<long>("0"), 1);
    } while (n == -EINTR);
    if (n != 1) return 119;
  }
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

StatusOr<PendingAgent> LaunchHere(const LaunchRequest& req) {
  if (req.self_join_fds.size() > sizeof(ChildArgs::self_join_fds) / sizeof(int))
    return InvalidArgument("too many cgroup hierarchies to join");
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
  args->self_join_count = static_cast<int>(req.self_join_fds.size());
  for (size_t i = 0; i < req.self_join_fds.size(); ++i)
    args->self_join_fds[i] = req.self_join_fds[i];
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
  long pid = sys::dsec_clone3_run(&ca, sizeof ca, ChildMain, args);
  // Sockets made on this thread later must not land in the sandbox's namespace; there is no
  // safe way on if we cannot get back.
  if (own_netns && setns(own_netns.get(), CLONE_NEWNET) < 0) abort();
  if (pid < 0) {
    munmap(stack, kStackSize);
    return ErrnoStatus(static_cast<int>(-pid), "clone3 sandbox namespaces");
  }
  return PendingAgent(PidFd(static_cast<pid_t>(pid), UniqueFd(pidfd)), std::move(go_w), stack,
                      kStackSize);
}

}  // namespace

PendingAgent::PendingAgent(PendingAgent&& o) noexcept
    : pid_(std::move(o.pid_)), go_(std::move(o.go_)), stack_(o.stack_), stack_size_(o.stack_size_) {
  o.stack_ = nullptr;
}

PendingAgent::~PendingAgent() {
  // The stack is shared with a child that may still run on it until it execs or dies.
  if (stack_) Abort();
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
  }
  FreeStack();  // the child is gone: nothing runs on the stack any more
}

StatusOr<std::unique_ptr<Launcher>> Launcher::Start(const std::vector<std::string>& keep) {
  std::unique_ptr<Launcher> l(new Launcher());
  std::promise<Status> ready;
  auto fut = ready.get_future();
  l->thread_ = std::thread(&Launcher::Run, l.get(), keep, &ready);
  Status s = fut.get();
  if (!s.ok()) return s;  // the thread has returned; ~Launcher joins it
  return l;
}

void Launcher::Run(std::vector<std::string> keep, std::promise<Status>* ready) {
  // Children start with every signal blocked (they share our memory until exec); the agent
  // sets its own mask.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  if (unshare(CLONE_FS) < 0 || unshare(CLONE_NEWNS) < 0) {
    ready->set_value(ErrnoError("unshare launcher mount namespace"));
    return;
  }
  Status s = TrimMounts(keep);
  ready->set_value(s);
  if (!s.ok()) return;
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

Launcher::~Launcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

StatusOr<PendingAgent> Launcher::Launch(const LaunchRequest& req) {
  std::promise<StatusOr<PendingAgent>> done;
  auto fut = done.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return Unavailable("launcher is stopping");
    tasks_.push_back([&] { done.set_value(LaunchHere(req)); });
  }
  cv_.notify_one();
  return fut.get();
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
  if (fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
    return ErrnoError("seal agent memfd");
  return mem;
}

}  // namespace dsec::backends::container
