#include "api/errors.h"

#include <cctype>

#include "base/json.h"

namespace dsec::api {

std::pair<int, std::string_view> HttpErrorFor(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return {400, "bad_request"};
    case StatusCode::kUnauthenticated:
      return {401, "unauthorized"};
    case StatusCode::kPermissionDenied:
      return {403, "forbidden"};
    case StatusCode::kNotFound:
      return {404, "not_found"};
    case StatusCode::kGone:
      return {410, "gone"};
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
      return {409, "conflict"};
    case StatusCode::kTooLarge:
      return {413, "too_large"};
    case StatusCode::kResourceExhausted:  // ENOSPC and the like inside the sandbox
    case StatusCode::kUnimplemented:
      return {422, "unprocessable"};
    case StatusCode::kOverCapacity:
      return {429, "over_capacity"};
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return {503, "unavailable"};
    default:
      return {500, "internal"};
  }
}

std::pair<int, std::string_view> HttpErrorFor(const Status& s) {
  if (s.error_number() != 0 && s.code() != StatusCode::kResourceExhausted) return {500, "internal"};
  return HttpErrorFor(s.code());
}

std::string TombstoneErrorBody(std::string_view code, std::string_view message,
                               const std::string& reason, int64_t at_ms) {
  return Json{{"error", {{"code", code}, {"message", message}, {"reason", reason}, {"at", at_ms}}}}
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

Status ValidateId(std::string_view what, std::string_view id) {
  bool ok = !id.empty() && id.size() <= 128 && id.find("..") == std::string_view::npos;
  for (char c : id)
    ok = ok && (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (!ok)
    return InvalidArgument(std::string(what) +
                           " must be 1-128 characters of A-Z a-z 0-9 . _ - (and no \"..\")");
  return OkStatus();
}

}  // namespace dsec::api
