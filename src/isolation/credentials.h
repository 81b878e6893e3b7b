// Credentials for user code, applied in the agent's child between fork and exec
// ("InitInChild" side): bounding set, user/groups, capabilities, rlimits, no_new_privs and the
// seccomp filters. Order matters and is fixed by ApplyExecCredentials.
// Runs single-threaded in a freshly forked child; needs CAP_SETUID/SETGID/SETPCAP.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/resources.h"
#include "base/status.h"

namespace dsec::isolation {

// Capability bit masks (1 << CAP_X).
uint64_t CapMask(std::initializer_list<int> caps);
// What root inside a sandbox keeps (Docker's reduced set minus MKNOD, NET_RAW, AUDIT_WRITE,
// SYS_CHROOT): CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP,
// NET_BIND_SERVICE.
uint64_t RootCapabilities();

struct Rlimits {
  uint64_t nofile = 65536;
  uint64_t fsize = 0;  // bytes; 0 = unlimited
  uint64_t core = 0;
  uint64_t stack = 8ull << 20;
};

struct ExecCredentials {
  uid_t uid = kSandboxUid;
  gid_t gid = kSandboxGid;
  // Capabilities kept after the switch: RootCapabilities() for uid 0, none otherwise.
  uint64_t caps = 0;
  Rlimits rlimits;
  const std::vector<std::string>* seccomp_programs = nullptr;  // raw sock_filter arrays
};

Status DropBoundingSet(uint64_t keep);
Status SetCapabilities(uint64_t caps);  // effective = permitted; inheritable, ambient empty
Status ApplyRlimits(const Rlimits& r);
Status SetNoNewPrivs();
Status InstallSeccompPrograms(const std::vector<std::string>& programs);
// The whole sequence: bounding set, rlimits, groups/gid/uid, capabilities, no_new_privs,
// seccomp. After it, the process can only exec.
Status ApplyExecCredentials(const ExecCredentials& c);

// Parses "CapEff:" etc. from /proc/<pid>/status content (used by tests and diagnostics).
uint64_t ParseCapLine(const std::string& status, const std::string& key);

}  // namespace dsec::isolation
