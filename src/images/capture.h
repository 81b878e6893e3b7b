// Captures a sandbox's writable layer (the upper dirs of its overlays) as an OCI layer tar
// stream: the inverse of LayerBuilder. overlayfs whiteouts (0/0 character devices) become
// ".wh.NAME" entries, opaque directories (trusted. or user.overlay.opaque = "y") a
// ".wh..wh..opq" entry; owners are mapped back from the sandbox's user namespace range; hard
// links inside the layer stay hard links; FIFOs, sockets and other devices are skipped.
// Files with holes become PAX sparse entries (format 1.0, as GNU tar writes them): only their
// data regions (SEEK_DATA/SEEK_HOLE) are read and written, so a sandbox's sparse files cost
// the layer (and the freeze) what they store, not their size. setuid/setgid bits are dropped
// from regular files unless keep_setuid: code in a sandbox made them, and a snapshot must not
// carry a setuid-root file onto the host's disk (or into every later sandbox) by default.
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
  bool keep_setuid = false;
  // Bound on the files' sizes counted with their holes (hard links once): what a reader of the
  // layer that does not know holes (an EROFS copy, an export) would have to go through. Past
  // it the capture stops with TooLarge. 0: none.
  uint64_t max_apparent_bytes = 0;
};

struct CaptureStats {
  uint64_t entries = 0, bytes = 0, skipped = 0, whiteouts = 0;
  uint64_t sparse_files = 0, hole_bytes = 0;  // files written as sparse entries, bytes not read
  uint64_t setuid_dropped = 0;
  uint64_t apparent_bytes = 0;  // regular files' sizes, holes included
};

Status WriteLayerTar(const std::vector<CaptureSource>& sources, const CaptureOptions& opts,
                     const std::function<Status(std::string_view)>& sink, CaptureStats* stats);

}  // namespace dsec::images
