// Strict reading of JSON request bodies: every field a handler reads is declared with its type
// and bounds; Finish() then rejects any field nobody read (a typo like "memroy_mb" is an
// error, not a silently ignored default). JSON null means "not given".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::http {

class JsonBody {
 public:
  // An empty body is an empty object. Anything but a JSON object is an error.
  static StatusOr<JsonBody> Parse(std::string_view body);

  StatusOr<std::optional<std::string>> String(const char* name, size_t max_len = 4096);
  StatusOr<std::optional<int64_t>> Int(const char* name, int64_t lo, int64_t hi);
  StatusOr<std::optional<double>> Number(const char* name, double lo, double hi);
  StatusOr<std::optional<bool>> Bool(const char* name);
  // An object of string values; `null_deletes` allows null values (returned as nullopt).
  StatusOr<std::optional<std::map<std::string, std::optional<std::string>>>> StringMap(
      const char* name, size_t max_entries, size_t max_key, size_t max_value,
      bool null_deletes = false);
  StatusOr<std::optional<std::vector<std::string>>> StringArray(const char* name, size_t max_items,
                                                                size_t max_len);
  // The raw value (marks it read); nullptr if absent or null.
  const Json* Raw(const char* name);
  // Fails on fields that no getter asked for.
  Status Finish() const;

  const Json& json() const { return j_; }

 private:
  explicit JsonBody(Json j) : j_(std::move(j)) {}
  const Json* Take(const char* name);
  Json j_;
  std::vector<std::string> seen_;
};

// InvalidArgument if `body` holds a NUL byte, or some JSON object in it has the same key twice.
// Such bodies mean different things to different parsers (nlohmann stops at a NUL and takes
// the last of two keys, others do not), so a proxy in front could check one request while the
// edge ran another: strict bodies refuse them. Other malformed text passes (its parse reports
// the error).
Status CheckStrictJson(std::string_view body);

// Plain string->string map (no nulls) from StringMap's result.
std::map<std::string, std::string> Flatten(
    const std::map<std::string, std::optional<std::string>>& m);

}  // namespace dsec::http
