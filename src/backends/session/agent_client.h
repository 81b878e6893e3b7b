// Edge side of the edge <-> agent protocol, the framing layer under AgentSession
// (agent_session.h), for every backend: one connection per sandbox, many concurrent calls
// ("channels") over it. Runs on a shared asio io_context; all state lives on the client's
// strand, and every public method may be called from any thread. When the connection drops,
// every pending call completes with Unavailable.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace boost::asio {
class io_context;
}

namespace dsec::backends {

class AgentClient : public std::enable_shared_from_this<AgentClient> {
 public:
  // One operation on its own channel. Callbacks run on the client's strand and must not block.
  class Call {
   public:
    virtual ~Call() = default;
    virtual void OnEvent(const protocol::Json& event) { (void)event; }
    virtual void OnData(uint8_t stream, std::string_view data) {
      (void)stream;
      (void)data;
    }
    // Exactly once: the agent's final response, or an error.
    virtual void OnResponse(StatusOr<protocol::Json> response) = 0;
  };

  // `conn` is a connected stream socket whose handshake is done.
  static std::shared_ptr<AgentClient> Create(boost::asio::io_context& io, UniqueFd conn);
  ~AgentClient();

  // Starts reading. on_closed runs (once, on the strand) when the connection ends.
  void Start(std::function<void(const Status&)> on_closed);
  // Opens a channel with `request` ({"op": ...}); returns the channel id.
  uint32_t StartCall(const protocol::Json& request, std::shared_ptr<Call> call);
  // The same with the request already serialized (at most protocol::kMaxPayload bytes).
  uint32_t StartCall(std::string request, std::shared_ptr<Call> call);
  void SendData(uint32_t channel, uint8_t stream, std::string data, bool eof);
  void SendControl(uint32_t channel, const protocol::Json& control);
  // Closes the connection; pending calls fail with Unavailable.
  void Close();
  bool closed() const { return closed_.load(); }

  // Blocking request/response for simple operations. `upload` is sent as body data (EOF at
  // the end); body data from the agent is appended to *download (at most max_download bytes).
  // Gives up with DeadlineExceeded after timeout_ms (the channel is abandoned). Must not be
  // called on an io_context thread.
  static constexpr int64_t kDefaultCallTimeoutMs = 120000;
  StatusOr<protocol::Json> CallSync(const protocol::Json& request, std::string_view upload = {},
                                    std::string* download = nullptr, uint64_t max_download = 0,
                                    bool has_upload = false,
                                    int64_t timeout_ms = kDefaultCallTimeoutMs);
  // CallSync with the upload read from `fd` (`size` bytes from offset 0) as it goes out: at
  // most kUploadWindow bytes of it wait in the outgoing queue, so a large upload is never held
  // in memory. Stops sending when the agent answered early (it refused the request).
  static constexpr uint64_t kUploadWindow = 4 << 20;
  // `size` bytes of fd from `offset`.
  StatusOr<protocol::Json> CallSyncUpload(const protocol::Json& request, int fd, uint64_t offset,
                                          uint64_t size,
                                          int64_t timeout_ms = kDefaultCallTimeoutMs);
  // A call whose kData frames go to `sink` as they arrive (on the connection's strand: it must
  // not block for long; the agent slows down with it). A sink error stops the call (a control
  // {"close": true}) and is the result.
  StatusOr<protocol::Json> CallSyncStream(const protocol::Json& request,
                                          std::function<Status(std::string_view)> sink,
                                          int64_t timeout_ms = kDefaultCallTimeoutMs);
  // Forgets a call: late frames for it are dropped and its callbacks never run.
  void Abandon(uint32_t channel);

  struct Impl;  // opaque; defined in agent_client.cc

 private:
  explicit AgentClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<uint32_t> next_channel_{1};
  std::atomic<bool> closed_{false};
};

// Runs an io_context on N threads until destroyed.
class IoRunner {
 public:
  explicit IoRunner(int threads);
  ~IoRunner();
  boost::asio::io_context& io();
  // True on one of this runner's threads (where blocking calls would deadlock).
  bool OnIoThread() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::backends
