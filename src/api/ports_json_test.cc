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
  EXPECT_EQ(ToJson(u).dump(),
            R"({"expires_at":7000,"host_url":null,"path":"/v1/p/x/","port":80,"url":null})");
  u.url = "http://h/v1/p/x/";
  EXPECT_EQ(ToJson(u)["url"], "http://h/v1/p/x/");
  u.host_url = "http://80-x.d/?dsec_port_token=1.2";
  EXPECT_EQ(ToJson(u)["host_url"], u.host_url);
}

TEST(PortsJsonTest, PortDomains) {
  EXPECT_TRUE(ValidatePortDomain("sbx.example.com").ok());
  EXPECT_TRUE(ValidatePortDomain("localhost").ok());
  for (const char* bad :
       {"", "Sbx.example.com", "a..b", ".a", "a.", "-a.b", "a-.b", "a_b.c", "a b", "a:80"})
    EXPECT_FALSE(ValidatePortDomain(bad).ok()) << bad;
  EXPECT_FALSE(ValidatePortDomain(std::string(64, 'a')).ok());
  EXPECT_FALSE(ValidatePortDomain(std::string(201, 'a')).ok());
}

TEST(PortsJsonTest, PortHosts) {
  EXPECT_EQ(PortHost(8080, "sb-n1-abc", "d.test"), "8080-sb-n1-abc.d.test");
  EXPECT_EQ(PortHost(8080, "sb-n1-abc", ""), "");
  EXPECT_EQ(PortHost(8080, "Sb_1", "d.test"), "");        // not a DNS label
  EXPECT_EQ(PortHost(8080, "a.b", "d.test"), "");         // would be two labels
  EXPECT_EQ(PortHost(1, std::string(62, 'a'), "d"), "");  // 64 characters
  std::string id, port;
  ASSERT_TRUE(ParsePortHost("8080-sb-n1-abc.d.test", "d.test", &id, &port));
  EXPECT_EQ(id, "sb-n1-abc");
  EXPECT_EQ(port, "8080");
  ASSERT_TRUE(ParsePortHost("80-SB-N1-ABC.D.Test.:7070", "d.test", &id, &port));
  EXPECT_EQ(id, "sb-n1-abc");
  EXPECT_EQ(port, "80");
  for (const char* not_port : {"d.test", "x.d.test", "8080.d.test", "8080-.d.test", "-x.d.test",
                               "80x-a.d.test", "80-a.b.d.test", "80-a.xd.test", "80-a.d.test.x",
                               "80-a_b.d.test", "[::1]:80", "", "80-a.d.tes"})
    EXPECT_FALSE(ParsePortHost(not_port, "d.test", &id, &port)) << not_port;
  EXPECT_FALSE(ParsePortHost("80-a.d.test", "", &id, &port));
}

TEST(PortsJsonTest, PortTokensAndCookies) {
  std::string t = "/a?x=1&dsec_port_token=9.ab&y=2";
  EXPECT_EQ(TakePortToken(&t), "9.ab");
  EXPECT_EQ(t, "/a?x=1&y=2");
  t = "/?dsec_port_token=9.ab";
  EXPECT_EQ(TakePortToken(&t), "9.ab");
  EXPECT_EQ(t, "/");
  t = "/a?dsec_port_tokenx=1";
  EXPECT_EQ(TakePortToken(&t), std::nullopt);
  EXPECT_EQ(t, "/a?dsec_port_tokenx=1");
  t = "/a";
  EXPECT_EQ(TakePortToken(&t), std::nullopt);

  std::string rest;
  EXPECT_EQ(TakePortCookies("a=1; dsec_port=1.x;b=2 ;dsec_port=2.y", &rest),
            (std::vector<std::string>{"1.x", "2.y"}));
  EXPECT_EQ(rest, "a=1; b=2");
  EXPECT_TRUE(TakePortCookies("", &rest).empty());
  EXPECT_EQ(rest, "");
  EXPECT_TRUE(TakePortCookies("dsec_portx=1", &rest).empty());
  EXPECT_EQ(rest, "dsec_portx=1");

  std::string e, m;
  EXPECT_TRUE(SplitPortToken("123.abc", &e, &m));
  EXPECT_EQ(e, "123");
  EXPECT_EQ(m, "abc");
  for (const char* bad : {"", "123", ".abc", "123.", "1.2.3"})
    EXPECT_FALSE(SplitPortToken(bad, &e, &m)) << bad;
}

}  // namespace
}  // namespace dsec::api
