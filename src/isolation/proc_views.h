// Per-sandbox views of /proc files the kernel keeps node-wide — MemTotal and MemFree in
// /proc/meminfo, /proc/uptime — from LXCFS (Debian: lxcfs), a FUSE filesystem that answers each
// read with the figures of the reader's cgroup (that of its pid namespace's init: the sandbox's
// agent). The edge runs one lxcfs per state dir and watches it; a new sandbox gets read-only
// clones of its files, which the agent attaches over /proc/<name> (isolation/rootfs.h).
//
// lxcfs outlives an edge that leaves its sandboxes running (--persist): the next edge on the
// state dir adopts it (its pidfile and its mount). Should lxcfs die, the views would fail
// (ENOTCONN): `on_death` runs first thing, so that the caller detaches them in every sandbox
// (the kernel's files show again), and a new lxcfs serves sandboxes made from then on.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/pidfd.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

class ProcViews {
 public:
  struct Options {
    std::string dir;               // mount point "mnt", "lxcfs.pid", "lxcfs.log" (made 0700)
    std::string binary = "lxcfs";  // a name is looked up in PATH
    std::function<void()> on_death;
  };
  // The /proc files that get views, in the order of Clone()'s fds.
  static const std::vector<std::string>& Names();
  // Starts lxcfs (or adopts the one a previous edge left for its sandboxes) and waits until it
  // serves. NotFound when the binary is not installed.
  static StatusOr<std::unique_ptr<ProcViews>> Start(Options opts);
  // Stops watching; lxcfs keeps serving the sandboxes that use it (Stop() ends it).
  ~ProcViews();
  ProcViews(const ProcViews&) = delete;
  ProcViews& operator=(const ProcViews&) = delete;

  // Ends lxcfs and removes its mount: only when no sandbox uses the views any more.
  void Stop();
  // Read-only detached clones of Names()' files; an error while lxcfs is down.
  StatusOr<std::vector<UniqueFd>> Clone();
  pid_t pid();
  // "lxcfs pid N at DIR/mnt" or why there is none now.
  std::string Describe();

 private:
  explicit ProcViews(Options opts);
  Status Launch() DSEC_REQUIRES(mu_);  // a new lxcfs on a fresh mount
  bool Adopt() DSEC_REQUIRES(mu_);     // a live one from an earlier edge
  void Watch();

  const Options opts_;
  const std::string mnt_;
  Mutex mu_;
  PidFd lxcfs_ DSEC_GUARDED_BY(mu_);
  bool ours_ DSEC_GUARDED_BY(mu_) = false;  // our child (reaped by us) or adopted
  std::string down_ DSEC_GUARDED_BY(mu_);   // why there is no lxcfs now ("" when serving)
  UniqueFd stop_;                           // eventfd: ends Watch()
  std::thread watcher_;
};

}  // namespace dsec::isolation
