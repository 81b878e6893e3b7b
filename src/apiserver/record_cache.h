// The sandbox records an apiserver has seen (creates it placed, records it read, lists it
// merged), so that a sandbox whose node is lost still has a record: its last known one, with
// `state: unavailable` (GET /v1/sandboxes/{id}, and the node's share of a list). Edges publish
// no per-sandbox state to etcd (a create writes nothing there), so this is what one apiserver
// knows: a sandbox it never saw has no record while its node is away (503 naming the node, as
// before), and a record may name a sandbox that ended on the node since it was seen.
//
// Bounded (least recently seen go first) and thread-safe. A record leaves when a delete of its
// sandbox is relayed, when its node answers 404/410 for it, and once past its expires_at.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/json.h"
#include "base/mutex.h"

namespace dsec::apiserver {

// What a list asks for (GET /v1/sandboxes' filters).
struct RecordFilter {
  std::vector<std::pair<std::string, std::string>> labels;  // all must match
  std::string state, kind;                                  // "" for any
  std::string project;                                      // "" for any
  bool Matches(const Json& record) const;
};

class RecordCache {
 public:
  explicit RecordCache(size_t capacity) : capacity_(capacity) {}

  // Keeps `record` (a SandboxRecord: id, node, created_at, ...); others are ignored.
  void Put(const Json& record);
  // Every record of a create's or a list's answer ({"sandboxes": [...]}, or one record).
  void PutAll(const Json& answer);
  void Erase(const std::string& id);
  // The record, as last seen; nullopt when unknown (or expired at `now_ms`).
  std::optional<Json> Get(const std::string& id, int64_t now_ms);
  // Records of `node` that match, ordered by (created_at, id), after the list position
  // `after` ("<created_at>.<id>", "" for the start): at most `limit`; *more says whether
  // others follow.
  std::vector<Json> OfNode(const std::string& node, const std::string& after,
                           const RecordFilter& filter, size_t limit, int64_t now_ms, bool* more);
  size_t size() const;

  // A record as it is shown while its node is unavailable.
  static Json Unavailable(Json record, const std::string& why);

 private:
  struct Entry {
    std::string id, node, key;  // key: "<created_at, 20 digits>.<id>" (orders like the API)
    int64_t expires_at = 0;     // 0: none
    Json record;
  };
  void EraseLocked(std::list<Entry>::iterator it) DSEC_REQUIRES(mu_);

  const size_t capacity_;
  mutable Mutex mu_;
  std::list<Entry> lru_ DSEC_GUARDED_BY(mu_);  // most recently seen first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, std::map<std::string, std::list<Entry>::iterator>> by_node_
      DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::apiserver
