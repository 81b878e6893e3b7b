#include "api/images_json.h"

#include "http/json_body.h"

namespace dsec::api {

Json ToJson(const ImageRecord& img) {
  Json layers = Json::array();
  for (const auto& l : img.layers)
    layers.push_back({{"digest", l.digest}, {"size", l.size}, {"format", l.format}});
  return {{"name", img.name},
          {"base", img.base.empty() ? Json(nullptr) : Json(img.base)},
          {"layers", layers},
          {"config",
           {{"env", img.env},
            {"workdir", img.workdir},
            {"user", img.user},
            {"entrypoint", img.entrypoint},
            {"cmd", img.cmd}}},
          {"size", img.size},
          {"source", img.source},
          {"created_at", img.created_at},
          {"in_use", img.in_use}};
}

Json HostImageJson() {
  return {{"name", "host"},
          {"base", nullptr},
          {"layers", Json::array()},
          {"config",
           {{"env", Json::array()},
            {"workdir", ""},
            {"user", ""},
            {"entrypoint", Json::array()},
            {"cmd", Json::array()}}},
          {"size", 0},
          {"source", "builtin"},
          {"builtin", true},
          {"created_at", 0},
          {"in_use", nullptr}};
}

Json ImageListJson(const std::vector<ImageRecord>& imgs) {
  Json out = Json::array({HostImageJson()});
  for (const auto& img : imgs) out.push_back(ToJson(img));
  return {{"images", out}};
}

StatusOr<SnapshotRequest> ParseSnapshotRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  auto name = b.String("image", 300);
  auto rid = b.String("request_id", 128);
  auto keep_setuid = b.Bool("keep_setuid");
  DSEC_RETURN_IF_ERROR(name.status());
  DSEC_RETURN_IF_ERROR(rid.status());
  DSEC_RETURN_IF_ERROR(keep_setuid.status());
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!name->has_value()) return InvalidArgument("\"image\" (name:tag) is required");
  return SnapshotRequest{**name, keep_setuid->value_or(false)};
}

StatusOr<ForkRequest> ParseForkRequest(std::string_view body, int max_count) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  auto count = b.Int("count", 1, max_count);
  auto rid = b.String("request_id", 128);
  auto keep_setuid = b.Bool("keep_setuid");
  auto memory = b.Bool("memory");
  // (checked in this order: the first error is the answer)
  DSEC_RETURN_IF_ERROR(keep_setuid.status());
  DSEC_RETURN_IF_ERROR(memory.status());
  DSEC_RETURN_IF_ERROR(count.status());
  DSEC_RETURN_IF_ERROR(rid.status());
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (memory->value_or(false) && keep_setuid->value_or(false))
    return InvalidArgument(
        "keep_setuid is for a fork of files (a captured layer); a fork with memory copies the "
        "machine as it is");
  return ForkRequest{static_cast<int>(count->value_or(1)), keep_setuid->value_or(false),
                     memory->value_or(false)};
}

}  // namespace dsec::api
