// The manager's admission: what a node can ever hold, what it may admit now (memory and
// sandbox count, warm pools included, which give back room on demand), and the node's memory
// figures they start from.
#include <algorithm>
#include <fstream>

#include "edge/manager.h"

namespace dsec::edge {

int64_t NodeMemoryMb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb / 1024;
    in.ignore(256, '\n');
  }
  return 1024;
}

int64_t ReserveMemoryMb(int64_t node_mb, int64_t configured) {
  return configured >= 0 ? configured : std::max<int64_t>(1024, node_mb / 10);
}

int64_t SandboxMemoryMb(int64_t node_mb, int64_t configured_reserve) {
  return std::max<int64_t>(256, node_mb - ReserveMemoryMb(node_mb, configured_reserve));
}

// --- Manager: admission -------------------------------------------------------------------

StatusOr<backends::KindCapabilities> Manager::Capabilities(backends::Kind kind) const {
  backends::Backend* backend = BackendFor(kind);
  if (!backend)
    return Unimplemented("kind \"" + std::string(backends::KindName(kind)) +
                         "\" is not available on this node");
  return backend->Capabilities();
}

Status Manager::FitsEver(const CreateParams& p, int count) const {
  const Resources& r = p.resources;
  backends::Backend* backend = BackendFor(p.kind);
  if (!backend)
    return Unimplemented("kind \"" + std::string(backends::KindName(p.kind)) +
                         "\" is not available on this node");
  // What the kind cannot do at all is refused before anything is admitted or recorded.
  DSEC_RETURN_IF_ERROR(backends::CheckCapabilities(p.kind, backend->Capabilities(), p.image,
                                                   p.network, /*worker=*/false));
  const Resources max = backend->Largest();
  auto never = [](const std::string& what, const std::string& why) {
    return ResourceExhausted(what + " can never fit this node: " + why);
  };
  const int64_t memory_max =
      max.memory_mb > 0 ? std::min(max.memory_mb, admit_memory_mb_) : admit_memory_mb_;
  if (r.memory_mb > memory_max) {
    std::string why = "one sandbox may have at most " + std::to_string(memory_max) + " MiB";
    if (memory_max == admit_memory_mb_)
      why += " (admit_memory_mb: the node's " + std::to_string(NodeMemoryMb()) +
             " MiB less reserve_memory_mb " + std::to_string(reserve_memory_mb_) +
             ", times memory_overcommit " + FormatNumber(cfg_.memory_overcommit) + ")";
    else
      why += " (the largest its backend can give)";
    return never("memory_mb " + std::to_string(r.memory_mb), why);
  }
  if (r.memory_mb * count > admit_memory_mb_)
    return never(
        std::to_string(count) + " sandboxes of " + std::to_string(r.memory_mb) + " MiB",
        "it admits " + std::to_string(admit_memory_mb_) + " MiB in all (create fewer at once)");
  if (max.cpu > 0 && r.cpu > max.cpu)
    return never("cpu " + FormatNumber(r.cpu), "it has " + FormatNumber(max.cpu) + " CPUs");
  if (max.disk_mb > 0 && r.disk_mb > max.disk_mb)
    return never("disk_mb " + std::to_string(r.disk_mb),
                 "a sandbox disk may have at most " + std::to_string(max.disk_mb) +
                     " MiB (the size of disk_dir's filesystem)");
  if (budget_.sandbox_pids > 0 && r.pids > budget_.sandbox_pids)
    return never("pids " + std::to_string(r.pids),
                 "all sandboxes together may hold " + std::to_string(budget_.sandbox_pids) +
                     " processes (reserve_pids and kernel.threads-max set it)");
  return OkStatus();
}

Status Manager::Admit(const CreateParams& p, int count) {
  // Caller holds mu_.
  DSEC_RETURN_IF_ERROR(FitsEver(p, count));
  return AdmitLocked(count, p.resources.memory_mb * count, /*pool_included=*/false);
}

Status Manager::AdmitLocked(int64_t count, int64_t memory_mb, bool pool_included) {
  // Pools' workers and ready sandboxes are sandboxes of this node too.
  auto [pooled, pooled_mb] = pools_ ? pools_->Usage() : std::pair<int64_t, int64_t>{0, 0};
  if (pool_included) {  // the pool counts the one it asks for already
    pooled = std::max<int64_t>(0, pooled - count);
    pooled_mb = std::max<int64_t>(0, pooled_mb - memory_mb);
    // Room pools gave up for an explicit create is that create's, not a refill's.
    pooled += reserved_;
    pooled_mb += reserved_mb_;
  }
  int64_t n = static_cast<int64_t>(entries_.size()) + pooled;
  if (n + count > cfg_.max_sandboxes) {
    metrics_->CountReject("max_sandboxes");
    return OverCapacity("node is full: " + std::to_string(n) + " of " +
                        std::to_string(cfg_.max_sandboxes) + " sandboxes (" +
                        std::to_string(pooled) + " of them in pools)");
  }
  if (files_.nofile > 0 && n + count > files_.max_sandboxes) {  // (nofile 0: not sized)
    metrics_->CountReject("open_files");
    return OverCapacity("the edge is at its open-file budget: " + std::to_string(n) +
                        " sandboxes of the " + std::to_string(files_.max_sandboxes) +
                        " its RLIMIT_NOFILE of " + std::to_string(files_.nofile) + " holds");
  }
  if (memory_mb_ + pooled_mb + memory_mb > admit_memory_mb_) {
    metrics_->CountReject("memory");
    return OverCapacity(
        "node memory is fully committed: " + std::to_string(memory_mb_ + pooled_mb) + " of " +
        std::to_string(admit_memory_mb_) + " MiB (" + std::to_string(pooled_mb) + " MiB in pools)");
  }
  return OkStatus();
}

bool Manager::MakeRoomFromPools(const CreateParams& p, int count) {
  if (!pools_) return false;
  const int64_t mb = p.resources.memory_mb * count;
  int64_t over_n = 0, over_mb = 0;
  {
    MutexLock l(mu_);
    // A create that could never fit (its 422) must not cost the pools their warm workers.
    if (!FitsEver(p, count).ok()) return false;
    auto [pooled, pooled_mb] = pools_->Usage();
    int64_t max_n = cfg_.max_sandboxes;
    if (files_.nofile > 0) max_n = std::min<int64_t>(max_n, files_.max_sandboxes);
    int64_t n = static_cast<int64_t>(entries_.size()) + reserved_;
    over_n = n + pooled + count - max_n;
    over_mb = memory_mb_ + reserved_mb_ + pooled_mb + mb - admit_memory_mb_;
    // Only when the pools' idle sandboxes are what stands in the way.
    if ((over_n <= 0 && over_mb <= 0) || n + count > max_n ||
        memory_mb_ + reserved_mb_ + mb > admit_memory_mb_)
      return false;
    reserved_ += count;
    reserved_mb_ += mb;
  }
  auto given = pools_->YieldIdle(std::max<int64_t>(0, over_n), std::max<int64_t>(0, over_mb));
  for (auto& sb : given)
    if (Status s = sb->Destroy(); !s.ok())
      DSEC_LOG_WARN("pool sandbox given up for a create not destroyed: sandbox={} error={}",
                    sb->id(), s.ToString());
  if (!given.empty())
    DSEC_LOG_INFO("pools gave up {} idle sandboxes for a create of {}", given.size(), count);
  return true;
}

void Manager::ReleaseRoomLocked(const CreateParams& p, int count) {
  reserved_ -= count;
  reserved_mb_ -= p.resources.memory_mb * count;
}

Status Manager::AdmitPoolSandbox(int64_t memory_mb) {
  MutexLock l(mu_);
  if (shut_down_) return Unavailable("the edge is shutting down");
  return AdmitLocked(1, memory_mb, /*pool_included=*/true);
}

}  // namespace dsec::edge
