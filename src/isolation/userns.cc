#include "isolation/userns.h"

#include <fcntl.h>

#include "base/file_util.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

Status WriteIdMaps(pid_t pid, const UsernsMap& map) {
  std::string line = "0 " + std::to_string(map.host_base) + " " + std::to_string(map.size);
  std::string base = "/proc/" + std::to_string(pid);
  DSEC_RETURN_IF_ERROR(WriteStringToFile(base + "/uid_map", line));
  return WriteStringToFile(base + "/gid_map", line);
}

StatusOr<UniqueFd> OpenUserns(pid_t pid) {
  std::string p = "/proc/" + std::to_string(pid) + "/ns/user";
  UniqueFd fd(open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open \"" + p + "\"");
  return fd;
}

namespace {
StatusOr<UniqueFd> CloneTree(int dirfd, const std::string& path, mount_attr* attr) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (path.empty() ? AT_EMPTY_PATH : 0);
  UniqueFd fd(sys::OpenTree(dirfd, path.c_str(), flags));
  if (!fd) return ErrnoError("open_tree \"" + path + "\"");
  if (sys::MountSetattr(fd.get(), "", AT_EMPTY_PATH, attr) != 0)
    return ErrnoError("mount_setattr \"" + path + "\"");
  return fd;
}
}  // namespace

StatusOr<UniqueFd> MakeIdmappedMount(const std::string& path, int userns_fd, int dirfd) {
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.userns_fd = static_cast<uint64_t>(userns_fd);
  return CloneTree(dirfd, path, &attr);
}

StatusOr<UniqueFd> MakeReadonlyBind(const std::string& path, int dirfd) {
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  return CloneTree(dirfd, path, &attr);
}

}  // namespace dsec::isolation
