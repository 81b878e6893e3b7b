#pragma once
// What an edge keeps about a running container sandbox so that the next edge can adopt it
// after a restart (stored with the sandbox's record, opaque to the manager). Pure: encoding
// and parsing only; ContainerInstance fills it in and acts on it.

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::backends::container {

struct AdoptionHandle {
  std::string secret;     // the agent's auth secret (never empty)
  int64_t uid_slot = -1;  // user-namespace slot, -1 without user namespaces
  // For snapshots; absent in handles of older edges (their sandboxes cannot snapshot).
  int layer_fd = -1;                       // the writable layer's fd number in the agent
  uint32_t id_base = 0;                    // first host id of the sandbox's id range
  bool disk_image = false;                 // the writable layer is a disk image
  std::vector<std::string> overlays;       // overlay mount targets inside the sandbox
  std::string base = "host";               // image stack: "host" or an image's base
  std::vector<std::string> layer_digests;  // its layers, bottom first
  // Its end of the node's sandbox network (net/node_network.h); 0 / empty: none.
  uint32_t net_addr = 0;
  std::string net_if;

  std::string Encode() const;
  // Unknown keys are ignored (a newer edge's handle); a missing or empty secret, or a field
  // of the wrong type, is an error.
  static StatusOr<AdoptionHandle> Parse(const std::string& text);
};

}  // namespace dsec::backends::container
