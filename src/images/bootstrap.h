// A Debian root filesystem from Debian's mirror with mmdebstrap (issue 5's image builder):
// `mmdebstrap --variant=V --include=P SUITE - [MIRROR]` writes a tar to its stdout, which is
// handed on as it comes (to an Importer), while its progress lines go to a log.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec::images {

struct BootstrapOptions {
  std::string suite;                  // bookworm, trixie, ... ([a-z]+)
  std::string variant = "minbase";    // mmdebstrap --variant
  std::vector<std::string> packages;  // --include
  std::string mirror;                 // "" = mmdebstrap's default (deb.debian.org)
  std::string mmdebstrap = "mmdebstrap";
  int64_t deadline_ms = 0;  // MonotonicMs() after which it is killed (0: none)
};

// Validates a suite name and package names (Debian policy: [a-z0-9][a-z0-9+.-]+, optionally
// "=version" or "/release" after it), so nothing reaches the tool's command line as an option.
Status ValidateBootstrap(const BootstrapOptions& o);

// Runs mmdebstrap to completion. `on_tar` gets the uncompressed tar stream; `on_log` its
// stderr (progress, errors). Once *cancel is set it is killed (SIGKILL to its process group)
// and the result is Aborted; an error from on_tar kills it too. It dies with the caller.
Status Bootstrap(const BootstrapOptions& o, const std::function<Status(std::string_view)>& on_tar,
                 const std::function<void(std::string_view)>& on_log,
                 const std::atomic<bool>* cancel);

}  // namespace dsec::images
