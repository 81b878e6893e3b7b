// Network namespaces with only loopback, for sandboxes with network mode "none".
//
// Creating a network namespace costs ~0.8 ms here and both creation and teardown serialize on
// the kernel's rtnl_lock / pernet_ops_rwsem, so they are pooled: created by the edge (owned by
// the initial user namespace, loopback brought up), handed to a sandbox, and recycled after
// the sandbox is gone. Code in a sandbox, even root in its user namespace, has no
// CAP_NET_ADMIN over such a namespace and cannot change its configuration; a namespace still
// holding TCP state (e.g. TIME_WAIT) when returned is closed instead of reused, so a later
// sandbox can always bind any port. (Per-namespace SNMP counters do carry over.)
// Thread safety: all methods are thread-safe. Privileges: CAP_SYS_ADMIN.
#pragma once

#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

// One descriptor per namespace, pooled or in use (a node holds thousands).
struct Netns {
  UniqueFd ns;
};

class NetnsPool {
 public:
  explicit NetnsPool(size_t max_idle) : max_idle_(max_idle) {}
  // A loopback-only namespace: from the pool, or newly made.
  StatusOr<Netns> Acquire();
  // Gives a namespace back once nothing runs in it any more.
  void Release(Netns ns);
  size_t idle() const;

  // Makes a new namespace with lo up, on a short-lived thread (no caller thread ever changes
  // namespace).
  static StatusOr<Netns> CreateLoopbackOnly();
  // True if the namespace has no TCP sockets (listening, connected or TIME_WAIT): its own
  // /proc/net/sockstat{,6}, read on a short-lived thread that joins it (O(1); /proc/net/tcp
  // would walk the host-wide TCP hash table).
  static bool IsQuiet(const Netns& ns);

 private:
  size_t max_idle_;
  mutable Mutex mu_;
  std::vector<Netns> idle_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::isolation
