// The trajectory log (../shared/DESIGN.md "Jobs, preemption, retries, the trajectory log"): a
// sandbox created with `trajectory: {"id"}` records every call that reads or changes its state,
// in order, with a sequence number and a fingerprint of the request; the answer is sent only
// once its entry is durable (TrajectoryStore's group commit). Every checkpoint_every mutating
// calls, and when its job is preempted, the writable layer is captured (the snapshot capture)
// as a checkpoint of that sequence number.
//
// A sandbox created with `trajectory: {"id", "resume": true}` exists at once but is not made:
// a call whose sequence number and fingerprint match the log is answered from the log, byte for
// byte, without running. The first call past the log's end or differing from it (or any call
// that needs the sandbox itself) materializes it: the latest checkpoint at or before that point,
// the background execs that were running at that checkpoint started again, the logged mutating
// calls after it run again in order; then the call runs live, and is recorded. A differing call
// forks the trajectory there: a new branch holds the entries before it, the old one is kept.
//
// Calls on a recording or replaying sandbox run one at a time, in the order they arrive: that
// order is the log's. What is not recorded: attach (a terminal's bytes), the port proxy,
// stats, pause/resume, snapshot and fork (they run live, materializing first if needed).
//
// Thread safety: all methods are thread-safe; Serve, Preempt, Resume and Housekeep block (they
// may capture a checkpoint or make a sandbox) and run on worker threads.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/routes.h"
#include "api/trajectory_json.h"
#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "edge/trajectory_store.h"

namespace dsec::images {
class ImageStore;
}

namespace dsec::edge {

class Api;
class Ctx;
class Manager;
class Metrics;
struct CreateParams;
using RouteFn = void (*)(const std::shared_ptr<Ctx>&);

struct TrajectoryOptions {
  int64_t checkpoint_every = 20;  // mutating calls between checkpoints (0: only at preempt)
  int64_t ttl_s = 7 * 86400;      // kept this long after its last use
  std::map<std::string, int64_t> project_ttl_s;  // per project, over ttl_s
  uint64_t max_body_bytes = 16 << 20;            // a request or response kept at most
  uint64_t max_bytes = 1ull << 30;               // all the bodies of one trajectory
  std::string node;  // this node's name (its sandboxes' ids begin "sb-<node>-")
};

class Trajectories {
 public:
  Trajectories(TrajectoryOptions opts, TrajectoryStore* store, Manager* manager,
               images::ImageStore* images, Api* api);
  ~Trajectories();
  // The API that runs logged calls again (set once, before serving).
  void SetApi(Api* api) { api_ = api; }
  void SetMetrics(Metrics* m) { metrics_ = m; }
  // In a cluster: fetches the images of a checkpoint's stack the node lacks (by name: the
  // layers of a shared store's checkpoints come from the store itself).
  using EnsureImagesFn =
      std::function<Status(const std::string& project, const std::vector<std::string>& names)>;
  void SetEnsureImages(EnsureImagesFn fn) { ensure_images_ = std::move(fn); }

  // At start, after the manager re-adopted its sandboxes: trajectories whose sandbox came back
  // record on; the others are stopped. Returns the image-store holders of their checkpoints.
  std::vector<std::string> Recover();

  // A new trajectory recorded by sandbox `sandbox` (just made with `p`); 409 when the id is
  // taken in the project.
  Status Begin(const std::string& sandbox, const CreateParams& p, const api::TrajectorySpec& spec);
  // What a resumed sandbox is made with: the trajectory's own create parameters, with the
  // request's labels, TTLs and cluster fields (404 for an unknown id, 409 when a sandbox
  // follows it now).
  // `takeover`: the sandbox an apiserver says is on a node that is gone (Dsec-Trajectory-Takeover):
  // a trajectory it follows is freed for this resume (only in a shared store, only another
  // node's sandbox).
  StatusOr<CreateParams> ResumeParams(const CreateParams& request, const api::TrajectorySpec& spec,
                                      const std::string& takeover = "");
  // Binds the resumed sandbox `sandbox` (made by the manager but not yet created: `create` does
  // it) to the trajectory.
  Status Resumed(const std::string& sandbox, const std::string& project,
                 const api::TrajectorySpec& spec, std::function<void()> create);

  // Runs a call on a sandbox (`fn`, the route's handler): recorded, answered from the log,
  // or run live after materializing, as the sandbox's binding says; untouched if it has none.
  void Serve(const std::shared_ptr<Ctx>& c, RouteFn fn, api::RouteId route);

  // POST /v1/jobs/{job}/preempt: checkpoints every recorded sandbox of the job, then deletes
  // them all (the others snapshotted first into an image when `others` is "snapshot").
  StatusOr<Json> Preempt(const std::string& job, const std::string& project,
                         const std::string& others);
  // GET /v1/trajectories/{id} (entries of `branch`, default the head, from `from`, at most
  // `limit`) and GET /v1/trajectories.
  StatusOr<Json> Describe(const std::string& project, const std::string& id,
                          std::optional<int64_t> branch, int64_t from, int64_t limit);
  StatusOr<Json> List(const std::string& project);
  // DELETE /v1/trajectories/{id}: 409 while a sandbox follows it.
  Status Delete(const std::string& project, const std::string& id);

  // Bindings of sandboxes that are gone; expired trajectories and what only they held.
  void Housekeep();
  // At shutdown, after the workers are joined: no checkpoint runs any more.
  void Stop();

  // The holder of a trajectory's checkpoint layers in the image store.
  static std::string HolderOf(const std::string& project, const std::string& id);
  // The id a background exec of a recorded call gets (the same when it runs again).
  static std::string ExecIdFor(const std::string& project, const std::string& id, int64_t seq);

  struct Binding;

 private:
  std::shared_ptr<Binding> Find(const std::string& sandbox);
  void Unbind(const std::shared_ptr<Binding>& b, const std::string& state);
  Status TakeTurn(const std::shared_ptr<Binding>& b, int wait_s = 60);
  void ReleaseTurn(const std::shared_ptr<Binding>& b);
  // A replaying sandbox's logged call `seq` with its body (read ahead), or null: none logged
  // (or the log could not be read; the call then goes live).
  TrajectoryAnswer* Logged(const std::shared_ptr<Binding>& b, int64_t seq);
  // Makes a replaying sandbox live at `seq` (forking when the log has an entry there).
  Status Materialize(const std::shared_ptr<Binding>& b, int64_t seq);
  // Runs a logged call again on the sandbox (its answer is dropped).
  Status Rerun(const std::shared_ptr<Binding>& b, const TrajectoryEntry& e);
  Status Checkpoint(const std::shared_ptr<Binding>& b, int64_t seq);
  Status HoldCheckpoints(const std::string& project, const std::string& id);
  // A shared store: a checkpoint's layers go to it before the checkpoint is noted, and come
  // from it to a node that makes a sandbox from the checkpoint.
  Status PutCheckpointLayers(const std::vector<std::string>& stack);
  Status FetchCheckpointLayers(const std::string& project, const std::string& stack);
  // A sandbox of this node (a shared store lists every node's trajectories).
  bool Ours(const std::string& sandbox) const;
  // A shared store: this node's holders of trajectories that are gone (another node expired
  // or deleted them) are released.
  void ReleaseGoneHolders();
  // A recorded call is done (its answer sent): the turn goes on, after a checkpoint if due.
  friend class TrajectoryRecorder;
  void Recorded(const std::shared_ptr<Binding>& b, bool checkpoint_due);
  // Counts `n` more bytes of bodies kept by b's trajectory: false (nothing counted) past
  // max_bytes.
  bool Charge(const std::shared_ptr<Binding>& b, int64_t n);
  Status MaterializeSteps(const std::shared_ptr<Binding>& b, int64_t seq);
  int64_t TtlFor(const std::string& project) const;

  TrajectoryOptions opts_;
  TrajectoryStore* store_;
  Manager* manager_;
  images::ImageStore* images_;
  Api* api_;
  Metrics* metrics_ = nullptr;
  EnsureImagesFn ensure_images_;
  int64_t next_gone_check_ms_ = 0;  // (ReleaseGoneHolders, from the housekeeper only)
  void Count(const char* event) const;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Binding>> bindings_ DSEC_GUARDED_BY(mu_);  // by sandbox
  std::atomic<bool> collect_{false};  // bodies to collect (a trajectory was deleted)
  // Checkpoints run here, not on the API's workers (which may all be waiting for a turn that
  // a checkpoint holds).
  boost::asio::thread_pool checkpointer_{1};
};

}  // namespace dsec::edge
