#include "isolation/credentials.h"

#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sstream>

namespace dsec::isolation {

uint64_t CapMask(std::initializer_list<int> caps) {
  uint64_t m = 0;
  for (int c : caps) m |= 1ULL << c;
  return m;
}

uint64_t RootCapabilities() {
  return CapMask({CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID,
                  CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE});
}

Status DropBoundingSet(uint64_t keep) {
  for (int cap = 0; cap <= 63; ++cap) {
    if (keep & (1ULL << cap)) continue;
    if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0) break;  // past the kernel's last cap
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
      return ErrnoError("prctl(PR_CAPBSET_DROP, " + std::to_string(cap) + ")");
  }
  return OkStatus();
}

Status SetCapabilities(uint64_t caps) {
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
    return ErrnoError("prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  for (int i = 0; i < 2; ++i) {
    auto word = static_cast<uint32_t>(caps >> (32 * i));
    data[i].effective = data[i].permitted = word;  // inheritable stays empty
  }
  if (syscall(SYS_capset, &hdr, data) < 0) return ErrnoError("capset");
  return OkStatus();
}

Status ApplyRlimits(const Rlimits& r) {
  // Limits only go down: raising a hard limit needs CAP_SYS_RESOURCE in the initial user
  // namespace, which a sandbox never has. The edge raises its own limits at start.
  auto set = [](int res, uint64_t v, const char* name) -> Status {
    rlimit cur{};
    if (getrlimit(res, &cur) < 0) return ErrnoError(std::string("getrlimit ") + name);
    rlimit l{};
    l.rlim_cur = l.rlim_max = v == 0 && res == RLIMIT_FSIZE ? RLIM_INFINITY : v;
    if (cur.rlim_max != RLIM_INFINITY && (l.rlim_max == RLIM_INFINITY || l.rlim_max > cur.rlim_max))
      l.rlim_cur = l.rlim_max = cur.rlim_max;
    if (setrlimit(res, &l) < 0) return ErrnoError(std::string("setrlimit ") + name);
    return OkStatus();
  };
  DSEC_RETURN_IF_ERROR(set(RLIMIT_NOFILE, r.nofile, "RLIMIT_NOFILE"));
  DSEC_RETURN_IF_ERROR(set(RLIMIT_FSIZE, r.fsize, "RLIMIT_FSIZE"));
  DSEC_RETURN_IF_ERROR(set(RLIMIT_CORE, r.core, "RLIMIT_CORE"));
  rlimit stack{};
  stack.rlim_cur = r.stack;
  stack.rlim_max = RLIM_INFINITY;
  if (getrlimit(RLIMIT_STACK, &stack) == 0) {
    stack.rlim_cur = std::min<rlim_t>(r.stack, stack.rlim_max);
    (void)setrlimit(RLIMIT_STACK, &stack);
  }
  return OkStatus();
}

Status SetNoNewPrivs() {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return ErrnoError("prctl(PR_SET_NO_NEW_PRIVS)");
  return OkStatus();
}

Status InstallSeccompPrograms(const std::vector<std::string>& programs) {
  for (const auto& p : programs) {
    if (p.empty() || p.size() % sizeof(sock_filter) != 0 || p.size() / sizeof(sock_filter) > 4096)
      return InvalidArgument("malformed seccomp program");
    sock_fprog prog{};
    prog.len = static_cast<unsigned short>(p.size() / sizeof(sock_filter));
    prog.filter = reinterpret_cast<sock_filter*>(const_cast<char*>(p.data()));
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
      return ErrnoError("seccomp(SECCOMP_SET_MODE_FILTER)");
  }
  return OkStatus();
}

Status ApplyExecCredentials(const ExecCredentials& c) {
  // The bounding set first, while CAP_SETPCAP is still held.
  DSEC_RETURN_IF_ERROR(DropBoundingSet(c.caps));
  DSEC_RETURN_IF_ERROR(ApplyRlimits(c.rlimits));
  if (setgroups(0, nullptr) < 0) return ErrnoError("setgroups(0)");
  if (setresgid(c.gid, c.gid, c.gid) < 0) return ErrnoError("setresgid " + std::to_string(c.gid));
  if (setresuid(c.uid, c.uid, c.uid) < 0) return ErrnoError("setresuid " + std::to_string(c.uid));
  // A switch to a non-zero uid already cleared permitted/effective; this also clears the
  // inheritable and ambient sets, and for root leaves exactly the kept set.
  DSEC_RETURN_IF_ERROR(SetCapabilities(c.caps));
  DSEC_RETURN_IF_ERROR(SetNoNewPrivs());
  if (c.seccomp_programs) DSEC_RETURN_IF_ERROR(InstallSeccompPrograms(*c.seccomp_programs));
  return OkStatus();
}

uint64_t ParseCapLine(const std::string& status, const std::string& key) {
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1), nullptr, 16);
  }
  return ~0ULL;
}

}  // namespace dsec::isolation
