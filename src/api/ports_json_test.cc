#include "api/ports_json.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

TEST(PortsJsonTest, Requests) {
  auto r = ParsePortUrlRequest(R"({"port":8080,"ttl_s":60,"request_id":"r"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->port, 8080);
  EXPECT_EQ(r->ttl_s, 60);
  EXPECT_EQ(ParsePortUrlRequest(R"({"port":1})")->ttl_s, 3600);
  EXPECT_EQ(ParsePortUrlRequest("{}").status().message(), "\"port\" is required");
  EXPECT_EQ(ParsePortUrlRequest(R"({"port":0})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParsePortUrlRequest(R"({"port":65536})").ok());
  EXPECT_FALSE(ParsePortUrlRequest(R"({"port":1,"ttl_s":0})").ok());
  EXPECT_FALSE(ParsePortUrlRequest(R"({"port":1,"ttl_s":2592001})").ok());
  EXPECT_EQ(ParsePortUrlRequest(R"({"port":1,"host":"x"})").status().message(),
            "unknown field \"host\"");
  // The body's fields are all checked before "port" is required.
  EXPECT_NE(ParsePortUrlRequest(R"({"ttl_s":0})").status().message(), "\"port\" is required");
}

TEST(PortsJsonTest, Urls) {
  PortUrl u{.port = 80, .path = "/v1/p/x/", .expires_at = 7000};
  EXPECT_EQ(ToJson(u).dump(), R"({"expires_at":7000,"path":"/v1/p/x/","port":80,"url":null})");
  u.url = "http://h/v1/p/x/";
  EXPECT_EQ(ToJson(u)["url"], "http://h/v1/p/x/");
}

}  // namespace
}  // namespace dsec::api
