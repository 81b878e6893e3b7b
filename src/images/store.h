// The edge's image store (issue 5): content-addressed read-only layers and named images, in
// <state_dir>/images, shared by every sandbox of the node.
//
//   images/index.json             images (name -> layers + config) and who holds which layers
//   images/layers/<hex>/          a directory layer: the layer's tree, overlayfs-ready
//   images/layers/<hex>.erofs     an EROFS layer, mounted read-only through a loop device
//   images/tmp/                   layers and uploads being made (removed at open)
//
// A layer is named by the sha256 of its uncompressed OCI layer tar (the OCI "diff_id"), so the
// same layer imported twice, or by two images, is stored once. Layers arrive as tar streams
// (LayerBuilder): OCI whiteouts become overlayfs whiteouts (images/oci_whiteouts.h, a hook of
// the tar extractor), owners and modes are kept, and nothing can be written outside the new
// layer's directory (archive/tar.h, image_layer mode).
//
// An image is an ordered list of layers (bottom first) on a base: "host" (the built-in host
// image below them) or "" (the layers are the whole root filesystem), plus a config (env,
// workdir, user, entrypoint, cmd). Layers are referenced by images and by holders (a sandbox id
// that was created from them): a layer is removed only by Collect(), and only once nothing
// references it and no import is in progress.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::images {

struct ImageConfig {
  std::vector<std::string> env;  // "K=V"
  std::string workdir;
  std::string user;
  std::vector<std::string> entrypoint, cmd;
};

// How a layer is stored: a directory tree, or an EROFS image mounted read-only.
enum class LayerFormat : unsigned char { kDir, kErofs };
std::string_view LayerFormatName(LayerFormat f);  // "dir", "erofs"
// InvalidArgument naming the choices for anything else.
StatusOr<LayerFormat> ParseLayerFormat(std::string_view s);

struct LayerInfo {
  std::string digest;  // "sha256:<hex>" of the uncompressed layer tar
  uint64_t size = 0;   // bytes of file content in the layer
  LayerFormat format = LayerFormat::kDir;
  // The layer as nodes pass it between them (Blob): its EROFS image's "sha256:<hex>" and size;
  // "" until first asked for.
  std::string blob;
  uint64_t blob_size = 0;
};

struct Image {
  std::string name;                 // "name:tag"
  std::string base;                 // "host" or "" (none)
  std::vector<std::string> layers;  // digests, bottom first
  ImageConfig config;
  std::string source;      // "import" | "snapshot" | "build"
  int64_t created_at = 0;  // ms since the epoch
  // The project whose snapshot made it (a cluster's); "" for one every project may use (an
  // import or build on the node, a snapshot through no project). Names are node-wide.
  std::string project;
  // A node's copy of a cluster's image (fetched from a peer; the cluster's record is the
  // original): dropped when the record goes, or when the layer cache needs the room.
  bool cached = false;
  // Made on this node and published to a cluster (its record there is its truth).
  bool published = false;
};

Json ConfigToJson(const ImageConfig& c);
ImageConfig ConfigFromJson(const Json& j);
// "sha256:" and 64 lowercase hex digits.
bool ValidDigest(const std::string& d);

// A resolved stack for one sandbox: the base, the layers bottom first, the merged config.
struct Stack {
  std::string base;
  std::vector<LayerInfo> layers;
  ImageConfig config;
};

// A layer ready to be stacked: a host directory, or a subtree of a detached read-only mount
// (EROFS) the store holds open for as long as the store lives.
struct LayerSource {
  std::string path;   // absolute host path (dir layers) or "." (erofs: the mount's root)
  int mount_fd = -1;  // erofs: the detached mount; path is relative to it
};

struct StoreOptions {
  std::string root;  // <state_dir>/images
  LayerFormat default_format = LayerFormat::kDir;
  uint64_t max_layer_bytes = 16ull << 30;
  uint64_t max_layer_entries = 2'000'000;
  std::string mkfs_erofs = "mkfs.erofs";
};

// "name" or "name:tag" -> "name:tag" (tag "latest" by default). Names: [a-z0-9][a-z0-9._-]*
// (at most 128), tags [A-Za-z0-9._-]+ (at most 128). "host" is the built-in image.
StatusOr<std::string> NormalizeName(std::string_view name);

class ImageStore;

// Receives one layer tar stream (uncompressed), hashing and extracting it as it comes.
class LayerBuilder {
 public:
  ~LayerBuilder();
  Status Feed(std::string_view data);
  // Completes the layer: verifies `expect_digest` when given, stores it under its digest (or
  // finds it already stored) in `format` ("" = the store's default).
  StatusOr<LayerInfo> Commit(const std::string& expect_digest = "",
                             std::optional<LayerFormat> format = std::nullopt);
  uint64_t bytes_in() const { return bytes_in_; }

 private:
  friend class ImageStore;
  struct Impl;
  explicit LayerBuilder(ImageStore* store);
  ImageStore* store_;
  std::unique_ptr<Impl> impl_;
  uint64_t bytes_in_ = 0;
  bool done_ = false;
};

class ImageStore {
 public:
  static StatusOr<std::unique_ptr<ImageStore>> Open(StoreOptions opts);
  ~ImageStore();

  const StoreOptions& options() const { return opts_; }

  // While an Import lease is held, Collect() removes nothing (a layer just committed is not
  // referenced by any image yet).
  class Lease {
   public:
    explicit Lease(ImageStore* s);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    ImageStore* s_;
  };

  // skip_dev_nodes: see archive::TarExtractOptions.
  StatusOr<std::unique_ptr<LayerBuilder>> NewLayer(bool skip_dev_nodes = false);
  StatusOr<LayerInfo> GetLayer(const std::string& digest);

  // The layer as one file that can be checked by its digest, as nodes pass layers between
  // them: its EROFS image (made once for a directory layer) with `blob` and `blob_size` set
  // (hashed once, then kept in the index). NotFound for a layer the store does not have.
  StatusOr<LayerInfo> Blob(const std::string& digest);
  std::string BlobPath(const LayerInfo& layer) const;  // (after Blob)
  // Adds a layer received as its blob: `file` (an EROFS image whose sha256 the caller checked
  // against info.blob) is moved into the store as an EROFS layer named info.digest.
  StatusOr<LayerInfo> AddBlobLayer(const std::string& file, LayerInfo info);
  // The layers whose blob is known (what this node can serve to others).
  std::vector<LayerInfo> BlobLayers();
  // Whether any holder (sandbox) uses the layer.
  bool Held(const std::string& digest);

  // Adds the image `img.name` (its layers must exist). An existing name is AlreadyExists
  // unless `replace`.
  Status PutImage(Image img, bool replace = false);
  StatusOr<Image> GetImage(const std::string& name);
  // Marks the image as made here and published to a cluster (Image::published).
  Status SetPublished(const std::string& name);
  std::vector<Image> ListImages();
  // Removes the name; its layers stay while other images or holders reference them.
  Status DeleteImage(const std::string& name);
  // How many holders (sandboxes) use any of the image's layers.
  int InUse(const Image& img);
  uint64_t ImageSize(const Image& img);

  // Resolves images stacked in order (the first one's base is the stack's; later ones must
  // have no base, or the same one) and records `holder` as using their layers. "host" may come
  // first; "sha256:<hex>" entries name single layers.
  StatusOr<Stack> Acquire(const std::vector<std::string>& names, const std::string& holder);
  // Records holder for exactly these layers (a snapshot's fork, an adopted sandbox).
  Status Hold(const std::string& holder, const std::vector<std::string>& digests);
  void Release(const std::string& holder);
  // Drops every holder not in `alive` (sandboxes that are gone after a restart).
  void RetainHolders(const std::set<std::string>& alive);
  std::vector<std::string> HeldBy(const std::string& holder);
  std::vector<std::string> HolderNames();

  // Removes unreferenced layers; returns how many.
  StatusOr<int> Collect();

  // The layer as an EROFS image file (a directory layer's copy is made on first use): what a
  // microVM's guest mounts from a read-only block device.
  StatusOr<std::string> ErofsFile(const LayerInfo& layer);
  // A layer ready to be mounted (an EROFS one is mounted on first use).
  // With own_fs, a directory layer is given as an EROFS copy (made on first use): layers
  // stacked on the host image must not share a filesystem with the host's root.
  StatusOr<LayerSource> Source(const LayerInfo& layer, bool own_fs = false);
  std::string LayerDir(const std::string& digest) const;

  std::string TempPath(const std::string& what);  // a fresh name under images/tmp

 private:
  friend class LayerBuilder;
  explicit ImageStore(StoreOptions opts) : opts_(std::move(opts)) {}
  Status Load() DSEC_EXCLUDES(mu_);
  Status SaveLocked() DSEC_REQUIRES(mu_);
  bool ReferencedLocked(const std::string& digest) const DSEC_REQUIRES(mu_);
  StatusOr<LayerInfo> AddLayer(const std::string& tmp_dir, const std::string& digest, uint64_t size,
                               LayerFormat format);

  StoreOptions opts_;
  Mutex mu_;
  std::map<std::string, Image> images_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, LayerInfo> layers_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> holders_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<UniqueFd>> erofs_mounts_ DSEC_GUARDED_BY(mu_);
  // One lock per layer whose EROFS copy is being made: creates on other layers go on meanwhile.
  std::map<std::string, std::shared_ptr<Mutex>> erofs_builds_ DSEC_GUARDED_BY(mu_);
  int leases_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t tmp_seq_ DSEC_GUARDED_BY(mu_) = 0;
};

}  // namespace dsec::images
