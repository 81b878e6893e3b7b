// The quota room codec both ends of a quota'd create use (Dsec-Quota, Dsec-Quota-Need).
#include "api/quota_room.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

TEST(QuotaRoomTest, RoundTripsWithAndWithoutTheHold) {
  QuotaRoom r{.hold = "a1b2", .sandboxes = 2, .memory_mb = 512, .cpu_milli = 1500};
  EXPECT_EQ(QuotaRoomText(r), "hold=a1b2;sandboxes=2;memory_mb=512;cpu_milli=1500");
  auto back = ParseQuotaRoom(QuotaRoomText(r), /*with_hold=*/true);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->hold, "a1b2");
  EXPECT_EQ(back->cpu_milli, 1500);
  QuotaRoom need{.sandboxes = 1, .memory_mb = 256, .cpu_milli = 1000};
  EXPECT_EQ(QuotaRoomText(need), "sandboxes=1;memory_mb=256;cpu_milli=1000");
  auto n = ParseQuotaRoom(QuotaRoomText(need), /*with_hold=*/false);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->memory_mb, 256);
}

TEST(QuotaRoomTest, RefusesWhatIsMissingOrMalformed) {
  for (const char* bad : {"", "sandboxes=1;memory_mb=2;cpu_milli=3",  // no hold
                          "hold=x;sandboxes=1;memory_mb=2",           // no cpu
                          "hold=x;sandboxes=-1;memory_mb=2;cpu_milli=3",
                          "hold=x;sandboxes=one;memory_mb=2;cpu_milli=3",
                          "hold=;sandboxes=1;memory_mb=2;cpu_milli=3"})
    EXPECT_FALSE(ParseQuotaRoom(bad, /*with_hold=*/true).ok()) << bad;
  // A need has no hold.
  EXPECT_FALSE(ParseQuotaRoom("hold=x;sandboxes=1;memory_mb=2;cpu_milli=3", false).ok());
  EXPECT_FALSE(ParseQuotaRoom("sandboxes=1;memory_mb=2", false).ok());
  std::string long_hold(65, 'h');
  EXPECT_FALSE(
      ParseQuotaRoom("hold=" + long_hold + ";sandboxes=1;memory_mb=2;cpu_milli=3", true).ok());
}

}  // namespace
}  // namespace dsec::api
