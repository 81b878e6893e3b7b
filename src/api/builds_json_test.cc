#include "api/builds_json.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

std::string BuildError(std::string_view body) {
  auto r = ParseBuildRequest(body);
  EXPECT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
  return std::string(r.status().message());
}

TEST(BuildsJsonTest, FromImages) {
  auto r = ParseBuildRequest(
      R"({"name":"proj","from":["host","py:3"],"run":["make"],"env":{"A":"1"},"workdir":"/w",
          "memory_mb":128,"disk_mb":32,"timeout_s":9,"network":{"mode":"open"},
          "request_id":"r"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "proj:latest");
  EXPECT_EQ(r->from, (std::vector<std::string>{"host", "py:3"}));
  EXPECT_EQ(r->run, (std::vector<std::string>{"make"}));
  EXPECT_EQ(r->env.at("A"), "1");
  EXPECT_EQ(r->workdir, "/w");
  EXPECT_EQ(r->memory_mb, 128);
  EXPECT_EQ(r->disk_mb, 32);
  EXPECT_EQ(r->timeout_s, 9);
  EXPECT_EQ(r->network.mode, net::NetMode::kOpen);
  EXPECT_TRUE(r->suite.empty());
  auto one = ParseBuildRequest(R"({"name":"a:1","from":"b","run":["x"]})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->from, (std::vector<std::string>{"b:latest"}));
  EXPECT_EQ(one->timeout_s, 3600);
  EXPECT_EQ(one->network.mode, net::NetMode::kNone);
}

TEST(BuildsJsonTest, DebianBase) {
  auto r = ParseBuildRequest(R"({"name":"py:3","base":"debian:bookworm","packages":["git"]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->suite, "bookworm");
  EXPECT_EQ(r->variant, "minbase");
  EXPECT_EQ(r->packages, (std::vector<std::string>{"git"}));
  EXPECT_TRUE(r->from.empty());
}

TEST(BuildsJsonTest, Errors) {
  EXPECT_EQ(BuildError(R"({"from":"a","run":["x"]})"), "\"name\" (name:tag) is required");
  EXPECT_EQ(BuildError(R"({"name":"a"})"),
            "give either \"base\" (debian:SUITE, made with mmdebstrap) or \"from\" (images)");
  EXPECT_EQ(BuildError(R"({"name":"a","base":"ubuntu:x"})").find("\"base\" must be debian:"), 0u);
  EXPECT_EQ(BuildError(R"({"name":"a","from":"b"})"),
            "a build \"from\" images needs \"run\" steps");
  EXPECT_EQ(
      BuildError(R"({"name":"a","from":"b","run":["x"],"packages":["p"]})").find("\"packages\""),
      0u);
  EXPECT_EQ(BuildError(R"({"name":"a","from":["b","host"],"run":["x"]})"),
            "\"host\" can only be the first image of \"from\"");
  EXPECT_EQ(BuildError(R"({"name":"a","from":[],"run":["x"]})"),
            "\"from\" must be an image name or a list of 1-16 of them");
  EXPECT_EQ(BuildError(R"({"name":"a","from":[1],"run":["x"]})"),
            "\"from\" must be an image name or a list");
  EXPECT_EQ(BuildError(R"({"name":"a","from":"b","run":[""]})"),
            "\"run\" steps must be non-empty commands without NUL");
  EXPECT_EQ(BuildError(R"({"name":"a","from":"b","run":["x"],"env":{"A=B":"1"}})"),
            "env names must not contain '=' or NUL, values no NUL");
  EXPECT_EQ(BuildError(R"({"name":"a","from":"b","run":["x"],"workdir":"w"})"),
            "\"workdir\" must be an absolute path");
  EXPECT_EQ(BuildError(R"({"name":"a","from":"b","run":["x"],"y":1})"), "unknown field \"y\"");
  EXPECT_EQ(
      BuildError(R"({"name":"a","from":"b","run":["x"],"memory_mb":1})").find("\"memory_mb\""), 0u);
  // The network is checked before the name.
  EXPECT_NE(BuildError(R"({"network":{"mode":"x"}})"), "\"name\" (name:tag) is required");
}

// A build record as the API shows it: nulls for what has not happened, the running step only
// while it runs, progress from the steps done.
TEST(BuildsJsonTest, RecordAndLogRender) {
  BuildRecord r;
  r.id = "bld-1";
  r.name = "x:1";
  r.state = "running";
  r.steps = {{"start a build sandbox", "done"}, {"run: make", "running"}};
  r.step = 1;
  r.sandbox = "sb-n-abc";
  r.log_bytes = 12;
  r.created_at = 5;
  r.started_at = 6;
  Json j = ToJson(r);
  EXPECT_EQ(j["step"], 1);
  EXPECT_EQ(j["progress"], 0.5);
  EXPECT_EQ(j["error"], nullptr);
  EXPECT_EQ(j["image"], nullptr);
  EXPECT_EQ(j["sandbox"], "sb-n-abc");
  EXPECT_EQ(j["finished_at"], nullptr);
  EXPECT_EQ(j["steps"][1], Json({{"name", "run: make"}, {"state", "running"}}));
  r.state = "succeeded";
  r.image = "x:1";
  r.finished_at = 9;
  j = ToJson(r);
  EXPECT_EQ(j["step"], nullptr);  // not shown once finished
  EXPECT_EQ(j["finished_at"], 9);
  EXPECT_EQ(BuildListJson({r, r})["builds"].size(), 2u);
  EXPECT_EQ(BuildListJson({}), Json({{"builds", Json::array()}}));
  BuildLogPiece p{.offset = 3, .next_offset = 5, .text = "ab", .done = true};
  EXPECT_EQ(ToJson(p), Json({{"offset", 3}, {"next_offset", 5}, {"text", "ab"}, {"done", true}}));
}

}  // namespace
}  // namespace dsec::api
