// Image importers: one archive stream in, one named image out.
//
// The stream may be gzip- or zstd-compressed (detected by its magic) and holds one of
//  - a root filesystem tar (one layer; `format=rootfs`);
//  - an OCI image layout (oci-layout, index.json, blobs/sha256/...; `format=oci`), as `umoci`,
//    `skopeo copy oci-archive:` or `docker save` since Docker 25 write it;
//  - a `docker save` archive (manifest.json with Config and Layers; `format=docker`).
// `format=auto` picks by the archive's top-level names. The decompressed archive is spooled to
// the store's tmp dir (bounded by max_archive_bytes: a zip bomb ends there), OCI and docker
// archives are unpacked there with the hardened extractor (nothing outside it can be written),
// every blob is checked against its sha256 digest, every layer against the config's diff_id,
// and each layer goes through LayerBuilder (whiteouts and opaque dirs per the OCI spec).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "images/store.h"

namespace dsec::images {

// Decompresses a gzip (any number of members) or zstd stream, or passes raw data through,
// choosing by the first bytes.
class Decoder {
 public:
  using Sink = std::function<Status(std::string_view)>;
  explicit Decoder(Sink sink);
  ~Decoder();
  Status Feed(std::string_view in);
  Status Finish();  // error if a compressed stream ended early
  const char* kind() const;
  // Whether a stream starting with `head` (its first 4 bytes, or all of a shorter one) is gzip
  // or zstd, as Feed would decide.
  static bool Compressed(std::string_view head);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ImportOptions {
  std::string name;                         // "name[:tag]"
  std::string format = "auto";              // auto | rootfs | oci | docker
  std::optional<LayerFormat> layer_format;  // none: the store's default
  std::string base;  // rootfs imports: "" or "host" (the layer goes on the host image)
  uint64_t max_archive_bytes = 32ull << 30;  // decompressed
  // false: the layers are stored but no image is added; Finish() returns what it would be
  // (the caller holds an ImageStore::Lease until it references the layers).
  bool add_image = true;
  bool skip_dev_nodes = false;  // see archive::TarExtractOptions
  std::string project;          // Image::project ("": every project's)
};

class Importer {
 public:
  static StatusOr<std::unique_ptr<Importer>> Start(ImageStore* store, ImportOptions opts);
  ~Importer();
  Status Feed(std::string_view data);
  // Instead of Feed: the whole archive is `size` bytes of the file `fd` from offset 0 (a body
  // the edge spooled). An uncompressed one is read in place rather than copied to the spool;
  // the caller keeps the file open and unchanged until Finish().
  Status FeedFile(int fd, uint64_t size);
  StatusOr<Image> Finish();

 private:
  struct Impl;
  explicit Importer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Imports a whole archive file (CLI-side tests and tools).
StatusOr<Image> ImportFile(ImageStore* store, const std::string& path, ImportOptions opts);

}  // namespace dsec::images
