// An etcd v3 client over etcd's JSON gateway (/v3/..., etcd 3.4 from Debian and later; see
// ../shared/notes/network-etcd-probe.md): keys and values are base64 on the wire and int64s are
// JSON strings; this class hides both. Endpoints are tried in order, the last one that worked
// first, so a cluster of etcds fails over by itself. Unary calls have a deadline of 2 s.
//
// Thread safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "http/client.h"

namespace dsec::etcd {

struct KeyValue {
  std::string key, value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct Event {
  bool deleted = false;
  KeyValue kv;  // for a delete: the key only
};

// "etcd://h:p,h:p" or "http://h:p,http://h:p" -> the gateway URLs. InvalidArgument otherwise.
StatusOr<std::vector<std::string>> ParseEndpoints(const std::string& spec);

class Client {
 public:
  explicit Client(std::vector<std::string> endpoints,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

  StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status Delete(const std::string& key);
  // One transaction: if every condition holds, puts `puts` and deletes `deletes` (keys, or
  // with a trailing '*' every key under that prefix) and answers true; else changes nothing
  // and answers false.
  struct Condition {
    std::string key;
    enum Kind { kAbsent, kPresent, kValueIs } kind = kAbsent;
    std::string value;  // kValueIs
  };
  StatusOr<bool> Txn(const std::vector<Condition>& when,
                     const std::vector<std::pair<std::string, std::string>>& puts,
                     const std::vector<std::string>& deletes = {});
  // The same with a lease on any put (0: none), and the store's revision after it (whether it
  // succeeded or not) in *revision.
  struct TxnPut {
    std::string key, value;
    int64_t lease = 0;
  };
  StatusOr<bool> TxnAt(const std::vector<Condition>& when, const std::vector<TxnPut>& puts,
                       const std::vector<std::string>& deletes, int64_t* revision);
  // Puts every pair if none of `absent` exists (true), or changes nothing (false).
  StatusOr<bool> PutIfAbsent(const std::vector<std::pair<std::string, std::string>>& puts,
                             const std::vector<std::string>& absent);
  // Deletes every key (or prefix*, as Txn) in one transaction.
  Status DeleteAll(const std::vector<std::string>& keys);
  // Every key under `prefix`, and the store's revision at that moment.
  StatusOr<std::vector<KeyValue>> RangePrefix(const std::string& prefix, int64_t* revision);
  StatusOr<std::optional<KeyValue>> Get(const std::string& key);

  StatusOr<int64_t> LeaseGrant(int64_t ttl_s);
  // The lease's TTL left after the refresh; NotFound once it has expired.
  StatusOr<int64_t> LeaseKeepAlive(int64_t id);
  Status LeaseRevoke(int64_t id);

  // Watches `prefix` from `start_revision` and calls `on_events` with each batch (and the
  // revision it brings the view to) until *stop, an error, or a compaction past
  // start_revision (FailedPrecondition: read the range again). Blocks.
  Status Watch(const std::string& prefix, int64_t start_revision,
               const std::function<void(const std::vector<Event>&, int64_t revision)>& on_events,
               const std::atomic<bool>* stop);

  const std::vector<std::string>& endpoints() const { return urls_; }

 private:
  StatusOr<Json> Call(const std::string& path, const Json& body);

  std::vector<std::string> urls_;
  std::vector<std::unique_ptr<http::HttpClient>> clients_;
  std::chrono::milliseconds timeout_;
  std::atomic<size_t> preferred_{0};
};

// The end of a prefix range: `prefix` with its last byte incremented.
std::string PrefixEnd(const std::string& prefix);

}  // namespace dsec::etcd
