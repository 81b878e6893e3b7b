#include "backends/pools/pool.h"

#include <signal.h>

#include <algorithm>
#include <cmath>

#include "base/clock.h"
#include "base/enum_names.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "protocol/frame.h"

namespace dsec::pools {

using backends::ExecOutput;
using backends::Sandbox;

namespace {

constexpr int64_t kWorkerDiskMb = 16;     // the worker's own writable layer (calls get theirs)
constexpr int64_t kBaselineSlackMb = 16;  // on top of what a fresh worker uses
constexpr int64_t kIdleRecheckMs = 500;
constexpr int64_t kQueueRecheckMs = 20;
constexpr int64_t kFailureBackoffMs = 1000;

// Collects a call's output; the agent already caps each stream at max_output_bytes.
class Collect : public backends::ExecObserver {
 public:
  // started: the agent had begun the call (else an error means it never ran).
  using Done = std::function<void(StatusOr<ExecOutput>, bool started)>;
  Collect(uint64_t cap, Done done) : cap_(cap), done_(std::move(done)) {}
  void OnStart(int) override { started_ = true; }
  void OnOutput(uint8_t stream, std::string_view data) override {
    std::string& b = stream == protocol::kStderr ? out_.stderr_data : out_.stdout_data;
    if (b.size() < cap_) b.append(data.substr(0, cap_ - b.size()));
  }
  void OnExit(const StatusOr<backends::ExecResult>& r) override {
    if (!r.ok()) return done_(r.status(), started_);
    out_.result = *r;
    done_(std::move(out_), true);
  }

 private:
  uint64_t cap_;
  Done done_;
  ExecOutput out_;
  bool started_ = false;
};

}  // namespace

namespace {
constexpr EnumName<PoolKind> kPoolKinds[] = {{PoolKind::kFncall, "fncall"},
                                             {PoolKind::kContainer, "container"},
                                             {PoolKind::kMicrovm, "microvm"}};
}  // namespace

std::string_view PoolKindName(PoolKind k) { return NameIn(kPoolKinds, k); }

std::optional<PoolKind> PoolKindFromName(std::string_view name) {
  return ValueIn(kPoolKinds, name);
}

// --- Pool ---

Pool::Pool(PoolConfig cfg, backends::Backend* backend, std::string node)
    : cfg_(std::move(cfg)), backend_(backend), node_(std::move(node)) {
  MutexLock l(mu_);
  last_asked_ms_ = MonotonicMs();
}

bool Pool::Expired(int64_t now_ms) const {
  MutexLock l(mu_);
  return cfg_.expire_unused_s > 0 && now_ms - last_asked_ms_ > cfg_.expire_unused_s * 1000;
}

void Pool::Submit(CallRequest req, CallDone done) {
  Queued q{std::move(req), std::move(done), MonotonicUs()};
  std::shared_ptr<Worker> w;
  MutexLock l(mu_);
  if (stopped_) {
    l.Unlock();
    return q.done(Unavailable("pool " + cfg_.name + " is shut down"));
  }
  if (cfg_.kind != PoolKind::kFncall) {
    l.Unlock();
    return q.done(InvalidArgument("pool " + cfg_.name + " is a container pool, not a runtime"));
  }
  if (!idle_.empty() && queue_.empty()) {
    calls_++;
    w = idle_.front();
    idle_.pop_front();
    idle_low_ = std::min(idle_low_, static_cast<int>(idle_.size()));
    busy_[w->sb.get()] = w;
    l.Unlock();
    return Start(std::move(w), std::move(q));
  }
  // Calls a new worker will take do not count against the queue bound.
  int growth = std::max(0, cfg_.max - static_cast<int>(idle_.size() + busy_.size()) - starting_);
  if (static_cast<int>(queue_.size()) >= cfg_.max_queue + growth) {
    rejected_++;
    size_t n = queue_.size();
    l.Unlock();
    return q.done(OverCapacity("pool " + cfg_.name + " is full: " + std::to_string(n) +
                               " calls already wait for a worker"));
  }
  calls_++;
  queue_.push_back(std::move(q));
  l.Unlock();
  if (wake_) wake_();
}

void Pool::Start(std::shared_ptr<Worker> w, Queued q) {
  int64_t want = q.req.memory_mb > 0 ? q.req.memory_mb : cfg_.resources.memory_mb;
  if (want != w->limit_mb) {
    Status s = w->sb->SetMemoryLimit((want + w->baseline_mb) << 20);
    if (!s.ok()) {
      // A cut below what the worker still holds: the previous call's memory is freed while
      // its processes finish dying (its result came first). The worker rests until the next
      // maintenance pass and the call goes first in line; a worker that keeps refusing goes.
      MutexLock l(mu_);
      busy_.erase(w->sb.get());
      if (++w->limit_failures > 3) {
        last_error_ = "set call memory limit: " + s.message();
        Retire(w);
      } else {
        w->rest_until_ms = MonotonicMs() + 10 * w->limit_failures;
        resting_.push_back(w);
      }
      queue_.push_front(std::move(q));
      if (wake_) wake_();
      return;
    }
    w->limit_failures = 0;
    w->limit_mb = want;
  }
  backends::ExecRequest r;
  r.fncall = q.req.call;
  r.stdin_data = q.req.stdin_data;
  r.timeout_ms = q.req.timeout_ms;
  r.max_output_bytes = q.req.max_output_bytes;
  double queue_ms = static_cast<double>(MonotonicUs() - q.enqueued_us) / 1000.0;
  auto self = shared_from_this();
  auto shared_q = std::make_shared<Queued>(std::move(q));
  auto obs = std::make_shared<Collect>(
      r.max_output_bytes, [self, w, shared_q, queue_ms](StatusOr<ExecOutput> out, bool started) {
        self->Finished(w, std::move(*shared_q), std::move(out), queue_ms, started);
      });
  auto h = w->sb->StartExec(r, obs);
  if (h.ok()) return;
  if (h.status().code() == StatusCode::kInvalidArgument ||
      h.status().code() == StatusCode::kTooLarge) {  // the caller's request, not the worker
    {
      MutexLock l(mu_);
      busy_.erase(w->sb.get());
      idle_.push_back(w);
    }
    return shared_q->done(h.status());
  }
  // The worker is gone or its zygote died: the call never started; it goes first in line.
  MutexLock l(mu_);
  last_error_ = "worker " + w->sb->id() + ": " + h.status().message();
  busy_.erase(w->sb.get());
  Retire(w);
  queue_.push_front(std::move(*shared_q));
  if (wake_) wake_();
}

void Pool::Finished(std::shared_ptr<Worker> w, Queued q, StatusOr<ExecOutput> out, double queue_ms,
                    bool started) {
  // Nothing the call printed or how it ended decides (the code could fake either): a worker
  // whose zygote died fails the next StartExec, which retires it and requeues that call.
  bool healthy = out.ok() && w->sb->state() == backends::SandboxState::kRunning;
  bool worn = started && max_calls_ > 0 && ++w->calls >= max_calls_;
  std::vector<std::pair<std::shared_ptr<Worker>, Queued>> next;
  bool requeued;
  {
    MutexLock l(mu_);
    busy_.erase(w->sb.get());
    if (healthy && !worn && !stopped_) {
      idle_.push_back(w);
    } else {
      if (!out.ok()) last_error_ = "worker " + w->sb->id() + ": " + out.status().message();
      Retire(w);
    }
    requeued = !out.ok() && !started && !stopped_;
    if (requeued) {
      // The worker could not take the call (its zygote died, say): the call never ran, so it
      // goes first in line for another worker.
      queue_.push_front(std::move(q));
    }
    std::shared_ptr<Worker> nw;
    Queued nq;
    while (NextLocked(&nw, &nq)) next.emplace_back(std::move(nw), std::move(nq));
  }
  if (requeued) {
    // goes to another worker
  } else if (!out.ok()) {
    q.done(Unavailable("the call's worker failed: " + out.status().message()));
  } else {
    CallResult r;
    r.out = std::move(*out);
    r.queue_ms = std::max(0.0, queue_ms);
    r.worker = w->sb->id();
    q.done(std::move(r));
  }
  for (auto& [nw, nq] : next) Start(std::move(nw), std::move(nq));
  if ((!healthy || worn) && wake_) wake_();
}

bool Pool::NextLocked(std::shared_ptr<Worker>* w, Queued* q) {
  if (idle_.empty() || queue_.empty() || stopped_) return false;
  *w = idle_.front();
  idle_.pop_front();
  idle_low_ = std::min(idle_low_, static_cast<int>(idle_.size()));
  *q = std::move(queue_.front());
  queue_.pop_front();
  busy_[(*w)->sb.get()] = *w;
  return true;
}

void Pool::Retire(std::shared_ptr<Worker> w) {
  replaced_++;
  retired_.push_back(std::move(w));
}

std::shared_ptr<Sandbox> Pool::TakeSandbox() {
  std::shared_ptr<Worker> w;
  {
    MutexLock l(mu_);
    if (!HoldsSandboxes(cfg_.kind) || stopped_) return nullptr;
    // A pooled sandbox that died while idle is not handed out.
    while (!idle_.empty() && !w) {
      w = idle_.back();
      idle_.pop_back();
      if (w->sb->state() != backends::SandboxState::kRunning) {
        Retire(w);
        w = nullptr;
      }
    }
    if (w) {
      taken_++;
    } else {
      missed_++;
    }
    last_asked_ms_ = MonotonicMs();
  }
  if (wake_) wake_();  // refill
  return w ? w->sb : nullptr;
}

backends::SandboxSpec ContainerSpecFor(const PoolConfig& c) {
  backends::SandboxSpec s;
  static_cast<backends::SandboxShape&>(s) = c.Shape();
  s.kind = SandboxKindOf(c.kind);
  return s;
}

backends::SandboxSpec Pool::ContainerSpec() const { return ContainerSpecFor(cfg_); }

std::shared_ptr<Sandbox> Pool::YieldIdle() {
  std::shared_ptr<Worker> w;
  {
    MutexLock l(mu_);
    if (stopped_ || idle_.empty()) return nullptr;
    w = idle_.front();  // least recently used
    idle_.pop_front();
    yielded_++;
  }
  // The pool asks for a new one as it maintains itself; the node's admission decides.
  if (wake_) wake_();
  return w->sb;
}

std::pair<int64_t, int64_t> Pool::Usage() const {
  MutexLock l(mu_);
  int64_t n = static_cast<int64_t>(idle_.size() + busy_.size() + resting_.size()) + starting_;
  return {n, n * cfg_.resources.memory_mb};
}

StatusOr<std::shared_ptr<Pool::Worker>> Pool::MakeWorker() {
  if (admit_) DSEC_RETURN_IF_ERROR(admit_(cfg_.resources.memory_mb));
  if (HoldsSandboxes(cfg_.kind)) {
    backends::SandboxSpec s = ContainerSpec();
    s.id = NewSandboxId(node_);
    DSEC_RETURN_IF_ERROR(backends::ValidateSandboxSpec(s));
    DSEC_ASSIGN_OR_RETURN(auto sb, backend_->Create(s));
    if (cfg_.kind == PoolKind::kMicrovm) {
      // A restored guest translates (TCG) every code path it runs afresh: the first exec in it
      // takes 100s of ms there. One `true` now, while it waits in the pool, not in the first
      // exec of whoever takes it. Best effort: an image without `true` still pools (the spawn
      // path ran all the same). (Its exec counter starts at one.)
      backends::ExecRequest warm;
      warm.cmd = {"true"};
      warm.timeout_ms = 30000;
      (void)sb->Exec(warm);
    }
    auto worker = std::make_shared<Worker>();
    worker->sb = sb;
    return worker;
  }
  backends::SandboxSpec s = ContainerSpecFor(cfg_);
  s.id = NewSandboxId(node_);
  s.hostname = "fncall";
  s.resources.disk_mb = kWorkerDiskMb;
  backends::WorkerSpec w;
  w.runtime = cfg_.runtime == backends::FnRuntime::kPython ? backends::FnRuntime::kPython
                                                           : backends::FnRuntime::kExec;
  w.preload = cfg_.preload;
  w.command = cfg_.runtime == backends::FnRuntime::kBash
                  ? std::vector<std::string>{"/bin/bash", "-c"}
                  : cfg_.command;
  w.call_disk_mb = cfg_.resources.disk_mb;
  s.worker = std::move(w);
  DSEC_RETURN_IF_ERROR(backends::ValidateSandboxSpec(s));
  DSEC_ASSIGN_OR_RETURN(auto sb, backend_->Create(s));
  auto worker = std::make_shared<Worker>();
  worker->sb = sb;
  auto st = sb->Stats();
  int64_t used_mb = st.ok() ? static_cast<int64_t>((st->memory_current + (1 << 20) - 1) >> 20) : 64;
  worker->baseline_mb = used_mb + kBaselineSlackMb;
  worker->limit_mb = cfg_.resources.memory_mb;
  if (Status s2 = sb->SetMemoryLimit((worker->limit_mb + worker->baseline_mb) << 20); !s2.ok()) {
    (void)sb->Destroy();
    return s2;
  }
  return worker;
}

ScalePlan PlanScale(const PoolCounts& c, int min_idle, int max, bool container) {
  ScalePlan p;
  int total = c.idle + c.busy + c.starting;
  // Enough idle workers for min_idle, and one for every queued call that none will take.
  int need = std::max(min_idle - c.idle - c.starting, c.queued - c.starting);
  // A container pool's sandboxes leave it when taken: only idle ones count against max.
  if (container) total = c.idle + c.starting;
  p.start = std::max(0, std::min(need, max - total));
  int idle = c.idle;
  // Shrink: workers that stayed idle through a whole idle_timeout_s window (the fewest idle at
  // any moment in it, beyond min_idle) were not needed. Calls go to the least recently used
  // worker (so one that just finished has time to prepare its next call), hence the window
  // rather than per-worker idle times. Never while calls wait.
  if (c.window_over && c.queued == 0) {
    p.retire_lru = std::max(0, std::min(c.idle_low, idle) - min_idle);
    idle -= p.retire_lru;
  }
  // Over max after a PUT lowered it: idle ones go.
  p.retire_over_max = std::max(0, std::min(idle, idle + c.busy - max));
  return p;
}

Pool::Upkeep Pool::PlanUpkeepLocked(int64_t now) {
  Upkeep u;
  while (!queue_.empty() && now - queue_.front().enqueued_us / 1000 > cfg_.queue_timeout_ms) {
    u.expired.push_back(std::move(queue_.front()));
    queue_.pop_front();
    rejected_++;
  }
  u.destroy.swap(retired_);
  // Rested workers come back first in line for the waiting calls.
  for (auto it = resting_.begin(); it != resting_.end();) {
    if ((*it)->rest_until_ms > now) {
      ++it;
      continue;
    }
    idle_.push_front(*it);
    it = resting_.erase(it);
  }
  if (!stopped_) {
    PoolCounts c;
    c.idle = static_cast<int>(idle_.size());
    c.busy = static_cast<int>(busy_.size());
    c.starting = starting_;
    c.queued = static_cast<int>(queue_.size());
    c.idle_low = idle_low_;
    c.window_over = now - window_start_ms_ >= cfg_.idle_timeout_s * 1000;
    ScalePlan plan = PlanScale(c, cfg_.min_idle, cfg_.max, HoldsSandboxes(cfg_.kind));
    u.create = plan.start;
    // The least recently used idle workers (at the back) go when the window had surplus;
    // over max, the front ones.
    for (int i = 0; i < plan.retire_lru; ++i) {
      u.destroy.push_back(idle_.back());
      idle_.pop_back();
    }
    for (int i = 0; i < plan.retire_over_max; ++i) {
      u.destroy.push_back(idle_.front());
      idle_.pop_front();
    }
    if (c.window_over) {
      window_start_ms_ = now;
      idle_low_ = static_cast<int>(idle_.size());
    }
  }
  starting_ += u.create;
  making_ += u.create;
  std::shared_ptr<Worker> nw;
  Queued nq;
  while (NextLocked(&nw, &nq)) u.start.emplace_back(std::move(nw), std::move(nq));
  return u;
}

bool Pool::CreateWorkers(int n) {
  bool failed = false;
  for (int i = 0; i < n; ++i) {
    auto w = failed ? StatusOr<std::shared_ptr<Worker>>(Unavailable("skipped")) : MakeWorker();
    std::vector<std::pair<std::shared_ptr<Worker>, Queued>> next;
    std::vector<Queued> hopeless;
    bool late = false;
    {
      MutexLock l(mu_);
      starting_--;
      late = w.ok() && stopped_;
      if (late) {
        // made while the pool shut down: destroyed below
      } else if (w.ok()) {
        idle_.push_back(*w);
        std::shared_ptr<Worker> nw;
        Queued nq;
        while (NextLocked(&nw, &nq)) next.emplace_back(std::move(nw), std::move(nq));
      } else if (!failed) {
        failed = true;
        last_error_ = "create worker: " + w.status().message();
        // Nothing will serve the waiting calls: say why now rather than after the timeout.
        if (idle_.empty() && busy_.empty() && starting_ == 0) {
          for (auto& q : queue_) hopeless.push_back(std::move(q));
          queue_.clear();
        }
      }
    }
    if (late) (void)(*w)->sb->Destroy();
    {
      MutexLock l(mu_);
      if (--making_ == 0) made_cv_.NotifyAll();
    }
    for (auto& q : hopeless)
      q.done(Unavailable("pool " + cfg_.name + " has no workers: " + w.status().message()));
    for (auto& [nw, nq] : next) Start(std::move(nw), std::move(nq));
  }
  return !failed;
}

int64_t Pool::Maintain() {
  Upkeep u;
  {
    MutexLock l(mu_);
    u = PlanUpkeepLocked(MonotonicMs());
  }
  for (auto& [nw, nq] : u.start) Start(std::move(nw), std::move(nq));
  for (auto& q : u.expired)
    q.done(OverCapacity("pool " + cfg_.name + ": no worker became free within " +
                        std::to_string(cfg_.queue_timeout_ms) + " ms"));
  for (auto& w : u.destroy) (void)w->sb->Destroy();
  bool created = CreateWorkers(u.create);
  MutexLock l(mu_);
  if (!created) return kFailureBackoffMs;
  return queue_.empty() && resting_.empty() ? kIdleRecheckMs : kQueueRecheckMs;
}

void Pool::UpdateLimits(const PoolConfig& c) {
  MutexLock l(mu_);
  cfg_.min_idle = c.min_idle;
  cfg_.max = c.max;
  cfg_.max_queue = c.max_queue;
  cfg_.queue_timeout_ms = c.queue_timeout_ms;
  cfg_.idle_timeout_s = c.idle_timeout_s;
}

void Pool::Shutdown() {
  std::vector<std::shared_ptr<Worker>> all;
  std::deque<Queued> queued;
  {
    MutexLock l(mu_);
    stopped_ = true;
    for (auto& w : idle_) all.push_back(w);
    for (auto& [p, w] : busy_) all.push_back(w);
    for (auto& w : retired_) all.push_back(w);
    for (auto& w : resting_) all.push_back(w);
    resting_.clear();
    idle_.clear();
    retired_.clear();
    queued.swap(queue_);
  }
  for (auto& q : queued) q.done(Unavailable("pool " + cfg_.name + " was removed"));
  for (auto& w : all) (void)w->sb->Destroy();
  // One still being made is destroyed as it comes (CreateWorkers sees stopped_).
  MutexLock l(mu_);
  made_cv_.WaitFor(l, std::chrono::seconds(120), [&]() DSEC_REQUIRES(mu_) { return making_ == 0; });
}

PoolStatus Pool::State() const {
  MutexLock l(mu_);
  PoolStatus st;
  st.config = cfg_;
  st.idle = idle_.size();
  st.busy = busy_.size();
  st.starting = starting_;
  st.taken = taken_;
  st.missed = missed_;
  st.queued = queue_.size();
  st.calls = calls_;
  st.rejected = rejected_;
  st.replaced = replaced_;
  st.yielded = yielded_;
  st.last_error = last_error_;
  return st;
}

// --- PoolSet ---

PoolSet::PoolSet(std::function<backends::Backend*(backends::Kind)> backend_of, std::string node)
    : backend_of_(std::move(backend_of)), node_(std::move(node)), thread_([this] { Loop(); }) {}

PoolSet::~PoolSet() { Shutdown(); }

void PoolSet::Wake() {
  MutexLock l(mu_);
  woken_ = true;
  cv_.NotifyOne();
}

StatusOr<std::shared_ptr<Pool>> PoolSet::Put(const PoolConfig& cfg) {
  DSEC_RETURN_IF_ERROR(ValidateSafeName("pool name", cfg.name));
  std::shared_ptr<Pool> old;
  backends::Backend* backend = backend_of_(SandboxKindOf(cfg.kind));
  if (!backend)
    return FailedPrecondition("this node has no " +
                              std::string(backends::KindName(SandboxKindOf(cfg.kind))) +
                              " sandboxes for pool " + cfg.name);
  auto pool = std::make_shared<Pool>(cfg, backend, node_);
  pool->wake_ = [this] { Wake(); };
  pool->admit_ = admit_;
  if (!HoldsSandboxes(cfg.kind)) pool->max_calls_ = max_calls_;
  {
    MutexLock l(mu_);
    if (stop_) return Unavailable("shutting down");
    auto it = pools_.find(cfg.name);
    if (it != pools_.end()) {
      const PoolConfig& o = it->second->config();
      bool same_workers = o.kind == cfg.kind && o.runtime == cfg.runtime &&
                          o.preload == cfg.preload && o.command == cfg.command &&
                          o.image == cfg.image && o.workdir == cfg.workdir && o.user == cfg.user &&
                          o.env == cfg.env && o.resources == cfg.resources;
      if (same_workers) {
        it->second->UpdateLimits(cfg);
        woken_ = true;
        cv_.NotifyOne();
        return it->second;
      }
      old = it->second;
      removed_.push_back(old);
    }
    pools_[cfg.name] = pool;
    woken_ = true;
    cv_.NotifyOne();
  }
  return pool;
}

std::pair<int64_t, int64_t> PoolSet::Usage() const {
  std::vector<std::shared_ptr<Pool>> all;
  {
    MutexLock l(mu_);
    for (const auto& [name, p] : pools_) all.push_back(p);
    all.insert(all.end(), removed_.begin(), removed_.end());
  }
  std::pair<int64_t, int64_t> sum{0, 0};
  for (const auto& p : all) {
    auto [n, mb] = p->Usage();
    sum.first += n;
    sum.second += mb;
  }
  return sum;
}

std::vector<std::shared_ptr<Sandbox>> PoolSet::YieldIdle(int64_t count, int64_t memory_mb) {
  std::vector<std::shared_ptr<Pool>> all;
  {
    MutexLock l(mu_);
    for (const auto& [name, p] : pools_) all.push_back(p);
  }
  std::vector<std::shared_ptr<Sandbox>> out;
  int64_t freed_mb = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (const auto& p : all) {
      if (static_cast<int64_t>(out.size()) >= count && freed_mb >= memory_mb) return out;
      if (auto sb = p->YieldIdle()) {
        out.push_back(std::move(sb));
        freed_mb += p->config().resources.memory_mb;
        progress = true;
      }
    }
  }
  return out;
}

std::shared_ptr<Pool> PoolSet::Get(const std::string& name) const {
  MutexLock l(mu_);
  auto it = pools_.find(name);
  return it == pools_.end() ? nullptr : it->second;
}

Status PoolSet::Remove(const std::string& name) {
  MutexLock l(mu_);
  auto it = pools_.find(name);
  if (it == pools_.end()) return NotFound("pool " + name + " not found");
  removed_.push_back(it->second);
  pools_.erase(it);
  woken_ = true;
  cv_.NotifyOne();
  return OkStatus();
}

void PoolSet::RemoveNow(const std::function<bool(const PoolConfig&)>& drop) {
  std::vector<std::shared_ptr<Pool>> gone;
  {
    MutexLock l(mu_);
    for (auto it = pools_.begin(); it != pools_.end();) {
      if (drop(it->second->config())) {
        gone.push_back(it->second);
        it = pools_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : gone) p->Shutdown();
}

std::vector<PoolStatus> PoolSet::List() const {
  std::vector<std::shared_ptr<Pool>> pools;
  {
    MutexLock l(mu_);
    for (auto& [n, p] : pools_) pools.push_back(p);
  }
  std::vector<PoolStatus> out;
  for (auto& p : pools) out.push_back(p->State());
  return out;
}

void PoolSet::WaitWarm(int64_t timeout_ms) const {
  int64_t deadline = MonotonicMs() + timeout_ms;
  while (MonotonicMs() < deadline) {
    bool warm = true;
    for (const auto& p : List())
      warm = warm && (static_cast<int>(p.idle) >= p.config.min_idle || !p.last_error.empty());
    if (warm) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PoolSet::Loop() {
  int64_t wait_ms = 0;
  while (true) {
    std::vector<std::shared_ptr<Pool>> pools, removed;
    {
      MutexLock l(mu_);
      cv_.WaitFor(l, std::chrono::milliseconds(wait_ms),
                  [&]() DSEC_REQUIRES(mu_) { return stop_ || woken_; });
      if (stop_) return;
      woken_ = false;
      const int64_t now = MonotonicMs();
      for (auto it = pools_.begin(); it != pools_.end();) {
        if (it->second->Expired(now)) {
          DSEC_LOG_INFO("pool {}: unused for {} s, removed", it->first,
                        it->second->config().expire_unused_s);
          removed_.push_back(it->second);
          it = pools_.erase(it);
        } else {
          pools.push_back(it->second);
          ++it;
        }
      }
      removed.swap(removed_);
    }
    for (auto& p : removed) p->Shutdown();
    wait_ms = kIdleRecheckMs;
    for (auto& p : pools) wait_ms = std::min(wait_ms, p->Maintain());
  }
}

void PoolSet::Shutdown() {
  std::vector<std::shared_ptr<Pool>> all;
  {
    MutexLock l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    cv_.NotifyOne();
  }
  if (thread_.joinable()) thread_.join();
  {
    MutexLock l(mu_);
    for (auto& [n, p] : pools_) all.push_back(p);
    for (auto& p : removed_) all.push_back(p);
    pools_.clear();
    removed_.clear();
  }
  for (auto& p : all) p->Shutdown();
}

}  // namespace dsec::pools
