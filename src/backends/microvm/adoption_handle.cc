#include "backends/microvm/adoption_handle.h"

#include <climits>

#include "base/json.h"

namespace dsec::backends::microvm {

std::string VmAdoptionHandle::Encode() const {
  return Json({{"secret", secret},
               {"uid_slot", uid_slot},
               {"qemu_pid", qemu_pid},
               {"layers", layer_digests},
               {"net_addr", net_addr},
               {"net_if", net_if}})
      .dump();
}

StatusOr<VmAdoptionHandle> VmAdoptionHandle::Parse(const std::string& text) {
  DSEC_ASSIGN_OR_RETURN(Json h, ParseJson(text));
  if (!h.is_object()) return InvalidArgument("microVM adoption handle is not an object");
  VmAdoptionHandle a;
  DSEC_ASSIGN_OR_RETURN(a.secret, GetString(h, "secret"));
  if (a.secret.empty()) return InvalidArgument("microVM adoption handle has no secret");
  DSEC_ASSIGN_OR_RETURN(a.uid_slot, GetInt(h, "uid_slot", -1, -1, INT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t pid, GetInt(h, "qemu_pid", std::nullopt, 1, INT32_MAX));
  a.qemu_pid = static_cast<pid_t>(pid);
  if (auto it = h.find("layers"); it != h.end()) {
    if (!it->is_array()) return InvalidArgument("microVM adoption handle: layers is not a list");
    for (const auto& d : *it) {
      if (!d.is_string())
        return InvalidArgument("microVM adoption handle: layers holds a non-string");
      a.layer_digests.push_back(d.get<std::string>());
    }
  }
  DSEC_ASSIGN_OR_RETURN(int64_t addr, GetInt(h, "net_addr", 0, 0, UINT32_MAX));
  a.net_addr = static_cast<uint32_t>(addr);
  DSEC_ASSIGN_OR_RETURN(a.net_if, GetString(h, "net_if", ""));
  if (a.net_addr != 0 && (a.net_if.empty() || a.net_if.size() >= 16))
    return InvalidArgument("microVM adoption handle: a network address without its tap");
  return a;
}

}  // namespace dsec::backends::microvm
