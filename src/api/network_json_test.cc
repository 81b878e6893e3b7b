#include "api/network_json.h"

#include <gtest/gtest.h>

namespace dsec::api {

using namespace net;  // NOLINT: the policy's types and constants
namespace {

StatusOr<NetworkPolicy> P(const char* text) {
  auto j = ParseJson(text);
  EXPECT_TRUE(j.ok());
  return NetworkPolicyFromJson(&*j);
}

TEST(NetworkJsonTest, DefaultsToNone) {
  auto p = NetworkPolicyFromJson(nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->mode, NetMode::kNone);
  EXPECT_EQ(ToJson(*p).dump(), R"({"mode":"none"})");
}

TEST(NetworkJsonTest, RulesPortsAndProtocols) {
  auto p = P(R"({"mode":"allowlist","rules":[
      {"cidr":"198.51.100.0/24","ports":"443,8000-8100,444","proto":"tcp"},
      {"cidr":"203.0.113.7","ports":[53,"60-70"],"proto":"udp"},
      {"cidr":"192.0.2.0/24","proto":"icmp"},
      {"cidr":"10.0.0.0/8"}],
      "domains":["PyPI.org.","*.pythonhosted.org"]})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->rules.size(), 4u);
  EXPECT_EQ(p->rules[0].protos, kTcp);
  ASSERT_EQ(p->rules[0].ports.size(), 2u);  // 443-444 merged
  EXPECT_EQ(p->rules[0].ports[0], (PortRange{443, 444}));
  EXPECT_EQ(p->rules[0].ports[1], (PortRange{8000, 8100}));
  EXPECT_EQ(p->rules[1].prefix, 32);
  EXPECT_EQ(p->rules[1].ports[1], (PortRange{60, 70}));
  EXPECT_EQ(p->rules[2].protos, kIcmp);
  EXPECT_EQ(p->rules[3].protos, kAnyProto);
  EXPECT_TRUE(p->rules[3].ports.empty());
  EXPECT_EQ(p->domains[0], "pypi.org");
  // Round trip.
  Json j = ToJson(*p);
  EXPECT_EQ(j["rules"][0]["ports"], "443-444,8000-8100");
  auto again = NetworkPolicyFromJson(&j);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *p);
}

TEST(NetworkJsonTest, ClearErrors) {
  struct Case {
    const char* json;
    const char* says;
  } cases[] = {
      {R"({"mode":"wide"})", "must be \"none\", \"allowlist\" or \"open\""},
      {R"({"mode":"none","rules":[{"cidr":"1.2.3.0/24"}]})", "takes no rules"},
      {R"({"mode":"allowlist","rules":[{"cidr":"10.1.2.3/8"}]})", "did you mean 10.0.0.0/8"},
      {R"({"mode":"allowlist","rules":[{"cidr":"fd00::/8"}]})", "IPv4 only"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.256"}]})", "bad network rule cidr"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","ports":"0"}]})", "bad port"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","ports":"90-80"}]})", "bad port"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","proto":"sctp"}]})", "tcp, udp, icmp"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","proto":"icmp","ports":1}]})",
       "takes no \"ports\""},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","port":1}]})", "network.rules[].port"},
      {R"({"mode":"allowlist","domains":["bad domain"]})", "bad domain"},
      {R"({"mode":"allowlist","extra":1})", "unknown field \"network.extra\""},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","ports":{}}]})", "must be a port"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","ports":[]}]})", "is empty"},
      {R"({"mode":"allowlist","rules":[{"cidr":"1.2.3.4","proto":6}]})", "tcp, udp, icmp"},
      {R"({"mode":"allowlist","rules":[{"ports":"80"}]})", "needs a \"cidr\""},
      {R"({"mode":"allowlist","rules":{}})", "must be a list"},
      {R"({"mode":"allowlist","domains":[5]})", "list of names"},
      {R"({"mode":5})", "\"network\" must be"},
      {R"([])", "\"network\" must be"},
  };
  for (const auto& c : cases) {
    auto p = P(c.json);
    ASSERT_FALSE(p.ok()) << c.json;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos)
        << c.json << " -> " << p.status().message();
  }
}

}  // namespace
}  // namespace dsec::api
