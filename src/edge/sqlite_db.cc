#include "edge/sqlite_db.h"

#include <sqlite3.h>
#include <sys/stat.h>

namespace dsec::edge {

StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path, std::string name,
                                                   bool full_sync, const char* schema) {
  std::unique_ptr<SqliteDb> d(new SqliteDb());
  d->name_ = std::move(name);
  mode_t old = umask(077);
  int rc =
      sqlite3_open_v2(path.c_str(), &d->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  umask(old);
  if (rc != SQLITE_OK) return d->Error(("open \"" + path + "\"").c_str());
  (void)chmod(path.c_str(), 0600);
  sqlite3_busy_timeout(d->db_, 5000);
  DSEC_RETURN_IF_ERROR(d->Exec("PRAGMA journal_mode=WAL"));
  DSEC_RETURN_IF_ERROR(
      d->Exec(full_sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  DSEC_RETURN_IF_ERROR(d->Exec(schema));
  return d;
}

SqliteDb::~SqliteDb() {
  for (auto& [sql, st] : stmts_) sqlite3_finalize(st);
  if (db_) sqlite3_close(db_);
}

Status SqliteDb::Error(const char* what) const {
  return InternalError(name_ + ": " + what + ": " + (db_ ? sqlite3_errmsg(db_) : "out of memory"));
}

Status SqliteDb::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return InternalError(name_ + ": " + m);
  }
  return OkStatus();
}

StatusOr<sqlite3_stmt*> SqliteDb::Prepare(const char* sql) {
  for (auto& [text, st] : stmts_) {
    if (text == sql) {
      sqlite3_reset(st);
      sqlite3_clear_bindings(st);
      return st;
    }
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &st, nullptr) != SQLITE_OK) return Error("prepare");
  stmts_.emplace_back(sql, st);
  return st;
}

int SqliteDb::Changes() const { return sqlite3_changes(db_); }

void BindText(sqlite3_stmt* st, int i, const std::string& s) {
  sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
}

std::string ColumnText(sqlite3_stmt* st, int i) {
  const void* p = sqlite3_column_blob(st, i);
  int n = sqlite3_column_bytes(st, i);
  return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

}  // namespace dsec::edge
