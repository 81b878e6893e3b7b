// Captures a sandbox's writable layer (the upper dirs of its overlays) as an OCI layer tar
// stream: the inverse of LayerBuilder. overlayfs whiteouts (0/0 character devices) become
// ".wh.NAME" entries, opaque directories (trusted. or user.overlay.opaque = "y") a
// ".wh..wh..opq" entry; owners are mapped back from the sandbox's user namespace range; hard
// links inside the layer stay hard links; FIFOs, sockets and other devices are skipped.
//
// The tree is hostile (the sandbox wrote it), so it is walked by fds without following any
// symlink (openat O_NOFOLLOW beneath the directory fd of each level), and the sandbox is frozen
// by the caller while it runs. Paths are bounded (4096 bytes, 1024 levels).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec::images {

struct CaptureSource {
  int dirfd = -1;            // an upper dir (not owned)
  std::string prefix = "/";  // where it appears in the sandbox ("/" or an overlay's target)
};

struct CaptureOptions {
  uint32_t id_base = 0;  // host uid/gid of id 0 inside; ids outside the range become 65534
  // Absolute paths inside the sandbox left out with everything below them (control-plane files).
  std::vector<std::string> skip;
  // Directories whose contents are left out (mount points: /proc, /sys, /dev).
  std::vector<std::string> empty;
};

struct CaptureStats {
  uint64_t entries = 0, bytes = 0, skipped = 0, whiteouts = 0;
};

Status WriteLayerTar(const std::vector<CaptureSource>& sources, const CaptureOptions& opts,
                     const std::function<Status(std::string_view)>& sink, CaptureStats* stats);

}  // namespace dsec::images
