// What the manager answers with: typed records of sandboxes and of the node. The manager knows
// nothing of JSON for them; the REST layer renders them (ToJson below, records_json.cc) into
// the shapes api/openapi.yaml describes, and a future front end (the apiserver) may render
// them its own way.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/kind.h"
#include "base/json.h"
#include "base/resources.h"
#include "edge/lifecycle.h"
#include "edge/node_budget.h"
#include "net/policy.h"

namespace dsec::edge {

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
};

// One page of GET /v1/sandboxes.
struct SandboxPage {
  std::vector<SandboxRecord> sandboxes;
  std::string next_cursor;  // empty on the last page
};

// What the manager knows of the node (GET /v1/node adds the edge's own fields).
struct NodeReport {
  std::string node;
  int64_t max_sandboxes = 0;    // configured
  int64_t memory_mb = 0;        // the node's memory
  double overcommit = 0;        // memory admission factor
  int64_t admit_memory_mb = 0;  // what admission lets sandboxes ask for together
  FileBudget files;             // the edge's own descriptors
  NodeBudget budget;            // node-wide kernel budgets
  int64_t sandboxes = 0;        // live now
  int64_t used_memory_mb = 0;   // asked for by live sandboxes
  std::map<Phase, int64_t> by_state;
};

Json ToJson(const SandboxRecord& r);
Json ToJson(const std::vector<SandboxRecord>& rs);  // an array
Json ToJson(const SandboxPage& p);
Json ToJson(const NodeReport& n);

}  // namespace dsec::edge
