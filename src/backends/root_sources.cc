#include "backends/root_sources.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "base/file_util.h"
#include "base/in_root.h"

namespace dsec::backends {

namespace {

// Opens a layer's root directory (for the lookups its facts need).
StatusOr<UniqueFd> OpenLayerRoot(const images::LayerSource& src, const std::string& digest) {
  UniqueFd root(src.mount_fd >= 0 ? fcntl(src.mount_fd, F_DUPFD_CLOEXEC, 3)
                                  : open(src.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return ErrnoError("open layer " + digest);
  return root;
}

// A file of the layer, if present (any type), with its text when it is a regular file.
void ReadLayerFile(int root, const char* file, bool* present, std::string* text) {
  struct stat st;
  if (fstatat(root, file, &st, AT_SYMLINK_NOFOLLOW) < 0) return;
  *present = true;  // a whiteout or anything else hides the layers below
  if (!S_ISREG(st.st_mode)) return;
  StatusOr<UniqueFd> f = OpenInRoot(root, file, O_RDONLY, InRoot::kNoSymlinks);
  if (!f.ok()) return;
  if (auto t = ReadFdToString(f->get(), file, 1 << 20); t.ok()) *text = *t;
}

StatusOr<LayerFacts> ReadLayerFacts(int root, const std::vector<isolation::OverlaySpec>& overlays,
                                    bool host_base) {
  LayerFacts f;
  for (size_t o = 1; o < overlays.size(); ++o) {
    struct stat st;
    f.has_overlay_dir.push_back(
        fstatat(root, overlays[o].target.substr(1).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode));
  }
  if (!host_base) {
    ReadLayerFile(root, "etc/passwd", &f.passwd_present, &f.passwd);
    ReadLayerFile(root, "etc/group", &f.group_present, &f.group);
  }
  return f;
}

}  // namespace

StatusOr<RootSources> GatherRootSources(const images::Stack& stack, isolation::HostImage host,
                                        images::ImageStore* store) {
  RootSources out;
  bool host_base = stack.base == "host";
  out.inputs.host_base = host_base;
  if (host_base) {
    out.host = std::move(host);
    for (const auto& layer : out.host.layers)
      out.inputs.host_lowers.push_back(layer.mount != nullptr);
    out.inputs.host_overlays = out.host.overlays;
  }
  std::vector<isolation::OverlaySpec> overlays =
      host_base ? out.host.overlays : std::vector<isolation::OverlaySpec>{{"/", {}}};
  for (const auto& layer : stack.layers) {
    DSEC_ASSIGN_OR_RETURN(images::LayerSource src, store->Source(layer, host_base));
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, OpenLayerRoot(src, layer.digest));
    DSEC_ASSIGN_OR_RETURN(LayerFacts facts, ReadLayerFacts(root.get(), overlays, host_base));
    out.layers.push_back(src);
    out.inputs.layers.push_back(std::move(facts));
  }
  return out;
}

}  // namespace dsec::backends
