// The container backend: namespaces + cgroups + seccomp + overlay rootfs, PID 1 = dsec-agent.
// Owns what all its sandboxes share: detected kernel features, the cgroup driver (parent
// cgroup "dsec-<instance>"), the host image's mask layers, the compiled seccomp filters, the
// sealed agent memfd, user-namespace id ranges and the I/O threads agent connections run on.
// Everything it creates carries the instance id derived from the state dir.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/container/cpu_spread.h"
#include "backends/container/launcher.h"
#include "backends/sandbox.h"
#include "backends/session/agent_client.h"
#include "base/mutex.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "isolation/credentials.h"
#include "isolation/disk_image.h"
#include "isolation/features.h"
#include "isolation/host_image.h"
#include "isolation/netns.h"
#include "isolation/proc_views.h"
#include "isolation/socket_budget.h"
#include "isolation/uid_ranges.h"
#include "net/node_network.h"

namespace dsec::backends::container {

struct ContainerBackendOptions {
  std::string state_dir;    // required; sandboxes/<id> and images/ live here
  std::string agent_path;   // default: $DSEC_AGENT_PATH, else dsec-agent beside this binary
  std::string zygote_path;  // default: $DSEC_ZYGOTE_PATH, else dsec-zygote beside this binary
  isolation::FeatureSwitches features;
  isolation::CgroupMode cgroup_mode = isolation::CgroupMode::kAuto;
  int64_t parent_memory_bytes = 0;  // limit on all sandboxes together; 0 = none
  int64_t parent_pids = 0;          // processes of all sandboxes together; 0 = none
  int64_t parent_socket_bytes = 0;  // v1: TCP buffers of all sandboxes together; 0 = memory
  uint32_t userns_base = 1u << 28;  // first host uid/gid of sandbox ranges
  uint32_t userns_slots = 8192;     // ranges of 65536 ids
  // Host-wide lease file shared by every edge on the host (isolation/uid_ranges.h).
  std::string uid_lock_file = "/run/dsec/uid-ranges.lock";
  isolation::Rlimits rlimits;
  uint32_t max_execs_per_sandbox = 64;
  uint64_t inodes_per_mb = 256;  // writable layer inode limit = disk_mb * this (>= 4096)
  // Writable layers of up to this many MB are a tmpfs (its pages count as the sandbox's
  // memory: memory limit = memory_mb + disk_mb); bigger ones are ext4 disk images made in
  // disk_dir (default <state_dir>/disks), not charged to memory (see isolation/disk_image.h).
  // 0: every writable layer is a disk image, and memory_mb is what the processes may use.
  int64_t tmpfs_disk_max_mb = 0;
  std::string disk_dir;
  bool disk_preallocate = true;  // disk images take all their space up front (DiskImageSpec)
  // Disk images kept ready per recently used size (isolation::DiskImagePool); 0: made at create.
  size_t disk_pool = 0;
  // Sandboxes see their own memory in /proc/meminfo (and uptime) through lxcfs, run by this
  // backend in <state_dir>/lxcfs when installed (isolation/proc_views.h).
  bool proc_views = false;
  std::vector<std::string> hidden_paths;  // the edge's token, config, socket, logs
  // Pseudo-terminals one sandbox's devpts may hand out (the node's kernel.pty.max is sized for
  // max_sandboxes of these by the edge).
  uint32_t pty_max = 256;
  // Inet sockets a sandbox may hold: this many per MiB of its memory limit, at least 256
  // (isolation/socket_budget.h); 0 turns the budget off.
  uint32_t sockets_per_mb = 4;
  // Sockets the budget tracks node-wide at most (creates past it are refused). Its BPF hash
  // table's buckets are allocated at start (the power of two at or above it, 16 bytes each: 32
  // MiB of kernel memory and ~50 ms at the default); `dsec run` (one sandbox) takes far fewer.
  uint32_t socket_table_entries = 1u << 21;
  bool allow_ptrace = true;
  int setup_timeout_ms = 10000;
  // Loopback-only network namespaces kept for reuse (0: a fresh one per sandbox).
  size_t netns_pool = 256;
  // How long an agent outlives its owner (this process) waiting to be re-adopted: -1 forever
  // (an edge restarting on the same state dir), 0 not at all (dsec run).
  int64_t orphan_timeout_ms = -1;
  int io_threads = 1;
  // Layered images beyond the built-in "host" (not owned; null: only "host").
  images::ImageStore* image_store = nullptr;
  // The node's sandbox network for modes other than none, started on first use (null or an
  // error: such sandboxes cannot be made, with that error).
  std::function<StatusOr<net::NodeNetwork*>()> network;
  // Every sandbox's /etc/resolv.conf names this (the node network's DNS forwarder; a sandbox
  // without a network cannot reach it); empty: the image's file stays.
  std::string nameserver;
};

class ContainerInstance;

class ContainerBackend : public Backend {
 public:
  static StatusOr<std::unique_ptr<ContainerBackend>> Create(ContainerBackendOptions opts);
  ~ContainerBackend() override;

  Kind kind() const override { return Kind::kContainer; }
  KindCapabilities Capabilities() const override { return {}; }  // all of them
  Resources Largest() const override;
  StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                           const std::string& handle) override;

  // Destroys sandboxes of this instance whose owner is gone (their owner.lock is free), e.g.
  // after `dsec run` was killed. Returns how many were cleaned up.
  StatusOr<int> CleanupOrphans() override;
  // Removes the parent cgroups if no sandbox uses them any more.
  Status Shutdown();

  const std::string& instance_id() const { return instance_id_; }
  const isolation::KernelFeatures& features() const { return features_; }
  // Whether sandboxes get a socket budget; if not, why ("" when on).
  bool socket_budget() const { return socket_budget_ != nullptr; }
  const std::string& socket_budget_error() const { return socket_budget_error_; }
  std::string Describe() const;
  // Whether sandboxes get /proc views now; if not, why ("" when they do).
  std::string ProcViewsState() const;
  // Disk images of destroyed sandboxes not unmounted yet (that happens off the destroy's path).
  size_t DiskReleasesPending() const { return disk_pool_ ? disk_pool_->Releasing() : 0; }

 private:
  friend class ContainerInstance;
  explicit ContainerBackend(ContainerBackendOptions opts) : opts_(std::move(opts)) {}
  Status Init();
  Status PrepareStateDirs();   // state, sandboxes, root mount and disk directories
  void PrepareSocketBudget();  // the cgroup BPF socket budget, or why there is none
  // The host image as of now: rebuilt if the host's root directory changed since.
  StatusOr<isolation::HostImage> CurrentHostImage();

  ContainerBackendOptions opts_;
  std::string instance_id_;
  std::string sandboxes_dir_;
  std::string root_mount_dir_;                           // see Init()
  std::string disk_dir_;                                 // where disk images are made
  std::unique_ptr<isolation::DiskImagePool> disk_pool_;  // made with disk_dir_
  std::unique_ptr<CpuSpread> cpu_spread_;
  std::unique_ptr<isolation::ProcViews> proc_views_;  // null: off or lxcfs missing
  std::string proc_views_error_;                      // why proc_views_ is null
  // Agents of sandboxes that may have views: dropped in each if lxcfs dies (DropProcViews).
  Mutex view_agents_mu_;
  std::set<pid_t> view_agents_ DSEC_GUARDED_BY(view_agents_mu_);
  void DropProcViews();
  void AddViewAgent(pid_t pid);
  void RemoveViewAgent(pid_t pid);
  isolation::KernelFeatures features_;
  std::unique_ptr<isolation::CgroupDriver> cgroups_;
  Mutex host_image_mu_;
  isolation::HostImageOptions host_image_opts_;
  isolation::HostImage host_image_ DSEC_GUARDED_BY(host_image_mu_);
  std::vector<std::string> seccomp_;
  std::vector<std::string> zygote_seccomp_;  // fncall workers (SeccompOptions::zygote)
  UniqueFd agent_memfd_;
  UniqueFd zygote_memfd_;  // invalid when dsec-zygote was not found
  std::unique_ptr<IoRunner> io_;
  std::unique_ptr<Launcher> launcher_;
  std::unique_ptr<isolation::NetnsPool> netns_;  // null when pooling is off
  std::unique_ptr<isolation::UidRangeAllocator> uid_ranges_;
  // Null when off or when the kernel cannot (then socket_budget_error_ says why).
  std::unique_ptr<isolation::SocketBudget> socket_budget_;
  std::string socket_budget_error_;
};

}  // namespace dsec::backends::container
