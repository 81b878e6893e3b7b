#include "base/in_root.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/strings.h"
#include "sys/syscalls.h"

namespace dsec {

uint64_t ResolveFlags(InRoot policy) {
  switch (policy) {
    case InRoot::kFollowInside:
      return RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    case InRoot::kNoSymlinks:
      return RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    case InRoot::kBeneath:
      return RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    case InRoot::kBeneathOneMount:
      return RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  }
  return RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
}

StatusOr<UniqueFd> OpenInRoot(int root, std::string_view path, int flags, InRoot policy,
                              mode_t mode) {
  const std::string p = path.empty() ? std::string(".") : std::string(path);
  const uint64_t resolve = ResolveFlags(policy);
  for (int attempt = 0;; ++attempt) {
    int fd = sys::Openat2(root, p.c_str(), flags | O_CLOEXEC, mode, resolve);
    if (fd >= 0) return UniqueFd(fd);
    if ((errno == EAGAIN || errno == EINTR) && attempt < kInRootRetries) continue;
    return ErrnoError(StrCat({"open ", Quote(p)}));
  }
}

std::string JoinPathComponents(const std::vector<std::string>& comps, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < comps.size(); ++i) {
    if (i) out += '/';
    out += comps[i];
  }
  return out;
}

namespace {

// Makes comps[i] in `parent` and opens it; an empty fd (errno EEXIST) when something is
// there already.
StatusOr<UniqueFd> MakeOne(int parent, const std::string& name, const std::string& prefix,
                           const MakeDirsOptions& o) {
  if (mkdirat(parent, name.c_str(), o.owner ? 0700 : o.mode) < 0) {
    if (errno == EEXIST) return UniqueFd();
    return ErrnoError(StrCat({"mkdir ", Quote(prefix)}));
  }
  if (o.created) o.created->push_back(prefix);
  UniqueFd made(openat(parent, name.c_str(), o.open_flags | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!made) {
    // Replaced between mkdir and open: without an owner to set, look it up again like any
    // directory that appeared; with one, the directory made stays 0700 and the caller fails.
    if (!o.owner) return UniqueFd();
    return ErrnoError(StrCat({"open ", Quote(prefix)}));
  }
  if (o.owner &&
      (fchown(made.get(), o.owner->first, o.owner->second) < 0 || fchmod(made.get(), o.mode) < 0))
    return ErrnoError(StrCat({"chown/chmod ", Quote(prefix)}));
  return made;
}

}  // namespace

StatusOr<UniqueFd> MakeDirsInRoot(int root, const std::vector<std::string>& comps, InRoot policy,
                                  const MakeDirsOptions& o) {
  const int flags = o.open_flags | O_DIRECTORY;
  auto open_prefix = [&](size_t n) {
    return OpenInRoot(root, JoinPathComponents(comps, n), flags, policy);
  };
  StatusOr<UniqueFd> full = open_prefix(comps.size());
  if (full.ok() || full.status().error_number() != ENOENT) return full;
  DSEC_ASSIGN_OR_RETURN(UniqueFd cur, open_prefix(0));
  size_t lo = 0, hi = comps.size();  // prefix lo exists, prefix hi does not
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    StatusOr<UniqueFd> m = open_prefix(mid);
    if (m.ok()) {
      lo = mid;
      cur = std::move(m).value();
    } else if (m.status().error_number() == ENOENT) {
      hi = mid;
    } else {
      return m.status();
    }
  }
  // Below a directory made here nothing exists yet, so the next one is made directly;
  // anything found in the way after all is looked up from the root.
  for (size_t i = lo; i < comps.size(); ++i) {
    const std::string prefix = JoinPathComponents(comps, i + 1);
    DSEC_ASSIGN_OR_RETURN(UniqueFd next, MakeOne(cur.get(), comps[i], prefix, o));
    if (!next) {
      DSEC_ASSIGN_OR_RETURN(next, open_prefix(i + 1));
    }
    cur = std::move(next);
  }
  return cur;
}

}  // namespace dsec
