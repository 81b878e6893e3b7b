// The one-exchange relay (relay.h) of the port proxy and the apiserver: one exchange, framed by
// parsing, then closed.
#include "http/relay.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/status.hpp>
#include <cstring>
#include <limits>

#include "base/file_util.h"
#include "base/strings.h"
#include "http/client.h"
#include "http/server.h"

namespace dsec::http {

std::string RawResponse(const HttpResponse& r) {
  namespace http = boost::beast::http;
  auto why = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(r.status)));
  std::string out = StrCat({"HTTP/1.1 ", std::to_string(r.status), " ", std::string(why),
                            "\r\nContent-Type: ", r.content_type,
                            "\r\nContent-Length: ", std::to_string(r.body.size()), "\r\n"});
  for (const auto& [k, v] : r.headers) out += StrCat({k, ": ", v, "\r\n"});
  if (r.status == 429) out += "Retry-After: 1\r\n";
  return StrCat({out, "Connection: close\r\n\r\n", r.body});
}

std::string ProxyErrorResponse(int status, std::string_view code, std::string_view message) {
  return RawResponse(JsonError(status, code, message));
}

void SendErrorAndClose(UniqueFd fd, int status, std::string_view code, std::string_view message) {
  SendAndClose(std::move(fd), JsonError(status, code, message));
}

void SendAndClose(UniqueFd fd, const HttpResponse& r) {
  std::string out = RawResponse(r);
  int fl = fcntl(fd.get(), F_GETFL);
  if (fl >= 0) fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  timeval tv{5, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  (void)WriteAllFd(fd.get(), out, "proxy error");
  ::shutdown(fd.get(), SHUT_WR);
}

bool IsHopByHop(std::string_view name) {
  return name == "connection" || name == "keep-alive" || name == "proxy-connection" ||
         name == "te" || name == "trailer" || name == "authorization" || name == "host" ||
         name == "proxy-authorization" || name == "content-length" || name == "transfer-encoding";
}

Status FrameBody(const HttpRequest& req, ProxiedRequest* pr) {
  // The server refused a Transfer-Encoding that does not end in chunked, and conflicting
  // lengths, before the handler saw the request.
  if (!req.Header("transfer-encoding").empty()) {
    pr->body = ProxiedRequest::Body::kChunked;
  } else if (std::string cl = req.Header("content-length"); !cl.empty()) {
    auto len = ParseUint64(std::string(TrimWhitespace(cl.substr(0, cl.find(',')))));
    if (!len) return InvalidArgument("bad Content-Length \"" + cl + "\"");
    pr->body = ProxiedRequest::Body::kLength;
    pr->length = *len;
  }
  return OkStatus();
}

StatusOr<UniqueFd> ConnectUpstream(const std::shared_ptr<HttpClient>& pool, bool upgrade,
                                   ProxiedRequest* pr) {
  auto connect = [pool] { return StartConnect(pool->host(), pool->port()); };
  if (upgrade) return connect();
  pr->upstream_reuse = [pool](UniqueFd fd) { pool->GiveBack(std::move(fd)); };
  if (UniqueFd idle = pool->TakeIdle(); idle.valid()) {
    pr->reconnect = connect;
    return idle;
  }
  return connect();
}

void SetUpstreamHead(const HttpRequest& req, std::string_view target, std::string_view host,
                     const std::vector<std::pair<std::string, std::string>>& extra,
                     std::initializer_list<std::string_view> drop, ProxiedRequest* pr) {
  std::string head = StrCat({req.method, " ", target, " HTTP/1.1\r\nHost: ", host, "\r\n"});
  for (const auto& [k, v] : req.headers) {
    bool dropped = IsHopByHop(k) || (!req.websocket_upgrade && k == "upgrade");
    for (std::string_view d : drop) dropped = dropped || k == d;
    if (!dropped) head += StrCat({k, ": ", v, "\r\n"});
  }
  for (const auto& [k, v] : extra) head += StrCat({k, ": ", v, "\r\n"});
  if (pr->body == ProxiedRequest::Body::kChunked) head += "Transfer-Encoding: chunked\r\n";
  if (pr->body == ProxiedRequest::Body::kLength)
    head += "Content-Length: " + std::to_string(pr->length) + "\r\n";
  head += req.websocket_upgrade ? "Connection: Upgrade\r\n\r\n"
          : pr->upstream_reuse  ? "\r\n"
                                : "Connection: close\r\n\r\n";
  pr->head = std::move(head);
  pr->upgrade = req.websocket_upgrade;
  pr->head_method = req.method == "HEAD";
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Stream = asio::posix::stream_descriptor;
using Strand = asio::strand<asio::io_context::executor_type>;

// A Beast parser that keeps the head and lets the body through uncopied: the relay forwards
// the bytes the parser consumed, as they came.
template <bool isRequest>
class Framer : public http::basic_parser<isRequest> {
 public:
  Framer() {
    // A number, not boost::none: Boost 1.74 compares lengths against the optional itself, and
    // any length is "greater" than none.
    this->body_limit(std::numeric_limits<uint64_t>::max());
    this->header_limit(static_cast<uint32_t>(kMaxHeadBytes));
  }
  int status = 0;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> fields;

 private:
  using Ec = beast::error_code;
  using Sv = beast::string_view;
  void on_request_impl(http::verb, Sv, Sv, int, Ec&) override {}
  void on_response_impl(int code, Sv why, int, Ec&) override {
    status = code;
    reason = std::string(why);
  }
  void on_field_impl(http::field, Sv name, Sv value, Ec&) override {
    fields.emplace_back(std::string(name), std::string(value));
  }
  void on_header_impl(Ec&) override {}
  void on_body_init_impl(const boost::optional<uint64_t>&, Ec&) override {}
  size_t on_body_impl(Sv body, Ec&) override { return body.size(); }
  void on_chunk_header_impl(uint64_t, Sv, Ec&) override {}
  size_t on_chunk_body_impl(uint64_t, Sv body, Ec&) override { return body.size(); }
  void on_finish_impl(Ec&) override {}
};

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kMaxHeld = 64 << 10;              // client bytes waiting for a 101
constexpr auto kLinger = std::chrono::seconds(5);  // reading a closing client's leftovers

}  // namespace

class PortRelay : public std::enable_shared_from_this<PortRelay> {
 public:
  PortRelay(asio::io_context& io, UniqueFd client, UniqueFd upstream, ProxiedRequest req,
            std::shared_ptr<void> slot, std::function<void(int)> outcome)
      : io_(io),
        strand_(asio::make_strand(io)),
        client_(strand_, client.Release()),
        upstream_(strand_, upstream.Release()),
        timer_(strand_),
        req_(std::move(req)),
        slot_(std::move(slot)),
        outcome_(std::move(outcome)) {}

  void Start(std::chrono::milliseconds connect_timeout) {
    connect_timeout_ = connect_timeout;
    // A pooled upstream connection may be found closed: the request is kept to send again
    // when all of it is in memory.
    if (req_.reconnect && !req_.upgrade &&
        (req_.body == ProxiedRequest::Body::kNone ||
         (req_.body == ProxiedRequest::Body::kLength && req_.length <= req_.buffered.size())))
      replay_ = std::make_unique<ProxiedRequest>(req_);
    auto self = shared_from_this();
    asio::dispatch(strand_, [self, connect_timeout] { self->Connect(connect_timeout); });
  }

 private:
  enum class Mode {
    kHead,   // reading a response head (down only)
    kCount,  // a body of known length: `remaining` more bytes, spliced
    kParse,  // a chunked body, through the parser
    kRaw,    // everything until the end of stream (an upgrade, or a response without length)
    kHold,   // the request ended: the client's further bytes are held for a 101 or dropped
    kStop,   // nothing more is read
  };
  struct Dir {
    Stream *from = nullptr, *to = nullptr;
    UniqueFd r, w;  // the pipe
    size_t cap = 0, in_pipe = 0;
    Mode mode = Mode::kStop;
    uint64_t remaining = 0;
    std::string in;         // read from `from`, not yet taken by the parser
    std::string out;        // for `to`, not yet in the pipe
    bool ended = false;     // the message (or raw stream) ended: finish once out and pipe drain
    bool finished = false;  // ... and did
    bool waiting_read = false, waiting_write = false;
  };

  // 1. The connect into the sandbox, with a deadline; no thread waits for it.
  void Connect(std::chrono::milliseconds timeout) {
    auto self = shared_from_this();
    timer_.expires_after(timeout);
    timer_.async_wait([self, timeout](beast::error_code ec) {
      if (ec || self->connected_ || self->closed_) return;
      self->Fail(504, "gateway_timeout",
                 StrCat({"the server on ", self->req_.target_name,
                         " did not accept the connection within ", std::to_string(timeout.count()),
                         " ms"}));
    });
    upstream_.async_wait(Stream::wait_write, [self](beast::error_code ec) {
      if (self->closed_ || self->connected_ || self->head_sent_) return;
      if (ec) return self->Close();
      int err = 0;
      socklen_t len = sizeof err;
      if (getsockopt(self->upstream_.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
      if (err != 0 && self->Restart()) return;
      if (err == ECONNREFUSED)
        return self->Fail(502, "bad_gateway", "nothing listens on " + self->req_.target_name);
      if (err != 0)
        return self->Fail(502, "bad_gateway",
                          StrCat({"connect to ", self->req_.target_name, ": ", strerror(err)}));
      self->connected_ = true;
      self->timer_.cancel();
      self->Begin();
    });
  }

  // 2. Both directions: the request's head and body up, the response down.
  void Begin() {
    for (Dir* d : {&up_, &down_}) {
      int p[2];
      if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) return Close();
      d->r.Reset(p[0]);
      d->w.Reset(p[1]);
      int cap = fcntl(p[1], F_SETPIPE_SZ, static_cast<int>(kPipeBytes));
      d->cap = cap > 0 ? static_cast<size_t>(cap) : 64 << 10;
    }
    up_.from = &client_, up_.to = &upstream_;
    down_.from = &upstream_, down_.to = &client_;
    up_.out = std::move(req_.head);
    switch (req_.body) {
      case ProxiedRequest::Body::kNone:
        up_.mode = Mode::kHold;
        break;
      case ProxiedRequest::Body::kLength:
        up_.mode = Mode::kCount;
        up_.remaining = req_.length;
        if (req_.length == 0) up_.mode = Mode::kHold;
        break;
      case ProxiedRequest::Body::kChunked: {
        up_.mode = Mode::kParse;
        req_parser_ = std::make_unique<Framer<true>>();
        const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        beast::error_code ec;
        req_parser_->put(asio::buffer(head), ec);
        req_parser_->eager(true);
        break;
      }
    }
    // What the client sent past its head is input like any other.
    TakeInput(up_, std::move(req_.buffered));
    NewResponseParser();
    down_.mode = Mode::kHead;
    Pump(up_);
    Pump(down_);
  }

  void NewResponseParser() {
    resp_parser_ = std::make_unique<Framer<false>>();
    if (req_.head_method) resp_parser_->skip(true);
  }

  // Bytes read from d.from (or handed over) go where d's mode says.
  void TakeInput(Dir& d, std::string data) {
    if (data.empty() || closed_) return;
    switch (d.mode) {
      case Mode::kCount: {
        size_t k = static_cast<size_t>(std::min<uint64_t>(d.remaining, data.size()));
        d.out.append(data, 0, k);
        d.remaining -= k;
        if (d.remaining == 0) MessageEnded(d);
        if (k < data.size() && &d == &up_) TakeInput(d, data.substr(k));  // pipelined: held
        return;
      }
      case Mode::kRaw:
        d.out += data;
        return;
      case Mode::kHold:
        // A WebSocket upgrade's early frames are kept (for after the 101), and with keep-alive
        // the client's next request (for the server it goes back to); otherwise the bytes of a
        // pipelined request are dropped: this connection serves one exchange.
        if (Holding() && held_.size() + data.size() <= kMaxHeld) held_ += data;
        return;
      case Mode::kHead:
      case Mode::kParse:
        d.in += data;
        return Parse(d);
      case Mode::kStop:
        return;
    }
  }

  void Parse(Dir& d) {
    while (!closed_ && !d.in.empty()) {
      if (d.mode == Mode::kHead) {
        beast::error_code ec;
        size_t used = resp_parser_->put(asio::buffer(d.in), ec);
        if (ec == http::error::need_more) {
          // Beast takes the status line and whole fields of a head still incomplete (they are
          // in the parser's state now): they must not be given to it again. (Fed twice, they
          // read as a malformed head: "bad field", a 502 for a response split after a line.)
          d.in.erase(0, used);
          return;
        }
        if (ec)
          return Fail(502, "bad_gateway",
                      StrCat({"the server on ", req_.target_name,
                              " sent a malformed response head: ", ec.message()}));
        std::string rest = d.in.substr(used);
        d.in.clear();
        OnResponseHead(rest);
        continue;
      }
      if (d.mode != Mode::kParse) return;
      auto* parser =
          &d == &up_ ? static_cast<http::basic_parser<true>*>(req_parser_.get()) : nullptr;
      beast::error_code ec;
      size_t used =
          parser ? parser->put(asio::buffer(d.in), ec) : resp_parser_->put(asio::buffer(d.in), ec);
      if (ec && ec != http::error::need_more) return Close();  // mid-body: nothing to say
      d.out.append(d.in, 0, used);
      d.in.erase(0, used);
      bool done = parser ? parser->is_done() : resp_parser_->is_done();
      if (done) {
        std::string rest = std::move(d.in);
        d.in.clear();
        MessageEnded(d);
        if (&d == &up_) TakeInput(d, std::move(rest));
        return;
      }
      if (ec == http::error::need_more || used == 0) return;
    }
  }

  // The response's head is in: interim heads pass on, a 101 turns both ways raw, any other
  // is rewritten to close the client's connection once its body ends.
  void OnResponseHead(std::string rest) {
    const int status = resp_parser_->status;
    if (status >= 100 && status < 200 && status != 101) {
      down_.out += Head(Kind::kInterim);
      NewResponseParser();
      if (!rest.empty()) TakeInput(down_, std::move(rest));
      return;
    }
    if (status == 101 && !req_.upgrade)
      return Fail(502, "bad_gateway",
                  "the server on " + req_.target_name +
                      " switched protocols for a request that did not ask to");
    head_sent_ = true;
    Report(status);
    if (status == 101) {
      down_.out += Head(Kind::kUpgrade);
      down_.mode = Mode::kRaw;
      TakeInput(down_, std::move(rest));
      upgraded_ = true;
      up_.mode = Mode::kRaw;
      TakeInput(up_, std::move(held_));
      held_.clear();
      return Pump(up_);
    }
    // Keep-alive toward the client only where the response's own framing ends it.
    const bool framed = resp_parser_->is_done() || resp_parser_->chunked() ||
                        resp_parser_->content_length().has_value();
    keep_client_ = req_.reuse && framed;
    keep_upstream_ = req_.upstream_reuse && framed && resp_parser_->keep_alive();
    down_.out += Head(keep_client_ ? Kind::kKeep : Kind::kFinal);
    if (resp_parser_->is_done()) return MessageEnded(down_);
    if (resp_parser_->chunked()) {
      down_.mode = Mode::kParse;
      resp_parser_->eager(true);
    } else if (auto len = resp_parser_->content_length()) {
      down_.mode = Mode::kCount;
      down_.remaining = *len;
    } else {
      down_.mode = Mode::kRaw;  // delimited by the end of the stream
    }
    TakeInput(down_, std::move(rest));
  }

  // The response head the client gets.
  enum class Kind { kInterim, kUpgrade, kFinal, kKeep };
  std::string Head(Kind kind) const {
    const bool upgrade = kind == Kind::kUpgrade;
    std::string h = StrCat(
        {"HTTP/1.1 ", std::to_string(resp_parser_->status), " ", resp_parser_->reason, "\r\n"});
    for (const auto& [name, value] : resp_parser_->fields) {
      if (beast::iequals(name, "connection") || beast::iequals(name, "keep-alive") ||
          beast::iequals(name, "proxy-connection"))
        continue;
      if (beast::iequals(name, "upgrade") && !upgrade) continue;
      h += StrCat({name, ": ", value, "\r\n"});
    }
    return h + (kind == Kind::kInterim || kind == Kind::kKeep ? "\r\n"
                : upgrade                                     ? "Connection: Upgrade\r\n\r\n"
                                                              : "Connection: close\r\n\r\n");
  }

  void MessageEnded(Dir& d) {
    if (&d == &up_ && !upgraded_) {
      d.mode = Mode::kHold;  // the request is complete; the exchange goes on
      return;
    }
    d.ended = true;
    d.mode = Mode::kStop;
  }

  // Moves what it can without blocking, then waits for the one event that unblocks it.
  void Pump(Dir& d) {
    if (closed_ || lingering_ || d.finished) return;
    for (;;) {
      bool progress = false;
      if (!d.out.empty()) {
        ssize_t n = write(d.w.get(), d.out.data(), d.out.size());
        if (n > 0) {
          d.out.erase(0, static_cast<size_t>(n));
          d.in_pipe += static_cast<size_t>(n);
          progress = true;
        } else if (n < 0 && errno != EAGAIN) {
          return Close();
        }
      }
      if (d.out.empty() && Reading(d) && d.in_pipe < d.cap) {
        int r = ReadSome(d);
        if (r < 0 || closed_) return;
        progress |= r > 0;
      }
      if (d.in_pipe > 0) {
        ssize_t m = splice(d.r.get(), nullptr, d.to->native_handle(), nullptr, d.in_pipe,
                           SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
        if (m > 0) {
          d.in_pipe -= static_cast<size_t>(m);
          progress = true;
        } else if (m < 0 && errno != EAGAIN) {
          if (&d == &up_) return UpstreamBroken(errno);
          return Close();
        }
      }
      if (d.ended && d.out.empty() && d.in_pipe == 0) return Finished(d);
      if (!progress) break;
    }
    if (d.in_pipe > 0 || !d.out.empty()) {
      WaitThenPump(d, d.to, Stream::wait_write, &d.waiting_write);
    } else if (Reading(d)) {
      WaitThenPump(d, d.from, Stream::wait_read, &d.waiting_read);
    }
  }

  // One wait at a time per stream and direction (`pending` says whether it is out).
  void WaitThenPump(Dir& d, Stream* s, Stream::wait_type what, bool* pending) {
    if (*pending) return;
    *pending = true;
    auto self = shared_from_this();
    Dir* dp = &d;
    s->async_wait(what, [self, dp, pending](beast::error_code ec) {
      *pending = false;
      if (ec == asio::error::operation_aborted) return;
      if (ec) return self->Close();
      self->Pump(*dp);
    });
  }

  bool Reading(const Dir& d) const {
    if (d.mode == Mode::kStop) return false;  // (also once the message ended)
    // Early frames of an upgrade are held up to a bound; past it the client waits.
    if (d.mode == Mode::kHold && Holding() && held_.size() >= kMaxHeld) return false;
    return true;
  }

  bool Holding() const { return req_.upgrade || static_cast<bool>(req_.reuse); }

  // One read from d.from: > 0 progress, 0 nothing now, < 0 the relay ended.
  int ReadSome(Dir& d) {
    const size_t room = d.cap - d.in_pipe;
    if (d.mode == Mode::kCount || d.mode == Mode::kRaw) {
      size_t want = d.mode == Mode::kCount
                        ? static_cast<size_t>(std::min<uint64_t>(d.remaining, room))
                        : room;
      ssize_t n = splice(d.from->native_handle(), nullptr, d.w.get(), nullptr, want,
                         SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
      if (n > 0) {
        if (&d == &down_) got_response_ = true;
        d.in_pipe += static_cast<size_t>(n);
        if (d.mode == Mode::kCount && (d.remaining -= static_cast<uint64_t>(n)) == 0)
          MessageEnded(d);
        return 1;
      }
      if (n < 0) return errno == EAGAIN ? 0 : (ReadFailed(d, errno), -1);
      return AtEof(d);
    }
    char buf[kReadChunk];
    size_t want = std::min(room, sizeof buf);
    if (d.mode == Mode::kHold && Holding()) want = std::min(want, kMaxHeld - held_.size());
    ssize_t n = recv(d.from->native_handle(), buf, want, MSG_DONTWAIT);
    if (n > 0) {
      if (&d == &down_) got_response_ = true;
      TakeInput(d, std::string(buf, static_cast<size_t>(n)));
      return 1;
    }
    if (n < 0) return errno == EAGAIN ? 0 : (ReadFailed(d, errno), -1);
    return AtEof(d);
  }

  int AtEof(Dir& d) {
    if (&d == &up_) {
      if (upgraded_ && d.mode == Mode::kRaw) {
        MessageEnded(d);  // a half-close, passed on; the other way goes on
        return 0;
      }
      // The client went away before the response ended (or cut its request short): the
      // exchange is abandoned, and what it held is let go at once (a server that never answers
      // must not keep it).
      Close();
      return -1;
    }
    if (d.mode == Mode::kRaw) {
      MessageEnded(d);
      return 0;
    }
    if (d.mode == Mode::kParse) {
      beast::error_code ec;
      resp_parser_->put_eof(ec);
      if (!ec) {
        MessageEnded(d);
        return 0;
      }
    }
    if (d.mode == Mode::kHead && !head_sent_) {
      if (Restart()) return -1;
      Fail(502, "bad_gateway",
           "the server on " + req_.target_name + " closed the connection without a response");
      return -1;
    }
    Close();  // a response cut short: the client sees its connection end
    return -1;
  }

  void Finished(Dir& d) {
    d.finished = true;
    if (upgraded_) {
      ::shutdown(d.to->native_handle(), SHUT_WR);  // the other way goes on
      if (up_.finished && down_.finished) Close();
      return;
    }
    if (&d != &down_) return;
    const bool request_out = up_.mode == Mode::kHold && up_.out.empty() && up_.in_pipe == 0;
    // The upstream connection, at a message boundary in both directions, goes to its pool.
    if (keep_upstream_ && request_out && down_.in.empty()) {
      UniqueFd upstream(upstream_.release());
      auto give = std::move(req_.upstream_reuse);
      give(std::move(upstream));
    }
    // The response is out; with keep-alive, and the request read whole, the connection goes
    // back to the client's server for its next request.
    if (keep_client_ && request_out) return HandBack();
    Linger();
  }

  void HandBack() {
    closed_ = true;  // nothing here touches either connection again
    beast::error_code ec;
    timer_.cancel();
    upstream_.close(ec);
    UniqueFd client(client_.release());  // (its pending waits end, aborted)
    auto reuse = std::move(req_.reuse);
    reuse(std::move(client), std::move(held_));
  }

  // The response is out: the sandbox's side closes, the client's after its unread bytes are
  // drained (closing with unread data would reset the connection and could lose the response).
  void Linger() {
    beast::error_code ec;
    upstream_.close(ec);
    up_.mode = Mode::kStop;
    ::shutdown(client_.native_handle(), SHUT_WR);
    lingering_ = true;
    timer_.expires_after(kLinger);
    auto self = shared_from_this();
    timer_.async_wait([self](beast::error_code e) {
      if (!e) self->Close();
    });
    DrainClient();
  }

  void DrainClient() {
    for (;;) {
      char buf[4096];
      ssize_t n = recv(client_.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EAGAIN) break;
      return Close();  // end of stream or an error: done
    }
    auto self = shared_from_this();
    client_.async_wait(Stream::wait_read, [self](beast::error_code ec) {
      if (ec == asio::error::operation_aborted && !self->closed_) return self->DrainClient();
      if (ec) return self->Close();
      self->DrainClient();
    });
  }

  // A read from `d.from` failed (not at its end).
  void ReadFailed(Dir& d, int err) {
    if (&d == &down_) return UpstreamBroken(err);
    Close();
  }

  // The upstream connection failed (a reset, a broken pipe): a pooled one is replaced when it
  // can be; before any response the client gets a 502, after one its connection ends.
  void UpstreamBroken(int err) {
    if (Restart()) return;
    if (head_sent_) return Close();
    Fail(502, "bad_gateway",
         StrCat({"the connection to the server on ", req_.target_name,
                 " failed before a response: ", strerror(err)}));
  }

  // The pooled upstream connection was found closed before any byte of a response: the whole
  // request (kept in replay_) goes again, once, on a fresh connection, in a new relay that
  // takes over the client, the slot and the outcome. False when that is not possible.
  bool Restart() {
    if (!replay_ || got_response_ || head_sent_ || closed_) return false;
    ProxiedRequest again = std::move(*replay_);
    replay_.reset();
    auto fresh = again.reconnect();
    if (!fresh.ok()) return false;
    again.reconnect = nullptr;  // once
    // The client's bytes read since (its next request, with keep-alive) follow the request.
    again.buffered += held_;
    closed_ = true;
    beast::error_code ec;
    timer_.cancel();
    upstream_.close(ec);
    UniqueFd client(client_.release());  // (its pending waits end, aborted)
    StartPortRelay(io_, std::move(client), std::move(*fresh), std::move(again), connect_timeout_,
                   std::move(slot_), std::move(outcome_));
    return true;
  }

  // An error from the edge itself, when the client has seen nothing of a response yet.
  void Fail(int status, std::string_view code, const std::string& message) {
    if (closed_) return;
    if (head_sent_) return Close();
    Report(status);
    head_sent_ = true;
    beast::error_code ec;
    upstream_.close(ec);
    timer_.cancel();
    if (down_.cap == 0) {
      // Before Begin: write it directly (a few hundred bytes into an empty socket buffer).
      std::string out = ProxyErrorResponse(status, code, message);
      (void)send(client_.native_handle(), out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      return Linger();
    }
    down_.in.clear();
    down_.out = ProxyErrorResponse(status, code, message);
    down_.in_pipe = 0;  // what is in the pipe is dropped
    for (char buf[4096]; read(down_.r.get(), buf, sizeof buf) > 0;) {
    }
    down_.mode = Mode::kStop;
    down_.ended = true;
    up_.mode = Mode::kStop;
    Pump(down_);
  }

  void Report(int status) {
    if (reported_) return;
    reported_ = true;
    if (outcome_) outcome_(status);
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    Report(0);
    beast::error_code ec;
    timer_.cancel();
    client_.close(ec);
    upstream_.close(ec);
  }

  asio::io_context& io_;
  Strand strand_;
  Stream client_, upstream_;
  asio::steady_timer timer_;
  ProxiedRequest req_;
  std::shared_ptr<void> slot_;
  std::function<void(int)> outcome_;
  std::unique_ptr<Framer<true>> req_parser_;
  std::unique_ptr<Framer<false>> resp_parser_;
  Dir up_, down_;
  std::string held_;                        // client bytes after an upgrade request, until the 101
  std::unique_ptr<ProxiedRequest> replay_;  // the request as it came, to send again (Restart)
  std::chrono::milliseconds connect_timeout_{0};
  bool connected_ = false, closed_ = false, head_sent_ = false, upgraded_ = false;
  bool reported_ = false, lingering_ = false, keep_client_ = false, keep_upstream_ = false;
  bool got_response_ = false;  // a byte of the response came from upstream
};

void StartPortRelay(asio::io_context& io, UniqueFd client, UniqueFd upstream, ProxiedRequest req,
                    std::chrono::milliseconds connect_timeout, std::shared_ptr<void> slot,
                    std::function<void(int status)> outcome) {
  auto relay = std::make_shared<PortRelay>(io, std::move(client), std::move(upstream),
                                           std::move(req), std::move(slot), std::move(outcome));
  relay->Start(connect_timeout);
}

}  // namespace dsec::http
