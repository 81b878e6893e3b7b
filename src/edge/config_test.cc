// The edge's config file and the checks FinalizeConfig makes, without starting an edge.
#include "edge/config.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <set>
#include <string_view>
#include <type_traits>
#include <variant>

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
  EXPECT_NE(Load("[1, 2]", &c).message().find("is not a JSON object"), std::string::npos);
  EXPECT_EQ(Load("{not json", &c).code(), StatusCode::kInvalidArgument);
}

TEST_F(ConfigTest, UnknownKeyNamesTheClosestKnownOne) {
  EdgeConfig c;
  EXPECT_EQ(Load(R"({"max_sandbox": 12})", &c).message(),
            "config file: unknown key \"max_sandbox\" (did you mean \"max_sandboxes\"?)");
  EXPECT_EQ(Load(R"({"netwrok_dns": "1.1.1.1"})", &c).message(),
            "config file: unknown key \"netwrok_dns\" (did you mean \"network_dns\"?)");
  EXPECT_EQ(Load(R"({"Log_Level": "info"})", &c).message(),
            "config file: unknown key \"Log_Level\" (did you mean \"log_level\"?)");
  // Nothing close: no guess.
  EXPECT_EQ(Load(R"({"colour": "blue"})", &c).message(), "config file: unknown key \"colour\"");
  EXPECT_EQ(Load(R"({"x": 1})", &c).message(), "config file: unknown key \"x\"");
}

TEST_F(ConfigTest, SyntaxErrorsSayWhere) {
  EdgeConfig c;
  Status s = Load("{\n  \"max_sandboxes\": 12,\n  \"listen\": ,\n}\n", &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "config file \"" + dir_ +
                             "/edge.json\": JSON syntax error at line 3, column 13: unexpected "
                             "','; expected '[', '{', or a literal")
      << s.message();
  s = Load("{\"a\": 1,\n\"b\": tru\n}", &c);  // the bad literal ends the line
  EXPECT_NE(s.message().find("at line 2, column 9: invalid literal"), std::string::npos)
      << s.message();
  s = Load("", &c);
  EXPECT_NE(s.message().find("at line 1, column 1: unexpected end of input"), std::string::npos)
      << s.message();
  s = Load("{\"max_sandboxes\": 12}\n}", &c);
  EXPECT_NE(s.message().find("at line 2, column 1: unexpected '}'"), std::string::npos)
      << s.message();
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

TEST_F(ConfigTest, EveryKeyIsDocumented) {
  std::set<std::string> keys;
  for (const ConfigKeyDoc& k : ConfigKeyDocs()) {
    EXPECT_TRUE(keys.insert(k.key).second) << "twice: " << k.key;
    EXPECT_FALSE(k.description.empty()) << k.key << " has no description";
    EXPECT_FALSE(k.group.empty()) << k.key;
    EXPECT_FALSE(k.default_value.empty()) << k.key;
    EdgeConfig c;
    EXPECT_TRUE(ConfigFieldOf(&c, k.key).has_value()) << k.key;
    // A byte count, duration or size says its unit.
    for (const char* suffix : {"_bytes", "_s", "_ms", "_mb"}) {
      std::string_view sv(k.key), sx(suffix);
      if (sv.size() > sx.size() && sv.substr(sv.size() - sx.size()) == sx) {
        EXPECT_FALSE(k.unit.empty()) << k.key << " has no unit";
      }
    }
  }
  EXPECT_GE(keys.size(), 90u);
  EdgeConfig c;
  EXPECT_FALSE(ConfigFieldOf(&c, "no_such_key").has_value());
  for (const EdgeFlag& f : EdgeFlags()) {
    EXPECT_FALSE(f.help.empty()) << f.name;
    if (!f.key.empty()) {
      EXPECT_TRUE(keys.count(std::string(f.key))) << f.name;
    }
  }
}

TEST_F(ConfigTest, ReferenceShowsDefaultsAndRanges) {
  std::map<std::string, ConfigKeyDoc> docs;
  for (ConfigKeyDoc& k : ConfigKeyDocs()) docs[k.key] = k;
  EXPECT_EQ(docs["max_sandboxes"].default_value, "`4096`");
  EXPECT_EQ(docs["max_sandboxes"].range, "1 to 1048576");
  EXPECT_EQ(docs["max_sandboxes"].type, "int64");
  EXPECT_EQ(docs["memory_overcommit"].range, "0.1 to 1000");
  EXPECT_EQ(docs["max_header_bytes"].default_value, "`16384` (16 KiB)");
  EXPECT_EQ(docs["persist"].default_value, "`false`");
  EXPECT_EQ(docs["token_file"].default_value, "`\"\"` (`<state_dir>/token`)");
  EXPECT_EQ(docs["image_layer_format"].range, "`dir`, `erofs`");
  // The reference shows the bounds FinalizeConfig enforces: each one holds at its ends and
  // fails just past them.
  for (const auto& item : docs) {
    // (Not a structured binding: clang 14, the fuzz build's compiler, cannot capture those.)
    const std::string& key = item.first;
    const ConfigKeyDoc& d = item.second;
    if (d.range.find(" to ") == std::string::npos || d.type == "string") continue;
    double lo = std::stod(d.range), hi = std::stod(d.range.substr(d.range.find(" to ") + 4));
    auto finalize = [&](double v) {
      EdgeConfig c = Valid();
      c.fncall_max = 4096;  // so that fncall_min_idle may reach its own maximum
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_arithmetic_v<T>) *p = static_cast<T>(v);
          },
          *ConfigFieldOf(&c, key));
      return FinalizeConfig(&c);
    };
    EXPECT_TRUE(finalize(lo).ok()) << key << " " << lo << ": " << finalize(lo).message();
    EXPECT_TRUE(finalize(hi).ok()) << key << " " << hi << ": " << finalize(hi).message();
    double step = d.type == "number" ? lo / 2 : 1;
    for (double bad : {lo - step, hi + 1}) {
      if (d.type == "uint64" && bad < 0) continue;
      Status s = finalize(bad);  // (fncall_max -1 fails fncall_min_idle <= fncall_max first)
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key << " " << bad;
      EXPECT_NE(s.message().find(key), std::string::npos)
          << key << " " << bad << ": " << s.message();
    }
  }
}

// docs/config.md is what the code generates, so it cannot go stale: after changing a key,
// regenerate it with `build/release/src/edge/dsec-edge --config-reference > docs/config.md`.
TEST_F(ConfigTest, DocsConfigMdIsCurrent) {
  auto file = ReadFileToString(std::string(DSEC_SOURCE_DIR) + "/docs/config.md", 1 << 22);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::string want = ConfigReference();
  if (*file == want) return;
  size_t line = 1, i = 0;
  for (; i < std::min(file->size(), want.size()) && (*file)[i] == want[i]; ++i)
    if (want[i] == '\n') ++line;
  auto line_at = [&](const std::string& s) {
    size_t b = s.rfind('\n', i == 0 ? 0 : i - 1);
    b = b == std::string::npos ? 0 : b + 1;
    return s.substr(b, s.find('\n', b) - b);
  };
  ADD_FAILURE() << "docs/config.md is stale from line " << line << ":\n  file: " << line_at(*file)
                << "\n  code: " << line_at(want)
                << "\nRegenerate it: build/release/src/edge/dsec-edge --config-reference > "
                   "docs/config.md";
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
