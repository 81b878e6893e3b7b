// One container sandbox: its cgroup, its agent process and connection, its directory under
// the state dir (agent.sock for reconnects, owner.lock, the tmpfs attach point) and its user
// namespace id range. Destroy() releases all of it and is idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backends/container/agent_client.h"
#include "backends/container/launcher.h"
#include "backends/sandbox.h"
#include "base/pidfd.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "isolation/netns.h"
#include "protocol/agent_ops.h"

namespace dsec::backends::container {

class ContainerBackend;

// Attributes SIGKILLed execs to the OOM killer when the cgroup's OOM count went up.
struct OomTracker {
  std::shared_ptr<isolation::Cgroup> cgroup;
  std::atomic<uint64_t> seen{0};
  bool CheckNewKill();
};

class ContainerSandbox : public Sandbox, public std::enable_shared_from_this<ContainerSandbox> {
 public:
  ContainerSandbox(ContainerBackend* backend, SandboxSpec spec);
  ~ContainerSandbox() override;

  // Builds everything and waits for the agent to be ready.
  Status Start();
  // Reconnects to the agent of a sandbox a previous edge made (see Backend::Adopt).
  Status Adopt(const std::string& handle);

  const SandboxSpec& spec() const override { return spec_; }
  SandboxState state() const override { return state_.load(); }
  std::string reason() const override;

  StatusOr<std::shared_ptr<ExecHandle>> StartExec(const ExecRequest& req,
                                                  std::shared_ptr<ExecObserver> observer) override;
  StatusOr<std::string> OpenShell(const std::string& user) override;
  StatusOr<std::shared_ptr<ExecHandle>> RunInShell(const std::string& shell_id,
                                                   const std::string& command, int64_t timeout_ms,
                                                   uint64_t max_output_bytes,
                                                   std::shared_ptr<ExecObserver> observer) override;
  Status CloseShell(const std::string& shell_id) override;
  StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) override;
  Status WriteFile(const std::string& path, const UploadBody& data, uint32_t mode) override;
  StatusOr<std::vector<FileEntry>> ListDir(const std::string& path) override;
  StatusOr<FileEntry> Stat(const std::string& path) override;
  Status MakeDir(const std::string& path, uint32_t mode) override;
  Status Remove(const std::string& path, bool recursive) override;
  Status ExtractTar(const std::string& dir, const UploadBody& tar) override;
  StatusOr<std::string> CreateTar(const std::string& dir, uint64_t max_bytes) override;
  StatusOr<int> SignalAll(int sig) override;
  Status Pause() override;
  Status Resume() override;
  StatusOr<SandboxStats> Stats() override;
  Status SetMemoryLimit(int64_t bytes) override;
  Status Destroy() override;
  std::vector<std::string> ListShells() override;
  StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid = false) override;
  // SIGKILL to every user process, then waits until only the agent is left (grader execs).
  Status KillEveryUserProcess();
  // True if pid is a process in this sandbox's cgroups (checked from /proc/<pid>/cgroup).
  bool InOwnCgroup(pid_t pid) const;
  std::string AdoptionHandle() const override;
  void Detach() override;

  pid_t agent_pid() const { return agent_pid_; }
  // What a reconnecting edge needs: the agent's socket and the secret it authenticates with.
  std::string agent_socket() const { return dir_ + "/agent.sock"; }
  const std::string& secret() const { return secret_; }
  const std::string& dir() const { return dir_; }

 private:
  Status StartLocked();
  Status Handshake(int conn, int userns_fd);
  Status AdoptLocked(const std::string& handle);
  void StartClient(UniqueFd conn);
  // Ready for agent calls: running (a paused sandbox is resumed first).
  StatusOr<std::shared_ptr<AgentClient>> Ready();
  // The ids a file operation runs as: `user`, or the sandbox's default user when empty.
  StatusOr<protocol::RunAs> RunAsUser(const std::string& user) const;
  StatusOr<protocol::ExecSpec> BuildExecSpec(const ExecRequest& req);
  std::vector<std::string> BaseEnv(const UserIds& u, bool tty) const;
  void MarkFailed(const std::string& why);

  ContainerBackend* backend_;
  SandboxSpec spec_;
  std::string dir_;
  std::atomic<SandboxState> state_{SandboxState::kCreating};
  mutable std::mutex mu_;
  std::string reason_;                         // GUARDED_BY(mu_)
  std::shared_ptr<isolation::Cgroup> cgroup_;  // set in Start, never reset
  std::shared_ptr<struct OomTracker> oom_;
  std::unique_ptr<PendingAgent> agent_;  // GUARDED_BY(mu_); launched by us
  bool adopted_ = false;                 // GUARDED_BY(mu_); found by Adopt (agent_pid_)
  std::set<std::string> shells_;         // GUARDED_BY(mu_)
  std::shared_ptr<AgentClient> client_;  // GUARDED_BY(mu_)
  UniqueFd lock_fd_;
  isolation::Netns netns_;  // pooled namespace, returned on destroy
  pid_t agent_pid_ = -1;
  int64_t uid_slot_ = -1;
  // The host uid range's lease while we hold it: until the agent has its own copy after
  // setup, or for the sandbox's life if it came from an edge before leases.
  UniqueFd uid_lease_;
  bool tmp_created_ = false;
  std::string secret_;
  std::atomic<uint64_t> exec_count_{0};
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
  // Bytes used in the writable layer's filesystem (statfs of the agent's fd of it).
  StatusOr<uint64_t> DiskImageUsed();
};

}  // namespace dsec::backends::container
