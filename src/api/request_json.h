// What a mutating request's JSON body says of itself whichever route it is for: its
// "request_id" (the idempotency key a body may carry instead of the Idempotency-Key header).
// The edge's request dispatch (edge/api.cc) calls this before any handler runs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsec::api {

// The body's "request_id" (nullopt: none, null, or a body that is not a JSON object). A body
// that parses as JSON (or holds a NUL) but is not strict JSON (http::CheckStrictJson) is
// refused for every route; other malformed bodies are left for their handler to report.
// InvalidArgument for a "request_id" that is not a string or is empty.
StatusOr<std::optional<std::string>> BodyRequestId(std::string_view body);

}  // namespace dsec::api
