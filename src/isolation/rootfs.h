// Root filesystem of a sandbox, built inside the sandbox's fresh mount namespace by the agent
// before it serves ("InitInChild"), from a spec the edge computed ("InitFromParent" side is
// the container backend). Steps, in order:
//   1. private propagation for everything inherited from the host;
//   2. a size- and inode-limited tmpfs (the writable layer; its pages are charged to the
//      sandbox's memory cgroup) attached at a directory the edge made for this sandbox;
//   3. image layers arrive as detached mounts (idmapped when the sandbox has a user
//      namespace) and are attached inside that tmpfs; overlays stack them under per-overlay
//      upper/work dirs in the same tmpfs (one disk budget);
//   4. the root: an overlay (the first in the spec must target "/"; more may stack on
//      sub-paths), whose upper dir is given the spec's dirs, files and symlinks before the
//      mount (no copy-ups later);
//   5. minimal /dev (null zero full random urandom tty bound from the host; devpts with its own
//      pty maximum; shm; std fds), fresh /proc with the sandbox's own namespace limits
//      written, dangerous entries masked and /proc/sys read-only, no /sys;
//   6. pivot_root into it by fds and detach the old root.
// Every path inside the new root is resolved by base/in_root.h (InRoot::kNoSymlinks: openat2
// RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) and every mount is attached by fd,
// so a symlink planted in an image can never redirect a mount or a write onto the host. Privileges:
// CAP_SYS_ADMIN in the mount namespace's owning user namespace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/in_root.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

struct OverlaySpec {
  std::string target;          // absolute path inside the sandbox; "/" for the root
  std::vector<int> lower_fds;  // indices into the received fds; topmost layer first
};

struct SymlinkSpec {
  std::string path;    // absolute, inside the sandbox
  std::string target;  // link text
};

struct DirSpec {
  std::string path;
  uint32_t mode = 0755;
  uint32_t uid = 0, gid = 0;
  bool operator==(const DirSpec&) const = default;
};

struct FileSpec {
  std::string path;
  std::string content;
  uint32_t mode = 0644;
  uint32_t uid = 0, gid = 0;
  bool operator==(const FileSpec&) const = default;
};

struct RootfsSpec {
  uint64_t size_bytes = 256ull << 20;
  uint64_t inodes = 65536;
  bool userns = false;  // overlays need "userxattr" inside a user namespace
  std::vector<OverlaySpec> overlays;
  std::vector<SymlinkSpec> symlinks;
  std::vector<DirSpec> dirs;
  std::vector<FileSpec> files;
  // The most pseudo-terminals the sandbox's own devpts instance hands out (0: the kernel's
  // node-wide limit only). Every instance shares kernel.pty.max, so without this one sandbox
  // could take every pty of the node.
  uint32_t pty_max = 0;
  // Written under the sandbox's fresh /proc/sys before it is made read-only: limits of the
  // sandbox's own namespaces (e.g. "kernel/shm_rmid_forced" = "1" for its ipc namespace).
  // Paths are relative, made of [a-z0-9_/-] components without "." or "..".
  std::vector<std::pair<std::string, std::string>> sysctls;
  // /proc files ("meminfo") that get the detached mounts BuildRootfsAndPivot is given as
  // `proc_views` (isolation/proc_views.h), in that order, attached over the kernel's.
  std::vector<std::string> proc_views;
};

// Entries masked in the sandbox's /proc (bound over with /dev/null or an empty read-only
// tmpfs) and those made read-only.
const std::vector<std::string>& ProcMaskedPaths();
// Files of PID 1 (the agent, which builds the root) masked the same way.
const std::vector<std::string>& ProcAgentMaskedPaths();
const std::vector<std::string>& ProcReadonlyPaths();

// Builds the root per spec and pivots into it. `layer_fds` are the detached layer mounts,
// `mount_dir` an O_PATH fd of a host directory to attach the tmpfs on (private to this mount
// namespace). On return the caller's root and cwd are the sandbox's "/". With `writable`, the
// writable layer's tmpfs (its root holds up/<i>, the upper dir of overlay i) is kept open there,
// unreachable from inside the new root: the edge reads it through the agent for snapshots.
// With `disk` (a detached mount of a filesystem the edge made, see disk_image.h), that
// filesystem is the writable layer instead of a tmpfs; spec.size_bytes and inodes are then
// already its own.
Status BuildRootfsAndPivot(const RootfsSpec& spec, const std::vector<int>& layer_fds, int mount_dir,
                           UniqueFd* writable = nullptr, int disk = -1,
                           const std::vector<int>& proc_views = {});

// Opens the absolute `path` (no "." or "..") inside `root` (base/in_root.h, InRoot::kNoSymlinks).
// The plan's directories, files and symlinks under `root`, missing parents made 0755 root:
// an overlay's fresh upper dir before it is mounted (parents kBeneath: nothing can be in the
// way), or a booted microVM guest's root before anything of the user's ran (kFollowInside: the
// image's links mean what they mean inside). The last component is never followed; an
// existing file is truncated and rewritten, an existing directory gets the mode and owner.
Status WriteRootPlan(int root, const std::vector<DirSpec>& dirs, const std::vector<FileSpec>& files,
                     const std::vector<SymlinkSpec>& symlinks, InRoot parents);

StatusOr<UniqueFd> OpenSandboxPath(int root, const std::string& path, int flags, mode_t mode = 0);
// mkdir -p inside root without following symlinks; a symlink or non-directory in the way of
// the final component is replaced when `replace` is set (mount points such as /proc and /dev),
// an error otherwise. Returns an O_PATH fd of the directory.
StatusOr<UniqueFd> MakeDirInRoot(int root, const std::string& path, mode_t mode, uid_t uid,
                                 gid_t gid, bool replace);

}  // namespace dsec::isolation
