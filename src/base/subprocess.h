// Running host tools (mkfs.erofs, mkfs.ext4): a host-side helper for the image store and the
// disk scratch.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec {

// Runs argv (argv[0] looked up on PATH) to completion with stdin from /dev/null and
// stdout/stderr captured (the last 400 bytes go into the error). A missing program is
// FailedPrecondition naming the Debian `package` that has it.
Status RunTool(const std::vector<std::string>& argv, std::string_view package);

}  // namespace dsec
