// Images as the REST API writes them (/v1/images, snapshot and fork): the one place their
// records are rendered and the snapshot and fork bodies parsed. The edge's image handlers
// (edge/api_images.cc) fill ImageRecord from their image store; this layer knows no store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

// One image as GET /v1/images/{name} shows it.
struct ImageRecord {
  struct Layer {
    std::string digest;
    uint64_t size = 0;
    std::string format;  // "dir" | "erofs"
  };
  std::string name;
  std::string base;  // "host" or "" (none: null)
  std::vector<Layer> layers;
  std::vector<std::string> env;  // "K=V"
  std::string workdir, user;
  std::vector<std::string> entrypoint, cmd;
  uint64_t size = 0;
  std::string source;
  int64_t created_at = 0;  // ms since the epoch
  int in_use = 0;          // sandboxes using it now
};
Json ToJson(const ImageRecord& img);
// The built-in "host" image.
Json HostImageJson();
// The answer of GET /v1/images: {"images": [host, then `imgs`...]}.
Json ImageListJson(const std::vector<ImageRecord>& imgs);

// POST /v1/sandboxes/{id}/snapshot.
struct SnapshotRequest {
  std::string image;  // as given (not normalized)
  bool keep_setuid = false;
};
StatusOr<SnapshotRequest> ParseSnapshotRequest(std::string_view body);

// POST /v1/sandboxes/{id}/fork: `max_count` bounds "count".
struct ForkRequest {
  int count = 1;
  bool keep_setuid = false;
  // The running machine too (memory, processes): a microVM's; its files are in its memory.
  bool memory = false;
};
StatusOr<ForkRequest> ParseForkRequest(std::string_view body, int max_count);

}  // namespace dsec::api
