// Cgroups behind one interface: a driver per edge instance owns the parent cgroup
// "dsec-<instance>" in every hierarchy it uses, and creates one Cgroup per sandbox under it.
//
// Two drivers:
//  - CgroupV2Driver: pure cgroup v2 (limits, kill, freeze, stats in one hierarchy).
//  - CgroupV1HybridDriver: controllers (memory, pids, cpu) on v1 hierarchies, and the cgroup2
//    mount (e.g. /sys/fs/cgroup/unified, no controllers) for process tracking, cgroup.kill,
//    cgroup.freeze and cpu.stat. Without a cgroup2 mount it falls back to the v1 freezer and
//    cpuacct hierarchies.
//
// In every mode a sandbox's v2 directory has this shape (the agent relies on it):
//   <sb>/           the agent (PID 1) lives here; CLONE_INTO_CGROUP target
//   <sb>/user/      every user process, in one child cgroup per exec or shell (created by the
//                   agent); killing user/ kills all user code but not the agent.
// Thread safety: a Cgroup is used by one sandbox; its methods may be called from any thread
// but not concurrently on the same object. The driver is thread-safe.
// Privileges: root on the host (writes cgroupfs).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

struct CgroupLimits {
  int64_t memory_bytes = 0;  // 0 = unlimited; swap is always off
  int64_t pids = 0;          // 0 = unlimited
  double cpu = 0;            // CFS quota in cores; 0 = unlimited
};

struct CgroupStats {
  uint64_t memory_current = 0;
  uint64_t memory_peak = 0;  // 0 if the kernel cannot tell
  uint64_t cpu_usage_us = 0;
  uint64_t pids_current = 0;
  uint64_t oom_kills = 0;
  uint64_t shmem = 0;  // tmpfs/shm pages: the sandbox's writable layer and /dev/shm
};

class Cgroup {
 public:
  virtual ~Cgroup() = default;
  // The sandbox's name (its directory name in every hierarchy).
  virtual const std::string& name() const = 0;
  virtual Status SetLimits(const CgroupLimits& limits) = 0;
  // The CPUs its processes may run on ("0-1,3", the kernel's list format; "": all of the
  // parent's), where a cpuset controller is there (a v1 cpuset hierarchy, or cpuset enabled on
  // v2); OK and nothing done otherwise (the caller's affinity is then the only view). Unlike an
  // affinity, a cpuset is a bound: root inside cannot widen it. Before the first process joins.
  virtual Status SetCpus(const std::string& list) = 0;
  // Whether SetCpus bounds anything on this host.
  virtual bool has_cpuset() const = 0;
  // Directory fd of the v2 cgroup for clone3(CLONE_INTO_CGROUP) and BPF attach; -1 without
  // cgroup2, after ReleaseCloneFd, and for a sandbox opened by OpenSandbox.
  virtual int CloneIntoFd() const = 0;
  // Closes that fd (the sandbox runs; nothing needs it any more).
  virtual void ReleaseCloneFd() = 0;
  // Moves pid into the sandbox: every v1 hierarchy, and the v2 dir unless `cloned_into_v2`.
  virtual Status AddProcess(pid_t pid, bool cloned_into_v2) = 0;
  // Opens the v2 "user/" directory for the agent (O_PATH|O_DIRECTORY); -1 fd without cgroup2.
  virtual StatusOr<UniqueFd> OpenUserDir() const = 0;
  // Hands user/ (and the files the agent writes) to the sandbox's root uid/gid, so an agent in
  // a user namespace can create per-exec cgroups under it (cgroup v2 delegation).
  virtual Status Delegate(uid_t uid, gid_t gid) = 0;
  // SIGKILLs every process (cgroup.kill, or freeze + kill each + thaw as the fallback).
  virtual Status KillAll() = 0;
  virtual Status Freeze() = 0;
  virtual Status Thaw() = 0;
  virtual StatusOr<bool> IsFrozen() = 0;
  virtual StatusOr<bool> IsPopulated() = 0;
  virtual StatusOr<CgroupStats> Stats() = 0;
  // OOM kills so far (one small read; used after a SIGKILLed exec).
  virtual StatusOr<uint64_t> OomKills() = 0;
  // Kills what is left, waits (up to ~2 s) for it to empty and removes every directory,
  // nested ones included. Safe to call twice.
  virtual Status Destroy() = 0;
};

// Which hierarchy carries the controllers: detected (v2 when its memory controller is there),
// cgroup v2, or v1 (hybrid: v1 controllers, the v2 mount for kill/freeze/BPF).
enum class CgroupMode { kAuto, kV1, kV2 };
std::string_view CgroupModeName(CgroupMode m);
// "auto", "v1", "v2"; anything else is InvalidArgument.
StatusOr<CgroupMode> ParseCgroupMode(std::string_view s);

struct CgroupDriverOptions {
  std::string instance_id;              // parent cgroup is "dsec-<instance_id>"
  CgroupMode mode = CgroupMode::kAuto;  // tests may point roots at fake trees
  std::string v2_root;                  // override the cgroup2 mount path
  std::string v1_root;                  // override the directory holding v1 hierarchies
  bool use_cgroup_kill = true;          // false forces the freeze+kill fallback
  // Bound each sandbox's CPUs with a cpuset cgroup where the host has the controller (Cgroup::
  // SetCpus); false: affinity only.
  bool use_cpuset = true;
  int64_t parent_memory_bytes = 0;  // limit for the parent (all sandboxes); 0 = none
  // Processes and threads of all sandboxes together (the parent's pids.max); 0 = none.
  int64_t parent_pids = 0;
  // v1 only: TCP buffer memory of all sandboxes together (memory.kmem.tcp.limit_in_bytes of the
  // parent); 0: the parent memory limit.
  int64_t parent_socket_bytes = 0;
  // Unit tests only: the roots are plain directories, so control files are created on write
  // (lets the v2 driver's writes be checked on hosts without a v2 controller hierarchy).
  bool plain_directory_tree = false;
};

class CgroupDriver {
 public:
  virtual ~CgroupDriver() = default;
  static StatusOr<std::unique_ptr<CgroupDriver>> Create(const CgroupDriverOptions& opts);

  virtual std::string Describe() const = 0;  // e.g. "v1-hybrid (memory,pids,cpu + cgroup2 at ..)"
  virtual bool is_v2() const = 0;
  // A cgroup2 hierarchy tracks the sandboxes (pure v2, or a v1 hybrid's cgroup2 mount): what
  // clone3 into a cgroup and cgroup BPF programs need.
  virtual bool has_cgroup2() const = 0;
  // Creates the sandbox's cgroups (and user/) and applies limits. Fails if it exists.
  virtual StatusOr<std::unique_ptr<Cgroup>> CreateSandbox(const std::string& name,
                                                          const CgroupLimits& limits) = 0;
  // Opens an existing sandbox's cgroups (re-adoption after an edge restart).
  virtual StatusOr<std::unique_ptr<Cgroup>> OpenSandbox(const std::string& name) = 0;
  // Names of sandbox cgroups under the parent, in any hierarchy (for orphan cleanup).
  virtual StatusOr<std::vector<std::string>> ListSandboxes() = 0;
  // Removes whatever is left of a sandbox's cgroup set that OpenSandbox cannot open: a crash
  // between the mkdirs of a create or the rmdirs of a destroy leaves some hierarchies with the
  // directory and some without (no process is in such a set). Missing directories are fine.
  virtual Status RemoveSandboxRemains(const std::string& name) = 0;
  virtual Status SetParentMemoryLimit(int64_t bytes) = 0;
  // Removes the parent cgroups if empty (called on clean shutdown). Safe to call twice.
  virtual Status RemoveParent() = 0;
};

}  // namespace dsec::isolation
