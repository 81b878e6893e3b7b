// One connection of the HTTP server: requests read with Beast (head first: auth preflight and
// limits before any body byte is read), bodies in memory or spooled to disk, responses written
// in order (pipelining) or streamed, and WebSocket sessions after an upgrade.
#include "http/parse.h"
#include "http/server_impl.h"

namespace dsec::http {

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

  // A connection handed back after a relayed exchange: its next request has begun (`bytes`),
  // and it is a keep-alive connection (the idle timeout, not the first request's, applies).
  void Prime(const std::string& bytes) {
    auto b = buf_.prepare(bytes.size());
    std::memcpy(b.data(), bytes.data(), bytes.size());
    buf_.commit(bytes.size());
    requests_ = 1;
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
    stream_res_->set(http::field::server, srv_->opts.server_name);
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
    if (pf.takeover) return TakeOver(std::move(req));
    body_limit_ = pf.body_limit;
    limit_why_ = pf.limit_why;
    if (auto len = parser_->content_length(); len && *len > pf.body_limit)
      return Reject(JsonError(413, "too_large", TooLargeMessage(std::to_string(*len) + " bytes")));
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

  // "request body of SIZE is larger than the limit of N bytes (WHY)".
  std::string TooLargeMessage(const std::string& size) const {
    std::string m = "request body of " + size + " is larger than the limit of " +
                    std::to_string(body_limit_) + " bytes";
    return limit_why_.empty() ? m : m + " (" + limit_why_ + ")";
  }

  // Gives the connection away (Preflight::takeover): this session ends without closing it.
  void TakeOver(HttpRequest req) {
    DisarmTimer();
    req.takeover_fd.Reset(fcntl(sock_.native_handle(), F_DUPFD_CLOEXEC, 3));
    if (!req.takeover_fd) return Shutdown();
    req.takeover_buffered = beast::buffers_to_string(buf_.data());
    buf_.consume(buf_.size());
    closed_ = true;
    phase_ = Phase::kDone;
    beast::error_code ec;
    sock_.close(ec);  // our descriptor; the duplicate keeps the connection
    srv_->Unregister(this);
    srv_->handler(std::move(req), nullptr);
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
      return Reject(JsonError(413, "too_large", TooLargeMessage("more")));
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
    res->set(http::field::server, srv_->opts.server_name);
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
  uint64_t body_limit_ = 0;  // of the request being read, and where it comes from
  std::string limit_why_;
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
void HttpServer::Impl::StartSession(Socket sock, bool via_unix, uid_t uid, std::string remote,
                                    const std::string* buffered) {
  bool over = conns.fetch_add(1) >= opts.max_connections;
  auto s = std::make_shared<HttpSession<Socket>>(this, std::move(sock), via_unix, uid,
                                                 std::move(remote), over);
  if (buffered) s->Prime(*buffered);
  s->Start();
}

template void HttpServer::Impl::StartSession<tcp::socket>(tcp::socket, bool, uid_t, std::string,
                                                          const std::string*);
template void HttpServer::Impl::StartSession<unix_proto::socket>(unix_proto::socket, bool, uid_t,
                                                                 std::string, const std::string*);

}  // namespace dsec::http
