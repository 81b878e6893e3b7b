#include "net/dns.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <mutex>

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
std::string CnameAnswer(const std::string& query, std::vector<std::pair<uint32_t, uint32_t>> as) {
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
  auto a = AnswerAddresses(CnameAnswer(q, {{0xc6336401, 300}, {0xc6336402, 30}}), *p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].addr, 0xc6336401u);
  EXPECT_EQ((*a)[0].ttl, 300u);
  EXPECT_EQ((*a)[1].ttl, 30u);
  // Another id, or another question, is not its answer.
  auto other = ParseQuery(Query(10, "files.pythonhosted.org", kTypeA));
  EXPECT_FALSE(AnswerAddresses(CnameAnswer(q, {{1, 1}}), *other));
  auto name = ParseQuery(Query(9, "other.org", kTypeA));
  EXPECT_FALSE(AnswerAddresses(CnameAnswer(q, {{1, 1}}), *name));
}

TEST(DnsTest, PointerLoopsAndTruncationAreRejected) {
  std::string q = Query(9, "a.org", kTypeA);
  auto p = ParseQuery(q);
  std::string ans = CnameAnswer(q, {{1, 1}});
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

// Resource records for hand-made answers: `owner` is wire bytes (Name() or Ptr()).
std::string Ptr(size_t off) { return {static_cast<char>(0xc0 | off >> 8), static_cast<char>(off)}; }
std::string Rr(const std::string& owner, uint16_t type, uint32_t ttl, const std::string& rdata) {
  std::string r = owner;
  r += {static_cast<char>(type >> 8), static_cast<char>(type), 0, 1};
  r += {static_cast<char>(ttl >> 24), static_cast<char>(ttl >> 16), static_cast<char>(ttl >> 8),
        static_cast<char>(ttl)};
  r += {static_cast<char>(rdata.size() >> 8), static_cast<char>(rdata.size())};
  return r + rdata;
}
std::string A(uint32_t addr, const std::string& owner, uint32_t ttl = 300) {
  return Rr(owner, kTypeA, ttl,
            {static_cast<char>(addr >> 24), static_cast<char>(addr >> 16),
             static_cast<char>(addr >> 8), static_cast<char>(addr)});
}
std::string Cname(const std::string& owner, const std::string& target, uint32_t ttl = 300) {
  return Rr(owner, kTypeCname, ttl, Name(target));
}
// A response to `query` (its id unless `id` is given) with these answer records.
std::string Response(const std::string& query, const std::vector<std::string>& records,
                     std::optional<uint16_t> id = std::nullopt) {
  std::string m = query;
  if (id) {
    m[0] = static_cast<char>(*id >> 8);
    m[1] = static_cast<char>(*id & 0xff);
  }
  m[2] = static_cast<char>(0x81);
  m[3] = static_cast<char>(0x80);
  m[6] = static_cast<char>(records.size() >> 8);
  m[7] = static_cast<char>(records.size());
  for (const auto& r : records) m += r;
  return m;
}
bool Contains(const std::string& msg, uint32_t addr) {
  std::string bytes = {static_cast<char>(addr >> 24), static_cast<char>(addr >> 16),
                       static_cast<char>(addr >> 8), static_cast<char>(addr)};
  return msg.find(bytes) != std::string::npos;
}
std::vector<uint32_t> Addrs(const std::optional<std::vector<Address>>& a) {
  std::vector<uint32_t> out;
  if (a)
    for (const auto& x : *a) out.push_back(x.addr);
  return out;
}

TEST(DnsTest, KeepsOnlyTheARecordsOfTheQuestionAndItsCnameChain) {
  std::string q = Query(9, "www.Example.org", kTypeA);
  auto p = ParseQuery(q);
  std::string ans = Response(q, {
                                    A(0x06060601, Name("unrelated.net")),  // before the chain
                                    Cname(Ptr(12), "Edge.CDN.net"),
                                    A(0x01010101, Name("edge.cdn.NET")),  // case-insensitive
                                    A(0x06060602, Name("cdn.net")),       // a suffix is not it
                                    A(0x02020202, Ptr(12)),               // the question's own
                                    A(0x06060603, Name("www.example.org.evil")),
                                });
  EXPECT_EQ(Addrs(AnswerAddresses(ans, *p)), (std::vector<uint32_t>{0x01010101, 0x02020202}));
  auto a = ParseAnswer(ans, *p);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->cnames.size(), 1u);
  EXPECT_EQ(a->cnames[0].target, "edge.cdn.net");
  EXPECT_EQ(a->addresses[0].owner, 1u);
  EXPECT_EQ(a->addresses[1].owner, 0u);
}

TEST(DnsTest, CnameChainIsFollowedInAnyOrderBoundedAndLoopProof) {
  // n0 -> n1 -> ... -> n9, records listed backwards: the chain stops after kMaxCnameChain.
  std::string q = Query(9, "n0.org", kTypeA);
  auto p = ParseQuery(q);
  std::vector<std::string> recs;
  for (uint32_t i = 0; i <= 9; ++i)
    recs.push_back(A(0x0a000000 + i, Name("n" + std::to_string(i) + ".org")));
  for (int i = 8; i >= 0; --i)
    recs.push_back(
        Cname(Name("n" + std::to_string(i) + ".org"), "n" + std::to_string(i + 1) + ".org"));
  auto a = AnswerAddresses(Response(q, recs), *p);
  std::vector<uint32_t> want;
  for (uint32_t i = 0; i <= kMaxCnameChain; ++i) want.push_back(0x0a000000 + i);
  EXPECT_EQ(Addrs(a), want);  // n9.org, 9 links away, is not kept
  // A loop ends the chain; what is off it stays out.
  auto loop =
      AnswerAddresses(Response(q, {Cname(Ptr(12), "n1.org"), Cname(Name("n1.org"), "n0.org"),
                                   A(1, Name("n1.org")), A(2, Name("n2.org"))}),
                      *p);
  EXPECT_EQ(Addrs(loop), std::vector<uint32_t>{1});
  // A CNAME whose target has a dotted label ends the chain: its text is not its name.
  std::string dotted = "\x06n1.org\x00";  // one label "n1.org"
  dotted.resize(8);
  auto odd =
      AnswerAddresses(Response(q, {Rr(Ptr(12), kTypeCname, 60, dotted), A(3, Name("n1.org"))}), *p);
  EXPECT_EQ(Addrs(odd), std::vector<uint32_t>{});
}

TEST(DnsTest, QuestionsWithLabelsNoHostNameHasAreMarked) {
  auto odd = [](std::string wire_name) {
    std::string m =
        Query(1, "x", kTypeA).substr(0, 12) + wire_name + std::string("\0\x01\0\x01", 4);
    auto q = ParseQuery(m);
    EXPECT_TRUE(q) << wire_name;
    return q && q->odd_label;
  };
  EXPECT_TRUE(odd(std::string("\x08pypi.org\x00", 10)));  // one label "pypi.org"
  EXPECT_TRUE(
      odd(std::string("\x03"
                      "a\0b\x03org\x00",
                      9)));
  EXPECT_TRUE(
      odd(std::string("\x03"
                      "a b\x03org\x00",
                      9)));
  EXPECT_FALSE(odd(Name("_dmarc.x-Y9.org")));
  EXPECT_FALSE(odd(Name("")));
  // The dotted label reads as the name the policy lists, which is why it is refused.
  auto q = ParseQuery(Query(1, "x", kTypeA).substr(0, 12) +
                      std::string("\x08pypi.org\x00\x00\x01\x00\x01", 14));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->name, "pypi.org");
}

TEST(DnsTest, BuiltAnswerHasTheClientsIdTheChainAndCappedTtls) {
  std::string client = Query(0x1234, "WWW.example.org", kTypeA);
  auto cq = ParseQuery(client);
  Question uq = *cq;
  uq.id = 0xbeef;
  std::string up =
      Response(client,
               {Cname(Ptr(12), "edge.cdn.net", 86400), A(0x06060606, Name("other.net")),
                A(0x01010101, Name("edge.cdn.net"), 7200), A(0x02020202, Ptr(12), 30)},
               0xbeef);
  up += A(0x06060607, Name("additional.net"));  // beyond ANCOUNT
  auto a = ParseAnswer(up, uq);
  ASSERT_TRUE(a);
  std::string out = BuildAnswer(client, *cq, *a, 3600, up.size());
  EXPECT_EQ(out.substr(0, 2), client.substr(0, 2));
  EXPECT_EQ(out.substr(12, cq->end - 12), client.substr(12, cq->end - 12));  // 0x20 case kept
  EXPECT_FALSE(Contains(out, 0x06060606));
  EXPECT_FALSE(Contains(out, 0x06060607));
  EXPECT_EQ(out[2] & 0x02, 0);  // not truncated
  auto back = ParseAnswer(out, *cq);
  ASSERT_TRUE(back);
  ASSERT_EQ(back->cnames.size(), 1u);
  EXPECT_EQ(back->cnames[0].target, "edge.cdn.net");
  EXPECT_EQ(back->cnames[0].ttl, 3600u);
  ASSERT_EQ(back->addresses.size(), 2u);
  EXPECT_EQ(back->addresses[0].address.addr, 0x01010101u);
  EXPECT_EQ(back->addresses[0].address.ttl, 3600u);
  EXPECT_EQ(back->addresses[1].address.addr, 0x02020202u);
  EXPECT_EQ(back->addresses[1].address.ttl, 30u);
  // Too many records for the size: the ones that fit, and TC.
  std::vector<std::string> many;
  for (uint32_t i = 0; i < 100; ++i) many.push_back(A(0x0b000000 + i, Ptr(12)));
  auto big = ParseAnswer(Response(client, many, 0xbeef), uq);
  ASSERT_TRUE(big);
  std::string cut = BuildAnswer(client, *cq, *big, 3600, 512);
  EXPECT_LE(cut.size(), 512u);
  EXPECT_NE(cut[2] & 0x02, 0);
  auto kept = AnswerAddresses(cut, *cq);
  ASSERT_TRUE(kept);
  EXPECT_GT(kept->size(), 20u);
  EXPECT_LT(kept->size(), 100u);
}

// The forwarder on loopback, between a client socket and a fake upstream made here.
class ForwarderTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kLoopback = 0x7f000001;

  void SetUp() override {
    upstream_ = Udp(0);
    ASSERT_TRUE(upstream_);
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    ASSERT_EQ(getsockname(upstream_.get(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
    upstream_port_ = ntohs(sa.sin_port);
  }

  void Start(DnsForwarderOptions o = {}) {
    o.listen_port = 0;
    auto f = DnsForwarder::Start(
        kLoopback, kLoopback, upstream_port_,
        [](uint32_t) {
          NetworkPolicy p;
          p.mode = NetMode::kAllowlist;
          p.domains = {"pypi.org"};
          return std::optional<NetworkPolicy>(p);
        },
        [this](uint32_t, const std::vector<Address>& a) {
          std::lock_guard<std::mutex> l(mu_);
          allowed_.insert(allowed_.end(), a.begin(), a.end());
        },
        o);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    forwarder_ = std::move(*f);
    client_ = Udp(forwarder_->port());
    ASSERT_TRUE(client_);
  }

  // A UDP socket on loopback, connected to `port` when not 0.
  static UniqueFd Udp(uint16_t port) {
    UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(kLoopback);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) return UniqueFd();
    sa.sin_port = htons(port);
    if (port && connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
      return UniqueFd();
    return fd;
  }
  // The next datagram within `ms` (and, for the upstream, who sent it); nullopt if none came.
  static std::optional<std::string> Recv(int fd, int ms, sockaddr_in* from = nullptr) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return std::nullopt;
    char buf[4096];
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    ssize_t n = recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&sa), &len);
    if (n < 0) return std::nullopt;
    if (from) *from = sa;
    return std::string(buf, static_cast<size_t>(n));
  }
  void Ask(const std::string& query) {
    ASSERT_EQ(send(client_.get(), query.data(), query.size(), 0),
              static_cast<ssize_t>(query.size()));
  }
  void SendFromUpstream(const sockaddr_in& to, const std::string& msg) {
    ASSERT_EQ(sendto(upstream_.get(), msg.data(), msg.size(), 0,
                     reinterpret_cast<const sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(msg.size()));
  }
  std::vector<Address> Allowed() {
    std::lock_guard<std::mutex> l(mu_);
    return allowed_;
  }

  UniqueFd upstream_, client_;
  uint16_t upstream_port_ = 0;
  std::unique_ptr<DnsForwarder> forwarder_;
  std::mutex mu_;
  std::vector<Address> allowed_;
};

TEST_F(ForwarderTest, UpstreamGetsTheForwardersIdAndOnlyAnswersWithItCount) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::string query = Query(0x1234, "pypi.org", kTypeA);
  Ask(query);
  sockaddr_in from{};
  auto up = Recv(upstream_.get(), 2000, &from);
  ASSERT_TRUE(up);
  auto uq = ParseQuery(*up);
  ASSERT_TRUE(uq);
  EXPECT_NE(uq->id, 0x1234);  // the sandbox's id is not the one to guess
  EXPECT_EQ(up->substr(2), query.substr(2));
  // A spoofed answer carrying the id the sandbox chose is not the answer.
  SendFromUpstream(from, Response(query, {A(0x06060606, Ptr(12))}, 0x1234));
  // Neither is one to another question with the right id.
  SendFromUpstream(from, Response(Query(uq->id, "pypa.org", kTypeA), {A(0x06060605, Ptr(12))}));
  SendFromUpstream(
      from, Response(*up, {Cname(Ptr(12), "cdn.example.net"), A(0x06060607, Name("evil.example")),
                           A(0xc6336401, Name("cdn.example.net"))}));
  auto reply = Recv(client_.get(), 2000);
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->substr(0, 2), query.substr(0, 2));  // the sandbox's id again
  auto cq = ParseQuery(query);
  EXPECT_EQ(Addrs(AnswerAddresses(*reply, *cq)), std::vector<uint32_t>{0xc6336401});
  for (uint32_t evil : {0x06060605u, 0x06060606u, 0x06060607u})
    EXPECT_FALSE(Contains(*reply, evil));
  std::vector<uint32_t> allowed;
  for (const auto& a : Allowed()) allowed.push_back(a.addr);
  EXPECT_EQ(allowed, std::vector<uint32_t>{0xc6336401});
}

TEST_F(ForwarderTest, DottedOrNulLabelsAreRefusedWithoutAskingUpstream) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::string header = Query(0x4321, "x", kTypeA).substr(0, 12);
  for (std::string name :
       {std::string("\x08pypi.org\x00", 10), std::string("\x04py\0i\x03org\x00", 10)}) {
    Ask(header + name + std::string("\0\x01\0\x01", 4));
    auto reply = Recv(client_.get(), 2000);
    ASSERT_TRUE(reply);
    EXPECT_EQ(reply->substr(0, 2), header.substr(0, 2));
    EXPECT_EQ(static_cast<uint8_t>((*reply)[3]) & 0x0f, kRefused);
  }
  EXPECT_FALSE(Recv(upstream_.get(), 300));
  EXPECT_TRUE(Allowed().empty());
}

TEST_F(ForwarderTest, AnAddressStaysAllowedAtMostMaxTtl) {
  DnsForwarderOptions o;
  o.max_ttl_s = 120;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  std::string query = Query(7, "pypi.org", kTypeA);
  Ask(query);
  sockaddr_in from{};
  auto up = Recv(upstream_.get(), 2000, &from);
  ASSERT_TRUE(up);
  SendFromUpstream(from, Response(*up, {A(0x01010101, Ptr(12), 86400), A(0x02020202, Ptr(12), 0),
                                        A(0x03030303, Ptr(12), 90)}));
  auto reply = Recv(client_.get(), 2000);
  ASSERT_TRUE(reply);
  auto told = AnswerAddresses(*reply, *ParseQuery(query));
  ASSERT_TRUE(told);
  ASSERT_EQ(told->size(), 3u);
  EXPECT_EQ((*told)[0].ttl, 120u);  // what the sandbox caches agrees with what is allowed
  EXPECT_EQ((*told)[1].ttl, 0u);
  EXPECT_EQ((*told)[2].ttl, 90u);
  auto allowed = Allowed();
  ASSERT_EQ(allowed.size(), 3u);
  EXPECT_EQ(allowed[0].ttl, 120u);
  EXPECT_EQ(allowed[1].ttl, 60u);  // a minute at least, for the connection right after
  EXPECT_EQ(allowed[2].ttl, 90u);
}

TEST_F(ForwarderTest, DefaultMaxTtlIsAnHour) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Ask(Query(7, "pypi.org", kTypeA));
  sockaddr_in from{};
  auto up = Recv(upstream_.get(), 2000, &from);
  ASSERT_TRUE(up);
  SendFromUpstream(from, Response(*up, {A(0x01010101, Ptr(12), 86400)}));
  ASSERT_TRUE(Recv(client_.get(), 2000));
  auto allowed = Allowed();
  ASSERT_EQ(allowed.size(), 1u);
  EXPECT_EQ(allowed[0].ttl, 3600u);
}

TEST(DnsTest, FirstNameserver) {
  EXPECT_EQ(FirstNameserver("# x\nsearch lan\nnameserver fd00::1\nnameserver 10.255.255.53\n"),
            0x0affff35u);
  EXPECT_FALSE(FirstNameserver("search lan\n"));
}

}  // namespace
}  // namespace dsec::net::dns
