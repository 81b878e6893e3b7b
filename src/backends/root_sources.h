// What a root filesystem plan (rootfs_plan.h) needs to know of the image it is made of, for
// every kind: the host image and the image's layers, and the facts read from them (the users
// and groups the image brings, which overlay targets exist). The container kind mounts the
// plan's lowers from these (container/root_mounts.h); a microVM boots the layers as block
// devices and writes the plan's files in the guest.
#pragma once

#include <vector>

#include "backends/rootfs_plan.h"
#include "base/status.h"
#include "images/store.h"
#include "isolation/host_image.h"

namespace dsec::backends {

// The host image and image layers a root is made of, and what its plan needs to know of them.
struct RootSources {
  isolation::HostImage host;
  std::vector<images::LayerSource> layers;  // bottom first, as the stack
  RootfsInputs inputs;                      // the image part filled in
};

// `host`: the host image, when the stack starts from it (moved into the result).
StatusOr<RootSources> GatherRootSources(const images::Stack& stack, isolation::HostImage host,
                                        images::ImageStore* store);

}  // namespace dsec::backends
