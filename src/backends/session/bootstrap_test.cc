// The agent bootstrap against a scripted agent on the other end of a socketpair.
#include "backends/session/bootstrap.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "base/clock.h"
#include "base/fd_passing.h"
#include "base/unique_fd.h"

namespace dsec::backends {
namespace {

using protocol::Frame;
using protocol::FrameType;

class BootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    edge_.Reset(sv[0]);
    agent_.Reset(sv[1]);
  }
  // The scripted agent says something.
  void Say(FrameType type, const Json& j) { Raw(protocol::EncodeFrameOrDie(type, 0, 0, j.dump())); }
  void Raw(const std::string& bytes) {
    ASSERT_EQ(write(agent_.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // The next frame the edge sent, with any fds that came along.
  Frame Heard(std::vector<UniqueFd>* fds = nullptr) {
    protocol::FrameDecoder dec;
    Frame f;
    std::string chunk;
    while (!dec.Next(&f)) {
      std::vector<UniqueFd> got;
      auto n = RecvWithFds(agent_.get(), 65536, 8, &chunk, &got);
      EXPECT_TRUE(n.ok() && *n > 0);
      if (!n.ok() || *n == 0) return f;
      for (auto& fd : got)
        if (fds) fds->push_back(std::move(fd));
      EXPECT_TRUE(dec.Feed(chunk).ok());
    }
    return f;
  }
  static int64_t In(int ms) { return MonotonicMs() + ms; }

  UniqueFd edge_, agent_;
};

TEST_F(BootstrapTest, HelloSetupWithFdsReady) {
  Say(FrameType::kHello, protocol::Encode(protocol::Hello{protocol::kProtocolVersion, 1, {}}));
  AgentBootstrap boot(edge_.get());
  auto hello = boot.ExpectHello(In(5000));
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->pid, 1);
  UniqueFd passed(eventfd(0, EFD_CLOEXEC));
  ASSERT_TRUE(boot.SendSetup(Json{{"sandbox_id", "sb1"}}, {passed.get()}).ok());
  std::vector<UniqueFd> fds;
  Frame setup = Heard(&fds);
  EXPECT_EQ(setup.type, FrameType::kSetup);
  EXPECT_EQ(ParseJson(setup.payload).value()["sandbox_id"], "sb1");
  EXPECT_EQ(fds.size(), 1u);
  Say(FrameType::kReady, protocol::Encode(protocol::Ready{1, 17}));
  auto ready = boot.ExpectReady(In(5000));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(ready->layer_fd, 17);
}

TEST_F(BootstrapTest, FramesSplitAcrossWritesAndBackToBackArrive) {
  std::string hello = protocol::EncodeFrameOrDie(FrameType::kHello, 0, 0,
                                                 protocol::Encode(protocol::Hello{}).dump());
  std::string ready = protocol::EncodeFrameOrDie(FrameType::kReady, 0, 0,
                                                 protocol::Encode(protocol::Ready{}).dump());
  Raw(hello.substr(0, 5));
  AgentBootstrap boot(edge_.get());
  std::thread rest([&] {
    usleep(50 * 1000);
    Raw(hello.substr(5) + ready);
  });
  EXPECT_TRUE(boot.ExpectHello(In(5000)).ok());
  rest.join();
  // Already buffered with the hello: no read needed.
  EXPECT_TRUE(boot.ExpectReady(In(5000)).ok());
}

TEST_F(BootstrapTest, AnAgentThatCannotStartSaysWhy) {
  Say(FrameType::kError, protocol::ErrorJson(NotFound("no /dev/vda")));
  auto hello = AgentBootstrap(edge_.get()).ExpectHello(In(5000));
  EXPECT_EQ(hello.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(hello.status().message().find("no /dev/vda"), std::string::npos);
}

TEST_F(BootstrapTest, SetupErrorsAndStrangeFramesAreErrors) {
  Say(FrameType::kHello, protocol::Encode(protocol::Hello{}));
  Say(FrameType::kError, protocol::ErrorJson(FailedPrecondition("mount failed")));
  AgentBootstrap boot(edge_.get());
  ASSERT_TRUE(boot.ExpectHello(In(5000)).ok());
  auto ready = boot.ExpectReady(In(5000));
  EXPECT_EQ(ready.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ready.status().message(), "mount failed");

  Say(FrameType::kLog, Json{{"line", "x"}});
  EXPECT_EQ(boot.ExpectReady(In(5000)).status().code(), StatusCode::kInternal);
}

TEST_F(BootstrapTest, VersionsThisEdgeDoesNotSpeakAreRefused) {
  protocol::Hello future;
  future.version = protocol::kProtocolVersion + 1;
  Say(FrameType::kHello, protocol::Encode(future));
  EXPECT_EQ(AgentBootstrap(edge_.get()).ExpectHello(In(5000)).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(BootstrapTest, GarbageIsAnError) {
  Raw(std::string(64, 'x'));
  EXPECT_FALSE(AgentBootstrap(edge_.get()).ExpectHello(In(5000)).ok());
}

TEST_F(BootstrapTest, SilenceHangUpAndCarrierExitGoThroughTheKindsExplanation) {
  std::vector<StatusCode> explained;
  AgentCarrier c;
  c.name = "the test agent";
  c.explain = [&](Status raw) {
    explained.push_back(raw.code());
    return raw.WithContext("explained");
  };
  {
    AgentBootstrap boot(edge_.get(), c);
    auto s = boot.ExpectHello(In(100)).status();
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(s.message().find("the test agent did not answer within"), std::string::npos);
    EXPECT_NE(s.message().find("explained"), std::string::npos);
  }
  // The carrier (QEMU) died while the connection stays open.
  UniqueFd exited(eventfd(1, EFD_CLOEXEC));
  c.exit_fd = exited.get();
  {
    AgentBootstrap boot(edge_.get(), c);
    int64_t t0 = MonotonicMs();
    EXPECT_EQ(boot.ExpectHello(In(10000)).status().code(), StatusCode::kUnavailable);
    EXPECT_LT(MonotonicMs() - t0, 5000);
  }
  c.exit_fd = -1;
  agent_.Reset();
  {
    AgentBootstrap boot(edge_.get(), c);
    EXPECT_EQ(boot.ExpectHello(In(10000)).status().code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(explained,
            (std::vector<StatusCode>{StatusCode::kDeadlineExceeded, StatusCode::kUnavailable,
                                     StatusCode::kUnavailable}));
}

TEST_F(BootstrapTest, ReauthenticateSendsTheTypedSecretAndSkipsStaleBytes) {
  // What the agent wrote to an edge that died unread: output frames, and junk holding the
  // magic.
  Say(FrameType::kData, Json{{"x", std::string(20000, 'o')}});
  Raw("DS\x01garbage-DS");
  Say(FrameType::kHello, protocol::Encode(protocol::Hello{protocol::kProtocolVersion, 1, {"sh1"}}));
  auto hello = Reauthenticate(edge_.get(), "s3cret", In(5000));
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->shells, std::vector<std::string>{"sh1"});
  Frame auth = Heard();
  EXPECT_EQ(auth.type, FrameType::kAuth);
  auto a = protocol::DecodeAs<protocol::Auth>(ParseJson(auth.payload).value());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->secret, "s3cret");
}

TEST_F(BootstrapTest, ReauthenticateRefusedTimedOutOrHungUp) {
  Say(FrameType::kError, protocol::ErrorJson(Status(StatusCode::kUnauthenticated, "bad secret")));
  EXPECT_EQ(Reauthenticate(edge_.get(), "wrong", In(5000)).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(Reauthenticate(edge_.get(), "s", In(100)).status().code(),
            StatusCode::kDeadlineExceeded);
  agent_.Reset();
  EXPECT_EQ(Reauthenticate(edge_.get(), "s", In(5000)).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dsec::backends
