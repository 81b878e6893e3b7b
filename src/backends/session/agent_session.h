// The client side of the agent protocol (protocol/agent_ops.h) for one sandbox, whatever runs
// it: a connected stream to its dsec-agent (a socketpair or unix socket for a container, the
// host end of a virtio-serial port for a microVM) and every operation the agent serves, typed.
// It owns what crosses that stream: exec and shell calls with their stdin (queued, sent as the
// command reads it: a bounded window in flight, a bounded queue behind it), the upload of a
// spooled file a window at a time, downloads capped at the caller's bound, and the OOM
// attribution of SIGKILLed execs. It knows nothing of how the sandbox was made; Sandbox
// (sandbox.h) resolves users and builds exec specs on top of it.
//
// Thread safety: every method may be called from any thread but an I/O thread of the IoRunner
// (the synchronous ones block on it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/instance.h"
#include "backends/sandbox_types.h"
#include "backends/session/agent_client.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "protocol/agent_ops.h"

namespace dsec::backends {

class AgentSession {
 public:
  // `stream`: connected, handshake done. `oom_seen`: the OOM kills that happened before this
  // session (so that only later ones are attributed). `on_closed` runs once, on an I/O thread,
  // when the connection ends; `oom` says whether the OOM killer struck since (the agent is
  // PID 1: when it goes, everything goes). It must not block.
  static std::shared_ptr<AgentSession> Start(IoRunner& io, UniqueFd stream, OomCounter oom_kills,
                                             uint64_t oom_seen,
                                             std::function<void(bool oom)> on_closed);
  ~AgentSession();
  // Ends the connection: pending calls fail with Unavailable.
  void Close();

  // Larger stdin goes as a stream after the request instead of inline in it.
  static constexpr size_t kInlineStdinMax = 256 * 1024;
  StatusOr<std::shared_ptr<ExecHandle>> StartExec(protocol::ExecSpec spec,
                                                  const std::string& stdin_data,
                                                  std::shared_ptr<ExecObserver> observer);
  StatusOr<std::string> OpenShell(protocol::ExecSpec spec);
  StatusOr<std::shared_ptr<ExecHandle>> RunInShell(const protocol::ShellRunRequest& req,
                                                   std::shared_ptr<ExecObserver> observer);
  Status CloseShell(const std::string& shell_id);

  StatusOr<std::string> ReadFile(protocol::RunAs as, const std::string& path, uint64_t max_bytes);
  Status WriteFile(protocol::RunAs as, const std::string& path, const UploadBody& data,
                   uint32_t mode);
  StatusOr<std::vector<FileEntry>> ListDir(protocol::RunAs as, const std::string& path);
  StatusOr<FileEntry> Stat(protocol::RunAs as, const std::string& path);
  // Stat with the figures of the filesystem holding the path.
  // `machine`: also the machine's memory and the agent's user processes (StatResponse).
  StatusOr<protocol::StatResponse> StatFs(protocol::RunAs as, const std::string& path,
                                          bool machine = false);
  Status MakeDir(protocol::RunAs as, const std::string& path, uint32_t mode);
  Status Remove(protocol::RunAs as, const std::string& path, bool recursive);
  // `max_bytes`: the most the archive may write (the sandbox's disk).
  Status ExtractTar(protocol::RunAs as, const std::string& dir, const UploadBody& tar,
                    uint64_t max_bytes);
  StatusOr<std::string> CreateTar(protocol::RunAs as, const std::string& dir, uint64_t max_bytes);
  // Signals every user process (the agent survives). Returns how many there were.
  StatusOr<int> SignalAll(int sig);
  // A connection to 127.0.0.1:port inside the sandbox, relayed by the agent
  // (session/port_bridge.h): kUnavailable when nothing listens there.
  StatusOr<UniqueFd> OpenPort(uint16_t port, int64_t timeout_ms = 5000);
  // Watches a directory (watch_dir). An agent that predates it answers FailedPrecondition
  // (through the observer's OnEnd).
  std::shared_ptr<WatchHandle> WatchDir(protocol::WatchDirRequest req,
                                        std::shared_ptr<WatchObserver> observer);
  // The writable layer the agent holds, as a layer tar to `sink` (capture_layer; on the
  // session's I/O thread). Returns the bytes sent.
  StatusOr<uint64_t> CaptureLayer(const protocol::CaptureLayerRequest& req,
                                  std::function<Status(std::string_view)> sink);

  // Background jobs (protocol/agent_ops.h, job_*): execs the agent keeps, with their output,
  // across connections. An agent older than protocol 3 answers FailedPrecondition.
  StatusOr<protocol::JobInfo> StartJob(protocol::JobStartRequest req,
                                       const std::string& stdin_data);
  struct JobOutput {
    protocol::JobReadResponse read;
    std::string out, err;  // from read.stdout_offset / read.stderr_offset
  };
  // Asynchronous (a read may wait for output): `done` runs once, on an I/O thread.
  void ReadJob(const protocol::JobReadRequest& req, std::function<void(StatusOr<JobOutput>)> done);
  StatusOr<protocol::JobInfo> KillJob(const std::string& job_id, bool forget);
  StatusOr<std::vector<protocol::JobInfo>> ListJobs();

  struct OomTracker;  // defined in agent_session.cc

 private:
  AgentSession() = default;
  Status Upload(const protocol::Json& request, const UploadBody& body);

  // SIGKILLed jobs' OOM attribution (defined in agent_session.cc).
  struct JobOom;

  boost::asio::io_context* io_ = nullptr;
  std::shared_ptr<AgentClient> client_;
  std::shared_ptr<OomTracker> oom_;
  std::shared_ptr<JobOom> job_oom_;
};

}  // namespace dsec::backends
