// Pools of warm sandboxes, made through any kind's Backend (backends/sandbox.h). kind
// "container": pre-created sandboxes, handed out whole by TakeSandbox (a create from the pool)
// and refilled to `min_idle` in the background. kind "fncall": warm fncall workers
// (backends/fncall/zygote.h), where a runtime is a pool. A pool keeps `min_idle`
// workers ready, grows to `max` while calls wait, shrinks back after `idle_timeout_s`, and
// replaces a worker that died or misbehaved. One call per worker at a time (its memory limit is
// the worker's cgroup, set per call); calls beyond capacity wait in a bounded queue for up to
// `queue_timeout_ms`, then fail with kOverCapacity.
//
// Thread safety: all methods are thread-safe. Submit never blocks: the call's result arrives
// through its callback (on a backend I/O thread or the maintenance thread). Worker creation
// and teardown happen on the PoolSet's maintenance thread.
#pragma once

#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/sandbox.h"
#include "base/mutex.h"
#include "base/resources.h"
#include "base/status.h"

namespace dsec::pools {

using Json = nlohmann::json;

// What a pool holds: warm fncall workers (a runtime calls are submitted to), or ready sandboxes
// that creates take whole: containers, or microVMs (each restored from its template and
// answering, so a create from the pool costs no restore).
enum class PoolKind { kFncall, kContainer, kMicrovm };
std::string_view PoolKindName(PoolKind k);  // "fncall", "container", "microvm"
std::optional<PoolKind> PoolKindFromName(std::string_view name);
// Whether it holds ready sandboxes (not fncall workers), and of which kind.
inline bool HoldsSandboxes(PoolKind k) { return k != PoolKind::kFncall; }
inline backends::Kind SandboxKindOf(PoolKind k) {
  return k == PoolKind::kMicrovm ? backends::Kind::kMicrovm : backends::Kind::kContainer;
}

struct PoolConfig {
  std::string name;
  PoolKind kind = PoolKind::kFncall;
  backends::FnRuntime runtime = backends::FnRuntime::kPython;  // fncall pools
  std::vector<std::string> preload;  // python modules imported once per worker
  std::vector<std::string> command;  // exec: argv the code is appended to
  std::string image = "host";
  int min_idle = 2;
  int max = 8;
  // fncall: memory_mb is per call, the default and the most a call may ask for, and disk_mb
  // each call's fresh workdir and /tmp; container: as a create's.
  Resources resources{.disk_mb = 64};
  int max_queue = 256;
  int64_t queue_timeout_ms = 10000;
  int64_t idle_timeout_s = 60;  // idle workers beyond min_idle go after this long
  // A pool of sandboxes nobody took from (or asked to) for this long is removed by the
  // PoolSet (0: never): the edge's own standby pools (config microvm_standby).
  int64_t expire_unused_s = 0;
  // A container pool's sandboxes start like a create of `image` would: the edge fills these
  // from the image's config (they are not part of the pool's JSON; fncall pools, on host only,
  // keep the defaults).
  std::string workdir = "/workspace";
  std::string user = "sandbox";
  std::map<std::string, std::string> env;

  // The shape of its sandboxes (a container pool's, as a create takes it; network none).
  backends::SandboxShape Shape() const {
    backends::SandboxShape s;
    s.image = image;
    s.resources = resources;
    s.user = user;
    s.workdir = workdir;
    s.env = env;
    return s;
  }
};
// What a pool is doing (GET /v1/pools renders it: api/pool_json.h).
struct PoolStatus {
  PoolConfig config;
  size_t idle = 0, busy = 0;  // workers (or ready container sandboxes)
  int starting = 0;
  uint64_t taken = 0, missed = 0;  // container pools: creates served from it, or not
  size_t queued = 0;               // fncall pools: calls waiting
  uint64_t calls = 0;
  uint64_t rejected = 0, replaced = 0, yielded = 0;
  std::string last_error;  // empty: none
};

// What a pool's ready sandboxes are created with (their id aside; fncall workers add theirs).
backends::SandboxSpec ContainerSpecFor(const PoolConfig& c);

struct CallRequest {
  protocol::FnCallSpec call;
  std::string stdin_data;
  int64_t timeout_ms = 5000;
  int64_t memory_mb = 0;  // 0: the pool's
  uint64_t max_output_bytes = 64 << 10;
};

struct CallResult {
  backends::ExecOutput out;
  double queue_ms = 0;
  std::string worker;
};
using CallDone = std::function<void(StatusOr<CallResult>)>;

// A pool's scaling, as a pure function of what it holds now (Pool::Maintain applies it).
struct PoolCounts {
  int idle = 0, busy = 0, starting = 0, queued = 0;
  int idle_low = 0;          // the fewest idle workers at any moment of the current window
  bool window_over = false;  // the idle_timeout_s window ended
};
struct ScalePlan {
  int start = 0;            // new workers to make
  int retire_lru = 0;       // idle workers to destroy, least recently used first (the surplus)
  int retire_over_max = 0;  // idle workers to destroy because max went down
};
// `container`: a container pool (its sandboxes leave when taken, so only idle ones count
// against max).
ScalePlan PlanScale(const PoolCounts& c, int min_idle, int max, bool container);

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  Pool(PoolConfig cfg, backends::Backend* backend, std::string node);
  const PoolConfig& config() const { return cfg_; }
  // Whether cfg_.expire_unused_s passed since it was made or last asked for a sandbox.
  bool Expired(int64_t now_ms) const;
  void Submit(CallRequest req, CallDone done);
  // kind "container": a ready sandbox, now the caller's (nullptr when none is idle).
  std::shared_ptr<backends::Sandbox> TakeSandbox();
  // kind "container": what each pooled sandbox is created with (its id aside).
  backends::SandboxSpec ContainerSpec() const;
  PoolStatus State() const;
  // Sandboxes the pool holds now (workers, or ready container sandboxes, starting ones
  // included) and the memory they may use (memory_mb each), for the node's admission.
  std::pair<int64_t, int64_t> Usage() const;
  // Gives up its least recently used idle worker (or ready sandbox) so that an explicit create
  // fits the node: nullptr when none is idle. The caller destroys it; the pool refills later
  // as the node's admission lets it.
  std::shared_ptr<backends::Sandbox> YieldIdle();

  // --- for the PoolSet's maintenance thread ---
  // Creates/destroys workers and expires queued calls; returns ms until it wants to run again.
  int64_t Maintain();
  void UpdateLimits(const PoolConfig& cfg);  // min_idle, max, queue bounds, idle timeout
  void Shutdown();                           // destroys every worker, fails queued calls

 private:
  struct Worker {
    std::shared_ptr<backends::Sandbox> sb;
    int64_t baseline_mb = 0;  // the worker's own use (agent, zygote) on top of a call's limit
    int64_t limit_mb = 0;     // the call limit its cgroup is set to now
    int limit_failures = 0;   // memory limit cuts refused in a row
    int64_t rest_until_ms = 0;
    int64_t calls = 0;  // calls it ran
  };
  struct Queued {
    CallRequest req;
    CallDone done;
    int64_t enqueued_us = 0;
  };
  // Runs `q` on `w` (mu_ not held). On a worker failure the call goes back to the queue.
  void Start(std::shared_ptr<Worker> w, Queued q);
  void Finished(std::shared_ptr<Worker> w, Queued q, StatusOr<backends::ExecOutput> out,
                double queue_ms, bool started);
  // Takes an idle worker and the next call, if both exist (mu_ held).
  bool NextLocked(std::shared_ptr<Worker>* w, Queued* q) DSEC_REQUIRES(mu_);
  void Retire(std::shared_ptr<Worker> w) DSEC_REQUIRES(mu_);  // destroyed by the maintenance thread
  StatusOr<std::shared_ptr<Worker>> MakeWorker();
  // What one maintenance pass does outside mu_, decided under it.
  struct Upkeep {
    std::vector<Queued> expired;                   // waited longer than queue_timeout_ms
    std::vector<std::shared_ptr<Worker>> destroy;  // retired, surplus or over max
    std::vector<std::pair<std::shared_ptr<Worker>, Queued>> start;  // rested worker + call
    int create = 0;                                                 // new workers to make
  };
  Upkeep PlanUpkeepLocked(int64_t now_ms) DSEC_REQUIRES(mu_);
  // Makes `n` workers one by one, each serving the queue as it arrives; false when one
  // could not be made (the rest are skipped, the pool backs off).
  bool CreateWorkers(int n);

  PoolConfig cfg_;
  backends::Backend* backend_;
  std::string node_;
  mutable Mutex mu_;
  std::deque<std::shared_ptr<Worker>> idle_ DSEC_GUARDED_BY(mu_);  // most recently used last
  std::map<backends::Sandbox*, std::shared_ptr<Worker>> busy_ DSEC_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Worker>> retired_ DSEC_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Worker>> resting_ DSEC_GUARDED_BY(mu_);
  std::deque<Queued> queue_ DSEC_GUARDED_BY(mu_);
  int starting_ DSEC_GUARDED_BY(mu_) = 0;
  // Workers CreateWorkers is still making or, made too late, destroying: Shutdown waits for
  // them (a removed pool leaves no sandbox behind when it returns).
  int making_ DSEC_GUARDED_BY(mu_) = 0;
  CondVar made_cv_;
  bool stopped_ DSEC_GUARDED_BY(mu_) = false;
  std::string last_error_ DSEC_GUARDED_BY(mu_);
  uint64_t calls_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t rejected_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t replaced_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t taken_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t last_asked_ms_ DSEC_GUARDED_BY(mu_) = 0;  // monotonic: made, or a TakeSandbox
  uint64_t missed_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t yielded_ DSEC_GUARDED_BY(mu_) = 0;  // idle ones given up for explicit creates
  int idle_low_ DSEC_GUARDED_BY(mu_) = 0;      // fewest idle workers in this window
  int64_t window_start_ms_ DSEC_GUARDED_BY(mu_) = 0;
  std::function<void()> wake_;  // asks the maintenance thread to run soon
  // The node's admission for one more sandbox of `memory_mb` (set by the PoolSet; may be
  // empty). Called without mu_ held.
  std::function<Status(int64_t memory_mb)> admit_;
  // A worker retires after this many calls (0: never). Calls forked from one warm interpreter
  // share its state that fork cannot renew, Python's hash secret above all (str hashes and
  // set order are the same in every call of a worker); retiring bounds what they share.
  int64_t max_calls_ = 0;
  friend class PoolSet;
};

// Every pool of a node, and the thread that maintains them.
class PoolSet {
 public:
  // `backend_of` gives the backend of a kind (null: the node does not serve it); fncall
  // workers are containers.
  PoolSet(std::function<backends::Backend*(backends::Kind)> backend_of, std::string node);
  ~PoolSet();
  // Creates the pool, or updates the limits of an existing one (a changed runtime, preload,
  // command, image or per-call limits replaces its workers).
  StatusOr<std::shared_ptr<Pool>> Put(const PoolConfig& cfg);
  std::shared_ptr<Pool> Get(const std::string& name) const;
  Status Remove(const std::string& name);
  // Removes the pools `drop` picks and destroys their sandboxes before it returns.
  void RemoveNow(const std::function<bool(const PoolConfig&)>& drop);
  std::vector<PoolStatus> List() const;
  // Waits (up to timeout_ms) until every pool has its min_idle workers or reported an error.
  void WaitWarm(int64_t timeout_ms) const;
  void Shutdown();
  // All pools' Usage() together.
  std::pair<int64_t, int64_t> Usage() const;
  // Idle workers and ready sandboxes given up, least recently used of each pool in turn,
  // until `count` sandboxes and `memory_mb` MiB are freed or none is idle; the caller destroys
  // them (Pool::YieldIdle).
  std::vector<std::shared_ptr<backends::Sandbox>> YieldIdle(int64_t count, int64_t memory_mb);
  // Every pool asks `admit` before it makes a worker or a ready sandbox: pools are part of the
  // node's admission (max_sandboxes, committed memory) like creates are. Set before serving.
  void SetAdmission(std::function<Status(int64_t memory_mb)> admit) { admit_ = std::move(admit); }
  // fncall workers retire after this many calls (0: never); set before serving.
  void SetWorkerMaxCalls(int64_t n) { max_calls_ = n; }

 private:
  void Loop();
  void Wake();

  std::function<backends::Backend*(backends::Kind)> backend_of_;
  std::string node_;
  mutable Mutex mu_;
  CondVar cv_;
  std::function<Status(int64_t)> admit_;  // set once before serving
  int64_t max_calls_ = 0;                 // set once before serving
  std::map<std::string, std::shared_ptr<Pool>> pools_ DSEC_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Pool>> removed_ DSEC_GUARDED_BY(mu_);  // to shut down
  bool stop_ DSEC_GUARDED_BY(mu_) = false;
  bool woken_ DSEC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dsec::pools
