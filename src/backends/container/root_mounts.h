// The container kind's side of a root filesystem plan (backends/rootfs_plan.h): the plan's
// lowers, from its sources (backends/root_sources.h), as detached read-only mounts, idmapped
// into the sandbox's id range where the plan says, for the agent to stack into overlays.
#pragma once

#include <vector>

#include "backends/root_sources.h"
#include "backends/rootfs_plan.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolation/host_image.h"
#include "isolation/rootfs.h"

namespace dsec::backends::container {

// Mounts the plan's lowers (detached; idmapped into the sandbox's range where the plan says,
// when there is a user namespace: userns_fd >= 0) into *mounts, and returns the overlays
// indexing them.
StatusOr<std::vector<isolation::OverlaySpec>> MountLowers(const RootfsPlan& plan,
                                                          const RootSources& src, int userns_fd,
                                                          std::vector<UniqueFd>* mounts);

}  // namespace dsec::backends::container
