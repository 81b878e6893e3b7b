// The HTTP/1.1 server of the edge and the apiserver (Boost.Beast on Asio): TCP and a unix socket,
// keep-alive, bounded headers and bodies, buffered and chunked streaming responses, and WebSocket
// upgrades. Everything is asynchronous: a connection costs a socket and a small object, never
// a thread, so thousands of open connections and long streams are fine.
//
// Flow per request: headers are read (header limit), `preflight` decides from them alone
// (authentication, and the body limit for this route) so an unauthenticated or oversized
// upload is refused before its body is read; then the body is read and `handler` gets the
// request and a Responder. The handler runs on an I/O thread and must not block: blocking work
// goes to a worker pool, and the Responder may be used from any thread.
//
// Thread safety: Responder and WebSocketConn methods are thread-safe (they post to the
// connection's strand). Start/Stop from one thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace boost::asio {
class io_context;
}

namespace dsec::http {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: path and query
  std::string path;                                          // percent-decoded path
  std::vector<std::pair<std::string, std::string>> query;    // decoded, in order
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string body;
  // When preflight asked for it (Preflight::spool), the body is in this unlinked file instead
  // (offset 0, body_size bytes) and `body` is empty: big uploads never sit in the edge's memory.
  UniqueFd body_file;
  uint64_t body_size = 0;
  bool via_unix = false;
  uid_t peer_uid = static_cast<uid_t>(-1);  // unix socket peers
  std::string remote;                       // "1.2.3.4:5678" or "unix"
  bool websocket_upgrade = false;
  bool keep_alive = false;  // HTTP/1.1 without "Connection: close" (or 1.0 with keep-alive)
  std::string principal;    // set by preflight: who is calling (for idempotency scopes, audit)
  // When preflight asked for it (Preflight::takeover): the connection itself, right after the
  // request head, and the bytes already read past it. The handler gets no Responder; it owns
  // the connection (the port proxy relays it as is).
  UniqueFd takeover_fd;
  std::string takeover_buffered;

  const std::string* Query(std::string_view name) const;  // first value
  std::vector<std::string> QueryAll(std::string_view name) const;
  std::string Header(std::string_view lowercase_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after this response
};

class WebSocketConn {
 public:
  virtual ~WebSocketConn() = default;
  virtual void Send(std::string data, bool binary) = 0;
  // Sends a close frame after what is queued; the handler then gets OnClose.
  virtual void Close() = 0;
};

class WebSocketHandler {
 public:
  virtual ~WebSocketHandler() = default;
  virtual void OnOpen(std::shared_ptr<WebSocketConn> conn) = 0;
  virtual void OnMessage(std::string data, bool binary) = 0;
  // Exactly once, when the connection is gone (either side closed, or an error).
  virtual void OnClose() = 0;
};

// How a handler answers. Exactly one of: Send; StartStream + Write* + End; AcceptWebSocket.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(HttpResponse r) = 0;
  virtual void StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Write(std::string chunk) = 0;  // one chunk; dropped once the client is gone
  virtual void End(std::string last_chunk = {}) = 0;
  // `cb` runs once (on an I/O thread) if the client goes away before the response is done.
  virtual void OnDisconnect(std::function<void()> cb) = 0;
  virtual void AcceptWebSocket(std::shared_ptr<WebSocketHandler> handler) = 0;
};

struct Preflight {
  bool ok = true;
  HttpResponse error;  // when !ok: sent, then the connection is closed
  uint64_t body_limit = 0;
  // Where body_limit comes from, for the 413's message ("max_json_body_bytes", "the sandbox's
  // disk_mb ...").
  std::string limit_why;
  bool upload_sandbox = false;  // an upload into a sandbox (the API sets its limit)
  std::string principal;
  // Read the body into an unlinked file in HttpServerOptions::spool_dir (see
  // HttpRequest::body_file), 64 KiB at a time: an image archive (at most max_spooled at once)
  // or a large file/archive upload (at most max_spooled_uploads).
  enum class Spool { kNo, kImport, kUpload };
  Spool spool = Spool::kNo;
  // Hand the connection to the handler after the head (HttpRequest::takeover_fd); no body is
  // read and no limit applies.
  bool takeover = false;
};

struct HttpServerOptions {
  std::string listen;     // "host:port" or empty
  std::string unix_path;  // socket path or empty; created 0600, root-only peers
  uint64_t max_header_bytes = 16 << 10;
  int max_connections = 16384;
  int idle_timeout_s = 120;
  int io_threads = 2;
  uint64_t max_websocket_message = 1 << 20;
  std::string spool_dir;  // where spooled bodies go (O_TMPFILE); required for Preflight::spool
  // Spooled bodies being received at once; more are refused (429) before their bodies are read.
  int max_spooled = 4;                    // image archives (GiBs each, unpacked afterwards)
  int max_spooled_uploads = 16;           // file and archive uploads into sandboxes
  std::string server_name = "dsec-edge";  // the Server header
};

class HttpServer {
 public:
  using PreflightFn = std::function<Preflight(HttpRequest& headers_only)>;
  using HandlerFn = std::function<void(HttpRequest&& req, std::shared_ptr<Responder> r)>;

  static StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions opts, PreflightFn preflight,
                                                     HandlerFn handler);
  ~HttpServer();
  // Stops accepting, closes every connection and joins the I/O threads.
  void Stop();
  int64_t connections() const;
  int64_t tcp_accepted() const;  // TCP connections accepted since the start
  uint16_t tcp_port() const;     // the bound port (useful with port 0)
  // Serves a TCP connection handed back after a relayed exchange (keep-alive through a relay):
  // a new session, as after a keep-alive response; `buffered` is what the client already sent
  // of its next request. Thread-safe.
  void Adopt(UniqueFd fd, std::string buffered, std::string remote);
  boost::asio::io_context& io();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// {"error": {"code": code, "message": message}} with the given status.
HttpResponse JsonError(int status, std::string_view code, std::string_view message);

// Splits "host:port" ("[::1]:7070" for IPv6).
Status ParseHostPort(const std::string& s, std::string* host, uint16_t* port);

// Percent-decoding for paths and query values ('+' is a space in queries). False on bad escapes.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);
// Sets req->path and req->query from req->target (percent-decoded); false (and a 400 in
// `error`) on bad escapes or a NUL in the path.
bool DecodeTarget(HttpRequest* req, HttpResponse* error);

}  // namespace dsec::http
