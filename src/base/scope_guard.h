// ScopeGuard: runs a callable at scope exit unless dismissed (absl::Cleanup-like).
#pragma once

#include <utility>

namespace dsec {

template <typename F>
class [[nodiscard]] ScopeGuard {
 public:
  explicit ScopeGuard(F f) : f_(std::move(f)) {}
  ~ScopeGuard() {
    if (active_) f_();
  }
  ScopeGuard(ScopeGuard&& o) noexcept
      : f_(std::move(o.f_)), active_(std::exchange(o.active_, false)) {}
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  void Dismiss() { active_ = false; }

 private:
  F f_;
  bool active_ = true;
};

template <typename F>
ScopeGuard<F> MakeScopeGuard(F f) {
  return ScopeGuard<F>(std::move(f));
}

}  // namespace dsec
