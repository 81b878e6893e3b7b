// The container kind's side of a root filesystem plan (backends/rootfs_plan.h): what the plan
// needs to know of the host image and the image layers (read from them), and the plan's lowers
// as detached read-only mounts, idmapped into the sandbox's id range where the plan says, for
// the agent to stack into overlays.
#pragma once

#include <vector>

#include "backends/rootfs_plan.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolation/host_image.h"
#include "isolation/rootfs.h"

namespace dsec::backends::container {

// The host image and image layers a root is made of, and what its plan needs to know of them.
struct RootSources {
  isolation::HostImage host;
  std::vector<images::LayerSource> layers;  // bottom first, as the stack
  RootfsInputs inputs;                      // the image part filled in
};

// `host`: the host image, when the stack starts from it (moved into the result).
StatusOr<RootSources> GatherRootSources(const images::Stack& stack, isolation::HostImage host,
                                        images::ImageStore* store);

// Mounts the plan's lowers (detached; idmapped into the sandbox's range where the plan says,
// when there is a user namespace: userns_fd >= 0) into *mounts, and returns the overlays
// indexing them.
StatusOr<std::vector<isolation::OverlaySpec>> MountLowers(const RootfsPlan& plan,
                                                          const RootSources& src, int userns_fd,
                                                          std::vector<UniqueFd>* mounts);

}  // namespace dsec::backends::container
