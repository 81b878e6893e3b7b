#include "net/policy.h"

#include <gtest/gtest.h>

namespace dsec::net {
namespace {

TEST(NetPolicyTest, BuilderMakesCheckedRules) {
  auto p = PolicyBuilder(NetMode::kAllowlist)
               .Allow("198.51.100.0/24", "443,8000-8100,444", "tcp")
               .Allow("203.0.113.7", "53", "udp")
               .Allow("192.0.2.0/24", "", "icmp")
               .Allow("10.0.0.0/8")
               .Allow("10.0.0.0/8")  // a duplicate is dropped
               .Domain("PyPI.org.")
               .Domain("*.pythonhosted.org")
               .Build();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->rules.size(), 4u);
  EXPECT_EQ(p->rules[0].protos, kTcp);
  ASSERT_EQ(p->rules[0].ports.size(), 2u);  // 443-444 merged
  EXPECT_EQ(p->rules[0].ports[0], (PortRange{443, 444}));
  EXPECT_EQ(PortsText(p->rules[0].ports), "443-444,8000-8100");
  EXPECT_EQ(p->rules[1].prefix, 32);
  EXPECT_EQ(p->rules[2].protos, kIcmp);
  EXPECT_EQ(p->rules[3].protos, kAnyProto);
  EXPECT_TRUE(p->rules[3].ports.empty());
  EXPECT_EQ(p->domains, (std::vector<std::string>{"pypi.org", "*.pythonhosted.org"}));
  // Every port is no port list at all.
  auto all = MakeRule("10.0.0.0/8", kTcp, {{1, 100}, {50, 65535}});
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->ports.empty());
}

TEST(NetPolicyTest, BuilderReportsTheFirstError) {
  struct Case {
    PolicyBuilder builder;
    const char* says;
  } cases[] = {
      {PolicyBuilder(NetMode::kNone).Allow("1.2.3.0/24"), "takes no rules"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("10.1.2.3/8"), "did you mean 10.0.0.0/8"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("fd00::/8"), "IPv4 only"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("1.2.3.256"), "bad network rule cidr"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("1.2.3.4", "0"), "bad port"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("1.2.3.4", "90-80"), "bad port"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("1.2.3.4", "", "sctp"), "tcp, udp, icmp"},
      {PolicyBuilder(NetMode::kAllowlist).Allow("1.2.3.4", "1", "icmp"), "takes no \"ports\""},
      {PolicyBuilder(NetMode::kAllowlist).Domain("bad domain").Allow("1.2.3.256"), "bad domain"},
  };
  for (const auto& c : cases) {
    auto p = c.builder.Build();
    ASSERT_FALSE(p.ok()) << c.says;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().message();
  }
  std::vector<Rule> many(kMaxRules + 1, *MakeRule("10.0.0.0/8"));
  EXPECT_FALSE(MakePolicy(NetMode::kOpen, many, {}).ok());
  EXPECT_EQ(ParseNetMode("wide").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseNetMode("open").value(), NetMode::kOpen);
  EXPECT_EQ(ProtoName(kUdp), "udp");
  EXPECT_EQ(ProtoName(kAnyProto), "any");
}

TEST(NetPolicyTest, Domains) {
  auto p =
      PolicyBuilder(NetMode::kAllowlist).Domain("pypi.org").Domain("*.pythonhosted.org").Build();
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(DomainAllowed(*p, "pypi.org"));
  EXPECT_FALSE(DomainAllowed(*p, "www.pypi.org"));
  EXPECT_TRUE(DomainAllowed(*p, "files.pythonhosted.org"));
  EXPECT_FALSE(DomainAllowed(*p, "pythonhosted.org"));
  EXPECT_FALSE(DomainAllowed(*p, "evilpythonhosted.org"));
  EXPECT_FALSE(NormalizeDomain("-bad.org").ok());
  EXPECT_FALSE(NormalizeDomain("*.").ok());
  EXPECT_EQ(NormalizeDomain("*.Example.ORG.").value(), "*.example.org");
}

TEST(NetPolicyTest, Cidr) {
  uint32_t a = 0;
  uint8_t p = 0;
  EXPECT_TRUE(ParseCidr("10.213.0.0/16", &a, &p));
  EXPECT_EQ(a, 0x0ad50000u);
  EXPECT_EQ(p, 16);
  EXPECT_FALSE(ParseCidr("10.213.0.0/33", &a, &p));
  EXPECT_FALSE(ParseCidr("010.1.1.1", &a, &p));
  EXPECT_EQ(Ipv4ToString(0xc0000201u), "192.0.2.1");
}

}  // namespace
}  // namespace dsec::net
