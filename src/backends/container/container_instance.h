// The container kind's Instance (backends/instance.h): one sandbox's cgroup, its agent process
// (PID 1 of fresh namespaces, launched by launcher.h), its directory under the state dir
// (agent.sock for reconnects, owner.lock), its user namespace id range, its root filesystem
// (overlays of the host image's and image layers' mounts, handed to the agent by fd) and its
// writable layer (a tmpfs, or an ext4 disk image). Destroy() releases all of it and is
// idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backends/container/launcher.h"
#include "backends/instance.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "isolation/netns.h"
#include "isolation/rootfs.h"
#include "net/sandbox_net.h"
#include "protocol/messages.h"

namespace dsec::backends::container {

class ContainerBackend;

class ContainerInstance : public Instance {
 public:
  ContainerInstance(ContainerBackend* backend, SandboxSpec spec);

  Kind kind() const override { return Kind::kContainer; }
  const SandboxSpec& spec() const override { return spec_; }
  StatusOr<AgentLink> Start() override;
  StatusOr<AgentLink> Adopt(const std::string& handle) override;
  std::string AdoptionHandle() const override;
  OomCounter OomKills() override;
  Status Pause() override;
  Status Resume() override;
  StatusOr<SandboxStats> Stats() override;
  Status SetMemoryLimit(int64_t bytes) override;
  StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid, bool running,
                                                  const CaptureProgress& progress,
                                                  AgentSession* session) override;
  Status Destroy() override;
  net::SandboxNet* Network() override { return &net_; }
  void Detach() override;

  // True if pid is a process in this sandbox's cgroups (checked from /proc/<pid>/cgroup).
  bool InOwnCgroup(pid_t pid) const;
  pid_t agent_pid() const { return agent_pid_; }
  // What a reconnecting edge needs: the agent's socket and the secret it authenticates with.
  std::string agent_socket() const { return dir_ + "/agent.sock"; }
  const std::string& secret() const { return secret_; }
  const std::string& dir() const { return dir_; }

 private:
  // The sandbox's directory under its final name, with its owner lock held.
  Status ClaimDirectory();
  // The image stack (unless on the host image) and the image's environment under the spec's.
  Status AcquireImage();
  // Setup over the agent's first connection: hello, the root, the zygote, ready.
  Status Handshake(int conn, int userns_fd);
  // agent.sock in the sandbox's directory, for a restarted edge to reconnect to.
  StatusOr<UniqueFd> BindAgentSocket();
  StatusOr<UniqueFd> ConnectToAgent(pid_t* agent_pid);  // Adopt: the running agent, verified
  // Plans the root (rootfs_plan.h) and mounts its lowers into *layers.
  Status PrepareRoot(int userns_fd, isolation::RootfsSpec* r, std::vector<UniqueFd>* layers);
  // An fncall worker's resident zygote (backends/fncall/zygote.h).
  Status AddZygote(int userns_fd, protocol::SetupSpec* setup);
  // Bytes used in the writable layer's filesystem (statfs of the agent's fd of it).
  StatusOr<uint64_t> DiskImageUsed();

  ContainerBackend* backend_;
  SandboxSpec spec_;
  std::string dir_;
  std::shared_ptr<isolation::Cgroup> cgroup_;  // set in Start, reset only by Detach
  std::unique_ptr<PendingAgent> agent_;        // launched by us
  bool adopted_ = false;                       // found by Adopt (agent_pid_)
  UniqueFd lock_fd_;
  isolation::Netns netns_;  // pooled namespace, returned on destroy (unless it got a network)
  // Its network namespace: the pooled one it was given, or its agent's (a new descriptor).
  StatusOr<UniqueFd> OpenNetns() const;
  net::SandboxNet net_;  // its network on the node's, over that namespace
  pid_t agent_pid_ = -1;
  int64_t uid_slot_ = -1;
  // The host uid range's lease while we hold it: until the agent has its own copy after
  // setup, or for the sandbox's life if it came from an edge before leases.
  UniqueFd uid_lease_;
  bool tmp_created_ = false;
  std::string secret_;
  bool destroyed_ = false;
  // Images: the layers stacked on (or instead of) the host image, whether the store counts this
  // sandbox as their holder, and what a snapshot reads: the agent's fd number of the writable
  // layer, the overlays' targets (upper dir i belongs to target i) and the id range's base.
  images::Stack stack_;
  bool holds_image_ = false;
  int layer_fd_ = -1;
  std::vector<std::string> overlay_targets_;
  uint32_t id_base_ = 0;
  // The writable layer is an ext4 disk image (disk_mb above the backend's tmpfs_disk_max_mb)
  // rather than a tmpfs charged to memory.
  bool disk_image_ = false;
  // The disk image's mount while this sandbox uses it (not after an adoption): given back to
  // the backend's disk pool at Destroy, which unmounts it off the delete's path.
  UniqueFd disk_mount_;
  // The CPUs it runs on (the backend's CpuSpread); empty: all of them.
  std::vector<int> cpus_;
  bool view_agent_ = false;  // registered with the backend's DropProcViews
};

}  // namespace dsec::backends::container
