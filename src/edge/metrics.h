// Prometheus metrics of one edge: counters, gauges supplied at scrape time, and latency
// histograms; rendered in the text exposition format 0.0.4 for GET /metrics.
// Thread safety: every method is thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/mutex.h"

namespace dsec::edge {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the _bucket/_sum/_count series for `name`.
  void Render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ DSEC_GUARDED_BY(mu_);  // one per bound plus +Inf
  double sum_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t count_ DSEC_GUARDED_BY(mu_) = 0;
};

class Metrics {
 public:
  Metrics();
  void ObserveCreate(double seconds) { create_.Observe(seconds); }
  void ObserveExec(double seconds) { exec_.Observe(seconds); }
  void ObserveFnCall(double seconds) { fncall_.Observe(seconds); }
  // outcome: done | timeout | rejected (queue full or timed out) | error
  void CountFnCall(const std::string& runtime, const std::string& outcome);
  void CountRequest(const std::string& method, int status);
  void CountReject(const std::string& reason);
  void CountError(const std::string& code);
  void CountCreated() { created_++; }
  void CountDeleted(const std::string& reason);
  // The trajectory log: recorded | replayed | materialized | checkpointed | not_recorded.
  void CountTrajectory(const std::string& event);
  // Layers passed between nodes (cluster_images.h): fetched | fetch_failed | served |
  // serve_refused | evicted.
  void CountLayer(const std::string& event);
  // Layer blobs being served to peers now.
  std::atomic<int64_t> layers_serving{0};

  using Gauges = std::map<std::pair<std::string, std::string>, int64_t>;  // (state, kind)
  std::string Render(const Gauges& sandboxes, int64_t connections, int64_t accepted) const;
  // Packets sandbox network policies refused, node-wide (set once, before serving).
  void SetNetworkDenied(std::function<uint64_t()> f) { network_denied_ = std::move(f); }

 private:
  using Labeled = std::map<std::string, uint64_t>;  // rendered label set -> count
  void Bump(Labeled* m, const std::string& labels);
  static void RenderLabeled(const std::string& name, const Labeled& m, std::string* out);

  Histogram create_, exec_, fncall_;
  std::function<uint64_t()> network_denied_;
  std::atomic<uint64_t> created_{0};
  mutable Mutex mu_;
  Labeled requests_ DSEC_GUARDED_BY(mu_);
  Labeled rejects_ DSEC_GUARDED_BY(mu_);
  Labeled errors_ DSEC_GUARDED_BY(mu_);
  Labeled deleted_ DSEC_GUARDED_BY(mu_);
  Labeled fncalls_ DSEC_GUARDED_BY(mu_);
  Labeled trajectory_ DSEC_GUARDED_BY(mu_);
  Labeled layers_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::edge
