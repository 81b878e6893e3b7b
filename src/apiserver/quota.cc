#include "apiserver/quota.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/format.h>

#include "api/ports_json.h"
#include "api/quota_room.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/resources.h"
#include "base/strings.h"

namespace dsec::apiserver {

namespace {

constexpr int64_t kUnlimited = int64_t{1} << 50;  // the room of a dimension no level limits
// A hold grows by up to this many creates' worth, or by as many as it admitted in the last
// second (at a steady rate: about one transaction a second, not one per 8 creates).
constexpr int64_t kBlockCreates = 8;
constexpr int64_t kIdleMs = 1000;             // a hold unused this long shrinks back
constexpr int64_t kUnknownOutcomeMs = 30000;  // a create whose answer never came
constexpr int kGrowAttempts = 8;
// How long a create at a full level waits for room: for deletes the nodes have not shown yet,
// and longer when other apiservers hold unused room that would do (they are asked for it back:
// a watch event, a shrink written to etcd, its event back here, on a loaded host).
constexpr int64_t kWantWaitMs = 1000;
constexpr int64_t kWantOthersWaitMs = 3000;

int64_t Window(int64_t now_ms) { return now_ms / 1000; }

Amount Plus(Amount a, const Amount& b) {
  a.sandboxes += b.sandboxes;
  a.memory_mb += b.memory_mb;
  a.cpu_milli += b.cpu_milli;
  return a;
}
Amount Minus(Amount a, const Amount& b) {
  a.sandboxes -= b.sandboxes;
  a.memory_mb -= b.memory_mb;
  a.cpu_milli -= b.cpu_milli;
  return a;
}
Amount Max(const Amount& a, const Amount& b) {
  return {std::max(a.sandboxes, b.sandboxes), std::max(a.memory_mb, b.memory_mb),
          std::max(a.cpu_milli, b.cpu_milli)};
}

// The three dimensions of an amount with their limits, by name.
struct Dim {
  const char* name;
  int64_t Amount::*field;
  std::optional<int64_t> QuotaLimits::*limit;
};
constexpr Dim kDims[] = {{"sandboxes", &Amount::sandboxes, &QuotaLimits::sandboxes},
                         {"memory_mb", &Amount::memory_mb, &QuotaLimits::memory_mb},
                         {"cpu", &Amount::cpu_milli, &QuotaLimits::cpu_milli}};

Json CpuJson(int64_t milli) { return static_cast<double>(milli) / 1000.0; }

}  // namespace

// --- limits, holds, levels ------------------------------------------------------------------

Json QuotaLimits::ToJson() const {
  auto opt = [](const std::optional<int64_t>& v) { return v ? Json(*v) : Json(nullptr); };
  return {{"sandboxes", opt(sandboxes)},
          {"memory_mb", opt(memory_mb)},
          {"cpu", cpu_milli ? CpuJson(*cpu_milli) : Json(nullptr)},
          {"creates_per_s", opt(creates_per_s)},
          {"parent", parent.empty() ? Json(nullptr) : Json(parent)}};
}

Status QuotaLimits::Patch(const Json& body) {
  if (!body.is_object()) return InvalidArgument("body must be a JSON object");
  for (const auto& [k, v] : body.items()) {
    if (k == "parent") {
      if (!v.is_null() && (!v.is_string() || !api::IsDnsLabel(v.get<std::string>())))
        return InvalidArgument("\"parent\" must be a project name, or null");
      parent = v.is_null() ? "" : v.get<std::string>();
      continue;
    }
    if (k != "sandboxes" && k != "max_sandboxes" && k != "memory_mb" && k != "cpu" &&
        k != "creates_per_s")
      return InvalidArgument("unknown field \"" + k +
                             "\" (sandboxes, memory_mb, cpu, creates_per_s, parent)");
    std::optional<int64_t> value;
    if (!v.is_null()) {
      if (k == "cpu") {
        if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1e6)
          return InvalidArgument("\"cpu\" must be a number of cores from 0 to 1000000, or null");
        value = CpuMilli(v.get<double>());
      } else {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 40))
          return InvalidArgument("\"" + k + "\" must be an integer from 0 to 2^40, or null");
        value = v.get<int64_t>();
      }
    }
    if (k == "sandboxes" || k == "max_sandboxes") sandboxes = value;
    if (k == "memory_mb") memory_mb = value;
    if (k == "cpu") cpu_milli = value;
    if (k == "creates_per_s") creates_per_s = value;
  }
  return OkStatus();
}

StatusOr<QuotaLimits> QuotaLimits::FromJson(const Json& j) {
  QuotaLimits q;
  DSEC_RETURN_IF_ERROR(q.Patch(j));
  return q;
}

Json Amount::ToJson() const {
  return {{"sandboxes", sandboxes}, {"memory_mb", memory_mb}, {"cpu", CpuJson(cpu_milli)}};
}

Json QuotaHold::ToJson() const {
  return {{"tag", tag},
          {"project", project},
          {"owner", owner},
          {"sandboxes", granted.sandboxes},
          {"memory_mb", granted.memory_mb},
          {"cpu_milli", granted.cpu_milli},
          {"window", window},
          {"creates", creates}};
}

StatusOr<QuotaHold> QuotaHold::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("quota hold is not an object");
  QuotaHold h;
  try {
    h.tag = j.value("tag", "");
    h.project = j.value("project", "");
    h.owner = j.value("owner", "");
    h.granted.sandboxes = j.value("sandboxes", int64_t{0});
    h.granted.memory_mb = j.value("memory_mb", int64_t{0});
    h.granted.cpu_milli = j.value("cpu_milli", int64_t{0});
    h.window = j.value("window", int64_t{0});
    h.creates = j.value("creates", int64_t{0});
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("quota hold: ") + e.what());
  }
  if (h.tag.empty()) return InvalidArgument("quota hold without a tag");
  return h;
}

bool IsQuotaLevel(std::string_view level) {
  if (level == "org") return true;
  auto parts = SplitString(level, '/', /*skip_empty=*/false);
  if (parts.size() == 2 && parts[0] == "project") return api::IsDnsLabel(parts[1]);
  return parts.size() == 3 && parts[0] == "token" && api::IsDnsLabel(parts[1]) &&
         api::IsDnsLabel(parts[2]);
}

std::string QuotaRefusal::Message() const {
  const bool cpu = what == "cpu";
  auto show = [&](int64_t v) {
    return cpu ? fmt::format("{:.3g}", static_cast<double>(v) / 1000.0) : std::to_string(v);
  };
  if (what == "creates_per_s")
    return StrCat({"quota exceeded at ", level, ": creates_per_s limit ", show(limit), ", ",
                   show(usage), " made this second"});
  return StrCat({"quota exceeded at ", level, ": ", what, " limit ", show(limit), ", ", show(usage),
                 " in use, ", show(asked), " asked"});
}

Json QuotaRefusal::ToJson() const {
  const bool cpu = what == "cpu";
  auto num = [&](int64_t v) { return cpu ? CpuJson(v) : Json(v); };
  return {{"error",
           {{"code", "quota_exceeded"},
            {"message", Message()},
            {"level", level},
            {"quota", what},
            {"limit", num(limit)},
            {"usage", num(usage)},
            {"asked", num(asked)}}}};
}

// --- Quotas ----------------------------------------------------------------------------------

Quotas::Quotas(etcd::Client* etcd, std::string apiserver, int64_t lease_ttl_s)
    : etcd_(etcd), apiserver_(std::move(apiserver)), lease_ttl_s_(lease_ttl_s) {}

Quotas::~Quotas() { Stop(); }

void Quotas::Start() {
  thread_ = std::thread([this] { Run(); });
  keepalive_ = std::thread([this] { KeepAlive(); });
}

void Quotas::Stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  if (keepalive_.joinable()) keepalive_.join();
  {
    // Creates made and not yet shown by their nodes are counted by the holds alone: give the
    // nodes a moment (they publish within 250 ms) before the holds go.
    MutexLock l(mu_);
    cv_.WaitFor(l, std::chrono::milliseconds(1500),
                [&]() DSEC_REQUIRES(mu_) { return pending_.empty(); });
  }
  int64_t lease = 0;
  {
    MutexLock l(mu_);
    lease = lease_;
    lease_ = 0;
  }
  if (lease != 0) (void)etcd_->LeaseRevoke(lease);
}

bool Quotas::Owns(std::string_view key) {
  return StartsWith(key, kQuotasPrefix) || StartsWith(key, kQuotaVersionPrefix) ||
         StartsWith(key, kQuotaHoldsPrefix) || StartsWith(key, kQuotaWantPrefix) ||
         StartsWith(key, cluster::kUsagePrefix);
}

void Quotas::ApplyPut(const std::string& key, const std::string& value) {
  MutexLock l(mu_);
  ApplyPutLocked(key, value);
}

void Quotas::ApplyPutLocked(const std::string& key, const std::string& value) {
  if (StartsWith(key, kQuotasPrefix)) {
    ++limits_gen_;
    const std::string level = key.substr(kQuotasPrefix.size());
    auto q = QuotaLimits::FromJson(Json::parse(value, nullptr, false));
    if (q.ok() && IsQuotaLevel(level))
      limits_[level] = *q;
    else
      DSEC_LOG_WARN("quota: ignoring bad limits at {}", key);
  } else if (StartsWith(key, kQuotaVersionPrefix)) {
    versions_[key.substr(kQuotaVersionPrefix.size())] = value;
  } else if (StartsWith(key, kQuotaWantPrefix)) {
    if (!StartsWith(value, apiserver_ + ":")) pressed_.insert(key.substr(kQuotaWantPrefix.size()));
  } else if (StartsWith(key, kQuotaHoldsPrefix)) {
    auto h = QuotaHold::FromJson(value);
    if (!h.ok()) return DSEC_LOG_WARN("quota: ignoring a bad hold at {}", key);
    if (auto old = holds_.find(key); old != holds_.end()) live_tags_.erase(old->second.tag);
    live_tags_.insert(h->tag);
    holds_[key] = std::move(*h);
  } else if (StartsWith(key, cluster::kUsagePrefix)) {
    const std::string node = key.substr(cluster::kUsagePrefix.size());
    auto u = cluster::NodeUsage::FromJson(value);
    if (!u.ok()) return DSEC_LOG_WARN("quota: ignoring bad usage at {}", key);
    const int64_t gen = u->gen;
    ShowLocked(node, -1);
    usage_[node] = std::move(*u);
    ShowLocked(node, +1);
    SettleShownLocked(node, gen);
  }
}

void Quotas::ApplyDelete(const std::string& key) {
  MutexLock l(mu_);
  if (StartsWith(key, kQuotasPrefix)) {
    ++limits_gen_;
    limits_.erase(key.substr(kQuotasPrefix.size()));
  } else if (StartsWith(key, kQuotaVersionPrefix)) {
    versions_.erase(key.substr(kQuotaVersionPrefix.size()));
  } else if (StartsWith(key, kQuotaHoldsPrefix)) {
    if (auto it = holds_.find(key); it != holds_.end()) {
      live_tags_.erase(it->second.tag);
      holds_.erase(it);
    }
  } else if (StartsWith(key, cluster::kUsagePrefix)) {
    // (a node that left with no sandboxes: nothing of it to count)
    const std::string node = key.substr(cluster::kUsagePrefix.size());
    ShowLocked(node, -1);
    usage_.erase(node);
  }
}

void Quotas::Reset(const std::vector<etcd::KeyValue>& kvs) {
  // All under one hold of the lock: no admission sees a half-read store.
  MutexLock l(mu_);
  limits_.clear();
  versions_.clear();
  holds_.clear();
  live_tags_.clear();
  usage_.clear();
  shown_.clear();
  ++limits_gen_;
  for (const auto& kv : kvs)
    if (Owns(kv.key)) ApplyPutLocked(kv.key, kv.value);
}

void Quotas::SetRevision(int64_t revision) {
  MutexLock l(mu_);
  if (revision > revision_) revision_ = revision;
  cv_.NotifyAll();
}

bool Quotas::WaitRevision(int64_t revision, int64_t timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock l(mu_);
  return cv_.WaitUntil(l, until, [&]() DSEC_REQUIRES(mu_) { return revision_ >= revision; });
}

std::vector<std::string> Quotas::Chain(const std::string& project, const std::string& owner) const {
  MutexLock l(mu_);
  return ChainLocked(project, owner);
}

std::vector<std::string> Quotas::ChainLocked(const std::string& project,
                                             const std::string& owner) const {
  std::vector<std::string> up;  // the project's ancestors, nearest first
  std::string at = project;
  for (int depth = 0; depth < 8; ++depth) {
    auto q = limits_.find("project/" + at);
    if (q == limits_.end() || q->second.parent.empty() || q->second.parent == project) break;
    at = q->second.parent;
    const std::string level = "project/" + at;
    if (std::find(up.begin(), up.end(), level) != up.end()) break;  // (a cycle: stop)
    up.push_back(level);
  }
  std::vector<std::string> chain = {"org"};
  chain.insert(chain.end(), up.rbegin(), up.rend());
  chain.push_back("project/" + project);
  chain.push_back(StrCat({"token/", project, "/", owner}));
  return chain;
}

std::string Quotas::LimitsSigLocked(const std::vector<std::string>& chain) const {
  // (Any change of any level's limits or parent counts: they are rare, and a look costs one
  // transaction per chain.)
  return StrCat({std::to_string(limits_gen_), "/", std::to_string(chain.size())});
}

void Quotas::ShowLocked(const std::string& node, int sign) {
  auto u = usage_.find(node);
  if (u == usage_.end()) return;
  for (const auto& e : u->second.entries) {
    if (e.hold.empty()) continue;
    Amount& a = shown_[e.hold];
    a.sandboxes += sign * e.sandboxes;
    a.memory_mb += sign * e.memory_mb;
    a.cpu_milli += sign * e.cpu_milli;
    if (a.sandboxes == 0 && a.memory_mb == 0 && a.cpu_milli == 0) shown_.erase(e.hold);
  }
}

bool Quotas::InLevelLocked(const std::string& level, const std::string& project,
                           const std::string& owner) const {
  if (level == "org") return true;
  if (StartsWith(level, "token/")) return level == StrCat({"token/", project, "/", owner});
  for (const auto& l : ChainLocked(project, owner))
    if (l == level) return true;
  return false;
}

Amount Quotas::ShownLocked(const std::string& tag) const {
  auto it = shown_.find(tag);
  return it == shown_.end() ? Amount{} : it->second;
}

Quotas::Taken Quotas::TakenLocked(const std::string& level, int64_t window) const {
  Taken t;
  std::map<std::string, Amount> shown;  // by live tag
  for (const auto& [node, u] : usage_)
    for (const auto& e : u.entries) {
      if (!InLevelLocked(level, e.project, e.owner)) continue;
      const Amount a{e.sandboxes, e.memory_mb, e.cpu_milli};
      if (!e.hold.empty() && live_tags_.count(e.hold))
        shown[e.hold] = Plus(shown[e.hold], a);
      else
        t.amount = Plus(t.amount, a);
    }
  for (const auto& [key, h] : holds_) {
    if (!InLevelLocked(level, h.project, h.owner)) continue;
    t.amount = Plus(t.amount, Max(h.granted, shown[h.tag]));
    if (h.window == window) t.creates += h.creates;
  }
  return t;
}

Amount Quotas::OthersSpareLocked(const std::string& level, const std::string& except_key) const {
  Amount spare;
  for (const auto& [key, h] : holds_) {
    if (key == except_key || !InLevelLocked(level, h.project, h.owner)) continue;
    spare = Plus(spare, Max(Minus(h.granted, ShownLocked(h.tag)), Amount{}));
  }
  return spare;
}

void Quotas::ReleaseLocked(const Pending& p) {
  auto it = own_.find(p.chain);
  if (it != own_.end()) it->second.pending = Minus(it->second.pending, p.need);
}

void Quotas::SettleShownLocked(const std::string& node, int64_t gen) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.node == node && it->second.gen <= gen) {
      ReleaseLocked(it->second);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Quotas::TryLocalLocked(Own& own, const std::vector<std::string>& chain, const Amount& need,
                            int64_t count, int64_t window) {
  // (Limits changed since the hold was granted: it is looked at again, with a transaction.)
  if (!own.in_etcd || own.shrinking || own.sig != LimitsSigLocked(chain)) return false;
  if (lease_ == 0 || WallMs() >= lease_ok_until_ms_) return false;
  // Only while the view has it as granted: a hold gone with a lapsed lease (the keepalive may
  // not have noticed yet) counts for nothing elsewhere.
  auto in_view = holds_.find(
      StrCat({kQuotaHoldsPrefix, apiserver_, "/", own.hold.project, "/", own.hold.owner}));
  if (in_view == holds_.end() || in_view->second.tag != own.hold.tag ||
      in_view->second.granted.sandboxes < own.hold.granted.sandboxes ||
      in_view->second.granted.memory_mb < own.hold.granted.memory_mb ||
      in_view->second.granted.cpu_milli < own.hold.granted.cpu_milli ||
      in_view->second.creates < own.hold.creates)
    return false;
  bool rate = false;
  const Amount used = Plus(ShownLocked(own.hold.tag), own.pending);
  for (const auto& level : chain) {
    auto q = limits_.find(level);
    if (q == limits_.end()) continue;
    for (const Dim& d : kDims)
      if (q->second.*d.limit && used.*d.field + need.*d.field > own.hold.granted.*d.field)
        return false;
    rate = rate || q->second.creates_per_s.has_value();
  }
  if (rate) {
    if (own.hold.window != window || own.creates_used + count > own.hold.creates) return false;
    own.creates_used += count;
  }
  own.pending = Plus(own.pending, need);
  const int64_t now = WallMs();
  if (now / 1000 != own.rate_second) {
    own.last_second_creates = own.rate_second == now / 1000 - 1 ? own.this_second_creates : 0;
    own.this_second_creates = 0;
    own.rate_second = now / 1000;
  }
  own.this_second_creates += count;
  own.last_use_ms = now;
  return true;
}

StatusOr<int64_t> Quotas::EnsureLease() {
  {
    MutexLock l(mu_);
    if (lease_ != 0 && WallMs() < lease_ok_until_ms_) return lease_;
  }
  const int64_t asked = WallMs();
  DSEC_ASSIGN_OR_RETURN(int64_t lease, etcd_->LeaseGrant(lease_ttl_s_));
  MutexLock l(mu_);
  // Holds of an older lease are gone, or going: new ones, under this lease, from now on.
  for (auto& [chain, own] : own_) own.in_etcd = false;
  lease_ = lease;
  lease_ok_until_ms_ = asked + lease_ttl_s_ * 1000 / 2;
  return lease;
}

void Quotas::LoseLeaseLocked(int64_t lease) {
  if (lease_ != lease) return;
  lease_ = 0;
  lease_ok_until_ms_ = 0;
  for (auto& [chain, own] : own_) own.in_etcd = false;
}

void Quotas::KeepAlive() {
  while (!stop_) {
    for (int i = 0; i < 10 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(lease_ttl_s_ * 1000 / 30));
    if (stop_) break;
    int64_t lease = 0;
    {
      MutexLock l(mu_);
      lease = lease_;
    }
    if (lease == 0) continue;
    const int64_t asked = WallMs();
    auto ttl = etcd_->LeaseKeepAlive(lease);
    MutexLock l(mu_);
    if (ttl.ok()) {
      // Counted on only for half the TTL from before it was asked: a hold is never used once
      // etcd may have let it go (an apiserver cut off from etcd stops admitting from it).
      if (lease_ == lease) lease_ok_until_ms_ = asked + lease_ttl_s_ * 1000 / 2;
    } else if (ttl.status().code() == StatusCode::kNotFound) {
      DSEC_LOG_WARN("quota: the holds' lease lapsed; new holds will be taken");
      LoseLeaseLocked(lease);
    }
  }
}

StatusOr<Quotas::Ticket> Quotas::Admit(const std::string& project, const std::string& owner,
                                       const Amount& need, int64_t count, QuotaRefusal* refused) {
  std::vector<std::string> chain = Chain(project, owner);
  const std::string chain_key = project + "/" + owner;
  auto admitted = [&](Own& own) {
    Ticket t;
    t.id = next_ticket_++;
    pending_[t.id] = Pending{chain_key, need, "", 0, 0};
    // The room: what it asked, in every dimension a level limits (unlimited otherwise).
    std::set<std::string> limited;
    for (const auto& level : chain)
      if (auto q = limits_.find(level); q != limits_.end())
        for (const Dim& d : kDims)
          if (q->second.*d.limit) limited.insert(d.name);
    auto room = [&](const Dim& d) { return limited.count(d.name) ? need.*d.field : kUnlimited; };
    t.header = api::QuotaRoomText({.hold = own.hold.tag,
                                   .sandboxes = room(kDims[0]),
                                   .memory_mb = room(kDims[1]),
                                   .cpu_milli = room(kDims[2])});
    return t;
  };
  {
    MutexLock l(mu_);
    chain = ChainLocked(project, owner);
    bool any = false;
    for (const auto& level : chain)
      if (auto q = limits_.find(level); q != limits_.end() && q->second.limits()) any = true;
    if (!any) return Ticket{};
    Own& own = own_[chain_key];
    if (TryLocalLocked(own, chain, need, count, Window(WallMs()))) return admitted(own);
  }
  MutexLock grow(grow_mu_);
  DSEC_ASSIGN_OR_RETURN(int64_t lease, EnsureLease());
  // Set at the first full level met: until then (and while room may still come) wait, then
  // refuse. Waiting rounds are bounded by the deadline, not counted as attempts.
  std::optional<std::chrono::steady_clock::time_point> want_deadline;
  for (int attempt = 0; attempt < kGrowAttempts; ++attempt) {
    const int64_t window = Window(WallMs());
    std::vector<etcd::Client::Condition> when;
    std::vector<etcd::Client::TxnPut> puts;
    std::string want;         // a level that is full now: wait a little for room there
    bool ask_others = false;  // ... and ask the other apiservers' unused room back
    Amount want_before;
    std::string hold_key = StrCat({kQuotaHoldsPrefix, apiserver_, "/", project, "/", owner});
    QuotaHold next;
    {
      MutexLock l(mu_);
      chain = ChainLocked(project, owner);  // (a parent set meanwhile changes it)
      Own& own = own_[chain_key];
      if (TryLocalLocked(own, chain, need, count, window)) return admitted(own);
      if (!own.in_etcd) {
        own.hold = QuotaHold{};
        own.hold.tag = StrCat({apiserver_, ".", std::to_string(next_tag_++)});
        own.hold.project = project;
        own.hold.owner = owner;
      }
      next = own.hold;
      const std::string sig = LimitsSigLocked(chain);
      const Amount shown = ShownLocked(own.hold.tag);
      const Amount used = Plus(shown, own.pending);
      // What the hold counts for in the view now; the new grant never goes below `base`: what
      // it has, or (when the chain's limits changed since it was granted: what it had in a
      // dimension nothing limited then means nothing now) what it covers.
      const Amount cur = Max(own.hold.granted, shown);
      const bool same = own.in_etcd && own.sig == sig;
      const Amount base = same ? cur : used;
      const int64_t rate_used = own.hold.window == window ? own.creates_used : 0;
      const int64_t rate_cur = own.hold.window == window ? own.hold.creates : 0;
      const int64_t rate_base = same ? rate_cur : rate_used;
      Amount grant = base;
      int64_t creates = rate_base;
      const int64_t block =  // (in sandboxes)
          std::max(kBlockCreates, std::max(own.last_second_creates, own.this_second_creates));
      for (const Dim& d : kDims) {
        const int64_t required = std::max(base.*d.field, used.*d.field + need.*d.field);
        // What the level's total moves by (negative when the hold shrinks).
        const int64_t delta = required - cur.*d.field;
        int64_t headroom = kUnlimited;
        bool limited = false;
        for (const auto& level : chain) {
          auto q = limits_.find(level);
          if (q == limits_.end() || !(q->second.*d.limit)) continue;
          limited = true;
          const int64_t taken = TakenLocked(level, window).amount.*d.field;
          const int64_t left = *(q->second.*d.limit) - taken;
          if (delta > left) {
            // Once, wait for room first: deletes the nodes have not shown yet, or room other
            // apiservers hold unused (asked back), may be all that stands in the way.
            if (!want_deadline || std::chrono::steady_clock::now() < *want_deadline) {
              want = level;
              ask_others = delta <= left + OthersSpareLocked(level, hold_key).*d.field;
              break;
            }
            *refused = {level, d.name, *(q->second.*d.limit), taken - cur.*d.field + used.*d.field,
                        need.*d.field};
            return Status(StatusCode::kOverCapacity, refused->Message());
          }
          headroom = std::min(headroom, left);
        }
        if (!want.empty()) break;
        grant.*d.field = required;
        if (!limited) continue;
        // A block more, but never more than half of what would be left to the others.
        const int64_t spare = headroom - delta;
        const int64_t per = count > 0 ? need.*d.field / count : need.*d.field;
        grant.*d.field = required + std::min(per * block, spare / 2);
      }
      if (want.empty()) {
        const int64_t required = std::max(rate_base, rate_used + count);
        int64_t headroom = kUnlimited;
        bool limited = false;
        for (const auto& level : chain) {
          auto q = limits_.find(level);
          if (q == limits_.end() || !q->second.creates_per_s) continue;
          limited = true;
          const int64_t taken = TakenLocked(level, window).creates;
          const int64_t left = *q->second.creates_per_s - taken;
          if (required - rate_cur > left) {
            *refused = {level, "creates_per_s", *q->second.creates_per_s,
                        taken - rate_cur + rate_used, count};
            return Status(StatusCode::kOverCapacity, refused->Message());
          }
          headroom = std::min(headroom, left);
        }
        creates = required;
        if (limited) creates += std::min(block, (headroom - (required - rate_cur)) / 2);
      }
      next.sig = sig;
      if (!want.empty()) {
        if (!want_deadline)
          want_deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(ask_others ? kWantOthersWaitMs : kWantWaitMs);
        want_before = TakenLocked(want, window).amount;
      }
      next.granted = grant;
      next.window = window;
      next.creates = creates;
      for (const auto& level : chain) {
        auto v = versions_.find(level);
        if (v == versions_.end())
          when.push_back(
              {StrCat({kQuotaVersionPrefix, level}), etcd::Client::Condition::kAbsent, ""});
        else
          when.push_back(
              {StrCat({kQuotaVersionPrefix, level}), etcd::Client::Condition::kValueIs, v->second});
        if (limits_.count(level))
          puts.push_back({StrCat({kQuotaVersionPrefix, level}),
                          StrCat({apiserver_, ":", std::to_string(next_version_++)}), 0});
      }
    }
    if (!want.empty()) {
      // Wait until what the level has taken drops (or a while), and look again; other grows
      // of this apiserver go on meanwhile.
      if (ask_others) {
        (void)etcd_->Put(StrCat({kQuotaWantPrefix, want}),
                         StrCat({apiserver_, ":", std::to_string(WallMs())}), lease);
        MutexLock l(mu_);
        pressed_.insert(want);  // (this apiserver's other holds there give theirs back too)
      }
      grow.Unlock();
      {
        const auto until = *want_deadline;
        MutexLock l(mu_);
        cv_.WaitUntil(l, until, [&]() DSEC_REQUIRES(mu_) {
          const Amount now = TakenLocked(want, Window(WallMs())).amount;
          return now.sandboxes < want_before.sandboxes || now.memory_mb < want_before.memory_mb ||
                 now.cpu_milli < want_before.cpu_milli;
        });
      }
      grow.Lock();
      --attempt;  // (a wait, bounded by its deadline)
      continue;
    }
    puts.push_back({hold_key, next.ToJson().dump(), lease});
    int64_t revision = 0;
    auto ok = etcd_->TxnAt(when, puts, {}, &revision);
    if (!ok.ok()) {
      if (ok.status().message().find("lease") != std::string::npos) {
        MutexLock l(mu_);  // (a lapsed lease: a new one next time)
        LoseLeaseLocked(lease);
      }
      return Status(StatusCode::kUnavailable, "quota: etcd: " + ok.status().message());
    }
    // The view must reach that revision before the next look: its own hold's event (a success)
    // comes with it; after a failed compare the change that failed it is at or below it (the
    // store's revision then may be a write the watch does not show: wait a little only).
    if (!WaitRevision(revision, *ok ? 2000 : 300) && *ok)
      return Status(StatusCode::kUnavailable, "quota: the view did not catch up with etcd");
    if (*ok) {
      MutexLock l(mu_);
      Own& own = own_[chain_key];
      if (own.hold.window != next.window) own.creates_used = 0;
      own.sig = next.sig;
      next.sig.clear();
      own.hold = next;
      own.in_etcd = true;
    }
  }
  return Status(StatusCode::kUnavailable, "quota: too much contention on the quota levels; retry");
}

void Quotas::Settle(uint64_t ticket, Outcome outcome, const std::string& node, int64_t gen) {
  if (ticket == 0) return;
  MutexLock l(mu_);
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  if (outcome == Outcome::kFailed) {
    ReleaseLocked(p);
    pending_.erase(it);
    return;
  }
  if (outcome == Outcome::kUnknown) {
    p.deadline_ms = WallMs() + kUnknownOutcomeMs;
    return;
  }
  p.node = node;
  auto u = usage_.find(node);
  const int64_t shown = u == usage_.end() ? 0 : u->second.gen;
  p.gen = gen > 0 ? gen : shown + 1;
  // No generation said (a replayed answer: the sandbox was counted by its first admission): the
  // node's next publication, or a few seconds on a node that has nothing new to say.
  if (gen <= 0) p.deadline_ms = WallMs() + 5000;
  if (shown >= p.gen) {
    ReleaseLocked(p);
    pending_.erase(it);
  }
}

std::string Quotas::NewVersion() {
  MutexLock l(mu_);
  return StrCat({apiserver_, ":", std::to_string(next_version_++)});
}

std::optional<QuotaLimits> Quotas::Limits(const std::string& level) const {
  MutexLock l(mu_);
  auto it = limits_.find(level);
  if (it == limits_.end()) return std::nullopt;
  return it->second;
}

Json Quotas::Report(const std::string& level) const {
  MutexLock l(mu_);
  const int64_t window = Window(WallMs());
  Amount running;
  for (const auto& [node, u] : usage_)
    for (const auto& e : u.entries)
      if (InLevelLocked(level, e.project, e.owner))
        running = Plus(running, {e.sandboxes, e.memory_mb, e.cpu_milli});
  const Taken t = TakenLocked(level, window);
  auto lim = limits_.find(level);
  const QuotaLimits limits = lim == limits_.end() ? QuotaLimits{} : lim->second;
  return {{"level", level},
          {"limits", limits.ToJson()},
          {"usage", running.ToJson()},
          {"held", Max(Minus(t.amount, running), Amount{}).ToJson()},
          {"creates_this_second", t.creates}};
}

void Quotas::Run() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stop_) break;
    {
      MutexLock l(mu_);
      const int64_t now = WallMs();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline_ms > 0 && it->second.deadline_ms <= now) {
          ReleaseLocked(it->second);
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    ReturnIdle();
  }
}

void Quotas::ReturnIdle() {
  struct Change {
    std::string chain, key;
    std::optional<QuotaHold> hold;  // nullopt: delete
  };
  std::vector<Change> changes;
  int64_t lease = 0;
  {
    MutexLock l(mu_);
    // (Without a lease known alive, nothing is written: a hold kept without one would never go.)
    if (lease_ == 0 || WallMs() >= lease_ok_until_ms_) return;
    lease = lease_;
    const int64_t now = WallMs();
    for (auto& [chain, own] : own_) {
      bool pressed = false;
      for (const auto& level : ChainLocked(own.hold.project, own.hold.owner))
        pressed = pressed || pressed_.count(level);
      own.pressed = pressed;
      if (!own.in_etcd || (now - own.last_use_ms < kIdleMs && !pressed)) continue;
      const Amount covers = Plus(ShownLocked(own.hold.tag), own.pending);
      const bool rate_spent = own.hold.window != Window(now);
      const std::string key =
          StrCat({kQuotaHoldsPrefix, apiserver_, "/", own.hold.project, "/", own.hold.owner});
      // A hold whose sandboxes are all shown by their nodes (nothing pending) can go: the
      // nodes count them from then on.
      if (own.pending.sandboxes == 0 && own.pending.memory_mb == 0 && own.pending.cpu_milli == 0 &&
          rate_spent && !pressed) {
        changes.push_back({chain, key, std::nullopt});
      } else if (covers.sandboxes < own.hold.granted.sandboxes ||
                 covers.memory_mb < own.hold.granted.memory_mb ||
                 covers.cpu_milli < own.hold.granted.cpu_milli) {
        QuotaHold h = own.hold;
        h.granted = covers;
        changes.push_back({chain, key, h});
      }
    }
    pressed_.clear();
  }
  if (changes.empty()) return;
  MutexLock grow(grow_mu_);  // (not while a grow is deciding from the same hold)
  for (auto& c : changes) {
    {
      // Used again meanwhile: keep it.
      MutexLock l(mu_);
      auto it = own_.find(c.chain);
      if (it == own_.end() || !it->second.in_etcd ||
          (WallMs() - it->second.last_use_ms < kIdleMs && !it->second.pressed))
        continue;
      if (c.hold) {
        // From the hold as it is now (a grow may have run since the look above).
        c.hold = it->second.hold;
        c.hold->granted = Plus(ShownLocked(it->second.hold.tag), it->second.pending);
      } else if (it->second.pending.sandboxes != 0 || it->second.pending.memory_mb != 0 ||
                 it->second.pending.cpu_milli != 0) {
        continue;
      }
      it->second.shrinking = true;
    }
    int64_t revision = 0;
    auto ok = c.hold ? etcd_->TxnAt({}, {{c.key, c.hold->ToJson().dump(), lease}}, {}, &revision)
                     : etcd_->TxnAt({}, {}, {c.key}, &revision);
    if (ok.ok()) (void)WaitRevision(revision, 2000);
    MutexLock l(mu_);
    auto it = own_.find(c.chain);
    if (it == own_.end()) continue;
    it->second.shrinking = false;
    if (!ok.ok()) {
      // (It may or may not have been written: a new hold, which covers what is pending, next.)
      it->second.in_etcd = false;
      continue;
    }
    if (c.hold) {
      it->second.hold.granted = c.hold->granted;
    } else {
      own_.erase(it);
    }
  }
}

}  // namespace dsec::apiserver
