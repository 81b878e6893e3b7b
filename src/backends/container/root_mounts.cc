#include "backends/container/root_mounts.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "base/file_util.h"
#include "base/in_root.h"
#include "isolation/userns.h"

namespace dsec::backends::container {

StatusOr<std::vector<isolation::OverlaySpec>> MountLowers(const RootfsPlan& plan,
                                                          const RootSources& src, int userns_fd,
                                                          std::vector<UniqueFd>* mounts) {
  for (const PlannedLower& l : plan.lowers) {
    std::string path;
    int dirfd = AT_FDCWD;
    if (l.from == PlannedLower::From::kHostLayer) {
      const isolation::HostLayer& h = src.host.layers[l.index];
      if (h.mount)
        dirfd = h.mount->get();
      else
        path = h.host_path;
    } else {
      const images::LayerSource& ls = src.layers[l.index];
      if (ls.mount_fd >= 0) {
        dirfd = ls.mount_fd;
        path = l.subdir;
      } else {
        path = l.subdir.empty() ? ls.path : ls.path + "/" + l.subdir;
      }
    }
    StatusOr<UniqueFd> m = userns_fd >= 0 && l.idmap
                               ? isolation::MakeIdmappedMount(path, userns_fd, dirfd)
                               : isolation::MakeReadonlyBind(path, dirfd);
    if (!m.ok()) return m.status().WithContext("layer \"" + path + "\"");
    mounts->push_back(std::move(*m));
  }
  std::vector<isolation::OverlaySpec> overlays;
  for (const auto& o : plan.overlays) {
    isolation::OverlaySpec spec{o.target, {}};
    for (size_t i : o.lowers) spec.lower_fds.push_back(static_cast<int>(i));
    overlays.push_back(std::move(spec));
  }
  return overlays;
}

}  // namespace dsec::backends::container
