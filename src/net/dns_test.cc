#include "net/dns.h"

#include <gtest/gtest.h>

#include "net/dns_forwarder.h"

namespace dsec::net::dns {
namespace {

std::string Name(const std::string& dotted) {
  std::string out;
  size_t start = 0;
  while (start < dotted.size()) {
    size_t dot = dotted.find('.', start);
    if (dot == std::string::npos) dot = dotted.size();
    out += static_cast<char>(dot - start);
    out += dotted.substr(start, dot - start);
    start = dot + 1;
  }
  return out + '\0';
}

std::string Query(uint16_t id, const std::string& name, uint16_t type) {
  std::string m = {static_cast<char>(id >> 8),
                   static_cast<char>(id & 0xff),
                   0x01,
                   0x00,  //
                   0,
                   1,
                   0,
                   0,
                   0,
                   0,
                   0,
                   0};
  m += Name(name);
  m += {static_cast<char>(type >> 8), static_cast<char>(type & 0xff), 0, 1};
  return m;
}

// An answer to `query` with CNAME -> A records, names compressed.
std::string Answer(const std::string& query, std::vector<std::pair<uint32_t, uint32_t>> as) {
  std::string m = query;
  m[2] = static_cast<char>(0x81);
  m[3] = static_cast<char>(0x80);
  m[7] = static_cast<char>(1 + as.size());
  // CNAME record: name = pointer to the question (offset 12), rdata "cdn.example.net".
  std::string target = Name("cdn.example.net");
  m += {static_cast<char>(0xc0), 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, static_cast<char>(target.size())};
  size_t target_off = m.size();
  m += target;
  for (auto [addr, ttl] : as) {
    m += {static_cast<char>(0xc0),
          static_cast<char>(target_off),
          0,
          1,
          0,
          1,
          static_cast<char>(ttl >> 24),
          static_cast<char>(ttl >> 16),
          static_cast<char>(ttl >> 8),
          static_cast<char>(ttl),
          0,
          4,
          static_cast<char>(addr >> 24),
          static_cast<char>(addr >> 16),
          static_cast<char>(addr >> 8),
          static_cast<char>(addr)};
  }
  return m;
}

TEST(DnsTest, ParsesAQuery) {
  std::string q = Query(0x1234, "PyPI.org", kTypeA);
  auto p = ParseQuery(q);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->id, 0x1234);
  EXPECT_EQ(p->name, "pypi.org");
  EXPECT_EQ(p->type, kTypeA);
  EXPECT_EQ(p->end, q.size());
}

TEST(DnsTest, RefusesWhatIsNotAQuery) {
  std::string q = Query(1, "a.b", kTypeA);
  std::string resp = q;
  resp[2] = static_cast<char>(0x80);  // QR: a response
  EXPECT_FALSE(ParseQuery(resp));
  std::string two = q;
  two[5] = 2;  // two questions
  EXPECT_FALSE(ParseQuery(two));
  EXPECT_FALSE(ParseQuery(q.substr(0, q.size() - 1)));  // truncated
  std::string ptr = q.substr(0, 12) + "\xc0\x0c" + std::string("\0\x01\0\x01", 4);
  EXPECT_FALSE(ParseQuery(ptr));  // no pointers in a question
}

TEST(DnsTest, ReplyKeepsIdAndQuestion) {
  std::string q = Query(7, "evil.example", kTypeA);
  auto p = ParseQuery(q);
  std::string r = Reply(q, *p, kNxDomain);
  EXPECT_EQ(r.size(), q.size());
  EXPECT_EQ(r[0], 0);
  EXPECT_EQ(r[1], 7);
  EXPECT_EQ(static_cast<uint8_t>(r[2]), 0x81);  // QR, RD copied
  EXPECT_EQ(static_cast<uint8_t>(r[3]), 0x83);  // RA, NXDOMAIN
  EXPECT_EQ(r.substr(12), q.substr(12));
}

TEST(DnsTest, ReadsTheAddressesOfAnAnswer) {
  std::string q = Query(9, "files.pythonhosted.org", kTypeA);
  auto p = ParseQuery(q);
  auto a = AnswerAddresses(Answer(q, {{0xc6336401, 300}, {0xc6336402, 30}}), *p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].addr, 0xc6336401u);
  EXPECT_EQ((*a)[0].ttl, 300u);
  EXPECT_EQ((*a)[1].ttl, 30u);
  // Another id, or another question, is not its answer.
  auto other = ParseQuery(Query(10, "files.pythonhosted.org", kTypeA));
  EXPECT_FALSE(AnswerAddresses(Answer(q, {{1, 1}}), *other));
  auto name = ParseQuery(Query(9, "other.org", kTypeA));
  EXPECT_FALSE(AnswerAddresses(Answer(q, {{1, 1}}), *name));
}

TEST(DnsTest, PointerLoopsAndTruncationAreRejected) {
  std::string q = Query(9, "a.org", kTypeA);
  auto p = ParseQuery(q);
  std::string ans = Answer(q, {{1, 1}});
  for (size_t cut = 12; cut < ans.size(); ++cut)
    EXPECT_FALSE(AnswerAddresses(ans.substr(0, cut), *p)) << cut;
  std::string loop = q;
  loop[2] = static_cast<char>(0x81);
  loop[7] = 1;
  size_t self = loop.size();
  loop +=
      {static_cast<char>(0xc0), static_cast<char>(self), 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4};
  EXPECT_FALSE(AnswerAddresses(loop, *p));
}

TEST(DnsTest, FirstNameserver) {
  EXPECT_EQ(FirstNameserver("# x\nsearch lan\nnameserver fd00::1\nnameserver 10.255.255.53\n"),
            0x0affff35u);
  EXPECT_FALSE(FirstNameserver("search lan\n"));
}

}  // namespace
}  // namespace dsec::net::dns
