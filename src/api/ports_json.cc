#include "api/ports_json.h"

#include "http/json_body.h"

namespace dsec::api {

StatusOr<PortUrlRequest> ParsePortUrlRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto port, b.Int("port", 1, 65535));
  DSEC_ASSIGN_OR_RETURN(auto ttl, b.Int("ttl_s", 1, kMaxPortUrlTtlS));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!port) return InvalidArgument("\"port\" is required");
  return PortUrlRequest{static_cast<uint16_t>(*port), ttl.value_or(3600)};
}

Json ToJson(const PortUrl& u) {
  return {{"port", u.port},
          {"path", u.path},
          {"expires_at", u.expires_at},
          {"url", u.url.empty() ? Json(nullptr) : Json(u.url)}};
}

}  // namespace dsec::api
