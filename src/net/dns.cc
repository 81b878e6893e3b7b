#include "net/dns.h"

#include <algorithm>
#include <cctype>

namespace dsec::net::dns {

namespace {

constexpr uint16_t kFlagQr = 0x8000, kFlagTc = 0x0200;
// Opcode (the query's is 0), Z, and AD: a rewritten answer vouches for no signature.
constexpr uint16_t kFlagsNotCopied = 0x7860;

uint16_t U16(std::string_view m, size_t o) {
  return static_cast<uint16_t>(static_cast<uint8_t>(m[o]) << 8 | static_cast<uint8_t>(m[o + 1]));
}
uint32_t U32(std::string_view m, size_t o) {
  return static_cast<uint32_t>(U16(m, o)) << 16 | U16(m, o + 2);
}
void Put16(std::string* m, uint16_t v) {
  *m += static_cast<char>(v >> 8);
  *m += static_cast<char>(v & 0xff);
}
void Put32(std::string* m, uint32_t v) {
  Put16(m, static_cast<uint16_t>(v >> 16));
  Put16(m, static_cast<uint16_t>(v & 0xffff));
}
void Set16(std::string* m, size_t o, uint16_t v) {
  (*m)[o] = static_cast<char>(v >> 8);
  (*m)[o + 1] = static_cast<char>(v & 0xff);
}

bool HostNameByte(unsigned char c) { return isalnum(c) || c == '-' || c == '_'; }

// Reads a name at `off` (following compression pointers when `allow_pointers`); sets `next`
// to the offset after it in the original position and `odd` when a label holds a byte no
// host name has. False when malformed.
bool ReadName(std::string_view m, size_t off, bool allow_pointers, std::string* name, size_t* next,
              bool* odd) {
  std::string out;
  size_t pos = off;
  bool jumped = false;
  int hops = 0;
  *odd = false;
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
    for (size_t i = 0; i < len; ++i) {
      auto c = static_cast<unsigned char>(m[pos + 1 + i]);
      *odd = *odd || !HostNameByte(c);
      out += static_cast<char>(tolower(c));
    }
    pos += 1 + len;
  }
  if (name) *name = std::move(out);
  return true;
}

// A name as labels, uncompressed. Only for names read by ReadName without `odd`: no label
// holds a dot, so splitting at dots gives back the labels.
void PutName(std::string* m, std::string_view name) {
  while (!name.empty()) {
    size_t dot = std::min(name.find('.'), name.size());
    *m += static_cast<char>(dot);
    *m += name.substr(0, dot);
    name.remove_prefix(std::min(dot + 1, name.size()));
  }
  *m += '\0';
}

}  // namespace

std::optional<Question> ParseQuery(std::string_view m) {
  if (m.size() < 12 || m.size() > 4096) return std::nullopt;
  uint16_t flags = U16(m, 2);
  if ((flags & kFlagQr) || ((flags >> 11) & 0xf) != 0) return std::nullopt;  // QR 0, QUERY
  if (U16(m, 4) != 1 || U16(m, 6) != 0 || U16(m, 8) != 0) return std::nullopt;
  Question q;
  q.id = U16(m, 0);
  size_t next = 0;
  if (!ReadName(m, 12, /*allow_pointers=*/false, &q.name, &next, &q.odd_label) ||
      next + 4 > m.size())
    return std::nullopt;
  q.type = U16(m, next);
  q.qclass = U16(m, next + 2);
  q.end = next + 4;
  return q;
}

std::string Reply(std::string_view query, const Question& q, uint8_t rcode) {
  std::string r(query.substr(0, q.end));
  uint16_t flags = static_cast<uint16_t>(kFlagQr | (U16(query, 2) & 0x0100) | 0x0080 | rcode);
  Set16(&r, 2, flags);
  for (size_t i = 6; i < 12; ++i) r[i] = 0;  // no answer, authority or additional records
  return r;
}

std::optional<Answer> ParseAnswer(std::string_view m, const Question& q) {
  if (m.size() < 12 || U16(m, 0) != q.id || !(U16(m, 2) & kFlagQr) || U16(m, 4) != 1)
    return std::nullopt;
  std::string name;
  size_t pos = 0;
  bool odd = false;
  if (!ReadName(m, 12, true, &name, &pos, &odd) || name != q.name || odd != q.odd_label ||
      pos + 4 > m.size() || U16(m, pos) != q.type || U16(m, pos + 2) != q.qclass)
    return std::nullopt;
  pos += 4;
  // The answer section as read; owners with odd labels are kept out of every match (their
  // dotted text is not the name they stand for).
  struct Record {
    std::string owner;
    bool usable;
    uint16_t type;
    uint32_t ttl;
    std::string target;  // CNAME only
    uint32_t addr;       // A only
  };
  std::vector<Record> records;
  for (uint16_t i = 0, n = U16(m, 6); i < n; ++i) {
    Record r;
    size_t next = 0;
    if (!ReadName(m, pos, true, &r.owner, &next, &odd) || next + 10 > m.size()) return std::nullopt;
    r.usable = !odd;
    r.type = U16(m, next);
    uint16_t cls = U16(m, next + 2), rdlen = U16(m, next + 8);
    r.ttl = U32(m, next + 4);
    size_t rdata = next + 10;
    if (rdata + rdlen > m.size()) return std::nullopt;
    pos = rdata + rdlen;
    if (cls != kClassIn) continue;
    if (r.type == kTypeCname) {
      size_t end = 0;
      if (!ReadName(m.substr(0, pos), rdata, true, &r.target, &end, &odd) || end != pos)
        return std::nullopt;
      r.usable = r.usable && !odd;
    } else if (r.type == kTypeA && rdlen == 4) {
      r.addr = U32(m, rdata);
    } else {
      continue;
    }
    records.push_back(std::move(r));
  }
  Answer a;
  a.flags = U16(m, 2);
  // The chain: question -> target -> target..., each link a CNAME owned by the name before.
  std::vector<std::string> chain = {q.name};
  while (a.cnames.size() < kMaxCnameChain) {
    auto link = std::find_if(records.begin(), records.end(), [&](const Record& r) {
      return r.usable && r.type == kTypeCname && r.owner == chain.back();
    });
    if (link == records.end() || std::find(chain.begin(), chain.end(), link->target) != chain.end())
      break;  // the end, or a loop
    a.cnames.push_back({link->target, link->ttl});
    chain.push_back(link->target);
  }
  for (const Record& r : records) {
    if (!r.usable || r.type != kTypeA) continue;
    auto owner = std::find(chain.begin(), chain.end(), r.owner);
    if (owner != chain.end())
      a.addresses.push_back({static_cast<size_t>(owner - chain.begin()), {r.addr, r.ttl}});
  }
  return a;
}

std::optional<std::vector<Address>> AnswerAddresses(std::string_view msg, const Question& q) {
  auto a = ParseAnswer(msg, q);
  if (!a) return std::nullopt;
  std::vector<Address> out;
  for (const auto& r : a->addresses) out.push_back(r.address);
  return out;
}

std::string BuildAnswer(std::string_view query, const Question& q, const Answer& a,
                        uint32_t max_ttl, size_t max_size) {
  // Offsets stay within 4096, far below what a compression pointer (14 bits) can address.
  max_size = std::clamp<size_t>(max_size, 512, 4096);
  std::string r(query.substr(0, q.end));
  uint16_t flags = static_cast<uint16_t>((a.flags | kFlagQr) & ~kFlagsNotCopied);
  for (size_t i = 6; i < 12; ++i) r[i] = 0;
  // Where each name of the chain is written, for the records it owns: the question's name
  // right after the header, each target in the rdata of its CNAME.
  std::vector<uint16_t> name_at = {12};
  uint16_t count = 0;
  auto record = [&](size_t owner, uint16_t type, uint32_t ttl, std::string_view rdata) {
    if (owner >= name_at.size() || r.size() + 12 + rdata.size() > max_size) return false;
    Put16(&r, static_cast<uint16_t>(0xc000 | name_at[owner]));
    Put16(&r, type);
    Put16(&r, kClassIn);
    Put32(&r, std::min(ttl, max_ttl));
    Put16(&r, static_cast<uint16_t>(rdata.size()));
    r += rdata;
    ++count;
    return true;
  };
  bool complete = q.end <= max_size;
  for (size_t i = 0; complete && i < a.cnames.size(); ++i) {
    std::string target;
    PutName(&target, a.cnames[i].target);
    size_t at = r.size() + 12;
    complete = record(i, kTypeCname, a.cnames[i].ttl, target);
    name_at.push_back(static_cast<uint16_t>(at));
  }
  for (size_t i = 0; complete && i < a.addresses.size(); ++i) {
    std::string addr;
    Put32(&addr, a.addresses[i].address.addr);
    complete = record(a.addresses[i].owner, kTypeA, a.addresses[i].address.ttl, addr);
  }
  if (!complete) flags |= kFlagTc;
  Set16(&r, 2, flags);
  Set16(&r, 6, count);
  return r;
}

}  // namespace dsec::net::dns
