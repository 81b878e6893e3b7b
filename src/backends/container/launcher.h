// Starts dsec-agent as PID 1 of a new sandbox ("InitFromParent" side, step 2 of DESIGN.md's
// isolation sequence): clone3 into new mount, pid, uts, ipc, net and cgroup namespaces (and a
// user namespace when enabled), born in the sandbox's cgroup (CLONE_INTO_CGROUP) when the
// kernel allows. The child waits until the parent wrote its id maps and cgroup membership,
// then becomes root of its user namespace and execs the agent from the sealed memfd with the
// edge connection on fd 3 and /dev/null on 0-2; every other fd closes at exec.
//
// The caller may be multithreaded: the child runs only raw syscalls on data prepared before
// the clone (no allocation, no glibc setxid broadcast).
#pragma once

#include <sys/types.h>

#include "base/pidfd.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::backends::container {

struct LaunchRequest {
  int agent_memfd = -1;
  int channel_fd = -1;  // child end of the edge <-> agent socketpair
  bool userns = false;
  int cgroup_fd = -1;   // v2 cgroup dir for CLONE_INTO_CGROUP; -1 to join later
};

// A started agent that is still waiting for Release().
class PendingAgent {
 public:
  PendingAgent(PidFd pid, UniqueFd go) : pid_(std::move(pid)), go_(std::move(go)) {}
  PidFd& pidfd() { return pid_; }
  pid_t pid() const { return pid_.pid(); }
  // Lets the child continue to exec the agent.
  Status Release();
  // Kills and reaps the child (use when setting it up failed).
  void Abort();

 private:
  PidFd pid_;
  UniqueFd go_;
};

StatusOr<PendingAgent> LaunchAgent(const LaunchRequest& req);

// A sealed memfd holding the agent binary: the sandbox can neither rewrite the host binary
// nor the memfd (F_SEAL_WRITE|SHRINK|GROW|SEAL).
StatusOr<UniqueFd> SealAgentBinary(const std::string& path);

}  // namespace dsec::backends::container
