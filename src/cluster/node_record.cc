#include "cluster/node_record.h"

#include <algorithm>

namespace dsec::cluster {

Json NodeRecord::ToJson() const {
  return {{"node", node},
          {"url", url},
          {"instance", instance},
          {"version", version},
          {"kinds", kinds},
          {"pools", pools},
          {"max_sandboxes", max_sandboxes},
          {"memory_mb", memory_mb},
          {"admit_memory_mb", admit_memory_mb},
          {"max_memory_mb", max_memory_mb},
          {"default_memory_mb", default_memory_mb},
          {"default_cpu_milli", default_cpu_milli},
          {"sandboxes", sandboxes},
          {"used_memory_mb", used_memory_mb},
          {"started_at", started_at},
          {"e2b_url", e2b_url},
          {"sandbox_fusion_url", sandbox_fusion_url}};
}

StatusOr<NodeRecord> NodeRecord::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("node") || !j["node"].is_string() ||
      !j.contains("url") || !j["url"].is_string())
    return InvalidArgument("node record is not a JSON object with node and url");
  NodeRecord r;
  try {
    r.node = j["node"].get<std::string>();
    r.url = j["url"].get<std::string>();
    r.instance = j.value("instance", "");
    r.version = j.value("version", "");
    r.kinds = j.value("kinds", std::vector<std::string>{});
    r.pools = j.value("pools", std::vector<std::string>{});
    r.max_sandboxes = j.value("max_sandboxes", int64_t{0});
    r.memory_mb = j.value("memory_mb", int64_t{0});
    r.admit_memory_mb = j.value("admit_memory_mb", int64_t{0});
    r.max_memory_mb = j.value("max_memory_mb", int64_t{0});
    r.default_memory_mb = j.value("default_memory_mb", int64_t{0});
    r.default_cpu_milli = j.value("default_cpu_milli", int64_t{0});
    r.sandboxes = j.value("sandboxes", int64_t{0});
    r.used_memory_mb = j.value("used_memory_mb", int64_t{0});
    r.started_at = j.value("started_at", int64_t{0});
    r.e2b_url = j.value("e2b_url", "");
    r.sandbox_fusion_url = j.value("sandbox_fusion_url", "");
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("node record: ") + e.what());
  }
  return r;
}

bool NodeRecord::HasKind(std::string_view kind) const {
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

Json NodeUsage::ToJson() const {
  Json list = Json::array();
  for (const auto& e : entries)
    list.push_back({{"project", e.project},
                    {"owner", e.owner},
                    {"hold", e.hold},
                    {"sandboxes", e.sandboxes},
                    {"memory_mb", e.memory_mb},
                    {"cpu_milli", e.cpu_milli}});
  return {{"gen", gen}, {"entries", std::move(list)}};
}

StatusOr<NodeUsage> NodeUsage::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("node usage is not an object");
  NodeUsage u;
  try {
    u.gen = j.value("gen", int64_t{0});
    for (const Json& e : j.value("entries", Json::array())) {
      UsageEntry x;
      x.project = e.value("project", "");
      x.owner = e.value("owner", "");
      x.hold = e.value("hold", "");
      x.sandboxes = e.value("sandboxes", int64_t{0});
      x.memory_mb = e.value("memory_mb", int64_t{0});
      x.cpu_milli = e.value("cpu_milli", int64_t{0});
      u.entries.push_back(std::move(x));
    }
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("node usage: ") + e.what());
  }
  return u;
}

}  // namespace dsec::cluster
