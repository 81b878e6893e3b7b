// One proxied HTTP exchange between a client of the API and a server inside a sandbox (the
// port proxy, api_ports.cc). What the proxy guarantees, whatever the sandbox's server sends:
//
//  - One request, one response, then the client's connection is closed (unless the caller
//    asks for keep-alive: ProxiedRequest::reuse). The upstream
//    response's head is parsed (Beast) and rewritten: its Connection and Keep-Alive headers are
//    dropped and "Connection: close" is sent, so no client reuses the connection, and the edge
//    closes it when the response's own framing (Content-Length, chunked, or the end of stream)
//    says it ended. A client's next request can never reach the sandbox (with its token).
//  - The request's body is relayed exactly as framed by the head the edge parsed (one
//    Content-Length or chunked, both normalised in the head the server sees); bytes the client
//    sends after it (pipelined requests) are read and dropped, never relayed.
//  - A WebSocket upgrade becomes a raw two-way relay only after the server answered 101 to a
//    request that asked for it; anything else the client sent before that waits (bounded).
//  - A client that closes its side before the response ended abandons the exchange: the
//    connection into the sandbox is closed at once.
//  - The connect into the sandbox never blocks a thread: it is non-blocking with a deadline
//    (then 504 gateway_timeout); a malformed or missing response head is a 502.
//  - Bounded: each connection holds two pipes of at most kPipeBytes (1 MiB: 256 KiB cost a
//    fifth of the throughput here) and a head buffer of at most kMaxHeadBytes; how many
//    connections one sandbox and the node may hold is capped by the caller (SandboxSlots).
//
// Bodies move with splice(2) where their length is known (the bytes never enter the edge's
// memory); chunked bodies and heads pass through the parser in user space. All handlers of
// one relay run on its own strand of the HTTP server's I/O threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::http {

inline constexpr size_t kPipeBytes = 1 << 20;
inline constexpr size_t kMaxHeadBytes = 64 << 10;

// The request side of one exchange, as the edge parsed it.
struct ProxiedRequest {
  std::string head;  // the head for the upstream server, framing headers normalised
  enum class Body { kNone, kLength, kChunked } body = Body::kNone;
  uint64_t length = 0;       // kLength
  bool upgrade = false;      // asks for a WebSocket upgrade
  bool head_method = false;  // HEAD: the response has no body
  std::string buffered;      // what the client sent past its head, already read
  std::string target_name;   // "port P in sandbox ID", for messages
  // Keep-alive toward the client (the apiserver; never the port proxy): when set, a response
  // whose end its framing tells (a length, chunked, or no body) leaves the client's connection
  // open, and once it is out and the request was read whole, `reuse` gets the connection and
  // the bytes the client sent past its request (its next one, at most 64 KiB held). Set it only
  // for a client that asked to keep its connection.
  std::function<void(UniqueFd client, std::string next)> reuse;
  // Keep-alive toward the upstream server (the apiserver's relays to nodes; never the port
  // proxy): when set, the head asks to keep the upstream connection (SetUpstreamHead), and once
  // the request went out whole and a response the server means to keep the connection after
  // ended by its own framing, the upstream connection goes to `upstream_reuse` (an idle pool).
  std::function<void(UniqueFd upstream)> upstream_reuse;
  // Set when `upstream` came from such a pool: should it turn out closed by the server before
  // any byte of a response came back (it closed it while idle), the exchange starts once more
  // on a connection from `reconnect` — only when the whole request is in memory (the head and
  // `buffered`: no body, or one that arrived with the head); a body still streaming from the
  // client cannot be sent twice, and its exchange fails as with a fresh connection.
  std::function<StatusOr<UniqueFd>()> reconnect;
};

// Relays one exchange. `upstream` is a non-blocking TCP socket whose connect was started
// (EINPROGRESS) or finished. `outcome` is called once with the status the client got from the
// edge itself (502, 504) or from the sandbox's server (its status, once its head arrived);
// 0 when the exchange ended before either.
class PortRelay;
void StartPortRelay(boost::asio::io_context& io, UniqueFd client, UniqueFd upstream,
                    ProxiedRequest req, std::chrono::milliseconds connect_timeout,
                    std::shared_ptr<void> slot, std::function<void(int status)> outcome);

// The upstream connection of an exchange relayed over `pool`'s connections (keep-alive toward
// a server the relay trusts to frame its responses): an idle one of the pool when there is one
// (pr->reconnect set to replace it should it turn out closed), else a fresh connect started;
// the connection goes back to the pool after the exchange (pr->upstream_reuse) unless the
// request is a WebSocket upgrade. Call before SetUpstreamHead.
class HttpClient;
StatusOr<UniqueFd> ConnectUpstream(const std::shared_ptr<HttpClient>& pool, bool upgrade,
                                   ProxiedRequest* pr);

// A complete error response (JSON body, Connection: close) as bytes.
std::string ProxyErrorResponse(int status, std::string_view code, std::string_view message);
// Any complete response (with Connection: close) as bytes.
struct HttpResponse;
std::string RawResponse(const HttpResponse& r);
// `r` written straight onto a taken-over connection (as SendErrorAndClose).
void SendAndClose(UniqueFd fd, const HttpResponse& r);

// The same, written straight onto a taken-over connection (blocking, at most 5 s), which is
// then shut down for writing and closed.
void SendErrorAndClose(UniqueFd fd, int status, std::string_view code, std::string_view message);

// Headers a proxy never passes on as they came: connection-level ones, credentials, Host and
// the body's framing (each proxy writes its own).
bool IsHopByHop(std::string_view lowercase_name);

struct HttpRequest;
// The body's framing of a taken-over request, as the server's parser accepted it (one
// Content-Length, or chunked): sets pr->body and pr->length.
Status FrameBody(const HttpRequest& req, ProxiedRequest* pr);

// The head of `req` as the upstream server gets it: the request line with `target`, `host` as
// Host, the client's headers but the hop-by-hop ones, Upgrade (unless it is a WebSocket
// upgrade) and those named in `drop` (lowercase), then `extra`, the framing FrameBody found,
// and "Connection: close" (or "Upgrade"; nothing, i.e. keep-alive, when pr->upstream_reuse
// is set). Sets pr->head, pr->upgrade and pr->head_method.
void SetUpstreamHead(const HttpRequest& req, std::string_view target, std::string_view host,
                     const std::vector<std::pair<std::string, std::string>>& extra,
                     std::initializer_list<std::string_view> drop, ProxiedRequest* pr);

}  // namespace dsec::http
