#include "edge/manager.h"

#include "api/network_json.h"
#include "base/clock.h"
#include "base/ids.h"

// What a sandbox was asked for, and the manager's entry for it (declared in manager.h).
namespace dsec::edge {

Json ToJson(const CreateParams& p) {
  Json j = {{"kind", backends::KindName(p.kind)},
            {"image", p.image},
            {"ttl_s", p.ttl_s},
            {"idle_ttl_s", p.idle_ttl_s},
            {"user", p.user},
            {"workdir", p.workdir},
            {"env", ToJsonObject(p.env)},
            {"labels", ToJsonObject(p.labels)},
            {"network", api::ToJson(p.network)},
            {"pool", p.pool.empty() ? Json(nullptr) : Json(p.pool)}};
  if (!p.config_from.empty()) j["config_from"] = p.config_from;
  j["project"] = p.project;
  if (!p.owner.empty()) j["owner"] = p.owner;
  if (!p.quota_hold.empty()) j["quota_hold"] = p.quota_hold;
  j.update(ToJson(p.resources));
  return j;
}

StatusOr<CreateParams> CreateParamsFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("params must be an object");
  CreateParams p;
  DSEC_ASSIGN_OR_RETURN(std::string kind,
                        GetString(j, "kind", std::string(backends::KindName(p.kind))));
  auto k = backends::KindFromName(kind);
  if (!k) return InvalidArgument("unknown sandbox kind \"" + kind + "\"");
  p.kind = *k;
  DSEC_ASSIGN_OR_RETURN(p.image, GetString(j, "image", p.image));
  Resources& r = p.resources;
  if (auto it = j.find("cpu"); it != j.end() && it->is_number()) r.cpu = it->get<double>();
  DSEC_ASSIGN_OR_RETURN(r.memory_mb, GetInt(j, "memory_mb", r.memory_mb));
  DSEC_ASSIGN_OR_RETURN(r.pids, GetInt(j, "pids", r.pids));
  DSEC_ASSIGN_OR_RETURN(r.disk_mb, GetInt(j, "disk_mb", r.disk_mb));
  DSEC_ASSIGN_OR_RETURN(p.ttl_s, GetInt(j, "ttl_s", p.ttl_s));
  DSEC_ASSIGN_OR_RETURN(p.idle_ttl_s, GetInt(j, "idle_ttl_s", p.idle_ttl_s));
  DSEC_ASSIGN_OR_RETURN(p.user, GetString(j, "user", p.user));
  DSEC_ASSIGN_OR_RETURN(p.workdir, GetString(j, "workdir", p.workdir));
  DSEC_ASSIGN_OR_RETURN(p.env, GetStringMap(j, "env"));
  DSEC_ASSIGN_OR_RETURN(p.labels, GetStringMap(j, "labels"));
  if (auto it = j.find("network"); it != j.end()) {
    DSEC_ASSIGN_OR_RETURN(p.network, api::NetworkPolicyFromJson(&*it));
  }
  DSEC_ASSIGN_OR_RETURN(p.pool, GetString(j, "pool", ""));
  DSEC_ASSIGN_OR_RETURN(p.config_from, GetString(j, "config_from", ""));
  DSEC_ASSIGN_OR_RETURN(p.project, GetString(j, "project", "default"));  // (rows from before)
  DSEC_ASSIGN_OR_RETURN(p.owner, GetString(j, "owner", ""));
  DSEC_ASSIGN_OR_RETURN(p.quota_hold, GetString(j, "quota_hold", ""));
  return p;
}

// --- SandboxEntry ------------------------------------------------------------------------

void SandboxEntry::Touch() { last_used_at = clock_->NowMs(); }

StatusOr<std::shared_ptr<backends::Sandbox>> SandboxEntry::Sandbox(Op op, int64_t timeout_ms) {
  if (deferred)
    return FailedPrecondition("sandbox " + id +
                              " resumes a trajectory: it is made at its first live call (an exec "
                              "or file call past the log), not before");
  MutexLock l(mu_);
  cv_.WaitFor(l, std::chrono::milliseconds(timeout_ms),
              [&]() DSEC_REQUIRES(mu_) { return phase_ != Phase::kCreating; });
  DSEC_RETURN_IF_ERROR(CheckOp(op, phase_, id, reason_));
  return sb_;
}

Phase SandboxEntry::phase() const {
  MutexLock l(mu_);
  return phase_;
}

void SandboxEntry::SetStartImage(std::string image) {
  MutexLock l(mu_);
  start_image_ = std::move(image);
}

int64_t SandboxEntry::created_at() const {
  MutexLock l(mu_);
  return created_at_;
}

}  // namespace dsec::edge
