// The microVM kind's Instance (backends/instance.h): one sandbox's QEMU process (run as its
// own leased host uid, in its own cgroup, with QEMU's seccomp sandbox on), its directory under
// the state dir (agent.sock and qmp.sock, the host ends only the edge can reach; owner.lock;
// qemu.log, what QEMU itself printed), the image layers it boots from, and the QMP connection
// that pauses and resumes it. Destroy() releases all of it and is idempotent.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backends/instance.h"
#include "backends/microvm/qemu_cmd.h"
#include "backends/microvm/qmp.h"
#include "backends/rootfs_plan.h"
#include "backends/sandbox.h"
#include "backends/session/bootstrap.h"
#include "base/pidfd.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "net/sandbox_net.h"
#include "protocol/agent_ops.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::backends::microvm {

class MicrovmBackend;
struct Template;

// A running VM's whole state (MicrovmInstance::SaveMachine): the migration stream of its RAM,
// processes and devices, in a sealed memfd; each fork restores it into RAM of its own.
struct VmState : MachineState {
  UniqueFd stream;
  uint64_t bytes = 0;
  std::string secret;                      // its agent's: a fork's first auth
  std::vector<std::string> layer_digests;  // a fork boots the same layers
  int cpus = 1;
  int64_t ram_mb = 0;
  bool ram_object = false;  // its RAM was a memory backend ("mem"): a fork's must be too
};

class MicrovmInstance : public Instance {
 public:
  MicrovmInstance(MicrovmBackend* backend, SandboxSpec spec);

  Kind kind() const override { return Kind::kMicrovm; }
  const SandboxSpec& spec() const override { return spec_; }
  StatusOr<AgentLink> Start() override;
  StatusOr<AgentLink> Adopt(const std::string& handle) override;
  std::string AdoptionHandle() const override;
  OomCounter OomKills() override;
  Status Pause() override;
  Status Resume() override;
  StatusOr<SandboxStats> Stats() override;
  Status SetMemoryLimit(int64_t bytes) override;
  // The guest's writable layer, captured by its agent (capture_layer) into a new layer of the
  // image store, on top of the VM's own layers. A paused VM is refused (its agent cannot run).
  StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid, bool running,
                                                  const CaptureProgress& progress,
                                                  AgentSession* session) override;
  // Its RAM, processes and devices, saved (stopped for the time it takes); a fork with them
  // restores it. A VM with a NIC is refused: its guest would keep its source's address.
  StatusOr<std::shared_ptr<const MachineState>> SaveMachine(bool running) override;
  // Its NIC's tap on the node (when created with a network; a live change to none refuses
  // everything and keeps the NIC).
  net::SandboxNet* Network() override { return &net_; }
  Status Destroy() override;
  void Detach() override;

  // Boots a template VM of `layers` (borrowed fds, bottom first) and saves it (see
  // microvm_backend.h).
  // With `nic`, the template has a NIC that goes nowhere (see microvm_backend.h).
  // The template's writable layer starts with the dirs and files of a sandbox's plan of
  // `stack` (see GuestSetup::prepare).
  static StatusOr<std::unique_ptr<Template>> MakeTemplate(
      MicrovmBackend* backend, const std::string& key, const images::Stack& stack,
      const std::vector<int>& layers, int cpus, int64_t ram_mb, int64_t disk_mb, bool nic);

  // Boots a guest under `accel` that can only report its init's failure (it has no layers):
  // OK if its agent says anything within timeout_ms (so guests run under that accelerator).
  static Status BootProbe(MicrovmBackend* backend, Accel accel, int timeout_ms);

  bool from_template() const { return template_ != nullptr; }
  pid_t qemu_pid() const { return qemu_.pid(); }
  uid_t qemu_uid() const { return qemu_uid_; }
  const std::string& dir() const { return dir_; }
  // The last bytes the guest wrote to its console (boot diagnostics; "" when unreadable).
  std::string ConsoleTail(size_t bytes = 2048);

 private:
  // The sandbox's directory, with its owner lock held.
  Status ClaimDirectory();
  // The image stack, its environment under the spec's, and read-only fds of its layers.
  Status AcquireImage(std::vector<UniqueFd>* layers);
  // Listening unix sockets at dir/<name> for QEMU to accept on.
  StatusOr<UniqueFd> Listen(const std::string& name);
  // `tap`: the NIC's (nic_ == kTap).
  Status SpawnQemu(std::vector<UniqueFd> layers, UniqueFd tap = {});
  // The host uid QEMU runs as and its cgroup (guest RAM + QEMU's overhead).
  Status LeaseAndCgroup();
  // A booted template VM: waits for its agent's greeting, stops it, saves its device state
  // into out->state, kills it and seals out's memfds.
  Status SaveAsTemplate(Template* out, const protocol::GuestSetup& prepare);
  // A clone or a fork: loads a saved state (the template's devices, or a VmState's stream)
  // into the waiting QEMU and continues it.
  Status Restore(int state_fd);
  // A fork, restored: authenticates as its source's edge and makes the guest a machine of its
  // own (protocol::GuestIdentity: name, machine-id, clock, entropy, secret).
  StatusOr<protocol::Hello> TakeIdentity(UniqueFd* conn);
  // Connects to the agent's port (queued until QEMU accepts).
  StatusOr<UniqueFd> ConnectAgent();
  // Adopt: authenticates on a fresh connection to the running agent and returns its hello.
  StatusOr<protocol::Hello> Reconnect(UniqueFd* conn);
  // Adopt: the QEMU named in the handle, if it is this VM's (in its cgroup).
  Status FindQemu(pid_t pid);
  int Cpus() const;
  // The guest agent's carrier for the bootstrap: QEMU, whose exit, log and console explain a
  // silent or vanished guest.
  AgentCarrier Carrier();
  Status Handshake(UniqueFd* conn);
  protocol::GuestSetup BuildGuestSetup();
  // What a guest's plan (rootfs_plan.h) is made of: the image's users, the node's resolver
  // with a NIC.
  static RootfsInputs PlanInputs(const MicrovmBackend& b, const images::Stack& stack, bool nic,
                                 const std::string& what);
  // The dirs and files of a guest's plan into `s`.
  static void PlanFiles(RootfsInputs in, const std::string& hostname, const std::string& workdir,
                        uid_t uid, gid_t gid, protocol::GuestSetup* s);
  // A template's plan (GuestSetup::prepare): a sandbox's with the defaults (hostname
  // "localhost", the default workdir and user), whose paths every clone's plan has too.
  static protocol::GuestSetup TemplatePlan(const RootfsInputs& in);
  // /etc/machine-id (32 hex digits): each VM's own (a template's is a placeholder).
  static isolation::FileSpec MachineId(const std::string& hex);
  // The dirs and files of a plan, as text to compare (Template::prepared).
  static std::string PreparedText(const protocol::GuestSetup& s);
  int64_t GuestRamMb() const { return spec_.resources.memory_mb + spec_.resources.disk_mb; }

  MicrovmBackend* backend_;
  SandboxSpec spec_;
  std::string dir_;
  bool dir_owned_ = false;
  UniqueFd lock_fd_;
  std::shared_ptr<isolation::Cgroup> cgroup_;
  PidFd qemu_;
  int64_t uid_slot_ = -1;
  uid_t qemu_uid_ = 0;
  UniqueFd uid_lease_;
  std::optional<QmpClient> qmp_;
  images::Stack stack_;
  bool holds_image_ = false;
  bool destroyed_ = false;
  std::string secret_;  // the agent's, for a later edge's reconnect
  enum class Mode { kBoot, kTemplate, kClone, kFork };
  Mode mode_ = Mode::kBoot;
  std::shared_ptr<const Template> template_;  // kClone
  std::shared_ptr<const VmState> fork_;       // kFork
  bool ram_object_ = false;                   // its RAM is a memory backend ("mem")
  UniqueFd ram_fd_;                           // kTemplate: the RAM memfd being made
  Accel accel_ = Accel::kAuto;                // BootProbe's; kAuto: the backend's
  Nic nic_ = Nic::kNone;
  net::SandboxNet net_;
  struct {
    int64_t hello = 0;  // MonotonicUs when the guest's hello came (Start's timing line)
  } marks_;
};

}  // namespace dsec::backends::microvm
