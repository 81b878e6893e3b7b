#include "api/sandboxes_json.h"

#include <algorithm>
#include <cctype>

#include "api/network_json.h"
#include "api/pool_json.h"
#include "base/strings.h"
#include "http/json_body.h"
#include "images/store.h"

namespace dsec::api {

namespace {

// "network": a policy (net/policy.h) this node can enforce.
StatusOr<net::NetworkPolicy> ParseNetwork(const Json* n, bool node_has_network) {
  DSEC_ASSIGN_OR_RETURN(net::NetworkPolicy p, NetworkPolicyFromJson(n));
  if (p.mode != net::NetMode::kNone && !node_has_network)
    return Unimplemented("network mode \"" + std::string(net::NetModeName(p.mode)) +
                         "\" is not available: this edge runs with network: false");
  return p;
}

}  // namespace

StatusOr<std::optional<std::string>> ParseImageStack(const Json* j) {
  if (!j) return std::optional<std::string>();
  std::vector<std::string> names;
  if (j->is_string()) {
    names.push_back(j->get<std::string>());
  } else if (j->is_array() && !j->empty() && j->size() <= 16) {
    for (const auto& e : *j) {
      if (!e.is_string()) return InvalidArgument("\"image\" entries must be strings");
      names.push_back(e.get<std::string>());
    }
  } else {
    return InvalidArgument("\"image\" must be a name or a list of 1 to 16 names");
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string n = names[i];
    if (n == "host" || n == "host:latest") {
      if (i != 0) return InvalidArgument("\"host\" can only be the first image of a stack");
      n = "host";
    } else if (StartsWith(n, "sha256:")) {
      if (n.size() != 71 || n.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
        return InvalidArgument("bad layer digest in \"image\"");
    } else {
      DSEC_ASSIGN_OR_RETURN(n, images::NormalizeName(n));
    }
    out += (i ? "," : "") + n;
  }
  return std::optional<std::string>(out);
}

Status ValidateLabels(const BodyStringMap& labels) {
  for (const auto& [k, v] : labels)
    for (char c : k)
      if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '/')
        return InvalidArgument("label keys are 1-63 characters of A-Z a-z 0-9 . _ - /");
  return OkStatus();
}

StatusOr<CreateRequest> ParseCreateRequest(std::string_view body, const CreateLimits& limits) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  CreateRequest r;
  DSEC_ASSIGN_OR_RETURN(auto kind, b.String("kind", 32));
  DSEC_ASSIGN_OR_RETURN(r.image, ParseImageStack(b.Raw("image")));
  DSEC_ASSIGN_OR_RETURN(r.cpu, b.Number("cpu", 0.01, 64));
  DSEC_ASSIGN_OR_RETURN(r.memory_mb, b.Int("memory_mb", 16, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(r.pids, b.Int("pids", 8, 1 << 22));
  DSEC_ASSIGN_OR_RETURN(r.disk_mb, b.Int("disk_mb", 1, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(r.ttl_s, b.Int("ttl_s", 0, kMaxTtlS));
  DSEC_ASSIGN_OR_RETURN(r.idle_ttl_s, b.Int("idle_ttl_s", 0, kMaxTtlS));
  DSEC_ASSIGN_OR_RETURN(r.user, b.String("user", 64));
  DSEC_ASSIGN_OR_RETURN(r.workdir, b.String("workdir", 1024));
  DSEC_ASSIGN_OR_RETURN(r.env, b.StringMap("env", 256, 256, 32 << 10));
  DSEC_ASSIGN_OR_RETURN(r.labels, b.StringMap("labels", 64, 63, 256));
  DSEC_ASSIGN_OR_RETURN(r.count, b.Int("count", 1, limits.max_count));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_ASSIGN_OR_RETURN(r.node, b.String("node", 253));
  const Json* network = b.Raw("network");
  const Json* pool = b.Raw("pool");
  const Json* trajectory = b.Raw("trajectory");
  DSEC_RETURN_IF_ERROR(b.Finish());
  DSEC_ASSIGN_OR_RETURN(r.trajectory, ParseTrajectorySpec(trajectory));
  if (kind) {
    auto k = backends::KindFromName(*kind);
    if (!k) return InvalidArgument("kind must be \"container\" or \"microvm\"");
    if (std::find(limits.kinds.begin(), limits.kinds.end(), *k) == limits.kinds.end())
      return Unimplemented("kind \"" + *kind +
                           "\" is not available on this node (GET /v1/node says why)");
    r.kind = *k;
  }
  DSEC_ASSIGN_OR_RETURN(r.network, ParseNetwork(network, limits.network));
  // What the kind cannot do is refused now, before its image or pool is looked up.
  if (limits.check_kind) DSEC_RETURN_IF_ERROR(limits.check_kind(r));
  if (pool && !pool->is_null()) {
    if (!pool->is_string()) return InvalidArgument("\"pool\" must be a pool name");
    r.pool = pool->get<std::string>();
  }
  return r;
}

StatusOr<SandboxPatch> ParsePatchRequest(std::string_view body, bool network) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  SandboxPatch p;
  DSEC_ASSIGN_OR_RETURN(p.ttl_s, b.Int("ttl_s", 0, kMaxTtlS));
  DSEC_ASSIGN_OR_RETURN(p.idle_ttl_s, b.Int("idle_ttl_s", 0, kMaxTtlS));
  DSEC_ASSIGN_OR_RETURN(auto labels, b.StringMap("labels", 64, 63, 256, /*null_deletes=*/true));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  const Json* net_json = b.Raw("network");
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (net_json) {
    DSEC_ASSIGN_OR_RETURN(p.network, ParseNetwork(net_json, network));
  }
  if (labels) {
    DSEC_RETURN_IF_ERROR(ValidateLabels(*labels));
    p.labels = *labels;
  }
  return p;
}

Status CheckActionBody(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  return b.Finish();
}

Json SandboxListJson(const std::vector<SandboxRecord>& rs) { return {{"sandboxes", ToJson(rs)}}; }

Json StatsJson(const backends::SandboxStats& st) {
  Json j = {{"cpu_time_ms", static_cast<double>(st.cpu_usage_us) / 1000.0},
            {"memory_current", st.memory_current},
            {"memory_peak", st.memory_peak},
            {"memory_limit", st.memory_limit},
            {"disk_used", st.disk_used},
            {"disk_limit", st.disk_limit},
            {"disk_kind", st.disk_kind},
            {"pids", st.pids},
            {"oom_kills", st.oom_kills},
            {"exec_count", st.exec_count},
            {"network_denied", st.network_denied}};
  if (st.guest)
    j["guest"] = {{"memory_total", st.guest->memory_total},
                  {"memory_used", st.guest->memory_used},
                  {"pids", st.guest->pids}};
  return j;
}

Json JobActionJson(int affected) { return {{"affected", affected}}; }

Json HealthJson() { return {{"ok", true}}; }

namespace {

Json ToJson(const backends::KindCapabilities& c) {
  return {{"host_image", c.host_image},
          {"network", c.network},
          {"port_proxy", c.port_proxy},
          {"snapshot", c.snapshot},
          {"fncall_workers", c.fncall_workers}};
}

Json ToJson(const MicrovmFeatures& m) {
  if (!m.available) return {{"available", false}, {"reason", m.reason}};
  Json j = {{"available", true},
            {"accel", m.accel},
            {"kernel", m.kernel},
            {"templates", m.templates},
            {"templates_loaded", m.templates_loaded}};
  if (!m.accel_reason.empty()) j["accel_reason"] = m.accel_reason;
  return j;
}

Json OrNull(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

// The settings, and whether the network works (or why not).
Json ToJson(const NetworkFeatures& n) {
  if (!n.enabled) return {{"enabled", false}, {"reason", "network: false in the edge's config"}};
  const net::LazyNodeNetwork::Info& i = n.info;
  Json dns = {{"upstream", OrNull(i.dns_upstream)}, {"state", i.dns_state}};
  if (!i.dns_error.empty()) dns["error"] = i.dns_error;
  Json j = {
      {"enabled", true}, {"available", i.reason.empty()}, {"started", i.started},
      {"cidr", i.cidr},  {"uplink", OrNull(i.uplink)},    {"dns_upstream", OrNull(i.dns_upstream)},
      {"dns", dns}};
  if (!i.reason.empty()) j["reason"] = i.reason;
  // Known once the network has started: "on", or why containers have nftables alone.
  if (!i.egress_guard.empty()) j["egress_guard"] = i.egress_guard;
  return j;
}

}  // namespace

Json ToJson(const NodeFeatures& f) {
  const KernelFeatures& k = f.kernel;
  Json j = {{"kernel", k.kernel},
            {"userns", k.userns},
            {"clone_into_cgroup", k.clone_into_cgroup},
            {"cgroup_kill", k.cgroup_kill},
            {"socket_budget", k.socket_budget},
            {"proc_views", k.proc_views_reason.empty()}};
  if (!k.socket_budget) j["socket_budget_reason"] = k.socket_budget_reason;
  if (!k.proc_views_reason.empty()) j["proc_views_reason"] = k.proc_views_reason;
  j["microvm"] = ToJson(f.microvm);
  j["network"] = ToJson(f.network);
  Json kinds = Json::object();
  for (const auto& [kind, caps] : f.kinds)
    kinds[std::string(backends::KindName(kind))] = ToJson(caps);
  j["kinds"] = kinds;
  return j;
}

Json ToJson(const NodeInfo& n) {
  Json j = ToJson(n.report);
  j["version"] = n.version;
  j["instance"] = n.instance;
  j["backends"] = Json::array();
  for (backends::Kind k : n.backends) j["backends"].push_back(backends::KindName(k));
  j["pools"] = ToJson(n.pools);
  j["features"] = ToJson(n.features);  // open connections are in /metrics (dsec_http_connections)
  return j;
}

}  // namespace dsec::api
