#include "api/request_json.h"

#include "base/json.h"
#include "http/json_body.h"

namespace dsec::api {

StatusOr<std::optional<std::string>> BodyRequestId(std::string_view body) {
  auto j = ParseJson(body);
  // Every JSON body, whichever handler reads it (some parse it themselves).
  if (j.ok() || body.find('\0') != std::string_view::npos)
    DSEC_RETURN_IF_ERROR(http::CheckStrictJson(body));
  if (!j.ok() || !j->is_object()) return std::optional<std::string>();
  auto it = j->find("request_id");
  if (it == j->end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return InvalidArgument("\"request_id\" must be a string");
  std::string rid = it->get<std::string>();
  if (rid.empty()) return InvalidArgument("\"request_id\" must not be empty");
  return std::optional<std::string>(std::move(rid));
}

}  // namespace dsec::api
