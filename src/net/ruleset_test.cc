// The node network's nftables text against golden files (net/testdata/*.nft): a change to what
// the kernel is told shows up here as a diff to review. DSEC_UPDATE_GOLDEN=1 rewrites them.
// node_network_test (privileged) checks that the kernel takes this text and enforces it.
#include "net/ruleset.h"

#include <gtest/gtest.h>

#include <fcntl.h>

#include <cstdlib>

#include "base/file_util.h"

namespace dsec::net {
namespace {

void ExpectGolden(const std::string& name, const std::string& got) {
  const std::string path = std::string(DSEC_NET_TESTDATA) + "/" + name;
  if (getenv("DSEC_UPDATE_GOLDEN")) {
    ASSERT_TRUE(WriteStringToFile(path, got, O_WRONLY | O_CREAT | O_TRUNC).ok()) << path;
    return;
  }
  auto want = ReadFileToString(path);
  ASSERT_TRUE(want.ok()) << path << ": " << want.status().ToString()
                         << " (DSEC_UPDATE_GOLDEN=1 writes it)";
  EXPECT_EQ(got, *want) << "differs from " << path;
}

NetworkPolicy Policy(const PolicyBuilder& b) {
  auto p = b.Build();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : NetworkPolicy{};
}
NetworkPolicy Mode(NetMode m) { return Policy(PolicyBuilder(m)); }

constexpr uint32_t kSandbox = 0x0ad50007;  // 10.213.0.7

TEST(SandboxRangeTest, ParsedOnceWithItsBounds) {
  auto r = ParseSandboxRange("10.213.0.0/16");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->base, 0x0ad50000u);
  EXPECT_EQ(r->prefix, 16);
  EXPECT_EQ(r->gateway(), 0x0ad50001u);
  EXPECT_EQ(r->size(), 65536u);
  EXPECT_TRUE(r->Contains(kSandbox));
  EXPECT_FALSE(r->Contains(0x0ad60001));
  EXPECT_EQ(r->ToString(), "10.213.0.0/16");
  EXPECT_EQ(*r, (Ipv4Net{0x0ad50000, 16}));
  for (const char* bad : {"", "10.213.0.1/16", "10.0.0.0/7", "10.213.0.0/29", "10.213.0.0",
                          "10.213.0.0/", "fd00::/64", "10.213.0.0/16 "}) {
    auto b = ParseSandboxRange(bad);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(RulesetTest, TheNodeTable) {
  NodeTable t;
  t.table = "dsec_t1";
  t.bridge = "dsgt1";
  t.veth_prefix = "dsvt1";
  t.uplink = "eth0";
  t.range = {0x0ad50000, 16};
  t.max_conns = 1024;
  t.new_conns_per_s = 200;
  ExpectGolden("table.nft", RenderTable(t));
  t.log_group = 0x4abc;
  ExpectGolden("table_logged.nft", RenderTable(t));
}

TEST(RulesetTest, AttachAndDetach) {
  ExpectGolden("attach.nft", RenderAttach("dsec_t1", kSandbox, "dsvt10000abcd"));
  ExpectGolden("detach.nft", RenderDetach("dsec_t1", kSandbox, "dsvt10000abcd", false));
  ExpectGolden("detach_dispatched.nft", RenderDetach("dsec_t1", kSandbox, "dsvt10000abcd", true));
}

TEST(RulesetTest, Policies) {
  // From none: rules, then the dispatch entry.
  ExpectGolden("policy_allowlist.nft",
               RenderPolicy("dsec_t1", kSandbox,
                            Policy(PolicyBuilder(NetMode::kAllowlist)
                                       .Allow("198.51.100.0/24", "80,443,8000-8100", "tcp")
                                       .Allow("203.0.113.9", "53", "udp")
                                       .Allow("192.0.2.0/24", "", "icmp")
                                       .Allow("10.9.9.9")
                                       .Domain("pypi.org")),
                            /*dispatched=*/false));
  // Already dispatched: only the rules change.
  ExpectGolden("policy_open.nft", RenderPolicy("dsec_t1", kSandbox, Mode(NetMode::kOpen), true));
  // Back to none: the dispatch entry goes (and the chain is left empty).
  ExpectGolden("policy_none.nft", RenderPolicy("dsec_t1", kSandbox, Mode(NetMode::kNone), true));
  // None to none changes nothing but the (empty) chain and set.
  std::string idle = RenderPolicy("dsec_t1", kSandbox, Mode(NetMode::kNone), false);
  EXPECT_EQ(idle, "flush chain inet dsec_t1 sb_0ad50007\nflush set inet dsec_t1 dns_0ad50007\n");
}

TEST(RulesetTest, ResolvedAddresses) {
  ExpectGolden("allow_resolved.nft",
               RenderAllowResolved("dsec_t1", kSandbox,
                                   {{0xc6336407, 300}, {0xc6336408, 0}, {0xc6336409, 999999}}));
  EXPECT_EQ(RenderAllowResolved("dsec_t1", kSandbox, {}), "");
  EXPECT_EQ(CounterName(kSandbox), "dn_0ad50007");
}

}  // namespace
}  // namespace dsec::net
