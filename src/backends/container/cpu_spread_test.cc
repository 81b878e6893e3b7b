#include "backends/container/cpu_spread.h"

#include <gtest/gtest.h>

namespace dsec::backends::container {
namespace {

TEST(CpuSpreadTest, GivesCeilOfTheCapOnTheLeastLoadedCpus) {
  CpuSpread s({0, 1, 2, 3});
  EXPECT_EQ(s.Take(0.5), (std::vector<int>{0}));
  EXPECT_EQ(s.Take(1.0), (std::vector<int>{1}));
  EXPECT_EQ(s.Take(1.5), (std::vector<int>{2, 3}));
  EXPECT_EQ(s.Load(), (std::vector<int>{1, 1, 1, 1}));
  auto two = s.Take(2);
  EXPECT_EQ(two, (std::vector<int>{0, 1}));
  // A cap of every CPU (or none) is not pinned and not counted.
  EXPECT_TRUE(s.Take(4).empty());
  EXPECT_TRUE(s.Take(64).empty());
  EXPECT_TRUE(s.Take(0).empty());
  EXPECT_EQ(s.Load(), (std::vector<int>{2, 2, 1, 1}));
  s.Give(two);
  EXPECT_EQ(s.Load(), (std::vector<int>{1, 1, 1, 1}));
  // Adopted sandboxes count again; unknown CPUs and unpinned masks are ignored.
  s.Claim({3});
  s.Claim({9});
  s.Claim({0, 1, 2, 3});
  EXPECT_EQ(s.Load(), (std::vector<int>{1, 1, 1, 2}));
  EXPECT_EQ(s.Take(1), (std::vector<int>{0}));
  s.Give({7});  // unknown: nothing
  EXPECT_EQ(s.Load(), (std::vector<int>{2, 1, 1, 2}));
}

TEST(CpuSpreadTest, ASingleCpuNodeNeverPins) {
  CpuSpread s({0});
  EXPECT_TRUE(s.Take(0.25).empty());
  EXPECT_EQ(s.Load(), (std::vector<int>{0}));
}

TEST(CpuSpreadTest, CpuListText) {
  EXPECT_EQ(CpuListText({}), "");
  EXPECT_EQ(CpuListText({1}), "1");
  EXPECT_EQ(CpuListText({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(3, &set);
  CPU_SET(4, &set);
  EXPECT_EQ(CpusOf(set), (std::vector<int>{3, 4}));
}

}  // namespace
}  // namespace dsec::backends::container
