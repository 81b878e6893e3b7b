// Images across a cluster (issue 38): what etcd holds about images and layers.
//
//   /dsec/images/<name:tag>  the image's record (ClusterImage), written by the node that made it
//                            (an import, build or snapshot through an apiserver); no lease: it
//                            lives until deleted. Names are the cluster's, one project each.
//   /dsec/layers/<node>      the layers a node can serve (LayerHolders), under the node's lease
//
// A layer travels as its blob: the EROFS image of the layer, named by the sha256 of that file
// (`blob`), which the node that made the image computed and wrote into the record. A node that
// lacks a layer fetches the blob from any holder and checks it against the record's digest
// before it uses it: a holder can serve nothing but the bytes the record names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::cluster {

inline constexpr std::string_view kImagesPrefix = "/dsec/images/";
inline constexpr std::string_view kLayersPrefix = "/dsec/layers/";

struct ClusterLayer {
  std::string digest;  // the layer's own ("sha256:<hex>" of its tar)
  uint64_t size = 0;   // bytes of file content
  std::string blob;    // "sha256:<hex>" of its EROFS image
  uint64_t blob_size = 0;
};

struct ClusterImage {
  std::string name;                  // "name:tag"
  std::string project;               // the only project that sees and uses it
  std::string base;                  // "host" or ""
  std::vector<ClusterLayer> layers;  // bottom first
  Json config = Json::object();      // as the image store keeps it (images::ConfigToJson)
  std::string source;                // "import" | "snapshot" | "build"
  int64_t created_at = 0;            // ms since the epoch
  std::string origin;                // the node that made it

  Json ToJson() const;
  // InvalidArgument for anything but a well-formed record (digests checked).
  static StatusOr<ClusterImage> FromJson(std::string_view text);
  uint64_t Size() const;  // its layers' blobs together
};

// What a node can serve: the digests (the layers' own) of the blobs it holds.
struct LayerHolders {
  std::vector<std::string> layers;  // sorted
  Json ToJson() const;
  static StatusOr<LayerHolders> FromJson(std::string_view text);
};

std::string ImageKey(std::string_view name);
std::string LayersKey(std::string_view node);

}  // namespace dsec::cluster
