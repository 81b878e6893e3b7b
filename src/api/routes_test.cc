#include "api/routes.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace dsec::api {
namespace {

TEST(Routes, TableIsInIdOrderWithUniqueMethodAndPattern) {
  std::set<std::string> seen;
  for (size_t i = 0; i < Routes().size(); ++i) {
    const RouteSpec& r = Routes()[i];
    EXPECT_EQ(static_cast<size_t>(r.id), i);
    EXPECT_EQ(&RouteOf(r.id), &r);
    EXPECT_TRUE(seen.insert(std::string(r.method) + " " + r.pattern).second) << r.pattern;
    // Every route that names a sandbox is a call on that sandbox, answered by its node.
    bool names_sandbox = r.segments.size() >= 3 && r.segments[1] == "sandboxes";
    EXPECT_EQ(names_sandbox, r.scope == Scope::kSandbox) << r.pattern;
  }
  EXPECT_EQ(Routes().size(), static_cast<size_t>(RouteId::kCount));
}

TEST(Routes, MatchesWithParamsDecoded) {
  auto m = MatchRoute("POST", "/v1/sandboxes/sb-a-1/execs/ex%2D9/kill?x=1", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kKillExec);
  EXPECT_EQ(m.params["id"], "sb-a-1");
  EXPECT_EQ(m.params["eid"], "ex-9");
  EXPECT_EQ(m.params.size(), 2u);
}

TEST(Routes, MostLiteralPatternWins) {
  auto m = MatchRoute("GET", "/v1/images/builds/b1", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kGetBuild);
  m = MatchRoute("GET", "/v1/images/python", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kGetImage);
  m = MatchRoute("GET", "/v1/sandboxes/sb-a-1/files/list", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kListFiles);
}

TEST(Routes, KnownPathWithOtherMethodListsAllowed) {
  auto m = MatchRoute("PUT", "/v1/sandboxes/sb-a-1", Server::kEdge);
  EXPECT_EQ(m.route, nullptr);
  EXPECT_TRUE(m.path_known);
  EXPECT_EQ(AllowHeader(m.allowed), "DELETE, GET, PATCH");
  m = MatchRoute("GET", "/v1/nope", Server::kEdge);
  EXPECT_EQ(m.route, nullptr);
  EXPECT_FALSE(m.path_known);
  EXPECT_TRUE(m.allowed.empty());
}

TEST(Routes, EncodedSlashStaysInOneSegment) {
  auto m = MatchRoute("GET", "/v1/sandboxes/a%2Fb", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.params["id"], "a/b");  // and the handler's ValidateId refuses it
  m = MatchRoute("GET", "/v1/sandboxes/a%2Fb/stats", Server::kEdge);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kStats);
  m = MatchRoute("GET", "/v1/sandboxes/%zz", Server::kEdge);
  EXPECT_EQ(m.route, nullptr);
  EXPECT_TRUE(m.bad_encoding);
}

TEST(Routes, NodesAreTheApiserversOnly) {
  EXPECT_EQ(MatchRoute("GET", "/v1/nodes", Server::kEdge).route, nullptr);
  EXPECT_FALSE(MatchRoute("POST", "/v1/nodes/n1/drain", Server::kEdge).path_known);
  auto m = MatchRoute("POST", "/v1/nodes/n1/drain", Server::kApiserver);
  ASSERT_NE(m.route, nullptr);
  EXPECT_EQ(m.route->id, RouteId::kDrainNode);
  EXPECT_EQ(m.params["node"], "n1");
  EXPECT_EQ(m.route->scope, Scope::kApiserver);
}

TEST(Routes, FlagsOfUploadsImportsAndIoThreadRoutes) {
  EXPECT_TRUE(RouteOf(RouteId::kPutFile).upload());
  EXPECT_TRUE(RouteOf(RouteId::kPutArchive).upload());
  EXPECT_FALSE(RouteOf(RouteId::kGetFile).upload());
  EXPECT_TRUE(RouteOf(RouteId::kImportImage).import());
  EXPECT_TRUE(RouteOf(RouteId::kHealth).on_io_thread());
  EXPECT_FALSE(RouteOf(RouteId::kCreateSandbox).on_io_thread());
}

TEST(Routes, PortTargets) {
  std::string id, port, up;
  ASSERT_TRUE(ParsePortTarget("/v1/sandboxes/sb-a-1/ports/8080/x/y?q=1", &id, &port, &up));
  EXPECT_EQ(id, "sb-a-1");
  EXPECT_EQ(port, "8080");
  EXPECT_EQ(up, "/x/y?q=1");
  ASSERT_TRUE(ParsePortTarget("/v1/sandboxes/sb-a-1/ports/80?q", &id, &port, &up));
  EXPECT_EQ(port, "80");
  EXPECT_EQ(up, "/?q");
  ASSERT_TRUE(ParsePortTarget("/v1/sandboxes/sb-a-1/ports/80", &id, &port, &up));
  EXPECT_EQ(up, "/");
  EXPECT_FALSE(ParsePortTarget("/v1/sandboxes/sb-a-1/files", &id, &port, &up));
  EXPECT_FALSE(ParsePortTarget("/v1/sandboxes/sb-a-1", &id, &port, &up));
  EXPECT_FALSE(ParsePortTarget("/v1/images/ports/1", &id, &port, &up));
}

}  // namespace
}  // namespace dsec::api
