// Sandboxes as the REST API writes them (/v1/sandboxes..., /v1/jobs, /v1/health, /v1/node):
// the one place the create, PATCH and action bodies are parsed into typed requests, and the
// sandbox routes' answers other than the records of records.h rendered. The edge's sandbox
// handlers (edge/api_sandboxes.cc) check the typed requests against the node (its pools, its
// images, what each kind can do) and fill the records; they hold no JSON of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/records.h"
#include "api/trajectory_json.h"
#include "backends/kind.h"
#include "backends/pools/pool.h"
#include "backends/sandbox.h"
#include "backends/sandbox_types.h"
#include "base/json.h"
#include "base/status.h"
#include "net/node_network.h"
#include "net/policy.h"

namespace dsec::api {

inline constexpr int64_t kMaxTtlS = 30 * 86400;

// A map of strings as a body sends it (null values where the field allows them).
using BodyStringMap = std::map<std::string, std::optional<std::string>>;

// POST /v1/sandboxes as sent: a field left out is nullopt (the node's default, or its pool's).
struct CreateRequest {
  std::optional<backends::Kind> kind;  // one the node serves
  // A name or a stack (the first at the bottom) of normalized names ("host" first only,
  // "name:tag" or "sha256:<hex>" layers) joined by ','.
  std::optional<std::string> image;
  std::optional<double> cpu;
  std::optional<int64_t> memory_mb, pids, disk_mb;
  std::optional<int64_t> ttl_s, idle_ttl_s;  // 0: none
  std::optional<std::string> user, workdir;  // not yet checked (the edge does, after the pool)
  std::optional<BodyStringMap> env;
  std::optional<BodyStringMap> labels;       // keys not yet checked (ValidateLabels)
  net::NetworkPolicy network;                // one the node can enforce
  std::optional<std::string> pool;           // a container pool's name
  std::optional<int64_t> count;              // given: the answer is a list
  std::optional<TrajectorySpec> trajectory;  // record (or resume) a trajectory log
  // An admin's pin to one node (a cluster's node name; the edge checks it is its own).
  std::optional<std::string> node;
};

// The node's side of a create's checks.
struct CreateLimits {
  int max_count = 1;                  // "count" at most
  std::vector<backends::Kind> kinds;  // the kinds the node serves
  bool network = false;               // the node has a sandbox network
  // What the kind can do, checked once the kind, image and network are read and before the
  // pool is (nullptr: no check). Its error is the answer.
  std::function<Status(const CreateRequest&)> check_kind;
};

// Checks in this order, the first error the answer: the body's fields (types and ranges, no
// unknown ones), the kind, the network, check_kind, "pool". InvalidArgument naming the field,
// or Unimplemented for a kind or a network this node does not have.
StatusOr<CreateRequest> ParseCreateRequest(std::string_view body, const CreateLimits& limits);

// "image": a name or a list of 1 to 16 (absent: nullopt), normalized as CreateRequest::image.
StatusOr<std::optional<std::string>> ParseImageStack(const Json* j);

// Label keys are 1-63 characters of A-Z a-z 0-9 . _ - / (the sizes are the body's checks).
Status ValidateLabels(const BodyStringMap& labels);

// PATCH /v1/sandboxes/{id}: what changes; labels with a null value are deleted.
struct SandboxPatch {
  std::optional<int64_t> ttl_s, idle_ttl_s;
  BodyStringMap labels;                       // nullopt deletes
  std::optional<net::NetworkPolicy> network;  // applied live
};
// `network`: the node has a sandbox network (else only mode none may be asked for).
StatusOr<SandboxPatch> ParsePatchRequest(std::string_view body, bool network);

// A body-less action (pause, resume, job actions) still takes an optional JSON body,
// strictly: only "request_id".
Status CheckActionBody(std::string_view body);

// The answer of a create with "count": {"sandboxes": [...]} (also a fork's).
Json SandboxListJson(const std::vector<SandboxRecord>& rs);
// GET /v1/sandboxes/{id}/stats.
Json StatsJson(const backends::SandboxStats& st);
// The answer of a job action: {"affected": sandboxes}.
Json JobActionJson(int affected);
// GET /v1/health.
Json HealthJson();

// GET /v1/node's "features": what the node found at start (the kernel's part) and what changes
// while it runs (microVMs, the network, the kinds' capabilities).
struct KernelFeatures {
  std::string kernel;  // release
  bool userns = false;
  bool clone_into_cgroup = false;
  bool cgroup_kill = false;
  bool socket_budget = false;
  std::string socket_budget_reason;  // why not, when !socket_budget
  std::string proc_views_reason;     // empty: the /proc views work
};
struct MicrovmFeatures {
  bool available = false;
  std::string reason;  // why not, when !available
  std::string accel, accel_reason, kernel;
  int64_t templates = 0;
  int64_t templates_loaded = 0;
};
struct NetworkFeatures {
  bool enabled = false;             // the edge's `network` setting
  net::LazyNodeNetwork::Info info;  // when enabled
};
struct NodeFeatures {
  KernelFeatures kernel;
  MicrovmFeatures microvm;
  NetworkFeatures network;
  std::vector<std::pair<backends::Kind, backends::KindCapabilities>> kinds;  // those served
};
Json ToJson(const NodeFeatures& f);

// GET /v1/node: the manager's report with the edge's own fields.
struct NodeInfo {
  NodeReport report;
  std::string version, instance;
  std::vector<backends::Kind> backends;  // the kinds served
  std::vector<pools::PoolStatus> pools;
  NodeFeatures features;
};
Json ToJson(const NodeInfo& n);

}  // namespace dsec::api
