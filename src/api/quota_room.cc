#include "api/quota_room.h"

#include "base/strings.h"

namespace dsec::api {

StatusOr<QuotaRoom> ParseQuotaRoom(std::string_view text, bool with_hold) {
  QuotaRoom q;
  int seen = 0;
  bool bad = false;
  for (auto part : SplitString(text, ';', /*skip_empty=*/true)) {
    size_t eq = part.find('=');
    std::string_view k = part.substr(0, eq),
                     v = eq == std::string_view::npos ? "" : part.substr(eq + 1);
    if (k == "hold") {
      bad = bad || v.empty() || v.size() > 64;
      q.hold = std::string(v);
      seen |= 1;
      continue;
    }
    auto n = ParseInt64(v);
    if (!n || *n < 0) {
      bad = true;
      break;
    }
    if (k == "sandboxes") q.sandboxes = *n, seen |= 2;
    if (k == "memory_mb") q.memory_mb = *n, seen |= 4;
    if (k == "cpu_milli") q.cpu_milli = *n, seen |= 8;
  }
  const int want = with_hold ? 15 : 14;
  if (bad || (seen & want) != want || (!with_hold && (seen & 1)))
    return InvalidArgument(with_hold ? "Dsec-Quota must be hold=<tag>;sandboxes=N;memory_mb=M;"
                                       "cpu_milli=C"
                                     : "a quota need must be sandboxes=N;memory_mb=M;cpu_milli=C");
  return q;
}

std::string QuotaRoomText(const QuotaRoom& r) {
  return StrCat(
      {r.hold.empty() ? "" : "hold=" + r.hold + ";", "sandboxes=", std::to_string(r.sandboxes),
       ";memory_mb=", std::to_string(r.memory_mb), ";cpu_milli=", std::to_string(r.cpu_milli)});
}

}  // namespace dsec::api
