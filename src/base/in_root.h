// Paths inside a directory tree that someone else controls — a sandbox's root (the agent), an
// extraction target (archives), an image layer or an unpacked image archive (images), a
// sandbox's upper directories and mount targets (the container backend) — are looked up here
// and only here, with openat2 from a directory fd and a named policy. A symlink or ".."
// planted in the tree can never take a lookup outside it; what a policy does with them is
// the only difference between callers.
//
// No privileges of its own: lookups run with the caller's (fs) ids.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

enum class InRoot {
  // Symlinks (absolute or relative) and ".." are followed, clamped to the root as if it were
  // "/"; magic links (/proc/self/fd/N) are refused. A path means what it means to a process
  // chrooted there: the agent's file API, archives into and out of a sandbox.
  kFollowInside,
  // Clamped like kFollowInside, and a symlink anywhere in the path is ELOOP: trees whose links
  // are data, never directions (image layers, mount targets in a new root).
  kNoSymlinks,
  // No symlinks, and an absolute path or ".." that would climb above the root is EXDEV (an
  // error, not clamped): paths the edge built itself, where climbing means a bug or an attack.
  kBeneath,
  // kBeneath that also never crosses a mount point (EXDEV): a sandbox's writable layer, where
  // a mount placed over a subdirectory must not be mistaken for the layer.
  kBeneathOneMount,
};

// The openat2 RESOLVE_* flags of a policy.
uint64_t ResolveFlags(InRoot policy);

// How often a lookup is retried when openat2 answers EAGAIN (a rename anywhere raced a lookup
// that used ".."; a sandbox can rename in a loop) or EINTR.
inline constexpr int kInRootRetries = 64;

// openat2(root, path, flags | O_CLOEXEC, mode) under `policy`. "" and "." are root itself.
// Errors name the path: `open "a/b": ENOENT (...)`.
StatusOr<UniqueFd> OpenInRoot(int root, std::string_view path, int flags, InRoot policy,
                              mode_t mode = 0);

struct MakeDirsOptions {
  // Mode of each directory made (the caller's umask applies unless `owner` is set).
  mode_t mode = 0755;
  // Set: each directory is made 0700, then chowned to it and given `mode`, so it is never
  // visible with the wrong owner or mode. Needs `open_flags` that allow fchown (not O_PATH).
  std::optional<std::pair<uid_t, gid_t>> owner;
  // How every directory on the way, and the one returned, is opened (O_DIRECTORY is implied).
  int open_flags = O_PATH;
  // Gets the path of each directory this call made ("a/b" form, as given), outermost first.
  std::vector<std::string>* created = nullptr;
};

// mkdir -p of `comps` (path components: no "", "." or ".." expected, though ".." is harmless
// under the clamping policies) below root, returning the deepest directory's fd. Existing
// prefixes are looked up from the root under `policy`, so symlinks in them keep their meaning
// and stay inside; the deepest existing one is found by binary search (resolving a prefix
// resolves every shorter one), so a path of 2,000 components costs a dozen lookups, not 2,000
// of growing length. Directories made here are entered by name without following anything;
// one that appears meanwhile (a race) is looked up from the root again.
StatusOr<UniqueFd> MakeDirsInRoot(int root, const std::vector<std::string>& comps, InRoot policy,
                                  const MakeDirsOptions& opts = {});

// The first n components joined with '/' ("" for n == 0).
std::string JoinPathComponents(const std::vector<std::string>& comps, size_t n);

}  // namespace dsec
