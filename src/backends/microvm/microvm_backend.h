// The microVM backend (kind "microvm"): one QEMU `microvm` machine per sandbox, its guest's
// init and agent being dsec-agent (agent/guest.h) on a virtio-serial port, its root the image's
// layers as read-only EROFS block devices under a writable tmpfs in guest RAM. Owns what all
// its VMs share: the guest kernel and the initramfs made from it, the accelerator, the cgroup
// driver (parent "dsec-<instance>-vm"), the host uids QEMU processes run as (a lease per VM
// from the host-wide allocator, so no two VMs or edges share one) and the I/O threads agent
// sessions run on.
//
// Templates: the first create of an (image layers, guest RAM, vCPUs) set boots a template VM
// whose RAM is a memfd shared with it; once its agent said hello it is stopped, its device
// state saved (x-ignore-shared: the RAM stays in the memfd) and it is killed. Both memfds are
// then sealed (F_SEAL_WRITE and friends), so no later QEMU can change what clones start from.
// Every create of that set restores a clone: QEMU maps the RAM privately (copy-on-write),
// loads the state (-incoming defer, migrate-incoming over an fd passed with getfd: QEMU's
// sandbox forbids exec:), continues, and gets its identity (hostname, clock, entropy, secret)
// from the agent's setup. A template that cannot be made leaves that set on cold boots.
//
// Templates are also kept on disk (template_files.h, <state_dir>/microvm-templates): a
// restarted edge loads a set's template instead of booting it again.
//
// A restarted edge re-adopts running VMs (MicrovmInstance::Adopt: QMP, and an authenticated
// reconnect to the agent's port).
//
// Network: a VM created with a network policy gets a NIC (virtio-net) behind a tap on the node
// (net::SandboxNet::AttachTap), routed and filtered like a container's veth; its guest gives
// eth0 the sandbox's address at setup. Its template set includes the NIC (the template's goes
// nowhere), so clones restore with the device and their own tap. A VM created without a
// network has no NIC and cannot get one later. Snapshots (and so fork) capture the guest's
// writable layer through its agent (capture_layer) into a new layer of the image store.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "backends/microvm/boot_files.h"
#include "backends/microvm/qemu_cmd.h"
#include "backends/microvm/template_files.h"
#include "backends/sandbox.h"
#include "backends/session/agent_client.h"
#include "base/mutex.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "isolation/credentials.h"
#include "isolation/uid_ranges.h"
#include "net/node_network.h"

namespace dsec::backends::microvm {

struct MicrovmBackendOptions {
  std::string state_dir;   // required; microvms/<id> and boot/ live here
  std::string agent_path;  // the static dsec-agent; default: as the container backend finds it
  std::string kernel_dir = "/var/cache/dsec/guest-kernel/current";
  std::string qemu = "qemu-system-x86_64";
  Accel accel = Accel::kAuto;
  // auto: KVM if this device opens and a probe guest boots under it (in the background, with
  // a hard timeout; the first create waits for it), else TCG. Tests point it elsewhere.
  std::string kvm_device = "/dev/kvm";
  int kvm_probe_timeout_ms = 15000;
  isolation::CgroupMode cgroup_mode = isolation::CgroupMode::kAuto;
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
  bool templates = true;        // restore creates from templates (else every create boots)
  size_t max_templates = 8;     // the least recently used goes beyond this
  int64_t orphan_timeout_ms = -1;
  int io_threads = 1;
  images::ImageStore* image_store = nullptr;  // not owned; required (VMs boot image layers)
  // The node's sandbox network, started on first use (unset: VMs get no network: a create
  // that asks for one is refused).
  std::function<StatusOr<net::NodeNetwork*>()> network;
  std::string nameserver;  // a networked guest's /etc/resolv.conf names it
};

class MicrovmInstance;

// A saved VM that clones restore (see above). Immutable once made.
struct Template {
  std::string key;  // layer digests, RAM and vCPUs
  std::string id;   // its name while it was booted ("tmpl-...")
  UniqueFd ram;     // memfd of the guest's RAM, sealed
  UniqueFd state;   // memfd of the migration stream (device state), sealed
  int64_t ram_mb = 0;
  uint64_t state_bytes = 0;
  int64_t build_ms = 0;
  // The dirs and files its writable layer was given (MicrovmInstance::PreparedText), "" none:
  // a clone's setup leaves out what is already there as its own plan wants it.
  std::string prepared;
};

class MicrovmBackend : public Backend {
 public:
  static StatusOr<std::unique_ptr<MicrovmBackend>> Create(MicrovmBackendOptions opts);
  ~MicrovmBackend() override;

  Kind kind() const override { return Kind::kMicrovm; }
  // Layered images only; a network (a NIC at create), the port proxy (relayed by the agent)
  // and snapshots (captured by the agent), but no fncall workers.
  KindCapabilities Capabilities() const override {
    return {.host_image = false,
            .network = true,
            .port_proxy = true,
            .snapshot = true,
            .fork_memory = true,
            .fncall_workers = false};
  }
  Resources Largest() const override;
  StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                           const std::string& handle) override;
  StatusOr<int> CleanupOrphans() override;
  Status Shutdown();

  const std::string& instance_id() const { return instance_id_; }
  // Templates made so far (tests and GET /v1/node), and how many of them were loaded from the
  // files of an earlier run.
  size_t template_count() const;
  int64_t templates_loaded() const { return templates_loaded_.load(); }
  // kKvm or kTcg: waits for the probe of `auto`.
  Accel accel() const;
  // Its name without waiting: "probing" while the probe runs. And why not KVM ("" for kvm).
  std::string AccelNow() const;
  std::string accel_reason() const;
  const GuestKernel& kernel() const { return kernel_; }
  std::string Describe() const;

 private:
  friend class MicrovmInstance;
  explicit MicrovmBackend(MicrovmBackendOptions opts) : opts_(std::move(opts)) {}
  Status Init();
  // Destroys what is left of one VM: its QEMU (by cgroup), cgroup and directory.
  void RemoveRemains(const std::string& name);
  // The template of `key`, made now (booting a VM of `layers`) when there is none; errors
  // are remembered, so a set that cannot be templated stays on cold boots. `disk_mb`: the
  // writable layer's size of the create that asks (of `ram_mb`): a template made now has it,
  // so clones of that size need not resize theirs.
  StatusOr<std::shared_ptr<const Template>> TemplateFor(const std::string& key,
                                                        const images::Stack& stack,
                                                        const std::vector<int>& layers, int cpus,
                                                        int64_t ram_mb, int64_t disk_mb, bool nic);

  MicrovmBackendOptions opts_;
  std::string instance_id_;
  std::string vms_dir_;
  GuestKernel kernel_;
  std::string initramfs_;
  // accel_ for opts_.accel; auto with an openable kvm_device starts the probe thread.
  Status ChooseAccel();
  mutable Mutex accel_mu_;
  mutable CondVar accel_cv_;
  Accel accel_ DSEC_GUARDED_BY(accel_mu_) = Accel::kAuto;  // kAuto while probing
  std::string accel_reason_ DSEC_GUARDED_BY(accel_mu_);
  std::thread probe_;
  int64_t tsc_khz_ = 0;
  UniqueFd kernel_fd_, initramfs_fd_;  // passed to every QEMU
  std::unique_ptr<isolation::CgroupDriver> cgroups_;
  std::unique_ptr<isolation::UidRangeAllocator> uids_;
  std::unique_ptr<IoRunner> io_;
  struct TemplateSlot {
    Mutex build;  // held while it is made: creates of the same set wait for it
    std::shared_ptr<const Template> made;
    std::string error;
    int64_t used_ms = 0;
  };
  mutable Mutex templates_mu_;
  std::map<std::string, std::shared_ptr<TemplateSlot>> templates_ DSEC_GUARDED_BY(templates_mu_);
  // On disk: set up at the first template (the accelerator is known then).
  Mutex files_mu_;
  std::unique_ptr<TemplateFiles> files_ DSEC_GUARDED_BY(files_mu_);
  std::string files_error_ DSEC_GUARDED_BY(files_mu_);
  std::atomic<int64_t> templates_loaded_{0};
  // The template files, ready; null when they cannot be used (logged once).
  TemplateFiles* Files();
};

}  // namespace dsec::backends::microvm
