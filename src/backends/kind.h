// The execution forms a sandbox can take. The API, the manager and the state DB name a kind
// by its string (KindName); everything inside the edge passes this enum.
#pragma once

#include <optional>
#include <string_view>

namespace dsec::backends {

enum class Kind : unsigned char { kContainer, kMicrovm };

inline constexpr Kind kAllKinds[] = {Kind::kContainer, Kind::kMicrovm};

// "container", "microvm".
std::string_view KindName(Kind k);
// The kind a name stands for; nullopt for anything else.
std::optional<Kind> KindFromName(std::string_view name);

}  // namespace dsec::backends
