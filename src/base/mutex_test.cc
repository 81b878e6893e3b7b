#include "base/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <thread>

namespace dsec {
namespace {

class Queue {
 public:
  void Push(int v) DSEC_EXCLUDES(mu_) {
    {
      MutexLock l(mu_);
      items_.push_back(v);
    }
    cv_.NotifyOne();
  }
  int Pop() DSEC_EXCLUDES(mu_) {
    MutexLock l(mu_);
    cv_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return !items_.empty(); });
    int v = items_.front();
    items_.pop_front();
    return v;
  }
  bool PopFor(std::chrono::milliseconds d, int* out) DSEC_EXCLUDES(mu_) {
    MutexLock l(mu_);
    if (!cv_.WaitFor(l, d, [&]() DSEC_REQUIRES(mu_) { return !items_.empty(); })) return false;
    *out = items_.front();
    items_.pop_front();
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::deque<int> items_ DSEC_GUARDED_BY(mu_);
};

TEST(MutexTest, ConditionVariableHandsValuesAcrossThreads) {
  Queue q;
  std::thread producer([&] {
    for (int i = 0; i < 1000; ++i) q.Push(i);
  });
  long sum = 0;
  for (int i = 0; i < 1000; ++i) sum += q.Pop();
  producer.join();
  EXPECT_EQ(sum, 999L * 1000 / 2);
}

TEST(MutexTest, TimedWaitTimesOutAndUnlockReleases) {
  Queue q;
  int v = 0;
  EXPECT_FALSE(q.PopFor(std::chrono::milliseconds(20), &v));
  q.Push(7);
  EXPECT_TRUE(q.PopFor(std::chrono::milliseconds(20), &v));
  EXPECT_EQ(v, 7);

  Mutex mu;
  MutexLock l(mu);
  EXPECT_FALSE(mu.TryLock());  // held by l (the analysis is told TryLock may fail)
  l.Unlock();
  if (mu.TryLock()) {
    mu.Unlock();
  } else {
    ADD_FAILURE() << "the mutex is still held after Unlock()";
  }
  l.Lock();  // released again by l's destructor
}

}  // namespace
}  // namespace dsec
