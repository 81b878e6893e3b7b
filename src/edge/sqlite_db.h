// One SQLite connection (WAL) with its cached statements: the plumbing the edge's databases
// share (the state DB, the trajectory log). Not thread-safe: its owner serializes its calls.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace dsec::edge {

class SqliteDb {
 public:
  // Opens (creating the file 0600, before SQLite does: what it holds is private) and applies
  // `schema`. With full_sync each commit is fsync'd (a power loss keeps it); else a commit
  // survives the process being killed. `name` prefixes its errors ("state db").
  static StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path, std::string name,
                                                  bool full_sync, const char* schema);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  Status Exec(const char* sql);
  // Cached per SQL text (the same pointer), reset and unbound.
  StatusOr<sqlite3_stmt*> Prepare(const char* sql);
  // "<name>: <what>: <SQLite's message>".
  Status Error(const char* what) const;
  // Rows the last statement changed.
  int Changes() const;

 private:
  SqliteDb() = default;
  std::string name_;
  sqlite3* db_ = nullptr;
  std::vector<std::pair<const char*, sqlite3_stmt*>> stmts_;
};

// Binds text without copying; the caller keeps `s` alive until the step.
void BindText(sqlite3_stmt* st, int i, const std::string& s);
// A text or blob column ("" for NULL).
std::string ColumnText(sqlite3_stmt* st, int i);

}  // namespace dsec::edge
