// Pieces shared by the cgroup drivers (not part of the public interface).
#pragma once

#include <sys/types.h>

#include <unistd.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation::internal {

// cgroup mounts found in /proc/self/mountinfo.
struct CgroupMounts {
  std::string v2;                         // cgroup2 mount point, empty if none
  std::map<std::string, std::string> v1;  // controller -> v1 mount point
};
CgroupMounts ParseCgroupMounts(const std::string& mountinfo);
StatusOr<CgroupMounts> DetectCgroupMounts();

// Value of "key N" in a flat-keyed file such as cgroup.events or memory.oom_control.
std::optional<uint64_t> FindKeyedValue(const std::string& content, const std::string& key);

// A cgroup2 directory: tracking, kill, freeze and cpu.stat. Used for the whole sandbox on pure
// v2, and for the cgroup2 side of the v1 hybrid.
class V2Dir {
 public:
  V2Dir(std::string path, bool use_cgroup_kill, bool plain = false)
      : path_(std::move(path)), use_kill_(use_cgroup_kill), plain_(plain) {}
  const std::string& path() const { return path_; }
  Status Create();  // mkdir path and path/user
  Status Open();    // for re-adoption: the directory must exist (no fd is kept)
  int fd() const { return fd_.get(); }
  void CloseFd() { fd_.Reset(); }
  Status Kill();
  Status SetFrozen(bool frozen);
  StatusOr<bool> IsFrozen() const;
  StatusOr<bool> IsPopulated() const;
  StatusOr<uint64_t> CpuUsageUs() const;
  Status Delegate(uid_t uid, gid_t gid);
  // Removes nested cgroups depth-first, then the directory itself.
  Status RemoveAll();

 private:
  std::string path_;
  bool use_kill_;
  bool plain_;
  UniqueFd fd_;
};

// Writes a cgroupfs control file with one write(2). `create` is for plain-directory test trees.
Status WriteControl(const std::string& path, const std::string& value, bool create = false);
// WriteControl unless the file already reads `value`. For the CPU bandwidth files: every write
// makes the kernel walk every task group on the host (tg_set_cfs_bandwidth), so a create
// that writes what is already there would cost O(live sandboxes).
Status WriteControlIfChanged(const std::string& path, const std::string& value,
                             bool create = false);
StatusOr<std::string> ReadControl(const std::string& path);
// Every pid in dir/cgroup.procs and nested cgroups (v1 or v2).
std::vector<pid_t> ListProcsRecursive(const std::string& dir);
// Child cgroups of a parent (names not starting with '.').
StatusOr<std::vector<std::string>> ListSandboxDirs(const std::string& parent);
// rmdir with retries while the kernel finishes releasing exited tasks (EBUSY).
Status RemoveCgroupDir(const std::string& path);
// Removes an edge's parent cgroup unless sandboxes (of another process on the same state dir)
// still use it; in use or missing is not an error.
Status RemoveParentDir(const std::string& path);
// Polls until `populated` returns false or ~2 s pass.
template <typename F>
bool WaitUntilEmpty(F populated);

template <typename F>
bool WaitUntilEmpty(F populated) {
  for (int i = 0; i < 400; ++i) {
    if (!populated()) return true;
    usleep(i < 20 ? 500 : 5000);
  }
  return !populated();
}
}  // namespace dsec::isolation::internal
