#include "http/client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>  // before asio (Boost 1.74)

#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "base/strings.h"

namespace dsec::http {

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// A socket as Beast's SyncReadStream/SyncWriteStream, where every wait has a deadline. With
// `idle` set, the deadline moves on after each byte received (a stream may last for ever, but
// not go quiet for longer than `idle`); `stop` is looked at every 200 ms of waiting.
class DeadlineStream {
 public:
  DeadlineStream(int fd, Clock::time_point deadline,
                 std::chrono::milliseconds idle = std::chrono::milliseconds(0),
                 const std::atomic<bool>* stop = nullptr)
      : fd_(fd), deadline_(deadline), idle_(idle), stop_(stop) {}

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, error_code& ec) {
    ec = {};
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::mutable_buffer b = *it;
      if (b.size() == 0) continue;
      for (;;) {
        ssize_t n = recv(fd_, b.data(), b.size(), MSG_DONTWAIT);
        if (n > 0) {
          if (idle_.count() > 0) deadline_ = Clock::now() + idle_;
          return static_cast<size_t>(n);
        }
        if (n == 0) {
          ec = boost::asio::error::eof;
          return 0;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          ec = error_code(errno, boost::system::system_category());
          return 0;
        }
        if (!Wait(POLLIN, ec)) return 0;
      }
    }
    return 0;
  }
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers, error_code& ec) {
    ec = {};
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::const_buffer b = *it;
      if (b.size() == 0) continue;
      for (;;) {
        ssize_t n = send(fd_, b.data(), b.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) return static_cast<size_t>(n);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          ec = error_code(errno, boost::system::system_category());
          return 0;
        }
        if (!Wait(POLLOUT, ec)) return 0;
      }
    }
    return 0;
  }
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers) {
    error_code ec;
    size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      error_code ec;
      size_t n = write_some(boost::asio::buffer(data.data(), data.size()), ec);
      if (ec) return ToStatus(ec, "send");
      data.remove_prefix(n);
    }
    return OkStatus();
  }

  static Status ToStatus(const error_code& ec, std::string_view what) {
    if (ec == boost::asio::error::timed_out)
      return DeadlineExceeded(std::string(what) + ": timed out");
    if (ec == boost::asio::error::operation_aborted)
      return Status(StatusCode::kAborted, std::string(what) + ": stopped");
    if (ec == bhttp::error::body_limit) return TooLarge(std::string(what) + ": body too large");
    return Unavailable(std::string(what) + ": " + ec.message());
  }

 private:
  bool Wait(short events, error_code& ec) {
    for (;;) {
      if (stop_ && stop_->load()) {
        ec = boost::asio::error::operation_aborted;
        return false;
      }
      int left = RemainingMs(deadline_);
      if (left <= 0) {
        ec = boost::asio::error::timed_out;
        return false;
      }
      pollfd p{fd_, events, 0};
      int r = poll(&p, 1, stop_ ? std::min(left, 200) : left);
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) {
        ec = error_code(errno, boost::system::system_category());
        return false;
      }
    }
  }

  int fd_;
  Clock::time_point deadline_;
  std::chrono::milliseconds idle_;
  const std::atomic<bool>* stop_;
};

std::string RequestHead(std::string_view method, std::string_view target, const std::string& host,
                        uint16_t port, const Headers& headers, size_t body_size, bool keep_alive) {
  std::string h =
      StrCat({method, " ", target, " HTTP/1.1\r\nHost: ", host, ":", std::to_string(port), "\r\n"});
  for (const auto& [k, v] : headers) h += StrCat({k, ": ", v, "\r\n"});
  if (body_size > 0 || method == "POST" || method == "PUT" || method == "PATCH")
    h += "Content-Length: " + std::to_string(body_size) + "\r\n";
  h += keep_alive ? "\r\n" : "Connection: close\r\n\r\n";
  return h;
}

template <class Fields>
Headers LowercaseHeaders(const Fields& f) {
  Headers out;
  for (const auto& field : f) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    out.emplace_back(std::move(name), std::string(field.value()));
  }
  return out;
}

}  // namespace

std::string ClientResponse::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

Status ParseHttpUrl(std::string_view url, std::string* host, uint16_t* port) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme)
    return InvalidArgument("\"" + std::string(url) + "\" is not an http:// URL");
  std::string_view rest = url.substr(kScheme.size());
  rest = rest.substr(0, rest.find('/'));
  if (rest.empty()) return InvalidArgument("\"" + std::string(url) + "\" has no host");
  std::string_view h = rest;
  uint16_t p = 80;
  size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos && rest.find(']', colon) == std::string_view::npos) {
    auto n = ParseInt64(std::string(rest.substr(colon + 1)));
    if (!n || *n <= 0 || *n > 65535)
      return InvalidArgument("bad port in \"" + std::string(url) + "\"");
    p = static_cast<uint16_t>(*n);
    h = rest.substr(0, colon);
  }
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) return InvalidArgument("\"" + std::string(url) + "\" has no host");
  *host = std::string(h);
  *port = p;
  return OkStatus();
}

HttpClient::HttpClient(std::string host, uint16_t port, size_t max_idle)
    : host_(std::move(host)), port_(port), max_idle_(max_idle) {}

HttpClient::~HttpClient() = default;

StatusOr<UniqueFd> StartConnect(const std::string& host, uint16_t port, size_t skip, bool* more) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res); rc != 0)
    return Unavailable("resolve " + host + ": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  addrinfo* a = res;
  for (size_t i = 0; a && i < skip; ++i) a = a->ai_next;
  if (more) *more = a && a->ai_next;
  if (!a) return Unavailable("connect " + host + ":" + p + ": no address");
  UniqueFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS)
    return Unavailable("connect " + host + ":" + p + ": " + strerror(errno));
  return fd;
}

StatusOr<UniqueFd> HttpClient::Connect(Clock::time_point deadline) {
  const std::string where = host_ + ":" + std::to_string(port_);
  Status last = Unavailable("connect " + where + ": no address");
  bool more = true;
  for (size_t i = 0; more; ++i) {
    auto fd = StartConnect(host_, port_, i, &more);
    if (!fd.ok()) {
      last = fd.status();
      continue;
    }
    pollfd p{fd->get(), POLLOUT, 0};
    int r;
    do {
      r = poll(&p, 1, RemainingMs(deadline));
    } while (r < 0 && errno == EINTR);
    if (r == 0) return DeadlineExceeded("connect " + where + ": timed out");
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd->get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) return fd;
    last = Unavailable("connect " + where + ": " + strerror(err));
  }
  return last;
}

UniqueFd HttpClient::TakeIdle() {
  for (;;) {
    UniqueFd fd;
    {
      MutexLock l(mu_);
      if (idle_.empty()) return UniqueFd();
      fd = std::move(idle_.back());
      idle_.pop_back();
    }
    // Between messages nothing may be readable: an end of stream (the server closed it while
    // idle), a reset or stray bytes all retire the connection.
    char c;
    ssize_t n = recv(fd.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return fd;
  }
}

void HttpClient::GiveBack(UniqueFd fd) {
  MutexLock l(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(fd));
}

StatusOr<ClientResponse> HttpClient::Request(std::string_view method, std::string_view target,
                                             const Headers& headers, std::string_view body,
                                             std::chrono::milliseconds timeout, uint64_t max_body) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string what = StrCat({method, " http://", host_, ":", std::to_string(port_), target});
  const std::string head =
      RequestHead(method, target, host_, port_, headers, body.size(), /*keep_alive=*/true);
  for (int attempt = 0;; ++attempt) {
    UniqueFd fd = attempt == 0 ? TakeIdle() : UniqueFd();
    const bool reused = fd.valid();
    if (!reused) {
      DSEC_ASSIGN_OR_RETURN(fd, Connect(deadline));
    }
    DeadlineStream s(fd.get(), deadline);
    Status sent = s.WriteAll(head);
    if (sent.ok() && !body.empty()) sent = s.WriteAll(body);
    if (!sent.ok()) {
      if (reused && sent.code() == StatusCode::kUnavailable) continue;  // stale idle connection
      return Status(sent.code(), what + ": " + sent.message());
    }
    beast::flat_buffer buf;
    bhttp::response_parser<bhttp::string_body> p;
    p.header_limit(64 << 10);
    p.body_limit(max_body);
    if (method == "HEAD") p.skip(true);
    error_code ec;
    bhttp::read(s, buf, p, ec);
    if (ec) {
      if (reused && !p.got_some() && ec != boost::asio::error::timed_out) continue;
      return DeadlineStream::ToStatus(ec, what);
    }
    ClientResponse r;
    auto& msg = p.get();
    r.status = static_cast<int>(msg.result_int());
    r.headers = LowercaseHeaders(msg.base());
    r.body = std::move(msg.body());
    if (p.keep_alive() && buf.size() == 0) GiveBack(std::move(fd));
    return r;
  }
}

Status HttpClient::Stream(std::string_view method, std::string_view target, const Headers& headers,
                          std::string_view body, std::chrono::milliseconds connect_timeout,
                          std::chrono::milliseconds idle, const std::atomic<bool>* stop,
                          const std::function<void(int, const Headers&)>& on_head,
                          const std::function<bool(std::string_view)>& on_data) {
  const std::string what = StrCat({method, " http://", host_, ":", std::to_string(port_), target});
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, Connect(Clock::now() + connect_timeout));
  DeadlineStream s(fd.get(), Clock::now() + std::max(idle, connect_timeout), idle, stop);
  Status sent = s.WriteAll(RequestHead(method, target, host_, port_, headers, body.size(), false));
  if (sent.ok() && !body.empty()) sent = s.WriteAll(body);
  if (!sent.ok()) return Status(sent.code(), what + ": " + sent.message());
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::buffer_body> p;
  p.header_limit(64 << 10);
  p.body_limit(std::numeric_limits<uint64_t>::max());
  error_code ec;
  bhttp::read_header(s, buf, p, ec);
  if (ec) return DeadlineStream::ToStatus(ec, what);
  on_head(static_cast<int>(p.get().result_int()), LowercaseHeaders(p.get().base()));
  char chunk[64 << 10];
  while (!p.is_done()) {
    p.get().body().data = chunk;
    p.get().body().size = sizeof chunk;
    bhttp::read_some(s, buf, p, ec);  // what has come, not a full buffer: events are small
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) return DeadlineStream::ToStatus(ec, what);
    size_t got = sizeof chunk - p.get().body().size;
    if (got > 0 && !on_data(std::string_view(chunk, got)))
      return Status(StatusCode::kAborted, what + ": stopped by the reader");
  }
  return OkStatus();
}

}  // namespace dsec::http
