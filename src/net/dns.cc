#include "net/dns.h"

#include <cctype>

namespace dsec::net::dns {

namespace {

uint16_t U16(std::string_view m, size_t o) {
  return static_cast<uint16_t>(static_cast<uint8_t>(m[o]) << 8 | static_cast<uint8_t>(m[o + 1]));
}
uint32_t U32(std::string_view m, size_t o) {
  return static_cast<uint32_t>(U16(m, o)) << 16 | U16(m, o + 2);
}

// Reads a name at `off` (following compression pointers when `allow_pointers`); sets `next`
// to the offset after it in the original position. False when malformed.
bool ReadName(std::string_view m, size_t off, bool allow_pointers, std::string* name,
              size_t* next) {
  std::string out;
  size_t pos = off;
  bool jumped = false;
  int hops = 0;
  for (;;) {
    if (pos >= m.size()) return false;
    uint8_t len = static_cast<uint8_t>(m[pos]);
    if ((len & 0xc0) == 0xc0) {
      if (!allow_pointers || pos + 1 >= m.size() || ++hops > 32) return false;
      if (!jumped) *next = pos + 2;
      jumped = true;
      pos = static_cast<size_t>(len & 0x3f) << 8 | static_cast<uint8_t>(m[pos + 1]);
      continue;
    }
    if (len & 0xc0) return false;  // reserved label types
    if (len == 0) {
      if (!jumped) *next = pos + 1;
      break;
    }
    if (pos + 1 + len > m.size() || out.size() + len + 1 > 253 + 1) return false;
    if (!out.empty()) out += '.';
    for (size_t i = 0; i < len; ++i)
      out += static_cast<char>(tolower(static_cast<unsigned char>(m[pos + 1 + i])));
    pos += 1 + len;
  }
  if (name) *name = std::move(out);
  return true;
}

}  // namespace

std::optional<Question> ParseQuery(std::string_view m) {
  if (m.size() < 12 || m.size() > 4096) return std::nullopt;
  uint16_t flags = U16(m, 2);
  if ((flags & 0x8000) || ((flags >> 11) & 0xf) != 0) return std::nullopt;  // QR 0, QUERY
  if (U16(m, 4) != 1 || U16(m, 6) != 0 || U16(m, 8) != 0) return std::nullopt;
  Question q;
  q.id = U16(m, 0);
  size_t next = 0;
  if (!ReadName(m, 12, /*allow_pointers=*/false, &q.name, &next) || next + 4 > m.size())
    return std::nullopt;
  q.type = U16(m, next);
  q.qclass = U16(m, next + 2);
  q.end = next + 4;
  return q;
}

std::string Reply(std::string_view query, const Question& q, uint8_t rcode) {
  std::string r(query.substr(0, q.end));
  uint16_t flags = static_cast<uint16_t>(0x8000 | (U16(query, 2) & 0x0100) | 0x0080 | rcode);
  r[2] = static_cast<char>(flags >> 8);
  r[3] = static_cast<char>(flags & 0xff);
  for (size_t i = 6; i < 12; ++i) r[i] = 0;  // no answer, authority or additional records
  return r;
}

std::optional<std::vector<Address>> AnswerAddresses(std::string_view m, const Question& q) {
  if (m.size() < 12 || U16(m, 0) != q.id || !(U16(m, 2) & 0x8000) || U16(m, 4) != 1)
    return std::nullopt;
  std::string name;
  size_t pos = 0;
  if (!ReadName(m, 12, true, &name, &pos) || name != q.name || pos + 4 > m.size() ||
      U16(m, pos) != q.type || U16(m, pos + 2) != q.qclass)
    return std::nullopt;
  pos += 4;
  std::vector<Address> out;
  for (uint16_t i = 0, n = U16(m, 6); i < n; ++i) {
    size_t next = 0;
    if (!ReadName(m, pos, true, nullptr, &next) || next + 10 > m.size()) return std::nullopt;
    uint16_t type = U16(m, next), cls = U16(m, next + 2), rdlen = U16(m, next + 8);
    uint32_t ttl = U32(m, next + 4);
    size_t rdata = next + 10;
    if (rdata + rdlen > m.size()) return std::nullopt;
    if (type == kTypeA && cls == kClassIn && rdlen == 4) out.push_back({U32(m, rdata), ttl});
    pos = rdata + rdlen;
  }
  return out;
}

}  // namespace dsec::net::dns
