// Starts dsec-agent as PID 1 of a new sandbox ("InitFromParent" side, step 2 of DESIGN.md's
// isolation sequence): a clone into new mount, pid, uts, ipc, cgroup and network namespaces
// (or a pooled network namespace) and a user namespace when enabled. The child waits until the
// parent wrote its id maps and cgroup membership, becomes root of its user namespace and execs
// the agent from the sealed memfd, with the edge connection on fd 3 and /dev/null on 0-2;
// every other fd closes at exec.
//
// All clones happen on one launcher thread that lives in a private mount namespace holding
// only what a new sandbox needs (/, /proc, /dev, the state dir's mount): every sandbox copies,
// and later tears down, that small namespace instead of the host's. The clone shares the
// edge's address space (CLONE_VM, like posix_spawn) so nothing is copied for it: the child runs
// on its own stack, with every signal blocked, and only makes raw syscalls that touch no
// memory of the parent's (not even errno) until it execs.
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/pidfd.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::backends::container {

struct LaunchRequest {
  int agent_memfd = -1;
  int channel_fd = -1;  // child end of the edge <-> agent socketpair
  bool userns = false;
  int cgroup_fd = -1;  // v2 cgroup dir for CLONE_INTO_CGROUP; -1 to join later
  // An existing network namespace to start in (the launcher thread joins it for the clone);
  // -1 for a new one.
  int netns_fd = -1;
  // With userns: the host uid that owns the new user namespace (0: root). The kernel charges
  // a user namespace's per-user budgets to its owner in the parent namespace, so a sandbox's
  // own owner keeps them apart from the edge's and every other sandbox's. The launcher thread
  // clones with this effective uid (its capabilities kept: SECBIT_NO_SETUID_FIXUP).
  uid_t userns_owner = 0;
};

// A started agent that is still waiting for Release().
class PendingAgent {
 public:
  PendingAgent(PidFd pid, UniqueFd go, void* stack, size_t stack_size)
      : pid_(std::move(pid)), go_(std::move(go)), stack_(stack), stack_size_(stack_size) {}
  PendingAgent(PendingAgent&& o) noexcept;
  PendingAgent& operator=(PendingAgent&&) = delete;
  ~PendingAgent();
  pid_t pid() const { return pid_.valid() ? pid_.pid() : child_pid_; }
  // Lets the child continue to exec the agent.
  Status Release();
  // The child has exec'd (the agent said hello): its launch stack is free.
  void Execd() { FreeStack(); }
  // Kills and reaps the child (use when setting it up failed, and on destroy).
  void Abort();
  // Closes the pidfd once the agent runs: one descriptor less per live sandbox. The agent is
  // our child and nothing in this process reaps children but Abort(), so its pid cannot be
  // recycled until then and plain kill/waitpid on it stay exact.
  void DropPidfd();

 private:
  void FreeStack();
  PidFd pid_;
  pid_t child_pid_ = -1;  // after DropPidfd
  UniqueFd go_;
  void* stack_ = nullptr;
  size_t stack_size_ = 0;
};

class Launcher {
 public:
  // `keep` are paths whose mounts must stay visible to new sandboxes (the state dir).
  static StatusOr<std::unique_ptr<Launcher>> Start(const std::vector<std::string>& keep);
  ~Launcher();
  // Thread-safe; the clone itself runs on the launcher thread.
  StatusOr<PendingAgent> Launch(const LaunchRequest& req);

 private:
  Launcher() = default;
  void Run(std::vector<std::string> keep, std::promise<Status>* ready);
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ DSEC_GUARDED_BY(mu_);
  Mutex launch_mu_;       // one launch on the socket at a time
  UniqueFd sock_;         // the edge's end
  int thread_sock_ = -1;  // the end in the launcher thread's own fd table
  bool stop_ DSEC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// A sealed memfd holding the agent binary: the sandbox can neither rewrite the host binary
// nor the memfd (F_SEAL_WRITE|SHRINK|GROW|SEAL).
StatusOr<UniqueFd> SealAgentBinary(const std::string& path);

}  // namespace dsec::backends::container
