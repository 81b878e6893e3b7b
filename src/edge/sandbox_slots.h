// Counted slots of something the edge holds on sandboxes' behalf (proxied connections, worker
// threads), capped per sandbox and node-wide, so that what one sandbox (or whoever drives it)
// can take of a shared edge resource is bounded. Thread-safe.
#pragma once

#include <climits>
#include <map>
#include <memory>
#include <string>

#include "base/mutex.h"
#include "base/status.h"

namespace dsec::edge {

class SandboxSlots {
 public:
  struct Limits {
    std::string what;  // "proxied connections"
    int max_total = INT_MAX;
    std::string total_knob;  // the config key of max_total ("" when uncapped)
    int max_per_sandbox = INT_MAX;
    std::string per_knob;
  };
  explicit SandboxSlots(Limits l) : l_(std::move(l)) {}
  // A slot held until the returned handle goes; kOverCapacity (a 429) when a cap is reached.
  StatusOr<std::shared_ptr<void>> Take(const std::string& sandbox_id);
  int total() const;
  int of(const std::string& sandbox_id) const;

 private:
  const Limits l_;
  mutable Mutex mu_;
  int total_ DSEC_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> per_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::edge
