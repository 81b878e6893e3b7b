// A sandbox of any kind, and the Backend that makes them. The shape, for whoever adds an
// execution form:
//
//   Backend (one per kind)  --makes-->  Instance (instance.h): what the kind builds, pauses,
//                                       measures, snapshots and tears down; hands over a
//                                       connected stream to the sandbox's dsec-agent
//   Sandbox (this file)     --over-->   Instance + AgentSession (session/agent_session.h):
//                                       the state machine, users and exec specs, grader
//                                       isolation, shells, files, archives, signals
//
// A new kind implements Instance and Backend (a few hundred lines of lifecycle); everything a
// sandbox does once its agent runs is shared, so every kind serves the same API.
//
// Thread safety: Sandbox methods may be called from any thread except the backend's I/O
// threads (synchronous methods block on them). Observer callbacks run on an I/O thread and
// must not block.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/instance.h"
#include "backends/sandbox_types.h"
#include "backends/session/agent_session.h"
#include "base/mutex.h"
#include "base/status.h"

namespace dsec::backends {

class Sandbox : public std::enable_shared_from_this<Sandbox> {
 public:
  // Starts `instance` and connects to its agent. On failure whatever was made is destroyed.
  static StatusOr<std::shared_ptr<Sandbox>> Start(std::unique_ptr<Instance> instance, IoRunner& io);
  // Takes over a sandbox an earlier process left running (Backend::Adopt). On failure what is
  // left of it is destroyed, unless another live process owns it (kAlreadyExists).
  static StatusOr<std::shared_ptr<Sandbox>> Adopt(std::unique_ptr<Instance> instance, IoRunner& io,
                                                  const std::string& handle);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  Kind kind() const { return instance_->kind(); }
  const SandboxSpec& spec() const { return instance_->spec(); }
  const std::string& id() const { return spec().id; }
  SandboxState state() const { return state_.load(); }
  // Why the sandbox failed ("agent exited", "oom"); empty otherwise.
  std::string reason() const;
  // Called after state() changed between running, paused and failed (not for Destroy or
  // Detach), on the thread that changed it (an I/O thread when the agent died), with no lock of
  // the Sandbox held. It says only that something changed: read state() for what (calls from
  // two threads may arrive in either order). It must not block. Set once, before use.
  void SetStateListener(std::function<void()> listener) { listener_ = std::move(listener); }
  // The kind-specific part (tests and the backend that made it look inside).
  Instance& instance() { return *instance_; }

  // Streaming exec: output and the result go to `observer`.
  StatusOr<std::shared_ptr<ExecHandle>> StartExec(const ExecRequest& req,
                                                  std::shared_ptr<ExecObserver> observer);
  // Buffered exec: waits for the command and returns its output (capped per stream).
  StatusOr<ExecOutput> Exec(const ExecRequest& req);

  // Persistent shells (cwd, env and background jobs persist between commands).
  // user: "" for the sandbox's default user.
  StatusOr<std::string> OpenShell(const std::string& user);
  StatusOr<std::shared_ptr<ExecHandle>> RunInShell(const std::string& shell_id,
                                                   const std::string& command, int64_t timeout_ms,
                                                   uint64_t max_output_bytes,
                                                   std::shared_ptr<ExecObserver> observer);
  StatusOr<ExecOutput> RunShell(const std::string& shell_id, const std::string& command,
                                int64_t timeout_ms = 30000, uint64_t max_output_bytes = 1 << 20);
  Status CloseShell(const std::string& shell_id);
  // Shell sessions alive in the sandbox (including ones found when it was adopted).
  std::vector<std::string> ListShells();

  // Files, resolved inside the sandbox root, as `user` ("": the sandbox's user).
  StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes,
                                 const std::string& user = "");
  Status WriteFile(const std::string& path, const UploadBody& data, uint32_t mode,
                   const std::string& user = "");
  StatusOr<std::vector<FileEntry>> ListDir(const std::string& path, const std::string& user = "");
  StatusOr<FileEntry> Stat(const std::string& path, const std::string& user = "");
  Status MakeDir(const std::string& path, uint32_t mode, const std::string& user = "");
  Status Remove(const std::string& path, bool recursive, const std::string& user = "");
  Status ExtractTar(const std::string& dir, const UploadBody& tar);
  StatusOr<std::string> CreateTar(const std::string& dir, uint64_t max_bytes);
  // Watches a directory as `user`: events to `observer` until the handle's Stop
  // (or the directory goes, or the sandbox).
  StatusOr<std::shared_ptr<WatchHandle>> WatchDir(const std::string& path, bool recursive,
                                                  bool include_entry,
                                                  std::shared_ptr<WatchObserver> observer,
                                                  const std::string& user = "");

  // Signals every user process (the agent survives). Returns how many there were.
  StatusOr<int> SignalAll(int sig);

  // Background execs the agent keeps (AgentSession::StartJob): they and their output survive a
  // restart of the edge. `job` names the job and its bounds; its spec is built from `req`.
  StatusOr<protocol::JobInfo> StartJob(const ExecRequest& req, protocol::JobStartRequest job);
  void ReadJob(const protocol::JobReadRequest& req,
               std::function<void(StatusOr<AgentSession::JobOutput>)> done);
  StatusOr<protocol::JobInfo> KillJob(const std::string& job_id, bool forget);
  StatusOr<std::vector<protocol::JobInfo>> ListJobs();

  // SIGKILL to every user process, then waits until only the agent is left (grader execs).
  Status KillEveryUserProcess();
  Status Pause();
  Status Resume();
  StatusOr<SandboxStats> Stats();
  // Changes the memory limit (bytes, the writable layer included); fncall pools set each
  // call's limit on its worker.
  Status SetMemoryLimit(int64_t bytes);
  // Changes the network policy live (Instance::SetNetwork).
  Status SetNetwork(const net::NetworkPolicy& p);
  // Its IPv4 address on the node's sandbox network; empty without one.
  std::string network_address() const;
  // A TCP connection to its 127.0.0.1:port (a paused sandbox is resumed first).
  // A relaying agent (a microVM's) answers within timeout_ms (else kDeadlineExceeded).
  StatusOr<UniqueFd> ConnectPort(uint16_t port, int64_t timeout_ms = 5000);
  // The same through its agent (port_connect), whatever the kind: what ConnectPort does for a
  // kind whose namespace the edge cannot enter.
  StatusOr<UniqueFd> ConnectPortViaAgent(uint16_t port, int64_t timeout_ms = 5000);
  // The sandbox's files as an image stack ("host" first when on the host image, then layer
  // digests bottom first), its writable layer captured as the new top layer while it is held
  // still for a moment. A kind without layered images says Unimplemented.
  // `keep_setuid`: keep setuid/setgid bits of the sandbox's files (dropped by default).
  StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid = false,
                                                  const CaptureProgress& progress = {});
  // Its running machine's state for forks that carry memory (Instance::SaveMachine); a
  // running sandbox is held still meanwhile and runs on after, a paused one stays paused.
  StatusOr<std::shared_ptr<const MachineState>> SaveMachine();
  // Removes every kernel object and file the sandbox made. Safe to call twice.
  Status Destroy();
  // What a later process needs to re-adopt this sandbox (Backend::Adopt): an opaque string
  // holding secrets; store it where only the edge can read it.
  std::string AdoptionHandle() const;
  // Lets go without destroying: the sandbox keeps running for a later Adopt (an edge shutting
  // down with --persist). Afterwards this object is inert (state kDestroyed).
  void Detach();

 private:
  Sandbox(std::unique_ptr<Instance> instance, IoRunner& io);
  void Connect(AgentLink link, uint64_t oom_seen) DSEC_REQUIRES(mu_);
  // Ready for agent calls: running (a paused sandbox is resumed first).
  StatusOr<std::shared_ptr<AgentSession>> Ready();
  // The ids a file operation runs as: `user`, or the sandbox's default user when empty.
  StatusOr<protocol::RunAs> RunAsUser(const std::string& user) const;
  StatusOr<protocol::ExecSpec> BuildExecSpec(const ExecRequest& req) const;
  void MarkFailed(const std::string& why);

  std::unique_ptr<Instance> instance_;
  IoRunner& io_;
  std::atomic<SandboxState> state_{SandboxState::kCreating};
  mutable Mutex mu_;
  std::string reason_ DSEC_GUARDED_BY(mu_);
  std::set<std::string> shells_ DSEC_GUARDED_BY(mu_);
  std::shared_ptr<AgentSession> session_ DSEC_GUARDED_BY(mu_);
  std::atomic<uint64_t> exec_count_{0};
  std::function<void()> listener_;
  void Notify() const {
    if (listener_) listener_();
  }
};

// The environment every command starts with, before the sandbox's and the request's own.
std::vector<std::string> BaseEnv(const UserIds& u, const std::string& hostname, bool tty);
// Sets k=v in an environment list, replacing an earlier value.
void SetEnv(std::vector<std::string>* env, const std::string& k, const std::string& v);

// What a kind can do, known before anything is built: a create or a change asking for more is
// refused (422, naming the field) before admission, and GET /v1/node lists the same table.
struct KindCapabilities {
  bool host_image = true;      // the built-in "host" image (a live view of the host's dirs)
  bool network = true;         // network modes other than "none", at create and later
  bool port_proxy = true;      // /ports/{port} and signed port URLs
  bool snapshot = true;        // snapshot and fork
  bool fork_memory = false;    // forks that carry the running machine (Instance::SaveMachine)
  bool fncall_workers = true;  // warm fncall workers
};
// Unimplemented, naming the field, when a sandbox of `kind` with this image, network and
// worker flag asks for what `caps` cannot give; OK otherwise.
Status CheckCapabilities(Kind kind, const KindCapabilities& caps, const std::string& image,
                         const net::NetworkPolicy& network, bool worker);
// The refusals of one capability, for the places that check it (the same words everywhere).
Status NoNetwork(Kind kind, net::NetMode mode);
Status NoPortProxy(Kind kind);
Status NoSnapshot(Kind kind);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Kind kind() const = 0;
  virtual KindCapabilities Capabilities() const = 0;
  // Returns when the sandbox is running.
  virtual StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;
  // Takes over a sandbox that a previous process on the same state made and left running,
  // given the spec it was created with and its AdoptionHandle(). On failure whatever is left of
  // it is destroyed (unless another live process owns it: kAlreadyExists).
  virtual StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                                   const std::string& handle) = 0;
  // Destroys what earlier processes left behind and nobody adopted. Returns how many.
  virtual StatusOr<int> CleanupOrphans() = 0;
  // The most one sandbox of this backend can ever be given on this node (CPUs, memory its
  // parent cgroup holds, disk its writable layers can live on; 0: no bound). A create beyond
  // any of them can never fit here (422), not merely now (429).
  virtual Resources Largest() const = 0;
};

// The CPUs this process may run on (its affinity mask): the most one sandbox can be given.
int UsableCpus();
// An image's environment ("KEY=VALUE" entries) added under what *env already sets.
void MergeImageEnv(const std::vector<std::string>& image_env,
                   std::map<std::string, std::string>* env);

// A helper binary (dsec-agent, dsec-zygote): $<env_name>, else installed beside this binary,
// else in the build tree (src/cli/dsec -> src/<subdir>/<name>).
std::string HelperBinaryPath(const char* env_name, const std::string& name,
                             const std::string& subdir);

// Validates resource fields (positive, bounded) and ids. Shared by every backend and the API.
Status ValidateSandboxSpec(const SandboxSpec& spec);

}  // namespace dsec::backends
