#include "edge/sandbox_slots.h"

namespace dsec::edge {

StatusOr<std::shared_ptr<void>> SandboxSlots::Take(const std::string& sandbox_id) {
  MutexLock l(mu_);
  if (total_ >= l_.max_total)
    return Status(StatusCode::kOverCapacity, "the node holds " + std::to_string(total_) + " " +
                                                 l_.what + ", its limit (" + l_.total_knob +
                                                 "); retry later");
  int& mine = per_[sandbox_id];
  if (mine >= l_.max_per_sandbox)
    return Status(StatusCode::kOverCapacity,
                  "sandbox " + sandbox_id + " holds " + std::to_string(mine) + " " + l_.what +
                      ", its limit (" + l_.per_knob + "); retry when some are done");
  ++mine;
  ++total_;
  return std::shared_ptr<void>(nullptr, [this, sandbox_id](void*) {
    MutexLock l(mu_);
    --total_;
    if (--per_[sandbox_id] == 0) per_.erase(sandbox_id);
  });
}

int SandboxSlots::total() const {
  MutexLock l(mu_);
  return total_;
}

int SandboxSlots::of(const std::string& sandbox_id) const {
  MutexLock l(mu_);
  auto it = per_.find(sandbox_id);
  return it == per_.end() ? 0 : it->second;
}

}  // namespace dsec::edge
