#include "edge/pg_trajectory_store.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <optional>
#include <unordered_map>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace dsec::edge {

namespace {

constexpr size_t kLayerPart = 4 << 20;  // a checkpoint layer's blob goes in parts of this size
constexpr int kMaxIdleConns = 4;
constexpr int kMaxConns = 16;
// A collection never takes what was touched this recently, whatever the config says (a
// transaction that touched it may still be about to name it).
constexpr int64_t kMinGraceMs = 1000;
// The database server's clock in ms: every node's touches and collections use the one clock.
#define DSEC_PG_NOW "(extract(epoch from clock_timestamp()) * 1000)::bigint"

// Tables of every node of the cluster; tkey is "<project>/<id>" (a project is a DNS label).
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS dsec_trajectories(
  tkey TEXT PRIMARY KEY, project TEXT NOT NULL, id TEXT NOT NULL, params TEXT NOT NULL,
  checkpoint_every BIGINT NOT NULL, head BIGINT NOT NULL, branches BIGINT NOT NULL,
  state TEXT NOT NULL, sandbox TEXT NOT NULL, created_ms BIGINT NOT NULL,
  updated_ms BIGINT NOT NULL, expires_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS dsec_trajectory_branches(
  tkey TEXT NOT NULL, branch BIGINT NOT NULL, parent BIGINT NOT NULL, fork_seq BIGINT NOT NULL,
  created_ms BIGINT NOT NULL, PRIMARY KEY(tkey, branch));
CREATE TABLE IF NOT EXISTS dsec_trajectory_entries(
  tkey TEXT NOT NULL, branch BIGINT NOT NULL, seq BIGINT NOT NULL, fingerprint TEXT NOT NULL,
  method TEXT NOT NULL, target BYTEA NOT NULL, request TEXT NOT NULL, mutating BOOLEAN NOT NULL,
  status INTEGER NOT NULL, content_type BYTEA NOT NULL, headers BYTEA NOT NULL,
  response TEXT NOT NULL, kept BOOLEAN NOT NULL, streamed BOOLEAN NOT NULL,
  exec_id TEXT NOT NULL, created_ms BIGINT NOT NULL, PRIMARY KEY(tkey, branch, seq));
CREATE INDEX IF NOT EXISTS dsec_trajectory_entries_request ON dsec_trajectory_entries(request);
CREATE INDEX IF NOT EXISTS dsec_trajectory_entries_response ON dsec_trajectory_entries(response);
CREATE TABLE IF NOT EXISTS dsec_trajectory_checkpoints(
  tkey TEXT NOT NULL, branch BIGINT NOT NULL, seq BIGINT NOT NULL, image TEXT NOT NULL,
  jobs TEXT NOT NULL, created_ms BIGINT NOT NULL, PRIMARY KEY(tkey, branch, seq));
CREATE TABLE IF NOT EXISTS dsec_trajectory_blobs(
  digest TEXT PRIMARY KEY, data BYTEA NOT NULL, touched_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS dsec_trajectory_layers(
  digest TEXT PRIMARY KEY, size BIGINT NOT NULL, blob TEXT NOT NULL, blob_size BIGINT NOT NULL,
  parts INTEGER NOT NULL, touched_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS dsec_trajectory_layer_parts(
  digest TEXT NOT NULL, part INTEGER NOT NULL, data BYTEA NOT NULL, PRIMARY KEY(digest, part));
)sql";

// Serializes the schema's creation between nodes (CREATE ... IF NOT EXISTS is not safe when
// run concurrently).
constexpr const char* kSchemaLock = "SELECT pg_advisory_xact_lock(746162657301)";

std::string Key(const std::string& project, const std::string& id) { return project + "/" + id; }

bool IsDigest(const std::string& d) {
  if (d.size() != 64) return false;
  for (char c : d)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A statement's parameter: text, or binary (bytea).
struct Param {
  std::string_view value;
  bool binary = false;
};

// Parameters as libpq takes them. Text parameters must be NUL-terminated: a std::string_view
// of a std::string is.
struct Params {
  template <typename Range>
  explicit Params(const Range& params) {
    for (const Param& p : params) {
      values.push_back(p.value.data());
      lengths.push_back(static_cast<int>(p.value.size()));
      formats.push_back(p.binary ? 1 : 0);
    }
  }
  int n() const { return static_cast<int>(values.size()); }
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
};

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

std::string Int(int64_t v) { return std::to_string(v); }
const char* Bool(bool b) { return b ? "t" : "f"; }
std::string Text(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
}
int64_t I64(const PGresult* r, int row, int col) {
  return std::strtoll(PQgetvalue(r, row, col), nullptr, 10);
}
bool B(const PGresult* r, int row, int col) { return PQgetvalue(r, row, col)[0] == 't'; }
// A BYTEA column in a text result: "\\x" and hex digits.
std::string Bytes(const PGresult* r, int row, int col) {
  std::string_view v(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
  if (!v.starts_with("\\x")) return std::string(v);
  v.remove_prefix(2);
  auto nib = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::string out(v.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>((nib(v[2 * i]) << 4) | nib(v[2 * i + 1]));
  return out;
}

}  // namespace

// Connections to the database, reused; one in use per caller at a time.
class PgConnPool {
 public:
  explicit PgConnPool(std::string conninfo) : conninfo_(std::move(conninfo)) {}
  ~PgConnPool() {
    MutexLock l(mu_);
    for (PGconn* c : idle_) PQfinish(c);
  }

  // A connection's statements prepared on the server, by their text (each is parsed and
  // planned once per connection, not at every call).
  using Prepared = std::unordered_map<std::string, std::string>;

  class Conn {
   public:
    Conn(PgConnPool* pool, PGconn* c, Prepared* prepared, bool reused)
        : pool_(pool), c_(c), prepared_(prepared), reused_(reused) {}
    Conn(Conn&& o) noexcept
        : pool_(o.pool_), c_(o.c_), prepared_(o.prepared_), reused_(o.reused_), used_(o.used_) {
      o.c_ = nullptr;
    }
    Conn& operator=(Conn&&) = delete;
    ~Conn() {
      if (c_) pool_->Put(c_);
    }
    // Runs one statement: TUPLES_OK or COMMAND_OK, or the server's error (AlreadyExists for a
    // unique violation, Unavailable when the connection is lost). `binary_results`: bytea
    // columns come back as their bytes.
    StatusOr<Result> Exec(const char* sql, std::initializer_list<Param> params = {},
                          bool binary_results = false) {
      const Params p(params);
      auto run = [&] {
        const char* name = nullptr;
        if (Result failed = Prepare(sql, p.n(), &name)) return failed;
        return Result(PQexecPrepared(c_, name, p.n(), p.values.data(), p.lengths.data(),
                                     p.formats.data(), binary_results ? 1 : 0));
      };
      Result r = run();
      ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
      if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && reused_ && !used_ &&
          PQstatus(c_) != CONNECTION_OK) {
        // An idle connection the server (or the network) dropped meanwhile: once, on a new one
        // (nothing of this checkout ran yet, so nothing is lost or done twice).
        PQreset(c_);
        prepared_->clear();  // (the server's session, and its statements, went with it)
        if (PQstatus(c_) == CONNECTION_OK && PgConnPool::Setup(c_).ok()) {
          r = run();
          st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
        }
      }
      used_ = true;
      if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
      return ErrorOf(r.get());
    }
    // The server's error (AlreadyExists for a unique violation, Aborted for a deadlock or a
    // serialization failure, Unavailable when the connection is lost).
    Status ErrorOf(const PGresult* r) {
      std::string msg = r ? PQresultErrorMessage(r) : PQerrorMessage(c_);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
      if (PQstatus(c_) != CONNECTION_OK)
        return Unavailable("trajectory store (PostgreSQL): " + msg);
      if (state && std::string_view(state) == "23505")
        return Status(StatusCode::kAlreadyExists, "trajectory store: " + msg);
      if (state && (std::string_view(state) == "40P01" || std::string_view(state) == "40001"))
        return Status(StatusCode::kAborted, "trajectory store: " + msg);
      return InternalError("trajectory store (PostgreSQL): " + msg);
    }
    Status ConnError() {
      std::string msg = PQerrorMessage(c_);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      return Unavailable("trajectory store (PostgreSQL): " + msg);
    }
    Status Run(const char* sql, std::initializer_list<Param> params = {}) {
      return Exec(sql, params).status();
    }
    // Statements sent together and answered together (libpq's pipeline mode: one round trip),
    // run as one implicit transaction up to the pipeline's sync: all of them, or on the first
    // error none (that error is returned).
    struct Stmt {
      const char* sql;
      std::vector<Param> params;
    };
    StatusOr<std::vector<Result>> Pipeline(const std::vector<Stmt>& stmts) {
      used_ = true;
      std::vector<const char*> names;
      for (const Stmt& st : stmts) {
        const char* name = nullptr;
        if (Result failed = Prepare(st.sql, static_cast<int>(st.params.size()), &name))
          return ErrorOf(failed.get());
        names.push_back(name);
      }
      if (PQenterPipelineMode(c_) != 1) return ConnError();
      std::vector<Result> out;
      Status err = OkStatus();
      bool sent = true;
      for (size_t k = 0; k < stmts.size(); ++k) {
        const Params p(stmts[k].params);
        if (PQsendQueryPrepared(c_, names[k], p.n(), p.values.data(), p.lengths.data(),
                                p.formats.data(), 0) != 1) {
          sent = false;
          break;
        }
      }
      // (Mid-pipeline the connection is not idle: it is closed when given back.)
      if (!sent || PQpipelineSync(c_) != 1) return ConnError();
      for (size_t i = 0; i < stmts.size(); ++i) {
        Result r(PQgetResult(c_));
        if (r) Result(PQgetResult(c_));  // (the NULL that ends each statement's results)
        ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
          out.push_back(std::move(r));
        } else if (err.ok() && st != PGRES_PIPELINE_ABORTED) {
          err = ErrorOf(r.get());
        }
      }
      Result sync(PQgetResult(c_));  // PGRES_PIPELINE_SYNC
      PQexitPipelineMode(c_);
      if (!err.ok()) return err;
      if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC) return ConnError();
      return out;
    }
    // Several statements without parameters (the simple query protocol).
    Status Script(const char* sql) {
      Result r(PQexec(c_, sql));
      if (r && PQresultStatus(r.get()) == PGRES_COMMAND_OK) return OkStatus();
      std::string msg = r ? PQresultErrorMessage(r.get()) : PQerrorMessage(c_);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      return Unavailable("trajectory store (PostgreSQL): " + msg);
    }
    // BEGIN, and a guard that rolls back unless Commit ran.
    Status Begin() { return Run("BEGIN"); }
    Status Commit() { return Run("COMMIT"); }
    void Rollback() { (void)Run("ROLLBACK"); }

   private:
    // The statement's name on this connection, prepared now if it is not yet: a null Result,
    // or the server's answer to a prepare that failed.
    Result Prepare(const char* sql, int nparams, const char** name) {
      auto it = prepared_->find(sql);
      if (it == prepared_->end()) {
        std::string n = "dsec_" + std::to_string(prepared_->size());
        Result r(PQprepare(c_, n.c_str(), sql, nparams, nullptr));
        if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK)
          return r ? std::move(r) : Result(PQmakeEmptyPGresult(c_, PGRES_FATAL_ERROR));
        it = prepared_->emplace(sql, std::move(n)).first;
      }
      *name = it->second.c_str();
      return Result();
    }

    PgConnPool* pool_;
    PGconn* c_;
    Prepared* prepared_;
    bool reused_ = false;  // taken from the idle ones
    bool used_ = false;    // a statement ran on this checkout
  };

  // What every new connection gets: notices ignored (CREATE TABLE IF NOT EXISTS's "already
  // exists" is no error), and no statement holding a node's thread for long.
  static Status Setup(PGconn* c) {
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);
    Result r(PQexec(c, "SET statement_timeout = '60s'"));
    if (r && PQresultStatus(r.get()) == PGRES_COMMAND_OK) return OkStatus();
    return Unavailable(std::string("trajectory store: ") + PQerrorMessage(c));
  }

  StatusOr<Conn> Get() {
    {
      // At most kMaxConns to the database from this node (many edges share its
      // max_connections): past them a caller waits for one a while.
      MutexLock l(mu_);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      if (!cv_.WaitUntil(l, until,
                         [&]() DSEC_REQUIRES(mu_) { return !idle_.empty() || open_ < kMaxConns; }))
        return Unavailable("trajectory store: all " + std::to_string(kMaxConns) +
                           " connections to PostgreSQL stayed busy for 30 s");
      if (!idle_.empty()) {
        PGconn* c = idle_.back();
        idle_.pop_back();
        return Conn(this, c, &prepared_[c], /*reused=*/true);
      }
      ++open_;
    }
    auto opened = Open();
    if (!opened.ok()) Closed(nullptr);
    return opened;
  }

 private:
  StatusOr<Conn> Open() {
    // The connection string may be key=value pairs or a postgresql:// URI (expand_dbname);
    // its own connect_timeout, if any, wins over the default given first.
    const char* keys[] = {"connect_timeout", "dbname", nullptr};
    const char* vals[] = {"5", conninfo_.c_str(), nullptr};
    PGconn* c = PQconnectdbParams(keys, vals, /*expand_dbname=*/1);
    if (!c) return Unavailable("trajectory store: out of memory connecting");
    if (PQstatus(c) != CONNECTION_OK) {
      std::string msg = PQerrorMessage(c);
      PQfinish(c);
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      return Unavailable("trajectory store: cannot reach PostgreSQL: " + msg);
    }
    if (Status s = Setup(c); !s.ok()) {
      PQfinish(c);
      return s;
    }
    Prepared* prepared;
    {
      MutexLock l(mu_);
      prepared = &prepared_[c];  // (a node of its own: stable while others come and go)
    }
    return Conn(this, c, prepared, /*reused=*/false);
  }

  // A connection goes (nullptr: one that was never made): another caller may open one.
  void Closed(PGconn* c) {
    if (c) PQfinish(c);
    MutexLock l(mu_);
    if (c) prepared_.erase(c);
    --open_;
    cv_.NotifyOne();
  }

  void Put(PGconn* c) {
    // A lost connection, or one left inside a transaction, is not reused.
    if (PQstatus(c) != CONNECTION_OK || PQtransactionStatus(c) != PQTRANS_IDLE) return Closed(c);
    MutexLock l(mu_);
    if (static_cast<int>(idle_.size()) >= kMaxIdleConns) {
      l.Unlock();
      return Closed(c);
    }
    idle_.push_back(c);
    cv_.NotifyOne();
  }

  const std::string conninfo_;
  Mutex mu_;
  CondVar cv_;
  std::vector<PGconn*> idle_ DSEC_GUARDED_BY(mu_);
  // Each connection's prepared statements: used by the one caller that has it checked out.
  std::unordered_map<PGconn*, Prepared> prepared_ DSEC_GUARDED_BY(mu_);
  int open_ DSEC_GUARDED_BY(mu_) = 0;  // idle and checked out
};

namespace {

using Conn = PgConnPool::Conn;

// Runs `body` in a transaction on `c`: committed when it returns OK, rolled back otherwise.
template <typename F>
Status InTxn(Conn& c, F body) {
  DSEC_RETURN_IF_ERROR(c.Begin());
  Status s = body();
  if (s.ok()) s = c.Commit();
  if (!s.ok()) c.Rollback();
  return s;
}

constexpr const char* kInfoColumns =
    "project, id, params, checkpoint_every, head, branches, state, sandbox, created_ms, "
    "updated_ms, expires_ms";

TrajectoryInfo InfoFrom(const PGresult* r, int i) {
  TrajectoryInfo t;
  t.project = Text(r, i, 0);
  t.id = Text(r, i, 1);
  t.params = Text(r, i, 2);
  t.checkpoint_every = I64(r, i, 3);
  t.head = I64(r, i, 4);
  t.branches = I64(r, i, 5);
  t.state = Text(r, i, 6);
  t.sandbox = Text(r, i, 7);
  t.created_ms = I64(r, i, 8);
  t.updated_ms = I64(r, i, 9);
  t.expires_ms = I64(r, i, 10);
  return t;
}

constexpr const char* kEntryColumns =
    "seq, fingerprint, method, target, request, mutating, status, content_type, headers, "
    "response, kept, streamed, exec_id, created_ms";
constexpr const char* kEntryColumnsOfE =
    "e.seq, e.fingerprint, e.method, e.target, e.request, e.mutating, e.status, "
    "e.content_type, e.headers, e.response, e.kept, e.streamed, e.exec_id, e.created_ms";
constexpr int kEntryColumnCount = 14;

TrajectoryEntry EntryFrom(const PGresult* r, int i) {
  TrajectoryEntry e;
  e.seq = I64(r, i, 0);
  e.fingerprint = Text(r, i, 1);
  e.method = Text(r, i, 2);
  e.target = Bytes(r, i, 3);
  e.request = Text(r, i, 4);
  e.mutating = B(r, i, 5);
  e.status = static_cast<int>(I64(r, i, 6));
  e.content_type = Bytes(r, i, 7);
  e.headers = Bytes(r, i, 8);
  e.response = Text(r, i, 9);
  e.kept = B(r, i, 10);
  e.streamed = B(r, i, 11);
  e.exec_id = Text(r, i, 12);
  e.created_ms = I64(r, i, 13);
  return e;
}

Status DeleteTrajectory(Conn& c, const std::string& key) {
  for (const char* sql : {"DELETE FROM dsec_trajectory_entries WHERE tkey = $1",
                          "DELETE FROM dsec_trajectory_checkpoints WHERE tkey = $1",
                          "DELETE FROM dsec_trajectory_branches WHERE tkey = $1",
                          "DELETE FROM dsec_trajectories WHERE tkey = $1"})
    DSEC_RETURN_IF_ERROR(c.Run(sql, {{key}}));
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<PgTrajectoryStore>> PgTrajectoryStore::Open(const std::string& conninfo,
                                                                     int64_t collect_grace_ms) {
  std::unique_ptr<PgTrajectoryStore> s(new PgTrajectoryStore());
  s->grace_ms_ = std::max(collect_grace_ms, kMinGraceMs);
  s->pool_ = std::make_unique<PgConnPool>(conninfo);
  {
    DSEC_ASSIGN_OR_RETURN(Conn c, s->pool_->Get());
    DSEC_RETURN_IF_ERROR(InTxn(c, [&] {
      DSEC_RETURN_IF_ERROR(c.Run(kSchemaLock));
      return c.Script(kSchema);
    }));
  }
  s->committer_ = std::thread([p = s.get()] { p->CommitLoop(); });
  return s;
}

PgTrajectoryStore::~PgTrajectoryStore() { Stop(); }

void PgTrajectoryStore::Stop() {
  queue_.Stop();
  if (committer_.joinable()) committer_.join();
}

Status PgTrajectoryStore::Create(const TrajectoryInfo& t) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(t.project, t.id);
  return InTxn(c, [&]() -> Status {
    const std::string every = Int(t.checkpoint_every), head = Int(t.head),
                      branches = Int(t.branches), created = Int(t.created_ms),
                      updated = Int(t.updated_ms), expires = Int(t.expires_ms);
    DSEC_ASSIGN_OR_RETURN(
        Result r, c.Exec("INSERT INTO dsec_trajectories(tkey, project, id, params, "
                         "checkpoint_every, head, branches, state, sandbox, created_ms, "
                         "updated_ms, expires_ms) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, "
                         "$10, $11, $12) ON CONFLICT (tkey) DO NOTHING",
                         {{key},
                          {t.project},
                          {t.id},
                          {t.params},
                          {every},
                          {head},
                          {branches},
                          {t.state},
                          {t.sandbox},
                          {created},
                          {updated},
                          {expires}}));
    if (std::string_view(PQcmdTuples(r.get())) == "0")
      return Status(StatusCode::kAlreadyExists, "trajectory \"" + t.id + "\" exists");
    return c.Run(
        "INSERT INTO dsec_trajectory_branches(tkey, branch, parent, fork_seq, created_ms) "
        "VALUES($1, 0, -1, 0, $2)",
        {{key}, {created}});
  });
}

StatusOr<TrajectoryInfo> PgTrajectoryStore::Get(const std::string& project, const std::string& id) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  static const std::string sql =
      std::string("SELECT ") + kInfoColumns + " FROM dsec_trajectories WHERE tkey = $1";
  const std::string key = Key(project, id);
  DSEC_ASSIGN_OR_RETURN(Result r, c.Exec(sql.c_str(), {{key}}));
  if (PQntuples(r.get()) == 0) return NotFound("trajectory \"" + id + "\" not found");
  return InfoFrom(r.get(), 0);
}

Status PgTrajectoryStore::Update(const TrajectoryInfo& t, const std::string& expect_sandbox) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(t.project, t.id), head = Int(t.head), updated = Int(t.updated_ms),
                    expires = Int(t.expires_ms);
  DSEC_ASSIGN_OR_RETURN(
      Result r,
      c.Exec("UPDATE dsec_trajectories SET head = $2, state = $3, sandbox = $4, "
             "updated_ms = $5, expires_ms = $6 WHERE tkey = $1 AND sandbox = $7",
             {{key}, {head}, {t.state}, {t.sandbox}, {updated}, {expires}, {expect_sandbox}}));
  if (std::string_view(PQcmdTuples(r.get())) == "0")
    return FailedPrecondition("trajectory \"" + t.id +
                              "\" is gone or followed by another sandbox now");
  return OkStatus();
}

StatusOr<std::vector<TrajectoryInfo>> PgTrajectoryStore::List() {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  static const std::string sql =
      std::string("SELECT ") + kInfoColumns + " FROM dsec_trajectories ORDER BY tkey";
  DSEC_ASSIGN_OR_RETURN(Result r, c.Exec(sql.c_str()));
  std::vector<TrajectoryInfo> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) out.push_back(InfoFrom(r.get(), i));
  return out;
}

Status PgTrajectoryStore::Delete(const std::string& project, const std::string& id) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(project, id);
  return InTxn(c, [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(
        Result r,
        c.Exec("SELECT sandbox FROM dsec_trajectories WHERE tkey = $1 FOR UPDATE", {{key}}));
    if (PQntuples(r.get()) == 0) return NotFound("trajectory \"" + id + "\" not found");
    if (std::string sb = Text(r.get(), 0, 0); !sb.empty())
      return FailedPrecondition("trajectory \"" + id + "\" is followed by sandbox " + sb +
                                ": delete the sandbox first");
    return DeleteTrajectory(c, key);
  });
}

StatusOr<std::vector<std::pair<std::string, std::string>>> PgTrajectoryStore::Expire(
    int64_t now_ms) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  std::vector<std::pair<std::string, std::string>> out;
  const std::string now = Int(now_ms);
  DSEC_RETURN_IF_ERROR(InTxn(c, [&]() -> Status {
    // (Rows another node is expiring or taking now are skipped: theirs.)
    DSEC_ASSIGN_OR_RETURN(
        Result r, c.Exec("SELECT tkey, project, id FROM dsec_trajectories WHERE sandbox = '' "
                         "AND expires_ms <= $1 FOR UPDATE SKIP LOCKED",
                         {{now}}));
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      DSEC_RETURN_IF_ERROR(DeleteTrajectory(c, Text(r.get(), i, 0)));
      out.emplace_back(Text(r.get(), i, 1), Text(r.get(), i, 2));
    }
    return OkStatus();
  }));
  return out;
}

void PgTrajectoryStore::Append(const std::string& project, const std::string& id, int64_t branch,
                               TrajectoryEntry e, std::vector<TrajectoryBlob> blobs,
                               std::function<void(Status)> done) {
  queue_.Push({Key(project, id), branch, std::move(e), std::move(blobs), std::move(done)});
}

void PgTrajectoryStore::CommitLoop() {
  for (;;) {
    std::vector<Pending> batch;
    if (!queue_.Take(&batch)) return;  // stopping, nothing left
    std::vector<Status> each(batch.size());
    Status s = CommitBatch(batch, &each);
    // Two nodes writing the same bodies at once may deadlock (the database aborts one), and an
    // idle connection may have been dropped: the batch goes again (on a new connection).
    for (int again = 0; again < 3 && s.code() == StatusCode::kAborted; ++again)
      s = CommitBatch(batch, &each);
    if (s.code() == StatusCode::kUnavailable) s = CommitBatch(batch, &each);
    if (!s.ok()) {
      std::fill(each.begin(), each.end(), s);
      // One bad entry (a seq taken, say) must not fail its neighbours: each on its own. (Not
      // when the database is unreachable: each would wait for its own connect timeout.)
      if (batch.size() > 1 && s.code() != StatusCode::kUnavailable) {
        for (size_t i = 0; i < batch.size(); ++i) {
          std::vector<Pending> one;
          one.push_back(std::move(batch[i]));
          std::vector<Status> st(1);
          Status s1 = CommitBatch(one, &st);
          each[i] = s1.ok() ? st[0] : s1;
          batch[i] = std::move(one[0]);
        }
      }
    }
    for (const Status& e : each)
      if (!e.ok()) DSEC_LOG_ERROR("trajectory commit failed: {}", e.ToString());
    for (size_t i = 0; i < batch.size(); ++i) batch[i].done(each[i]);
  }
}

Status PgTrajectoryStore::CommitBatch(std::vector<Pending>& batch, std::vector<Status>* each) {
  // The batch's bodies once each, in digest order (two nodes touching the same ones take their
  // row locks in the same order), before the entries that name them.
  std::map<std::string_view, std::string_view> blobs;
  for (const auto& p : batch)
    for (const auto& b : p.blobs) {
      if (!IsDigest(b.digest)) return InvalidArgument("not a digest: " + b.digest);
      blobs.emplace(b.digest, b.data);
    }
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  std::vector<Conn::Stmt> stmts;
  for (const auto& [digest, data] : blobs)
    // Touched when there: a collection on another node then leaves it alone (see
    // CollectBlobs).
    stmts.push_back(
        {"INSERT INTO dsec_trajectory_blobs(digest, data, touched_ms) VALUES($1, $2, " DSEC_PG_NOW
         ") ON CONFLICT (digest) DO UPDATE SET touched_ms = "
         "EXCLUDED.touched_ms",
         {{digest}, {data, true}}});
  std::vector<std::array<std::string, 4>> nums;  // (the numbers' text outlives the statements)
  nums.reserve(batch.size());
  for (const auto& p : batch) {
    const TrajectoryEntry& e = p.e;
    nums.push_back({Int(p.branch), Int(e.seq), Int(e.status), Int(e.created_ms)});
    const auto& n = nums.back();
    // Only while this sandbox (or none) follows the trajectory: one another node's resume took
    // over writes no more (its entry is not written; the others of the batch are).
    stmts.push_back(
        {"INSERT INTO dsec_trajectory_entries(tkey, branch, seq, fingerprint, method, target, "
         "request, mutating, status, content_type, headers, response, kept, streamed, exec_id, "
         "created_ms) SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::text, $6::bytea, "
         "$7::text, $8::boolean, $9::integer, $10::bytea, $11::bytea, $12::text, $13::boolean, "
         "$14::boolean, $15::text, $16::bigint WHERE EXISTS (SELECT 1 FROM dsec_trajectories "
         "WHERE tkey = $1 AND sandbox IN ($17, ''))",
         {{p.key},
          {n[0]},
          {n[1]},
          {e.fingerprint},
          {e.method},
          {e.target, true},
          {e.request},
          {Bool(e.mutating)},
          {n[2]},
          {e.content_type, true},
          {e.headers, true},
          {e.response},
          {Bool(e.kept)},
          {Bool(e.streamed)},
          {e.exec_id},
          {n[3]},
          {e.follower}}});
  }
  // One round trip, one transaction (committed at the pipeline's sync: synchronous commit).
  DSEC_ASSIGN_OR_RETURN(std::vector<Result> results, c.Pipeline(stmts));
  for (size_t i = 0; i < batch.size(); ++i) {
    const PGresult* r = results[blobs.size() + i].get();
    (*each)[i] = std::string_view(PQcmdTuples(const_cast<PGresult*>(r))) == "0"
                     ? FailedPrecondition("trajectory \"" + batch[i].key +
                                          "\" is gone or followed by another sandbox now")
                     : OkStatus();
  }
  return OkStatus();
}

StatusOr<std::optional<TrajectoryEntry>> PgTrajectoryStore::Entry(const std::string& project,
                                                                  const std::string& id,
                                                                  int64_t branch, int64_t seq) {
  DSEC_ASSIGN_OR_RETURN(auto v, Entries(project, id, branch, seq, seq));
  if (v.empty()) return std::optional<TrajectoryEntry>();
  return std::optional<TrajectoryEntry>(std::move(v[0]));
}

StatusOr<std::vector<TrajectoryEntry>> PgTrajectoryStore::Entries(const std::string& project,
                                                                  const std::string& id,
                                                                  int64_t branch, int64_t from,
                                                                  int64_t to) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  static const std::string sql = std::string("SELECT ") + kEntryColumns +
                                 " FROM dsec_trajectory_entries WHERE tkey = $1 AND branch = $2 "
                                 "AND seq >= $3 AND seq <= $4 ORDER BY seq";
  const std::string key = Key(project, id), b = Int(branch), f = Int(from), t = Int(to);
  DSEC_ASSIGN_OR_RETURN(Result r, c.Exec(sql.c_str(), {{key}, {b}, {f}, {t}}));
  std::vector<TrajectoryEntry> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) out.push_back(EntryFrom(r.get(), i));
  return out;
}

Status PgTrajectoryStore::AddCheckpoint(const std::string& project, const std::string& id,
                                        int64_t branch, const TrajectoryCheckpoint& c) {
  DSEC_ASSIGN_OR_RETURN(Conn conn, pool_->Get());
  const std::string key = Key(project, id), b = Int(branch), seq = Int(c.seq),
                    jobs = Json(c.jobs).dump(), created = Int(c.created_ms);
  return InTxn(conn, [&]() -> Status {
    // Its layers, touched (a collection now skips them, and one later sees the checkpoint):
    // each must still be there.
    for (auto n : SplitString(c.image, ',', true)) {
      if (!n.starts_with("sha256:")) continue;
      const std::string d(n);
      DSEC_ASSIGN_OR_RETURN(Result r,
                            conn.Exec("UPDATE dsec_trajectory_layers SET touched_ms = " DSEC_PG_NOW
                                      " WHERE digest = $1",
                                      {{d}}));
      if (std::string_view(PQcmdTuples(r.get())) == "0")
        return Unavailable("checkpoint layer " + d + " is not in the store");
    }
    DSEC_ASSIGN_OR_RETURN(
        Result r,
        conn.Exec("INSERT INTO dsec_trajectory_checkpoints(tkey, branch, seq, image, jobs, "
                  "created_ms) SELECT $1::text, $2::bigint, $3::bigint, $4::text, $5::text, "
                  "$6::bigint WHERE EXISTS (SELECT 1 FROM dsec_trajectories WHERE tkey = $1 AND "
                  "sandbox IN ($7, '')) ON CONFLICT (tkey, branch, seq) DO UPDATE SET image = "
                  "EXCLUDED.image, jobs = EXCLUDED.jobs, created_ms = EXCLUDED.created_ms",
                  {{key}, {b}, {seq}, {c.image}, {jobs}, {created}, {c.follower}}));
    if (std::string_view(PQcmdTuples(r.get())) == "0")
      return FailedPrecondition("trajectory \"" + id +
                                "\" is gone or followed by another sandbox now");
    return OkStatus();
  });
}

StatusOr<std::vector<TrajectoryCheckpoint>> PgTrajectoryStore::Checkpoints(
    const std::string& project, const std::string& id, int64_t branch) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(project, id), b = Int(branch);
  DSEC_ASSIGN_OR_RETURN(
      Result r, c.Exec("SELECT seq, image, jobs, created_ms FROM dsec_trajectory_checkpoints "
                       "WHERE tkey = $1 AND branch = $2 ORDER BY seq",
                       {{key}, {b}}));
  std::vector<TrajectoryCheckpoint> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    TrajectoryCheckpoint cp;
    cp.seq = I64(r.get(), i, 0);
    cp.image = Text(r.get(), i, 1);
    Json jobs = Json::parse(Text(r.get(), i, 2), nullptr, /*allow_exceptions=*/false);
    if (jobs.is_array())
      for (const auto& j : jobs)
        if (j.is_number_integer()) cp.jobs.push_back(j.get<int64_t>());
    cp.created_ms = I64(r.get(), i, 3);
    out.push_back(std::move(cp));
  }
  return out;
}

StatusOr<std::vector<TrajectoryBranch>> PgTrajectoryStore::Branches(const std::string& project,
                                                                    const std::string& id) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(project, id);
  DSEC_ASSIGN_OR_RETURN(
      Result r,
      c.Exec("SELECT b.branch, b.parent, b.fork_seq, b.created_ms, COUNT(e.seq), "
             "COALESCE(MAX(e.seq), 0) FROM dsec_trajectory_branches b LEFT JOIN "
             "dsec_trajectory_entries e ON e.tkey = b.tkey AND e.branch = b.branch WHERE "
             "b.tkey = $1 GROUP BY b.branch, b.parent, b.fork_seq, b.created_ms ORDER BY b.branch",
             {{key}}));
  std::vector<TrajectoryBranch> out;
  for (int i = 0; i < PQntuples(r.get()); ++i)
    out.push_back({I64(r.get(), i, 0), I64(r.get(), i, 1), I64(r.get(), i, 2), I64(r.get(), i, 3),
                   I64(r.get(), i, 4), I64(r.get(), i, 5)});
  return out;
}

StatusOr<int64_t> PgTrajectoryStore::Fork(const std::string& project, const std::string& id,
                                          int64_t from, int64_t at_seq) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string key = Key(project, id), f = Int(from), at = Int(at_seq), now = Int(WallMs());
  int64_t branch = 0;
  DSEC_RETURN_IF_ERROR(InTxn(c, [&]() -> Status {
    // The trajectory's row lock: two forks at once get two numbers.
    DSEC_ASSIGN_OR_RETURN(
        Result r,
        c.Exec("SELECT branches FROM dsec_trajectories WHERE tkey = $1 FOR UPDATE", {{key}}));
    if (PQntuples(r.get()) == 0) return NotFound("trajectory \"" + id + "\" not found");
    branch = I64(r.get(), 0, 0);
    const std::string b = Int(branch);
    DSEC_RETURN_IF_ERROR(
        c.Run("INSERT INTO dsec_trajectory_branches(tkey, branch, parent, fork_seq, created_ms) "
              "VALUES($1, $2, $3, $4, $5)",
              {{key}, {b}, {f}, {at}, {now}}));
    DSEC_RETURN_IF_ERROR(
        c.Run("INSERT INTO dsec_trajectory_entries SELECT tkey, $2, seq, fingerprint, method, "
              "target, request, mutating, status, content_type, headers, response, kept, "
              "streamed, exec_id, created_ms FROM dsec_trajectory_entries WHERE tkey = $1 AND "
              "branch = $3 AND seq < $4",
              {{key}, {b}, {f}, {at}}));
    DSEC_RETURN_IF_ERROR(
        c.Run("INSERT INTO dsec_trajectory_checkpoints SELECT tkey, $2, seq, image, jobs, "
              "created_ms FROM dsec_trajectory_checkpoints WHERE tkey = $1 AND branch = $3 AND "
              "seq < $4",
              {{key}, {b}, {f}, {at}}));
    // The new branch is the head: calls go to it from now on.
    return c.Run(
        "UPDATE dsec_trajectories SET branches = $2::bigint + 1, head = $2, updated_ms = $3 "
        "WHERE tkey = $1",
        {{key}, {b}, {now}});
  }));
  return branch;
}

StatusOr<std::vector<TrajectoryAnswer>> PgTrajectoryStore::Answers(const std::string& project,
                                                                   const std::string& id,
                                                                   int64_t branch, int64_t from,
                                                                   int64_t to, size_t max_bytes) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  // One round trip: the entries with their bodies, up to the one whose body would bring the
  // bodies past max_bytes (`upto`: the bodies' bytes up to and with a row; the first row comes
  // whatever its size).
  static const std::string sql =
      std::string("SELECT * FROM (SELECT ") + kEntryColumnsOfE +
      ", b.data, COALESCE(SUM(OCTET_LENGTH(b.data)) OVER (ORDER BY e.seq ROWS BETWEEN UNBOUNDED "
      "PRECEDING AND CURRENT ROW), 0) AS upto, ROW_NUMBER() OVER (ORDER BY e.seq) AS n FROM "
      "dsec_trajectory_entries e LEFT JOIN dsec_trajectory_blobs b ON e.kept AND b.digest = "
      "e.response WHERE e.tkey = $1 AND e.branch = $2 AND e.seq >= $3 AND e.seq <= $4) q WHERE "
      "upto <= $5 OR n = 1 ORDER BY seq";
  const std::string key = Key(project, id), b = Int(branch), f = Int(from), t = Int(to),
                    m = Int(static_cast<int64_t>(max_bytes));
  DSEC_ASSIGN_OR_RETURN(Result r, c.Exec(sql.c_str(), {{key}, {b}, {f}, {t}, {m}}));
  std::vector<TrajectoryAnswer> out;
  const int data = kEntryColumnCount;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    TrajectoryAnswer a{EntryFrom(r.get(), i), std::nullopt};
    if (a.e.kept && a.e.response.empty())
      a.body.emplace();  // an empty body keeps no row
    else if (a.e.kept && !PQgetisnull(r.get(), i, data))
      a.body = Bytes(r.get(), i, data);
    out.push_back(std::move(a));
  }
  return out;
}

StatusOr<std::string> PgTrajectoryStore::ReadBlob(const std::string& digest) {
  if (digest.empty()) return std::string();
  if (!IsDigest(digest)) return InvalidArgument("not a digest: " + digest);
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  DSEC_ASSIGN_OR_RETURN(
      Result r, c.Exec("SELECT data FROM dsec_trajectory_blobs WHERE digest = $1", {{digest}},
                       /*binary_results=*/true));
  if (PQntuples(r.get()) == 0) return NotFound("trajectory body " + digest + " not found");
  return Text(r.get(), 0, 0);
}

StatusOr<int64_t> PgTrajectoryStore::CollectBlobs() {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  const std::string grace = Int(grace_ms_);
  // A body or layer is taken only when nothing names it and nothing touched it for the grace:
  // a node about to name one touches it first in the same transaction (its row lock, and a
  // touch newer than the grace, keep this from taking it), and a row locked now is skipped.
  DSEC_ASSIGN_OR_RETURN(
      Result bodies,
      c.Exec("DELETE FROM dsec_trajectory_blobs WHERE digest IN (SELECT digest FROM "
             "dsec_trajectory_blobs b WHERE b.touched_ms < " DSEC_PG_NOW
             " - $1 AND NOT EXISTS (SELECT 1 FROM "
             "dsec_trajectory_entries e WHERE e.request = b.digest) AND NOT EXISTS (SELECT 1 "
             "FROM dsec_trajectory_entries e WHERE e.response = b.digest) FOR UPDATE SKIP "
             "LOCKED) AND touched_ms < " DSEC_PG_NOW " - $1",
             {{grace}}));
  int64_t n = std::strtoll(PQcmdTuples(bodies.get()), nullptr, 10);
  DSEC_RETURN_IF_ERROR(InTxn(c, [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(
        Result layers,
        c.Exec("DELETE FROM dsec_trajectory_layers WHERE digest IN (SELECT digest FROM "
               "dsec_trajectory_layers l WHERE l.touched_ms < " DSEC_PG_NOW
               " - $1 AND NOT EXISTS (SELECT 1 FROM "
               "dsec_trajectory_checkpoints k WHERE strpos(k.image, l.digest) > 0) FOR UPDATE "
               "SKIP LOCKED) AND touched_ms < " DSEC_PG_NOW " - $1 RETURNING digest",
               {{grace}}));
    for (int i = 0; i < PQntuples(layers.get()); ++i) {
      const std::string d = Text(layers.get(), i, 0);
      DSEC_RETURN_IF_ERROR(
          c.Run("DELETE FROM dsec_trajectory_layer_parts WHERE digest = $1", {{d}}));
      ++n;
    }
    return OkStatus();
  }));
  return n;
}

Status PgTrajectoryStore::PutLayer(const TrajectoryLayer& layer, const std::string& file) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  // Already there (another checkpoint, or another node, put it): touched, so it stays.
  DSEC_ASSIGN_OR_RETURN(
      Result r,
      c.Exec("UPDATE dsec_trajectory_layers SET touched_ms = " DSEC_PG_NOW " WHERE digest = $1",
             {{layer.digest}}));
  if (std::string_view(PQcmdTuples(r.get())) != "0") return OkStatus();
  UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open " + file);
  return InTxn(c, [&]() -> Status {
    std::string buf(kLayerPart, '\0');
    int part = 0;
    uint64_t total = 0;
    for (;;) {
      size_t got = 0;
      while (got < buf.size()) {
        ssize_t n = read(fd.get(), buf.data() + got, buf.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return ErrnoError("read " + file);
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      if (got == 0) break;
      total += got;
      const std::string p = Int(part++);
      DSEC_RETURN_IF_ERROR(
          c.Run("INSERT INTO dsec_trajectory_layer_parts(digest, part, data) VALUES($1, $2, $3) "
                "ON CONFLICT (digest, part) DO UPDATE SET data = EXCLUDED.data",
                {{layer.digest}, {p}, {std::string_view(buf.data(), got), true}}));
      if (got < buf.size()) break;
    }
    if (total != layer.blob_size)
      return Unavailable("layer " + layer.digest + ": its blob is " + std::to_string(total) +
                         " bytes, not " + std::to_string(layer.blob_size));
    const std::string size = Int(static_cast<int64_t>(layer.size)),
                      blob_size = Int(static_cast<int64_t>(layer.blob_size)), parts = Int(part);
    // (Two nodes putting the same layer at once: the same bytes; the last one's row stays.)
    return c.Run(
        "INSERT INTO dsec_trajectory_layers(digest, size, blob, blob_size, parts, touched_ms) "
        "VALUES($1, $2, $3, $4, $5, " DSEC_PG_NOW
        ") ON CONFLICT (digest) DO UPDATE SET "
        "touched_ms = EXCLUDED.touched_ms",
        {{layer.digest}, {size}, {layer.blob}, {blob_size}, {parts}});
  });
}

StatusOr<TrajectoryLayer> PgTrajectoryStore::FetchLayer(const std::string& digest,
                                                        const std::string& file) {
  DSEC_ASSIGN_OR_RETURN(Conn c, pool_->Get());
  DSEC_ASSIGN_OR_RETURN(Result r, c.Exec("SELECT size, blob, blob_size, parts FROM "
                                         "dsec_trajectory_layers WHERE digest = $1",
                                         {{digest}}));
  if (PQntuples(r.get()) == 0) return NotFound("checkpoint layer " + digest + " is not stored");
  TrajectoryLayer layer;
  layer.digest = digest;
  layer.size = static_cast<uint64_t>(I64(r.get(), 0, 0));
  layer.blob = Text(r.get(), 0, 1);
  layer.blob_size = static_cast<uint64_t>(I64(r.get(), 0, 2));
  const int64_t parts = I64(r.get(), 0, 3);
  UniqueFd fd(open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return ErrnoError("create " + file);
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  auto free_md = MakeScopeGuard([md] { EVP_MD_CTX_free(md); });
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1)
    return InternalError("sha256 init failed");
  uint64_t total = 0;
  // One part per statement: a layer of any size never sits whole in memory.
  for (int64_t i = 0; i < parts; ++i) {
    const std::string p = Int(i);
    DSEC_ASSIGN_OR_RETURN(Result part, c.Exec("SELECT data FROM dsec_trajectory_layer_parts "
                                              "WHERE digest = $1 AND part = $2",
                                              {{digest}, {p}}, /*binary_results=*/true));
    if (PQntuples(part.get()) == 0)
      return Unavailable("checkpoint layer " + digest + ": part " + p + " is missing");
    const char* data = PQgetvalue(part.get(), 0, 0);
    const size_t len = static_cast<size_t>(PQgetlength(part.get(), 0, 0));
    DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), std::string_view(data, len), file));
    EVP_DigestUpdate(md, data, len);
    total += len;
  }
  unsigned char sum[EVP_MAX_MD_SIZE];
  unsigned int sum_len = 0;
  EVP_DigestFinal_ex(md, sum, &sum_len);
  if (total != layer.blob_size ||
      "sha256:" + HexEncode(std::string_view(reinterpret_cast<const char*>(sum), sum_len)) !=
          layer.blob)
    return Unavailable("checkpoint layer " + digest + ": what the store holds is not its blob (" +
                       std::to_string(total) + " bytes): refused");
  return layer;
}

}  // namespace dsec::edge
