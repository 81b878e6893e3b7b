#include "edge/idempotency.h"

#include "base/clock.h"
#include "base/logging.h"

namespace dsec::edge {

namespace {
// Bounds on the records held in memory while the state DB refuses writes.
constexpr size_t kMaxUnsavedRecords = 4096;
constexpr uint64_t kMaxUnsavedBytes = 64 << 20;
}  // namespace

Idempotency::Idempotency(StateStore* store, int64_t max_records, int64_t max_age_s,
                         uint64_t max_body, uint64_t max_total)
    : store_(store),
      max_records_(max_records),
      max_age_s_(max_age_s),
      max_body_(max_body),
      max_total_(max_total) {}

std::string Idempotency::Hash(std::string_view data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool Idempotency::Recordable(int status) {
  return status != 429 && status != 503 && status != 401 && status != 403;
}

http::HttpResponse Idempotency::Mismatch() {
  return http::JsonError(409, "conflict",
                         "this request id was already used for a different request body");
}

http::HttpResponse Idempotency::Replay(const StoredResponse& r) const {
  http::HttpResponse out;
  out.status = r.status;
  out.content_type = r.content_type;
  out.body = r.body;
  out.headers.emplace_back("Idempotent-Replay", "true");
  return out;
}

Idempotency::Decision Idempotency::Begin(const std::string& key, const std::string& hash,
                                         std::function<void(http::HttpResponse)> reply,
                                         bool run_if_new) {
  MutexLock l(mu_);
  if (auto it = inflight_.find(key); it != inflight_.end()) {
    if (it->second.hash != hash) {
      l.Unlock();
      reply(Mismatch());
      return Decision::kReplayed;
    }
    it->second.waiters.push_back(std::move(reply));
    return Decision::kWaiting;
  }
  if (auto it = unsaved_.find(key); it != unsaved_.end()) {
    http::HttpResponse out = it->second.request_hash == hash ? Replay(it->second) : Mismatch();
    l.Unlock();
    reply(std::move(out));
    return Decision::kReplayed;
  }
  auto stored = store_->GetResponse(key);
  if (!stored.ok()) {
    l.Unlock();
    reply(http::JsonError(503, "unavailable", "state db: " + stored.status().message()));
    return Decision::kReplayed;
  }
  if (stored->has_value()) {
    const StoredResponse& r = **stored;
    http::HttpResponse out = r.request_hash == hash ? Replay(r) : Mismatch();
    l.Unlock();
    reply(std::move(out));
    return Decision::kReplayed;
  }
  if (!run_if_new) return Decision::kAbsent;
  inflight_[key].hash = hash;
  return Decision::kRun;
}

void Idempotency::Finish(const std::string& key, const std::string& hash,
                         const http::HttpResponse& r) {
  // (A create refused for the room its apiserver admitted it in is asked again with the same
  // id and more room: not an answer to keep.)
  bool quota_room = false;
  for (const auto& [k, v] : r.headers) quota_room = quota_room || k == "Dsec-Quota-Need";
  if (Recordable(r.status) && !quota_room) {
    StoredResponse s;
    s.status = r.status;
    s.content_type = r.content_type;
    s.body = r.body;
    s.request_hash = hash;
    s.created_ms = WallMs();
    if (s.body.size() > max_body_) {
      http::HttpResponse big = http::JsonError(409, "conflict",
                                               "this request already ran; its response (" +
                                                   std::to_string(r.body.size()) +
                                                   " bytes) was too large to keep for replay");
      s.status = big.status;
      s.content_type = big.content_type;
      s.body = big.body;
    }
    if (Status st = store_->PutResponse(key, s); !st.ok()) {
      // Kept in memory instead (a retry must still not run it again), written when it can be.
      MutexLock l(mu_);
      if (unsaved_.size() < kMaxUnsavedRecords &&
          unsaved_bytes_ + s.body.size() <= kMaxUnsavedBytes) {
        unsaved_bytes_ += s.body.size();
        unsaved_[key] = s;
        have_unsaved_ = true;
        DSEC_LOG_ERROR("idempotency record kept in memory: error={}", st.ToString());
      } else {
        DSEC_LOG_ERROR("idempotency record lost: error={}", st.ToString());
      }
    } else if (have_unsaved_) {
      FlushUnsaved();  // the state DB takes writes again
    }
    // Big responses in a burst must not wait for the periodic prune to be bounded.
    if (since_prune_ += s.body.size(); since_prune_ > max_total_ / 8) Prune();
  }
  std::vector<std::function<void(http::HttpResponse)>> waiters;
  {
    MutexLock l(mu_);
    auto it = inflight_.find(key);
    if (it != inflight_.end()) {
      waiters = std::move(it->second.waiters);
      inflight_.erase(it);
    }
  }
  for (auto& w : waiters) {
    http::HttpResponse copy = r;
    copy.headers.emplace_back("Idempotent-Replay", "true");
    w(std::move(copy));
  }
}

void Idempotency::FlushUnsaved() {
  MutexLock l(mu_);
  for (auto it = unsaved_.begin(); it != unsaved_.end();) {
    if (!store_->PutResponse(it->first, it->second).ok()) return;
    unsaved_bytes_ -= it->second.body.size();
    it = unsaved_.erase(it);
  }
  have_unsaved_ = false;
}

void Idempotency::Prune() {
  if (have_unsaved_) FlushUnsaved();
  since_prune_ = 0;
  auto n = store_->PruneResponses(WallMs() - max_age_s_ * 1000, max_records_, max_total_);
  if (!n.ok()) DSEC_LOG_WARN("idempotency prune failed: error={}", n.status().ToString());
}

}  // namespace dsec::edge
