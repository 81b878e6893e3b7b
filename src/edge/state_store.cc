#include "edge/state_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include "base/scope_guard.h"
#include "edge/sqlite_db.h"

namespace dsec::edge {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS sandboxes(
  id TEXT PRIMARY KEY,
  record TEXT NOT NULL,
  handle TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pools(
  name TEXT PRIMARY KEY,
  config TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS responses(
  key TEXT PRIMARY KEY,
  status INTEGER NOT NULL,
  content_type TEXT NOT NULL,
  body BLOB NOT NULL,
  request_hash TEXT NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses(created_ms);
)sql";

}  // namespace

StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path) {
  std::unique_ptr<StateStore> s(new StateStore());
  // (0600: it holds every sandbox's agent secret.)
  DSEC_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(path, "state db", /*full_sync=*/false, kSchema));
  MutexLock l(s->mu_);
  s->db_ = std::move(db);
  return s;
}

StateStore::~StateStore() = default;

Status StateStore::PutSandbox(const StoredSandbox& s) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("INSERT OR REPLACE INTO sandboxes(id, record, handle) "
                                     "VALUES(?1, ?2, ?3)"));
  BindText(st, 1, s.id);
  BindText(st, 2, s.record);
  BindText(st, 3, s.handle);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("store sandbox");
  return OkStatus();
}

Status StateStore::UpdateRecord(const std::string& id, const std::string& record) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("UPDATE sandboxes SET record = ?2 WHERE id = ?1"));
  BindText(st, 1, id);
  BindText(st, 2, record);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("update sandbox");
  return OkStatus();
}

Status StateStore::DeleteSandbox(const std::string& id) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare("DELETE FROM sandboxes WHERE id = ?1"));
  BindText(st, 1, id);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("delete sandbox");
  return OkStatus();
}

StatusOr<std::vector<StoredSandbox>> StateStore::ListSandboxes() {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("SELECT id, record, handle FROM sandboxes"));
  std::vector<StoredSandbox> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.push_back({ColumnText(st, 0), ColumnText(st, 1), ColumnText(st, 2)});
  if (rc != SQLITE_DONE) return db_->Error("list sandboxes");
  return out;
}

Status StateStore::PutPool(const std::string& name, const std::string& config) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("INSERT OR REPLACE INTO pools(name, config) VALUES(?1, ?2)"));
  BindText(st, 1, name);
  BindText(st, 2, config);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("put pool");
  return OkStatus();
}

Status StateStore::DeletePool(const std::string& name) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare("DELETE FROM pools WHERE name = ?1"));
  BindText(st, 1, name);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("delete pool");
  return OkStatus();
}

StatusOr<std::vector<std::pair<std::string, std::string>>> StateStore::ListPools() {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("SELECT name, config FROM pools ORDER BY name"));
  std::vector<std::pair<std::string, std::string>> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.emplace_back(ColumnText(st, 0), ColumnText(st, 1));
  if (rc != SQLITE_DONE) return db_->Error("list pools");
  return out;
}

StatusOr<std::optional<StoredResponse>> StateStore::GetResponse(const std::string& key) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("SELECT status, content_type, body, request_hash, created_ms "
                                     "FROM responses WHERE key = ?1"));
  BindText(st, 1, key);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) return std::optional<StoredResponse>();
  if (rc != SQLITE_ROW) return db_->Error("read response");
  StoredResponse r;
  r.status = sqlite3_column_int(st, 0);
  r.content_type = ColumnText(st, 1);
  r.body = ColumnText(st, 2);
  r.request_hash = ColumnText(st, 3);
  r.created_ms = sqlite3_column_int64(st, 4);
  return std::optional<StoredResponse>(std::move(r));
}

Status StateStore::PutResponse(const std::string& key, const StoredResponse& r) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(
      sqlite3_stmt * st,
      db_->Prepare("INSERT OR REPLACE INTO responses(key, status, content_type, "
                   "body, request_hash, created_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
  BindText(st, 1, key);
  sqlite3_bind_int(st, 2, r.status);
  BindText(st, 3, r.content_type);
  sqlite3_bind_blob(st, 4, r.body.data(), static_cast<int>(r.body.size()), SQLITE_STATIC);
  BindText(st, 5, r.request_hash);
  sqlite3_bind_int64(st, 6, r.created_ms);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("store response");
  return OkStatus();
}

StatusOr<int64_t> StateStore::PruneResponses(int64_t min_created_ms, int64_t max_records,
                                             uint64_t max_total_bytes) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("DELETE FROM responses WHERE created_ms < ?1"));
  sqlite3_bind_int64(st, 1, min_created_ms);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("prune responses");
  int64_t n = db_->Changes();
  DSEC_ASSIGN_OR_RETURN(st, db_->Prepare("DELETE FROM responses WHERE key IN (SELECT key FROM "
                                         "responses ORDER BY created_ms DESC LIMIT -1 OFFSET ?1)"));
  sqlite3_bind_int64(st, 1, max_records);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("prune responses");
  n += db_->Changes();
  // Newest first, keep records while their running total of body bytes fits.
  DSEC_ASSIGN_OR_RETURN(
      st, db_->Prepare("DELETE FROM responses WHERE key IN (SELECT key FROM (SELECT key, "
                       "SUM(LENGTH(body)) OVER (ORDER BY created_ms DESC, key) AS total FROM "
                       "responses) WHERE total > ?1)"));
  sqlite3_bind_int64(st, 1, static_cast<int64_t>(max_total_bytes));
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("prune responses");
  return n + db_->Changes();
}

StatusOr<int64_t> StateStore::CountResponses() {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare("SELECT COUNT(*) FROM responses"));
  if (sqlite3_step(st) != SQLITE_ROW) return db_->Error("count responses");
  return sqlite3_column_int64(st, 0);
}

}  // namespace dsec::edge
