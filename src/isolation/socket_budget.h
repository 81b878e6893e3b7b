// A per-sandbox budget of inet sockets, enforced by two cgroup BPF programs attached to the
// sandbox's cgroup2 directory (cgroup v2, or the cgroup2 mount of a v1 hybrid host):
//  - cgroup/sock_create refuses a new AF_INET/AF_INET6 socket (socket() fails EPERM) once the
//    sandbox holds its limit, and otherwise counts it (by socket cookie, in a node-wide table);
//  - cgroup/sock_release uncounts a counted socket when it goes.
// Why: the memory cgroup bounds socket buffers, but not all of them. The kernel always lets a
// TCP socket queue one segment past its cgroup's limit ("forced" charges), and the receive
// queue of a connection nobody accept()ed yet is charged to no cgroup at all. Thousands of
// never-read loopback connections thus held far more than a sandbox's memory limit and pushed
// the host's whole TCP stack into memory pressure. With the number of sockets bounded, what a
// sandbox can hold beyond its limit is bounded too. (Accepted sockets are not counted: each
// is the peer of a counted one or arrived through the edge's port proxy.)
// The counter of a sandbox lives in BPF cgroup storage shared by both programs; its limit is
// written once, right after attaching and before any process runs in the cgroup (a zero
// limit refuses every socket: fail closed).
// Thread-safe. Privileges: CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN (root).
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

class SocketBudget {
 public:
  // Loads the maps and programs once per edge; Unimplemented if the kernel cannot (no cgroup
  // BPF, no BPF_ATOMIC, ...). `max_tracked`: sockets counted node-wide at most (creates past
  // it are refused).
  static StatusOr<std::unique_ptr<SocketBudget>> Create(uint32_t max_tracked);

  // Attaches both programs to the cgroup2 directory `cgroup_fd` and sets its limit.
  Status Attach(int cgroup_fd, uint64_t limit) const;

 private:
  SocketBudget() = default;
  UniqueFd storage_, tracked_, create_prog_, release_prog_;
};

}  // namespace dsec::isolation
