#include "backends/container/cpu_spread.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsec::backends::container {

CpuSpread::CpuSpread(std::vector<int> usable)
    : usable_(std::move(usable)), load_(usable_.size(), 0) {}

std::vector<int> CpusOf(const cpu_set_t& set) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

std::vector<int> CpuSpread::UsableNow() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  return CpusOf(set);
}

std::vector<int> CpuSpread::Take(double cpu) {
  size_t want = cpu <= 0 ? usable_.size() : static_cast<size_t>(std::ceil(cpu - 1e-9));
  if (want == 0) want = 1;
  if (want >= usable_.size()) return {};
  MutexLock l(mu_);
  std::vector<size_t> order(usable_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) DSEC_REQUIRES(mu_) { return load_[a] < load_[b]; });
  std::vector<int> out;
  for (size_t i = 0; i < want; ++i) {
    ++load_[order[i]];
    out.push_back(usable_[order[i]]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void CpuSpread::Claim(const std::vector<int>& cpus) {
  MutexLock l(mu_);
  if (cpus.size() >= usable_.size()) return;  // not pinned
  for (int c : cpus) {
    auto it = std::find(usable_.begin(), usable_.end(), c);
    if (it != usable_.end()) ++load_[static_cast<size_t>(it - usable_.begin())];
  }
}

void CpuSpread::Give(const std::vector<int>& cpus) {
  MutexLock l(mu_);
  for (int c : cpus) {
    auto it = std::find(usable_.begin(), usable_.end(), c);
    if (it != usable_.end()) {
      size_t i = static_cast<size_t>(it - usable_.begin());
      if (load_[i] > 0) --load_[i];
    }
  }
}

std::vector<int> CpuSpread::Load() {
  MutexLock l(mu_);
  return load_;
}

std::string CpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace dsec::backends::container
