// What an edge publishes about itself in etcd and the apiservers read: the key layout of the
// cluster's membership, and the record (JSON) under each node's key.
//
//   /dsec/nodes/<node>   the node's record, under the node's lease (gone when it lapses)
//   /dsec/cordon/<node>  present while the node is cordoned ("cordon" or "drain"); no lease
//   /dsec/usage/<node>   what its sandboxes take, by project, token and quota hold (NodeUsage);
//                        no lease: a lost node's sandboxes stay counted against quotas until it
//                        is back and says otherwise
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::cluster {

inline constexpr std::string_view kPrefix = "/dsec/";
inline constexpr std::string_view kNodesPrefix = "/dsec/nodes/";
inline constexpr std::string_view kCordonPrefix = "/dsec/cordon/";
inline constexpr std::string_view kUsagePrefix = "/dsec/usage/";

struct NodeRecord {
  std::string node;      // the routing key in sandbox ids (sb-<node>-<random>)
  std::string url;       // where apiservers reach its API ("http://10.0.0.5:7070")
  std::string instance;  // changes when the node's state dir does
  std::string version;
  std::vector<std::string> kinds;  // sandbox kinds it creates ("container", "microvm")
  std::vector<std::string> pools;  // its pools and fncall runtimes
  int64_t max_sandboxes = 0;       // what it admits
  int64_t memory_mb = 0;           // the node's memory
  int64_t admit_memory_mb = 0;     // what its admission lets sandboxes ask for together
  int64_t max_memory_mb = 0;       // the most one sandbox may ask for there
  // What a create that names no memory_mb / cpu gets there (quotas count it before it goes).
  int64_t default_memory_mb = 0;
  int64_t default_cpu_milli = 0;
  // Load, republished as it changes (at most a few times a second).
  int64_t sandboxes = 0;
  int64_t used_memory_mb = 0;
  int64_t started_at = 0;  // ms since the epoch
  // Its compatibility listeners, where it runs them (empty otherwise): apiservers started with
  // the same listeners relay to them.
  std::string e2b_url;
  std::string sandbox_fusion_url;

  Json ToJson() const;
  static StatusOr<NodeRecord> FromJson(std::string_view text);
  bool HasKind(std::string_view kind) const;
};

// The sandboxes of one (project, owner token, quota hold) on a node and what they take (a
// failed sandbox, which holds nothing any more, is not counted).
struct UsageEntry {
  std::string project;
  std::string owner;  // the name of the token that made them ("" when no apiserver said)
  std::string hold;   // the quota hold an apiserver admitted them from ("" for none)
  int64_t sandboxes = 0;
  int64_t memory_mb = 0;
  int64_t cpu_milli = 0;  // CPU caps, in thousandths of a core
};

struct NodeUsage {
  // Grows with every change on the node, and across its restarts: an apiserver that was told a
  // create's generation knows the sandbox is in any usage of that generation or later.
  int64_t gen = 0;
  std::vector<UsageEntry> entries;
  Json ToJson() const;
  static StatusOr<NodeUsage> FromJson(std::string_view text);
};

}  // namespace dsec::cluster
