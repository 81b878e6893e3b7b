// Idempotency keys (API.md): a mutating request carrying `request_id` (JSON body) or an
// `Idempotency-Key` header runs at most once per (caller, method, target, key). Its response is
// recorded in the state DB before the caller sees it; a retry with the same key and body gets
// the recorded response, a retry with another body gets 409, and a retry that arrives while
// the first is still running waits for it and gets the same answer.
//
// Not recorded: 429 and 503 (by contract "nothing was done, try again") and 401/403.
// A record the state DB cannot take (a full state disk) is kept in memory (bounded) and
// written later, so a retry is still answered from it rather than run again.
// Retention is bounded by count and age. A response larger than the record cap is replaced
// by a 409 that says so (the request did run; its output is too big to keep).
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "edge/state_store.h"
#include "http/server.h"

namespace dsec::edge {

class Idempotency {
 public:
  // max_total: the recorded bodies' total; the oldest records go first beyond it.
  Idempotency(StateStore* store, int64_t max_records, int64_t max_age_s, uint64_t max_body,
              uint64_t max_total);

  enum class Decision { kRun, kReplayed, kWaiting, kAbsent };
  // For a request with `key` (already scoped) and body hash `hash`: kRun (the caller must
  // call Finish with its response), kReplayed (`reply` was called with the recorded or a 409
  // response), or kWaiting (`reply` will be called when the first request finishes). With
  // run_if_new false (a replay-only probe: the apiserver asking whether a create it may have
  // forwarded before is here) a key seen nowhere is kAbsent and nothing is registered.
  Decision Begin(const std::string& key, const std::string& hash,
                 std::function<void(http::HttpResponse)> reply, bool run_if_new = true);
  // Records (when recordable) and wakes waiters. Call before sending `r` to the caller.
  void Finish(const std::string& key, const std::string& hash, const http::HttpResponse& r);
  void Prune();

  static bool Recordable(int status);
  // A 64-bit FNV-1a-style hash, hex: for request bodies and token fingerprints (not a secret
  // MAC). Its offset basis is 1469598103934665603, a digit short of FNV's own; it stays, since
  // recorded requests and fingerprints must hash alike across an upgrade.
  static std::string Hash(std::string_view data);

 private:
  struct InFlight {
    std::string hash;
    std::vector<std::function<void(http::HttpResponse)>> waiters;
  };
  http::HttpResponse Replay(const StoredResponse& r) const;
  static http::HttpResponse Mismatch();
  void FlushUnsaved();

  StateStore* store_;
  int64_t max_records_, max_age_s_;
  uint64_t max_body_, max_total_;
  std::atomic<uint64_t> since_prune_{0};  // bytes recorded since the last prune
  Mutex mu_;
  std::map<std::string, InFlight> inflight_ DSEC_GUARDED_BY(mu_);
  // Records the state DB refused, by key; written again by FlushUnsaved.
  std::map<std::string, StoredResponse> unsaved_ DSEC_GUARDED_BY(mu_);
  uint64_t unsaved_bytes_ DSEC_GUARDED_BY(mu_) = 0;
  std::atomic<bool> have_unsaved_{false};
};

}  // namespace dsec::edge
