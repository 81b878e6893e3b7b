// The cluster's trajectory store (edge/trajectory_store.h): every edge of a cluster reads and
// writes the same PostgreSQL database, so a trajectory survives the node that recorded it and
// any node can resume it. Entries, branches, checkpoints and bodies are rows; checkpoint layers
// (their EROFS blobs, as nodes pass layers between them) are kept in 4 MiB parts, put by the
// node that took the checkpoint before the checkpoint is noted and fetched by a node that makes
// a sandbox from it.
//
// Durability: Append is a group commit on a connection of its own (one transaction per group,
// PostgreSQL's synchronous commit). Concurrency between nodes: a trajectory's follower is set
// and cleared by conditional updates, forks take the trajectory's row lock, and bodies and layers
// are collected only once unreferenced and untouched for `collect_grace_ms` (a body another node
// is about to reference is touched by its insert first).
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "edge/trajectory_store.h"

namespace dsec::edge {

class PgConnPool;

class PgTrajectoryStore : public TrajectoryStore {
 public:
  // `conninfo`: a libpq connection string ("host=127.0.0.1 port=5432 dbname=dsec user=dsec").
  // Creates the tables when missing (one node at a time, under an advisory lock).
  static StatusOr<std::unique_ptr<PgTrajectoryStore>> Open(const std::string& conninfo,
                                                           int64_t collect_grace_ms);
  ~PgTrajectoryStore() override;

  bool shared() const override { return true; }
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
  StatusOr<std::vector<TrajectoryAnswer>> Answers(const std::string& project, const std::string& id,
                                                  int64_t branch, int64_t from, int64_t to,
                                                  size_t max_bytes) override;
  StatusOr<int64_t> CollectBlobs() override;
  Status PutLayer(const TrajectoryLayer& layer, const std::string& file) override;
  StatusOr<TrajectoryLayer> FetchLayer(const std::string& digest, const std::string& file) override;

 private:
  PgTrajectoryStore() = default;
  using Pending = TrajectoryPending;
  void CommitLoop();
  // Writes the batch (one transaction): an error when none of it could be written, else each
  // entry's own outcome in `each` (one another sandbox took over is not written).
  Status CommitBatch(std::vector<Pending>& batch, std::vector<Status>* each);

  int64_t grace_ms_ = 0;
  std::unique_ptr<PgConnPool> pool_;

  TrajectoryCommitQueue queue_;
  std::thread committer_;
};

}  // namespace dsec::edge
