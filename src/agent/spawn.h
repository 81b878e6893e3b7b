// Starting user processes inside the sandbox: each gets its own cgroup under <sb>/user (the
// child joins it first thing: the agent runs under the seccomp profile, which refuses clone3,
// so CLONE_INTO_CGROUP is not available here), a new session, its stdio, and the exec
// credential sequence (isolation/credentials.h) before execve. The seccomp filter is
// inherited from the agent, already compiled.
// Exec failures come back through a CLOEXEC error pipe as "dsec: <what>: <errno text>".
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "base/resources.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "isolation/credentials.h"

namespace dsec::agent {

class Agent;

struct SpawnRequest {
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd = "/";
  uid_t uid = kSandboxUid;
  gid_t gid = kSandboxGid;
  bool root_caps = false;
  std::optional<uint64_t> caps;  // overrides the root capability set (uid 0 only)
  int stdin_fd = -1;             // child ends; -1 = /dev/null
  int stdout_fd = -1;
  int stderr_fd = -1;
  bool controlling_tty = false;  // stdin_fd is a pty slave to become the controlling tty
  std::vector<int> extra_fds;    // placed at 3, 4, ... in the child
  char cgroup_prefix = 'e';
};

struct Spawned {
  pid_t pid = -1;
  UniqueFd err_pipe;   // read end; holds a message if exec failed
  std::string cgroup;  // name under <sb>/user, empty without cgroup2
};

StatusOr<Spawned> Spawn(Agent& agent, const SpawnRequest& req);

// SIGKILLs every process of a child cgroup (cgroup.kill, or freeze + kill + thaw).
void KillCgroup(Agent& agent, const std::string& name);
// Freezes (or thaws) a child cgroup of <sb>/user; best effort.
void FreezeCgroup(Agent& agent, const std::string& name, bool frozen);
// Sends sig to every process in <sb>/user (all user code; the agent is outside it).
int SignalAllUserProcesses(Agent& agent, int sig);
// Pids in a child cgroup of <sb>/user (not recursive).
std::vector<pid_t> CgroupPids(Agent& agent, const std::string& name);
// Whether a child cgroup (or one below it) still holds a process that has not exited; false
// when it cannot be read.
bool CgroupPopulated(Agent& agent, const std::string& name);
// rmdir of an empty child cgroup; false if still populated.
bool RemoveCgroup(Agent& agent, const std::string& name);

// Reads whatever the exec error pipe holds (non-blocking); empty if the exec succeeded.
std::string ReadSpawnError(int err_pipe);

}  // namespace dsec::agent
