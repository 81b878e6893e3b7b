// The microVM backend (kind "microvm"): one QEMU `microvm` machine per sandbox, its guest's
// init and agent being dsec-agent (agent/guest.h) on a virtio-serial port, its root the image's
// layers as read-only EROFS block devices under a writable tmpfs in guest RAM. Owns what all
// its VMs share: the guest kernel and the initramfs made from it, the accelerator, the cgroup
// driver (parent "dsec-<instance>-vm"), the host uids QEMU processes run as (a lease per VM
// from the host-wide allocator, so no two VMs or edges share one) and the I/O threads agent
// sessions run on.
//
// Not yet: templates (every create is a cold boot, ~2 s on this host's TCG), adoption after
// an edge restart (a restarted edge destroys the VMs it finds), snapshots and networking.
#pragma once

#include <memory>
#include <string>

#include "backends/microvm/boot_files.h"
#include "backends/sandbox.h"
#include "backends/session/agent_client.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "isolation/credentials.h"
#include "isolation/uid_ranges.h"

namespace dsec::backends::microvm {

struct MicrovmBackendOptions {
  std::string state_dir;   // required; microvms/<id> and boot/ live here
  std::string agent_path;  // the static dsec-agent; default: as the container backend finds it
  std::string kernel_dir = "/var/cache/dsec/guest-kernel/current";
  std::string qemu = "qemu-system-x86_64";
  std::string accel = "auto";  // auto | kvm | tcg
  std::string cgroup_mode = "auto";
  int64_t parent_memory_bytes = 0;  // all VMs together (QEMU processes); 0 = none
  // Charged to a VM's cgroup beyond its guest RAM: QEMU's own heap, TCG's translation buffer,
  // device state.
  int64_t qemu_overhead_mb = 96;
  int64_t qemu_pids = 64;  // threads of one QEMU
  // QEMU processes run as the first id of a leased range of the host-wide allocator.
  uint32_t uid_base = 1u << 28;
  uint32_t uid_slots = 8192;
  std::string uid_lock_file = "/run/dsec/uid-ranges.lock";
  isolation::Rlimits rlimits;
  uint32_t max_execs_per_sandbox = 64;
  int boot_timeout_ms = 60000;  // cold boot to a ready agent (TCG on a busy host is slow)
  int64_t orphan_timeout_ms = -1;
  int io_threads = 1;
  images::ImageStore* image_store = nullptr;  // not owned; required (VMs boot image layers)
};

class MicrovmInstance;

class MicrovmBackend : public Backend {
 public:
  static StatusOr<std::unique_ptr<MicrovmBackend>> Create(MicrovmBackendOptions opts);
  ~MicrovmBackend() override;

  Kind kind() const override { return Kind::kMicrovm; }
  Resources Largest() const override;
  StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                           const std::string& handle) override;
  StatusOr<int> CleanupOrphans() override;
  Status Shutdown();

  const std::string& instance_id() const { return instance_id_; }
  const std::string& accel() const { return accel_; }
  const GuestKernel& kernel() const { return kernel_; }
  std::string Describe() const;

 private:
  friend class MicrovmInstance;
  explicit MicrovmBackend(MicrovmBackendOptions opts) : opts_(std::move(opts)) {}
  Status Init();
  // Destroys what is left of one VM: its QEMU (by cgroup), cgroup and directory.
  void RemoveRemains(const std::string& name);

  MicrovmBackendOptions opts_;
  std::string instance_id_;
  std::string vms_dir_;
  GuestKernel kernel_;
  std::string initramfs_;
  std::string accel_;
  int64_t tsc_khz_ = 0;
  UniqueFd kernel_fd_, initramfs_fd_;  // passed to every QEMU
  std::unique_ptr<isolation::CgroupDriver> cgroups_;
  std::unique_ptr<isolation::UidRangeAllocator> uids_;
  std::unique_ptr<IoRunner> io_;
};

}  // namespace dsec::backends::microvm
