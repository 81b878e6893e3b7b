#include "edge/metrics.h"

#include <cstdio>

#include "base/strings.h"

namespace dsec::edge {

namespace {

// Label values are ours (methods, codes, states), but escape anyway: the format requires it.
std::string Escape(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

std::string Label(const char* k, const std::string& v) {
  return std::string(k) + "=\"" + Escape(v) + "\"";
}

// Seconds: 1 ms .. 60 s.
std::vector<double> LatencyBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  MutexLock l(mu_);
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::Render(const std::string& name, std::string* out) const {
  MutexLock l(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += name + "_bucket{le=\"" + FormatNumber(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  *out += name + "_sum " + FormatNumber(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics() : create_(LatencyBounds()), exec_(LatencyBounds()), fncall_(LatencyBounds()) {}

void Metrics::Bump(Labeled* m, const std::string& labels) {
  MutexLock l(mu_);
  (*m)[labels]++;
}

void Metrics::CountRequest(const std::string& method, int status) {
  // Label values come from a fixed set: a caller inventing methods (or, unauthenticated,
  // anything else) must not grow the metrics without bound.
  static const char* kMethods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"};
  std::string m = "other";
  for (const char* k : kMethods)
    if (method == k) m = k;
  if (status < 100 || status > 599) status = 0;
  Bump(&requests_, Label("method", m) + "," + Label("code", std::to_string(status)));
}
void Metrics::CountTrajectory(const std::string& event) {
  Bump(&trajectory_, Label("event", event));
}

void Metrics::CountLayer(const std::string& event) { Bump(&layers_, Label("event", event)); }

void Metrics::CountReject(const std::string& reason) { Bump(&rejects_, Label("reason", reason)); }
void Metrics::CountError(const std::string& code) { Bump(&errors_, Label("code", code)); }
void Metrics::CountFnCall(const std::string& runtime, const std::string& outcome) {
  Bump(&fncalls_, Label("runtime", runtime) + "," + Label("outcome", outcome));
}
void Metrics::CountDeleted(const std::string& reason) { Bump(&deleted_, Label("reason", reason)); }

void Metrics::RenderLabeled(const std::string& name, const Labeled& m, std::string* out) {
  for (const auto& [labels, n] : m) *out += name + "{" + labels + "} " + std::to_string(n) + "\n";
}

namespace {

void Describe(const char* name, const char* type, const char* help, std::string* out) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

std::string Metrics::Render(const Gauges& sandboxes, int64_t connections, int64_t accepted) const {
  std::string o;
  Describe("dsec_sandboxes", "gauge", "Sandboxes on this node by state and kind.", &o);
  for (const auto& [k, n] : sandboxes)
    o += "dsec_sandboxes{" + Label("state", k.first) + "," + Label("kind", k.second) + "} " +
         std::to_string(n) + "\n";
  Describe("dsec_http_connections", "gauge", "Open HTTP connections.", &o);
  o += "dsec_http_connections " + std::to_string(connections) + "\n";
  Describe("dsec_http_connections_accepted_total", "counter",
           "TCP connections the API accepted since the start.", &o);
  o += "dsec_http_connections_accepted_total " + std::to_string(accepted) + "\n";
  Describe("dsec_sandbox_create_seconds", "histogram",
           "Time to create a sandbox until it is running.", &o);
  create_.Render("dsec_sandbox_create_seconds", &o);
  Describe("dsec_exec_seconds", "histogram", "Duration of execs and shell commands.", &o);
  exec_.Render("dsec_exec_seconds", &o);
  Describe("dsec_fncall_seconds", "histogram", "Duration of function calls (without queueing).",
           &o);
  fncall_.Render("dsec_fncall_seconds", &o);
  Describe("dsec_network_denied_packets_total", "counter",
           "Packets from sandboxes their network policy refused, and calls the egress guard "
           "refused at connect()/send.",
           &o);
  o += "dsec_network_denied_packets_total " +
       std::to_string(network_denied_ ? network_denied_() : 0) + "\n";
  Describe("dsec_sandboxes_created_total", "counter", "Sandboxes created.", &o);
  o += "dsec_sandboxes_created_total " + std::to_string(created_.load()) + "\n";
  MutexLock l(mu_);
  Describe("dsec_sandboxes_deleted_total", "counter", "Sandboxes deleted, by reason.", &o);
  RenderLabeled("dsec_sandboxes_deleted_total", deleted_, &o);
  Describe("dsec_api_requests_total", "counter", "API requests by method and status code.", &o);
  RenderLabeled("dsec_api_requests_total", requests_, &o);
  Describe("dsec_rejects_total", "counter", "Requests refused for capacity or bounds.", &o);
  RenderLabeled("dsec_rejects_total", rejects_, &o);
  Describe("dsec_errors_total", "counter", "Error responses by error code.", &o);
  RenderLabeled("dsec_errors_total", errors_, &o);
  Describe("dsec_fncalls_total", "counter", "Function calls by runtime and outcome.", &o);
  RenderLabeled("dsec_fncalls_total", fncalls_, &o);
  Describe("dsec_trajectory_events_total", "counter",
           "Trajectory log: calls recorded, answered from the log (replayed), sandboxes made "
           "from it (materialized), checkpoints, calls it could not record.",
           &o);
  RenderLabeled("dsec_trajectory_events_total", trajectory_, &o);
  Describe("dsec_layer_events_total", "counter",
           "Image layers passed between nodes: fetched from a peer, fetches that failed (one per "
           "holder tried), served to a peer, serves refused (busy), cached layers evicted.",
           &o);
  RenderLabeled("dsec_layer_events_total", layers_, &o);
  Describe("dsec_layers_serving", "gauge", "Layer blobs being sent to peers now.", &o);
  o += "dsec_layers_serving " + std::to_string(layers_serving.load()) + "\n";
  return o;
}

}  // namespace dsec::edge
