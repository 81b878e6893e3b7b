// Internal to the HTTP server: its shared state (HttpServer::Impl) and what a connection is to
// it (SessionBase). server.cc listens, accepts and starts and stops the server;
// session.cc serves one connection (HTTP/1.1 requests, streamed responses, WebSocket
// upgrades); http_request.cc turns a parsed request head into an HttpRequest.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>  // before asio (Boost 1.74)

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cstring>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "http/parse.h"

namespace dsec::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using unix_proto = asio::local::stream_protocol;

// Limits of every connection (the rest are HttpServerOptions).
inline constexpr int kBodyTimeoutS = 600;
inline constexpr int kAcceptRetryMs = 100;
inline constexpr int kFirstRequestTimeoutS = 15;
// Output queued for one slow client (a streamed exec or an attach) beyond this drops the client
// (which kills its command): the code in the sandbox must not be able to grow our memory.
inline constexpr size_t kMaxQueuedOutput = 32 << 20;

class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual void Close() = 0;  // from any thread
};

struct HttpServer::Impl {
  HttpServerOptions opts;
  std::string busy_response;  // the 503 for connections past the descriptor reserve
  PreflightFn preflight;
  HandlerFn handler;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::unique_ptr<tcp::acceptor> tcp_acceptor;
  std::unique_ptr<unix_proto::acceptor> unix_acceptor;
  std::unique_ptr<asio::steady_timer> tcp_retry, unix_retry;
  std::atomic<int64_t> conns{0};
  std::atomic<int64_t> accepted{0};  // TCP connections accepted since the start
  // Bodies being spooled (HttpServerOptions::max_spooled and max_spooled_uploads).
  std::atomic<int> spooling{0}, spooling_uploads{0};
  std::atomic<bool> stopping{false};
  Mutex mu;
  std::unordered_map<SessionBase*, std::weak_ptr<SessionBase>> sessions DSEC_GUARDED_BY(mu);
  // A descriptor held in reserve: out of descriptors, it is given up for a moment at a time to
  // accept the waiting connections and refuse them (503), instead of leaving their clients
  // hanging in the listen backlog until descriptors come back.
  //
  // Any other thread may take the slot while it is given up (a handler opening a file), and the
  // reserve is then lost until a descriptor frees. So it is taken back before every accept
  // retry, and a connection accepted while it is missing is refused so that its descriptor
  // becomes the reserve: otherwise connections held open by clients could use up every
  // descriptor and leave the rest of the backlog unanswered for as long as they stay.
  Mutex reserve_mu;
  int reserve_fd DSEC_GUARDED_BY(reserve_mu) = -1;
  void ShedWaiting(int listen_fd);
  bool RestoreReserve();          // true if a reserve descriptor is held
  void RefuseForReserve(int fd);  // 503 and close fd; its slot becomes the reserve
  // A just-accepted connection is served only if the reserve is held (or can be taken back).
  template <class Socket>
  bool Admit(Socket& s) {
    if (RestoreReserve()) return true;
    beast::error_code ec;
    int fd = s.release(ec);
    if (!ec) RefuseForReserve(fd);
    return false;
  }

  void Register(const std::shared_ptr<SessionBase>& s) {
    MutexLock l(mu);
    sessions[s.get()] = s;
  }
  void Unregister(SessionBase* s) {
    MutexLock l(mu);
    sessions.erase(s);
  }
  template <class Socket>
  void StartSession(Socket sock, bool via_unix, uid_t uid, std::string remote,
                    const std::string* buffered = nullptr);
  void AcceptTcp();
  void AcceptUnix();
};

}  // namespace dsec::http
