#include "edge/http_server.h"

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
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "base/file_util.h"
#include "base/logging.h"
#include "edge/config.h"
#include "edge/http_parse.h"

namespace dsec::edge {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using unix_proto = asio::local::stream_protocol;

namespace {
constexpr int kBodyTimeoutS = 600;
constexpr int kAcceptRetryMs = 100;
constexpr int kFirstRequestTimeoutS = 15;
// Output queued for one slow client (a streamed exec or an attach) beyond this drops the client
// (which kills its command): the code in the sandbox must not be able to grow our memory.
constexpr size_t kMaxQueuedOutput = 32 << 20;
}  // namespace

HttpResponse JsonError(int status, std::string_view code, std::string_view message) {
  HttpResponse r;
  r.status = status;
  r.body = nlohmann::json({{"error", {{"code", code}, {"message", message}}}})
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  auto hex = [](char h) -> int {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
  };
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      *out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      *out += (c == '+' && plus_is_space) ? ' ' : c;
    }
  }
  return true;
}

bool RequestFromHead(const http::request_header<>& h, HttpRequest* req, HttpResponse* error) {
  req->method = std::string(h.method_string());
  req->target = std::string(h.target());
  for (const auto& f : h) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    req->headers.emplace_back(std::move(name), std::string(f.value()));
  }
  std::string_view target = req->target;
  size_t q = target.find('?');
  if (!PercentDecode(target.substr(0, q), false, &req->path) ||
      req->path.find('\0') != std::string::npos) {
    *error = JsonError(400, "bad_request", "bad percent-encoding in the path");
    return false;
  }
  if (q != std::string_view::npos) {
    std::string_view qs = target.substr(q + 1);
    while (!qs.empty()) {
      size_t amp = qs.find('&');
      std::string_view part = qs.substr(0, amp);
      qs = amp == std::string_view::npos ? std::string_view() : qs.substr(amp + 1);
      if (part.empty()) continue;
      size_t eq = part.find('=');
      std::string k, v;
      if (!PercentDecode(part.substr(0, eq), true, &k) ||
          (eq != std::string_view::npos && !PercentDecode(part.substr(eq + 1), true, &v))) {
        *error = JsonError(400, "bad_request", "bad percent-encoding in the query");
        return false;
      }
      req->query.emplace_back(std::move(k), std::move(v));
    }
  }
  req->websocket_upgrade = websocket::is_upgrade(h);
  return true;
}

const std::string* HttpRequest::Query(std::string_view name) const {
  for (const auto& [k, v] : query)
    if (k == name) return &v;
  return nullptr;
}

std::vector<std::string> HttpRequest::QueryAll(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : query)
    if (k == name) out.push_back(v);
  return out;
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

// ---------------------------------------------------------------------------------------------

class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual void Close() = 0;  // from any thread
};

struct HttpServer::Impl {
  HttpServerOptions opts;
  PreflightFn preflight;
  HandlerFn handler;
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::unique_ptr<tcp::acceptor> tcp_acceptor;
  std::unique_ptr<unix_proto::acceptor> unix_acceptor;
  std::unique_ptr<asio::steady_timer> tcp_retry, unix_retry;
  std::atomic<int64_t> conns{0};
  // Bodies being spooled (HttpServerOptions::max_spooled and max_spooled_uploads).
  std::atomic<int> spooling{0}, spooling_uploads{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::unordered_map<SessionBase*, std::weak_ptr<SessionBase>> sessions;  // GUARDED_BY(mu)
  // A descriptor held in reserve: out of descriptors, it is given up for a moment at a time to
  // accept the waiting connections and refuse them (503), instead of leaving their clients
  // hanging in the listen backlog until descriptors come back.
  //
  // Any other thread may take the slot while it is given up (a handler opening a file), and the
  // reserve is then lost until a descriptor frees. So it is taken back before every accept
  // retry, and a connection accepted while it is missing is refused so that its descriptor
  // becomes the reserve: otherwise connections held open by clients could use up every
  // descriptor and leave the rest of the backlog unanswered for as long as they stay.
  std::mutex reserve_mu;
  int reserve_fd = -1;  // GUARDED_BY(reserve_mu)
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
    std::lock_guard<std::mutex> l(mu);
    sessions[s.get()] = s;
  }
  void Unregister(SessionBase* s) {
    std::lock_guard<std::mutex> l(mu);
    sessions.erase(s);
  }
  template <class Socket>
  void StartSession(Socket sock, bool via_unix, uid_t uid, std::string remote);
  void AcceptTcp();
  void AcceptUnix();
};

// A WebSocket connection after the upgrade.
template <class Socket>
class WsSession : public SessionBase, public WebSocketConn {
 public:
  WsSession(HttpServer::Impl* srv, Socket sock, std::shared_ptr<WebSocketHandler> h)
      : srv_(srv), ws_(std::move(sock)), h_(std::move(h)) {}
  ~WsSession() override { srv_->conns--; }

  void Accept(http::request<http::string_body> req) {
    srv_->Register(shared_from_this());
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(srv_->opts.max_websocket_message);
    auto self = Self();
    req_ = std::move(req);
    ws_.async_accept(req_, [self](beast::error_code ec) {
      if (ec) return self->Finish();
      self->open_ = true;
      self->h_->OnOpen(
          std::shared_ptr<WebSocketConn>(self, static_cast<WebSocketConn*>(self.get())));
      self->DoRead();
    });
  }

  void Send(std::string data, bool binary) override {
    auto self = Self();
    asio::post(ws_.get_executor(), [self, d = std::move(data), binary]() mutable {
      if (self->finished_) return;
      self->queued_ += d.size();
      self->out_.emplace_back(std::move(d), binary);
      if (self->queued_ > kMaxQueuedOutput) return self->Abort();  // a reader this slow
      self->Pump();
    });
  }
  void Close() override {
    auto self = Self();
    asio::post(ws_.get_executor(), [self] {
      if (self->finished_) return;
      self->close_requested_ = true;
      if (!self->open_) return self->Abort();
      self->Pump();
    });
  }

 private:
  std::shared_ptr<WsSession> Self() {
    return std::static_pointer_cast<WsSession>(shared_from_this());
  }
  void DoRead() {
    auto self = Self();
    ws_.async_read(rbuf_, [self](beast::error_code ec, size_t) {
      if (ec) return self->Finish();
      bool binary = self->ws_.got_binary();
      std::string data = beast::buffers_to_string(self->rbuf_.data());
      self->rbuf_.consume(self->rbuf_.size());
      if (self->h_) self->h_->OnMessage(std::move(data), binary);
      self->DoRead();
    });
  }
  void Pump() {
    if (writing_ || finished_) return;
    auto self = Self();
    if (!out_.empty()) {
      writing_ = true;
      ws_.binary(out_.front().second);
      ws_.async_write(asio::buffer(out_.front().first), [self](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (!self->out_.empty()) {
          self->queued_ -= self->out_.front().first.size();
          self->out_.pop_front();
        }
        if (ec) return self->Finish();
        self->Pump();
      });
      return;
    }
    if (close_requested_ && !close_sent_) {
      close_sent_ = true;
      writing_ = true;
      ws_.async_close(websocket::close_code::normal, [self](beast::error_code) {
        self->writing_ = false;
        // The read loop ends when the peer answers the close (or the timeout fires).
      });
    }
  }
  void Abort() {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).close(ec);
    Finish();
  }
  void Finish() {
    if (finished_) return;
    finished_ = true;
    // A write in flight still reads out_.front(): its completion drops it.
    if (writing_ && !out_.empty()) {
      out_.erase(std::next(out_.begin()), out_.end());
    } else {
      out_.clear();
    }
    if (h_) {
      auto h = std::move(h_);
      h->OnClose();
    }
    srv_->Unregister(this);
  }

  HttpServer::Impl* srv_;
  websocket::stream<Socket> ws_;
  std::shared_ptr<WebSocketHandler> h_;
  http::request<http::string_body> req_;
  beast::flat_buffer rbuf_;
  std::deque<std::pair<std::string, bool>> out_;
  size_t queued_ = 0;  // bytes in out_
  bool writing_ = false, open_ = false, close_requested_ = false, close_sent_ = false;
  bool finished_ = false;
};

template <class Socket>
class HttpSession : public SessionBase {
 public:
  HttpSession(HttpServer::Impl* srv, Socket sock, bool via_unix, uid_t uid, std::string remote,
              bool over_limit)
      : srv_(srv),
        sock_(std::move(sock)),
        timer_(sock_.get_executor()),
        via_unix_(via_unix),
        peer_uid_(uid),
        remote_(std::move(remote)),
        over_limit_(over_limit) {}
  ~HttpSession() override {
    if (!upgraded_) srv_->conns--;
  }

  void Start() {
    srv_->Register(shared_from_this());
    if (over_limit_) {
      // Refuse at once: waiting for its headers would let a flood of idle connections hold
      // our descriptors for the whole read timeout.
      HttpResponse r = JsonError(503, "unavailable", "too many connections");
      r.headers.emplace_back("Retry-After", "1");
      return Reject(std::move(r));
    }
    DoRead();
  }

  void Close() override {
    auto self = Self();
    asio::post(sock_.get_executor(), [self] { self->Shutdown(); });
  }

  // --- Responder operations; run on the strand. `seq` ties them to one request. ---
  void DoSend(uint64_t seq, HttpResponse r) {
    if (seq != seq_ || phase_ != Phase::kHandling || closed_) return;
    WriteResponse(std::move(r));
  }
  void DoStartStream(uint64_t seq, int status, std::string ctype,
                     std::vector<std::pair<std::string, std::string>> headers) {
    if (seq != seq_ || phase_ != Phase::kHandling || closed_) return;
    phase_ = Phase::kStreaming;
    stream_res_ =
        std::make_unique<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
    stream_res_->set(http::field::server, "dsec-edge");
    stream_res_->set(http::field::content_type, ctype);
    for (auto& [k, v] : headers) stream_res_->set(k, v);
    stream_res_->chunked(true);
    stream_res_->keep_alive(keep_alive_);
    stream_sr_ = std::make_unique<http::response_serializer<http::empty_body>>(*stream_res_);
    writing_ = true;
    auto self = Self();
    http::async_write_header(sock_, *stream_sr_, [self](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->Disconnected();
      self->PumpStream();
    });
  }
  void DoWrite(uint64_t seq, std::string chunk) {
    if (seq != seq_ || phase_ != Phase::kStreaming || closed_ || chunk.empty()) return;
    queued_ += chunk.size();
    chunks_.push_back(std::move(chunk));
    if (queued_ > kMaxQueuedOutput) return Disconnected();  // a reader this slow is gone
    PumpStream();
  }
  void DoEnd(uint64_t seq, std::string last) {
    if (seq != seq_ || closed_) return;
    if (phase_ == Phase::kHandling) {  // End without StartStream: an empty 200
      HttpResponse r;
      r.body = std::move(last);
      return WriteResponse(std::move(r));
    }
    if (phase_ != Phase::kStreaming) return;
    if (!last.empty()) {
      queued_ += last.size();
      chunks_.push_back(std::move(last));
    }
    end_requested_ = true;
    PumpStream();
  }
  void DoOnDisconnect(uint64_t seq, std::function<void()> cb) {
    if (seq != seq_) return;
    if (closed_) {
      if (cb) cb();
      return;
    }
    on_disconnect_ = std::move(cb);
    if (!watching_) Watch();
  }
  void DoAcceptWebSocket(uint64_t seq, std::shared_ptr<WebSocketHandler> h) {
    if (seq != seq_ || phase_ != Phase::kHandling || closed_ || !raw_req_) {
      if (h) h->OnClose();
      return;
    }
    if (watching_) {
      beast::error_code ec;
      sock_.cancel(ec);
    }
    timer_.cancel();
    upgraded_ = true;
    phase_ = Phase::kDone;
    closed_ = true;
    auto ws = std::make_shared<WsSession<Socket>>(srv_, std::move(sock_), std::move(h));
    srv_->Unregister(this);
    ws->Accept(std::move(*raw_req_));
  }

 private:
  enum class Phase { kReading, kHandling, kStreaming, kWriting, kDone };

  std::shared_ptr<HttpSession> Self() {
    return std::static_pointer_cast<HttpSession>(shared_from_this());
  }

  void ArmTimer(int seconds) {
    uint64_t gen = ++timer_gen_;
    timer_.expires_after(std::chrono::seconds(seconds));
    auto self = Self();
    timer_.async_wait([self, gen](beast::error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      if (self->phase_ == Phase::kReading) self->Shutdown();
    });
  }
  void DisarmTimer() {
    ++timer_gen_;
    timer_.cancel();
  }

  void DoRead() {
    phase_ = Phase::kReading;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(srv_->opts.max_header_bytes));
    // The real limit is set once the route is known (preflight); Content-Length is checked
    // against it before any body byte is read.
    parser_->body_limit((std::numeric_limits<uint64_t>::max)());
    raw_req_.reset();
    // A new connection must send its first request promptly (slow-header floods); between
    // keep-alive requests the longer idle timeout applies.
    ArmTimer(requests_ == 0 ? std::min(srv_->opts.idle_timeout_s, kFirstRequestTimeoutS)
                            : srv_->opts.idle_timeout_s);
    auto self = Self();
    http::async_read_header(sock_, buf_, *parser_,
                            [self](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void Reject(HttpResponse r) {
    r.close = true;
    phase_ = Phase::kHandling;
    WriteResponse(std::move(r));
  }

  void OnHeader(beast::error_code ec) {
    if (ec == http::error::header_limit)
      return Reject(JsonError(413, "too_large", "request headers are too large"));
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset)
      return Shutdown();
    if (ec) return Reject(JsonError(400, "bad_request", "malformed HTTP request: " + ec.message()));
    ++requests_;
    auto& h = parser_->get();
    HttpRequest req;
    req.via_unix = via_unix_;
    req.peer_uid = peer_uid_;
    req.remote = remote_;
    if (HttpResponse bad; !RequestFromHead(h, &req, &bad)) return Reject(std::move(bad));
    // A Transfer-Encoding that does not end in chunked leaves the body's length unknown: Beast
    // would read no body and parse the body's bytes as the next request (a smuggling vector
    // behind any proxy that frames it otherwise). RFC 9112 6.3: 400, then close.
    if (h.find(http::field::transfer_encoding) != h.end() && !parser_->chunked())
      return Reject(JsonError(400, "bad_request", "unsupported Transfer-Encoding"));
    Preflight pf = srv_->preflight(req);
    if (!pf.ok) return Reject(std::move(pf.error));
    req.principal = std::move(pf.principal);
    if (auto len = parser_->content_length(); len && *len > pf.body_limit)
      return Reject(
          JsonError(413, "too_large",
                    "request body is larger than " + std::to_string(pf.body_limit) + " bytes"));
    parser_->body_limit(pf.body_limit);
    bool spool = pf.spool != Preflight::Spool::kNo && !req.websocket_upgrade;
    if (spool) {
      // The header is parsed and no body byte read: the parser moves to a body type that
      // hands the body over piece by piece, and the pieces go to an unlinked file.
      bool import = pf.spool == Preflight::Spool::kImport;
      std::atomic<int>* count = import ? &srv_->spooling : &srv_->spooling_uploads;
      if (count->fetch_add(1) >=
          (import ? srv_->opts.max_spooled : srv_->opts.max_spooled_uploads)) {
        count->fetch_sub(1);
        HttpResponse busy = JsonError(429, "over_capacity",
                                      "too many uploads in progress on this node; retry later");
        busy.headers.emplace_back("Retry-After", "5");
        return Reject(std::move(busy));
      }
      spool_slot_ = std::shared_ptr<void>(nullptr, [count](void*) { count->fetch_sub(1); });
      int fd = open(srv_->opts.spool_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0) {
        spool_slot_.reset();
        HttpResponse r = JsonError(503, "unavailable",
                                   std::string("cannot take the request body: ") + strerror(errno));
        r.headers.emplace_back("Retry-After", "5");
        return Reject(std::move(r));
      }
      req.body_file.Reset(fd);
      req.body_size = 0;
      spool_parser_.emplace(std::move(*parser_));
      spool_parser_->body_limit(pf.body_limit);
      spool_buf_.resize(64 << 10);
    }
    req_ = std::move(req);
    auto self = Self();
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      http::async_write(sock_, *cont, [self, cont, spool](beast::error_code ec, size_t) {
        if (ec) return self->Shutdown();
        if (spool) {
          self->ArmTimer(kBodyTimeoutS);
          self->ReadSpooled();
        } else {
          self->ReadBody();
        }
      });
      return;
    }
    if (spool) {
      ArmTimer(kBodyTimeoutS);
      return ReadSpooled();
    }
    ReadBody();
  }

  void EndSpool() {
    spool_slot_.reset();
    spool_parser_.reset();
    std::vector<char>().swap(spool_buf_);
  }

  // One piece of a spooled body: read into spool_buf_, appended to the file.
  void ReadSpooled() {
    phase_ = Phase::kReading;
    auto& body = spool_parser_->get().body();
    body.data = spool_buf_.data();
    body.size = spool_buf_.size();
    auto self = Self();
    http::async_read(sock_, buf_, *spool_parser_, [self](beast::error_code ec, size_t) {
      if (ec == http::error::need_buffer) ec = {};
      self->OnSpooled(ec);
    });
  }

  void OnSpooled(beast::error_code ec) {
    if (ec) {
      DisarmTimer();
      EndSpool();
      req_.body_file.Reset();
      return OnBodyError(ec);
    }
    size_t n = spool_buf_.size() - spool_parser_->get().body().size;
    if (n > 0) {
      if (Status s = WriteAllFd(req_.body_file.get(), std::string_view(spool_buf_.data(), n),
                                "spooled request body");
          !s.ok()) {
        DisarmTimer();
        EndSpool();
        req_.body_file.Reset();
        HttpResponse r =
            JsonError(503, "unavailable", "cannot store the request body: " + s.message());
        r.headers.emplace_back("Retry-After", "5");
        return Reject(std::move(r));
      }
      req_.body_size += n;
    }
    if (!spool_parser_->is_done()) return ReadSpooled();
    DisarmTimer();
    keep_alive_ = spool_parser_->keep_alive();
    EndSpool();
    if (lseek(req_.body_file.get(), 0, SEEK_SET) < 0) {
      req_.body_file.Reset();
      return Reject(JsonError(500, "internal", "cannot rewind the request body"));
    }
    phase_ = Phase::kHandling;
    ++seq_;
    srv_->handler(std::move(req_), MakeResponder());
  }

  void ReadBody() {
    ArmTimer(kBodyTimeoutS);
    phase_ = Phase::kReading;
    auto self = Self();
    http::async_read(sock_, buf_, *parser_,
                     [self](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    DisarmTimer();
    if (ec) return OnBodyError(ec);
    keep_alive_ = parser_->keep_alive();
    req_.body = std::move(parser_->get().body());
    if (req_.websocket_upgrade) raw_req_.emplace(parser_->release());
    phase_ = Phase::kHandling;
    ++seq_;
    srv_->handler(std::move(req_), MakeResponder());
  }

  void OnBodyError(beast::error_code ec) {
    if (ec == http::error::body_limit)
      return Reject(JsonError(413, "too_large", "request body is too large"));
    // A malformed body (a bad chunk header, an overflowing chunk size) is answered like a
    // malformed head; a client that went away or timed out is not.
    if (ec && ec.category() == http::make_error_code(http::error::bad_chunk).category() &&
        ec != http::error::partial_message && ec != http::error::end_of_stream && !closed_)
      return Reject(JsonError(400, "bad_request", "malformed HTTP request body: " + ec.message()));
    Shutdown();
  }

  std::shared_ptr<Responder> MakeResponder();

  void WriteResponse(HttpResponse r) {
    phase_ = Phase::kWriting;
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(r.status), 11);
    res->set(http::field::server, "dsec-edge");
    if (!r.body.empty() || r.status != 204) res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive_ && !r.close);
    res->prepare_payload();
    auto self = Self();
    http::async_write(sock_, *res, [self, res](beast::error_code ec, size_t) {
      self->AfterResponse(ec, res->keep_alive());
    });
  }

  void AfterResponse(beast::error_code ec, bool keep) {
    on_disconnect_ = nullptr;
    stream_sr_.reset();
    stream_res_.reset();
    if (ec || !keep) return Shutdown();
    DoRead();
  }

  void PumpStream() {
    if (writing_ || closed_) return;
    auto self = Self();
    if (!chunks_.empty()) {
      writing_ = true;
      asio::async_write(sock_, http::make_chunk(asio::buffer(chunks_.front())),
                        [self](beast::error_code ec, size_t) {
                          self->writing_ = false;
                          if (!self->chunks_.empty()) {
                            self->queued_ -= self->chunks_.front().size();
                            self->chunks_.pop_front();
                          }
                          if (ec) return self->Disconnected();
                          self->PumpStream();
                        });
      return;
    }
    if (end_requested_) {
      end_requested_ = false;
      writing_ = true;
      phase_ = Phase::kWriting;
      asio::async_write(sock_, http::make_chunk_last(), [self](beast::error_code ec, size_t) {
        self->writing_ = false;
        self->AfterResponse(ec, self->keep_alive_);
      });
    }
  }

  // Notices a client that hangs up while its request is handled or streamed.
  void Watch() {
    watching_ = true;
    auto self = Self();
    sock_.async_wait(asio::socket_base::wait_read, [self](beast::error_code ec) {
      self->watching_ = false;
      if (ec) return;  // cancelled, or the socket closed (Shutdown notifies)
      char c;
      ssize_t n = recv(self->sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return self->Disconnected();
      // A pipelined request: leave it for the next read; this client is still there.
    });
  }

  void Disconnected() { Shutdown(); }

  void Shutdown() {
    if (closed_) return;
    closed_ = true;
    phase_ = Phase::kDone;
    DisarmTimer();
    beast::error_code ec;
    sock_.shutdown(asio::socket_base::shutdown_both, ec);
    sock_.close(ec);
    // A chunk write in flight still reads chunks_.front() until its completion (now
    // cancelled) runs and drops it; freeing it here was a use-after-free and a pop_front
    // of an empty deque when a client hung up mid-stream.
    if (writing_ && !chunks_.empty()) {
      chunks_.erase(std::next(chunks_.begin()), chunks_.end());
    } else {
      chunks_.clear();
    }
    srv_->Unregister(this);
    if (on_disconnect_) {
      auto cb = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      cb();
    }
  }

  HttpServer::Impl* srv_;
  Socket sock_;
  asio::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  bool via_unix_;
  uid_t peer_uid_;
  std::string remote_;
  bool over_limit_;
  uint64_t requests_ = 0;  // request headers read on this connection
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request_parser<http::buffer_body>> spool_parser_;
  std::vector<char> spool_buf_;
  std::shared_ptr<void> spool_slot_;  // holds one of srv_->spooling while the body arrives
  std::optional<http::request<http::string_body>> raw_req_;
  HttpRequest req_;
  Phase phase_ = Phase::kReading;
  uint64_t seq_ = 0;
  bool keep_alive_ = false, closed_ = false, upgraded_ = false;
  // Streaming state.
  std::unique_ptr<http::response<http::empty_body>> stream_res_;
  std::unique_ptr<http::response_serializer<http::empty_body>> stream_sr_;
  std::deque<std::string> chunks_;
  size_t queued_ = 0;  // bytes in chunks_
  bool writing_ = false, end_requested_ = false, watching_ = false;
  std::function<void()> on_disconnect_;
};

template <class Socket>
class ResponderImpl : public Responder {
 public:
  ResponderImpl(std::shared_ptr<HttpSession<Socket>> s, uint64_t seq, asio::any_io_executor ex)
      : s_(std::move(s)), seq_(seq), ex_(std::move(ex)) {}
  void Send(HttpResponse r) override {
    asio::post(ex_, [s = s_, q = seq_, r = std::move(r)]() mutable { s->DoSend(q, std::move(r)); });
  }
  void StartStream(int status, std::string ct,
                   std::vector<std::pair<std::string, std::string>> headers) override {
    asio::post(ex_,
               [s = s_, q = seq_, status, ct = std::move(ct), h = std::move(headers)]() mutable {
                 s->DoStartStream(q, status, std::move(ct), std::move(h));
               });
  }
  void Write(std::string chunk) override {
    asio::post(ex_,
               [s = s_, q = seq_, c = std::move(chunk)]() mutable { s->DoWrite(q, std::move(c)); });
  }
  void End(std::string last) override {
    asio::post(ex_,
               [s = s_, q = seq_, c = std::move(last)]() mutable { s->DoEnd(q, std::move(c)); });
  }
  void OnDisconnect(std::function<void()> cb) override {
    asio::post(ex_, [s = s_, q = seq_, cb = std::move(cb)]() mutable {
      s->DoOnDisconnect(q, std::move(cb));
    });
  }
  void AcceptWebSocket(std::shared_ptr<WebSocketHandler> h) override {
    asio::post(ex_, [s = s_, q = seq_, h = std::move(h)]() mutable {
      s->DoAcceptWebSocket(q, std::move(h));
    });
  }

 private:
  std::shared_ptr<HttpSession<Socket>> s_;
  uint64_t seq_;
  asio::any_io_executor ex_;
};

template <class Socket>
std::shared_ptr<Responder> HttpSession<Socket>::MakeResponder() {
  return std::make_shared<ResponderImpl<Socket>>(Self(), seq_, sock_.get_executor());
}

template <class Socket>
void HttpServer::Impl::StartSession(Socket sock, bool via_unix, uid_t uid, std::string remote) {
  bool over = conns.fetch_add(1) >= opts.max_connections;
  auto s = std::make_shared<HttpSession<Socket>>(this, std::move(sock), via_unix, uid,
                                                 std::move(remote), over);
  s->Start();
}

namespace {

const std::string& BusyResponse() {
  static const std::string kBusy = [] {
    HttpResponse r = JsonError(503, "unavailable", "the edge is out of file descriptors");
    return "HTTP/1.1 503 Service Unavailable\r\nServer: dsec-edge\r\nContent-Type: "
           "application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
           std::to_string(r.body.size()) + "\r\n\r\n" + r.body;
  }();
  return kBusy;
}

// Answers 503 on a connection the edge cannot serve and closes it.
void RefuseBusy(int fd) {
  char buf[4096];  // read what it sent, so the close is a FIN and not a reset
  for (int k = 0; k < 4 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0; ++k) {
  }
  const std::string& busy = BusyResponse();
  (void)send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_WR);
  close(fd);
}

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

bool HttpServer::Impl::RestoreReserve() {
  std::lock_guard<std::mutex> l(reserve_mu);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
  return reserve_fd >= 0;
}

void HttpServer::Impl::RefuseForReserve(int fd) {
  std::lock_guard<std::mutex> l(reserve_mu);
  RefuseBusy(fd);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
}

void HttpServer::Impl::ShedWaiting(int listen_fd) {
  std::lock_guard<std::mutex> l(reserve_mu);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
  for (int i = 0; i < 256 && reserve_fd >= 0; ++i) {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (poll(&pfd, 1, 0) != 1) break;  // nobody waiting
    close(reserve_fd);
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) RefuseBusy(fd);
    reserve_fd = OpenReserve();
    if (fd < 0) break;  // another thread took the slot: next time
  }
}

void HttpServer::Impl::AcceptTcp() {
  tcp_acceptor->async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket s) {
    if (stopping) return;
    if (ec) {
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE)
        ShedWaiting(tcp_acceptor->native_handle());
      // Out of fds and the like: back off instead of spinning.
      tcp_retry->expires_after(std::chrono::milliseconds(kAcceptRetryMs));
      tcp_retry->async_wait([this](beast::error_code e) {
        if (e || stopping) return;
        RestoreReserve();  // before the accept can take a freed slot
        AcceptTcp();
      });
      return;
    }
    if (!Admit(s)) return AcceptTcp();
    beast::error_code ig;
    s.set_option(tcp::no_delay(true), ig);
    auto ep = s.remote_endpoint(ig);
    std::string remote = ig ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
    StartSession(std::move(s), false, static_cast<uid_t>(-1), std::move(remote));
    AcceptTcp();
  });
}

void HttpServer::Impl::AcceptUnix() {
  unix_acceptor->async_accept(
      asio::make_strand(io), [this](beast::error_code ec, unix_proto::socket s) {
        if (stopping) return;
        if (ec) {
          if (ec == asio::error::no_descriptors || ec.value() == ENFILE)
            ShedWaiting(unix_acceptor->native_handle());
          unix_retry->expires_after(std::chrono::milliseconds(kAcceptRetryMs));
          unix_retry->async_wait([this](beast::error_code e) {
            if (e || stopping) return;
            RestoreReserve();
            AcceptUnix();
          });
          return;
        }
        if (!Admit(s)) return AcceptUnix();
        ucred cred{};
        socklen_t len = sizeof cred;
        uid_t uid = static_cast<uid_t>(-1);
        if (getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
          uid = cred.uid;
        StartSession(std::move(s), true, uid, "unix");
        AcceptUnix();
      });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions opts,
                                                        PreflightFn preflight, HandlerFn handler) {
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(opts);
  impl->preflight = std::move(preflight);
  impl->handler = std::move(handler);
  impl->tcp_retry = std::make_unique<asio::steady_timer>(impl->io);
  impl->unix_retry = std::make_unique<asio::steady_timer>(impl->io);
  beast::error_code ec;
  if (!impl->opts.listen.empty()) {
    std::string host;
    uint16_t port;
    DSEC_RETURN_IF_ERROR(ParseHostPort(impl->opts.listen, &host, &port));
    auto addr = asio::ip::make_address(host, ec);
    if (ec) return InvalidArgument("bad listen address \"" + host + "\": " + ec.message());
    tcp::endpoint ep(addr, port);
    auto acc = std::make_unique<tcp::acceptor>(impl->io);
    acc->open(ep.protocol(), ec);
    if (!ec) acc->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acc->bind(ep, ec);
    if (!ec) acc->listen(4096, ec);
    if (ec)
      return Status(StatusCode::kUnavailable,
                    "listen on " + impl->opts.listen + ": " + ec.message());
    impl->tcp_acceptor = std::move(acc);
  }
  if (!impl->opts.unix_path.empty()) {
    const std::string& p = impl->opts.unix_path;
    // A socket file left by a crashed edge is replaced; a live edge there is an error.
    struct stat st;
    if (lstat(p.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode))
        return FailedPrecondition("\"" + p + "\" exists and is not a socket");
      unix_proto::socket probe(impl->io);
      probe.connect(unix_proto::endpoint(p), ec);
      if (!ec)
        return Status(StatusCode::kAlreadyExists, "another edge is serving on \"" + p + "\"");
      (void)unlink(p.c_str());
    }
    auto acc = std::make_unique<unix_proto::acceptor>(impl->io);
    mode_t old = umask(0177);  // the socket file is born 0600: no window for other users
    acc->open(unix_proto(), ec);
    if (!ec) acc->bind(unix_proto::endpoint(p), ec);
    umask(old);
    if (!ec) acc->listen(4096, ec);
    if (ec) return Status(StatusCode::kUnavailable, "listen on \"" + p + "\": " + ec.message());
    (void)chmod(p.c_str(), 0600);
    impl->unix_acceptor = std::move(acc);
  }
  impl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (impl->tcp_acceptor) impl->AcceptTcp();
  if (impl->unix_acceptor) impl->AcceptUnix();
  impl->work.emplace(impl->io.get_executor());
  for (int i = 0; i < std::max(1, impl->opts.io_threads); ++i)
    impl->threads.emplace_back([io = &impl->io] { io->run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    beast::error_code ec;
    if (impl->tcp_acceptor) impl->tcp_acceptor->close(ec);
    if (impl->unix_acceptor) impl->unix_acceptor->close(ec);
    impl->tcp_retry->cancel();
    impl->unix_retry->cancel();
  });
  std::vector<std::shared_ptr<SessionBase>> live;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [p, w] : impl_->sessions)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->Close();
  live.clear();
  impl_->work.reset();
  // Give the closes a moment to run, then stop whatever is still pending.
  for (int i = 0; i < 100 && impl_->conns.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  if (!impl_->opts.unix_path.empty()) (void)unlink(impl_->opts.unix_path.c_str());
  std::lock_guard<std::mutex> l(impl_->reserve_mu);
  if (impl_->reserve_fd >= 0) close(impl_->reserve_fd);
  impl_->reserve_fd = -1;
}

int64_t HttpServer::connections() const { return impl_->conns.load(); }

uint16_t HttpServer::tcp_port() const {
  beast::error_code ec;
  return impl_->tcp_acceptor ? impl_->tcp_acceptor->local_endpoint(ec).port() : 0;
}

asio::io_context& HttpServer::io() { return impl_->io; }

}  // namespace dsec::edge
