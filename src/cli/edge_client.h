// A small synchronous client for the dsec-edge REST API, used by the CLI. One keep-alive
// connection over TCP (bearer token) or the edge's unix socket; JSON calls, streamed response
// bodies (NDJSON exec, file and archive downloads), streamed chunked uploads, and the WebSocket
// attach endpoint.
#pragma once

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/verb.hpp>
#include <boost/beast/websocket/stream.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/json.h"
#include "base/status.h"

namespace dsec::cli {

using Verb = boost::beast::http::verb;

struct Endpoint {
  std::string url;  // as shown to the user
  bool is_unix = false;
  std::string unix_path;
  std::string host, port;
  std::string token;
  std::string project;      // sent as Dsec-Project (a cluster's apiserver); "" not at all
  bool configured = false;  // from --url or DSEC_URL (not the default)
};

inline constexpr const char* kDefaultSocket = "/run/dsec/edge.sock";
inline constexpr const char* kDefaultUrl = "http://127.0.0.1:7070";
inline constexpr const char* kDefaultTokenFile = "/var/lib/dsec/edge/token";

// url: --url or $DSEC_URL ("http://HOST:PORT", "unix:///PATH" or "/PATH"); empty picks the
// default unix socket when it exists, else http://127.0.0.1:7070. token: --token or $DSEC_TOKEN,
// else the default edge's token file when readable. project: --project or $DSEC_PROJECT.
StatusOr<Endpoint> ResolveEndpoint(std::string url, std::string token, std::string project = "");

// An API error as a Status: the HTTP status picks the code, the message is the server's.
Status ApiError(unsigned http_status, std::string_view body);

class EdgeClient {
 public:
  explicit EdgeClient(Endpoint ep);
  ~EdgeClient();
  EdgeClient(const EdgeClient&) = delete;
  EdgeClient& operator=(const EdgeClient&) = delete;

  const Endpoint& endpoint() const { return ep_; }
  // The context WebSockets from OpenWebSocket run on (the caller runs it).
  boost::asio::io_context& io() { return io_; }
  // True when an edge answers /v1/health.
  bool Reachable();

  struct Response {
    unsigned status = 0;
    std::string body;
  };
  // One request; a non-2xx answer is returned as a Response too (see Json/NoContent for errors).
  StatusOr<Response> Call(Verb verb, const std::string& target, std::string body = {},
                          std::string_view content_type = "application/json");
  // JSON in, JSON out; non-2xx -> the API error as a Status.
  StatusOr<Json> CallJson(Verb verb, const std::string& target, const Json* body = nullptr);
  // Streams a 2xx response body to on_data (a non-OK return stops and fails the call);
  // non-2xx -> the API error.
  Status Download(Verb verb, const std::string& target, std::string body,
                  const std::function<Status(std::string_view)>& on_data);
  // Sends a chunked request body pulled from next_chunk (empty chunk = end); expects 2xx.
  // response_body, when given, receives the 2xx answer's body.
  Status Upload(Verb verb, const std::string& target, std::string_view content_type,
                const std::function<StatusOr<std::string>()>& next_chunk,
                std::string* response_body = nullptr);

  // A WebSocket connection to target (e.g. /v1/sandboxes/ID/attach?...). Its own connection.
  using WebSocket = boost::beast::websocket::stream<boost::asio::generic::stream_protocol::socket>;
  StatusOr<std::unique_ptr<WebSocket>> OpenWebSocket(const std::string& target);

 private:
  // Sends one request and streams the answer's body to on_body(status, bytes); returns the
  // status. Retries once, for repeatable verbs, on a keep-alive connection the server closed.
  StatusOr<unsigned> Exchange(Verb verb, const std::string& target, std::string body,
                              std::string_view content_type,
                              const std::function<Status(unsigned, std::string_view)>& on_body);
  StatusOr<boost::asio::generic::stream_protocol::socket> Dial();
  Status EnsureConnected();
  void Disconnect();

  Endpoint ep_;
  boost::asio::io_context io_;
  std::optional<boost::asio::generic::stream_protocol::socket> sock_;
  boost::beast::flat_buffer buf_;
  bool reused_ = false;  // sock_ has carried a request already
};

// Percent-encodes everything but unreserved characters (and '/' when keep_slash): query values
// keep '/', path segments (sandbox ids) do not.
std::string UrlEncode(std::string_view s, bool keep_slash = true);

}  // namespace dsec::cli
