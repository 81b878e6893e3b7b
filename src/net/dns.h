// The bits of the DNS wire format (RFC 1035) the edge's forwarder needs: reading a query's
// question, building a short answer of its own (NXDOMAIN, no data), reading an upstream answer
// down to the question's CNAME chain and the A records it owns, and writing that back as the
// sandbox's answer. Pure functions over untrusted bytes: every read is bounds-checked and name
// decompression is loop-proof (fuzzed by net_dns_fuzz).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsec::net::dns {

inline constexpr uint16_t kTypeA = 1, kTypeCname = 5, kTypeAAAA = 28, kClassIn = 1;
inline constexpr uint8_t kNoError = 0, kServFail = 2, kNxDomain = 3, kRefused = 5;
// CNAMEs followed from the question's name; resolvers give up at about this depth too.
inline constexpr size_t kMaxCnameChain = 8;

struct Question {
  uint16_t id = 0;
  std::string name;  // lowercased, without the final dot ("" is the root)
  uint16_t type = 0, qclass = 0;
  size_t end = 0;  // offset just past the question
  // A label holds a byte no host name has (anything but letters, digits, '-' and '_'). `name`
  // is then not what the upstream resolves: the one label "pypi.org" reads as pypi.org here.
  bool odd_label = false;
};

// A standard query (QR 0, opcode 0) with exactly one question; nullopt otherwise.
std::optional<Question> ParseQuery(std::string_view msg);

// An answer made here: the query's header and question, no records, this rcode.
std::string Reply(std::string_view query, const Question& q, uint8_t rcode);

struct Address {
  uint32_t addr;  // host byte order
  uint32_t ttl;   // seconds
};

// What of an upstream answer is the question's: the CNAME chain from its name (each target
// owned by the previous name) and the A records (class IN) owned by a name on that chain.
// Every other record of the answer section, and the other sections, are left out.
struct Answer {
  struct Cname {
    std::string target;  // lowercased, like Question::name
    uint32_t ttl;
  };
  struct A {
    size_t owner;  // 0: the question's name; i: cnames[i - 1].target
    Address address;
  };
  uint16_t flags = 0;  // the upstream's header flags (QR, AA, TC, RD, RA, rcode...)
  std::vector<Cname> cnames;
  std::vector<A> addresses;
};

// Reads a response to `q` (same id, QR 1, the same question, case-insensitively); nullopt
// when it is not such a response or is malformed.
std::optional<Answer> ParseAnswer(std::string_view msg, const Question& q);
// The addresses of ParseAnswer(msg, q), TTLs as they came.
std::optional<std::vector<Address>> AnswerAddresses(std::string_view msg, const Question& q);

// The answer for the sandbox that asked `query` (parsed as `q`): its id and question, the
// upstream's flags, then `a`'s CNAME chain and A records, every TTL at most `max_ttl`, names
// compressed. Records past `max_size` bytes are left out and TC is set, as a server does.
std::string BuildAnswer(std::string_view query, const Question& q, const Answer& a,
                        uint32_t max_ttl, size_t max_size);

}  // namespace dsec::net::dns
