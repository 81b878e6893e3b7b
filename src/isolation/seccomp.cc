#include "isolation/seccomp.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

namespace dsec::isolation {

namespace {

// Allowed unconditionally (Docker's default list, minus what DESIGN.md forbids).
constexpr const char* kAllowed[] = {"accept",
                                    "accept4",
                                    "access",
                                    "adjtimex",
                                    "alarm",
                                    "arch_prctl",
                                    "bind",
                                    "brk",
                                    "cachestat",
                                    "capget",
                                    "capset",
                                    "chdir",
                                    "chmod",
                                    "chown",
                                    "clock_adjtime",
                                    "clock_getres",
                                    "clock_gettime",
                                    "clock_nanosleep",
                                    "close",
                                    "close_range",
                                    "connect",
                                    "copy_file_range",
                                    "creat",
                                    "dup",
                                    "dup2",
                                    "dup3",
                                    "epoll_create",
                                    "epoll_create1",
                                    "epoll_ctl",
                                    "epoll_pwait",
                                    "epoll_pwait2",
                                    "epoll_wait",
                                    "eventfd",
                                    "eventfd2",
                                    "execve",
                                    "execveat",
                                    "exit",
                                    "exit_group",
                                    "faccessat",
                                    "faccessat2",
                                    "fadvise64",
                                    "fallocate",
                                    "fanotify_mark",
                                    "fchdir",
                                    "fchmod",
                                    "fchmodat",
                                    "fchmodat2",
                                    "fchown",
                                    "fchownat",
                                    "fcntl",
                                    "fdatasync",
                                    "fgetxattr",
                                    "flistxattr",
                                    "flock",
                                    "fork",
                                    "fremovexattr",
                                    "fsetxattr",
                                    "fstat",
                                    "fstatfs",
                                    "fsync",
                                    "ftruncate",
                                    "futex",
                                    "futex_waitv",
                                    "futimesat",
                                    "get_mempolicy",
                                    "get_robust_list",
                                    "get_thread_area",
                                    "getcpu",
                                    "getcwd",
                                    "getdents",
                                    "getdents64",
                                    "getegid",
                                    "geteuid",
                                    "getgid",
                                    "getgroups",
                                    "getitimer",
                                    "getpeername",
                                    "getpgid",
                                    "getpgrp",
                                    "getpid",
                                    "getppid",
                                    "getpriority",
                                    "getrandom",
                                    "getresgid",
                                    "getresuid",
                                    "getrlimit",
                                    "getrusage",
                                    "getsid",
                                    "getsockname",
                                    "getsockopt",
                                    "gettid",
                                    "gettimeofday",
                                    "getuid",
                                    "getxattr",
                                    "inotify_add_watch",
                                    "inotify_init",
                                    "inotify_init1",
                                    "inotify_rm_watch",
                                    "io_cancel",
                                    "io_destroy",
                                    "io_getevents",
                                    "io_pgetevents",
                                    "io_setup",
                                    "io_submit",
                                    "ioprio_get",
                                    "ioprio_set",
                                    "kill",
                                    "landlock_add_rule",
                                    "landlock_create_ruleset",
                                    "landlock_restrict_self",
                                    "lchown",
                                    "lgetxattr",
                                    "link",
                                    "linkat",
                                    "listen",
                                    "listxattr",
                                    "llistxattr",
                                    "lremovexattr",
                                    "lseek",
                                    "lsetxattr",
                                    "lstat",
                                    "madvise",
                                    "membarrier",
                                    "memfd_create",
                                    "mincore",
                                    "mkdir",
                                    "mkdirat",
                                    "mlock",
                                    "mlock2",
                                    "mlockall",
                                    "mmap",
                                    "modify_ldt",
                                    "mprotect",
                                    "mq_getsetattr",
                                    "mq_notify",
                                    "mq_open",
                                    "mq_timedreceive",
                                    "mq_timedsend",
                                    "mq_unlink",
                                    "mremap",
                                    "msgctl",
                                    "msgget",
                                    "msgrcv",
                                    "msgsnd",
                                    "msync",
                                    "munlock",
                                    "munlockall",
                                    "munmap",
                                    "name_to_handle_at",
                                    "nanosleep",
                                    "newfstatat",
                                    "open",
                                    "openat",
                                    "openat2",
                                    "pause",
                                    "pidfd_open",
                                    "pidfd_send_signal",
                                    "pipe",
                                    "pipe2",
                                    "pkey_alloc",
                                    "pkey_free",
                                    "pkey_mprotect",
                                    "poll",
                                    "ppoll",
                                    "prctl",
                                    "pread64",
                                    "preadv",
                                    "preadv2",
                                    "prlimit64",
                                    "process_mrelease",
                                    "pselect6",
                                    "pwrite64",
                                    "pwritev",
                                    "pwritev2",
                                    "read",
                                    "readahead",
                                    "readlink",
                                    "readlinkat",
                                    "readv",
                                    "recvfrom",
                                    "recvmmsg",
                                    "recvmsg",
                                    "remap_file_pages",
                                    "removexattr",
                                    "rename",
                                    "renameat",
                                    "renameat2",
                                    "restart_syscall",
                                    "rmdir",
                                    "rseq",
                                    "rt_sigaction",
                                    "rt_sigpending",
                                    "rt_sigprocmask",
                                    "rt_sigqueueinfo",
                                    "rt_sigreturn",
                                    "rt_sigsuspend",
                                    "rt_sigtimedwait",
                                    "rt_tgsigqueueinfo",
                                    "sched_get_priority_max",
                                    "sched_get_priority_min",
                                    "sched_getaffinity",
                                    "sched_getattr",
                                    "sched_getparam",
                                    "sched_getscheduler",
                                    "sched_rr_get_interval",
                                    "sched_setaffinity",
                                    "sched_setattr",
                                    "sched_setparam",
                                    "sched_setscheduler",
                                    "sched_yield",
                                    "seccomp",
                                    "select",
                                    "semctl",
                                    "semget",
                                    "semop",
                                    "semtimedop",
                                    "sendfile",
                                    "sendmmsg",
                                    "sendmsg",
                                    "sendto",
                                    "set_robust_list",
                                    "set_thread_area",
                                    "set_tid_address",
                                    "setfsgid",
                                    "setfsuid",
                                    "setgid",
                                    "setgroups",
                                    "setitimer",
                                    "setpgid",
                                    "setpriority",
                                    "setregid",
                                    "setresgid",
                                    "setresuid",
                                    "setreuid",
                                    "setrlimit",
                                    "setsid",
                                    "setsockopt",
                                    "setuid",
                                    "setxattr",
                                    "shmat",
                                    "shmctl",
                                    "shmdt",
                                    "shmget",
                                    "shutdown",
                                    "sigaltstack",
                                    "signalfd",
                                    "signalfd4",
                                    "socketpair",
                                    "splice",
                                    "stat",
                                    "statfs",
                                    "statx",
                                    "symlink",
                                    "symlinkat",
                                    "sync",
                                    "sync_file_range",
                                    "syncfs",
                                    "sysinfo",
                                    "tee",
                                    "tgkill",
                                    "time",
                                    "timer_create",
                                    "timer_delete",
                                    "timer_getoverrun",
                                    "timer_gettime",
                                    "timer_settime",
                                    "timerfd_create",
                                    "timerfd_gettime",
                                    "timerfd_settime",
                                    "times",
                                    "tkill",
                                    "truncate",
                                    "umask",
                                    "uname",
                                    "unlink",
                                    "unlinkat",
                                    "utime",
                                    "utimensat",
                                    "utimes",
                                    "vfork",
                                    "vmsplice",
                                    "wait4",
                                    "waitid",
                                    "write",
                                    "writev",
                                    "process_madvise",
                                    "map_shadow_stack"};

constexpr const char* kPtrace[] = {"ptrace", "process_vm_readv", "process_vm_writev"};

// Refused with EPERM so callers see a clear "not permitted" rather than "not implemented".
constexpr const char* kDenied[] = {"mount",
                                   "umount2",
                                   "pivot_root",
                                   "chroot",
                                   "move_mount",
                                   "open_tree",
                                   "fsopen",
                                   "fsconfig",
                                   "fsmount",
                                   "fspick",
                                   "mount_setattr",
                                   "unshare",
                                   "setns",
                                   "bpf",
                                   "keyctl",
                                   "add_key",
                                   "request_key",
                                   "userfaultfd",
                                   "perf_event_open",
                                   "io_uring_setup",
                                   "io_uring_enter",
                                   "io_uring_register",
                                   "kexec_load",
                                   "kexec_file_load",
                                   "init_module",
                                   "finit_module",
                                   "delete_module",
                                   "open_by_handle_at",
                                   "swapon",
                                   "swapoff",
                                   "reboot",
                                   "acct",
                                   "settimeofday",
                                   "clock_settime",
                                   "syslog",
                                   "vhangup",
                                   "quotactl",
                                   "lookup_dcookie",
                                   "iopl",
                                   "ioperm",
                                   "kcmp",
                                   "pidfd_getfd",
                                   "fanotify_init",
                                   "sethostname",
                                   "setdomainname",
                                   "mbind",
                                   "set_mempolicy",
                                   "migrate_pages",
                                   "move_pages",
                                   "memfd_secret",
                                   "nfsservctl",
                                   "uselib",
                                   "ustat",
                                   "sysfs",
                                   "_sysctl",
                                   "personality"};

constexpr uint64_t kNamespaceFlags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                     CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP | CLONE_NEWTIME;

struct CtxDeleter {
  void operator()(void* c) const { seccomp_release(c); }
};
using Ctx = std::unique_ptr<void, CtxDeleter>;

Status Check(int rc, const std::string& what) {
  if (rc < 0) return ErrnoStatus(-rc, "seccomp " + what);
  return OkStatus();
}

Status Rule(scmp_filter_ctx ctx, uint32_t action, const char* name, unsigned n,
            const scmp_arg_cmp* args = nullptr) {
  int nr = seccomp_syscall_resolve_name(name);
  if (nr == __NR_SCMP_ERROR) return OkStatus();  // unknown to this libseccomp/arch: default
  return Check(seccomp_rule_add_array(ctx, action, nr, n, args), std::string("rule ") + name);
}

StatusOr<Ctx> Build(const SeccompOptions& opts) {
  Ctx ctx(seccomp_init(SCMP_ACT_ERRNO(ENOSYS)));
  if (!ctx) return InternalError("seccomp_init failed");
  scmp_filter_ctx c = ctx.get();
  DSEC_RETURN_IF_ERROR(
      Check(seccomp_attr_set(c, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "badarch"));
  DSEC_RETURN_IF_ERROR(Check(seccomp_attr_set(c, SCMP_FLTATR_CTL_NNP, 0), "nnp"));
  // A binary tree of syscall numbers instead of a linear chain: the kernel emulates the filter
  // for every syscall number when it installs it (to build its allow cache), so the install
  // costs O(syscalls x depth); a tree keeps that, and each filtered call, short.
  DSEC_RETURN_IF_ERROR(Check(seccomp_attr_set(c, SCMP_FLTATR_CTL_OPTIMIZE, 2), "optimize"));
  const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
  for (const char* n : kAllowed) DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, n, 0));
  for (const char* n : kPtrace)
    DSEC_RETURN_IF_ERROR(Rule(c, opts.allow_ptrace ? SCMP_ACT_ALLOW : eperm, n, 0));
  for (const char* n : kDenied) {
    std::string_view name(n);
    if (name == "personality") continue;
    if (opts.zygote && (name == "mount" || name == "umount2")) {
      DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, n, 0));
      continue;
    }
    if (opts.zygote && name == "unshare") continue;  // flag-checked like clone, below
    DSEC_RETURN_IF_ERROR(Rule(c, eperm, n, 0));
  }

  // clone: allowed without namespace flags (fork, threads); with any of them, EPERM (the
  // zygote profile allows the per-call mount, pid and ipc namespaces).
  const uint64_t refused_ns =
      opts.zygote ? kNamespaceFlags & ~uint64_t{CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC}
                  : kNamespaceFlags;
  scmp_arg_cmp no_ns = SCMP_A0(SCMP_CMP_MASKED_EQ, refused_ns, 0);
  DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "clone", 1, &no_ns));
  for (uint64_t bit = 1; bit; bit <<= 1) {
    if (!(refused_ns & bit)) continue;
    scmp_arg_cmp has = SCMP_A0(SCMP_CMP_MASKED_EQ, bit, bit);
    DSEC_RETURN_IF_ERROR(Rule(c, eperm, "clone", 1, &has));
  }
  if (opts.zygote) {
    DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "unshare", 1, &no_ns));
    for (uint64_t bit = 1; bit; bit <<= 1) {
      if (!(refused_ns & bit)) continue;
      scmp_arg_cmp has = SCMP_A0(SCMP_CMP_MASKED_EQ, bit, bit);
      DSEC_RETURN_IF_ERROR(Rule(c, eperm, "unshare", 1, &has));
    }
  }
  // clone3 gets the default action, ENOSYS (libseccomp refuses a rule equal to the default).

  // ioctl is allowed here; TIOCSTI and TIOCLINUX are refused by a hand-written prefix
  // (HandWrittenPrefix), because libseccomp 2.5 cannot express "low 32 bits differ": it lets
  // cmd = (1 << 32) | TIOCSTI through, and the kernel truncates cmd to 32 bits.
  DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "ioctl", 0));

  // socket: the families a tool call needs. Raw/packet/vsock/alg/etc. are refused, and netlink
  // only speaks route (ip addr) and sock_diag (ss): no kernel uevents, no audit, no xfrm.
  for (int fam : {AF_UNIX, AF_INET, AF_INET6}) {
    scmp_arg_cmp a = SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(fam));
    DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "socket", 1, &a));
  }
  for (uint64_t proto : {0 /* NETLINK_ROUTE */, 4 /* NETLINK_SOCK_DIAG */}) {
    scmp_arg_cmp a[] = {SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(AF_NETLINK)),
                        SCMP_A2(SCMP_CMP_EQ, proto)};
    DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "socket", 2, a));
  }

  // mknod: regular files, FIFOs and sockets only; device nodes are refused.
  for (const auto& [name, idx] : {std::pair{"mknod", 1u}, std::pair{"mknodat", 2u}}) {
    for (uint64_t type : std::initializer_list<uint64_t>{0, S_IFREG, S_IFIFO, S_IFSOCK}) {
      scmp_arg_cmp a{idx, SCMP_CMP_MASKED_EQ, S_IFMT, type};
      DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, name, 1, &a));
    }
    for (uint64_t type : std::initializer_list<uint64_t>{S_IFCHR, S_IFBLK}) {
      scmp_arg_cmp a{idx, SCMP_CMP_MASKED_EQ, S_IFMT, type};
      DSEC_RETURN_IF_ERROR(Rule(c, eperm, name, 1, &a));
    }
  }

  // personality: the query and the values Docker allows; not ADDR_NO_RANDOMIZE and friends.
  for (uint64_t v : std::initializer_list<uint64_t>{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}) {
    scmp_arg_cmp a = SCMP_A0(SCMP_CMP_EQ, v);
    DSEC_RETURN_IF_ERROR(Rule(c, SCMP_ACT_ALLOW, "personality", 1, &a));
  }
  return ctx;
}

// A small cBPF assembler with forward labels, for the hand-written prefix below.
class Prefix {
 public:
  int NewLabel() { return next_label_++; }
  void Bind(int label) { labels_[label] = static_cast<int>(code_.size()); }
  void Load(uint32_t offset) { Emit(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset)); }
  // if A == k goto on_eq else goto on_ne (-1: the next instruction)
  void JumpIfEqual(uint32_t k, int on_eq, int on_ne) {
    Emit(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, k, 0, 0), on_eq, on_ne);
  }
  void Return(uint32_t action) { Emit(BPF_STMT(BPF_RET | BPF_K, action)); }
  void Jump(int label) { Emit(BPF_STMT(BPF_JMP | BPF_JA, 0), -1, -1, label); }
  std::string Assemble() {
    for (size_t i = 0; i < code_.size(); ++i) {
      auto target = [&](int label) -> uint8_t {
        if (label < 0) return 0;
        int off = labels_.at(label) - static_cast<int>(i) - 1;
        if (off < 0 || off > 255) abort();  // forward and short, by construction
        return static_cast<uint8_t>(off);
      };
      code_[i].jt = target(jt_[i]);
      code_[i].jf = target(jf_[i]);
      if (ja_[i] >= 0)
        code_[i].k = static_cast<uint32_t>(labels_.at(ja_[i]) - static_cast<int>(i) - 1);
    }
    return std::string(reinterpret_cast<const char*>(code_.data()),
                       code_.size() * sizeof(sock_filter));
  }

 private:
  void Emit(sock_filter f, int jt = -1, int jf = -1, int ja = -1) {
    code_.push_back(f);
    jt_.push_back(jt);
    jf_.push_back(jf);
    ja_.push_back(ja);
  }
  std::vector<sock_filter> code_;
  std::vector<int> jt_, jf_, ja_;
  std::map<int, int> labels_;
  int next_label_ = 0;
};

// Instructions that run before libseccomp's program, for checks libseccomp 2.5 cannot express
// correctly: the kernel truncates these arguments to 32 bits (cmd, pid_t), but libseccomp lets
// any value with high bits set through a "not equal" rule. Here only the low 32 bits are
// compared. Anything not refused falls through to the main program (cBPF jumps are relative,
// so prepending is safe).
//  - ioctl(fd, TIOCSTI, ...): terminal input injection; ioctl(fd, TIOCLINUX, ...): the virtual
//    console's selection paste (input injection again) and kernel message redirection.
//  - prlimit64, sched_set{affinity,attr,scheduler,param} on pid 1, setpriority/ioprio_set on
//    pid 1 or on a whole user: root inside shares PID 1's uid, and must not be able to starve
//    the agent, lower its limits (RLIMIT_CPU ends in SIGKILL) or deprioritize it.
std::string HandWrittenPrefix() {
#if !defined(__x86_64__)
#error "HandWrittenPrefix: add this architecture's AUDIT_ARCH and argument layout"
#endif
  auto arg_low = [](int i) {  // little-endian: the low word of args[i]
    return static_cast<uint32_t>(offsetof(seccomp_data, args) + i * sizeof(uint64_t));
  };
  struct Rule {
    uint32_t nr;
    std::vector<std::pair<int, uint32_t>> refuse;  // (arg index, low-32-bit value)
  };
  const std::vector<Rule> rules = {
      {__NR_ioctl, {{1, static_cast<uint32_t>(TIOCSTI)}, {1, static_cast<uint32_t>(TIOCLINUX)}}},
      {__NR_prlimit64, {{0, 1}}},
      {__NR_sched_setaffinity, {{0, 1}}},
      {__NR_sched_setattr, {{0, 1}}},
      {__NR_sched_setscheduler, {{0, 1}}},
      {__NR_sched_setparam, {{0, 1}}},
      {__NR_setpriority, {{1, 1}, {0, 2 /* PRIO_USER */}}},
      {__NR_ioprio_set, {{1, 1}, {0, 3 /* IOPRIO_WHO_USER */}}},
  };
  Prefix p;
  int end = p.NewLabel(), refuse = p.NewLabel();
  p.Load(offsetof(seccomp_data, arch));
  p.JumpIfEqual(AUDIT_ARCH_X86_64, -1, end);  // foreign ABIs: the main program kills them
  for (const auto& r : rules) {
    int next = p.NewLabel();
    p.Load(offsetof(seccomp_data, nr));
    p.JumpIfEqual(r.nr, -1, next);
    for (const auto& [arg, value] : r.refuse) {
      p.Load(arg_low(arg));
      p.JumpIfEqual(value, refuse, -1);
    }
    p.Bind(next);
  }
  // Not refused: continue with the main program, which starts right after this prefix.
  p.Jump(end);
  p.Bind(refuse);
  p.Return(SECCOMP_RET_ERRNO | EPERM);
  p.Bind(end);
  return p.Assemble();
}

}  // namespace

StatusOr<std::vector<std::string>> BuildUserSeccompFilter(const SeccompOptions& opts) {
  DSEC_ASSIGN_OR_RETURN(Ctx ctx, Build(opts));
  std::vector<std::string> programs;
  int fd = memfd_create("dsec-seccomp", MFD_CLOEXEC);
  if (fd < 0) return ErrnoError("memfd_create");
  std::string out;
  Status s = Check(seccomp_export_bpf(ctx.get(), fd), "export");
  if (s.ok()) {
    off_t size = lseek(fd, 0, SEEK_END);
    out.resize(static_cast<size_t>(size));
    if (pread(fd, out.data(), out.size(), 0) != size) s = ErrnoError("pread seccomp bpf");
  }
  close(fd);
  if (!s.ok()) return s;
  // One program: each installed filter costs a JIT compile, which is slow on nested VMs.
  programs.push_back(HandWrittenPrefix() + out);
  return programs;
}

StatusOr<std::string> DescribeUserSeccompFilter(const SeccompOptions& opts) {
  DSEC_ASSIGN_OR_RETURN(Ctx ctx, Build(opts));
  int fd = memfd_create("dsec-seccomp-pfc", MFD_CLOEXEC);
  if (fd < 0) return ErrnoError("memfd_create");
  Status s = Check(seccomp_export_pfc(ctx.get(), fd), "export pfc");
  std::string out;
  if (s.ok()) {
    off_t size = lseek(fd, 0, SEEK_END);
    out.resize(static_cast<size_t>(size));
    if (pread(fd, out.data(), out.size(), 0) != size) s = ErrnoError("pread seccomp pfc");
  }
  close(fd);
  if (!s.ok()) return s;
  return out;
}

}  // namespace dsec::isolation
