// Node-wide kernel budgets that every sandbox on the node shares, sized at edge start so that no
// sandbox (nor all of them together) can use one up for its neighbours and the host:
//  - fs.file-max: the host's open-file table. Raised to its maximum, so what bounds a
//    sandbox's open files is its memory limit (the kernel charges each struct file and fd
//    table to the opener's memory cgroup), not a count shared by the whole node.
//  - fs.aio-max-nr: the host's count of AIO events (io_setup). Raised to its maximum for the
//    same reason: the kernel charges each AIO context's ring and objects to the memory cgroup
//    of whoever sets it up, so a sandbox's memory limit bounds its AIO contexts, not a count
//    of 65,536 shared by the whole node (which a sandbox took for 4 MB).
//  - kernel.pid_max and kernel.threads-max: the parent cgroup of all sandboxes gets a pids
//    limit that keeps a reserve of both for the host (pid_max is raised to the kernel's
//    maximum first, so the bound is set by threads-max, i.e. memory).
//  - kernel.pty.max: all devpts instances share it; each sandbox's own devpts gets a maximum
//    (pty_per_sandbox), and pty.max is raised so max_sandboxes of those fit beside the host's
//    reserved ones.
//  - net.ipv4.tcp_mem: read, to size the TCP buffers all sandboxes may hold on cgroup v1.
// Host-wide sysctls are only ever raised, never lowered (another edge on the host may rely on
// them), and only with apply_sysctls; what changed is listed in `changes`.
// Privileges: root (writes /proc/sys).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/records.h"
#include "base/status.h"

namespace dsec::edge {

struct NodeBudgetOptions {
  bool apply_sysctls = true;
  int64_t max_sandboxes = 4096;
  uint32_t pty_per_sandbox = 256;
  int64_t reserve_pids = -1;           // kept for the host; -1: max(4096, 10% of the bound)
  std::string proc_sys = "/proc/sys";  // tests point this at a fake tree
  int64_t memory_mb = 0;  // the node's memory: sizes the TCP budget where tcp_mem is not shown
};

using api::NodeBudget;

StatusOr<NodeBudget> PrepareNodeBudget(const NodeBudgetOptions& opts);

// The edge's own open-file budget. Every live sandbox holds kEdgeFdsPerSandbox descriptors of
// the edge's (its agent connection, its network namespace, its owner lock; one spare for a
// create in flight), and every HTTP connection one. At start the edge raises RLIMIT_NOFILE
// (and fs.nr_open, with apply_sysctls) to what max_sandboxes and max_connections need, as far
// as it may; what it could not get lowers how many sandboxes it admits (429 beyond, never an
// EMFILE in the middle of a create) and how many connections it accepts.
inline constexpr int64_t kEdgeFdsPerSandbox = 4;
inline constexpr int64_t kEdgeFdsBase = 512;  // state DB, logs, listeners, threads, pools

using api::FileBudget;

StatusOr<FileBudget> PrepareFileBudget(int64_t max_sandboxes, int max_connections,
                                       bool apply_sysctls,
                                       const std::string& proc_sys = "/proc/sys");

}  // namespace dsec::edge
