#include "base/ids.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace dsec {
namespace {

TEST(IdsTest, SandboxIdShapeAndUniqueness) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewSandboxId("n1");
    EXPECT_EQ(id.rfind("sb-n1-", 0), 0u);
    EXPECT_EQ(id.size(), 6u + 12u);
    EXPECT_TRUE(IsSafeName(id));
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(IdsTest, InstanceIdIsStableAndDistinct) {
  EXPECT_EQ(InstanceIdForPath("/var/lib/dsec"), InstanceIdForPath("/var/lib/dsec"));
  EXPECT_NE(InstanceIdForPath("/var/lib/dsec"), InstanceIdForPath("/var/lib/dsec2"));
  EXPECT_EQ(InstanceIdForPath("/x").size(), 12u);
}

TEST(IdsTest, UnsafeNamesRejected) {
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "a/b", "a..b", std::string("a\0b", 3), "a b", "../x",
                                std::string(129, 'a')}) {
    EXPECT_FALSE(IsSafeName(bad)) << bad;
  }
  EXPECT_TRUE(IsSafeName("sb-node-abc.def_1"));
}

}  // namespace
}  // namespace dsec
