#include "api/pool_json.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <type_traits>

#include "base/strings.h"

namespace dsec::api {

using pools::PoolConfig;
using pools::PoolKind;
using pools::PoolKindFromName;
using pools::PoolKindName;

namespace {

bool ValidModuleName(const std::string& m) {
  if (m.empty() || m.size() > 128 || m.front() == '.' || m.back() == '.') return false;
  for (char c : m)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

template <typename T>
Status GetField(const Json& j, const char* key, T* out, T lo, T hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return InvalidArgument(std::string("\"") + key + "\" must be a number");
  } else {
    if (!it->is_number_integer())
      return InvalidArgument(std::string("\"") + key + "\" must be an integer");
  }
  // Compared before narrowing: 2^63 must not wrap into the range.
  bool in_range;
  T v{};
  if constexpr (std::is_floating_point_v<T>) {
    v = it->get<T>();
    in_range = v >= lo && v <= hi;
  } else if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    in_range = hi >= 0 && u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo &&
               u <= static_cast<uint64_t>(INT64_MAX);
    v = static_cast<T>(u);
  } else {
    int64_t i = it->get<int64_t>();
    in_range = i >= static_cast<int64_t>(lo) && i <= static_cast<int64_t>(hi);
    v = static_cast<T>(i);
  }
  if (!in_range)
    return InvalidArgument(std::string("\"") + key + "\" must be between " + FormatNumber(lo) +
                           " and " + FormatNumber(hi));
  *out = v;
  return OkStatus();
}

Status GetStrings(const Json& j, const char* key, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_array() || it->size() > 256)
    return InvalidArgument(std::string("\"") + key + "\" must be a list of at most 256 strings");
  std::vector<std::string> v;
  for (const auto& e : *it) {
    if (!e.is_string() || e.get<std::string>().size() > 4096 ||
        e.get<std::string>().find('\0') != std::string::npos)
      return InvalidArgument(std::string("\"") + key + "\" must hold strings");
    v.push_back(e.get<std::string>());
  }
  *out = std::move(v);
  return OkStatus();
}

}  // namespace

Json ToJson(const PoolConfig& c) {
  Json j = {{"name", c.name},
            {"kind", PoolKindName(c.kind)},
            {"runtime", backends::FnRuntimeName(c.runtime)},
            {"image", c.image},
            {"min_idle", c.min_idle},
            {"max", c.max},
            {"max_queue", c.max_queue},
            {"queue_timeout_ms", c.queue_timeout_ms},
            {"idle_timeout_s", c.idle_timeout_s}};
  j.update(ToJson(c.resources));
  if (pools::HoldsSandboxes(c.kind)) {
    j.erase("runtime");
    j.erase("max_queue");
    j.erase("queue_timeout_ms");
    j.erase("idle_timeout_s");
  }
  if (c.expire_unused_s > 0) j["expire_unused_s"] = c.expire_unused_s;
  if (c.kind == PoolKind::kFncall && c.runtime == backends::FnRuntime::kPython)
    j["preload"] = c.preload;
  if (c.kind == PoolKind::kFncall && c.runtime == backends::FnRuntime::kExec)
    j["command"] = c.command;
  return j;
}

StatusOr<PoolConfig> PoolConfigFromJson(const Json& j, PoolConfig c) {
  if (!j.is_object()) return InvalidArgument("a pool must be a JSON object");
  static const char* kKnown[] = {"name",           "kind",
                                 "runtime",        "image",
                                 "preload",        "command",
                                 "min_idle",       "max",
                                 "memory_mb",      "disk_mb",
                                 "pids",           "cpu",
                                 "max_queue",      "queue_timeout_ms",
                                 "idle_timeout_s", "request_id"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return it.key() == k; }) == std::end(kKnown))
      return InvalidArgument("unknown pool field \"" + it.key() + "\"");
  }
  auto str = [&](const char* key, std::string* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return OkStatus();
    if (!it->is_string()) return InvalidArgument(std::string("\"") + key + "\" must be a string");
    *out = it->get<std::string>();
    return OkStatus();
  };
  std::string kind(PoolKindName(c.kind));
  DSEC_RETURN_IF_ERROR(str("kind", &kind));
  auto k = PoolKindFromName(kind);
  if (!k) return InvalidArgument("\"kind\" must be \"fncall\", \"container\" or \"microvm\"");
  c.kind = *k;
  std::string runtime(backends::FnRuntimeName(c.runtime));
  DSEC_RETURN_IF_ERROR(str("runtime", &runtime));
  DSEC_RETURN_IF_ERROR(str("image", &c.image));
  DSEC_RETURN_IF_ERROR(GetStrings(j, "preload", &c.preload));
  DSEC_RETURN_IF_ERROR(GetStrings(j, "command", &c.command));
  DSEC_RETURN_IF_ERROR(GetField(j, "min_idle", &c.min_idle, 0, 1024));
  DSEC_RETURN_IF_ERROR(GetField(j, "max", &c.max, 1, 4096));
  Resources& r = c.resources;
  DSEC_RETURN_IF_ERROR(GetField<int64_t>(j, "memory_mb", &r.memory_mb, 16, 1 << 20));
  DSEC_RETURN_IF_ERROR(GetField<int64_t>(j, "disk_mb", &r.disk_mb, 1, 1 << 20));
  DSEC_RETURN_IF_ERROR(GetField<int64_t>(j, "pids", &r.pids, 16, 1 << 22));
  DSEC_RETURN_IF_ERROR(GetField(j, "cpu", &r.cpu, 0.01, 1024.0));
  DSEC_RETURN_IF_ERROR(GetField(j, "max_queue", &c.max_queue, 0, 1 << 20));
  DSEC_RETURN_IF_ERROR(GetField<int64_t>(j, "queue_timeout_ms", &c.queue_timeout_ms, 0, 600000));
  DSEC_RETURN_IF_ERROR(GetField<int64_t>(j, "idle_timeout_s", &c.idle_timeout_s, 1, 86400 * 7));
  if (c.min_idle > c.max) return InvalidArgument("\"min_idle\" must not exceed \"max\"");
  if (c.kind == PoolKind::kFncall) {
    auto r = backends::FnRuntimeFromName(runtime);
    if (!r) return InvalidArgument("\"runtime\" must be \"python\", \"bash\" or \"exec\"");
    c.runtime = *r;
    if (c.runtime == backends::FnRuntime::kExec && c.command.empty())
      return InvalidArgument("an \"exec\" runtime needs a \"command\" (the code is appended)");
    for (const auto& m : c.preload)
      if (!ValidModuleName(m)) return InvalidArgument("bad module name \"" + m + "\" in preload");
  }
  return c;
}

Json ToJson(const pools::PoolStatus& st) {
  const PoolConfig& c = st.config;
  Json j = ToJson(c);
  j["workers"] = {{"idle", st.idle}, {"busy", st.busy}, {"starting", st.starting}};
  if (pools::HoldsSandboxes(c.kind)) {
    j["taken"] = st.taken;
    j["missed"] = st.missed;
  } else {
    j["queued"] = st.queued;
    j["calls"] = st.calls;
  }
  j["rejected"] = st.rejected;
  j["replaced"] = st.replaced;
  j["yielded"] = st.yielded;
  j["last_error"] = st.last_error.empty() ? Json(nullptr) : Json(st.last_error);
  return j;
}

Json ToJson(const std::vector<pools::PoolStatus>& all) {
  Json arr = Json::array();
  for (const auto& p : all) arr.push_back(ToJson(p));
  return arr;
}

Json PoolListJson(const std::vector<pools::PoolStatus>& all) { return {{"pools", ToJson(all)}}; }

StatusOr<PoolConfig> ParsePoolPut(std::string_view body, const std::string& name,
                                  const PoolConfig* existing, const PoolDefaultsFn& defaults) {
  auto j = ParseJson(body.empty() ? "{}" : body);
  if (!j.ok() || !j->is_object()) return InvalidArgument("the body must be a JSON object");
  if (j->contains("name") && (*j)["name"] != name)
    return InvalidArgument("\"name\" differs from the path");
  PoolKind kind = existing ? existing->kind : PoolKind::kFncall;
  if (auto k = j->find("kind"); k != j->end() && k->is_string()) {
    auto named = PoolKindFromName(k->get<std::string>());
    if (!named) return InvalidArgument("\"kind\" must be \"fncall\", \"container\" or \"microvm\"");
    kind = *named;
  }
  PoolConfig base = existing && existing->kind == kind ? *existing : defaults(kind);
  if (!j->contains("runtime") && kind == PoolKind::kFncall && !existing) {
    if (!j->contains("command")) return InvalidArgument("\"runtime\" is required");
    base.runtime = backends::FnRuntime::kExec;
  }
  base.name = name;
  return PoolConfigFromJson(*j, base);
}

StatusOr<PoolConfig> StoredPoolFromJson(std::string_view text, const std::string& name,
                                        const PoolDefaultsFn& defaults) {
  auto j = ParseJson(text);
  // A stored kind that is not valid is refused by PoolConfigFromJson below.
  auto kind = PoolKindFromName(j.ok() && j->is_object() && (*j)["kind"].is_string()
                                   ? (*j)["kind"].get<std::string>()
                                   : "fncall");
  PoolConfig base = defaults(kind.value_or(PoolKind::kFncall));
  base.name = name;
  return j.ok() ? PoolConfigFromJson(*j, base) : StatusOr<PoolConfig>(j.status());
}

}  // namespace dsec::api
