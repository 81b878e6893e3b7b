// The value types every execution form shares: what a sandbox is made of (SandboxSpec), what
// an exec asks for and returns, the observer and handle of a streaming exec, upload bodies,
// stats and user ids. Used by Sandbox (sandbox.h), the agent session and every backend.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/kind.h"
#include "base/resources.h"
#include "base/status.h"
#include "net/policy.h"
#include "protocol/agent_ops.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::backends {

using ExecResult = protocol::ExecResult;
using FileEntry = protocol::FileEntry;

// What an fncall runtime runs a call's code with: an embedded CPython, bash (exec of
// /bin/bash -c), or a command the code is appended to.
enum class FnRuntime { kPython, kBash, kExec };
std::string_view FnRuntimeName(FnRuntime r);  // "python", "bash", "exec"
std::optional<FnRuntime> FnRuntimeFromName(std::string_view name);

// An fncall worker: the sandbox also runs a resident zygote (backends/fncall/zygote.h) that
// serves ExecRequest::fncall calls, each in fresh namespaces forked from it.
struct WorkerSpec {
  FnRuntime runtime = FnRuntime::kPython;  // kPython or kExec (bash is exec of /bin/bash -c)
  std::vector<std::string> preload;        // python: modules imported once, before any call
  std::vector<std::string> command;        // exec: argv; the call's code is appended
  int64_t call_disk_mb = 64;               // each call's fresh workdir, /tmp and /dev/shm
};

// The shape of a sandbox: what it runs and with what, as whom, where, and what it may reach.
// One struct that a create (edge CreateParams), a container pool's sandboxes and the backend's
// spec all are, so that it is copied whole, never field by field.
struct SandboxShape {
  Kind kind = Kind::kContainer;
  std::string image = "host";  // "host", or an image (stack: "a,b")
  Resources resources;
  std::string user = "sandbox";
  std::string workdir = "/workspace";
  std::map<std::string, std::string> env;
  net::NetworkPolicy network;  // egress (net/policy.h); mode none: loopback only
  bool operator==(const SandboxShape&) const = default;
};

// A running machine's saved state (its memory, processes and devices: Instance::SaveMachine),
// which a fork that carries memory starts from; the kind's own, opaque elsewhere.
struct MachineState {
  virtual ~MachineState() = default;
};

struct SandboxSpec : SandboxShape {
  std::optional<WorkerSpec> worker;
  std::string id;        // chosen by the caller (unique per node)
  std::string hostname;  // defaults to the id
  // Set: it starts as a copy of that machine (of its kind, shape and image), not fresh.
  std::shared_ptr<const MachineState> machine;
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
  UploadBody(int file, uint64_t bytes, uint64_t from = 0) : fd(file), size(bytes), offset(from) {}
  std::string_view data;
  int fd = -1;
  uint64_t size = 0;
  uint64_t offset = 0;  // of the bytes in fd
};

// Output and result of a buffered exec.
struct ExecOutput {
  ExecResult result;
  std::string stdout_data;
  std::string stderr_data;
};

// Which output stream OnOutput's data is from (the agent protocol's stream numbers).
inline constexpr uint8_t kStdoutStream = protocol::kStdout;
inline constexpr uint8_t kStderrStream = protocol::kStderr;

class ExecObserver {
 public:
  virtual ~ExecObserver() = default;
  virtual void OnStart(int pid) { (void)pid; }
  // stream: kStdoutStream or kStderrStream.
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

// A directory watch's events (Sandbox::WatchDir). Callbacks run on an I/O thread and must
// not block.
class WatchObserver {
 public:
  virtual ~WatchObserver() = default;
  virtual void OnWatching() = 0;  // the watches are set: changes from now on are reported
  virtual void OnEvents(std::vector<protocol::WatchEvent> events) = 0;
  // Exactly once: OK after Stop, else why the watch ended (the directory removed, ...).
  virtual void OnEnd(const Status& status) = 0;
};
class WatchHandle {
 public:
  virtual ~WatchHandle() = default;
  virtual void Stop() = 0;
};

struct SandboxStats {
  uint64_t memory_current = 0, memory_peak = 0, memory_limit = 0;
  uint64_t cpu_usage_us = 0;
  uint64_t pids = 0;
  uint64_t oom_kills = 0;
  uint64_t disk_used = 0, disk_limit = 0;
  std::string disk_kind = "tmpfs";  // what the writable layer is: "tmpfs" or "image"
  // False when the writable layer lives where the instance cannot see it (a microVM guest's
  // RAM): the agent is asked (statfs of its root) while the sandbox runs.
  bool disk_used_known = true;
  // A microVM's guest, as its agent reads it while the sandbox runs (its own account: the
  // guest's /proc/meminfo, and the processes of what the agent started): `ask_guest` set by
  // the instance, `guest` once the agent answered.
  bool ask_guest = false;
  struct Guest {
    uint64_t memory_total = 0, memory_used = 0;  // MemTotal, MemTotal - MemAvailable
    uint64_t pids = 0;
  };
  std::optional<Guest> guest;
  uint64_t exec_count = 0;
  uint64_t network_denied = 0;  // packets its network policy refused
};

struct UserIds {
  uint32_t uid = kSandboxUid, gid = kSandboxGid;
  bool root = false;  // root keeps the reduced root capability set
  std::string name;   // for USER/LOGNAME/HOME
  std::string home;
};
// "sandbox" (uid 1000), "root", or numeric "uid" / "uid:gid" (0-65535).
StatusOr<UserIds> ResolveUser(const std::string& user);

}  // namespace dsec::backends
