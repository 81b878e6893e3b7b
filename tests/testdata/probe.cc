// dsec-probe: a tiny static program run inside sandboxes by the tests. Each argument names an
// attempt; for each it prints "<name> allowed" or "<name> blocked <errno name>". It never
// decides pass/fail itself: the tests do.
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <string>

namespace {

long Tiocsti() {
  int fd = open("/dev/tty", O_RDWR);
  if (fd < 0) fd = 0;
  char c = 'x';
  return syscall(SYS_ioctl, fd, (1UL << 32) | TIOCSTI, &c);
}

long WriteFile(const char* path) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) return -1;
  long r = write(fd, "x", 1);
  close(fd);
  return r;
}

long ReadFile(const char* path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  char buf[64];
  long r = read(fd, buf, sizeof buf);
  close(fd);
  return r < 0 ? -1 : 0;
}

const std::map<std::string, std::function<long()>>& Attempts() {
  static const std::map<std::string, std::function<long()>> m = {
      {"unshare_user", [] { return static_cast<long>(unshare(CLONE_NEWUSER)); }},
      {"unshare_net", [] { return static_cast<long>(unshare(CLONE_NEWNET)); }},
      {"clone3",
       [] {
         clone_args a{};
         a.flags = CLONE_NEWUSER;
         a.exit_signal = SIGCHLD;
         return syscall(SYS_clone3, &a, sizeof a);
       }},
      {"mount_proc", [] { return static_cast<long>(mount("proc", "/tmp", "proc", 0, nullptr)); }},
      {"mount_sysfs",
       [] { return static_cast<long>(mount("sysfs", "/tmp", "sysfs", 0, nullptr)); }},
      {"mount_cgroup",
       [] { return static_cast<long>(mount("cgroup", "/tmp", "cgroup2", 0, nullptr)); }},
      {"umount_proc_mask", [] { return static_cast<long>(umount2("/proc/kallsyms", MNT_DETACH)); }},
      {"tiocsti", Tiocsti},
      {"bpf", [] { return syscall(SYS_bpf, 0, 0, 0); }},
      {"userfaultfd", [] { return syscall(SYS_userfaultfd, 0); }},
      {"io_uring", [] { return syscall(SYS_io_uring_setup, 1, 0); }},
      {"perf_event_open", [] { return syscall(SYS_perf_event_open, 0, 0, -1, -1, 0); }},
      {"keyctl", [] { return syscall(SYS_keyctl, 0, 0, 0, 0, 0); }},
      {"open_by_handle_at", [] { return syscall(SYS_open_by_handle_at, AT_FDCWD, 0, 0); }},
      {"x32", [] { return syscall(0x40000000 | SYS_getpid); }},
      {"mknod_dev",
       [] { return static_cast<long>(mknod("/tmp/.probe-sda", S_IFBLK | 0600, makedev(8, 0))); }},
      {"ptrace_pid1", [] { return ptrace(PTRACE_ATTACH, 1, 0, 0); }},
      {"kill_pid1", [] { return static_cast<long>(kill(1, SIGKILL)); }},
      {"write_pid1_exe", [] { return WriteFile("/proc/1/exe"); }},
      {"read_pid1_environ", [] { return ReadFile("/proc/1/environ"); }},
      {"read_pid1_mem", [] { return ReadFile("/proc/1/mem"); }},
      {"open_pid1_fd0", [] { return static_cast<long>(open("/proc/1/fd/0", O_RDONLY)); }},
      {"list_pid1_fds",
       [] { return static_cast<long>(open("/proc/1/fd", O_RDONLY | O_DIRECTORY)); }},
      {"readlink_pid1_fd",
       [] {
         char buf[256];
         return static_cast<long>(readlink("/proc/1/fd/3", buf, sizeof buf));
       }},
      {"pid1_map_files",
       [] {
         int fd = open("/proc/1/map_files", O_RDONLY | O_DIRECTORY);
         if (fd < 0) return -1L;
         // Read to the end: the kernel hands out "." and ".." before it checks access.
         char buf[4096];
         long r;
         while ((r = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
         }
         close(fd);
         return r;
       }},
      {"sysrq", [] { return WriteFile("/proc/sysrq-trigger"); }},
      {"proc_sys_write", [] { return WriteFile("/proc/sys/kernel/hostname"); }},
      {"read_kcore", [] { return ReadFile("/proc/kcore"); }},
      {"dev_mem", [] { return static_cast<long>(open("/dev/mem", O_RDONLY)); }},
      {"dev_kvm", [] { return static_cast<long>(open("/dev/kvm", O_RDWR)); }},
      {"sethostname", [] { return static_cast<long>(sethostname("x", 1)); }},
      {"chroot", [] { return static_cast<long>(chroot("/tmp")); }},
      {"prlimit_pid1",
       [] {
         struct rlimit r = {1, 1};
         return syscall(SYS_prlimit64, 1, RLIMIT_CPU, &r, nullptr);
       }},
      {"setpriority_pid1", [] { return static_cast<long>(setpriority(PRIO_PROCESS, 1, 19)); }},
      {"sched_pid1",
       [] {
         struct sched_param sp = {};
         return static_cast<long>(sched_setscheduler(1, SCHED_IDLE, &sp));
       }},
      {"uevent_socket", [] { return static_cast<long>(socket(AF_NETLINK, SOCK_RAW, 15)); }},
      {"chmod_dev_null", [] { return static_cast<long>(chmod("/dev/null", 0600)); }},
  };
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    auto it = Attempts().find(argv[i]);
    if (it == Attempts().end()) {
      printf("%s unknown\n", argv[i]);
      continue;
    }
    errno = 0;
    long r = it->second();
    if (r < 0) {
      const char* n = strerrorname_np(errno);
      printf("%s blocked %s\n", argv[i], n ? n : "?");
    } else {
      printf("%s allowed\n", argv[i]);
    }
    fflush(stdout);
  }
  return 0;
}
