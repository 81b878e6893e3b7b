#include "http/server.h"

#include <sys/un.h>

#include "http/server_impl.h"

namespace dsec::http {

namespace {

std::string BusyResponse(const std::string& server_name) {
  HttpResponse r = JsonError(503, "unavailable", "the server is out of file descriptors");
  return "HTTP/1.1 503 Service Unavailable\r\nServer: " + server_name +
         "\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
         "Content-Length: " +
         std::to_string(r.body.size()) + "\r\n\r\n" + r.body;
}

// Answers 503 on a connection the server cannot serve and closes it.
void RefuseBusy(int fd, const std::string& busy) {
  char buf[4096];  // read what it sent, so the close is a FIN and not a reset
  for (int k = 0; k < 4 && recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0; ++k) {
  }
  (void)send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_WR);
  close(fd);
}

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

bool HttpServer::Impl::RestoreReserve() {
  MutexLock l(reserve_mu);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
  return reserve_fd >= 0;
}

void HttpServer::Impl::RefuseForReserve(int fd) {
  MutexLock l(reserve_mu);
  RefuseBusy(fd, busy_response);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
}

void HttpServer::Impl::ShedWaiting(int listen_fd) {
  MutexLock l(reserve_mu);
  if (reserve_fd < 0) reserve_fd = OpenReserve();
  for (int i = 0; i < 256 && reserve_fd >= 0; ++i) {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (poll(&pfd, 1, 0) != 1) break;  // nobody waiting
    close(reserve_fd);
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) RefuseBusy(fd, busy_response);
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
    accepted.fetch_add(1, std::memory_order_relaxed);
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
  impl->busy_response = BusyResponse(impl->opts.server_name);
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
    if (p.size() >= sizeof(sockaddr_un::sun_path))
      return InvalidArgument("unix socket path \"" + p + "\" is " + std::to_string(p.size()) +
                             " bytes; the kernel takes at most " +
                             std::to_string(sizeof(sockaddr_un::sun_path) - 1));
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
  {
    MutexLock l(impl->reserve_mu);  // not shared yet: taken for the analysis
    impl->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
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
    MutexLock l(impl_->mu);
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
  MutexLock l(impl_->reserve_mu);
  if (impl_->reserve_fd >= 0) close(impl_->reserve_fd);
  impl_->reserve_fd = -1;
}

int64_t HttpServer::connections() const { return impl_->conns.load(); }
int64_t HttpServer::tcp_accepted() const { return impl_->accepted.load(); }

void HttpServer::Adopt(UniqueFd fd, std::string buffered, std::string remote) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) < 0) return;
  Impl* impl = impl_.get();
  auto shared =
      std::make_shared<std::pair<UniqueFd, std::string>>(std::move(fd), std::move(buffered));
  asio::post(impl->io, [impl, shared, remote = std::move(remote), v6 = ss.ss_family == AF_INET6] {
    if (impl->stopping) return;  // (the descriptor closes with `shared`)
    tcp::socket s(impl->io);
    beast::error_code ec;
    s.assign(v6 ? tcp::v6() : tcp::v4(), shared->first.get(), ec);
    if (ec) return;
    (void)shared->first.Release();  // the socket owns it now
    impl->StartSession(std::move(s), false, static_cast<uid_t>(-1), remote, &shared->second);
  });
}

uint16_t HttpServer::tcp_port() const {
  beast::error_code ec;
  return impl_->tcp_acceptor ? impl_->tcp_acceptor->local_endpoint(ec).port() : 0;
}

asio::io_context& HttpServer::io() { return impl_->io; }

}  // namespace dsec::http
