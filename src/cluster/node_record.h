// What an edge publishes about itself in etcd and the apiservers read: the key layout of the
// cluster's membership, and the record (JSON) under each node's key.
//
//   /dsec/nodes/<node>   the node's record, under the node's lease (gone when it lapses)
//   /dsec/cordon/<node>  present while the node is cordoned ("cordon" or "drain"); no lease
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

}  // namespace dsec::cluster
