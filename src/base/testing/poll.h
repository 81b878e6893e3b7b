// How tests wait for something to happen: poll the condition with a deadline, never a fixed
// sleep that is too short on a loaded machine and too long everywhere else.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace dsec::testing {

// Polls `cond` (1 ms apart at first, backing off to 20 ms) until it returns true or
// `timeout_ms` passed. Returns its last answer: EXPECT_TRUE(PollUntil(...)) reads as the check.
template <typename F>
bool PollUntil(F&& cond, int64_t timeout_ms = 10000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int64_t pause_ms = 1;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min<int64_t>(pause_ms * 2, 20);
  }
  return true;
}

}  // namespace dsec::testing
