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

// Both directions of one proxied connection, each moved by splice(2) through a pipe of its
// own: the bytes never enter the edge's memory. A direction waits until its source is readable
// (pipe empty) or its sink writable (pipe holding data), so a slow reader holds back its writer
// (backpressure; at most a pipe's worth in flight). An end of stream is passed on as a
// half-close once the pipe is drained.
class Relay : public std::enable_shared_from_this<Relay> {
 public:
  Relay(asio::io_context& io, UniqueFd client, UniqueFd upstream)
      : client_(io, client.Release()), upstream_(io, upstream.Release()) {}

  void Start(std::string to_upstream) {
    for (Dir* d : {&up_, &down_}) {
      int p[2];
      if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) return Abort();
      d->r.Reset(p[0]);
      d->w.Reset(p[1]);
      (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);  // fewer wakeups; the default 64 KiB also works
    }
    up_.from = &client_, up_.to = &upstream_;
    down_.from = &upstream_, down_.to = &client_;
    auto self = shared_from_this();
    auto buf = std::make_shared<std::string>(std::move(to_upstream));
    asio::async_write(upstream_, asio::buffer(*buf),
                      [self, buf](boost::system::error_code ec, size_t) {
                        if (ec) return self->Abort();
                        self->Move(self->up_);
                        self->Move(self->down_);
                      });
  }

 private:
  struct Dir {
    Stream *from = nullptr, *to = nullptr;
    UniqueFd r, w;  // the pipe
    size_t in_pipe = 0;
    bool eof = false, done = false;
  };

  // Moves what it can without blocking, then waits for the one event that unblocks it.
  void Move(Dir& d) {
    constexpr unsigned kFlags = SPLICE_F_NONBLOCK | SPLICE_F_MOVE;
    for (;;) {
      bool progress = false;
      if (!d.eof && d.in_pipe < (1 << 20)) {
        ssize_t n = splice(d.from->native_handle(), nullptr, d.w.get(), nullptr,
                           (1 << 20) - d.in_pipe, kFlags);
        if (n > 0) {
          d.in_pipe += static_cast<size_t>(n);
          progress = true;
        } else if (n == 0) {
          d.eof = true;
        } else if (errno != EAGAIN) {
          return Abort();
        }
      }
      if (d.in_pipe > 0) {
        ssize_t m = splice(d.r.get(), nullptr, d.to->native_handle(), nullptr, d.in_pipe, kFlags);
        if (m > 0) {
          d.in_pipe -= static_cast<size_t>(m);
          progress = true;
        } else if (m < 0 && errno != EAGAIN) {
          return Abort();
        }
      }
      if (d.eof && d.in_pipe == 0) {
        ::shutdown(d.to->native_handle(), SHUT_WR);  // pass the end on; the other way goes on
        d.done = true;
        if (up_.done && down_.done) Abort();
        return;
      }
      if (!progress) break;
    }
    auto self = shared_from_this();
    Dir* dp = &d;
    auto next = [self, dp](boost::system::error_code ec) {
      if (ec) return self->Abort();
      self->Move(*dp);
    };
    if (d.in_pipe > 0) {
      d.to->async_wait(Stream::wait_write, next);
    } else {
      d.from->async_wait(Stream::wait_read, next);
    }
  }
  void Abort() {
    boost::system::error_code ec;
    client_.close(ec);
    upstream_.close(ec);
  }

  Stream client_, upstream_;
  Dir up_, down_;
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
  std::string out = StrCat(
      {"HTTP/1.1 ", std::to_string(status), " ", reason,
       "\r\nContent-Type: application/json\r\nContent-Length: ", std::to_string(r.body.size()),
       "\r\nConnection: close\r\n\r\n", r.body});
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
  std::string head = StrCat(
      {req.method, " ", target, " HTTP/1.1\r\nHost: localhost:", std::to_string(*port), "\r\n"});
  for (const auto& [k, v] : req.headers)
    if (!HopByHop(k) && (req.websocket_upgrade || k != "upgrade"))
      head += StrCat({k, ": ", v, "\r\n"});
  head += StrCat({"X-Forwarded-For: ", req.remote.substr(0, req.remote.rfind(':')),
                  "\r\nX-Forwarded-Prefix: /v1/sandboxes/", id, "/ports/", port_text, "\r\n"});
  head += req.websocket_upgrade ? "Connection: Upgrade\r\n\r\n" : "Connection: close\r\n\r\n";
  head += req.takeover_buffered;
  api->deps().metrics->CountRequest(req.method, 200);
  auto relay =
      std::make_shared<Relay>(*api->deps().proxy_io, std::move(client), std::move(*upstream));
  relay->Start(std::move(head));
}

}  // namespace dsec::edge
