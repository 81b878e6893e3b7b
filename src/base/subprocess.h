// Running host tools (mkfs.erofs, mkfs.ext4) and attaching loop devices: host-side helpers for
// the image store and the disk scratch.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

// Runs argv (argv[0] looked up on PATH) to completion with stdin from /dev/null and
// stdout/stderr captured (the last 400 bytes go into the error). A missing program is
// FailedPrecondition naming the Debian `package` that has it.
Status RunTool(const std::vector<std::string>& argv, std::string_view package);

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
