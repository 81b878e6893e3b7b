// Pool scaling as a pure function of the pool's counts (PlanScale).
#include <gtest/gtest.h>

#include "backends/pools/pool.h"

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

}  // namespace
}  // namespace dsec::pools
