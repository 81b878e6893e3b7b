// The edge's config file and the checks FinalizeConfig makes, without starting an edge.
#include "edge/config.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "base/file_util.h"

namespace dsec::edge {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-config-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  Status Load(const std::string& text, EdgeConfig* c) {
    std::string path = dir_ + "/edge.json";
    EXPECT_TRUE(WriteStringToFile(path, text, O_WRONLY | O_CREAT | O_TRUNC).ok());
    return LoadConfigFile(path, c);
  }
  static EdgeConfig Valid() {
    EdgeConfig c;
    c.state_dir = "/var/lib/dsec";
    c.listen = "127.0.0.1:7070";
    c.node = "n1";
    return c;
  }
  std::string dir_;
};

TEST_F(ConfigTest, KnownKeysAreRead) {
  EdgeConfig c;
  ASSERT_TRUE(Load(R"({"max_sandboxes": 12, "memory_overcommit": 1.5, "userns": false,
                       "cgroup_mode": "v1", "audit_max_bytes": 4096})",
                   &c)
                  .ok());
  EXPECT_EQ(c.max_sandboxes, 12);
  EXPECT_DOUBLE_EQ(c.memory_overcommit, 1.5);
  EXPECT_FALSE(c.userns);
  EXPECT_EQ(c.cgroup_mode, "v1");
}

TEST_F(ConfigTest, UnknownKeysAndWrongTypesAreErrorsNamingTheKey) {
  EdgeConfig c;
  Status s = Load(R"({"max_sandbox": 12})", &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"max_sandbox\""), std::string::npos) << s.message();
  s = Load(R"({"max_sandboxes": "12"})", &c);
  EXPECT_NE(s.message().find("max_sandboxes\" must be an integer"), std::string::npos);
  s = Load(R"({"userns": 1})", &c);
  EXPECT_NE(s.message().find("true or false"), std::string::npos);
  s = Load(R"({"idempotency_max_body_bytes": -1})", &c);
  EXPECT_NE(s.message().find("non-negative"), std::string::npos);
  s = Load(R"({"reap_interval_ms": 99999999999})", &c);  // an int field
  EXPECT_NE(s.message().find("in range"), std::string::npos);
  EXPECT_EQ(Load("[1, 2]", &c).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Load("{not json", &c).code(), StatusCode::kInvalidArgument);
}

TEST_F(ConfigTest, FinalizeFillsDerivedDefaults) {
  EdgeConfig c = Valid();
  ASSERT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_EQ(c.token_file, "/var/lib/dsec/token");
  EXPECT_EQ(c.audit_log, "/var/lib/dsec/audit/exec.log");
  EXPECT_GE(c.fncall_max, 8);
}

TEST_F(ConfigTest, FinalizeRefusesWhatCannotWork) {
  auto refused = [](void (*change)(EdgeConfig*), const char* words) {
    EdgeConfig c = Valid();
    change(&c);
    Status s = FinalizeConfig(&c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  refused([](EdgeConfig* c) { c->state_dir = "relative"; }, "--state-dir");
  refused([](EdgeConfig* c) { c->node = "Bad_Node"; }, "node name");
  refused([](EdgeConfig* c) { c->listen = "nohost"; }, "HOST:PORT");
  refused([](EdgeConfig* c) { c->listen = "127.0.0.1:99999"; }, "bad port");
  refused(
      [](EdgeConfig* c) {
        c->listen.clear();
        c->socket.clear();
      },
      "nothing to serve");
  refused([](EdgeConfig* c) { c->image_layer_format = "zip"; }, "image_layer_format");
  refused([](EdgeConfig* c) { c->build_mirror = "ftp://x"; }, "build_mirror");
  refused([](EdgeConfig* c) { c->max_sandboxes = 0; }, "max_sandboxes");
  refused(
      [](EdgeConfig* c) {
        c->fncall_max = 2;
        c->fncall_min_idle = 3;
      },
      "fncall_min_idle");
}

TEST_F(ConfigTest, DnsMaxTtlIsReadAndBounded) {
  EdgeConfig c = Valid();
  EXPECT_EQ(c.network_dns_max_ttl_s, 3600);
  ASSERT_TRUE(Load(R"({"network_dns_max_ttl_s": 300})", &c).ok());
  EXPECT_EQ(c.network_dns_max_ttl_s, 300);
  EXPECT_TRUE(FinalizeConfig(&c).ok());
  for (int bad : {0, -1, 86401}) {
    c.network_dns_max_ttl_s = bad;
    Status s = FinalizeConfig(&c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("network_dns_max_ttl_s must be between 1 and 86400"),
              std::string::npos)
        << s.message();
  }
  c.network_dns_max_ttl_s = 86400;
  EXPECT_TRUE(FinalizeConfig(&c).ok());
  EXPECT_NE(Load(R"({"network_dns_max_ttl_s": "1h"})", &c).message().find("an integer"),
            std::string::npos);
}

TEST_F(ConfigTest, HostPortParsing) {
  std::string h;
  uint16_t p = 0;
  ASSERT_TRUE(ParseHostPort("[::1]:7070", &h, &p).ok());
  EXPECT_EQ(h, "::1");
  EXPECT_EQ(p, 7070);
  ASSERT_TRUE(ParseHostPort("0.0.0.0:0", &h, &p).ok());
  EXPECT_EQ(p, 0);
  EXPECT_FALSE(ParseHostPort(":80", &h, &p).ok());
  EXPECT_FALSE(ParseHostPort("h:-1", &h, &p).ok());
}

TEST_F(ConfigTest, SandboxFusionListener) {
  EdgeConfig c;
  ASSERT_TRUE(Load(R"j({"sandbox_fusion_listen": "127.0.0.1:8080", "sandbox_fusion_auth": "none",
                       "sandbox_fusion_pool": "cc", "sandbox_fusion_max_body_bytes": 1024})j",
                   &c)
                  .ok());
  EXPECT_EQ(c.sandbox_fusion_listen, "127.0.0.1:8080");
  EXPECT_EQ(c.sandbox_fusion_auth, "none");
  EXPECT_EQ(c.sandbox_fusion_pool, "cc");
  EXPECT_EQ(c.sandbox_fusion_max_body_bytes, 1024u);
  c = Valid();
  c.sandbox_fusion_auth = "maybe";
  Status s = FinalizeConfig(&c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sandbox_fusion_auth"), std::string::npos) << s.message();
  c = Valid();
  c.sandbox_fusion_listen = "nohostport";
  s = FinalizeConfig(&c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sandbox_fusion_listen"), std::string::npos) << s.message();
  c = Valid();
  c.sandbox_fusion_listen = "127.0.0.1:0";
  EXPECT_TRUE(FinalizeConfig(&c).ok());
  c = Valid();
  c.e2b_listen = "nohostport";
  s = FinalizeConfig(&c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("e2b_listen"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dsec::edge
