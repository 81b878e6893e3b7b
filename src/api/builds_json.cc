#include "api/builds_json.h"

#include <optional>

#include "api/network_json.h"
#include "base/json.h"
#include "http/json_body.h"
#include "images/bootstrap.h"
#include "images/store.h"

namespace dsec::api {

namespace {

// "from": one image name or a list of 1-16 (absent: nullopt).
StatusOr<std::optional<std::vector<std::string>>> ParseFrom(const Json* f) {
  if (!f) return std::optional<std::vector<std::string>>();
  std::vector<std::string> from;
  if (f->is_string()) {
    from.push_back(f->get<std::string>());
  } else if (f->is_array() && !f->empty() && f->size() <= 16) {
    for (const auto& x : *f) {
      if (!x.is_string()) return InvalidArgument("\"from\" must be an image name or a list");
      from.push_back(x.get<std::string>());
    }
  } else {
    return InvalidArgument("\"from\" must be an image name or a list of 1-16 of them");
  }
  return std::optional<std::vector<std::string>>(std::move(from));
}

// Image names of "from" in their normal form; "host" may only be the first.
StatusOr<std::vector<std::string>> NormalizeFrom(std::vector<std::string> from) {
  for (size_t i = 0; i < from.size(); ++i) {
    std::string& n = from[i];
    if (n == "host" || n == "host:latest") {
      if (i != 0) return InvalidArgument("\"host\" can only be the first image of \"from\"");
      n = "host";
      continue;
    }
    DSEC_ASSIGN_OR_RETURN(n, images::NormalizeName(n));
  }
  return from;
}

}  // namespace

StatusOr<BuildRequest> ParseBuildRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  BuildRequest r;
  DSEC_ASSIGN_OR_RETURN(auto name, b.String("name", 300));
  DSEC_ASSIGN_OR_RETURN(auto base, b.String("base", 64));
  DSEC_ASSIGN_OR_RETURN(auto variant, b.String("variant", 16));
  DSEC_ASSIGN_OR_RETURN(auto packages, b.StringArray("packages", 256, 128));
  DSEC_ASSIGN_OR_RETURN(auto run, b.StringArray("run", 64, 64 << 10));
  DSEC_ASSIGN_OR_RETURN(auto env, b.StringMap("env", 256, 256, 32 << 10));
  DSEC_ASSIGN_OR_RETURN(auto workdir, b.String("workdir", 4096));
  DSEC_ASSIGN_OR_RETURN(auto memory, b.Int("memory_mb", 64, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto disk, b.Int("disk_mb", 16, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_s", 1, 86400));
  DSEC_ASSIGN_OR_RETURN(auto request_id, b.String("request_id", 128));
  (void)request_id;  // the API layer's idempotency uses it
  DSEC_ASSIGN_OR_RETURN(auto from, ParseFrom(b.Raw("from")));
  const Json* network = b.Raw("network");
  DSEC_RETURN_IF_ERROR(b.Finish());
  DSEC_ASSIGN_OR_RETURN(r.network, NetworkPolicyFromJson(network));
  if (!name) return InvalidArgument("\"name\" (name:tag) is required");
  DSEC_ASSIGN_OR_RETURN(r.name, images::NormalizeName(*name));
  if (base.has_value() == from.has_value())
    return InvalidArgument(
        "give either \"base\" (debian:SUITE, made with mmdebstrap) or \"from\" (images)");
  if (base) {
    if (base->rfind("debian:", 0) != 0)
      return InvalidArgument(
          "\"base\" must be debian:SUITE (e.g. debian:bookworm); use \"from\" "
          "to start from an image");
    r.suite = base->substr(7);
  } else {
    DSEC_ASSIGN_OR_RETURN(r.from, NormalizeFrom(std::move(*from)));
    if (packages && !packages->empty())
      return InvalidArgument(
          "\"packages\" need a \"base\" (debian:SUITE); with \"from\", install "
          "them in a \"run\" step");
    if (!run || run->empty()) return InvalidArgument("a build \"from\" images needs \"run\" steps");
  }
  if (variant) r.variant = *variant;
  if (packages) r.packages = *packages;
  if (run) {
    for (const auto& c : *run)
      if (c.empty() || c.find('\0') != std::string::npos)
        return InvalidArgument("\"run\" steps must be non-empty commands without NUL");
    r.run = *run;
  }
  if (env) {
    for (const auto& [k, v] : *env) {
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
          !v || v->find('\0') != std::string::npos)
        return InvalidArgument("env names must not contain '=' or NUL, values no NUL");
      r.env[k] = *v;
    }
  }
  if (workdir) {
    if (workdir->empty() || (*workdir)[0] != '/' || workdir->find('\0') != std::string::npos)
      return InvalidArgument("\"workdir\" must be an absolute path");
    r.workdir = *workdir;
  }
  if (!r.suite.empty()) {
    images::BootstrapOptions bo;
    bo.suite = r.suite;
    bo.variant = r.variant;
    bo.packages = r.packages;
    DSEC_RETURN_IF_ERROR(images::ValidateBootstrap(bo));
  }
  if (memory) r.memory_mb = *memory;
  if (disk) r.disk_mb = *disk;
  r.timeout_s = timeout.value_or(3600);
  return r;
}

Json ToJson(const BuildRecord& r) {
  Json steps = Json::array();
  size_t done = 0;
  for (const auto& s : r.steps) {
    steps.push_back({{"name", s.name}, {"state", s.state}});
    done += s.state == "done";
  }
  auto opt = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  auto ts = [](int64_t t) { return t ? Json(t) : Json(nullptr); };
  const bool live = r.state == "running" || r.state == "canceling";  // a step may be running
  return {{"id", r.id},
          {"name", r.name},
          {"state", r.state},
          {"steps", steps},
          {"step", live && r.step >= 0 ? Json(r.step) : Json(nullptr)},
          {"progress", r.steps.empty() ? 0.0 : double(done) / double(r.steps.size())},
          {"error", opt(r.error)},
          {"image", opt(r.image)},
          {"sandbox", opt(r.sandbox)},
          {"log_bytes", r.log_bytes},
          {"created_at", r.created_at},
          {"started_at", ts(r.started_at)},
          {"finished_at", ts(r.finished_at)}};
}

Json BuildListJson(const std::vector<BuildRecord>& all) {
  Json out = Json::array();
  for (const auto& r : all) out.push_back(ToJson(r));
  return Json{{"builds", out}};
}

Json ToJson(const BuildLogPiece& p) {
  return Json{
      {"offset", p.offset}, {"next_offset", p.next_offset}, {"text", p.text}, {"done", p.done}};
}

}  // namespace dsec::api
