// Pool scaling as a pure function of the pool's counts (PlanScale).
#include <gtest/gtest.h>

#include "backends/pools/pool.h"
#include "base/clock.h"

namespace dsec::pools {
namespace {

PoolCounts Counts(int idle, int busy, int starting, int queued) {
  PoolCounts c;
  c.idle = idle;
  c.busy = busy;
  c.starting = starting;
  c.queued = queued;
  c.idle_low = idle;
  return c;
}

TEST(PoolScaleTest, KeepsMinIdleWarm) {
  EXPECT_EQ(PlanScale(Counts(0, 0, 0, 0), 2, 8, false).start, 2);
  EXPECT_EQ(PlanScale(Counts(1, 3, 0, 0), 2, 8, false).start, 1);
  // Workers being made count as idle soon.
  EXPECT_EQ(PlanScale(Counts(1, 3, 1, 0), 2, 8, false).start, 0);
  EXPECT_EQ(PlanScale(Counts(2, 0, 0, 0), 2, 8, false).start, 0);
}

TEST(PoolScaleTest, GrowsForQueuedCallsUpToMax) {
  EXPECT_EQ(PlanScale(Counts(0, 4, 0, 3), 1, 8, false).start, 3);
  EXPECT_EQ(PlanScale(Counts(0, 4, 1, 3), 1, 8, false).start, 2);
  EXPECT_EQ(PlanScale(Counts(0, 6, 0, 9), 1, 8, false).start, 2);  // max 8
  EXPECT_EQ(PlanScale(Counts(0, 8, 0, 9), 1, 8, false).start, 0);
}

TEST(PoolScaleTest, AContainerPoolCountsOnlyIdleAgainstMax) {
  // Sandboxes taken from a container pool are gone from it: 8 taken do not stop a refill.
  EXPECT_EQ(PlanScale(Counts(0, 8, 0, 0), 2, 8, true).start, 2);
  EXPECT_EQ(PlanScale(Counts(0, 8, 0, 0), 2, 8, false).start, 0);
}

TEST(PoolScaleTest, ShrinksOnlyTheWindowsSurplusAndNeverWhileCallsWait) {
  PoolCounts c = Counts(5, 1, 0, 0);
  c.idle_low = 4;                                      // at least 4 were idle all window long
  EXPECT_EQ(PlanScale(c, 1, 8, false).retire_lru, 0);  // the window is not over yet
  c.window_over = true;
  EXPECT_EQ(PlanScale(c, 1, 8, false).retire_lru, 3);  // 4 - min_idle
  c.queued = 1;
  EXPECT_EQ(PlanScale(c, 1, 8, false).retire_lru, 0);
  c.queued = 0;
  c.idle_low = 0;  // every worker was busy at some moment
  EXPECT_EQ(PlanScale(c, 1, 8, false).retire_lru, 0);
}

TEST(PoolScaleTest, ALoweredMaxRetiresIdleWorkersOnly) {
  ScalePlan p = PlanScale(Counts(3, 4, 0, 0), 0, 5, false);
  EXPECT_EQ(p.retire_over_max, 2);
  EXPECT_EQ(p.start, 0);
  p = PlanScale(Counts(1, 6, 0, 0), 0, 5, false);
  EXPECT_EQ(p.retire_over_max, 1);  // busy ones finish their call first
  // The window's surplus counts first.
  PoolCounts c = Counts(4, 4, 0, 0);
  c.window_over = true;
  c.idle_low = 2;
  p = PlanScale(c, 0, 6, false);
  EXPECT_EQ(p.retire_lru, 2);
  EXPECT_EQ(p.retire_over_max, 0);
}

// A standby pool (expire_unused_s) expires when nobody asked it for a sandbox for that long;
// a miss counts as asking (the shape is still wanted).
TEST(PoolExpiryTest, APoolUnaskedForItsExpiryExpires) {
  PoolConfig cfg;
  cfg.name = "standby-x";
  cfg.kind = PoolKind::kMicrovm;
  cfg.expire_unused_s = 2;
  Pool p(cfg, nullptr, "node");
  int64_t t0 = MonotonicMs();
  EXPECT_FALSE(p.Expired(t0 + 1000));
  EXPECT_TRUE(p.Expired(t0 + 2500));
  EXPECT_EQ(p.TakeSandbox(), nullptr);  // none ready: a miss
  EXPECT_FALSE(p.Expired(MonotonicMs() + 1500));
  EXPECT_TRUE(p.Expired(MonotonicMs() + 2500));
  cfg.expire_unused_s = 0;  // a caller's pool: never
  Pool kept(cfg, nullptr, "node");
  EXPECT_FALSE(kept.Expired(MonotonicMs() + 86400 * 1000LL));
}

}  // namespace
}  // namespace dsec::pools
