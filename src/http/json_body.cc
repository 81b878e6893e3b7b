#include "http/json_body.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>

namespace dsec::http {

namespace {
Status TypeError(const char* name, const char* want) {
  return InvalidArgument(std::string("\"") + name + "\" must be " + want);
}
// Walks the text (iteratively, any depth) and remembers the keys of every open object.
class DuplicateKeyFinder : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (keys_.back().insert(k).second) return true;
    duplicate_ = k;
    return false;  // stops the parse
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
  std::optional<std::string> duplicate_;

 private:
  std::vector<std::unordered_set<std::string>> keys_;  // of each open object, innermost last
};

}  // namespace

Status CheckStrictJson(std::string_view body) {
  if (body.find('\0') != std::string_view::npos)
    return InvalidArgument("request body is not valid JSON (it contains a NUL byte)");
  DuplicateKeyFinder f;
  (void)Json::sax_parse(body, &f);
  if (f.duplicate_) {
    std::string k = f.duplicate_->substr(0, 64);
    for (char& ch : k)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == '"' || ch == '\\') ch = '?';
    return InvalidArgument("duplicate key \"" + k + "\" in the request body");
  }
  return OkStatus();
}

StatusOr<JsonBody> JsonBody::Parse(std::string_view body) {
  if (std::all_of(body.begin(), body.end(),
                  [](char c) { return isspace(static_cast<unsigned char>(c)); }))
    return JsonBody(Json::object());
  if (body.find('\0') != std::string_view::npos)
    return InvalidArgument("request body is not valid JSON");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("request body is not valid JSON");
  if (!j.is_object()) return InvalidArgument("request body must be a JSON object");
  DSEC_RETURN_IF_ERROR(CheckStrictJson(body));
  return JsonBody(std::move(j));
}

const Json* JsonBody::Take(const char* name) {
  seen_.emplace_back(name);
  auto it = j_.find(name);
  if (it == j_.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json* JsonBody::Raw(const char* name) { return Take(name); }

StatusOr<std::optional<std::string>> JsonBody::String(const char* name, size_t max_len) {
  const Json* v = Take(name);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(name, "a string");
  std::string s = v->get<std::string>();
  if (s.size() > max_len)
    return InvalidArgument(std::string("\"") + name + "\" is longer than " +
                           std::to_string(max_len) + " bytes");
  return std::optional<std::string>(std::move(s));
}

StatusOr<std::optional<int64_t>> JsonBody::Int(const char* name, int64_t lo, int64_t hi) {
  const Json* v = Take(name);
  if (!v) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    // 512.0 is fine; 512.5, true and "512" are not.
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= static_cast<double>(lo) &&
          d <= static_cast<double>(hi))
        return std::optional<int64_t>(static_cast<int64_t>(d));
    }
    return TypeError(
        name, ("an integer between " + std::to_string(lo) + " and " + std::to_string(hi)).c_str());
  }
  bool in_range = v->is_number_unsigned()
                      ? v->get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(hi, 0)) &&
                            static_cast<int64_t>(v->get<uint64_t>()) >= lo
                      : v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
  if (!in_range)
    return InvalidArgument(std::string("\"") + name + "\" must be between " + std::to_string(lo) +
                           " and " + std::to_string(hi));
  return std::optional<int64_t>(v->get<int64_t>());
}

StatusOr<std::optional<double>> JsonBody::Number(const char* name, double lo, double hi) {
  const Json* v = Take(name);
  if (!v) return std::optional<double>();
  if (!v->is_number()) return TypeError(name, "a number");
  double d = v->get<double>();
  if (!(d >= lo && d <= hi)) {
    char b[128];
    snprintf(b, sizeof b, "\"%s\" must be between %g and %g", name, lo, hi);
    return InvalidArgument(b);
  }
  return std::optional<double>(d);
}

StatusOr<std::optional<bool>> JsonBody::Bool(const char* name) {
  const Json* v = Take(name);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return TypeError(name, "true or false");
  return std::optional<bool>(v->get<bool>());
}

StatusOr<std::optional<std::map<std::string, std::optional<std::string>>>> JsonBody::StringMap(
    const char* name, size_t max_entries, size_t max_key, size_t max_value, bool null_deletes) {
  using Map = std::map<std::string, std::optional<std::string>>;
  const Json* v = Take(name);
  if (!v) return std::optional<Map>();
  if (!v->is_object()) return TypeError(name, "an object of strings");
  if (v->size() > max_entries)
    return InvalidArgument(std::string("\"") + name + "\" has more than " +
                           std::to_string(max_entries) + " entries");
  Map out;
  for (const auto& [k, val] : v->items()) {
    if (k.empty() || k.size() > max_key)
      return InvalidArgument(std::string("\"") + name + "\" keys must be 1-" +
                             std::to_string(max_key) + " bytes");
    if (val.is_null() && null_deletes) {
      out[k] = std::nullopt;
      continue;
    }
    if (!val.is_string()) return TypeError(name, "an object of strings");
    if (val.get_ref<const std::string&>().size() > max_value)
      return InvalidArgument(std::string("\"") + name + "\" values must be at most " +
                             std::to_string(max_value) + " bytes");
    out[k] = val.get<std::string>();
  }
  return std::optional<Map>(std::move(out));
}

StatusOr<std::optional<std::vector<std::string>>> JsonBody::StringArray(const char* name,
                                                                        size_t max_items,
                                                                        size_t max_len) {
  const Json* v = Take(name);
  if (!v) return std::optional<std::vector<std::string>>();
  if (!v->is_array()) return TypeError(name, "an array of strings");
  if (v->size() > max_items)
    return InvalidArgument(std::string("\"") + name + "\" has more than " +
                           std::to_string(max_items) + " items");
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) return TypeError(name, "an array of strings");
    if (e.get_ref<const std::string&>().size() > max_len)
      return InvalidArgument(std::string("\"") + name + "\" items must be at most " +
                             std::to_string(max_len) + " bytes");
    out.push_back(e.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

Status JsonBody::Finish() const {
  for (const auto& [k, v] : j_.items())
    if (std::find(seen_.begin(), seen_.end(), k) == seen_.end())
      return InvalidArgument("unknown field \"" + k + "\"");
  return OkStatus();
}

std::map<std::string, std::string> Flatten(
    const std::map<std::string, std::optional<std::string>>& m) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : m)
    if (v) out[k] = *v;
  return out;
}

}  // namespace dsec::http
