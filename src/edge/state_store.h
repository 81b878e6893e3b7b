// The edge's durable state: one SQLite database (WAL) in the state dir, holding every live
// sandbox's record and adoption handle (so a restarted edge can re-adopt them) and the
// idempotency records (so a retried request is answered, not run again).
//
// Durability: WAL with synchronous=NORMAL: a committed write survives the edge being killed
// (what re-adoption and idempotency need); only a host power loss can drop the last commits.
// Thread safety: all methods are thread-safe (one connection behind a mutex).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace dsec::edge {

class SqliteDb;

struct StoredSandbox {
  std::string id;
  std::string record;  // JSON: what the API shows plus the create parameters
  std::string handle;  // Backend adoption handle (secret)
};

struct StoredResponse {
  int status = 0;
  std::string content_type;
  std::string body;
  std::string request_hash;  // hash of the request body it answered
  int64_t created_ms = 0;
};

class StateStore {
 public:
  // Creates the file (0600) and schema if missing.
  static StatusOr<std::unique_ptr<StateStore>> Open(const std::string& path);
  ~StateStore();

  Status PutSandbox(const StoredSandbox& s);  // insert or replace
  Status UpdateRecord(const std::string& id, const std::string& record);
  Status DeleteSandbox(const std::string& id);
  StatusOr<std::vector<StoredSandbox>> ListSandboxes();

  // Pools made through the API (name -> config JSON), recreated at start.
  Status PutPool(const std::string& name, const std::string& config);
  Status DeletePool(const std::string& name);
  StatusOr<std::vector<std::pair<std::string, std::string>>> ListPools();

  StatusOr<std::optional<StoredResponse>> GetResponse(const std::string& key);
  Status PutResponse(const std::string& key, const StoredResponse& r);
  // Drops records older than `min_created_ms`, then the oldest beyond `max_records`.
  StatusOr<int64_t> PruneResponses(int64_t min_created_ms, int64_t max_records,
                                   uint64_t max_total_bytes);
  StatusOr<int64_t> CountResponses();

 private:
  StateStore() = default;

  Mutex mu_;
  std::unique_ptr<SqliteDb> db_ DSEC_PT_GUARDED_BY(mu_);
};

}  // namespace dsec::edge
