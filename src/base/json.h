// The JSON type every module uses (nlohmann::json), with a non-throwing parser and typed field
// getters. The REST side (edge handlers, CLI, apiserver) and the agent protocol both build on
// this header; neither depends on the other for it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/resources.h"
#include "base/status.h"

namespace dsec {

using Json = nlohmann::json;

// Parses a JSON document; never throws. Malformed input is InvalidArgument.
StatusOr<Json> ParseJson(std::string_view text);

// Typed getters: a missing or null field takes `def` (an error without one); a wrong type or a
// value out of [min, max] is InvalidArgument naming the field.
StatusOr<std::string> GetString(const Json& j, const char* key,
                                std::optional<std::string> def = {});
StatusOr<int64_t> GetInt(const Json& j, const char* key, std::optional<int64_t> def = {},
                         int64_t min = INT64_MIN, int64_t max = INT64_MAX);
StatusOr<bool> GetBool(const Json& j, const char* key, std::optional<bool> def = {});
// An object of strings (labels, env): a missing or null field is empty; anything but an object
// of strings is InvalidArgument naming the field.
StatusOr<std::map<std::string, std::string>> GetStringMap(const Json& j, const char* key);

// Resources under their public names: {"cpu", "memory_mb", "pids", "disk_mb"} (the create
// API's fields, a sandbox's "limits", a pool's fields, the state DB's records).
Json ToJson(const Resources& r);

// A map as a JSON object.
template <typename Map>
Json ToJsonObject(const Map& m) {
  Json j = Json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j;
}

}  // namespace dsec
