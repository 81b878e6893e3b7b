// The edge's side of port_connect against a scripted agent on the other end of a socketpair:
// the connect answer, data and acks both ways, ends, refusal, silence, and an agent that
// ignores its window (a guest's root may replace its agent).
#include "backends/session/port_bridge.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "base/unique_fd.h"
#include "protocol/agent_ops.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::backends {
namespace {

using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

class PortBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    agent_.Reset(sv[1]);
    client_ = AgentClient::Create(io_.io(), UniqueFd(sv[0]));
    client_->Start([](const Status&) {});
  }
  void TearDown() override { client_->Close(); }

  void Say(FrameType type, uint8_t flags, uint32_t ch, std::string_view payload) {
    std::string bytes = protocol::EncodeFrameOrDie(type, flags, ch, payload);
    ASSERT_EQ(write(agent_.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // The next frame the edge sent (within 5 s).
  Frame Heard() {
    Frame f;
    while (!dec_.Next(&f)) {
      pollfd p{agent_.get(), POLLIN, 0};
      EXPECT_EQ(poll(&p, 1, 5000), 1) << "the edge said nothing";
      char buf[65536];
      ssize_t n = read(agent_.get(), buf, sizeof buf);
      EXPECT_GT(n, 0);
      if (n <= 0) return f;
      EXPECT_TRUE(dec_.Feed(std::string_view(buf, static_cast<size_t>(n))).ok());
    }
    return f;
  }
  // Opens a relay to `port` in the background; returns the agent's view of the request.
  std::future<StatusOr<UniqueFd>> Open(uint16_t port, int64_t timeout_ms, Frame* request) {
    auto f = std::async(std::launch::async, [this, port, timeout_ms] {
      return OpenPortRelay(io_.io(), client_, port, timeout_ms);
    });
    *request = Heard();
    return f;
  }
  static std::string ReadSome(int fd, size_t want) {
    std::string got;
    char buf[65536];
    while (got.size() < want) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 5000) != 1) break;
      ssize_t n = read(fd, buf, std::min(sizeof buf, want - got.size()));
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  IoRunner io_{1};
  std::shared_ptr<AgentClient> client_;
  UniqueFd agent_;
  protocol::FrameDecoder dec_;
};

TEST_F(PortBridgeTest, RelaysBothWaysWithAcksAndEnds) {
  Frame req;
  auto opened = Open(8080, 5000, &req);
  ASSERT_EQ(req.type, FrameType::kRequest);
  Json r = Json::parse(req.payload);
  EXPECT_EQ(r["op"], "port_connect");
  EXPECT_EQ(r["port"], 8080);
  const uint32_t ch = req.channel;
  Say(FrameType::kEvent, 0, ch, R"({"connected":true})");
  auto fd = opened.get();
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();

  // The client's bytes reach the agent as stdin data.
  ASSERT_EQ(write(fd->get(), "hello", 5), 5);
  Frame in = Heard();
  EXPECT_EQ(in.type, FrameType::kData);
  EXPECT_EQ(in.stream(), protocol::kStdin);
  EXPECT_EQ(in.payload, "hello");
  // The server's bytes reach the client; the edge acks what it delivered.
  Say(FrameType::kData, protocol::kStdout, ch, "world!");
  EXPECT_EQ(ReadSome(fd->get(), 6), "world!");
  Frame ack = Heard();
  EXPECT_EQ(ack.type, FrameType::kControl);
  EXPECT_EQ(Json::parse(ack.payload)["ack"], 6);
  // The server closed its side: the client reads the end after the data.
  Say(FrameType::kEvent, 0, ch, R"({"eof":true})");
  pollfd p{fd->get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  char c;
  EXPECT_EQ(read(fd->get(), &c, 1), 0);  // (the relay's end is non-blocking, as a socket is)
  // The client closes its side: the agent hears stdin's end.
  shutdown(fd->get(), SHUT_WR);
  Frame end = Heard();
  EXPECT_EQ(end.type, FrameType::kData);
  EXPECT_TRUE(end.eof());
  Say(FrameType::kResponse, 0, ch, "{}");
}

TEST_F(PortBridgeTest, RefusalAndSilenceAreErrors) {
  Frame req;
  auto opened = Open(9, 5000, &req);
  Say(FrameType::kResponse, 0, req.channel,
      protocol::ErrorJson(Unavailable("nothing listens on port 9 in the sandbox")).dump());
  auto fd = opened.get();
  EXPECT_EQ(fd.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find("nothing listens on port 9"), std::string::npos);

  auto silent = Open(10, 200, &req);
  auto late = silent.get();
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  Frame close = Heard();  // the edge gives up on the channel
  EXPECT_EQ(close.type, FrameType::kControl);
  EXPECT_EQ(close.channel, req.channel);
  EXPECT_TRUE(Json::parse(close.payload).contains("close"));
}

TEST_F(PortBridgeTest, AnAgentPastItsWindowEndsTheRelay) {
  Frame req;
  auto opened = Open(8080, 5000, &req);
  const uint32_t ch = req.channel;
  Say(FrameType::kEvent, 0, ch, R"({"connected":true})");
  auto fd = opened.get();
  ASSERT_TRUE(fd.ok());
  // The client reads nothing; the agent sends twice its window without waiting for acks.
  std::string chunk(protocol::kDataChunk, 'x');
  const size_t chunks = 2 * protocol::kPortWindow / protocol::kDataChunk;
  auto flood = std::async(std::launch::async, [&] {
    for (size_t i = 0; i < chunks; ++i) Say(FrameType::kData, protocol::kStdout, ch, chunk);
  });
  // The edge answers with a close (acks may come first, for what the socket took).
  bool closed = false;
  for (int i = 0; i < 64 && !closed; ++i) {
    Frame f = Heard();
    if (f.type == FrameType::kData && f.payload.empty()) break;  // nothing more was said
    if (f.type == FrameType::kControl && Json::parse(f.payload).contains("close")) closed = true;
  }
  if (flood.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "the edge stopped reading its agent";
    shutdown(agent_.get(), SHUT_RDWR);  // unblocks the flood
  }
  flood.wait();
  EXPECT_TRUE(closed) << "the edge queued past the window";
  // And the client's end is closed after at most what was queued.
  std::string got = ReadSome(fd->get(), 4 * protocol::kPortWindow);
  EXPECT_LE(got.size(), protocol::kPortWindow + 2 * protocol::kDataChunk + (1 << 20));
}

}  // namespace
}  // namespace dsec::backends
