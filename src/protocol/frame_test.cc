#include "protocol/frame.h"

#include <gtest/gtest.h>

#include <random>

namespace dsec::protocol {
namespace {

TEST(FrameTest, RoundTripAcrossArbitrarySplits) {
  std::string wire;
  ASSERT_TRUE(EncodeFrame(FrameType::kRequest, 0, 7, R"({"op":"ping"})", &wire).ok());
  ASSERT_TRUE(
      EncodeFrame(FrameType::kData, kStdout | kFlagEof, 9, std::string(70000, 'x'), &wire).ok());
  ASSERT_TRUE(EncodeFrame(FrameType::kResponse, 0, 7, "", &wire).ok());
  for (size_t step : {1u, 5u, 12u, 13u, 4096u, 1u << 20}) {
    FrameDecoder d;
    std::vector<Frame> got;
    for (size_t i = 0; i < wire.size(); i += step) {
      ASSERT_TRUE(d.Feed(std::string_view(wire).substr(i, step)).ok());
      Frame f;
      while (d.Next(&f)) got.push_back(f);
    }
    ASSERT_EQ(got.size(), 3u) << step;
    EXPECT_EQ(got[0].type, FrameType::kRequest);
    EXPECT_EQ(got[0].channel, 7u);
    EXPECT_EQ(got[0].payload, R"({"op":"ping"})");
    EXPECT_EQ(got[1].stream(), kStdout);
    EXPECT_TRUE(got[1].eof());
    EXPECT_EQ(got[1].payload.size(), 70000u);
    EXPECT_EQ(got[2].payload, "");
    EXPECT_EQ(d.buffered(), 0u);
  }
}

TEST(FrameTest, RejectsBadMagicTypeAndSize) {
  FrameDecoder d1;
  EXPECT_FALSE(d1.Feed("GET / HTTP/1.1\r\n").ok());
  EXPECT_TRUE(d1.failed());

  std::string bad_type = EncodeFrameOrDie(FrameType::kData, 0, 1, "x");
  bad_type[2] = 99;
  FrameDecoder d2;
  EXPECT_FALSE(d2.Feed(bad_type).ok());

  std::string huge = EncodeFrameOrDie(FrameType::kData, 0, 1, "");
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';
  FrameDecoder d3;
  Status s = d3.Feed(huge);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge);

  std::string out;
  EXPECT_FALSE(EncodeFrame(FrameType::kData, 0, 1, std::string(kMaxPayload + 1, 'a'), &out).ok());
}

TEST(FrameTest, GarbageAfterValidFrameFailsButFrameIsDelivered) {
  std::string wire = EncodeFrameOrDie(FrameType::kLog, 0, 0, "hi") + std::string(20, '\x01');
  FrameDecoder d;
  (void)d.Feed(wire);
  Frame f;
  EXPECT_TRUE(d.Next(&f));
  EXPECT_EQ(f.payload, "hi");
  EXPECT_FALSE(d.Next(&f));
  EXPECT_TRUE(d.failed());
}

TEST(FrameTest, RandomBytesNeverCrashAndStayBounded) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 2000; ++iter) {
    FrameDecoder d(4096);
    std::string junk(rng() % 300, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    if (iter % 2) junk.insert(0, EncodeFrameOrDie(FrameType::kEvent, 0, 3, "{}"));
    (void)d.Feed(junk);
    Frame f;
    while (d.Next(&f)) EXPECT_LE(f.payload.size(), 4096u);
    EXPECT_LE(d.buffered(), junk.size());
  }
}

}  // namespace
}  // namespace dsec::protocol
