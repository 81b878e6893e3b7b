// The jail of a helper process the edge runs on a sandbox's behalf (QEMU for a microVM; lxcfs
// for every sandbox's /proc views): everything it is confined by is one JailSpec, the list a
// reviewer reads (as Firecracker's jailer is for its VMM), and SpawnJailed the one place that
// applies it. The process starts with clone3 (its pidfd taken atomically, its namespaces made
// in the same call), waits until the edge has put it where it belongs (before_exec: its
// cgroup), then in this order: its descriptor map (everything else closed), its minimal root
// (a read-only tmpfs holding only the listed host paths, read-only, and a /proc of its own pid
// namespace), a session of its own, its rlimits, its credentials, no_new_privs, exec.
//
// Privileges: CAP_SYS_ADMIN (namespaces, mounts), CAP_SETUID/SETGID for the credentials.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/pidfd.h"
#include "base/status.h"

namespace dsec::isolation {

struct JailSpec {
  std::string exe;                // absolute path, as the jail's root shows it
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // complete ("K=V")

  // Its descriptors: {target, source} (0, 1 and 2 included); every other one is closed.
  std::vector<std::pair<int, int>> fds;

  // CLONE_NEW* flags of namespaces of its own. With CLONE_NEWNS it gets the minimal root
  // below; with CLONE_NEWNET it reaches no network at all (only inherited sockets).
  int namespaces = 0;
  // The minimal root (CLONE_NEWNS): built on top of `root_at` (an existing directory; the
  // mount is seen in the jail's mount namespace only), an empty tmpfs made read-only that
  // holds these host paths bind-mounted read-only, nosuid, nodev, each at its own path
  // (directories or files; paths that do not exist are skipped)...
  std::string root_at;
  std::vector<std::string> ro_paths;
  // ...these device nodes (bind-mounted read-write, nosuid)...
  std::vector<std::string> devices;
  // ...and, with CLONE_NEWPID, a /proc of its own pid namespace (its own processes only).
  bool proc = false;

  std::vector<std::pair<int, rlim_t>> rlimits;  // each set as soft = hard
  // Credentials; unset: keeps the edge's.
  std::optional<uid_t> uid;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary (e.g. /dev/kvm's group)
  bool no_new_privs = true;

  // Runs in the edge once the process exists and before it runs anything (it waits): put it
  // in its cgroup. An error kills it.
  std::function<Status(pid_t)> before_exec;
};

// The absolute path execve runs for `name`: itself when absolute, else found on PATH.
StatusOr<std::string> FindExecutable(const std::string& name);

// Starts the jailed process (default signal dispositions, nothing blocked). Its pidfd names the
// host pid; the caller reaps it.
StatusOr<PidFd> SpawnJailed(const JailSpec& spec);

}  // namespace dsec::isolation
