// `dsec cp SRC DST`: copies files or directories between this machine and a sandbox (ID:PATH
// names a path in sandbox ID). Talks to the edge found through --url/DSEC_URL.
#pragma once

#include <string>

#include "cli/run.h"

namespace dsec::cli {

int Copy(const GlobalOptions& g, const std::string& src, const std::string& dst);

}  // namespace dsec::cli
