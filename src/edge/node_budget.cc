#include "edge/node_budget.h"

#include <sys/resource.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <climits>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::edge {

namespace {

// The kernel's ceilings: PID_MAX_LIMIT on 64-bit, NR_UNIX98_PTY_MAX.
constexpr uint64_t kPidMaxLimit = 4u << 20;
constexpr uint64_t kPtyMaxLimit = 1u << 20;

// Field `field` (tab-separated) of a numeric sysctl.
StatusOr<uint64_t> ReadSysctl(const std::string& root, const std::string& name, size_t field = 0) {
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(root, name), 4096));
  auto f = SplitString(TrimWhitespace(text), '\t', true);
  auto v = field < f.size() ? ParseUint64(TrimWhitespace(f[field])) : std::nullopt;
  if (!v) return InternalError("cannot parse /proc/sys/" + name + ": \"" + text + "\"");
  return *v;
}

// Raises name to at least want (only with `apply`); returns the value in force afterwards.
StatusOr<uint64_t> RaiseSysctl(const std::string& root, bool apply, const std::string& name,
                               uint64_t want, std::vector<std::string>* changes) {
  DSEC_ASSIGN_OR_RETURN(uint64_t cur, ReadSysctl(root, name));
  if (!apply || cur >= want) return cur;
  DSEC_RETURN_IF_ERROR(WriteStringToFile(JoinPath(root, name), std::to_string(want))
                           .WithContext("raise /proc/sys/" + name));
  DSEC_ASSIGN_OR_RETURN(uint64_t now, ReadSysctl(root, name));
  std::string dotted = name;
  std::replace(dotted.begin(), dotted.end(), '/', '.');
  changes->push_back(dotted + " " + std::to_string(cur) + " -> " + std::to_string(now));
  return now;
}

}  // namespace

StatusOr<NodeBudget> PrepareNodeBudget(const NodeBudgetOptions& o) {
  NodeBudget b;
  // Open files: memory is the bound (struct file and fd tables are charged to the memory
  // cgroup of whoever opens them), so the shared count must never be what stops anyone.
  DSEC_ASSIGN_OR_RETURN(b.file_max, RaiseSysctl(o.proc_sys, o.apply_sysctls, "fs/file-max",
                                                static_cast<uint64_t>(LONG_MAX), &b.changes));

  // AIO events: fs.aio-max-nr is one count for the whole host (65,536 by default) that every
  // io_setup takes its nr_events from, whoever calls it; a sandbox took all of it and host root
  // and neighbours got EAGAIN. What a context costs is charged to the caller's memory cgroup:
  // its ring is page cache of the aio inode (32 bytes an event, doubled), its kioctx, file and
  // mapping are accounted slab. Measured on cgroup v1 memory (kernel 6.18): 65,536 events in
  // 16 contexts charged 4 MB (all of it), 20,000 one-event contexts 5.2 KB each, of which only
  // ~33 bytes of per-cpu counters were not charged. So, as for open files, the count is raised
  // out of the way and the memory limit is the bound. (Refusing io_setup in seccomp was the
  // other choice; it would break libaio users — databases, fio, QEMU aio=native — in sandboxes
  // for no gain, since the memory an AIO context pins is already the sandbox's own.)
  auto aio = RaiseSysctl(o.proc_sys, o.apply_sysctls, "fs/aio-max-nr",
                         static_cast<uint64_t>(LONG_MAX), &b.changes);
  if (aio.ok())
    b.aio_max_nr = *aio;
  else if (aio.status().error_number() != ENOENT)  // a kernel without CONFIG_AIO has no count
    return aio.status();

  // Processes: pid_max to the kernel's ceiling; threads-max (derived from memory) stays the
  // host's; the sandboxes together get both minus a reserve for the host.
  DSEC_ASSIGN_OR_RETURN(b.pid_max, RaiseSysctl(o.proc_sys, o.apply_sysctls, "kernel/pid_max",
                                               kPidMaxLimit, &b.changes));
  DSEC_ASSIGN_OR_RETURN(b.threads_max, ReadSysctl(o.proc_sys, "kernel/threads-max"));
  int64_t total = static_cast<int64_t>(std::min(b.pid_max, b.threads_max));
  int64_t reserve = o.reserve_pids >= 0 ? o.reserve_pids : std::max<int64_t>(4096, total / 10);
  if (reserve >= total)
    return InvalidArgument(
        "reserve_pids " + std::to_string(reserve) + " leaves no processes for sandboxes (pid_max " +
        std::to_string(b.pid_max) + ", threads-max " + std::to_string(b.threads_max) + ")");
  b.sandbox_pids = total - reserve;

  // Pseudo-terminals: the host's own devpts keeps pty.reserve; every other instance shares
  // pty.max - reserve. Size it for max_sandboxes devpts instances at their own maximum, within
  // the kernel's ceiling (which may cut the per-sandbox maximum on very dense nodes).
  // The per-sandbox maximum is then cut to what the value in force leaves (it stays what it
  // was without apply_sysctls), with a floor of 16 so a sandbox can always open a terminal.
  DSEC_ASSIGN_OR_RETURN(b.pty_reserve, ReadSysctl(o.proc_sys, "kernel/pty/reserve"));
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(1, o.max_sandboxes));
  const uint64_t want = std::min(kPtyMaxLimit, b.pty_reserve + uint64_t{o.pty_per_sandbox} * n);
  DSEC_ASSIGN_OR_RETURN(
      b.pty_max, RaiseSysctl(o.proc_sys, o.apply_sysctls, "kernel/pty/max", want, &b.changes));
  const uint64_t room = b.pty_max - std::min(b.pty_max, b.pty_reserve);
  b.pty_per_sandbox = static_cast<uint32_t>(std::max<uint64_t>(
      std::min<uint64_t>(o.pty_per_sandbox, room / n), std::min<uint64_t>(o.pty_per_sandbox, 16)));

  // tcp_mem is node-wide and shown only in the initial network namespace. An edge running in
  // another one (a test's private node) uses the kernel's own default: free buffer pages / 16,
  // which is memory / 16 within a percent.
  auto pressure_or = ReadSysctl(o.proc_sys, "net/ipv4/tcp_mem", 1);
  if (!pressure_or.ok() && pressure_or.status().error_number() == ENOENT && o.memory_mb > 0)
    pressure_or = std::max<uint64_t>(128, (static_cast<uint64_t>(o.memory_mb) << 20) /
                                              static_cast<uint64_t>(getpagesize()) / 16);
  DSEC_ASSIGN_OR_RETURN(uint64_t pressure, pressure_or);
  b.sandbox_tcp_bytes =
      static_cast<int64_t>(pressure * static_cast<uint64_t>(getpagesize()) / 4 * 3);
  return b;
}

StatusOr<FileBudget> PrepareFileBudget(int64_t max_sandboxes, int max_connections,
                                       bool apply_sysctls, const std::string& proc_sys) {
  FileBudget b;
  const uint64_t want = static_cast<uint64_t>(kEdgeFdsBase + max_sandboxes * kEdgeFdsPerSandbox +
                                              std::max(64, max_connections));
  // fs.nr_open caps what any process's RLIMIT_NOFILE may be.
  DSEC_ASSIGN_OR_RETURN(uint64_t nr_open,
                        RaiseSysctl(proc_sys, apply_sysctls, "fs/nr_open", want, &b.changes));
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return ErrnoError("getrlimit RLIMIT_NOFILE");
  uint64_t target = std::min<uint64_t>(want, nr_open);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < target) {
    rlimit raised{std::max<rlim_t>(rl.rlim_cur, target), target};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0)  // needs CAP_SYS_RESOURCE
      b.changes.push_back("RLIMIT_NOFILE hard " + std::to_string(rl.rlim_max) + " -> " +
                          std::to_string(target));
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < std::min<rlim_t>(rl.rlim_max, target)) {
    rlimit soft{std::min<rlim_t>(rl.rlim_max, target), rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &soft) == 0)
      b.changes.push_back("RLIMIT_NOFILE soft " + std::to_string(rl.rlim_cur) + " -> " +
                          std::to_string(soft.rlim_cur));
    (void)getrlimit(RLIMIT_NOFILE, &rl);
  }
  b.nofile = rl.rlim_cur == RLIM_INFINITY ? want : rl.rlim_cur;
  // Sandboxes first (what they hold they hold for minutes), then connections get what is left
  // (at least 64, never more than configured).
  int64_t room = static_cast<int64_t>(b.nofile) - kEdgeFdsBase - 64;
  b.max_sandboxes = std::max<int64_t>(0, std::min(max_sandboxes, room / kEdgeFdsPerSandbox));
  int64_t left =
      static_cast<int64_t>(b.nofile) - kEdgeFdsBase - b.max_sandboxes * kEdgeFdsPerSandbox;
  int64_t conns = max_connections;
  if (left < conns) conns = std::max<int64_t>(64, left);
  b.max_connections = static_cast<int>(conns);
  return b;
}

}  // namespace dsec::edge
