#include "backends/container/adoption_handle.h"

#include <climits>

#include "base/json.h"

namespace dsec::backends::container {

std::string AdoptionHandle::Encode() const {
  return Json({{"secret", secret},
               {"uid_slot", uid_slot},
               {"layer_fd", layer_fd},
               {"overlays", overlays},
               {"id_base", id_base},
               {"disk_image", disk_image},
               {"stack", {{"base", base}, {"layers", layer_digests}}},
               {"net", {{"addr", net_addr}, {"if", net_if}}}})
      .dump();
}

StatusOr<AdoptionHandle> AdoptionHandle::Parse(const std::string& text) {
  DSEC_ASSIGN_OR_RETURN(Json h, ParseJson(text));
  if (!h.is_object()) return InvalidArgument("adoption handle is not an object");
  AdoptionHandle a;
  DSEC_ASSIGN_OR_RETURN(a.secret, GetString(h, "secret"));
  if (a.secret.empty()) return InvalidArgument("adoption handle has no secret");
  DSEC_ASSIGN_OR_RETURN(a.uid_slot, GetInt(h, "uid_slot", -1, -1, INT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t layer_fd, GetInt(h, "layer_fd", -1, -1, INT32_MAX));
  a.layer_fd = static_cast<int>(layer_fd);
  DSEC_ASSIGN_OR_RETURN(int64_t id_base, GetInt(h, "id_base", 0, 0, UINT32_MAX));
  a.id_base = static_cast<uint32_t>(id_base);
  DSEC_ASSIGN_OR_RETURN(a.disk_image, GetBool(h, "disk_image", false));
  auto strings = [](const Json& j, const char* what, std::vector<std::string>* out) -> Status {
    if (!j.is_array())
      return InvalidArgument(std::string("adoption handle: ") + what + " is not a list");
    for (const auto& s : j) {
      if (!s.is_string())
        return InvalidArgument(std::string("adoption handle: ") + what + " holds a non-string");
      out->push_back(s.get<std::string>());
    }
    return OkStatus();
  };
  if (auto it = h.find("overlays"); it != h.end())
    DSEC_RETURN_IF_ERROR(strings(*it, "overlays", &a.overlays));
  if (auto it = h.find("stack"); it != h.end()) {
    if (!it->is_object()) return InvalidArgument("adoption handle: stack is not an object");
    DSEC_ASSIGN_OR_RETURN(a.base, GetString(*it, "base", "host"));
    if (auto l = it->find("layers"); l != it->end())
      DSEC_RETURN_IF_ERROR(strings(*l, "stack layers", &a.layer_digests));
  }
  if (auto it = h.find("net"); it != h.end()) {
    if (!it->is_object()) return InvalidArgument("adoption handle: net is not an object");
    DSEC_ASSIGN_OR_RETURN(int64_t addr, GetInt(*it, "addr", 0, 0, UINT32_MAX));
    a.net_addr = static_cast<uint32_t>(addr);
    DSEC_ASSIGN_OR_RETURN(a.net_if, GetString(*it, "if", ""));
    if ((a.net_addr == 0) != a.net_if.empty())
      return InvalidArgument("adoption handle: net needs both addr and if");
  }
  return a;
}

}  // namespace dsec::backends::container
