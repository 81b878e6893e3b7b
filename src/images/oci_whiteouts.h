// The OCI image-spec's whiteouts, as a hook of the tar extractor (archive::EntryHook) for
// image layers: ".wh.NAME" becomes an overlayfs whiteout of NAME (a 0/0 character device; one
// for a file of this same layer replaces it, one for a directory is an error), and
// ".wh..wh..opq" makes its directory opaque (the overlay.opaque xattrs, trusted. and user.),
// so that it hides everything the layers below have there. A whiteout entry that is itself a
// directory, or names "", ".", ".." or another whiteout, is refused.
// Privileges: CAP_MKNOD (whiteouts) and CAP_SYS_ADMIN (trusted. xattrs).
#pragma once

#include <string>
#include <string_view>

#include "archive/tar.h"

namespace dsec::images {

class OciWhiteouts : public archive::EntryHook {
 public:
  bool Claims(std::string_view name) const override;
  Status Apply(int parent, const std::string& name, bool is_dir) override;
};

}  // namespace dsec::images
