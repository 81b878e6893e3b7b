// The bits of the DNS wire format (RFC 1035) the edge's forwarder needs: reading a query's
// question, building a short answer of its own (NXDOMAIN, no data), and reading the A records
// of an upstream answer. Pure functions over untrusted bytes: every read is bounds-checked and
// name decompression is loop-proof (fuzzed by net_dns_fuzz).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsec::net::dns {

inline constexpr uint16_t kTypeA = 1, kTypeAAAA = 28, kClassIn = 1;
inline constexpr uint8_t kNoError = 0, kServFail = 2, kNxDomain = 3, kRefused = 5;

struct Question {
  uint16_t id = 0;
  std::string name;  // lowercased, without the final dot ("" is the root)
  uint16_t type = 0, qclass = 0;
  size_t end = 0;  // offset just past the question
};

// A standard query (QR 0, opcode 0) with exactly one question; nullopt otherwise.
std::optional<Question> ParseQuery(std::string_view msg);

// An answer made here: the query's header and question, no records, this rcode.
std::string Reply(std::string_view query, const Question& q, uint8_t rcode);

struct Address {
  uint32_t addr;  // host byte order
  uint32_t ttl;   // seconds
};
// The A records (class IN) in the answer section of a response to `q` (same id, QR 1, the same
// question); nullopt when it is not such a response.
std::optional<std::vector<Address>> AnswerAddresses(std::string_view msg, const Question& q);

}  // namespace dsec::net::dns
