#include "api/sandboxes_json.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

const CreateLimits kLimits{.max_count = 4, .kinds = {backends::Kind::kContainer}, .network = true};

Status CreateError(std::string_view body, const CreateLimits& limits = kLimits) {
  auto r = ParseCreateRequest(body, limits);
  EXPECT_FALSE(r.ok()) << body;
  return r.status();
}

TEST(SandboxesJsonTest, ParsesACreate) {
  auto r = ParseCreateRequest(
      R"({"kind":"container","image":["host","app:1"],"cpu":0.5,"memory_mb":64,"pids":16,
          "disk_mb":10,"ttl_s":0,"idle_ttl_s":60,"user":"root","workdir":"/w",
          "env":{"A":"1"},"labels":{"job":"x"},"count":2,"request_id":"r",
          "network":{"mode":"open"},"pool":"warm"})",
      kLimits);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, backends::Kind::kContainer);
  EXPECT_EQ(r->image, "host,app:1");
  EXPECT_EQ(r->cpu, 0.5);
  EXPECT_EQ(r->memory_mb, 64);
  EXPECT_EQ(r->pids, 16);
  EXPECT_EQ(r->disk_mb, 10);
  EXPECT_EQ(r->ttl_s, 0);
  EXPECT_EQ(r->idle_ttl_s, 60);
  EXPECT_EQ(r->user, "root");
  EXPECT_EQ(r->workdir, "/w");
  EXPECT_EQ(r->env->at("A"), "1");
  EXPECT_EQ(r->labels->at("job"), "x");
  EXPECT_EQ(r->count, 2);
  EXPECT_EQ(r->network.mode, net::NetMode::kOpen);
  EXPECT_EQ(r->pool, "warm");

  auto empty = ParseCreateRequest("", kLimits);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->kind || empty->image || empty->count || empty->pool || empty->env);
  EXPECT_EQ(empty->network.mode, net::NetMode::kNone);
  EXPECT_FALSE(ParseCreateRequest(R"({"pool":null})", kLimits)->pool);
}

TEST(SandboxesJsonTest, CreateErrors) {
  EXPECT_EQ(CreateError(R"({"x":1})").message(), "unknown field \"x\"");
  EXPECT_EQ(CreateError(R"({"count":5})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateError(R"({"kind":"vm"})").message(), "kind must be \"container\" or \"microvm\"");
  Status s = CreateError(R"({"kind":"microvm"})");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(), "kind \"microvm\" is not available on this node (GET /v1/node says why)");
  EXPECT_EQ(CreateError(R"({"image":"host:1"})").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateError(R"({"image":["a:1","host"]})").message(),
            "\"host\" can only be the first image of a stack");
  EXPECT_EQ(CreateError(R"({"image":"sha256:ab"})").message(), "bad layer digest in \"image\"");
  EXPECT_EQ(CreateError(R"({"image":[]})").message(),
            "\"image\" must be a name or a list of 1 to 16 names");
  EXPECT_EQ(CreateError(R"({"image":[1]})").message(), "\"image\" entries must be strings");
  EXPECT_EQ(CreateError(R"({"pool":1})").message(), "\"pool\" must be a pool name");
  CreateLimits no_net = kLimits;
  no_net.network = false;
  s = CreateError(R"({"network":{"mode":"open"}})", no_net);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(),
            "network mode \"open\" is not available: this edge runs with network: false");
}

TEST(SandboxesJsonTest, CreateChecksInOrder) {
  // The kind's check sees what was read, and comes after the network and before the pool.
  CreateLimits limits = kLimits;
  std::string seen;
  limits.check_kind = [&](const CreateRequest& r) -> Status {
    seen = r.image.value_or("-");
    return Unimplemented("no");
  };
  EXPECT_EQ(CreateError(R"({"image":"a","pool":1})", limits).message(), "no");
  EXPECT_EQ(seen, "a:latest");
  EXPECT_EQ(CreateError(R"({"network":{"mode":"x"},"pool":1})", limits).code(),
            StatusCode::kInvalidArgument);
  // The body's fields before the kind.
  EXPECT_EQ(CreateError(R"({"kind":"vm","count":9})").message().find("kind"), std::string::npos);
}

TEST(SandboxesJsonTest, Labels) {
  EXPECT_TRUE(ValidateLabels({{"a.b/c-d_e", "1"}}).ok());
  EXPECT_EQ(ValidateLabels({{"a b", "1"}}).message(),
            "label keys are 1-63 characters of A-Z a-z 0-9 . _ - /");
}

TEST(SandboxesJsonTest, Patches) {
  auto p = ParsePatchRequest(
      R"({"ttl_s":5,"idle_ttl_s":0,"labels":{"a":"1","b":null},"network":{"mode":"none"}})",
      /*network=*/false);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ttl_s, 5);
  EXPECT_EQ(p->idle_ttl_s, 0);
  EXPECT_EQ(p->labels.at("a"), "1");
  EXPECT_FALSE(p->labels.at("b"));
  ASSERT_TRUE(p->network);
  EXPECT_EQ(p->network->mode, net::NetMode::kNone);
  auto none = ParsePatchRequest("{}", true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->ttl_s || none->network);
  EXPECT_TRUE(none->labels.empty());
  EXPECT_EQ(ParsePatchRequest(R"({"network":{"mode":"open"}})", false).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(ParsePatchRequest(R"({"ttl_s":-1})", true).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePatchRequest(R"({"labels":{"a b":"1"}})", true).status().message(),
            "label keys are 1-63 characters of A-Z a-z 0-9 . _ - /");
  EXPECT_EQ(ParsePatchRequest(R"({"state":"x"})", true).status().message(),
            "unknown field \"state\"");
}

TEST(SandboxesJsonTest, ActionBodies) {
  EXPECT_TRUE(CheckActionBody("").ok());
  EXPECT_TRUE(CheckActionBody(R"({"request_id":"r"})").ok());
  EXPECT_FALSE(CheckActionBody(R"({"force":true})").ok());
  EXPECT_FALSE(CheckActionBody("[]").ok());
}

TEST(SandboxesJsonTest, Answers) {
  backends::SandboxStats st;
  st.cpu_usage_us = 1500;
  st.memory_current = 2;
  st.pids = 3;
  EXPECT_EQ(StatsJson(st).dump(),
            R"({"cpu_time_ms":1.5,"disk_kind":"tmpfs","disk_limit":0,"disk_used":0,)"
            R"("exec_count":0,"memory_current":2,"memory_limit":0,"memory_peak":0,)"
            R"("network_denied":0,"oom_kills":0,"pids":3})");
  EXPECT_EQ(JobActionJson(2).dump(), R"({"affected":2})");
  EXPECT_EQ(HealthJson().dump(), R"({"ok":true})");
  SandboxRecord r;
  r.id = "sb-1";
  Json list = SandboxListJson({r});
  ASSERT_EQ(list["sandboxes"].size(), 1u);
  EXPECT_EQ(list["sandboxes"][0]["id"], "sb-1");
  EXPECT_EQ(SandboxListJson({}).dump(), R"({"sandboxes":[]})");
}

TEST(SandboxesJsonTest, Node) {
  NodeInfo n;
  n.report.node = "n1";
  n.version = "1.0";
  n.instance = "i";
  n.backends = {backends::Kind::kContainer, backends::Kind::kMicrovm};
  n.features.kernel.kernel = "6";
  n.features.kernel.socket_budget = true;
  n.features.microvm.reason = "no qemu";
  n.features.kinds.emplace_back(backends::Kind::kContainer, backends::KindCapabilities{});
  Json j = ToJson(n);
  EXPECT_EQ(j["node"], "n1");
  EXPECT_EQ(j["version"], "1.0");
  EXPECT_EQ(j["instance"], "i");
  EXPECT_EQ(j["backends"].dump(), R"(["container","microvm"])");
  EXPECT_EQ(j["pools"].dump(), "[]");
  EXPECT_EQ(j["features"]["kernel"], "6");
  EXPECT_EQ(j["features"]["socket_budget"], true);
  EXPECT_FALSE(j["features"].contains("socket_budget_reason"));
  EXPECT_EQ(j["features"]["proc_views"], true);
  EXPECT_EQ(j["features"]["microvm"].dump(), R"({"available":false,"reason":"no qemu"})");
  EXPECT_EQ(j["features"]["network"].dump(),
            R"({"enabled":false,"reason":"network: false in the edge's config"})");
  EXPECT_EQ(j["features"]["kinds"].dump(),
            R"({"container":{"fncall_workers":true,"host_image":true,"network":true,)"
            R"("port_proxy":true,"snapshot":true}})");
  EXPECT_TRUE(j.contains("capacity"));
  EXPECT_TRUE(j.contains("usage"));
}

TEST(SandboxesJsonTest, NodeFeaturesSayWhyNot) {
  NodeFeatures f;
  f.kernel.socket_budget_reason = "no BPF";
  f.kernel.proc_views_reason = "lxcfs is gone";
  f.microvm.available = true;
  f.microvm.accel = "tcg";
  f.microvm.accel_reason = "kvm: guest did not boot";
  f.microvm.templates = 2;
  f.network.enabled = true;
  f.network.info.cidr = "10.0.0.0/16";
  f.network.info.dns_state = "unreachable";
  f.network.info.dns_error = "timeout";
  f.network.info.reason = "no default route";
  Json j = ToJson(f);
  EXPECT_EQ(j["socket_budget"], false);
  EXPECT_EQ(j["socket_budget_reason"], "no BPF");
  EXPECT_EQ(j["proc_views"], false);
  EXPECT_EQ(j["proc_views_reason"], "lxcfs is gone");
  EXPECT_EQ(j["microvm"]["accel"], "tcg");
  EXPECT_EQ(j["microvm"]["accel_reason"], "kvm: guest did not boot");
  EXPECT_EQ(j["microvm"]["templates"], 2);
  EXPECT_EQ(j["network"]["available"], false);
  EXPECT_EQ(j["network"]["reason"], "no default route");
  EXPECT_TRUE(j["network"]["uplink"].is_null());
  EXPECT_EQ(j["network"]["dns"].dump(),
            R"({"error":"timeout","state":"unreachable","upstream":null})");
  EXPECT_EQ(j["kinds"].dump(), "{}");
}

}  // namespace
}  // namespace dsec::api
