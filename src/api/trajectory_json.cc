#include "api/trajectory_json.h"

#include "api/errors.h"
#include "http/json_body.h"

namespace dsec::api {

namespace {
constexpr int64_t kMaxBranch = 1 << 20;
constexpr int64_t kMaxCheckpointEvery = 1 << 20;
}  // namespace

StatusOr<std::optional<TrajectorySpec>> ParseTrajectorySpec(const Json* j) {
  if (!j || j->is_null()) return std::optional<TrajectorySpec>();
  if (!j->is_object())
    return InvalidArgument("\"trajectory\" must be an object: {\"id\": ..., \"resume\": false}");
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(j->dump()));
  TrajectorySpec s;
  DSEC_ASSIGN_OR_RETURN(auto id, b.String("id", 128));
  DSEC_ASSIGN_OR_RETURN(auto resume, b.Bool("resume"));
  DSEC_ASSIGN_OR_RETURN(s.branch, b.Int("branch", 0, kMaxBranch));
  DSEC_ASSIGN_OR_RETURN(s.checkpoint_every, b.Int("checkpoint_every", 0, kMaxCheckpointEvery));
  if (Status st = b.Finish(); !st.ok())
    return InvalidArgument("\"trajectory\": " + std::string(st.message()));
  if (!id) return InvalidArgument("\"trajectory\" needs an \"id\"");
  DSEC_RETURN_IF_ERROR(ValidateId("trajectory id", *id));
  s.id = *id;
  s.resume = resume.value_or(false);
  if (s.branch && !s.resume) return InvalidArgument("\"trajectory\": \"branch\" is for a resume");
  if (s.checkpoint_every && s.resume)
    return InvalidArgument("\"trajectory\": a resume keeps the trajectory's checkpoint_every");
  return std::optional<TrajectorySpec>(std::move(s));
}

StatusOr<std::string> ResumeAsCreateBody(std::string_view body, const std::string& id) {
  Json in = body.empty() ? Json::object() : Json::parse(body, nullptr, false);
  if (!in.is_object()) return InvalidArgument("the body must be a JSON object");
  Json out = Json::object();
  Json traj = {{"id", id}, {"resume", true}};
  for (auto& [k, v] : in.items()) {
    if (k == "branch")
      traj["branch"] = v;
    else if (k == "ttl_s" || k == "idle_ttl_s" || k == "labels" || k == "request_id")
      out[k] = v;
    else
      return InvalidArgument("unknown field \"" + k +
                             "\" (a resume takes branch, ttl_s, idle_ttl_s, labels, request_id)");
  }
  out["trajectory"] = std::move(traj);
  return out.dump();
}

StatusOr<std::string> ParsePreemptRequest(std::string_view body) {
  if (body.empty()) return std::string("delete");
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto others, b.String("others", 16));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  std::string o = others.value_or("delete");
  if (o != "delete" && o != "snapshot")
    return InvalidArgument("\"others\" must be \"delete\" or \"snapshot\"");
  return o;
}

}  // namespace dsec::api
