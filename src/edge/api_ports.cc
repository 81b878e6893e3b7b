// The port proxy: /v1/sandboxes/{id}/ports/{port}/{path...} (any method) reaches a server on
// 127.0.0.1:port inside the sandbox, in every network mode (the edge connects from inside the
// sandbox's namespace). The HTTP server hands the connection over right after the request head
// (Preflight::takeover, after authentication); the head is rewritten (path, Host, no
// Authorization, Connection: close unless it is an upgrade) and from then on bytes are relayed
// both ways as they come, so bodies stream, responses stream and a WebSocket upgrade just
// works. Relaying is asynchronous on the HTTP server's I/O threads: no thread per connection.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/manager.h"

namespace dsec::edge {

namespace {

namespace asio = boost::asio;
using Stream = asio::posix::stream_descriptor;

// Both directions of one proxied connection. Each direction reads into its buffer and writes
// it out before reading again (so a slow reader holds back its writer: backpressure, bounded
// memory); an end of stream is passed on as a half-close.
class Relay : public std::enable_shared_from_this<Relay> {
 public:
  Relay(asio::io_context& io, UniqueFd client, UniqueFd upstream)
      : client_(io, client.Release()), upstream_(io, upstream.Release()) {}

  void Start(std::string to_upstream) {
    auto self = shared_from_this();
    auto buf = std::make_shared<std::string>(std::move(to_upstream));
    asio::async_write(upstream_, asio::buffer(*buf), [self, buf](boost::system::error_code ec,
                                                                 size_t) {
      if (ec) return self->Abort();
      self->Pump(self->client_, self->upstream_, self->up_buf_, &self->up_done_);
      self->Pump(self->upstream_, self->client_, self->down_buf_, &self->down_done_);
    });
  }

 private:
  void Pump(Stream& from, Stream& to, std::array<char, 65536>& buf, bool* done) {
    auto self = shared_from_this();
    from.async_read_some(asio::buffer(buf), [self, &from, &to, &buf, done](
                                                boost::system::error_code ec, size_t n) {
      if (ec == asio::error::eof) {
        ::shutdown(to.native_handle(), SHUT_WR);  // pass the end on; the other way goes on
        *done = true;
        if (self->up_done_ && self->down_done_) self->Abort();
        return;
      }
      if (ec) return self->Abort();
      asio::async_write(to, asio::buffer(buf.data(), n),
                        [self, &from, &to, &buf, done](boost::system::error_code ec2, size_t) {
                          if (ec2) return self->Abort();
                          self->Pump(from, to, buf, done);
                        });
    });
  }
  void Abort() {
    boost::system::error_code ec;
    client_.close(ec);
    upstream_.close(ec);
  }

  Stream client_, upstream_;
  std::array<char, 65536> up_buf_{}, down_buf_{};
  bool up_done_ = false, down_done_ = false;
};

// A complete error response written straight onto the taken-over connection, which then closes.
void SendError(UniqueFd fd, int status, std::string_view code, std::string_view message) {
  HttpResponse r = JsonError(status, code, message);
  std::string reason = status == 404   ? "Not Found"
                       : status == 422 ? "Unprocessable Entity"
                       : status == 502 ? "Bad Gateway"
                       : status == 503 ? "Service Unavailable"
                       : status == 400 ? "Bad Request"
                                       : "Error";
  std::string out = StrCat({"HTTP/1.1 ", std::to_string(status), " ", reason,
                            "\r\nContent-Type: application/json\r\nContent-Length: ",
                            std::to_string(r.body.size()), "\r\nConnection: close\r\n\r\n",
                            r.body});
  int fl = fcntl(fd.get(), F_GETFL);
  if (fl >= 0) fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  timeval tv{5, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  (void)WriteAllFd(fd.get(), out, "port proxy error");
  ::shutdown(fd.get(), SHUT_WR);
}

bool HopByHop(const std::string& name) {
  return name == "connection" || name == "keep-alive" || name == "proxy-connection" ||
         name == "te" || name == "trailer" || name == "authorization" || name == "host" ||
         name == "proxy-authorization";
}

}  // namespace

// "/v1/sandboxes/ID/ports/PORT[/rest][?query]": id, port and the upstream target ("/rest?query").
bool ParsePortTarget(const std::string& target, std::string* id, std::string* port,
                     std::string* upstream) {
  constexpr std::string_view kPrefix = "/v1/sandboxes/";
  if (!StartsWith(target, kPrefix)) return false;
  size_t id_end = target.find('/', kPrefix.size());
  if (id_end == std::string::npos || target.compare(id_end, 7, "/ports/") != 0) return false;
  size_t port_start = id_end + 7;
  size_t port_end = target.find_first_of("/?", port_start);
  if (port_end == std::string::npos) port_end = target.size();
  *id = target.substr(kPrefix.size(), id_end - kPrefix.size());
  *port = target.substr(port_start, port_end - port_start);
  std::string rest = target.substr(port_end);
  *upstream = rest.empty() || rest[0] != '/' ? "/" + rest : rest;
  return true;
}

void ServePort(Api* api, HttpRequest req) {
  std::string id, port_text, target;
  ParsePortTarget(req.target, &id, &port_text, &target);
  UniqueFd client = std::move(req.takeover_fd);
  auto fail = [&](const Status& s) {
    auto [status, code] = HttpErrorFor(s);
    if (s.code() == StatusCode::kUnavailable) status = 502, code = "bad_gateway";
    api->deps().metrics->CountRequest(req.method, status);
    SendError(std::move(client), status, code, s.message());
  };
  if (Status s = ValidateId("sandbox id", id); !s.ok()) return fail(s);
  auto port = ParseUint64(port_text);
  if (!port || *port == 0 || *port > 65535)
    return fail(InvalidArgument("port must be 1-65535, not \"" + port_text + "\""));
  auto entry = api->deps().manager->Get(id);
  if (!entry.ok()) return fail(entry.status());
  (*entry)->Touch();
  auto sb = (*entry)->Sandbox(Op::kUse);
  if (!sb.ok()) return fail(sb.status());
  auto upstream = (*sb)->ConnectPort(static_cast<uint16_t>(*port));
  if (!upstream.ok()) return fail(upstream.status());

  // The head as the server in the sandbox sees it.
  std::string head = StrCat({req.method, " ", target, " HTTP/1.1\r\nHost: localhost:",
                             std::to_string(*port), "\r\n"});
  for (const auto& [k, v] : req.headers)
    if (!HopByHop(k) && (req.websocket_upgrade || k != "upgrade"))
      head += StrCat({k, ": ", v, "\r\n"});
  head += StrCat({"X-Forwarded-For: ", req.remote.substr(0, req.remote.rfind(':')),
                  "\r\nX-Forwarded-Prefix: /v1/sandboxes/", id, "/ports/", port_text, "\r\n"});
  head += req.websocket_upgrade ? "Connection: Upgrade\r\n\r\n" : "Connection: close\r\n\r\n";
  head += req.takeover_buffered;
  api->deps().metrics->CountRequest(req.method, 200);
  auto relay = std::make_shared<Relay>(*api->deps().proxy_io, std::move(client),
                                       std::move(*upstream));
  relay->Start(std::move(head));
}

}  // namespace dsec::edge
