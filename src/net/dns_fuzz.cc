// Fuzzes the DNS parsers with untrusted bytes: as a query, and as an answer to a fixed query
// (then rewritten into the sandbox's answer, which must read back as an answer to it).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/dns.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsec::net::dns;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto q = ParseQuery(in)) (void)Reply(in, *q, kNxDomain);
  static const char kQuery[] =
      "\x00\x09\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01"
      "a\x03org\x00\x00\x01\x00\x01";
  const std::string_view query(kQuery, sizeof kQuery - 1);
  auto q = ParseQuery(query);
  if (!q) return 0;
  if (auto a = ParseAnswer(in, *q)) {
    std::string out = BuildAnswer(query, *q, *a, 3600, in.size());
    if (out.size() > 4096 || !ParseAnswer(out, *q)) __builtin_trap();
  }
  return 0;
}
