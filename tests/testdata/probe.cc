// dsec-probe: a tiny static program run inside sandboxes by the tests. Each argument names an
// attempt; for each it prints "<name> allowed" or "<name> blocked <errno name>". It never
// decides pass/fail itself: the tests do. An attempt the kernel answers by killing the process
// (x32, int80: seccomp kills foreign ABIs) ends the run: give it as the last name.
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
#include <sys/uio.h>
#include <sys/wait.h>
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

long OpenFile(const char* path, int flags) {
  int fd = open(path, flags);
  if (fd < 0) return -1;
  close(fd);
  return 0;
}

long Syscall6(long nr, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  return syscall(nr, a, b, c, d, e, f);
}

// A legacy 32-bit syscall from a 64-bit process (int 0x80): getpid is 20 there.
long Int80() {
  long r;
  asm volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
  if (r < 0 && r > -4096) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}

long ReadPid1Memory() {
  char buf[16];
  iovec local{buf, sizeof buf};
  iovec remote{reinterpret_cast<void*>(0x400000), sizeof buf};
  return syscall(SYS_process_vm_readv, 1, &local, 1, &remote, 1, 0);
}

long PidfdGetfdPid1() {
  long pidfd = syscall(SYS_pidfd_open, 1, 0);
  if (pidfd < 0) return -1;
  long r = syscall(SYS_pidfd_getfd, pidfd, 3, 0);
  int saved = errno;
  close(static_cast<int>(pidfd));
  errno = saved;
  return r;
}

long SetnsPid1(const char* ns) {
  std::string path = std::string("/proc/1/ns/") + ns;
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  long r = syscall(SYS_setns, fd, 0);
  int saved = errno;
  close(fd);
  errno = saved;
  return r;
}

long SetnsSelf() {
  // Re-entering our own mount namespace still needs the syscall: the profile refuses setns.
  int fd = open("/proc/self/ns/mnt", O_RDONLY);
  if (fd < 0) return -1;
  long r = syscall(SYS_setns, fd, CLONE_NEWNS);
  int saved = errno;
  close(fd);
  errno = saved;
  return r;
}

long ExecPid1Exe() {
  const char* argv[] = {"dsec-agent", "--version", nullptr};
  const char* envp[] = {nullptr};
  return execve("/proc/1/exe", const_cast<char* const*>(argv), const_cast<char* const*>(envp));
}

long Tioclinux() {
  int fd = open("/dev/tty", O_RDWR);
  if (fd < 0) fd = 0;
  char sub[2] = {11 /* TIOCL_GETKMSGREDIRECT */, 0};
  return syscall(SYS_ioctl, fd, TIOCLINUX, sub);
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
      // More of the agent (PID 1): its memory, fds, root, cwd, namespaces, binary.
      {"vm_read_pid1", ReadPid1Memory},
      {"ptrace_seize_pid1", [] { return ptrace(PTRACE_SEIZE, 1, 0, 0); }},
      {"pidfd_getfd_pid1", PidfdGetfdPid1},
      {"kcmp_pid1", [] { return syscall(SYS_kcmp, getpid(), 1, 0 /* KCMP_FILE */, 0, 3); }},
      {"open_pid1_exe", [] { return OpenFile("/proc/1/exe", O_RDONLY); }},
      {"exec_pid1_exe", ExecPid1Exe},
      {"open_pid1_root", [] { return OpenFile("/proc/1/root/", O_RDONLY | O_DIRECTORY); }},
      {"chdir_pid1_root", [] { return static_cast<long>(chdir("/proc/1/root/")); }},
      {"chdir_pid1_cwd", [] { return static_cast<long>(chdir("/proc/1/cwd/")); }},
      {"open_pid1_fd3", [] { return OpenFile("/proc/1/fd/3", O_RDWR); }},
      {"read_pid1_fdinfo", [] { return ReadFile("/proc/1/fdinfo/3"); }},
      {"read_pid1_maps", [] { return ReadFile("/proc/1/maps"); }},
      {"read_pid1_task_mem", [] { return ReadFile("/proc/1/task/1/mem"); }},
      {"read_pid1_syscall", [] { return ReadFile("/proc/1/syscall"); }},
      {"read_pid1_stack", [] { return ReadFile("/proc/1/stack"); }},
      {"read_pid1_auxv", [] { return ReadFile("/proc/1/auxv"); }},
      {"write_pid1_mem", [] { return WriteFile("/proc/1/mem"); }},
      {"setns_pid1_mnt", [] { return SetnsPid1("mnt"); }},
      {"setns_pid1_user", [] { return SetnsPid1("user"); }},
      {"setns_self", SetnsSelf},
      // The agent's scheduling, by process group too (it leads its own session).
      {"setpriority_pgrp1", [] { return static_cast<long>(setpriority(PRIO_PGRP, 1, 19)); }},
      {"ioprio_pid1", [] { return Syscall6(SYS_ioprio_set, 1 /* WHO_PROCESS */, 1, 3 << 13); }},
      {"ioprio_pgrp1", [] { return Syscall6(SYS_ioprio_set, 2 /* WHO_PGRP */, 1, 3 << 13); }},
      {"affinity_pid1",
       [] {
         cpu_set_t set;
         CPU_ZERO(&set);
         CPU_SET(0, &set);
         return static_cast<long>(sched_setaffinity(1, sizeof set, &set));
       }},
      // Namespaces, mounts and the syscalls the profile refuses.
      {"unshare_mnt", [] { return static_cast<long>(unshare(CLONE_NEWNS)); }},
      {"unshare_pid", [] { return static_cast<long>(unshare(CLONE_NEWPID)); }},
      {"unshare_cgroup", [] { return static_cast<long>(unshare(CLONE_NEWCGROUP)); }},
      {"clone_newuser",
       [] {
         long r = Syscall6(SYS_clone, CLONE_NEWUSER | SIGCHLD);
         if (r == 0) _exit(0);
         return r;
       }},
      {"clone_newns",
       [] {
         long r = Syscall6(SYS_clone, CLONE_NEWNS | SIGCHLD);
         if (r == 0) _exit(0);
         return r;
       }},
      {"mount_cgroup_v1",
       [] { return static_cast<long>(mount("cgroup", "/tmp", "cgroup", 0, "memory")); }},
      {"mount_tmpfs", [] { return static_cast<long>(mount("t", "/tmp", "tmpfs", 0, nullptr)); }},
      {"mount_bind_root",
       [] { return static_cast<long>(mount("/", "/tmp", nullptr, MS_BIND, 0)); }},
      {"remount_root_suid",
       [] { return static_cast<long>(mount("", "/", nullptr, MS_REMOUNT | MS_BIND, nullptr)); }},
      {"umount_proc", [] { return static_cast<long>(umount2("/proc", MNT_DETACH)); }},
      {"fsopen_proc", [] { return Syscall6(SYS_fsopen, reinterpret_cast<long>("proc"), 0); }},
      {"fsopen_cgroup", [] { return Syscall6(SYS_fsopen, reinterpret_cast<long>("cgroup"), 0); }},
      {"open_tree_root",
       [] { return Syscall6(SYS_open_tree, AT_FDCWD, reinterpret_cast<long>("/"), 1); }},
      {"pivot_root",
       [] {
         return Syscall6(SYS_pivot_root, reinterpret_cast<long>("/tmp"),
                         reinterpret_cast<long>("/tmp"));
       }},
      {"mknod_char_mem",
       [] { return static_cast<long>(mknod("/tmp/.probe-mem", S_IFCHR | 0600, makedev(1, 1))); }},
      {"mknodat_char_kvm",
       [] {
         return static_cast<long>(
             mknodat(AT_FDCWD, "/tmp/.probe-kvm", S_IFCHR | 0600, makedev(10, 232)));
       }},
      {"dev_kmsg", [] { return OpenFile("/dev/kmsg", O_RDONLY); }},
      {"dev_port", [] { return OpenFile("/dev/port", O_RDONLY); }},
      {"dev_sda", [] { return OpenFile("/dev/sda", O_RDONLY); }},
      {"sys_firmware", [] { return OpenFile("/sys/firmware", O_RDONLY | O_DIRECTORY); }},
      {"sys_kernel", [] { return OpenFile("/sys/kernel", O_RDONLY | O_DIRECTORY); }},
      {"sys_fs_cgroup", [] { return OpenFile("/sys/fs/cgroup", O_RDONLY | O_DIRECTORY); }},
      {"proc_sys_core_pattern", [] { return WriteFile("/proc/sys/kernel/core_pattern"); }},
      {"proc_sys_vm_drop_caches", [] { return WriteFile("/proc/sys/vm/drop_caches"); }},
      {"write_timer_list", [] { return WriteFile("/proc/timer_list"); }},
      {"tioclinux", Tioclinux},
      {"add_key",
       [] {
         return Syscall6(SYS_add_key, reinterpret_cast<long>("user"), reinterpret_cast<long>("k"),
                         reinterpret_cast<long>("v"), 1, -2 /* KEY_SPEC_PROCESS_KEYRING */);
       }},
      {"request_key",
       [] {
         return Syscall6(SYS_request_key, reinterpret_cast<long>("user"),
                         reinterpret_cast<long>("k"), 0, 0);
       }},
      {"io_uring_enter", [] { return Syscall6(SYS_io_uring_enter, 0, 1, 0, 0, 0, 0); }},
      {"io_uring_register", [] { return Syscall6(SYS_io_uring_register, 0, 0, 0, 0); }},
      {"memfd_secret", [] { return Syscall6(SYS_memfd_secret, 0); }},
      {"kexec_load", [] { return Syscall6(SYS_kexec_load, 0, 0, 0, 0); }},
      {"init_module", [] { return Syscall6(SYS_init_module, 0, 0, reinterpret_cast<long>("")); }},
      {"finit_module", [] { return Syscall6(SYS_finit_module, 0, reinterpret_cast<long>(""), 0); }},
      {"iopl", [] { return Syscall6(SYS_iopl, 3); }},
      {"ioperm", [] { return Syscall6(SYS_ioperm, 0x80, 1, 1); }},
      {"syslog", [] { return Syscall6(SYS_syslog, 3 /* READ_ALL */, 0, 0); }},
      {"reboot", [] { return Syscall6(SYS_reboot, 0xfee1dead, 672274793, 0x4321fedc); }},
      {"swapon", [] { return Syscall6(SYS_swapon, reinterpret_cast<long>("/tmp/x"), 0); }},
      {"acct", [] { return Syscall6(SYS_acct, 0); }},
      {"settimeofday", [] { return Syscall6(SYS_settimeofday, 0, 0); }},
      {"fanotify_init", [] { return Syscall6(SYS_fanotify_init, 0, 0); }},
      {"personality_no_aslr", [] { return Syscall6(SYS_personality, 0x0040000); }},
      {"int80", Int80},
      {"packet_socket", [] { return static_cast<long>(socket(AF_PACKET, SOCK_RAW, 0)); }},
      {"raw_socket", [] { return static_cast<long>(socket(AF_INET, SOCK_RAW, 1)); }},
      {"vsock_socket", [] { return static_cast<long>(socket(40 /* AF_VSOCK */, SOCK_STREAM, 0)); }},
      {"alg_socket", [] { return static_cast<long>(socket(AF_ALG, SOCK_SEQPACKET, 0)); }},
      // Harmless controls: the profile must let these through.
      {"getpid", [] { return static_cast<long>(getpid()); }},
      {"clone_plain",
       [] {
         long r = Syscall6(SYS_clone, SIGCHLD);
         if (r == 0) _exit(0);
         if (r > 0) waitpid(static_cast<pid_t>(r), nullptr, 0);
         return r;
       }},
      {"unix_socket", [] { return static_cast<long>(socket(AF_UNIX, SOCK_STREAM, 0)); }},
  };
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    auto it = Attempts().find(argv[i]);
    if (it == Attempts().end()) {
      printf("%s unknown\n", argv[i]);
      fflush(stdout);
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
