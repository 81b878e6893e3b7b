// The Sandbox interface every execution form implements (container now; fncall workers and
// microVMs later), and the Backend that creates them. All forms run the same dsec-agent, so
// exec, shells and file operations share one shape; backends differ in create, destroy,
// pause/resume and stats.
//
// Thread safety: Sandbox methods may be called from any thread except the backend's I/O
// threads (synchronous methods block on them). Observer callbacks run on an I/O thread and
// must not block.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "protocol/messages.h"

namespace dsec::backends {

using ExecResult = protocol::ExecResult;
using FileEntry = protocol::FileEntry;

// An fncall worker: the sandbox also runs a resident zygote (backends/fncall/zygote.h) that
// serves ExecRequest::fncall calls, each in fresh namespaces forked from it.
struct WorkerSpec {
  std::string runtime = "python";    // python | exec
  std::vector<std::string> preload;  // python: modules imported once, before any call
  std::vector<std::string> command;  // exec: argv; the call's code is appended
  int64_t call_disk_mb = 64;         // each call's fresh workdir, /tmp and /dev/shm
};

struct SandboxSpec {
  std::optional<WorkerSpec> worker;
  std::string id;  // chosen by the caller (unique per node)
  std::string kind = "container";
  std::string image = "host";
  double cpus = 1.0;
  int64_t memory_mb = 512;
  int64_t pids = 256;
  int64_t disk_mb = 256;
  std::string user = "sandbox";
  std::string workdir = "/workspace";
  std::map<std::string, std::string> env;
  std::string hostname;  // defaults to the id
};

enum class SandboxState { kCreating, kRunning, kPaused, kFailed, kDestroyed };
std::string_view SandboxStateName(SandboxState s);

struct ExecRequest {
  std::optional<protocol::FnCallSpec> fncall;  // fncall workers only: instead of cmd
  std::vector<std::string> cmd;
  std::optional<std::string> shell;  // run by /bin/sh -c instead of cmd
  std::map<std::string, std::string> env;
  std::string cwd;   // default: the sandbox's workdir
  std::string user;  // default: the sandbox's user
  int64_t timeout_ms = 30000;
  uint64_t max_output_bytes = 1 << 20;
  std::string stdin_data;
  bool stdin_stream = false;  // the caller writes stdin through the ExecHandle
  bool tty = false;
  uint16_t cols = 80, rows = 24;
  // A grader (API "grader": true): every process in the sandbox is killed first (what the
  // agent left running could tamper with it through /proc/PID/mem or ptrace as the same uid),
  // then the command runs as kGraderUid with a clean environment: the base variables and the
  // request's own env, none of the sandbox's defaults. `user` must be empty. It cannot help
  // against what root inside changed on disk (/etc/ld.so.preload, .pth files): grade in a
  // fresh sandbox that receives only the artefacts for that.
  bool grader = false;
};

// The uid/gid grader execs run as: never the sandbox user's or root's, so the agent's own
// processes cannot signal, ptrace or write the memory of a grader.
inline constexpr uint32_t kGraderUid = 65533;

// A body to send into a sandbox: bytes in memory, or `size` bytes of the file `fd` from offset
// 0 (an upload the edge spooled to disk), read as they are sent.
struct UploadBody {
  UploadBody(std::string_view d) : data(d), size(d.size()) {}     // NOLINT: implicit on purpose
  UploadBody(const std::string& d) : data(d), size(d.size()) {}   // NOLINT
  UploadBody(const char* d) : UploadBody(std::string_view(d)) {}  // NOLINT
  UploadBody(int file, uint64_t bytes) : fd(file), size(bytes) {}
  std::string_view data;
  int fd = -1;
  uint64_t size = 0;
};

// Output and result of a buffered exec.
struct ExecOutput {
  ExecResult result;
  std::string stdout_data;
  std::string stderr_data;
};

class ExecObserver {
 public:
  virtual ~ExecObserver() = default;
  virtual void OnStart(int pid) { (void)pid; }
  // stream: protocol::kStdout or kStderr.
  virtual void OnOutput(uint8_t stream, std::string_view data) = 0;
  // Exactly once. An error means the exec could not run or the sandbox went away.
  virtual void OnExit(const StatusOr<ExecResult>& result) = 0;
};

class ExecHandle {
 public:
  virtual ~ExecHandle() = default;
  // Queued and sent as the command reads; bounded (ResourceExhausted when it stops reading).
  virtual Status WriteStdin(std::string data) = 0;
  virtual void CloseStdin() = 0;
  virtual void Signal(int sig) = 0;
  virtual void Resize(uint16_t cols, uint16_t rows) = 0;
  virtual void Kill() = 0;  // the whole process tree
};

struct SandboxStats {
  uint64_t memory_current = 0, memory_peak = 0, memory_limit = 0;
  uint64_t cpu_usage_us = 0;
  uint64_t pids = 0;
  uint64_t oom_kills = 0;
  uint64_t disk_used = 0, disk_limit = 0;
  std::string disk_kind = "tmpfs";  // what the writable layer is: "tmpfs" or "image"
  uint64_t exec_count = 0;
};

class Sandbox {
 public:
  virtual ~Sandbox() = default;
  virtual const SandboxSpec& spec() const = 0;
  const std::string& id() const { return spec().id; }
  virtual SandboxState state() const = 0;
  // Why the sandbox failed ("agent exited", ...); empty otherwise.
  virtual std::string reason() const = 0;

  // Streaming exec: output and the result go to `observer`.
  virtual StatusOr<std::shared_ptr<ExecHandle>> StartExec(
      const ExecRequest& req, std::shared_ptr<ExecObserver> observer) = 0;
  // Buffered exec: waits for the command and returns its output (capped per stream).
  StatusOr<ExecOutput> Exec(const ExecRequest& req);

  // Persistent shells (cwd, env and background jobs persist between commands).
  // user: "" for the sandbox's default user.
  virtual StatusOr<std::string> OpenShell(const std::string& user) = 0;
  virtual StatusOr<std::shared_ptr<ExecHandle>> RunInShell(
      const std::string& shell_id, const std::string& command, int64_t timeout_ms,
      uint64_t max_output_bytes, std::shared_ptr<ExecObserver> observer) = 0;
  StatusOr<ExecOutput> RunShell(const std::string& shell_id, const std::string& command,
                                int64_t timeout_ms = 30000, uint64_t max_output_bytes = 1 << 20);
  virtual Status CloseShell(const std::string& shell_id) = 0;

  // Files, resolved inside the sandbox root, as the sandbox's user.
  virtual StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) = 0;
  virtual Status WriteFile(const std::string& path, const UploadBody& data, uint32_t mode) = 0;
  virtual StatusOr<std::vector<FileEntry>> ListDir(const std::string& path) = 0;
  virtual StatusOr<FileEntry> Stat(const std::string& path) = 0;
  virtual Status MakeDir(const std::string& path, uint32_t mode) = 0;
  virtual Status Remove(const std::string& path, bool recursive) = 0;
  virtual Status ExtractTar(const std::string& dir, const UploadBody& tar) = 0;
  virtual StatusOr<std::string> CreateTar(const std::string& dir, uint64_t max_bytes) = 0;

  // Signals every user process (the agent survives). Returns how many there were.
  virtual StatusOr<int> SignalAll(int sig) = 0;
  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
  virtual StatusOr<SandboxStats> Stats() = 0;
  // Changes the memory limit (bytes, the writable layer included); fncall pools set each
  // call's limit on its worker.
  virtual Status SetMemoryLimit(int64_t bytes) = 0;
  // Removes every kernel object and file the sandbox made. Safe to call twice.
  virtual Status Destroy() = 0;
  // The sandbox's files as an image stack ("host" first when on the host image, then layer
  // digests bottom first), its writable layer captured as the new top layer while it is frozen
  // for a moment. A backend without layered images says Unimplemented.
  // `keep_setuid`: keep setuid/setgid bits of the sandbox's files (dropped by default).
  virtual StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid = false) {
    (void)keep_setuid;
    return Unimplemented("this kind of sandbox cannot be snapshotted");
  }

  // Shell sessions alive in the sandbox (including ones found when it was adopted).
  virtual std::vector<std::string> ListShells() = 0;
  // What a later process needs to re-adopt this sandbox (Backend::Adopt): an opaque string
  // holding secrets; store it where only the edge can read it.
  virtual std::string AdoptionHandle() const = 0;
  // Lets go without destroying: the sandbox keeps running for a later Adopt (an edge shutting
  // down with --persist). Afterwards this object is inert (state kDestroyed).
  virtual void Detach() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Returns when the sandbox is running.
  virtual StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;
  // Takes over a sandbox that a previous process on the same state made and left running,
  // given the spec it was created with and its AdoptionHandle(). On failure whatever is left of
  // it is destroyed (unless another live process owns it: kAlreadyExists).
  virtual StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                                   const std::string& handle) = 0;
  // Destroys what earlier processes left behind and nobody adopted. Returns how many.
  virtual StatusOr<int> CleanupOrphans() = 0;
};

struct UserIds {
  uint32_t uid = 1000, gid = 1000;
  bool root = false;  // root keeps the reduced root capability set
  std::string name;   // for USER/LOGNAME/HOME
  std::string home;
};
// "sandbox" (uid 1000), "root", or numeric "uid" / "uid:gid" (0-65535).
StatusOr<UserIds> ResolveUser(const std::string& user);

// Validates resource fields (positive, bounded) and ids. Shared by every backend and the API.
Status ValidateSandboxSpec(const SandboxSpec& spec);

}  // namespace dsec::backends
