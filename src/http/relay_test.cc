// The relay's keep-alive toward the upstream server (the apiserver's pools to nodes): a
// connection goes back to its pool only at a message boundary the server keeps, and a pooled
// connection found closed before any byte of a response is replaced, once, when the request
// can be sent again.
#include "http/relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "http/client.h"

namespace dsec::http {
namespace {

// A loopback TCP listener.
struct Listener {
  UniqueFd fd;
  uint16_t port = 0;
  Listener() {
    fd.Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd.get(), 16), 0);
    socklen_t len = sizeof a;
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  // The next connection, or an invalid fd when none comes within 5 s.
  UniqueFd Accept(int flags = 0) const {
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return UniqueFd();
    return UniqueFd(accept4(fd.get(), nullptr, nullptr, SOCK_CLOEXEC | flags));
  }
};

UniqueFd Connect(uint16_t port) {
  auto fd = StartConnect("127.0.0.1", port);
  EXPECT_TRUE(fd.ok());
  pollfd p{fd->get(), POLLOUT, 0};
  poll(&p, 1, 5000);
  return std::move(*fd);
}

// The relay's outcome, or -1 when it has none within 5 s.
int OutcomeOf(std::future<int>& f) {
  return f.wait_for(std::chrono::seconds(5)) == std::future_status::ready ? f.get() : -1;
}

// Reads until `end` is in what was read (or the stream ends, or 5 s pass).
std::string ReadUntil(int fd, std::string_view end) {
  std::string got;
  while (got.find(end) == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

void SendAll(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 5000);
      continue;
    }
    ASSERT_GT(n, 0);
    s.remove_prefix(static_cast<size_t>(n));
  }
}

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    work_.reset();
    io_.stop();
    thread_.join();
  }

  // Starts a relay of `head` (+ `buffered`) from a new client connection to `upstream`; returns
  // the client's end and a future of the relay's outcome.
  UniqueFd Relay(UniqueFd upstream, ProxiedRequest pr, std::future<int>* outcome) {
    Listener front;
    UniqueFd client = Connect(front.port);
    UniqueFd served = front.Accept(SOCK_NONBLOCK);  // as the server hands it over
    auto done = std::make_shared<std::promise<int>>();
    *outcome = done->get_future();
    pr.target_name = "the test's server";
    StartPortRelay(io_, std::move(served), std::move(upstream), std::move(pr),
                   std::chrono::milliseconds(5000), nullptr,
                   [done](int status) { done->set_value(status); });
    return client;
  }

  static ProxiedRequest Get(bool keep_upstream) {
    ProxiedRequest pr;
    pr.head = "GET /x HTTP/1.1\r\nHost: t\r\n";
    pr.head += keep_upstream ? "\r\n" : "Connection: close\r\n\r\n";
    return pr;
  }

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      boost::asio::make_work_guard(io_)};
  std::thread thread_;
};

TEST_F(RelayTest, AKeptResponseGivesTheUpstreamConnectionBackAtItsBoundary) {
  Listener server;
  UniqueFd up = Connect(server.port);
  UniqueFd conn = server.Accept();
  std::promise<int> pooled_fd;
  ProxiedRequest pr = Get(true);
  pr.upstream_reuse = [&](UniqueFd fd) { pooled_fd.set_value(fd.Release()); };
  std::future<int> outcome;
  UniqueFd client = Relay(std::move(up), std::move(pr), &outcome);
  EXPECT_NE(ReadUntil(conn.get(), "\r\n\r\n").find("GET /x HTTP/1.1"), std::string::npos);
  SendAll(conn.get(), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  std::string got = ReadUntil(client.get(), "\r\n\r\nok");
  EXPECT_NE(got.find("HTTP/1.1 200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;  // toward the client
  EXPECT_EQ(OutcomeOf(outcome), 200);
  auto f = pooled_fd.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  UniqueFd back(f.get());
  // The connection is at a message boundary: a next exchange on it works.
  SendAll(back.get(), "GET /y HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_NE(ReadUntil(conn.get(), "\r\n\r\n").find("GET /y HTTP/1.1"), std::string::npos);
  SendAll(conn.get(), "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_NE(ReadUntil(back.get(), "\r\n\r\n").find("204"), std::string::npos);
}

// A head that arrives a line at a time (a CGI server writes its own fields after the status
// line): the lines the parser took with the first pieces are not fed to it again.
TEST_F(RelayTest, AResponseHeadInPiecesIsParsedOnce) {
  Listener server;
  UniqueFd up = Connect(server.port);
  UniqueFd conn = server.Accept();
  std::future<int> outcome;
  UniqueFd client = Relay(std::move(up), Get(false), &outcome);
  ReadUntil(conn.get(), "\r\n\r\n");
  for (std::string_view piece : {"HTTP/1.1 200 OK\r\n", "Content-Type: text/plain\r\n",
                                 "X-A: 1\r\nContent-Length: 2\r\n", "\r\nok"}) {
    SendAll(conn.get(), piece);
    usleep(30 * 1000);
  }
  std::string got = ReadUntil(client.get(), "\r\n\r\nok");
  EXPECT_NE(got.find("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\n"),
            std::string::npos)
      << got;
  EXPECT_EQ(OutcomeOf(outcome), 200);
}

TEST_F(RelayTest, AServerThatClosesOrFramesByTheEndKeepsNothing) {
  for (std::string_view response :
       {std::string_view("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"),
        std::string_view("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        std::string_view("HTTP/1.1 200 OK\r\n\r\nok")}) {
    Listener server;
    UniqueFd up = Connect(server.port);
    UniqueFd conn = server.Accept();
    std::atomic<bool> pooled{false};
    ProxiedRequest pr = Get(true);
    pr.upstream_reuse = [&](UniqueFd) { pooled = true; };
    std::future<int> outcome;
    UniqueFd client = Relay(std::move(up), std::move(pr), &outcome);
    ReadUntil(conn.get(), "\r\n\r\n");
    SendAll(conn.get(), response);
    conn.Reset();  // (the last form ends by the close)
    std::string got = ReadUntil(client.get(), "\r\n\r\nok");
    EXPECT_NE(got.find("\r\n\r\nok"), std::string::npos) << response;
    EXPECT_EQ(OutcomeOf(outcome), 200);
    EXPECT_FALSE(pooled.load()) << response;
  }
}

TEST_F(RelayTest, APooledConnectionFoundClosedIsReplacedOnceWhenTheRequestIsInMemory) {
  Listener stale_server, server;
  UniqueFd stale = Connect(stale_server.port);
  stale_server.Accept().Reset();  // the server closed it while it was idle
  std::atomic<int> reconnects{0};
  ProxiedRequest pr;
  pr.head = "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\n";
  pr.body = ProxiedRequest::Body::kLength;
  pr.length = 4;
  pr.buffered = "body";
  pr.upstream_reuse = [](UniqueFd) {};
  pr.reconnect = [&]() -> StatusOr<UniqueFd> {
    ++reconnects;
    return StartConnect("127.0.0.1", server.port);
  };
  std::future<int> outcome;
  UniqueFd client = Relay(std::move(stale), std::move(pr), &outcome);
  UniqueFd conn = server.Accept();
  ASSERT_TRUE(conn.valid()) << "no second connection";
  std::string req = ReadUntil(conn.get(), "\r\n\r\nbody");
  EXPECT_NE(req.find("POST /x HTTP/1.1"), std::string::npos) << req;
  SendAll(conn.get(), "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n");
  EXPECT_NE(ReadUntil(client.get(), "\r\n\r\n").find("201 Created"), std::string::npos);
  EXPECT_EQ(OutcomeOf(outcome), 201);
  EXPECT_EQ(reconnects.load(), 1);
}

TEST_F(RelayTest, ABodyStillStreamingIsNeverSentTwice) {
  Listener stale_server;
  UniqueFd stale = Connect(stale_server.port);
  stale_server.Accept().Reset();
  std::atomic<int> reconnects{0};
  ProxiedRequest pr;
  pr.head = "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n";
  pr.body = ProxiedRequest::Body::kLength;
  pr.length = 8;
  pr.buffered = "half";  // the rest would come from the client
  pr.upstream_reuse = [](UniqueFd) {};
  pr.reconnect = [&]() -> StatusOr<UniqueFd> {
    ++reconnects;
    return Unavailable("not to be called");
  };
  std::future<int> outcome;
  UniqueFd client = Relay(std::move(stale), std::move(pr), &outcome);
  std::string got = ReadUntil(client.get(), "}");
  EXPECT_NE(got.find("HTTP/1.1 502"), std::string::npos) << got;
  EXPECT_EQ(reconnects.load(), 0);
  EXPECT_EQ(OutcomeOf(outcome), 502);
}

TEST_F(RelayTest, TheIdlePoolRetiresAConnectionTheServerClosed) {
  Listener server;
  HttpClient pool("127.0.0.1", server.port);
  UniqueFd a = Connect(server.port);
  UniqueFd sa = server.Accept();
  UniqueFd b = Connect(server.port);
  UniqueFd sb = server.Accept();
  int live = b.get();
  pool.GiveBack(std::move(b));
  pool.GiveBack(std::move(a));
  sa.Reset();  // a's server side closes while a is idle: taken last-in first, it is skipped
  usleep(50 * 1000);
  UniqueFd got = pool.TakeIdle();
  EXPECT_EQ(got.get(), live);
  EXPECT_FALSE(pool.TakeIdle().valid());
}

}  // namespace
}  // namespace dsec::http
