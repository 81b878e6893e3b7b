#include "api/create_request.h"
#include "base/resources.h"

#include "api/sandboxes_json.h"
#include "base/json.h"
#include "base/strings.h"

namespace dsec::api {

StatusOr<CreateShape> ParseCreateShape(std::string_view body) {
  CreateShape s;
  if (body.empty()) return s;
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("body must be a JSON object");
  auto str = [&](const char* name, std::string* out) -> Status {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return OkStatus();
    if (!it->is_string()) return InvalidArgument(std::string("\"") + name + "\" must be a string");
    *out = it->get<std::string>();
    return OkStatus();
  };
  auto num = [&](const char* name, int64_t lo, int64_t hi, int64_t* out, bool* given) -> Status {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return OkStatus();
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
      return InvalidArgument(std::string("\"") + name + "\" must be an integer from " +
                             std::to_string(lo) + " to " + std::to_string(hi));
    *out = it->get<int64_t>();
    if (given) *given = true;
    return OkStatus();
  };
  DSEC_RETURN_IF_ERROR(str("kind", &s.kind));
  DSEC_RETURN_IF_ERROR(str("pool", &s.pool));
  DSEC_RETURN_IF_ERROR(str("request_id", &s.request_id));
  DSEC_RETURN_IF_ERROR(str("node", &s.node));
  if (auto it = j.find("image"); it != j.end() && !it->is_null()) {
    auto stack = ParseImageStack(&*it);
    if (!stack.ok()) return stack.status();
    for (auto n : SplitString(stack->value_or(""), ',', /*skip_empty=*/true))
      if (n != "host" && !StartsWith(n, "sha256:")) s.images.emplace_back(n);
  }
  DSEC_RETURN_IF_ERROR(num("memory_mb", 1, int64_t{1} << 30, &s.memory_mb, nullptr));
  DSEC_RETURN_IF_ERROR(num("count", 1, 1 << 20, &s.count, &s.count_given));
  if (auto it = j.find("cpu"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 1024)
      return InvalidArgument("\"cpu\" must be a number of cores above 0, at most 1024");
    s.cpu_milli = CpuMilli(it->get<double>());
  }
  if (auto it = j.find("trajectory"); it != j.end() && it->is_object()) {
    auto id = it->find("id");
    auto resume = it->find("resume");
    if (id == it->end() || !id->is_string() || id->get<std::string>().empty())
      return InvalidArgument("\"trajectory\" needs an \"id\"");
    if (resume != it->end() && resume->is_boolean() && resume->get<bool>())
      s.resume_trajectory = id->get<std::string>();
    else
      s.new_trajectory = id->get<std::string>();
  }
  if (s.kind.empty()) s.kind = "container";
  return s;
}

}  // namespace dsec::api
