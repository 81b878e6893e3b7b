#include "api/images_json.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

TEST(ImagesJsonTest, Records) {
  ImageRecord r;
  r.name = "app:1";
  r.layers.push_back({"sha256:ab", 10, "erofs"});
  r.env = {"A=1"};
  r.workdir = "/w";
  r.cmd = {"sh"};
  r.size = 10;
  r.source = "snapshot";
  r.created_at = 5;
  r.in_use = 2;
  EXPECT_EQ(ToJson(r).dump(),
            R"({"base":null,"config":{"cmd":["sh"],"entrypoint":[],"env":["A=1"],)"
            R"("user":"","workdir":"/w"},"created_at":5,"in_use":2,"layers":[{"digest":)"
            R"("sha256:ab","format":"erofs","size":10}],"name":"app:1","size":10,)"
            R"("source":"snapshot"})");
  r.base = "host";
  EXPECT_EQ(ToJson(r)["base"], "host");
  EXPECT_EQ(HostImageJson()["builtin"], true);
  EXPECT_TRUE(HostImageJson()["in_use"].is_null());
}

TEST(ImagesJsonTest, SnapshotRequests) {
  auto s = ParseSnapshotRequest(R"({"image":"a:1","keep_setuid":true,"request_id":"r"})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->image, "a:1");
  EXPECT_TRUE(s->keep_setuid);
  EXPECT_EQ(ParseSnapshotRequest("{}").status().message(), "\"image\" (name:tag) is required");
  EXPECT_EQ(ParseSnapshotRequest("{}").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseSnapshotRequest(R"({"image":1})").ok());
  EXPECT_FALSE(ParseSnapshotRequest(R"({"image":"a","x":1})").ok());
}

TEST(ImagesJsonTest, ForkRequests) {
  auto f = ParseForkRequest("", 4);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->count, 1);
  EXPECT_FALSE(f->keep_setuid);
  f = ParseForkRequest(R"({"count":4,"keep_setuid":true})", 4);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->count, 4);
  EXPECT_TRUE(f->keep_setuid);
  EXPECT_FALSE(f->memory);
  f = ParseForkRequest(R"({"count":2,"memory":true})", 4);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->memory);
  EXPECT_FALSE(ParseForkRequest(R"({"memory":1})", 4).ok());
  EXPECT_FALSE(ParseForkRequest(R"({"memory":true,"keep_setuid":true})", 4).ok());
  EXPECT_FALSE(ParseForkRequest(R"({"count":5})", 4).ok());
  EXPECT_FALSE(ParseForkRequest(R"({"count":0})", 4).ok());
  EXPECT_FALSE(ParseForkRequest(R"({"cnt":1})", 4).ok());
  // keep_setuid's error is the one answered when both are wrong.
  auto both = ParseForkRequest(R"({"count":"x","keep_setuid":"y"})", 4);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("keep_setuid"), std::string::npos);
}

TEST(ImagesJsonTest, List) {
  EXPECT_EQ(ImageListJson({}).dump(), Json({{"images", {HostImageJson()}}}).dump());
  ImageRecord r;
  r.name = "app:1";
  Json list = ImageListJson({r});
  ASSERT_EQ(list["images"].size(), 2u);
  EXPECT_EQ(list["images"][0]["name"], "host");
  EXPECT_EQ(list["images"][1], ToJson(r));
}

}  // namespace
}  // namespace dsec::api
