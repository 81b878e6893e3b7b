#include "edge/manager.h"
#include "base/resources.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>

#include "api/network_json.h"
#include "base/clock.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"

namespace dsec::edge {

namespace {
// "2026-12-06T02:40:00Z" (UTC, to the second).
std::string UtcTime(int64_t ms) {
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

namespace {

constexpr int kCreateThreads = 4;  // for "count": setup work that can overlap
constexpr int kDestroyThreads = 8;

// Runs fn(i) for i in [0, n) on up to `threads` threads.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  if (n <= 1 || threads <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < std::min(n, threads); ++t)
    ts.emplace_back([&] {
      for (int i; (i = next++) < n;) fn(i);
    });
  for (auto& t : ts) t.join();
}

}  // namespace

// ttl_s 0 is no TTL: expires_at 0 (shown as null).
static int64_t ExpiresAt(int64_t now_ms, int64_t ttl_s) {
  return ttl_s > 0 ? now_ms + ttl_s * 1000 : 0;
}

// --- Manager -----------------------------------------------------------------------------

Manager::Manager(const EdgeConfig& cfg, std::vector<backends::Backend*> backends, StateStore* store,
                 Metrics* metrics)
    : cfg_(cfg), backends_(std::move(backends)), store_(store), metrics_(metrics) {
  const int64_t node_mb = NodeMemoryMb();
  reserve_memory_mb_ = ReserveMemoryMb(node_mb, cfg_.reserve_memory_mb);
  admit_memory_mb_ =
      static_cast<int64_t>(static_cast<double>(SandboxMemoryMb(node_mb, cfg_.reserve_memory_mb)) *
                           cfg_.memory_overcommit);
  MutexLock l(mu_);
  usage_gen_ = WallMs() * 1000;  // (above what an earlier edge of this node published)
}

Manager::~Manager() { Shutdown(cfg_.persist); }

std::vector<std::shared_ptr<SandboxEntry>> Manager::Snapshot() const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<SandboxEntry>> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e);
  return out;
}

size_t Manager::size() const {
  MutexLock l(mu_);
  return entries_.size();
}

void Manager::Attach(const std::shared_ptr<SandboxEntry>& e,
                     std::shared_ptr<backends::Sandbox> sb) {
  std::weak_ptr<SandboxEntry> weak = e;
  sb->SetStateListener([this, weak] {
    if (auto entry = weak.lock()) SyncPhase(entry);
  });
  {
    MutexLock l(e->mu_);
    e->sb_ = std::move(sb);
    if (e->phase_ == Phase::kCreating) e->phase_ = Phase::kRunning;
  }
  SyncPhase(e);  // whatever happened before the listener was there
}

void Manager::SyncPhase(const std::shared_ptr<SandboxEntry>& e) {
  bool failed = false;
  {
    MutexLock l(e->mu_);
    if (!e->sb_ || (e->phase_ != Phase::kRunning && e->phase_ != Phase::kPaused)) return;
    switch (e->sb_->state()) {
      case backends::SandboxState::kRunning:
        e->phase_ = Phase::kRunning;
        break;
      case backends::SandboxState::kPaused:
        e->phase_ = Phase::kPaused;
        break;
      case backends::SandboxState::kFailed:
        e->phase_ = Phase::kFailed;
        e->reason_ = e->sb_->reason();
        failed = true;
        break;
      default:  // creating, or destroyed by the manager itself
        break;
    }
  }
  // The reaper releases and destroys it (not here: this may run on an agent's I/O thread).
  if (failed) reaper_cv_.NotifyAll();
}

std::vector<std::string> Manager::Ids() const {
  MutexLock l(mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : entries_) out.push_back(id);
  return out;
}

SandboxRecord Manager::Record(const SandboxEntry& e) const {
  const CreateParams& p = e.params;
  SandboxRecord r;
  r.id = e.id;
  r.kind = p.kind;
  r.node = cfg_.node;
  r.image = p.image;
  r.last_used_at = e.last_used_at.load();
  r.limits = p.resources;
  r.user = p.user;
  r.workdir = p.workdir;
  r.pool = p.pool;
  r.project = p.project;
  MutexLock l(e.mu_);
  r.state = e.phase_;
  r.created_at = e.created_at_;
  r.expires_at = e.expires_at_;
  r.idle_ttl_s = e.idle_ttl_s_;
  r.ttl_s = e.ttl_s_;
  r.labels = e.labels_;
  r.network = e.network_;
  if (e.sb_) r.address = e.sb_->network_address();
  r.reason = e.reason_;
  if (r.reason.empty() && r.state == Phase::kFailed && e.sb_) r.reason = e.sb_->reason();
  return r;
}

Json Manager::StoredRecord(const SandboxEntry& e) const {
  MutexLock l(e.mu_);
  return {{"params", ToJson(e.params)},
          {"labels", ToJsonObject(e.labels_)},
          {"network", api::ToJson(e.network_)},
          {"created_at", e.created_at_},
          {"expires_at", e.expires_at_},
          {"idle_ttl_s", e.idle_ttl_s_},
          {"ttl_s", e.ttl_s_}};
}

Status Manager::Persist(const SandboxEntry& e) {
  Status s = store_->UpdateRecord(e.id, StoredRecord(e).dump());
  if (!s.ok()) DSEC_LOG_ERROR("state db update failed: sandbox={} error={}", e.id, s.ToString());
  return s;
}

StatusOr<std::vector<SandboxRecord>> Manager::Create(
    const CreateParams& p, int count, bool wait,
    const std::function<void(std::function<void()>)>& background) {
  std::vector<std::shared_ptr<SandboxEntry>> made;
  // What the entries keep: not a fork's saved machine (copied only for such a fork).
  std::optional<CreateParams> stripped;
  if (p.machine) {
    stripped = p;
    stripped->machine.reset();
  }
  const CreateParams& stored = stripped ? *stripped : p;
  // Ready sandboxes from the pool first; whatever it lacks is created fresh, alike.
  std::vector<std::shared_ptr<backends::Sandbox>> pooled;
  if (!p.pool.empty()) {
    auto pool = pools_ ? pools_->Get(p.pool) : nullptr;
    if (!pool) return NotFound("pool " + p.pool + " not found");
    while (static_cast<int>(pooled.size()) < count) {
      auto sb = pool->TakeSandbox();
      if (!sb) break;
      pooled.push_back(std::move(sb));
    }
  }
  auto unused = MakeScopeGuard([&] {
    for (auto& sb : pooled)
      if (sb) (void)sb->Destroy();
  });
  // A pooled sandbox gets the caller's network policy as it is taken (pools keep theirs none).
  if (p.network.mode != net::NetMode::kNone)
    for (auto& sb : pooled) DSEC_RETURN_IF_ERROR(sb->SetNetwork(p.network));
  // Fresh sandboxes beyond what the pool gave may need room that idle pool workers hold.
  const int fresh = count - static_cast<int>(pooled.size());
  bool reserved = fresh > 0 && MakeRoomFromPools(p, fresh);
  auto release = MakeScopeGuard([&] {
    if (!reserved) return;
    MutexLock l(mu_);
    ReleaseRoomLocked(p, fresh);
  });
  {
    MutexLock l(mu_);
    if (reserved) {  // admitted below, under the same lock: the room is this create's
      ReleaseRoomLocked(p, fresh);
      reserved = false;
    }
    // Checked under mu_: Shutdown's snapshot (also under mu_) then sees every entry made.
    if (shut_down_) return Unavailable("the edge is shutting down");
    DSEC_RETURN_IF_ERROR(Admit(p, count));
    int64_t now = clock_->NowMs();
    for (int i = 0; i < count; ++i) {
      std::string id = static_cast<size_t>(i) < pooled.size() ? pooled[static_cast<size_t>(i)]->id()
                                                              : NewSandboxId(cfg_.node);
      auto e = std::make_shared<SandboxEntry>(id, stored, clock_);
      {
        MutexLock el(e->mu_);  // not published yet
        e->machine_ = p.machine;
        e->labels_ = p.labels;
        e->created_at_ = now;
        e->expires_at_ = ExpiresAt(now, p.ttl_s);
        e->idle_ttl_s_ = p.idle_ttl_s;
        e->ttl_s_ = p.ttl_s;
      }
      e->last_used_at = now;
      entries_[e->id] = e;
      made.push_back(e);
    }
    memory_mb_ += p.resources.memory_mb * count;
    ++usage_gen_;
  }
  std::vector<StatusOr<SandboxRecord>> results(made.size(), InternalError("not run"));
  for (size_t i = 0; i < pooled.size(); ++i)
    results[i] = AttachPooled(made[i], std::move(pooled[i]));
  const size_t first_fresh = pooled.size();
  pooled.clear();
  if (!wait) {
    std::vector<SandboxRecord> out;
    for (size_t i = 0; i < made.size(); ++i) {
      auto e = made[i];
      out.push_back(i < first_fresh ? *results[i] : Record(*e));
      if (i >= first_fresh) background([this, e] { (void)CreateOne(e); });
    }
    return out;
  }
  ParallelFor(static_cast<int>(made.size() - first_fresh), kCreateThreads, [&](int i) {
    size_t k = first_fresh + static_cast<size_t>(i);
    results[k] = CreateOne(made[k]);
  });
  std::vector<SandboxRecord> out;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      // All or nothing: the ones that did start go again.
      for (size_t k = 0; k < made.size(); ++k)
        if (results[k].ok()) (void)Delete(made[k]->id, "create_failed");
      return results[i].status();
    }
    out.push_back(std::move(*results[i]));
  }
  return out;
}

namespace {

// What the backend makes (or re-adopts) for a sandbox created with p.
backends::SandboxSpec SpecFor(const std::string& id, const CreateParams& p,
                              const net::NetworkPolicy& network) {
  backends::SandboxSpec spec;
  static_cast<backends::SandboxShape&>(spec) = p;
  spec.network = network;
  spec.id = id;
  spec.machine = p.machine;
  return spec;
}

}  // namespace

StatusOr<SandboxRecord> Manager::CreateOne(const std::shared_ptr<SandboxEntry>& e) {
  // Counted before the deleted check: Shutdown marks every entry deleted, then waits for
  // this to reach zero, so no create can slip past it and outlive the backend.
  creates_in_flight_++;
  auto done = MakeScopeGuard([this] { creates_in_flight_--; });
  {
    MutexLock l(e->mu_);
    if (e->phase_ == Phase::kDeleted) {
      e->cv_.NotifyAll();
      return NotFound("sandbox " + e->id + " was deleted before it was created");
    }
  }
  Stopwatch sw;
  backends::Backend* backend = BackendFor(e->params.kind);
  CreateParams params = e->params;
  {
    MutexLock l(e->mu_);
    if (!e->start_image_.empty()) params.image = e->start_image_;
    params.machine = std::move(e->machine_);  // (leaves the entry's empty)
  }
  auto sb = backend ? backend->Create(SpecFor(e->id, params, e->params.network))
                    : StatusOr<std::shared_ptr<backends::Sandbox>>(Unimplemented(
                          "kind \"" + std::string(backends::KindName(e->params.kind)) +
                          "\" is not available on this node"));
  if (!sb.ok()) {
    {
      MutexLock l(e->mu_);
      e->create_error_ = sb.status().message();
    }
    // Nothing was made (the backend cleaned up): the id disappears as if never admitted.
    {
      MutexLock l(mu_);
      if (entries_.erase(e->id)) ReleaseMemoryLocked(*e);
    }
    MutexLock l(e->mu_);
    e->phase_ = Phase::kDeleted;
    e->cv_.NotifyAll();
    DSEC_LOG_WARN("create failed: sandbox={} error={}", e->id, sb.status().ToString());
    // The host ran out of something (fds, memory, disk): not the caller's fault, and worth
    // retrying later or elsewhere, so 503 with Retry-After rather than 422.
    if (sb.status().code() == StatusCode::kResourceExhausted)
      return Unavailable("node is out of resources: " + sb.status().message());
    return sb.status();
  }
  metrics_->ObserveCreate(sw.ElapsedMs() / 1000.0);
  metrics_->CountCreated();
  Attach(e, *sb);
  bool deleted = e->phase() == Phase::kDeleted;
  if (!deleted) {
    StoredSandbox row{e->id, StoredRecord(*e).dump(), (*sb)->AdoptionHandle()};
    if (Status s = store_->PutSandbox(row); !s.ok()) {
      // Not durable (a full state disk): a restarted edge would not know it and would clean it
      // up as an orphan while the caller relies on it. Undo the create instead.
      DSEC_LOG_ERROR("state db insert failed, destroying: sandbox={} error={}", e->id,
                     s.ToString());
      {
        MutexLock l(mu_);
        if (entries_.erase(e->id)) ReleaseMemoryLocked(*e);
      }
      {
        MutexLock l(e->mu_);
        e->phase_ = Phase::kDeleted;
        e->cv_.NotifyAll();
      }
      metrics_->CountDeleted("create_failed");
      Destroy(e);
      return Unavailable("the sandbox could not be recorded in the state db: " + s.message());
    }
  }
  {
    MutexLock l(e->mu_);
    e->cv_.NotifyAll();
  }
  if (deleted) {  // deleted while it was being made (wait=0): Delete left the teardown to us
    Destroy(e);
    return NotFound("sandbox " + e->id + " was deleted while it was created");
  }
  return Record(*e);
}

SandboxRecord Manager::AttachPooled(const std::shared_ptr<SandboxEntry>& e,
                                    std::shared_ptr<backends::Sandbox> sb) {
  metrics_->CountCreated();
  Attach(e, sb);
  {
    MutexLock l(e->mu_);
    e->cv_.NotifyAll();
  }
  StoredSandbox row{e->id, StoredRecord(*e).dump(), sb->AdoptionHandle()};
  if (Status s = store_->PutSandbox(row); !s.ok())
    DSEC_LOG_ERROR("state db insert failed: sandbox={} error={}", e->id, s.ToString());
  return Record(*e);
}

Status Manager::CheckProject(const std::string& id, const std::string& project) const {
  if (project.empty()) return OkStatus();
  MutexLock l(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (it->second->params.project != project) return NotFound("sandbox " + id + " not found");
    return OkStatus();
  }
  auto t = tombstones_.find(id);
  if (t != tombstones_.end() && t->second.project != project)
    return NotFound("sandbox " + id + " not found");
  return OkStatus();
}

bool Manager::Has(const std::string& id) const {
  MutexLock l(mu_);
  return entries_.count(id) > 0;
}

StatusOr<std::shared_ptr<SandboxEntry>> Manager::Get(const std::string& id) {
  MutexLock l(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    auto t = tombstones_.find(id);
    if (t == tombstones_.end() || WallMs() - t->second.at_ms > cfg_.tombstone_ttl_s * 1000)
      return NotFound("sandbox " + id + " not found");
    const Tombstone& ts = t->second;
    std::string why =
        ts.reason == "ttl"    ? "its ttl_s ran out"
        : ts.reason == "idle" ? "it was idle for its idle_ttl_s"
        : ts.reason == "job"  ? "its job was deleted"
        : ts.reason == "preempted"
            ? "its job was preempted (its trajectory, if it recorded one, can be resumed)"
        : ts.reason == "lost" ? "the edge restarted and could not re-adopt it"
                              : "it had failed";
    return Gone("sandbox " + id + " is gone: " + why +
                (ts.detail.empty() ? "" : " (" + ts.detail + ")") + ", at " + UtcTime(ts.at_ms));
  }
  it->second->Touch();
  return it->second;
}

std::optional<Tombstone> Manager::TombstoneOf(const std::string& id) const {
  MutexLock l(mu_);
  auto t = tombstones_.find(id);
  if (t == tombstones_.end() || WallMs() - t->second.at_ms > cfg_.tombstone_ttl_s * 1000)
    return std::nullopt;
  return t->second;
}

void Manager::AddTombstoneLocked(const std::string& id, Tombstone t) {
  if (cfg_.tombstone_max <= 0) return;
  const int64_t now = t.at_ms;
  if (tombstones_.insert_or_assign(id, std::move(t)).second) tombstone_order_.push_back(id);
  // Bounded by count and age, oldest first (an id is never reused: one entry per id).
  while (!tombstone_order_.empty() &&
         (static_cast<int64_t>(tombstone_order_.size()) > cfg_.tombstone_max ||
          now - tombstones_[tombstone_order_.front()].at_ms > cfg_.tombstone_ttl_s * 1000)) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

StatusOr<SandboxPage> Manager::List(const ListFilter& f) const {
  std::vector<std::pair<std::pair<int64_t, std::string>, std::shared_ptr<SandboxEntry>>> all;
  for (auto& e : Snapshot()) {
    MutexLock l(e->mu_);
    all.push_back({{e->created_at_, e->id}, e});
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::optional<std::pair<int64_t, std::string>> after;
  if (!f.cursor.empty()) {
    size_t dot = f.cursor.find('.');
    auto ts = dot == std::string::npos ? std::nullopt : ParseInt64(f.cursor.substr(0, dot));
    if (!ts) return InvalidArgument("bad cursor");
    after = std::make_pair(*ts, f.cursor.substr(dot + 1));
  }
  SandboxPage page;
  std::string last_key;
  bool more = false;
  for (const auto& [key, e] : all) {
    if (after && !(*after < key)) continue;
    if (f.kind && e->params.kind != *f.kind) continue;
    if (!f.project.empty() && e->params.project != f.project) continue;
    {
      MutexLock l(e->mu_);
      bool ok = true;
      for (const auto& [k, v] : f.labels) {
        auto it = e->labels_.find(k);
        ok = ok && it != e->labels_.end() && it->second == v;
      }
      if (!ok) continue;
    }
    if (f.state && e->phase() != *f.state) continue;
    if (page.sandboxes.size() == f.limit) {
      more = true;
      break;
    }
    page.sandboxes.push_back(Record(*e));
    last_key = std::to_string(key.first) + "." + key.second;
  }
  if (more) page.next_cursor = last_key;
  return page;
}

StatusOr<SandboxRecord> Manager::Patch(const std::string& id, const PatchParams& p) {
  DSEC_ASSIGN_OR_RETURN(auto e, Get(id));
  // Network changes of one sandbox apply in the order they are recorded.
  MutexLock nl(e->network_mu_);
  std::optional<net::NetworkPolicy> old_network;
  std::shared_ptr<backends::Sandbox> sb;
  if (p.network) {
    DSEC_ASSIGN_OR_RETURN(backends::KindCapabilities caps, Capabilities(e->params.kind));
    if (!caps.network && p.network->mode != net::NetMode::kNone)
      return backends::NoNetwork(e->params.kind, p.network->mode);
    // Waits while it is being created: the policy applies to the sandbox as made.
    DSEC_ASSIGN_OR_RETURN(sb, e->Sandbox(Op::kUpdate));
    {
      MutexLock l(e->mu_);
      old_network = e->network_;
    }
    if (*p.network != *old_network) DSEC_RETURN_IF_ERROR(sb->SetNetwork(*p.network));
    MutexLock l(e->mu_);
    e->network_ = *p.network;
  }
  std::map<std::string, std::string> old_labels;
  int64_t old_expires = 0, old_idle = 0, old_ttl = 0;
  {
    MutexLock l(e->mu_);
    DSEC_RETURN_IF_ERROR(CheckOp(Op::kUpdate, e->phase_, e->id));
    old_labels = e->labels_;
    old_expires = e->expires_at_;
    old_idle = e->idle_ttl_s_;
    old_ttl = e->ttl_s_;
    // Validate on a copy: a refused patch changes nothing.
    auto labels = e->labels_;
    for (const auto& [k, v] : p.labels) {
      if (v) {
        labels[k] = *v;
      } else {
        labels.erase(k);
      }
    }
    if (labels.size() > 64) return InvalidArgument("a sandbox has at most 64 labels");
    e->labels_ = std::move(labels);
    if (p.ttl_s) {
      e->expires_at_ = ExpiresAt(clock_->NowMs(), *p.ttl_s);
      e->ttl_s_ = *p.ttl_s;
    }
    if (p.idle_ttl_s) e->idle_ttl_s_ = *p.idle_ttl_s;
  }
  // A network change changes the adoption handle too (a veth and an address made or gone): the
  // next edge must readopt exactly what the sandbox has, or its address could be given twice.
  const bool network_changed = old_network && *p.network != *old_network;
  Status persisted =
      network_changed ? store_->PutSandbox({e->id, StoredRecord(*e).dump(), sb->AdoptionHandle()})
                      : Persist(*e);
  if (Status s = persisted; !s.ok()) {
    // Not durable: a restart would bring the old values back. Refuse it instead.
    MutexLock l(e->mu_);
    e->labels_ = std::move(old_labels);
    e->expires_at_ = old_expires;
    e->idle_ttl_s_ = old_idle;
    e->ttl_s_ = old_ttl;
    if (old_network) {
      e->network_ = *old_network;
      if (*p.network != *old_network) (void)sb->SetNetwork(*old_network);
    }
    return Unavailable("the change could not be recorded in the state db: " + s.message());
  }
  return Record(*e);
}

void Manager::Destroy(const std::shared_ptr<SandboxEntry>& e) {
  std::shared_ptr<backends::Sandbox> sb;
  {
    MutexLock l(e->mu_);
    sb = e->sb_;
  }
  if (sb) {
    if (Status s = sb->Destroy(); !s.ok())
      DSEC_LOG_ERROR("destroy incomplete: sandbox={} error={}", e->id, s.ToString());
  }
}

Status Manager::Delete(const std::string& id, const std::string& reason) {
  std::shared_ptr<SandboxEntry> e;
  {
    MutexLock l(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return NotFound("sandbox " + id + " not found");
    e = it->second;
    entries_.erase(it);
    ReleaseMemoryLocked(*e);
  }
  bool creating;
  std::string failed;  // why, when it had failed
  {
    MutexLock l(e->mu_);
    creating = e->phase_ == Phase::kCreating;
    if (e->phase_ == Phase::kFailed) failed = e->reason_.empty() ? "failed" : e->reason_;
    e->phase_ = Phase::kDeleted;
    e->cv_.NotifyAll();
  }
  // What the node removed by itself leaves a tombstone (410 gone); an explicit delete does
  // not (404, as for an id that never was: a retried delete is done).
  if (reason == "ttl" || reason == "idle" || reason == "job" || reason == "preempted") {
    MutexLock l(mu_);
    AddTombstoneLocked(id, {.reason = reason,
                            .detail = failed.empty() ? "" : "it had failed: " + failed,
                            .at_ms = WallMs(),
                            .project = e->params.project});
  }
  if (Status s = store_->DeleteSandbox(id); !s.ok())
    DSEC_LOG_ERROR("state db delete failed: sandbox={} error={}", id, s.ToString());
  metrics_->CountDeleted(reason);
  if (creating) return OkStatus();  // CreateOne sees it deleted and tears down when it is done
  Destroy(e);
  return OkStatus();
}

StatusOr<SandboxRecord> Manager::Pause(const std::string& id) {
  DSEC_ASSIGN_OR_RETURN(auto e, Get(id));
  DSEC_ASSIGN_OR_RETURN(auto sb, e->Sandbox(Op::kPause));
  DSEC_RETURN_IF_ERROR(sb->Pause());
  return Record(*e);
}

StatusOr<SandboxRecord> Manager::Resume(const std::string& id) {
  DSEC_ASSIGN_OR_RETURN(auto e, Get(id));
  DSEC_ASSIGN_OR_RETURN(auto sb, e->Sandbox(Op::kResume));
  DSEC_RETURN_IF_ERROR(sb->Resume());
  return Record(*e);
}

StatusOr<int> Manager::JobAction(const std::string& job, JobOp op, const std::string& project) {
  std::vector<std::string> ids;
  for (auto& e : Snapshot()) {
    if (!project.empty() && e->params.project != project) continue;
    MutexLock l(e->mu_);
    auto it = e->labels_.find("job");
    if (it != e->labels_.end() && it->second == job) ids.push_back(e->id);
  }
  std::atomic<int> affected{0};
  ParallelFor(static_cast<int>(ids.size()), op == JobOp::kDelete ? kDestroyThreads : 1, [&](int i) {
    const std::string& id = ids[static_cast<size_t>(i)];
    bool ok = op == JobOp::kPause    ? Pause(id).ok()
              : op == JobOp::kResume ? Resume(id).ok()
                                     : Delete(id, "job").ok();
    if (ok) affected++;
  });
  return affected.load();
}

void Manager::ReleaseMemoryLocked(SandboxEntry& e) {
  if (!e.memory_counted) return;  // a failed sandbox released it already
  e.memory_counted = false;
  memory_mb_ -= e.params.resources.memory_mb;
  ++usage_gen_;
}

cluster::NodeUsage Manager::Usage() const {
  cluster::NodeUsage u;
  std::map<std::tuple<std::string, std::string, std::string>, cluster::UsageEntry> by;
  MutexLock l(mu_);
  u.gen = usage_gen_;
  for (const auto& [id, e] : entries_) {
    if (!e->memory_counted) continue;  // failed: it holds nothing
    const CreateParams& p = e->params;
    cluster::UsageEntry& x = by[{p.project, p.owner, p.quota_hold}];
    x.sandboxes++;
    x.memory_mb += p.resources.memory_mb;
    x.cpu_milli += CpuMilli(p.resources.cpu);
  }
  for (auto& [k, x] : by) {
    std::tie(x.project, x.owner, x.hold) = k;
    u.entries.push_back(std::move(x));
  }
  return u;
}

int64_t Manager::usage_gen() const {
  MutexLock l(mu_);
  return usage_gen_;
}

void Manager::FinishFailure(const std::shared_ptr<SandboxEntry>& e) {
  std::string reason;
  {
    MutexLock l(e->mu_);
    if (e->phase_ != Phase::kFailed || e->failure_handled_) return;
    e->failure_handled_ = true;
    reason = e->reason_;
  }
  {
    // A failed sandbox holds nothing any more: it no longer counts against node memory.
    MutexLock l(mu_);
    if (entries_.count(e->id)) ReleaseMemoryLocked(*e);
  }
  DSEC_LOG_WARN("sandbox failed: sandbox={} reason={}", e->id, reason);
  metrics_->CountError("sandbox_failed");
  Destroy(e);
  Json rec = StoredRecord(*e);
  rec["failed"] = reason;
  (void)store_->UpdateRecord(e->id, rec.dump());
}

void Manager::ReapOnce() {
  int64_t now = clock_->NowMs();
  for (auto& e : Snapshot()) {
    std::string why;
    std::shared_ptr<backends::Sandbox> sb;
    {
      MutexLock l(e->mu_);
      // (A sandbox made later, by its trajectory's first live call, expires as any other.)
      if (e->phase_ == Phase::kCreating && !e->deferred) continue;
      sb = e->sb_;
      if (e->expires_at_ > 0 && now >= e->expires_at_) {
        why = "ttl";
      } else if (e->idle_ttl_s_ > 0 && e->active_execs.load() == 0 &&
                 now - e->last_used_at.load() >= e->idle_ttl_s_ * 1000) {
        why = "idle";
      }
    }
    if (!why.empty()) {
      DSEC_LOG_INFO("reaping sandbox: sandbox={} reason={}", e->id, why);
      (void)Delete(e->id, why);
      continue;
    }
    SyncPhase(e);  // (the listener does this at once; this is for anything it missed)
    FinishFailure(e);
  }
}

void Manager::StartReaper() {
  reaper_ = std::thread([this] {
    MutexLock l(reaper_mu_);
    int64_t last_prune = 0;
    (void)last_prune;
    while (!stopping_) {
      reaper_cv_.WaitFor(l, std::chrono::milliseconds(cfg_.reap_interval_ms));
      if (stopping_) break;
      l.Unlock();
      ReapOnce();
      l.Lock();
    }
  });
}

StatusOr<std::pair<int, int>> Manager::Recover() {
  DSEC_ASSIGN_OR_RETURN(std::vector<StoredSandbox> rows, store_->ListSandboxes());
  int adopted = 0;
  for (const auto& row : rows) {
    auto rec = ParseJson(row.record);
    StatusOr<CreateParams> p = rec.ok() ? CreateParamsFromJson(rec->value("params", Json::object()))
                                        : StatusOr<CreateParams>(rec.status());
    Status result = p.status();
    if (result.ok() && rec->contains("failed"))
      result = FailedPrecondition("it had failed: " + rec->value("failed", ""));
    std::shared_ptr<backends::Sandbox> sb;
    backends::Backend* backend = result.ok() ? BackendFor(p->kind) : nullptr;
    if (result.ok() && !backend)
      result = Unimplemented("this edge does not serve kind " +
                             std::string(backends::KindName(p->kind)));
    // The policy as last changed (PATCH), not as created.
    net::NetworkPolicy network = result.ok() ? p->network : net::NetworkPolicy();
    if (result.ok() && rec->contains("network")) {
      auto n = api::NetworkPolicyFromJson(&(*rec)["network"]);
      if (n.ok())
        network = *n;
      else
        result = n.status();
    }
    if (result.ok()) {
      auto a = backend->Adopt(SpecFor(row.id, *p, network), row.handle);
      result = a.status();
      if (a.ok()) sb = *a;
    }
    if (!result.ok()) {
      DSEC_LOG_WARN("could not re-adopt, cleaning up: sandbox={} error={}", row.id,
                    result.ToString());
      (void)store_->DeleteSandbox(row.id);
      {
        MutexLock l(mu_);
        AddTombstoneLocked(row.id, {.reason = "lost",
                                    .detail = result.message(),
                                    .at_ms = WallMs(),
                                    .project = p.ok() ? p->project : std::string()});
      }
      continue;
    }
    auto e = std::make_shared<SandboxEntry>(row.id, *p, clock_);
    Attach(e, sb);
    int64_t now = clock_->NowMs();
    {
      MutexLock el(e->mu_);  // not published yet
      e->labels_ = GetStringMap(*rec, "labels").value_or(p->labels);
      e->network_ = network;
      e->created_at_ = rec->value("created_at", now);
      e->expires_at_ = rec->value("expires_at", ExpiresAt(now, p->ttl_s));
      e->idle_ttl_s_ = rec->value("idle_ttl_s", p->idle_ttl_s);
      e->ttl_s_ = rec->value("ttl_s", p->ttl_s);
    }
    e->last_used_at = now;
    MutexLock l(mu_);
    entries_[e->id] = e;
    memory_mb_ += p->resources.memory_mb;
    ++usage_gen_;
    ++adopted;
  }
  int cleaned = 0;
  for (backends::Backend* b : backends_) {
    DSEC_ASSIGN_OR_RETURN(int n, b->CleanupOrphans());
    cleaned += n;
  }
  return std::make_pair(adopted, cleaned);
}

void Manager::Shutdown(bool persist) {
  if (shut_down_.exchange(true)) return;
  {
    MutexLock l(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.NotifyAll();
  if (reaper_.joinable()) reaper_.join();
  std::vector<std::shared_ptr<SandboxEntry>> all = Snapshot();
  if (persist) {
    for (auto& e : all) {
      // Wait out creates in flight so nothing is half-made when we go.
      (void)e->Sandbox(Op::kUse, 60000);
      MutexLock l(e->mu_);
      if (e->sb_) e->sb_->Detach();
    }
    DSEC_LOG_INFO("left {} sandboxes running for the next edge (--persist)", all.size());
    return;
  }
  ParallelFor(static_cast<int>(all.size()), kDestroyThreads,
              [&](int i) { (void)Delete(all[static_cast<size_t>(i)]->id, "shutdown"); });
  // Creates that were in flight finish and tear down by themselves (they see them deleted).
  for (int i = 0; creates_in_flight_ > 0 && i < 12000; ++i) usleep(10000);
  DSEC_LOG_INFO("destroyed {} sandboxes", all.size());
}

backends::Backend* Manager::BackendFor(backends::Kind kind) const {
  for (backends::Backend* b : backends_)
    if (b->kind() == kind) return b;
  return nullptr;
}

std::vector<backends::Kind> Manager::Kinds() const {
  std::vector<backends::Kind> out;
  for (backends::Backend* b : backends_) out.push_back(b->kind());
  return out;
}

NodeReport Manager::NodeInfo() const {
  NodeReport r;
  r.node = cfg_.node;
  r.max_sandboxes = cfg_.max_sandboxes;
  r.memory_mb = NodeMemoryMb();
  r.overcommit = cfg_.memory_overcommit;
  r.admit_memory_mb = admit_memory_mb_;
  r.reserve_memory_mb = reserve_memory_mb_;
  r.files = files_;
  r.budget = budget_;
  for (auto& e : Snapshot()) {
    r.by_state[e->phase()]++;
    r.sandboxes++;
  }
  MutexLock l(mu_);
  r.used_memory_mb = memory_mb_;
  return r;
}

Metrics::Gauges Manager::Gauges() const {
  Metrics::Gauges g;
  for (backends::Kind k : Kinds())
    for (const char* s : {"creating", "running", "paused", "failed"})
      g[{s, std::string(backends::KindName(k))}] = 0;
  for (auto& e : Snapshot())
    g[{std::string(PhaseName(e->phase())), std::string(backends::KindName(e->params.kind))}]++;
  return g;
}

}  // namespace dsec::edge
