#include "backends/container/launcher.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sys/syscalls.h"

namespace dsec::backends::container {

namespace {

[[noreturn]] void ChildMain(const LaunchRequest& req, int go_r, char* const* argv,
                            char* const* envp) {
  char c;
  long n;
  do {
    n = syscall(SYS_read, go_r, &c, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) _exit(120);  // the parent gave up on us
  if (req.userns) {
    // Root of the new user namespace (its maps are written now). Raw syscalls: glibc's
    // wrappers would try to synchronize threads that do not exist in this child.
    if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setresuid, 0, 0, 0) < 0 ||
        syscall(SYS_setgroups, 0, nullptr) < 0)
      _exit(121);
  }
  int exe = static_cast<int>(syscall(SYS_fcntl, req.agent_memfd, F_DUPFD_CLOEXEC, 10));
  int chan = static_cast<int>(syscall(SYS_fcntl, req.channel_fd, F_DUPFD_CLOEXEC, 10));
  if (exe < 0 || chan < 0) _exit(122);
  if (syscall(SYS_dup3, chan, 3, 0) < 0) _exit(123);
  int null = static_cast<int>(syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR | O_CLOEXEC));
  if (null < 0) _exit(124);
  for (int fd = 0; fd < 3; ++fd)
    if (syscall(SYS_dup3, null, fd, 0) < 0) _exit(125);
  // Everything else (the edge's sockets, files, the memfd copy) closes at exec.
  if (syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) < 0) _exit(126);
  syscall(SYS_execveat, exe, "", argv, envp, AT_EMPTY_PATH);
  _exit(127);
}

}  // namespace

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
  }
}

StatusOr<PendingAgent> LaunchAgent(const LaunchRequest& req) {
  int go[2];
  if (pipe2(go, O_CLOEXEC) < 0) return ErrnoError("pipe2");
  UniqueFd go_r(go[0]), go_w(go[1]);
  static char arg0[] = "dsec-agent";
  char* argv[] = {arg0, nullptr};
  char* envp[] = {nullptr};

  clone_args args{};
  int pidfd = -1;
  args.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
               CLONE_NEWCGROUP | CLONE_PIDFD;
  if (req.userns) args.flags |= CLONE_NEWUSER;
  if (req.cgroup_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(req.cgroup_fd);
  }
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  long pid = sys::Clone3(&args);
  if (pid < 0) return ErrnoError("clone3 sandbox namespaces");
  if (pid == 0) ChildMain(req, go_r.get(), argv, envp);
  return PendingAgent(PidFd(static_cast<pid_t>(pid), UniqueFd(pidfd)), std::move(go_w));
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
