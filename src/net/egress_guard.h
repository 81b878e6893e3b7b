// The second layer of a container sandbox's egress policy: cgroup BPF programs that refuse,
// at connect() and at an unconnected UDP send, what the node's nftables table (ruleset.h)
// refuses there for every policy: the sandbox range (other sandboxes and the node's gateway,
// but DNS to the gateway over UDP port 53), the node's own addresses, link-local and metadata
// (169.254.0.0/16), multicast and reserved (224.0.0.0/3), private ranges (ruleset.h's
// `private`) unless one of the policy's rules names them, and every IPv6 destination but
// loopback and v4-mapped ones (checked as IPv4). In mode none (no network device) the kernel
// answers; between Attach and the first Set everything but loopback is refused. The call fails
// with EPERM before a packet exists; a packet that gets past this (a raw socket, or a policy
// narrower than these: an allowlist's ports and domains) still meets the nftables layer, which
// decides. So a bug or a flush of one layer leaves the node's and the neighbours' addresses
// closed.
//
// Programs (BPF_PROG_TYPE_CGROUP_SOCK_ADDR: connect4, connect6, sendmsg4, sendmsg6) and maps
// are loaded once per edge, and attached once to the sandboxes' parent cgroup (the first
// Attach under it; an earlier edge's programs there are replaced); a program finds the
// caller's sandbox as its cgroup ancestor at the sandboxes' depth. So a sandbox costs one map
// update, not four attachments. Maps:
//   - an LPM trie keyed {owner, destination}: owner 0 holds the node-wide verdicts (refuse,
//     refuse but DNS, private), a sandbox's own address holds the private networks its rules
//     name;
//   - slots by sandbox cgroup id: {mode, its address, refusals, the next time one is logged};
//     a process of no sandbox with a slot is left alone;
//   - the node's refusal total and the sandboxes' depth, and a ring buffer of refusals (at
//     most one per 10 s per sandbox, burst 5) read by a thread of this guard into `on_denied`.
// Refusals add to the sandbox's denied packets; they never reach the nftables counters.
//
// Thread-safe. Privileges: CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN (root); each sandbox in a
// cgroup2 directory of its own, two or more levels below the root, all at one depth.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "net/deny_log.h"
#include "net/policy.h"
#include "net/ruleset.h"

namespace dsec::net {

struct EgressGuardOptions {
  Ipv4Net range;                     // the sandbox range; its gateway answers DNS
  std::vector<uint32_t> node_addrs;  // the node's own addresses (host byte order)
  // Refusals, rate-limited per sandbox, on the guard's thread (src: the sandbox's address).
  std::function<void(const DeniedPacket&)> on_denied;
};

class EgressGuard {
 public:
  // Unimplemented if the kernel cannot (no cgroup BPF, no ring buffer, ...).
  static StatusOr<std::unique_ptr<EgressGuard>> Start(EgressGuardOptions o);
  ~EgressGuard();

  // Guards the sandbox in cgroup2 directory `cgroup_fd` (attaching the programs to its parent
  // first, if they are not there yet); until Set, everything but loopback is refused.
  Status Attach(int cgroup_fd);
  // The sandbox's policy: `addr` its address (0 and mode none: it has no network device, and
  // nothing more is refused).
  Status Set(int cgroup_fd, uint32_t addr, const NetworkPolicy& p);
  // Drops what Attach and Set keep for the sandbox.
  void Forget(int cgroup_fd);
  // Refusals of this sandbox's cgroup, and of all.
  uint64_t Denied(int cgroup_fd);
  uint64_t DeniedTotal();

 private:
  explicit EgressGuard(EgressGuardOptions o) : opts_(std::move(o)) {}
  Status Load();
  Status SetGlobal();
  void Loop();

  EgressGuardOptions opts_;
  UniqueFd trie_, slots_, node_, events_;
  UniqueFd progs_[4];
  uint32_t prog_ids_[4] = {};
  void* consumer_ = nullptr;  // the ring buffer's mappings
  void* producer_ = nullptr;
  size_t page_ = 4096, ring_size_ = 0;
  Mutex mu_;
  // Per cgroup id: the address and private networks Set put in the trie for it.
  struct Entry {
    uint32_t addr = 0;
    std::vector<Ipv4Net> allowed;
  };
  std::map<uint64_t, Entry> entries_ DSEC_GUARDED_BY(mu_);
  std::set<uint64_t> parents_ DSEC_GUARDED_BY(mu_);  // cgroup ids the programs are attached to
  uint32_t level_ DSEC_GUARDED_BY(mu_) = 0;          // the sandboxes' depth
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsec::net
