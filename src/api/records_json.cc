#include "api/network_json.h"
#include "api/records.h"
#include "base/strings.h"

// The REST shapes of the manager's records (api/openapi.yaml: Sandbox, SandboxList, Node).
namespace dsec::api {

std::string_view PhaseName(Phase p) {
  switch (p) {
    case Phase::kCreating:
      return "creating";
    case Phase::kRunning:
      return "running";
    case Phase::kPaused:
      return "paused";
    case Phase::kFailed:
      return "failed";
    case Phase::kDeleted:
      return "deleted";
  }
  return "unknown";
}

namespace {
// A stack of images is shown as the list it was given as; a single image as its name.
Json ImageField(const std::string& image) {
  if (image.find(',') == std::string::npos) return image;
  Json a = Json::array();
  for (auto n : SplitString(image, ',', /*skip_empty=*/true)) a.push_back(std::string(n));
  return a;
}
}  // namespace

Json ToJson(const SandboxRecord& r) {
  Json j = {{"id", r.id},
            {"kind", backends::KindName(r.kind)},
            {"state", PhaseName(r.state)},
            {"node", r.node},
            {"image", ImageField(r.image)},
            {"created_at", r.created_at},
            {"expires_at", r.expires_at > 0 ? Json(r.expires_at) : Json(nullptr)},  // null: no TTL
            {"ttl_s", r.ttl_s},
            {"idle_ttl_s", r.idle_ttl_s},
            {"last_used_at", r.last_used_at},
            {"limits", ToJson(r.limits)},
            {"user", r.user},
            {"workdir", r.workdir},
            {"network", api::ToJson(r.network)},
            {"labels", ToJsonObject(r.labels)},
            {"project", r.project},
            {"reason", r.reason.empty() ? Json(nullptr) : Json(r.reason)}};
  if (!r.pool.empty()) j["pool"] = r.pool;
  if (!r.address.empty()) j["network"]["address"] = r.address;
  return j;
}

Json ToJson(const std::vector<SandboxRecord>& rs) {
  Json list = Json::array();
  for (const auto& r : rs) list.push_back(ToJson(r));
  return list;
}

Json ToJson(const SandboxPage& p) {
  return {{"sandboxes", ToJson(p.sandboxes)},
          {"next_cursor", p.next_cursor.empty() ? Json(nullptr) : Json(p.next_cursor)}};
}

Json ToJson(const NodeReport& n) {
  Json by_state = Json::object();
  for (const auto& [phase, count] : n.by_state) by_state[std::string(PhaseName(phase))] = count;
  const NodeBudget& b = n.budget;
  return {{"node", n.node},
          {"capacity",
           {{"max_sandboxes", n.max_sandboxes},
            {"memory_mb", n.memory_mb},
            {"overcommit", n.overcommit},
            {"admit_memory_mb", n.admit_memory_mb},
            {"reserve_memory_mb", n.reserve_memory_mb},
            {"edge_max_sandboxes", n.files.max_sandboxes},
            {"edge_nofile", n.files.nofile},
            {"budgets",
             {{"file_max", b.file_max},
              {"aio_max_nr", b.aio_max_nr},
              {"pid_max", b.pid_max},
              {"threads_max", b.threads_max},
              {"sandbox_pids", b.sandbox_pids},
              {"sandbox_tcp_bytes", b.sandbox_tcp_bytes},
              {"pty_max", b.pty_max},
              {"pty_per_sandbox", b.pty_per_sandbox}}}}},
          {"usage",
           {{"sandboxes", n.sandboxes}, {"memory_mb", n.used_memory_mb}, {"by_state", by_state}}}};
}

}  // namespace dsec::api
