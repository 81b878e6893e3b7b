// Function calls as the REST API writes them (POST /v1/fncalls): the one place a call's body
// is parsed into a typed request for its runtime's pool (backends/pools/pool.h) and its result
// rendered. The edge's fncall handler (edge/api_fncall.cc) calls these.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backends/pools/pool.h"
#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

inline constexpr int64_t kMaxCallTimeoutMs = 600000;
inline constexpr uint64_t kDefaultCallOutput = 64 << 10;

// The node's bounds on a call (from its config).
struct FnCallLimits {
  uint64_t max_body_bytes = 0;    // "code" and "stdin" as sent (max_json_body_bytes)
  uint64_t max_output_bytes = 0;  // "max_output_bytes" at most
};

struct FnCallParams {
  std::string runtime;  // non-empty
  pools::CallRequest req;
  bool base64 = false;  // "encoding": "base64"
};
// InvalidArgument naming the field for a body that is not a valid call. "files" are relative
// paths without "." or ".." parts, with content a string or {"base64": ...}.
StatusOr<FnCallParams> ParseFnCallRequest(std::string_view body, const FnCallLimits& limits);

// The answer of a call of `runtime`: the exec result with its output, "runtime", "queue_ms".
Json FnCallResultJson(const pools::CallResult& r, bool base64, const std::string& runtime);

}  // namespace dsec::api
