// The edge <-> agent operations, typed: one request and one response struct per operation the
// agent serves, each with one serializer (Encode) and one parser (Decode). A request opens a
// channel (a kRequest frame carrying {"op": <kOp>, ...fields}); the agent answers with one
// kResponse frame (the response's fields, or {"error": {...}}), after kData body frames for
// the operations that stream (exec and shell output, read_file, tar_create) and before which
// the edge streams kData for those that take a body (write_file, tar_extract, exec stdin).
//
// Identity: every operation that touches the sandbox's files or starts a process carries the
// uid/gid it runs as ("uid", "gid"), and the agent has no default: a request without them is
// refused. Shell commands run as the user their shell was opened with; signal_all and ping are
// the agent's own.
//
// Versions: the agent's hello names the version it speaks. Version 2 made the ids required;
// the edge still talks to version 1 agents (sandboxes adopted across an upgrade), to which it
// always sends the ids anyway. Version 3 added background jobs (job_*); an older agent answers
// them "unknown operation".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "protocol/messages.h"

namespace dsec::protocol {

inline constexpr int kProtocolVersion = 3;
inline constexpr int kMinProtocolVersion = 1;

// The first frame (kHello) on every connection, agent -> edge.
struct Hello {
  int version = kProtocolVersion;
  int pid = 0;
  std::vector<std::string> shells;  // shell sessions alive (on a reconnect)
};
Json Encode(const Hello& h);
Status Decode(const Json& j, Hello* out);
// The hello's version is one this edge speaks.
Status CheckVersion(const Hello& h);

// kAuth, edge -> agent: the first frame on a connection the agent did not start with (an edge
// that restarted, or a microVM's port with a new host end). The agent answers with a hello, or
// with an "unauthenticated" error frame and nothing more.
struct Auth {
  std::string secret;  // hex, as given in the setup
  // A microVM's only (GuestIdentity): applied before the hello; an error frame if it fails.
  std::optional<GuestIdentity> identity;
};
Json Encode(const Auth& a);
Status Decode(const Json& j, Auth* out);

// kReady, agent -> edge: the setup is done and the agent serves.
struct Ready {
  int pid = 0;        // the agent, in its own pid namespace (1)
  int layer_fd = -1;  // its fd of the writable layer (snapshots open it via /proc); -1 none
};
Json Encode(const Ready& r);
Status Decode(const Json& j, Ready* out);

// The user an operation runs as (ids inside the sandbox's user namespace).
struct RunAs {
  uint32_t uid = 0, gid = 0;
};

// Empty answers ({"ok": true}).
struct OkResponse {};
Json Encode(const OkResponse&);
Status Decode(const Json& j, OkResponse* out);

// --- processes ---

// exec: ExecSpec (messages.h) is the request; output streams as kData, the response is an
// ExecResult. shell_open takes an ExecSpec too (argv is the shell).
struct ExecRequest {
  static constexpr std::string_view kOp = "exec";
  ExecSpec spec;
};
struct ShellOpenRequest {
  static constexpr std::string_view kOp = "shell_open";
  ExecSpec spec;
};
struct ShellOpenResponse {
  std::string shell_id;
};
struct ShellRunRequest {
  static constexpr std::string_view kOp = "shell_run";
  std::string shell_id;
  std::string command;
  int64_t timeout_ms = 0;  // 0: none
  uint64_t max_output_bytes = 1 << 20;
};
// A shell command's response: its ExecResult, and whether the shell itself ended with it.
struct ShellRunResponse {
  ExecResult result;
  bool session_ended = false;
};
struct ShellCloseRequest {
  static constexpr std::string_view kOp = "shell_close";
  std::string shell_id;
};
struct SignalAllRequest {
  static constexpr std::string_view kOp = "signal_all";
  int signal = 9;
};
struct SignalAllResponse {
  int processes = 0;
};
// A TCP connection to 127.0.0.1:port inside the sandbox, relayed over the channel (the port
// proxy of a kind whose network namespace the edge cannot enter: a microVM). The agent answers
// an event {"connected": true} once connected (or the final response with the error:
// kUnavailable when nothing listens), then relays: kData frames on kStdout carry what the
// server sent (an event {"eof": true} when it closed its side), kData frames on kStdin what the
// edge sends (kFlagEof: shut down the writing side). Each side keeps at most kPortWindow bytes
// unacknowledged: the agent acks what it wrote to the server with events {"ack": n}, the edge
// what it delivered with controls {"ack": n}. The final response {} comes when both sides
// ended; a control {"close": true} ends it at once.
inline constexpr uint64_t kPortWindow = 1 << 20;
struct PortConnectRequest {
  static constexpr std::string_view kOp = "port_connect";
  uint16_t port = 0;
};

// Watches a directory (inotify) as `as`: the agent answers an event {"watching": true} once
// its watches are set, then events {"fs": [WatchEvent...]} as changes happen (at most
// kMaxWatchBatch a frame; {"overflow": true} when the kernel dropped some), until a control
// {"close": true} (final response {}) or an error (the directory gone, too many directories).
// `name` is relative to the watched directory; with `recursive`, directories made later are
// watched too. At most kMaxWatchOps watches run in one agent at once.
inline constexpr size_t kMaxWatchBatch = 256;
inline constexpr int kMaxWatchOps = 16;
struct WatchDirRequest {
  static constexpr std::string_view kOp = "watch_dir";
  RunAs as;
  std::string path;
  bool recursive = false;
  bool include_entry = false;  // each event carries the entry's stat (when it still exists)
  uint32_t max_dirs = 4096;    // directories watched at most (recursive)
};
// One change: "create", "write", "remove", "rename" or "chmod" (fsnotify's names).
struct WatchEvent {
  std::string name;
  std::string type;
  std::optional<FileEntry> entry;
};
Json ToJson(const WatchEvent& e);
StatusOr<WatchEvent> WatchEventFromJson(const Json& j);

// Captures the writable layer the agent holds (a microVM guest's: its root's overlay upper;
// a container's is read by the edge itself, and its agent answers FailedPrecondition) as an
// OCI layer tar (images/capture.h: whiteouts, opaque directories, sparse files), streamed in
// kData frames on kBody while the sandbox's processes are frozen; the final response is
// {"bytes": n}. A control {"close": true} stops it.
struct CaptureLayerRequest {
  static constexpr std::string_view kOp = "capture_layer";
  std::vector<std::string> skip;   // paths left out, with what is below them
  std::vector<std::string> empty;  // directories whose contents are left out
  bool keep_setuid = false;
  uint64_t max_apparent_bytes = 0;  // 0: none
};

struct PingRequest {
  static constexpr std::string_view kOp = "ping";
};
struct PingResponse {
  int pid = 0;
  int active = 0;  // execs + shells running
};

// --- background jobs (protocol 3) ---
// A job is an exec the agent owns rather than a channel: it outlives the connection that
// started it (a restarted edge finds it again), and its output is kept in the agent (each
// stream up to the spec's max_output_bytes, all jobs together up to max_kept_bytes) to be read
// from any offset. Finished jobs are forgotten oldest first beyond `keep`.
struct JobInfo {
  std::string job_id;
  int pid = 0;
  int64_t started_at = 0;  // as the job_start request gave it (the edge's clock)
  bool done = false;
  std::string meta;                           // as job_start gave it (the edge's, opaque)
  uint64_t stdout_kept = 0, stderr_kept = 0;  // bytes held, readable from offset 0
  ExecResult result;                          // when done
};
Json Encode(const JobInfo& i);
Status Decode(const Json& j, JobInfo* out);

struct JobStartRequest {
  static constexpr std::string_view kOp = "job_start";
  std::string job_id;
  int64_t started_at = 0;
  std::string meta;  // at most kMaxJobMeta bytes
  uint32_t keep = 256;
  uint64_t max_kept_bytes = 64 << 20;
  ExecSpec spec;  // stdin inline only
};
// Response: JobInfo.
// Reads kept output from the offsets as kData frames (stdout first, then stderr; at most
// max_bytes in all), then answers with a JobReadResponse. With wait_ms, the answer waits (at
// most that long) until there is output past the offsets or the job ended; with wait_exit,
// until it ended.
struct JobReadRequest {
  static constexpr std::string_view kOp = "job_read";
  std::string job_id;
  uint64_t stdout_offset = 0, stderr_offset = 0;
  uint64_t max_bytes = 1 << 20;
  int64_t wait_ms = 0;
  bool wait_exit = false;
};
struct JobReadResponse {
  JobInfo info;
  uint64_t stdout_offset = 0, stderr_offset = 0;  // where the data sent starts
  uint64_t stdout_sent = 0, stderr_sent = 0;
};
// Kills the job's process tree and answers (JobInfo) once it ended; `forget` removes it then.
// A finished job is answered at once (and forgotten when asked).
struct JobKillRequest {
  static constexpr std::string_view kOp = "job_kill";
  std::string job_id;
  bool forget = false;
};
struct JobListRequest {
  static constexpr std::string_view kOp = "job_list";
};
struct JobListResponse {
  std::vector<JobInfo> jobs;  // oldest first
};
inline constexpr uint64_t kMaxJobRead = 64 << 20;
inline constexpr size_t kMaxJobMeta = 1024;
inline constexpr int64_t kMaxJobWaitMs = 600000;

// --- files (paths are absolute, resolved inside the sandbox root) ---

struct ReadFileRequest {
  static constexpr std::string_view kOp = "read_file";
  RunAs as;
  std::string path;
  uint64_t max_bytes = 64 << 20;
  uint64_t offset = 0;
};
struct ReadFileResponse {
  uint64_t size = 0;   // of what was left to read from the offset
  uint64_t bytes = 0;  // sent as body
  bool truncated = false;
};
struct WriteFileRequest {
  static constexpr std::string_view kOp = "write_file";
  RunAs as;
  std::string path;
  uint32_t mode = 0644;
  bool mkdirs = true;
  bool append = false;
};
struct WriteFileResponse {
  uint64_t bytes = 0;
};
struct ListDirRequest {
  static constexpr std::string_view kOp = "list";
  RunAs as;
  std::string path;
  uint32_t max_entries = 10000;
};
struct ListDirResponse {
  std::vector<FileEntry> entries;
  bool truncated = false;
};
struct StatRequest {
  static constexpr std::string_view kOp = "stat";
  RunAs as;
  std::string path;
  bool machine = false;  // add the machine's memory and the user processes (a microVM's stats)
};
struct StatResponse {
  FileEntry entry;
  uint32_t uid = 0, gid = 0;
  // The filesystem holding the path (statvfs): its size and what is used; 0 from older agents.
  uint64_t fs_bytes = 0, fs_used = 0;
  // With `machine`: /proc/meminfo's MemTotal and MemAvailable (bytes) and the processes in the
  // agent's user cgroup; 0 when not asked or not known.
  uint64_t mem_total = 0, mem_available = 0, user_pids = 0;
};
struct MakeDirRequest {
  static constexpr std::string_view kOp = "mkdir";
  RunAs as;
  std::string path;
  uint32_t mode = 0755;
  bool parents = true;
};
struct RemoveRequest {
  static constexpr std::string_view kOp = "remove";
  RunAs as;
  std::string path;
  bool recursive = false;
};
struct TarExtractRequest {
  static constexpr std::string_view kOp = "tar_extract";
  RunAs as;
  std::string path;
  uint64_t max_bytes = 1ull << 32;  // extracted bytes (sparse files at their real size)
};
struct TarExtractResponse {
  uint64_t entries = 0, bytes = 0, skipped = 0;
};
struct TarCreateRequest {
  static constexpr std::string_view kOp = "tar_create";
  RunAs as;
  std::string path;
  uint64_t max_bytes = 0;  // the agent stops sending past this
};
struct TarCreateResponse {
  uint64_t bytes = 0, skipped = 0;
};

// Limits the parsers enforce.
inline constexpr uint32_t kMaxListEntries = 100000;
inline constexpr size_t kMaxPathBytes = 4096;

// One serializer and one parser per type. Requests encode their "op"; Decode checks types and
// bounds and answers InvalidArgument naming the field.
#define DSEC_PROTOCOL_CODEC(T) \
  Json Encode(const T& v);     \
  Status Decode(const Json& j, T* out);
DSEC_PROTOCOL_CODEC(ExecRequest)
DSEC_PROTOCOL_CODEC(ShellOpenRequest)
DSEC_PROTOCOL_CODEC(ShellOpenResponse)
DSEC_PROTOCOL_CODEC(ShellRunRequest)
DSEC_PROTOCOL_CODEC(ShellRunResponse)
DSEC_PROTOCOL_CODEC(ShellCloseRequest)
DSEC_PROTOCOL_CODEC(SignalAllRequest)
DSEC_PROTOCOL_CODEC(SignalAllResponse)
DSEC_PROTOCOL_CODEC(PortConnectRequest)
DSEC_PROTOCOL_CODEC(WatchDirRequest)
DSEC_PROTOCOL_CODEC(CaptureLayerRequest)
DSEC_PROTOCOL_CODEC(PingRequest)
DSEC_PROTOCOL_CODEC(PingResponse)
DSEC_PROTOCOL_CODEC(JobStartRequest)
DSEC_PROTOCOL_CODEC(JobReadRequest)
DSEC_PROTOCOL_CODEC(JobReadResponse)
DSEC_PROTOCOL_CODEC(JobKillRequest)
DSEC_PROTOCOL_CODEC(JobListRequest)
DSEC_PROTOCOL_CODEC(JobListResponse)
DSEC_PROTOCOL_CODEC(ReadFileRequest)
DSEC_PROTOCOL_CODEC(ReadFileResponse)
DSEC_PROTOCOL_CODEC(WriteFileRequest)
DSEC_PROTOCOL_CODEC(WriteFileResponse)
DSEC_PROTOCOL_CODEC(ListDirRequest)
DSEC_PROTOCOL_CODEC(ListDirResponse)
DSEC_PROTOCOL_CODEC(StatRequest)
DSEC_PROTOCOL_CODEC(StatResponse)
DSEC_PROTOCOL_CODEC(MakeDirRequest)
DSEC_PROTOCOL_CODEC(RemoveRequest)
DSEC_PROTOCOL_CODEC(TarExtractRequest)
DSEC_PROTOCOL_CODEC(TarExtractResponse)
DSEC_PROTOCOL_CODEC(TarCreateRequest)
DSEC_PROTOCOL_CODEC(TarCreateResponse)
#undef DSEC_PROTOCOL_CODEC

// Decode into a fresh value.
template <class T>
StatusOr<T> DecodeAs(const Json& j) {
  if (!j.is_object()) return InvalidArgument("message must be a JSON object");
  T v;
  DSEC_RETURN_IF_ERROR(Decode(j, &v));
  return v;
}

// Paths in requests: absolute, no NUL, at most kMaxPathBytes.
Status ValidateSandboxPath(const std::string& path);

}  // namespace dsec::protocol
