#include "images/oci_whiteouts.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>

#include "base/strings.h"

namespace dsec::images {

namespace {

constexpr std::string_view kPrefix = ".wh.";
constexpr std::string_view kOpaque = ".wh..wh..opq";
// Replacing a file of this same layer races nothing but the layer's own entries: a few
// attempts are plenty.
constexpr int kMaxAttempts = 8;

Status MakeOpaque(int parent) {
  for (const char* key : {"trusted.overlay.opaque", "user.overlay.opaque"})
    if (fsetxattr(parent, key, "y", 1, 0) < 0) return ErrnoError(StrCat({"set ", key}));
  return OkStatus();
}

// Removes a non-directory at parent/name so the whiteout can take its place.
Status RemoveFile(int parent, const std::string& name) {
  if (unlinkat(parent, name.c_str(), 0) == 0 || errno == ENOENT) return OkStatus();
  struct stat st;
  if ((errno == EISDIR || errno == EPERM) &&
      fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
    return FailedPrecondition("a directory already exists at this path");
  return ErrnoError(StrCat({"unlinkat ", Quote(name)}));
}

}  // namespace

bool OciWhiteouts::Claims(std::string_view name) const { return StartsWith(name, kPrefix); }

Status OciWhiteouts::Apply(int parent, const std::string& name, bool is_dir) {
  if (is_dir) return InvalidArgument("whiteout is a directory");
  if (name == kOpaque) return MakeOpaque(parent);
  const std::string hidden = name.substr(kPrefix.size());
  if (hidden.empty() || hidden == "." || hidden == ".." || StartsWith(hidden, kPrefix))
    return InvalidArgument("bad whiteout name");
  for (int attempt = 0;; ++attempt) {
    if (mknodat(parent, hidden.c_str(), S_IFCHR | 0, makedev(0, 0)) == 0) return OkStatus();
    if (errno != EEXIST || attempt >= kMaxAttempts)
      return ErrnoError(StrCat({"mknod whiteout ", Quote(hidden)}));
    DSEC_RETURN_IF_ERROR(RemoveFile(parent, hidden));
  }
}

}  // namespace dsec::images
