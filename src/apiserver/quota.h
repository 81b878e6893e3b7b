// Quota chains (issue 37): limits on concurrent sandboxes, committed memory_mb, CPU caps and the
// create rate at each level of a chain, organisation -> project -> token, exact across any
// number of apiservers, and at well below one etcd write per create.
//
// Keys (all read by every apiserver from its one watch on /dsec/, through ClusterView):
//   /dsec/quotas/<level>           a level's limits (QuotaLimits); absent: no limit there
//   /dsec/quota-version/<level>    changed by every transaction that raises what the level has
//                                  handed out (holds), and by every change of its limits
//   /dsec/quota-holds/<apiserver>/<project>/<token>
//                                  what one apiserver may admit for that chain without asking
//                                  etcd (QuotaHold), under the apiserver's lease
//   /dsec/usage/<node>             what a node's sandboxes take, by project, token and the hold
//                                  they were admitted from (cluster::NodeUsage), no lease
//   /dsec/quota-want/<level>       asks the other apiservers for the room they hold unused
// Levels: "org", "project/<p>", "token/<p>/<name>".
//
// The scheme. What a level has taken is, on a view of etcd (a consistent prefix: the watch
// applies revisions in order): for every live hold in it, max(granted, what the nodes show of
// the sandboxes admitted from it), plus every sandbox the nodes show that came from no live
// hold. A hold's sandboxes are inside it while it lives, and counted by the nodes once it is
// gone, so none is counted twice or never. An apiserver admits a create from its own hold when
// granted - (shown + admitted and not yet shown) covers it: no etcd write. Otherwise it grows the
// hold by a block (a few creates' worth, never more than half of what is left) in one
// transaction that requires every level's version key to be what its view has and changes the
// limited levels' keys: two apiservers cannot both hand out the same room. "Not yet shown" ends
// when the node's published usage reaches the generation the create's answer named
// (Dsec-Usage-Gen); a create that failed ends at once; one whose answer never came after
// kUnknownOutcomeMs. A create is refused only when the level is full of what exists or is being
// made: when only other apiservers' unused room stands in the way, the apiserver asks for it
// (quota-want) and they shrink their holds there to what they cover at once; it waits for that
// (up to kWantWaitMs) before it decides. Idle holds shrink back to what they cover, and go when
// they cover nothing; an apiserver that dies loses its holds with its lease. Worst-case overshoot:
// none, but for (a) a create sent by an apiserver that dies and reaches its node more than the
// lease's TTL later, (b) a create whose answer was lost and that the node admits more than
// kUnknownOutcomeMs later, (c) creates made on an edge directly (its own token: an admin's way
// around), (d) limits set or lowered below what is already running (nothing is stopped; new creates
// wait). The create rate is a budget per second of wall clock (windows numbered ms / 1000): each
// hold carries the creates it may make in one window, granted by the same transactions.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "cluster/etcd.h"
#include "cluster/node_record.h"

namespace dsec::apiserver {

inline constexpr std::string_view kQuotasPrefix = "/dsec/quotas/";
inline constexpr std::string_view kQuotaVersionPrefix = "/dsec/quota-version/";
inline constexpr std::string_view kQuotaHoldsPrefix = "/dsec/quota-holds/";
// /dsec/quota-want/<level>: an apiserver that would refuse a create only because other
// apiservers' holds keep room they do not use asks them for it (under its lease).
inline constexpr std::string_view kQuotaWantPrefix = "/dsec/quota-want/";

// Unset: no limit at that level. A project's level may name a parent project: its chain goes
// through the parent's level (and the parent's parent...) before the organisation's, so a
// parent's limits hold its own sandboxes and its children's together.
struct QuotaLimits {
  std::optional<int64_t> sandboxes, memory_mb, cpu_milli, creates_per_s;
  std::string parent;  // a project ("" for none)
  bool limits() const { return sandboxes || memory_mb || cpu_milli || creates_per_s; }
  bool empty() const { return !limits() && parent.empty(); }
  // {"sandboxes": N|null, "memory_mb": N|null, "cpu": cores|null, "creates_per_s": N|null,
  //  "parent": "p"|null}
  Json ToJson() const;
  static StatusOr<QuotaLimits> FromJson(const Json& j);
  // A PATCH body over these: a number sets a limit, null removes it, absent keeps it
  // ("max_sandboxes" is another name of "sandboxes"). A PUT is a Patch over none.
  Status Patch(const Json& body);
};

struct Amount {
  int64_t sandboxes = 0, memory_mb = 0, cpu_milli = 0;
  Json ToJson() const;  // {"sandboxes", "memory_mb", "cpu"}
};

struct QuotaHold {
  std::string tag;  // "<apiserver>.<n>": the edges keep it with each sandbox admitted from it
  std::string project, owner;
  Amount granted;
  int64_t window = 0;   // the rate window (wall ms / 1000) `creates` is for
  int64_t creates = 0;  // creates it may make in that window
  std::string sig;      // (not stored) the chain's limits it was granted under
  Json ToJson() const;
  static StatusOr<QuotaHold> FromJson(std::string_view text);
};

// Whether `level` is a well-formed level name.
bool IsQuotaLevel(std::string_view level);

// A create refused by a quota: the JSON error (429 quota_exceeded) names the level.
struct QuotaRefusal {
  std::string level, what;  // what: "sandboxes", "memory_mb", "cpu" or "creates_per_s"
  int64_t limit = 0, usage = 0, asked = 0;
  std::string Message() const;
  Json ToJson() const;  // the whole error body
};

class Quotas {
 public:
  // `apiserver`: this apiserver's id in hold keys and tags (unique per process).
  Quotas(etcd::Client* etcd, std::string apiserver, int64_t lease_ttl_s = 10);
  ~Quotas();
  void Start();  // its lease (at the first hold) and the idle-hold return
  void Stop();   // revokes its lease: its holds go at once

  // The keys it keeps (ClusterView forwards them).
  static bool Owns(std::string_view key);
  void ApplyPut(const std::string& key, const std::string& value);
  void ApplyPutLocked(const std::string& key, const std::string& value) DSEC_REQUIRES(mu_);
  void ApplyDelete(const std::string& key);
  void Reset(const std::vector<etcd::KeyValue>& kvs);
  // The view has applied everything up to `revision`.
  void SetRevision(int64_t revision);
  // Waits until it has (false after timeout_ms).
  bool WaitRevision(int64_t revision, int64_t timeout_ms);

  // One admission: `header` goes to the node as Dsec-Quota ("" when no level of the chain has a
  // limit: nothing to hold), then Settle says how it ended.
  struct Ticket {
    uint64_t id = 0;  // 0: nothing to settle
    std::string header;
  };
  // `need`: what the create takes in all (count sandboxes); `count` creates for the rate.
  // A refusal is returned in `refused` (and the status is kOverCapacity); other errors are
  // 503s (etcd cannot be reached, or contention that did not settle).
  StatusOr<Ticket> Admit(const std::string& project, const std::string& owner, const Amount& need,
                         int64_t count, QuotaRefusal* refused);
  enum class Outcome { kFailed, kCreated, kUnknown };
  // kCreated: `node` answered it with Dsec-Usage-Gen `gen` (0: not said; the node's next
  // published usage counts).
  void Settle(uint64_t ticket, Outcome outcome, const std::string& node = "", int64_t gen = 0);

  // What a level's limits are, and what it has taken: sandboxes running (as the nodes say),
  // held (granted by holds beyond that), creates in this second.
  Json Report(const std::string& level) const;
  std::optional<QuotaLimits> Limits(const std::string& level) const;
  // A value for a level's version key no other write ever had (limits changes write one).
  std::string NewVersion();
  // The levels of a create by `owner` in `project`: "org", the project's ancestors (parents)
  // from the top, "project/<p>", "token/<p>/<owner>".
  std::vector<std::string> Chain(const std::string& project, const std::string& owner) const;

 private:
  struct Own {  // this apiserver's hold on one chain
    QuotaHold hold;
    std::string sig;  // the chain's limits it was granted under (LimitsSigLocked)
    bool in_etcd = false;
    Amount pending;            // admitted and not yet shown by a node
    int64_t creates_used = 0;  // in hold.window
    int64_t last_use_ms = 0;
    // Creates admitted from it in this second of wall clock, and in the one before.
    int64_t rate_second = 0, this_second_creates = 0, last_second_creates = 0;
    bool shrinking = false;  // ReturnIdle is writing it smaller: nothing is admitted from it
    bool pressed = false;    // another apiserver asked for room in one of its levels
  };
  struct Pending {
    std::string chain;  // "<project>/<owner>"
    Amount need;
    std::string node;  // "" until answered
    int64_t gen = 0;   // shown once the node's usage gen reaches it
    int64_t deadline_ms = 0;
  };
  struct Taken {
    Amount amount;
    int64_t creates = 0;
  };

  std::vector<std::string> ChainLocked(const std::string& project, const std::string& owner) const
      DSEC_REQUIRES(mu_);
  // The limits a hold was granted under (a generation of every level's limits, and the chain's
  // length): a hold granted under other limits is not admitted from without a look.
  std::string LimitsSigLocked(const std::vector<std::string>& chain) const DSEC_REQUIRES(mu_);
  bool InLevelLocked(const std::string& level, const std::string& project,
                     const std::string& owner) const DSEC_REQUIRES(mu_);
  // Adds (+1) or takes (-1) a node's usage entries to or from shown_.
  void ShowLocked(const std::string& node, int sign) DSEC_REQUIRES(mu_);
  // What the sandboxes admitted from `tag` take, as the nodes show them.
  Amount ShownLocked(const std::string& tag) const DSEC_REQUIRES(mu_);
  // What `level` has taken (the scheme above), with rate in `window`.
  Taken TakenLocked(const std::string& level, int64_t window) const DSEC_REQUIRES(mu_);
  // Admits from the own hold if it covers `need`; true if so.
  bool TryLocalLocked(Own& own, const std::vector<std::string>& chain, const Amount& need,
                      int64_t count, int64_t window) DSEC_REQUIRES(mu_);
  void ReleaseLocked(const Pending& p) DSEC_REQUIRES(mu_);
  void SettleShownLocked(const std::string& node, int64_t gen) DSEC_REQUIRES(mu_);
  // The lease of this apiserver's holds: a new one when there is none known alive.
  StatusOr<int64_t> EnsureLease();
  void LoseLeaseLocked(int64_t lease) DSEC_REQUIRES(mu_);
  // Refreshes the lease every tenth of its TTL (its own thread: ReturnIdle may wait).
  void KeepAlive();
  void Run();
  // Shrinks holds idle for kIdleMs, or in a level another apiserver asked room back at, to what
  // they cover; deletes the ones that cover nothing.
  void ReturnIdle();
  // The room the live holds in `level` (but `except_key`) keep beyond what their nodes show.
  Amount OthersSpareLocked(const std::string& level, const std::string& except_key) const
      DSEC_REQUIRES(mu_);

  etcd::Client* etcd_;
  const std::string apiserver_;
  const int64_t lease_ttl_s_;
  Mutex grow_mu_;  // one growing transaction at a time (taken before mu_)
  mutable Mutex mu_;
  CondVar cv_;  // revision_ moved
  int64_t revision_ DSEC_GUARDED_BY(mu_) = 0;
  std::map<std::string, QuotaLimits> limits_ DSEC_GUARDED_BY(mu_);  // by level
  std::map<std::string, std::string> versions_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, QuotaHold> holds_ DSEC_GUARDED_BY(mu_);  // every apiserver's, by key
  std::set<std::string> live_tags_ DSEC_GUARDED_BY(mu_);
  std::set<std::string> pressed_ DSEC_GUARDED_BY(mu_);  // levels others asked room back at
  std::map<std::string, cluster::NodeUsage> usage_ DSEC_GUARDED_BY(mu_);  // by node
  std::map<std::string, Amount> shown_ DSEC_GUARDED_BY(mu_);  // by hold tag, over usage_
  uint64_t limits_gen_ DSEC_GUARDED_BY(mu_) = 0;              // bumped by any limits change
  std::map<std::string, Own> own_ DSEC_GUARDED_BY(mu_);       // by chain
  std::map<uint64_t, Pending> pending_ DSEC_GUARDED_BY(mu_);
  uint64_t next_ticket_ DSEC_GUARDED_BY(mu_) = 1;
  uint64_t next_tag_ DSEC_GUARDED_BY(mu_) = 1;
  uint64_t next_version_ DSEC_GUARDED_BY(mu_) = 1;
  int64_t lease_ DSEC_GUARDED_BY(mu_) = 0;
  // Until when its holds may be admitted from: half the TTL past the last refresh asked.
  int64_t lease_ok_until_ms_ DSEC_GUARDED_BY(mu_) = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::thread keepalive_;
};

}  // namespace dsec::apiserver
