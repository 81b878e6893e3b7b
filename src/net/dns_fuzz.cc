// Fuzzes the DNS parsers with untrusted bytes: as a query, and as an answer to a fixed query.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "net/dns.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsec::net::dns;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto q = ParseQuery(in)) (void)Reply(in, *q, kNxDomain);
  static const char kQuery[] =
      "\x00\x09\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01"
      "a\x03org\x00\x00\x01\x00\x01";
  auto q = ParseQuery(std::string_view(kQuery, sizeof kQuery - 1));
  if (q) (void)AnswerAddresses(in, *q);
  return 0;
}
