// Host uid/gid ranges for user namespaces, one allocator that every edge (and `dsec run`) on a
// host shares without talking to the others.
//
// Range N (host ids [base + N * size, base + (N + 1) * size)) is leased by an open file
// description lock (F_OFD_SETLK, a write lock on byte N) of one host-wide lock file. A lease
// is held by whichever descriptors share that open file description: the edge's while it
// creates the sandbox, then the sandbox's agent's (it receives the descriptor at setup and
// keeps it for its whole life). So a lease
//  - outlives a crashed edge (its sandboxes keep running with their ids; the next edge
//    re-adopts them and records their slots from its state DB),
//  - ends by itself when the sandbox's agent is gone (the kernel drops the lock with the last
//    descriptor), whoever owned it: nothing has to be reclaimed from dead edges by hand,
//  - is never granted twice: another edge's (or this edge's) attempt on a held byte fails.
// Two edges on one host therefore never give sandboxes the same host ids, so the per-user
// budgets the kernel keeps by host uid (pipe buffers, the user namespace owner's counts)
// are never shared between them.
//
// Thread-safe. Privileges: root (the lock file lives in a root-only directory).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

struct UidRangeOptions {
  // Host-wide: every edge on the host must use the same file. /run is a tmpfs, so leases do
  // not survive a reboot (nor does any process that used them).
  std::string lock_file = "/run/dsec/uid-ranges.lock";
  uint32_t base = 1u << 28;  // first host id of range 0
  uint32_t count = 8192;     // ranges
  uint32_t size = 65536;     // ids per range
};

struct UidLease {
  uint32_t slot = 0;
  uint32_t first_id = 0;  // host uid/gid of id 0 inside
  // Holds the lock: hand it to the process that keeps the range in use (or keep it).
  UniqueFd fd;
};

class UidRangeAllocator {
 public:
  static StatusOr<std::unique_ptr<UidRangeAllocator>> Open(const UidRangeOptions& opts);

  // A free range, locked with a new open file description. ResourceExhausted when every range
  // is leased (by this process or any other).
  StatusOr<UidLease> Acquire();
  // Records a range that a live sandbox already uses (re-adoption). If nobody holds its lock
  // (a sandbox made before leases existed), it is locked now and the returned fd holds it;
  // otherwise the fd is invalid (the sandbox's agent holds the lease).
  StatusOr<UniqueFd> Claim(uint32_t slot);
  // A read-only lease of `slot` for a process that must not write the lock file (QEMU): a new
  // O_RDONLY open file description holding a read lock on the slot's byte, which, like the
  // write lock, every other Acquire and Claim fails on. `held` (this slot's lease) is
  // downgraded to a read lock first and may be closed afterwards. The holder can still take
  // read locks on other bytes (a lock file per slot would be the fix); it cannot write.
  StatusOr<UniqueFd> ShareReadOnly(uint32_t slot, const UniqueFd& held) const;
  // This process no longer uses the range (its sandbox is gone); the lock goes with the
  // descriptors that hold it.
  void Release(uint32_t slot);
  // True if some process holds slot's lock (for tests and diagnostics).
  StatusOr<bool> Held(uint32_t slot) const;

  const UidRangeOptions& options() const { return opts_; }
  uint32_t FirstId(uint32_t slot) const { return opts_.base + slot * opts_.size; }

 private:
  explicit UidRangeAllocator(UidRangeOptions opts)
      : opts_(std::move(opts)), used_(opts_.count, false) {}
  StatusOr<UniqueFd> OpenLockFile() const;
  StatusOr<UniqueFd> TryLock(uint32_t slot) const;

  UidRangeOptions opts_;
  Mutex mu_;
  std::vector<bool> used_ DSEC_GUARDED_BY(mu_);  // ranges this process's sandboxes use
  uint32_t next_ DSEC_GUARDED_BY(mu_) = 0;       // rotates, so a freed range is not reused at once
};

}  // namespace dsec::isolation
