// The edge's sandbox manager: every sandbox on the node, from admission to deletion.
// Owns admission (max count, memory overcommit), the records the API shows (labels, TTLs,
// state, failure reason), their persistence in the state DB (with the backend's adoption
// handle), TTL and idle reaping, failure detection, re-adoption after a restart, and
// shutdown (destroy all, or detach all with --persist).
//
// Thread safety: all public methods are thread-safe. Create, Delete, Recover and Shutdown
// block (sandbox setup and teardown) and must run on worker threads, not I/O threads.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "api/records.h"
#include "api/sandboxes_json.h"
#include "backends/pools/pool.h"
#include "backends/sandbox.h"
#include "base/clock.h"
#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "cluster/node_record.h"
#include "edge/config.h"
#include "edge/lifecycle.h"
#include "edge/metrics.h"
#include "edge/node_budget.h"
#include "edge/output_budget.h"
#include "edge/state_store.h"
#include "net/policy.h"

namespace dsec::edge {

using api::NodeReport;
using api::SandboxPage;
using api::SandboxRecord;

// What a caller asked for (validated by the API layer; defaults filled in).
// The shape's network is the one at create; the live one is SandboxEntry::network_.
struct CreateParams : backends::SandboxShape {
  int64_t ttl_s = 3600;
  int64_t idle_ttl_s = 0;
  std::map<std::string, std::string> labels;
  std::string pool;  // a container pool to take a ready sandbox from (else a fresh create)
  // A fork's image is the layer digests it was made of, which carry no config: this names the
  // image (stack) whose config it got, for a snapshot of it to carry that config.
  std::string config_from;
  // The project it belongs to (a cluster's apiserver names it in Dsec-Project; "default" on a
  // lone edge): a call naming another project finds no such sandbox.
  std::string project = "default";
  // Who made it, for a cluster's quotas: the apiserver's caller's token name (Dsec-Owner), and
  // the quota hold it was admitted from (Dsec-Quota); both "" on a lone edge.
  std::string owner;
  std::string quota_hold;
  // A fork that carries memory: the running machine it starts as (not stored: a sandbox made
  // from it is adopted, never made again, after a restart).
  std::shared_ptr<const backends::MachineState> machine;
};
Json ToJson(const CreateParams& p);
StatusOr<CreateParams> CreateParamsFromJson(const Json& j);

class SandboxEntry {
 public:
  SandboxEntry(std::string id, CreateParams p, const Clock* clock = Clock::System())
      : id(std::move(id)), params(std::move(p)), clock_(clock), network_(params.network) {}

  const std::string id;
  const CreateParams params;  // labels below are the live copy
  std::atomic<int64_t> last_used_at{0};
  std::atomic<int> active_execs{0};
  // Its memory_mb counts against the node (guarded by the Manager's mutex); released once.
  bool memory_counted = true;
  // Made later, by a trajectory's first live call (edge/trajectory.h): until then it stays
  // "creating", its TTLs apply, and whatever needs it is refused at once rather than waiting.
  std::atomic<bool> deferred{false};

  // Records an API call (idle TTL counts time without any).
  void Touch();
  // The backend sandbox, for `op` (lifecycle.h: 409 when it failed, 404 once deleted). Waits
  // (up to timeout) while it is being created.
  StatusOr<std::shared_ptr<backends::Sandbox>> Sandbox(Op op = Op::kUse,
                                                       int64_t timeout_ms = 120000);
  Phase phase() const;
  int64_t created_at() const;
  // The image (stack) a sandbox still to be made starts from instead of params.image: a
  // trajectory's checkpoint (edge/trajectory.h).
  void SetStartImage(std::string image);

 private:
  friend class Manager;
  const Clock* clock_;
  Mutex network_mu_;  // serializes network changes (Patch); taken before mu_
  mutable Mutex mu_;
  CondVar cv_;
  Phase phase_ DSEC_GUARDED_BY(mu_) = Phase::kCreating;  // the one state
  bool failure_handled_ DSEC_GUARDED_BY(mu_) = false;    // released, destroyed
  std::shared_ptr<backends::Sandbox> sb_ DSEC_GUARDED_BY(mu_);
  std::string reason_ DSEC_GUARDED_BY(mu_);
  std::string create_error_ DSEC_GUARDED_BY(mu_);
  std::string start_image_ DSEC_GUARDED_BY(mu_);
  // A fork with memory's saved machine (CreateParams::machine), until its create takes it:
  // held no longer than that (params keeps none).
  std::shared_ptr<const backends::MachineState> machine_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, std::string> labels_ DSEC_GUARDED_BY(mu_);
  net::NetworkPolicy network_ DSEC_GUARDED_BY(mu_);  // the live policy (PATCH changes it)
  int64_t created_at_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t expires_at_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t idle_ttl_s_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t ttl_s_ DSEC_GUARDED_BY(mu_) = 0;  // as last set (create, or PATCH ttl_s)
};

struct ListFilter {
  std::string project;                                      // "": any
  std::vector<std::pair<std::string, std::string>> labels;  // all must match
  std::optional<Phase> state;
  std::optional<backends::Kind> kind;
  size_t limit = 100;
  std::string cursor;
};

// What a job action (POST /v1/jobs/{job}/...) does to each sandbox labelled job=<job>.
enum class JobOp { kPause, kResume, kDelete };

// What a sandbox the node removed by itself left behind (Manager::TombstoneOf): why it went —
// "ttl", "idle", "failed" (it had failed: `detail` says how), "job" (its job was deleted),
// "lost" (an edge restart could not re-adopt it), "preempted" (its job was preempted) — and when
// (ms since the epoch).
struct Tombstone {
  std::string reason;
  std::string detail;
  int64_t at_ms = 0;
  std::string project;
};

// What a PATCH changes (api/sandboxes_json.h parses it).
using PatchParams = api::SandboxPatch;

class Manager {
 public:
  // One backend per kind the node serves (a container backend, and a microVM one when the
  // node can run them).
  Manager(const EdgeConfig& cfg, std::vector<backends::Backend*> backends, StateStore* store,
          Metrics* metrics);
  ~Manager();

  // Re-adopts the sandboxes in the state DB, then removes whatever a previous edge left that
  // nobody could adopt. Returns {adopted, cleaned}.
  StatusOr<std::pair<int, int>> Recover();
  void StartReaper();
  // Container pools that creates with CreateParams::pool take sandboxes from.
  void SetPools(pools::PoolSet* pools) { pools_ = pools; }
  // Node-wide kernel budgets (set once at start, before serving).
  void SetNodeBudget(const NodeBudget& b) { budget_ = b; }
  void SetFileBudget(const FileBudget& b) { files_ = b; }
  // The clock TTLs and idle times are measured with (tests move a FakeClock; set before use).
  void SetClock(const Clock* clock) { clock_ = clock; }
  // The admission of one more pool worker or ready pooled sandbox (PoolSet::SetAdmission).
  Status AdmitPoolSandbox(int64_t memory_mb);

  // Admission, then creation. With wait=false the records come back "creating" and creation
  // continues on `background` (which must run the task on a worker thread).
  StatusOr<std::vector<SandboxRecord>> Create(
      const CreateParams& p, int count, bool wait,
      const std::function<void(std::function<void()>)>& background);
  // NotFound for unknown ids, Gone for ids the node removed by itself lately (a tombstone);
  // Touches the entry.
  StatusOr<std::shared_ptr<SandboxEntry>> Get(const std::string& id);
  // Whether `id` is a sandbox here now (without touching it).
  bool Has(const std::string& id) const;
  // NotFound (the same words as for an unknown id) when `id` is a sandbox, or a tombstone, of
  // another project than `project`; OK otherwise, unknown ids too (the call then says so).
  Status CheckProject(const std::string& id, const std::string& project) const;
  // What the sandboxes take, by (project, owner, quota hold), for the cluster's quotas; its
  // generation grows with every change (usage_gen).
  cluster::NodeUsage Usage() const;
  int64_t usage_gen() const;
  // The tombstone of a sandbox the node removed by itself (not by an explicit delete), kept
  // for tombstone_ttl_s and at most tombstone_max of them (the oldest go first).
  std::optional<Tombstone> TombstoneOf(const std::string& id) const;
  SandboxRecord Record(const SandboxEntry& e) const;
  StatusOr<SandboxPage> List(const ListFilter& f) const;
  StatusOr<SandboxRecord> Patch(const std::string& id, const PatchParams& p);
  // What sandboxes of `kind` can do on this node (Backend::Capabilities); NotFound-like
  // Unimplemented when the node does not serve the kind.
  StatusOr<backends::KindCapabilities> Capabilities(backends::Kind kind) const;
  Status Delete(const std::string& id, const std::string& reason = "api");
  StatusOr<SandboxRecord> Pause(const std::string& id);
  StatusOr<SandboxRecord> Resume(const std::string& id);
  // `op` on every sandbox labelled job=<job>; returns how many it succeeded on.
  // `project`: only its sandboxes ("": any).
  StatusOr<int> JobAction(const std::string& job, JobOp op, const std::string& project = "");

  NodeReport NodeInfo() const;
  // The kinds of sandbox this node makes.
  std::vector<backends::Kind> Kinds() const;
  Metrics::Gauges Gauges() const;
  size_t size() const;
  std::vector<std::string> Ids() const;

  // Expired, idle and failed sandboxes (the reaper calls this every reap_interval_ms).
  void ReapOnce();
  // Destroys every sandbox (or, with persist, detaches them for the next edge) and stops the
  // reaper. Safe to call twice.
  void Shutdown(bool persist);

 private:
  // 422 for a create that no amount of waiting lets this node take (429 is for "full now").
  Status FitsEver(const CreateParams& p, int count) const;
  Status Admit(const CreateParams& p, int count) DSEC_REQUIRES(mu_);
  Status AdmitLocked(int64_t count, int64_t memory_mb, bool pool_included) DSEC_REQUIRES(mu_);
  // Idle pool workers give way to an explicit create: when they are what keeps it from fitting
  // max_sandboxes (or the open-file budget, or committed memory), the least recently used are
  // destroyed first, and the room is reserved for the create (the pools' refills see it taken)
  // until it is admitted. Returns whether a reservation is held (ReleaseRoomLocked).
  bool MakeRoomFromPools(const CreateParams& p, int count);
  void ReleaseRoomLocked(const CreateParams& p, int count) DSEC_REQUIRES(mu_);
  StatusOr<SandboxRecord> CreateOne(const std::shared_ptr<SandboxEntry>& e);
  // An entry whose sandbox came ready-made from a pool.
  SandboxRecord AttachPooled(const std::shared_ptr<SandboxEntry>& e,
                             std::shared_ptr<backends::Sandbox> sb);
  Status Persist(const SandboxEntry& e);
  Json StoredRecord(const SandboxEntry& e) const;
  // The entry's sandbox is ready (made, adopted or taken from a pool): running or paused as
  // the sandbox is, and following its changes from now on (SyncPhase).
  void Attach(const std::shared_ptr<SandboxEntry>& e, std::shared_ptr<backends::Sandbox> sb);
  // Takes the backend sandbox's running/paused/failed into the entry's phase (its state
  // listener; any thread, does not block). A failure is finished by the reaper (FinishFailure).
  void SyncPhase(const std::shared_ptr<SandboxEntry>& e);
  // Once per failed entry: its memory no longer counts, its sandbox goes, the db says why.
  void FinishFailure(const std::shared_ptr<SandboxEntry>& e);
  void ReleaseMemoryLocked(SandboxEntry& e) DSEC_REQUIRES(mu_);
  void AddTombstoneLocked(const std::string& id, Tombstone t) DSEC_REQUIRES(mu_);
  void Destroy(const std::shared_ptr<SandboxEntry>& e);
  std::vector<std::shared_ptr<SandboxEntry>> Snapshot() const;

  EdgeConfig cfg_;
  const Clock* clock_ = Clock::System();
  // The backend of `kind`; null when this node does not serve it.
  backends::Backend* BackendFor(backends::Kind kind) const;
  std::vector<backends::Backend*> backends_;
  pools::PoolSet* pools_ = nullptr;
  StateStore* store_;
  Metrics* metrics_;
  int64_t admit_memory_mb_ = 0;
  int64_t reserve_memory_mb_ = 0;
  NodeBudget budget_;
  FileBudget files_;

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<SandboxEntry>> entries_ DSEC_GUARDED_BY(mu_);
  int64_t memory_mb_ DSEC_GUARDED_BY(mu_) = 0;
  // Room that pools gave up for creates not yet admitted (MakeRoomFromPools).
  int64_t reserved_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t reserved_mb_ DSEC_GUARDED_BY(mu_) = 0;
  // Bumped (under mu_) whenever what Usage() counts changes; starts from the wall clock in
  // microseconds, so a restarted edge goes on above what it published before.
  int64_t usage_gen_ DSEC_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, Tombstone> tombstones_ DSEC_GUARDED_BY(mu_);
  std::deque<std::string> tombstone_order_ DSEC_GUARDED_BY(mu_);  // oldest first

  Mutex reaper_mu_;
  CondVar reaper_cv_;
  bool stopping_ DSEC_GUARDED_BY(reaper_mu_) = false;
  std::thread reaper_;
  std::atomic<int> creates_in_flight_{0};
  std::atomic<bool> shut_down_{false};
};

// Node memory in MiB (MemTotal).
int64_t NodeMemoryMb();
// What the edge keeps out of the sandboxes' parent cgroup: reserve_memory_mb, or when it is
// negative (the default) max(1 GiB, 10% of the node).
int64_t ReserveMemoryMb(int64_t node_mb, int64_t configured);
// The memory all sandboxes together may use (their parent cgroup's limit): the node's less the
// reserve, at least 256 MiB. Admission is this times memory_overcommit.
int64_t SandboxMemoryMb(int64_t node_mb, int64_t configured_reserve);

}  // namespace dsec::edge
