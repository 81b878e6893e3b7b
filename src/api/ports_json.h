// Signed port URLs as the REST API writes them (POST /v1/sandboxes/{id}/port-urls): the one
// place the request is parsed and the URL rendered. The edge's port handler
// (edge/api_ports.cc) signs the path; this layer knows no keys.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

inline constexpr int64_t kMaxPortUrlTtlS = 30 * 86400;

// {"port": 1-65535 (required), "ttl_s": 1-30 days (default an hour)}.
struct PortUrlRequest {
  uint16_t port = 0;
  int64_t ttl_s = 3600;
};
StatusOr<PortUrlRequest> ParsePortUrlRequest(std::string_view body);

// The answer: the signed path, when it expires, and the whole URL when the request came with a
// Host over TCP (empty: null).
struct PortUrl {
  uint16_t port = 0;
  std::string path;
  int64_t expires_at = 0;  // ms since the epoch
  std::string url;
};
Json ToJson(const PortUrl& u);

}  // namespace dsec::api
