// Where trajectory logs live (edge/trajectory.h): the entries of every branch, their request and
// response bodies by content digest, the checkpoints, and the trajectories' own records.
//
// TrajectoryStore is the interface the edge uses; SqliteTrajectoryStore is the single-node one:
// a SQLite database (WAL) beside the state DB, bodies up to kInlineBlobMax in its `blobs` table
// and larger ones as digest-named files in a directory beside it. A cluster store (entries in
// PostgreSQL, bodies and checkpoints in the content-addressed store every node reads) implements
// the same interface.
//
// Durability: Append is a group commit. Entries queued while the committer writes go in its next
// transaction; each caller's `done` runs once its entry, and every body it names, is durable:
// written and fsync'd (with fsync) or at least handed to the kernel (without), so an edge killed
// with -9 loses no entry whose answer was sent.
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace dsec::edge {

class SqliteDb;

// A trajectory is named by (project, id): another project's id is another trajectory.
struct TrajectoryInfo {
  std::string project, id;
  std::string params;  // the create parameters of the sandbox that began it (JSON)
  int64_t checkpoint_every = 0;
  int64_t head = 0;      // the branch calls go to now
  int64_t branches = 1;  // branches 0..branches-1 exist
  std::string state;     // "recording", "replaying", "preempted", "stopped"
  std::string sandbox;   // the sandbox it follows now ("" when none)
  int64_t created_ms = 0, updated_ms = 0, expires_ms = 0;
};

struct TrajectoryBranch {
  int64_t branch = 0, parent = -1, fork_seq = 0, created_ms = 0;
  int64_t entries = 0, last_seq = 0;
};

// One recorded call. `target` is the request target after "/v1/sandboxes/{id}".
struct TrajectoryEntry {
  int64_t seq = 0;
  std::string fingerprint;
  std::string method, target;
  std::string request;    // digest of the request body ("" for none)
  bool mutating = false;  // re-run when the sandbox is rebuilt from an earlier checkpoint
  int status = 0;
  std::string content_type;
  std::string headers;    // JSON array of [name, value]
  std::string response;   // digest of the response body ("" when it was not kept)
  bool kept = true;       // false: too large to keep; a resumed call runs live
  bool streamed = false;  // sent as a stream (replayed as one)
  std::string exec_id;    // the background exec it started ("" none)
  int64_t created_ms = 0;
  // (Not stored.) The sandbox that writes it: a shared store refuses the entry unless that
  // sandbox, or none, follows the trajectory (another node's resume took it over).
  std::string follower;
};

struct TrajectoryCheckpoint {
  int64_t seq = 0;            // the state after this call (0: before any)
  std::string image;          // the captured stack (image names or layer digests, ',' joined)
  std::vector<int64_t> jobs;  // the background execs (by seq) still running when taken
  int64_t created_ms = 0;
  std::string follower;  // (not stored) as TrajectoryEntry::follower
};

// A body to store with an entry: its digest (lowercase hex SHA-256) and bytes.
struct TrajectoryBlob {
  std::string digest, data;
};

// An entry with its answer's body, for answering from the log: `body` is unset when the entry
// kept none or its body is not in the store.
struct TrajectoryAnswer {
  TrajectoryEntry e;
  std::optional<std::string> body;
};

// A checkpoint's layer as a shared store keeps it (images::LayerInfo's fields as nodes pass
// layers: `digest` names the layer, `blob` is its EROFS image's "sha256:<hex>").
struct TrajectoryLayer {
  std::string digest;
  uint64_t size = 0;
  std::string blob;
  uint64_t blob_size = 0;
};

// An entry waiting for its group commit ("<project>/<id>" as its key).
struct TrajectoryPending {
  std::string key;
  int64_t branch = 0;
  TrajectoryEntry e;
  std::vector<TrajectoryBlob> blobs;
  std::function<void(Status)> done;
};

// The group commit's queue (both stores): Append queues, the committer takes all that is queued
// at once. Thread-safe.
class TrajectoryCommitQueue {
 public:
  // Queues `p`, or answers it at once (Unavailable) once stopped.
  void Push(TrajectoryPending p);
  // Waits for entries and takes them all; false once stopped with none left.
  bool Take(std::vector<TrajectoryPending>* batch);
  void Stop();

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<TrajectoryPending> queue_ DSEC_GUARDED_BY(mu_);
  bool stopping_ DSEC_GUARDED_BY(mu_) = false;
};

class TrajectoryStore {
 public:
  virtual ~TrajectoryStore() = default;

  virtual Status Create(const TrajectoryInfo& t) = 0;  // AlreadyExists for a taken (project, id)
  virtual StatusOr<TrajectoryInfo> Get(const std::string& project, const std::string& id) = 0;
  // Writes head, state, sandbox, updated_ms and expires_ms, only while the sandbox that follows
  // it is `expect_sandbox` ("": none): FailedPrecondition when another one took it meanwhile.
  virtual Status Update(const TrajectoryInfo& t, const std::string& expect_sandbox) = 0;
  virtual StatusOr<std::vector<TrajectoryInfo>> List() = 0;
  // The trajectory and its entries, checkpoints and branches (bodies go at CollectBlobs), only
  // while no sandbox follows it (FailedPrecondition).
  virtual Status Delete(const std::string& project, const std::string& id) = 0;
  // Deletes the trajectories no sandbox follows whose expires_ms is at most now_ms; returns
  // them as (project, id).
  virtual StatusOr<std::vector<std::pair<std::string, std::string>>> Expire(int64_t now_ms) = 0;

  // Queues an entry of `branch` and its bodies; `done` runs (on the committer) once all are
  // durable, or with the error that kept them from it (an entry of that seq already there, a
  // stopped store).
  virtual void Append(const std::string& project, const std::string& id, int64_t branch,
                      TrajectoryEntry e, std::vector<TrajectoryBlob> blobs,
                      std::function<void(Status)> done) = 0;
  virtual StatusOr<std::optional<TrajectoryEntry>> Entry(const std::string& project,
                                                         const std::string& id, int64_t branch,
                                                         int64_t seq) = 0;
  // Entries with from <= seq <= to, in order.
  virtual StatusOr<std::vector<TrajectoryEntry>> Entries(const std::string& project,
                                                         const std::string& id, int64_t branch,
                                                         int64_t from, int64_t to) = 0;
  virtual Status AddCheckpoint(const std::string& project, const std::string& id, int64_t branch,
                               const TrajectoryCheckpoint& c) = 0;
  virtual StatusOr<std::vector<TrajectoryCheckpoint>> Checkpoints(const std::string& project,
                                                                  const std::string& id,
                                                                  int64_t branch) = 0;
  virtual StatusOr<std::vector<TrajectoryBranch>> Branches(const std::string& project,
                                                           const std::string& id) = 0;
  // A new branch holding `from`'s entries and checkpoints before `at_seq`; its number.
  virtual StatusOr<int64_t> Fork(const std::string& project, const std::string& id, int64_t from,
                                 int64_t at_seq) = 0;
  virtual StatusOr<std::string> ReadBlob(const std::string& digest) = 0;
  // Entries with from <= seq <= to, in order, each with its answer's body; it stops before the
  // entry whose body would bring the bodies past `max_bytes` (the first comes whatever its
  // size). A store that can answers in one round trip; this one asks for the entries, then
  // each body.
  virtual StatusOr<std::vector<TrajectoryAnswer>> Answers(const std::string& project,
                                                          const std::string& id, int64_t branch,
                                                          int64_t from, int64_t to,
                                                          size_t max_bytes);
  // Bodies no entry names any more (and, in a shared store, checkpoint layers no checkpoint
  // names); how many went.
  virtual StatusOr<int64_t> CollectBlobs() = 0;
  // Commits what is queued and stops the committer: later appends fail at once.
  virtual void Stop() = 0;

  // Whether other nodes read this store (a cluster's): a checkpoint's layers are then put in it
  // (PutLayer) before the checkpoint is noted, and fetched from it (FetchLayer) by a node that
  // makes a sandbox from a checkpoint whose layers it lacks. A node's own store keeps them in
  // its image store only.
  virtual bool shared() const { return false; }
  // Stores `file`, the layer's blob (its size and sha256 checked by the caller); a layer already
  // there is only touched.
  virtual Status PutLayer(const TrajectoryLayer& layer, const std::string& file) {
    (void)layer;
    (void)file;
    return OkStatus();
  }
  // Writes the layer's blob to `file`, checked against its record (size and sha256): NotFound
  // when the store does not have it, Unavailable when what it has does not match.
  virtual StatusOr<TrajectoryLayer> FetchLayer(const std::string& digest, const std::string& file) {
    (void)file;
    return NotFound("no shared layer store: layer " + digest);
  }
};

class SqliteTrajectoryStore : public TrajectoryStore {
 public:
  // Bodies up to this size live in the database; larger ones are files.
  static constexpr size_t kInlineBlobMax = 64 << 10;

  // `path`: the database (created 0600); `blob_dir`: the large bodies (created 0700).
  // With fsync, a commit is fsync'd (the WAL and every body file): durable across a power loss,
  // not only across the edge's death.
  static StatusOr<std::unique_ptr<SqliteTrajectoryStore>> Open(const std::string& path,
                                                               const std::string& blob_dir,
                                                               bool fsync);
  ~SqliteTrajectoryStore() override;

  Status Create(const TrajectoryInfo& t) override;
  StatusOr<TrajectoryInfo> Get(const std::string& project, const std::string& id) override;
  Status Update(const TrajectoryInfo& t, const std::string& expect_sandbox) override;
  StatusOr<std::vector<TrajectoryInfo>> List() override;
  Status Delete(const std::string& project, const std::string& id) override;
  StatusOr<std::vector<std::pair<std::string, std::string>>> Expire(int64_t now_ms) override;
  void Stop() override;
  void Append(const std::string& project, const std::string& id, int64_t branch, TrajectoryEntry e,
              std::vector<TrajectoryBlob> blobs, std::function<void(Status)> done) override;
  StatusOr<std::optional<TrajectoryEntry>> Entry(const std::string& project, const std::string& id,
                                                 int64_t branch, int64_t seq) override;
  StatusOr<std::vector<TrajectoryEntry>> Entries(const std::string& project, const std::string& id,
                                                 int64_t branch, int64_t from, int64_t to) override;
  Status AddCheckpoint(const std::string& project, const std::string& id, int64_t branch,
                       const TrajectoryCheckpoint& c) override;
  StatusOr<std::vector<TrajectoryCheckpoint>> Checkpoints(const std::string& project,
                                                          const std::string& id,
                                                          int64_t branch) override;
  StatusOr<std::vector<TrajectoryBranch>> Branches(const std::string& project,
                                                   const std::string& id) override;
  StatusOr<int64_t> Fork(const std::string& project, const std::string& id, int64_t from,
                         int64_t at_seq) override;
  StatusOr<std::string> ReadBlob(const std::string& digest) override;
  StatusOr<int64_t> CollectBlobs() override;

  // Commits so far and the entries they held (for the group commit's figures).
  std::pair<int64_t, int64_t> commits() const;

 private:
  SqliteTrajectoryStore() = default;
  using Pending = TrajectoryPending;
  void CommitLoop();
  Status CommitBatch(std::vector<Pending>& batch);
  Status WriteBlobFile(const TrajectoryBlob& b);
  std::string BlobPath(const std::string& digest) const;
  Status DeleteLocked(const std::string& key) DSEC_REQUIRES(mu_);

  std::string blob_dir_;
  bool fsync_ = true;
  Mutex mu_;  // the connection
  std::unique_ptr<SqliteDb> db_ DSEC_PT_GUARDED_BY(mu_);

  Mutex commit_mu_;  // a commit, or a collection of bodies
  TrajectoryCommitQueue queue_;
  std::atomic<int64_t> commits_{0}, committed_{0};
  std::thread committer_;
};

}  // namespace dsec::edge
