// The node-wide bound on exec output the edge holds in memory: output being collected for a
// buffered exec's result, and the kept results of background execs. Each exec's output has
// its own cap (max_output_bytes); this bounds all of them together, so many sandboxes
// flooding output at once cannot grow the edge past `limit` (what does not fit is dropped
// and the result says truncated, as for the per-exec cap).
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace dsec::edge {

class OutputBudget {
 public:
  explicit OutputBudget(uint64_t limit) : limit_(limit) {}

  // One exec's share: grows by Take, all of it returned when the Charge is destroyed.
  class Charge {
   public:
    explicit Charge(OutputBudget* b) : budget_(b) {}
    ~Charge() { budget_->used_.fetch_sub(held_); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    // Up to `want` more bytes: what the budget has left of them.
    uint64_t Take(uint64_t want);

   private:
    OutputBudget* budget_;
    uint64_t held_ = 0;  // used by one exec's observer at a time
  };

  std::shared_ptr<Charge> NewCharge() { return std::make_shared<Charge>(this); }
  uint64_t used() const { return used_.load(); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

inline uint64_t OutputBudget::Charge::Take(uint64_t want) {
  uint64_t cur = budget_->used_.load();
  while (true) {
    uint64_t room = cur >= budget_->limit_ ? 0 : budget_->limit_ - cur;
    uint64_t got = want < room ? want : room;
    if (got == 0) return 0;
    if (budget_->used_.compare_exchange_weak(cur, cur + got)) {
      held_ += got;
      return got;
    }
  }
}

}  // namespace dsec::edge
