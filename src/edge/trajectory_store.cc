#include "edge/trajectory_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "edge/sqlite_db.h"

namespace dsec::edge {

namespace {

// tkey: "<project>/<id>" (a project is a DNS label: no '/').
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS trajectories(
  tkey TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  id TEXT NOT NULL,
  params TEXT NOT NULL,
  checkpoint_every INTEGER NOT NULL,
  head INTEGER NOT NULL,
  branches INTEGER NOT NULL,
  state TEXT NOT NULL,
  sandbox TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  expires_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS branches(
  tkey TEXT NOT NULL,
  branch INTEGER NOT NULL,
  parent INTEGER NOT NULL,
  fork_seq INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(tkey, branch)
);
CREATE TABLE IF NOT EXISTS entries(
  tkey TEXT NOT NULL,
  branch INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  fingerprint TEXT NOT NULL,
  method TEXT NOT NULL,
  target TEXT NOT NULL,
  request TEXT NOT NULL,
  mutating INTEGER NOT NULL,
  status INTEGER NOT NULL,
  content_type TEXT NOT NULL,
  headers TEXT NOT NULL,
  response TEXT NOT NULL,
  kept INTEGER NOT NULL,
  streamed INTEGER NOT NULL,
  exec_id TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(tkey, branch, seq)
);
CREATE INDEX IF NOT EXISTS entries_request ON entries(request);
CREATE INDEX IF NOT EXISTS entries_response ON entries(response);
CREATE TABLE IF NOT EXISTS checkpoints(
  tkey TEXT NOT NULL,
  branch INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  image TEXT NOT NULL,
  jobs TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(tkey, branch, seq)
);
CREATE TABLE IF NOT EXISTS blobs(
  digest TEXT PRIMARY KEY,
  data BLOB NOT NULL
);
)sql";

std::string Key(const std::string& project, const std::string& id) { return project + "/" + id; }

// Resets a cached statement when a read returns (an active statement holds the connection's
// read transaction open, and the WAL could not be reset).
struct ResetOnExit {
  sqlite3_stmt* st;
  ~ResetOnExit() { sqlite3_reset(st); }
};

bool IsDigest(const std::string& d) {
  if (d.size() != 64) return false;
  for (char c : d)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

TrajectoryInfo InfoFrom(sqlite3_stmt* st) {
  TrajectoryInfo t;
  t.project = ColumnText(st, 0);
  t.id = ColumnText(st, 1);
  t.params = ColumnText(st, 2);
  t.checkpoint_every = sqlite3_column_int64(st, 3);
  t.head = sqlite3_column_int64(st, 4);
  t.branches = sqlite3_column_int64(st, 5);
  t.state = ColumnText(st, 6);
  t.sandbox = ColumnText(st, 7);
  t.created_ms = sqlite3_column_int64(st, 8);
  t.updated_ms = sqlite3_column_int64(st, 9);
  t.expires_ms = sqlite3_column_int64(st, 10);
  return t;
}

constexpr const char* kInfoColumns =
    "project, id, params, checkpoint_every, head, branches, state, sandbox, created_ms, "
    "updated_ms, expires_ms";

constexpr const char* kEntryColumns =
    "seq, fingerprint, method, target, request, mutating, status, content_type, headers, "
    "response, kept, streamed, exec_id, created_ms";

TrajectoryEntry EntryFrom(sqlite3_stmt* st) {
  TrajectoryEntry e;
  e.seq = sqlite3_column_int64(st, 0);
  e.fingerprint = ColumnText(st, 1);
  e.method = ColumnText(st, 2);
  e.target = ColumnText(st, 3);
  e.request = ColumnText(st, 4);
  e.mutating = sqlite3_column_int(st, 5) != 0;
  e.status = sqlite3_column_int(st, 6);
  e.content_type = ColumnText(st, 7);
  e.headers = ColumnText(st, 8);
  e.response = ColumnText(st, 9);
  e.kept = sqlite3_column_int(st, 10) != 0;
  e.streamed = sqlite3_column_int(st, 11) != 0;
  e.exec_id = ColumnText(st, 12);
  e.created_ms = sqlite3_column_int64(st, 13);
  return e;
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || fsync(fd.get()) != 0) return ErrnoError("fsync " + dir);
  return OkStatus();
}

}  // namespace

void TrajectoryCommitQueue::Push(TrajectoryPending p) {
  {
    MutexLock l(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(p));
      cv_.NotifyAll();
      return;
    }
  }
  p.done(Unavailable("the trajectory log is stopped (the edge is shutting down)"));
}

bool TrajectoryCommitQueue::Take(std::vector<TrajectoryPending>* batch) {
  MutexLock l(mu_);
  cv_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
  if (queue_.empty()) return false;
  batch->swap(queue_);
  return true;
}

void TrajectoryCommitQueue::Stop() {
  MutexLock l(mu_);
  stopping_ = true;
  cv_.NotifyAll();
}

StatusOr<std::vector<TrajectoryAnswer>> TrajectoryStore::Answers(const std::string& project,
                                                                 const std::string& id,
                                                                 int64_t branch, int64_t from,
                                                                 int64_t to, size_t max_bytes) {
  DSEC_ASSIGN_OR_RETURN(auto entries, Entries(project, id, branch, from, to));
  std::vector<TrajectoryAnswer> out;
  size_t bytes = 0;
  for (auto& e : entries) {
    TrajectoryAnswer a{std::move(e), std::nullopt};
    if (a.e.kept) {
      auto body = ReadBlob(a.e.response);
      if (body.ok()) {
        if (!out.empty() && bytes + body->size() > max_bytes) break;
        bytes += body->size();
        a.body = std::move(*body);
      } else if (body.status().code() != StatusCode::kNotFound) {
        if (out.empty()) return body.status();
        break;  // (the ones before are good)
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

StatusOr<std::unique_ptr<SqliteTrajectoryStore>> SqliteTrajectoryStore::Open(
    const std::string& path, const std::string& blob_dir, bool fsync) {
  std::unique_ptr<SqliteTrajectoryStore> s(new SqliteTrajectoryStore());
  s->blob_dir_ = blob_dir;
  s->fsync_ = fsync;
  DSEC_RETURN_IF_ERROR(MakeDirs(blob_dir, 0700));
  // (0600: what calls sent and saw. FULL: a commit's WAL frames are fsync'd before it returns,
  // one fsync per group.)
  DSEC_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(path, "trajectory db", fsync, kSchema));
  {
    MutexLock l(s->mu_);
    s->db_ = std::move(db);
  }
  s->committer_ = std::thread([p = s.get()] { p->CommitLoop(); });
  return s;
}

void SqliteTrajectoryStore::Stop() {
  queue_.Stop();
  if (committer_.joinable()) committer_.join();
}

SqliteTrajectoryStore::~SqliteTrajectoryStore() { Stop(); }

Status SqliteTrajectoryStore::Create(const TrajectoryInfo& t) {
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto rollback =
      MakeScopeGuard([this]() DSEC_NO_THREAD_SAFETY_ANALYSIS { (void)db_->Exec("ROLLBACK"); });
  const std::string key = Key(t.project, t.id);
  DSEC_ASSIGN_OR_RETURN(
      sqlite3_stmt * st,
      db_->Prepare("INSERT OR IGNORE INTO trajectories(tkey, project, id, params, "
                   "checkpoint_every, head, branches, state, sandbox, created_ms, "
                   "updated_ms, expires_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                   "?9, ?10, ?11, ?12)"));
  BindText(st, 1, key);
  BindText(st, 2, t.project);
  BindText(st, 3, t.id);
  BindText(st, 4, t.params);
  sqlite3_bind_int64(st, 5, t.checkpoint_every);
  sqlite3_bind_int64(st, 6, t.head);
  sqlite3_bind_int64(st, 7, t.branches);
  BindText(st, 8, t.state);
  BindText(st, 9, t.sandbox);
  sqlite3_bind_int64(st, 10, t.created_ms);
  sqlite3_bind_int64(st, 11, t.updated_ms);
  sqlite3_bind_int64(st, 12, t.expires_ms);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("create trajectory");
  if (db_->Changes() == 0)
    return Status(StatusCode::kAlreadyExists, "trajectory \"" + t.id + "\" exists");
  DSEC_ASSIGN_OR_RETURN(st, db_->Prepare("INSERT INTO branches(tkey, branch, parent, fork_seq, "
                                         "created_ms) VALUES(?1, 0, -1, 0, ?2)"));
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, t.created_ms);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("create branch");
  DSEC_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  rollback.Dismiss();
  return OkStatus();
}

StatusOr<TrajectoryInfo> SqliteTrajectoryStore::Get(const std::string& project,
                                                    const std::string& id) {
  MutexLock l(mu_);
  static const std::string sql =
      std::string("SELECT ") + kInfoColumns + " FROM trajectories WHERE tkey = ?1";
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare(sql.c_str()));
  ResetOnExit reset{st};
  const std::string key = Key(project, id);
  BindText(st, 1, key);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) return InfoFrom(st);
  if (rc != SQLITE_DONE) return db_->Error("get trajectory");
  return NotFound("trajectory \"" + id + "\" not found");
}

Status SqliteTrajectoryStore::Update(const TrajectoryInfo& t, const std::string& expect_sandbox) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(
      sqlite3_stmt * st,
      db_->Prepare("UPDATE trajectories SET head = ?2, state = ?3, sandbox = ?4, "
                   "updated_ms = ?5, expires_ms = ?6 WHERE tkey = ?1 AND sandbox = ?7"));
  const std::string key = Key(t.project, t.id);
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, t.head);
  BindText(st, 3, t.state);
  BindText(st, 4, t.sandbox);
  sqlite3_bind_int64(st, 5, t.updated_ms);
  sqlite3_bind_int64(st, 6, t.expires_ms);
  BindText(st, 7, expect_sandbox);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("update trajectory");
  if (db_->Changes() == 0)
    return FailedPrecondition("trajectory \"" + t.id +
                              "\" is gone or followed by another sandbox now");
  return OkStatus();
}

StatusOr<std::vector<TrajectoryInfo>> SqliteTrajectoryStore::List() {
  MutexLock l(mu_);
  static const std::string sql =
      std::string("SELECT ") + kInfoColumns + " FROM trajectories ORDER BY tkey";
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare(sql.c_str()));
  std::vector<TrajectoryInfo> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) out.push_back(InfoFrom(st));
  if (rc != SQLITE_DONE) return db_->Error("list trajectories");
  return out;
}

Status SqliteTrajectoryStore::DeleteLocked(const std::string& key) {
  for (const char* sql :
       {"DELETE FROM entries WHERE tkey = ?1", "DELETE FROM checkpoints WHERE tkey = ?1",
        "DELETE FROM branches WHERE tkey = ?1", "DELETE FROM trajectories WHERE tkey = ?1"}) {
    DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare(sql));
    BindText(st, 1, key);
    if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("delete trajectory");
  }
  return OkStatus();
}

Status SqliteTrajectoryStore::Delete(const std::string& project, const std::string& id) {
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto rollback =
      MakeScopeGuard([this]() DSEC_NO_THREAD_SAFETY_ANALYSIS { (void)db_->Exec("ROLLBACK"); });
  const std::string key = Key(project, id);
  {
    DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                          db_->Prepare("SELECT sandbox FROM trajectories WHERE tkey = ?1"));
    ResetOnExit reset{st};
    BindText(st, 1, key);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) return NotFound("trajectory \"" + id + "\" not found");
    if (rc != SQLITE_ROW) return db_->Error("get trajectory");
    if (std::string sb = ColumnText(st, 0); !sb.empty())
      return FailedPrecondition("trajectory \"" + id + "\" is followed by sandbox " + sb +
                                ": delete the sandbox first");
  }
  DSEC_RETURN_IF_ERROR(DeleteLocked(key));
  DSEC_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  rollback.Dismiss();
  return OkStatus();
}

StatusOr<std::vector<std::pair<std::string, std::string>>> SqliteTrajectoryStore::Expire(
    int64_t now_ms) {
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto rollback =
      MakeScopeGuard([this]() DSEC_NO_THREAD_SAFETY_ANALYSIS { (void)db_->Exec("ROLLBACK"); });
  std::vector<std::pair<std::string, std::string>> out;
  {
    DSEC_ASSIGN_OR_RETURN(
        sqlite3_stmt * st,
        db_->Prepare("SELECT project, id FROM trajectories WHERE sandbox = '' AND "
                     "expires_ms <= ?1"));
    ResetOnExit reset{st};
    sqlite3_bind_int64(st, 1, now_ms);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
      out.emplace_back(ColumnText(st, 0), ColumnText(st, 1));
    if (rc != SQLITE_DONE) return db_->Error("list expired trajectories");
  }
  for (const auto& [project, id] : out) DSEC_RETURN_IF_ERROR(DeleteLocked(Key(project, id)));
  DSEC_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  rollback.Dismiss();
  return out;
}

void SqliteTrajectoryStore::Append(const std::string& project, const std::string& id,
                                   int64_t branch, TrajectoryEntry e,
                                   std::vector<TrajectoryBlob> blobs,
                                   std::function<void(Status)> done) {
  queue_.Push({Key(project, id), branch, std::move(e), std::move(blobs), std::move(done)});
}

void SqliteTrajectoryStore::CommitLoop() {
  for (;;) {
    std::vector<Pending> batch;
    if (!queue_.Take(&batch)) return;  // stopping, nothing left
    Status s = CommitBatch(batch);
    std::vector<Status> each(batch.size(), s);
    if (!s.ok() && batch.size() > 1) {
      // One bad entry (a seq taken, say) must not fail its neighbours: each on its own.
      for (size_t i = 0; i < batch.size(); ++i) {
        std::vector<Pending> one;
        one.push_back(std::move(batch[i]));
        each[i] = CommitBatch(one);
        batch[i] = std::move(one[0]);
      }
    }
    for (const Status& e : each)
      if (!e.ok()) DSEC_LOG_ERROR("trajectory commit failed: {}", e.ToString());
    ++commits_;
    committed_ += static_cast<int64_t>(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) batch[i].done(each[i]);
  }
}

std::string SqliteTrajectoryStore::BlobPath(const std::string& digest) const {
  return blob_dir_ + "/" + digest;
}

Status SqliteTrajectoryStore::WriteBlobFile(const TrajectoryBlob& b) {
  const std::string path = BlobPath(b.digest);
  if (access(path.c_str(), F_OK) == 0) return OkStatus();  // content-addressed: already there
  const std::string tmp = path + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return ErrnoError("create " + tmp);
  DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), b.data, tmp));
  if (fsync_ && fdatasync(fd.get()) != 0) return ErrnoError("fdatasync " + tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename " + tmp);
  return OkStatus();
}

Status SqliteTrajectoryStore::CommitBatch(std::vector<Pending>& batch) {
  MutexLock cl(commit_mu_);  // CollectBlobs must not take a body file before its entry lands
  // Large bodies first, as files (the directory once), then everything else in one transaction.
  bool files = false;
  for (const auto& p : batch)
    for (const auto& b : p.blobs)
      if (b.data.size() > kInlineBlobMax) {
        if (!IsDigest(b.digest)) return InvalidArgument("not a digest: " + b.digest);
        DSEC_RETURN_IF_ERROR(WriteBlobFile(b));
        files = true;
      }
  if (files && fsync_) DSEC_RETURN_IF_ERROR(FsyncDir(blob_dir_));
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto rollback =
      MakeScopeGuard([this]() DSEC_NO_THREAD_SAFETY_ANALYSIS { (void)db_->Exec("ROLLBACK"); });
  for (const auto& p : batch) {
    for (const auto& b : p.blobs) {
      if (b.data.size() > kInlineBlobMax) continue;
      DSEC_ASSIGN_OR_RETURN(
          sqlite3_stmt * st,
          db_->Prepare("INSERT OR IGNORE INTO blobs(digest, data) VALUES(?1, ?2)"));
      BindText(st, 1, b.digest);
      sqlite3_bind_blob(st, 2, b.data.data(), static_cast<int>(b.data.size()), SQLITE_STATIC);
      if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("store body");
    }
    DSEC_ASSIGN_OR_RETURN(
        sqlite3_stmt * st,
        db_->Prepare(
            "INSERT INTO entries(tkey, branch, seq, fingerprint, method, target, "
            "request, mutating, status, content_type, headers, response, kept, streamed, "
            "exec_id, created_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
            "?13, ?14, ?15, ?16)"));
    const TrajectoryEntry& e = p.e;
    BindText(st, 1, p.key);
    sqlite3_bind_int64(st, 2, p.branch);
    sqlite3_bind_int64(st, 3, e.seq);
    BindText(st, 4, e.fingerprint);
    BindText(st, 5, e.method);
    BindText(st, 6, e.target);
    BindText(st, 7, e.request);
    sqlite3_bind_int(st, 8, e.mutating);
    sqlite3_bind_int(st, 9, e.status);
    BindText(st, 10, e.content_type);
    BindText(st, 11, e.headers);
    BindText(st, 12, e.response);
    sqlite3_bind_int(st, 13, e.kept);
    sqlite3_bind_int(st, 14, e.streamed);
    BindText(st, 15, e.exec_id);
    sqlite3_bind_int64(st, 16, e.created_ms);
    if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("store entry");
  }
  DSEC_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  rollback.Dismiss();
  return OkStatus();
}

StatusOr<std::optional<TrajectoryEntry>> SqliteTrajectoryStore::Entry(const std::string& project,
                                                                      const std::string& id,
                                                                      int64_t branch, int64_t seq) {
  MutexLock l(mu_);
  static const std::string sql = std::string("SELECT ") + kEntryColumns +
                                 " FROM entries WHERE tkey = ?1 AND branch = ?2 AND seq = ?3";
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare(sql.c_str()));
  ResetOnExit reset{st};
  const std::string key = Key(project, id);
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, seq);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) return std::optional<TrajectoryEntry>(EntryFrom(st));
  if (rc != SQLITE_DONE) return db_->Error("read entry");
  return std::optional<TrajectoryEntry>();
}

StatusOr<std::vector<TrajectoryEntry>> SqliteTrajectoryStore::Entries(const std::string& project,
                                                                      const std::string& id,
                                                                      int64_t branch, int64_t from,
                                                                      int64_t to) {
  MutexLock l(mu_);
  static const std::string sql =
      std::string("SELECT ") + kEntryColumns +
      " FROM entries WHERE tkey = ?1 AND branch = ?2 AND seq >= ?3 AND seq <= ?4 ORDER BY seq";
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st, db_->Prepare(sql.c_str()));
  const std::string key = Key(project, id);
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, from);
  sqlite3_bind_int64(st, 4, to);
  std::vector<TrajectoryEntry> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) out.push_back(EntryFrom(st));
  if (rc != SQLITE_DONE) return db_->Error("read entries");
  return out;
}

Status SqliteTrajectoryStore::AddCheckpoint(const std::string& project, const std::string& id,
                                            int64_t branch, const TrajectoryCheckpoint& c) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("INSERT OR REPLACE INTO checkpoints(tkey, branch, seq, image, "
                                     "jobs, created_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6)"));
  const std::string key = Key(project, id);
  const std::string jobs = Json(c.jobs).dump();
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, c.seq);
  BindText(st, 4, c.image);
  BindText(st, 5, jobs);
  sqlite3_bind_int64(st, 6, c.created_ms);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("store checkpoint");
  return OkStatus();
}

StatusOr<std::vector<TrajectoryCheckpoint>> SqliteTrajectoryStore::Checkpoints(
    const std::string& project, const std::string& id, int64_t branch) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("SELECT seq, image, jobs, created_ms FROM checkpoints WHERE "
                                     "tkey = ?1 AND branch = ?2 ORDER BY seq"));
  const std::string key = Key(project, id);
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  std::vector<TrajectoryCheckpoint> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    TrajectoryCheckpoint c;
    c.seq = sqlite3_column_int64(st, 0);
    c.image = ColumnText(st, 1);
    Json jobs = Json::parse(ColumnText(st, 2), nullptr, /*allow_exceptions=*/false);
    if (jobs.is_array())
      for (const auto& j : jobs)
        if (j.is_number_integer()) c.jobs.push_back(j.get<int64_t>());
    c.created_ms = sqlite3_column_int64(st, 3);
    out.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE) return db_->Error("read checkpoints");
  return out;
}

StatusOr<std::vector<TrajectoryBranch>> SqliteTrajectoryStore::Branches(const std::string& project,
                                                                        const std::string& id) {
  MutexLock l(mu_);
  DSEC_ASSIGN_OR_RETURN(
      sqlite3_stmt * st,
      db_->Prepare(
          "SELECT b.branch, b.parent, b.fork_seq, b.created_ms, COUNT(e.seq), "
          "COALESCE(MAX(e.seq), 0) FROM branches b LEFT JOIN entries e ON e.tkey = b.tkey "
          "AND e.branch = b.branch WHERE b.tkey = ?1 GROUP BY b.branch ORDER BY b.branch"));
  const std::string key = Key(project, id);
  BindText(st, 1, key);
  std::vector<TrajectoryBranch> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    out.push_back({sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                   sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3),
                   sqlite3_column_int64(st, 4), sqlite3_column_int64(st, 5)});
  if (rc != SQLITE_DONE) return db_->Error("read branches");
  return out;
}

StatusOr<int64_t> SqliteTrajectoryStore::Fork(const std::string& project, const std::string& id,
                                              int64_t from, int64_t at_seq) {
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto rollback =
      MakeScopeGuard([this]() DSEC_NO_THREAD_SAFETY_ANALYSIS { (void)db_->Exec("ROLLBACK"); });
  const std::string key = Key(project, id);
  DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                        db_->Prepare("SELECT branches FROM trajectories WHERE tkey = ?1"));
  BindText(st, 1, key);
  if (sqlite3_step(st) != SQLITE_ROW) {
    sqlite3_reset(st);
    return NotFound("trajectory \"" + id + "\" not found");
  }
  const int64_t branch = sqlite3_column_int64(st, 0);
  sqlite3_reset(st);
  const int64_t now = WallMs();
  DSEC_ASSIGN_OR_RETURN(st, db_->Prepare("INSERT INTO branches(tkey, branch, parent, fork_seq, "
                                         "created_ms) VALUES(?1, ?2, ?3, ?4, ?5)"));
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, from);
  sqlite3_bind_int64(st, 4, at_seq);
  sqlite3_bind_int64(st, 5, now);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("create branch");
  DSEC_ASSIGN_OR_RETURN(
      st, db_->Prepare(
              "INSERT INTO entries SELECT tkey, ?2, seq, fingerprint, method, target, "
              "request, mutating, status, content_type, headers, response, kept, streamed, "
              "exec_id, created_ms FROM entries WHERE tkey = ?1 AND branch = ?3 AND seq < ?4"));
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, from);
  sqlite3_bind_int64(st, 4, at_seq);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("copy entries");
  DSEC_ASSIGN_OR_RETURN(
      st, db_->Prepare("INSERT INTO checkpoints SELECT tkey, ?2, seq, image, jobs, created_ms FROM "
                       "checkpoints WHERE tkey = ?1 AND branch = ?3 AND seq < ?4"));
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, from);
  sqlite3_bind_int64(st, 4, at_seq);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("copy checkpoints");
  // The new branch is the head: calls go to it from now on.
  DSEC_ASSIGN_OR_RETURN(st, db_->Prepare("UPDATE trajectories SET branches = ?2 + 1, head = ?2, "
                                         "updated_ms = ?3 WHERE tkey = ?1"));
  BindText(st, 1, key);
  sqlite3_bind_int64(st, 2, branch);
  sqlite3_bind_int64(st, 3, now);
  if (sqlite3_step(st) != SQLITE_DONE) return db_->Error("count branches");
  DSEC_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  rollback.Dismiss();
  return branch;
}

StatusOr<std::string> SqliteTrajectoryStore::ReadBlob(const std::string& digest) {
  if (digest.empty()) return std::string();
  if (!IsDigest(digest)) return InvalidArgument("not a digest: " + digest);
  {
    MutexLock l(mu_);
    DSEC_ASSIGN_OR_RETURN(sqlite3_stmt * st,
                          db_->Prepare("SELECT data FROM blobs WHERE digest = ?1"));
    ResetOnExit reset{st};
    BindText(st, 1, digest);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) return ColumnText(st, 0);
    if (rc != SQLITE_DONE) return db_->Error("read body");
  }
  return ReadFileToString(BlobPath(digest), size_t{4} << 30);
}

StatusOr<int64_t> SqliteTrajectoryStore::CollectBlobs() {
  MutexLock cl(commit_mu_);
  int64_t n = 0;
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDir(blob_dir_));
  MutexLock l(mu_);
  DSEC_RETURN_IF_ERROR(db_->Exec(
      "DELETE FROM blobs WHERE digest NOT IN (SELECT request FROM entries) AND digest NOT "
      "IN (SELECT response FROM entries)"));
  n += db_->Changes();
  DSEC_ASSIGN_OR_RETURN(
      sqlite3_stmt * st,
      db_->Prepare(
          "SELECT EXISTS(SELECT 1 FROM entries WHERE request = ?1) OR EXISTS(SELECT 1 FROM "
          "entries WHERE response = ?1)"));
  for (const auto& f : files) {
    // A ".tmp" left by a commit that died: never named by an entry.
    bool referenced = false;
    if (IsDigest(f)) {
      sqlite3_reset(st);
      BindText(st, 1, f);
      if (sqlite3_step(st) != SQLITE_ROW) return db_->Error("check body");
      referenced = sqlite3_column_int(st, 0) != 0;
      sqlite3_reset(st);
    }
    if (!referenced && unlink(BlobPath(f).c_str()) == 0) ++n;
  }
  return n;
}

std::pair<int64_t, int64_t> SqliteTrajectoryStore::commits() const {
  return {commits_.load(), committed_.load()};
}

}  // namespace dsec::edge
