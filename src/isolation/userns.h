// User namespaces, host side: id maps for a sandbox's range and idmapped mounts of image
// layers, so files owned by host root appear owned by root inside the sandbox.
// Privileges: host root.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

// Inside ids [0, size) map to host ids [host_base, host_base + size).
struct UsernsMap {
  uint32_t host_base = 0;
  uint32_t size = 65536;
};

// Writes /proc/<pid>/{uid,gid}_map. setgroups stays allowed (a privileged writer).
Status WriteIdMaps(pid_t pid, const UsernsMap& map);
StatusOr<UniqueFd> OpenUserns(pid_t pid);
// A detached, read-only, nosuid, nodev clone of `path` (or, with an empty path, of the mount
// `dirfd` refers to) idmapped through the user namespace `userns_fd` (open_tree +
// mount_setattr). The receiver attaches it with move_mount.
StatusOr<UniqueFd> MakeIdmappedMount(const std::string& path, int userns_fd, int dirfd = AT_FDCWD);
// Same without idmapping: a detached read-only clone (used when userns is off).
StatusOr<UniqueFd> MakeReadonlyBind(const std::string& path, int dirfd = AT_FDCWD);

}  // namespace dsec::isolation
