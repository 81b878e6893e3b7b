#include "base/json.h"

namespace dsec {

StatusOr<Json> ParseJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  // Parse again, only to say where it broke (the exception names the line and column).
  try {
    [[maybe_unused]] Json again = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    std::string why = e.what();
    if (size_t k = why.find("] "); why.starts_with("[json.exception") && k != std::string::npos)
      why.erase(0, k + 2);
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    return InvalidArgument("malformed JSON: " + why);
  } catch (const std::exception&) {
  }
  return InvalidArgument("malformed JSON");
}

StatusOr<std::string> GetString(const Json& j, const char* key, std::optional<std::string> def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    return InvalidArgument(std::string("missing field \"") + key + "\"");
  }
  if (!it->is_string())
    return InvalidArgument(std::string("field \"") + key + "\" must be a string");
  return it->get<std::string>();
}

StatusOr<int64_t> GetInt(const Json& j, const char* key, std::optional<int64_t> def, int64_t min,
                         int64_t max) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    return InvalidArgument(std::string("missing field \"") + key + "\"");
  }
  int64_t v;
  if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      return InvalidArgument(std::string("field \"") + key + "\" is out of range");
    v = static_cast<int64_t>(u);
  } else {
    return InvalidArgument(std::string("field \"") + key + "\" must be an integer");
  }
  if (v < min || v > max)
    return InvalidArgument(std::string("field \"") + key + "\" must be between " +
                           std::to_string(min) + " and " + std::to_string(max));
  return v;
}

StatusOr<bool> GetBool(const Json& j, const char* key, std::optional<bool> def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    return InvalidArgument(std::string("missing field \"") + key + "\"");
  }
  if (!it->is_boolean())
    return InvalidArgument(std::string("field \"") + key + "\" must be a boolean");
  return it->get<bool>();
}

StatusOr<std::map<std::string, std::string>> GetStringMap(const Json& j, const char* key) {
  std::map<std::string, std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_object()) return InvalidArgument(std::string(key) + " must be an object");
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) return InvalidArgument(std::string(key) + " values must be strings");
    out[k] = v.get<std::string>();
  }
  return out;
}

Json ToJson(const Resources& r) {
  return {{"cpu", r.cpu}, {"memory_mb", r.memory_mb}, {"pids", r.pids}, {"disk_mb", r.disk_mb}};
}

}  // namespace dsec
