// What a node answers with: typed records of sandboxes and of the node. The edge's manager
// fills them and knows nothing of JSON; this layer renders them (ToJson below, records_json.cc)
// into the shapes api/openapi.yaml describes, for the edge and the apiserver alike.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "backends/kind.h"
#include "base/json.h"
#include "base/resources.h"
#include "net/policy.h"

namespace dsec::api {

// A sandbox's lifecycle phase (edge/lifecycle.h has the operations each allows).
enum class Phase { kCreating, kRunning, kPaused, kFailed, kDeleted };
// "creating", "running", "paused", "failed", "deleted".
std::string_view PhaseName(Phase p);

// The node-wide kernel budgets the edge set at start (edge/node_budget.h).
struct NodeBudget {
  uint64_t file_max = 0;
  uint64_t aio_max_nr = 0;  // 0 where the kernel has no AIO (no fs/aio-max-nr)
  uint64_t pid_max = 0;
  uint64_t threads_max = 0;
  uint64_t pty_max = 0;
  uint64_t pty_reserve = 0;
  uint32_t pty_per_sandbox = 0;  // what each sandbox's devpts gets (may be below the option)
  int64_t sandbox_pids = 0;      // pids.max of the parent cgroup: all sandboxes together
  // TCP buffer memory of all sandboxes together on cgroup v1 (the parent's
  // memory.kmem.tcp.limit_in_bytes): 3/4 of the host's TCP memory-pressure threshold
  // (net.ipv4.tcp_mem[1]), so sandboxes together never put the host's own TCP (the edge's API
  // connections included) under memory pressure. Cgroup v2 charges socket buffers to
  // memory.max instead, with no separate limit.
  int64_t sandbox_tcp_bytes = 0;
  std::vector<std::string> changes;
};

// The edge's own open-file budget (edge/node_budget.h).
struct FileBudget {
  uint64_t nofile = 0;        // RLIMIT_NOFILE in force
  int64_t max_sandboxes = 0;  // sandboxes the edge admits (<= the configured max_sandboxes)
  int max_connections = 0;    // HTTP connections it accepts
  std::vector<std::string> changes;
};

// One sandbox as the API shows it (GET /v1/sandboxes/{id}).
struct SandboxRecord {
  std::string id;
  backends::Kind kind = backends::Kind::kContainer;
  Phase state = Phase::kCreating;
  std::string node;
  std::string image;                                         // a stack is its images joined by ','
  int64_t created_at = 0, expires_at = 0, last_used_at = 0;  // ms since the epoch
  int64_t ttl_s = 0, idle_ttl_s = 0;
  Resources limits;
  std::string user, workdir;
  net::NetworkPolicy network;
  std::string address;  // its IPv4 address when it has a network
  std::map<std::string, std::string> labels;
  std::string reason;  // why it failed; empty otherwise
  std::string pool;    // the container pool it was taken from; empty for a fresh create
  std::string project = "default";
};

// One page of GET /v1/sandboxes.
struct SandboxPage {
  std::vector<SandboxRecord> sandboxes;
  std::string next_cursor;  // empty on the last page
};

// What the manager knows of the node (GET /v1/node adds the edge's own fields).
struct NodeReport {
  std::string node;
  int64_t max_sandboxes = 0;      // configured
  int64_t memory_mb = 0;          // the node's memory
  double overcommit = 0;          // memory admission factor
  int64_t admit_memory_mb = 0;    // what admission lets sandboxes ask for together
  int64_t reserve_memory_mb = 0;  // kept from sandboxes: admit = (memory - reserve) * overcommit
  FileBudget files;               // the edge's own descriptors
  NodeBudget budget;              // node-wide kernel budgets
  int64_t sandboxes = 0;          // live now
  int64_t used_memory_mb = 0;     // asked for by live sandboxes
  std::map<Phase, int64_t> by_state;
};

Json ToJson(const SandboxRecord& r);
Json ToJson(const std::vector<SandboxRecord>& rs);  // an array
Json ToJson(const SandboxPage& p);
Json ToJson(const NodeReport& n);

}  // namespace dsec::api
