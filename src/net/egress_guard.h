// The second layer of a container sandbox's egress policy: cgroup BPF programs on the
// sandbox's cgroup2 directory that refuse, at connect() and at an unconnected UDP send, what
// the node's nftables table (ruleset.h) would refuse there for every policy: the sandbox range
// (other sandboxes and the node's gateway, but for DNS to the gateway over UDP port 53), the
// node's own addresses, link-local and metadata (169.254.0.0/16), multicast and reserved
// (224.0.0.0/3), private ranges (ruleset.h's `private`) unless one of the policy's rules names
// them, and every IPv6 destination but loopback and v4-mapped ones (checked as IPv4); in mode
// none (no network device) the kernel answers, and until its first policy everything but
// loopback is refused. The call fails with EPERM before a packet exists; a
// packet that gets past this (a raw socket, or a policy narrower than these, such as an
// allowlist's ports and domains) still meets the nftables layer, which decides. So a bug or a
// flush of one layer leaves the node's and the neighbours' addresses closed.
//
// Programs (BPF_PROG_TYPE_CGROUP_SOCK_ADDR: connect4, connect6, sendmsg4, sendmsg6) and maps
// are loaded once per edge:
//   - an LPM trie keyed {owner, destination}: owner 0 holds the node-wide verdicts (refuse,
//     refuse but DNS, private), a sandbox's own address holds the private networks its rules
//     name;
//   - cgroup storage per sandbox: {mode, its address, refusals, the next time one is logged};
//   - a node-wide refusal total, and a ring buffer of refusals (at most one per 10 s per
//     sandbox, burst 5) read by a thread of this guard into `on_denied`.
// After an edge restart the programs of the last edge are replaced (Attach). Counted refusals
// add to the sandbox's denied packets; they never reach the nftables counters.
//
// Thread-safe. Privileges: CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN (root); a cgroup2 directory
// per sandbox.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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

  // Attaches the programs to the sandbox's cgroup2 directory (an earlier edge's are replaced);
  // until Set, everything but loopback is refused.
  Status Attach(int cgroup_fd);
  // The sandbox's policy: `addr` its address (0 and mode none: it has no network device, and
  // nothing more is refused).
  Status Set(int cgroup_fd, uint32_t addr, const NetworkPolicy& p);
  // Drops what Set keeps for the sandbox (its cgroup's storage goes with the cgroup).
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
  UniqueFd trie_, storage_, total_, events_;
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
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsec::net
