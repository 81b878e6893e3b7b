#include "isolation/features.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace dsec::isolation {
namespace {

TEST(FeaturesTest, SwitchesForceFallbacks) {
  FeatureSwitches off;
  off.userns = off.clone_into_cgroup = off.cgroup_kill = false;
  auto f = KernelFeatures::Detect(off);
  EXPECT_FALSE(f.userns);
  EXPECT_EQ(f.userns_reason, "disabled by configuration");
  EXPECT_FALSE(f.clone_into_cgroup);
  EXPECT_FALSE(f.cgroup_kill);
  EXPECT_NE(f.Describe().find("userns=off"), std::string::npos);
}

TEST(FeaturesPrivilegedTest, ProbeMatchesTheKernel) {
  if (geteuid() != 0) GTEST_SKIP() << "the userns probe needs root";
  auto f = KernelFeatures::Detect({});
  EXPECT_FALSE(f.kernel_release.empty());
  if (KernelVersionCode() >= 6006) {
    EXPECT_TRUE(f.userns) << f.userns_reason;  // idmapped layers + tmpfs user xattrs
  }
  EXPECT_EQ(f.cgroup_kill, KernelVersionCode() >= 5014);
}

}  // namespace
}  // namespace dsec::isolation
