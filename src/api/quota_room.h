// The quota room an apiserver admitted a create in, as the edge is told it (Dsec-Quota:
// "hold=<tag>;sandboxes=N;memory_mb=M;cpu_milli=C") and as the edge answers what a create takes
// beyond it (Dsec-Quota-Need: the same without the hold). One codec for both ends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsec::api {

struct QuotaRoom {
  std::string hold;  // the quota hold's tag ("" in a Need)
  int64_t sandboxes = 0, memory_mb = 0, cpu_milli = 0;
};

// Every count must be there (and `hold` with with_hold); InvalidArgument naming the form.
StatusOr<QuotaRoom> ParseQuotaRoom(std::string_view text, bool with_hold);
// "hold=<tag>;" (when it has one) then "sandboxes=N;memory_mb=M;cpu_milli=C".
std::string QuotaRoomText(const QuotaRoom& r);

}  // namespace dsec::api
