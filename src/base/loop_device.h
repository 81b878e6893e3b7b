// Loop devices: a file attached as a block device, for the image store's EROFS layers and the
// sandboxes' disk images. Privileges: root (/dev/loop-control).
#pragma once

#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

struct LoopDevice {
  UniqueFd fd;      // the open /dev/loopN
  std::string dev;  // its path
};

// Attaches `file_fd` to a free loop device with LO_FLAGS_AUTOCLEAR: the device goes away with
// its last user (the mount made from it), so a crash leaves nothing behind once that goes.
// `direct_io` makes the device read its file with O_DIRECT, so the file's pages are not cached
// twice (once for the loop file, once for the filesystem on it).
StatusOr<LoopDevice> AttachLoopDevice(int file_fd, bool read_only, bool direct_io);

}  // namespace dsec
