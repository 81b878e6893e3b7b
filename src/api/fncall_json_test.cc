#include "api/fncall_json.h"

#include <gtest/gtest.h>

#include "api/pool_json.h"

namespace dsec::api {
namespace {

const FnCallLimits kCallLimits{.max_body_bytes = 1 << 20, .max_output_bytes = 1 << 20};

std::string CallParseError(std::string_view body) {
  auto p = ParseFnCallRequest(body, kCallLimits);
  EXPECT_FALSE(p.ok()) << body;
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << body;
  return std::string(p.status().message());
}

TEST(FnCallJsonTest, ParsesACall) {
  auto p = ParseFnCallRequest(
      R"json({"runtime":"python","code":"print(1)","filename":"m.py","stdin":"x",
          "files":{"a/b.txt":"t","c":{"base64":"aGk="}},"timeout_ms":9,"memory_mb":32,
          "max_output_bytes":100,"encoding":"base64","request_id":"r"})json",
      kCallLimits);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->runtime, "python");
  EXPECT_EQ(p->req.call.code, "print(1)");
  EXPECT_EQ(p->req.call.filename, "m.py");
  EXPECT_EQ(p->req.stdin_data, "x");
  ASSERT_EQ(p->req.call.files.size(), 2u);
  EXPECT_EQ(p->req.call.files[0], (std::pair<std::string, std::string>{"a/b.txt", "t"}));
  EXPECT_EQ(p->req.call.files[1], (std::pair<std::string, std::string>{"c", "hi"}));
  EXPECT_EQ(p->req.timeout_ms, 9);
  EXPECT_EQ(p->req.memory_mb, 32);
  EXPECT_EQ(p->req.max_output_bytes, 100u);
  EXPECT_TRUE(p->base64);

  p = ParseFnCallRequest(R"({"runtime":"bash","code":""})", kCallLimits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->req.timeout_ms, 5000);
  EXPECT_EQ(p->req.memory_mb, 0);
  EXPECT_EQ(p->req.max_output_bytes, kDefaultCallOutput);
  EXPECT_FALSE(p->base64);
}

TEST(FnCallJsonTest, RejectsBadCalls) {
  EXPECT_EQ(CallParseError(R"({"code":"x"})"), "\"runtime\" is required");
  EXPECT_EQ(CallParseError(R"({"runtime":"","code":"x"})"), "\"runtime\" is required");
  EXPECT_EQ(CallParseError(R"({"runtime":"python"})"), "\"code\" is required");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","filename":"a\u0000b"})"),
            "\"filename\" must not contain NUL");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","files":[]})"),
            "\"files\" must be an object of at most 256 name: content entries");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","files":{"/etc/x":"y"}})"),
            "file names are relative paths: \"/etc/x\"");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","files":{"a/../b":"y"}})"),
            "file names are relative paths without . or ..: \"a/../b\"");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","files":{"a":{"base64":"*"}}})"),
            "file \"a\" is not valid base64");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","files":{"a":1}})"),
            "file \"a\" must be a string or {\"base64\": ...}");
  EXPECT_EQ(CallParseError(R"({"runtime":"p","code":"x","encoding":"hex"})"),
            "\"encoding\" must be \"utf-8\" or \"base64\"");
  CallParseError(R"({"runtime":"p","code":"x","timeout_ms":600001})");
  CallParseError(R"({"runtime":"p","code":"x","memory_mb":8})");
  CallParseError(R"({"runtime":"p","code":"x","bogus":1})");
}

TEST(FnCallJsonTest, Results) {
  pools::CallResult r;
  r.out.result.exit_code = 0;
  r.out.stdout_data = "out";
  r.queue_ms = 0.0004;
  Json j = FnCallResultJson(r, false, "python");
  EXPECT_EQ(j["stdout"], "out");
  EXPECT_EQ(j["stderr"], "");
  EXPECT_EQ(j["runtime"], "python");
  EXPECT_EQ(j["queue_ms"], 0.0);
  EXPECT_EQ(j["encoding"], "utf-8");
  EXPECT_EQ(j["exit_code"], 0);
}

pools::PoolConfig Defaults(pools::PoolKind kind) {
  pools::PoolConfig c;
  c.kind = kind;
  c.max = kind == pools::PoolKind::kContainer ? 64 : 8;
  return c;
}

TEST(PoolJsonTest, PutOverExistingOrDefaults) {
  auto c = ParsePoolPut(R"({"runtime":"python"})", "py", nullptr, Defaults);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "py");
  EXPECT_EQ(c->kind, pools::PoolKind::kFncall);
  EXPECT_EQ(c->max, 8);
  // A new fncall pool without "runtime" is a command pool.
  c = ParsePoolPut(R"({"command":["/bin/cat"]})", "cat", nullptr, Defaults);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->runtime, backends::FnRuntime::kExec);
  // Without "kind", the existing pool's is kept, with its config.
  pools::PoolConfig existing = Defaults(pools::PoolKind::kContainer);
  existing.name = "web";
  existing.max = 3;
  c = ParsePoolPut("", "web", &existing, Defaults);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kind, pools::PoolKind::kContainer);
  EXPECT_EQ(c->max, 3);
  // Round trip through the state DB's form.
  auto stored = StoredPoolFromJson(ToJson(*c).dump(), "web", Defaults);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(ToJson(*stored), ToJson(*c));
}

TEST(PoolJsonTest, PutErrors) {
  EXPECT_EQ(ParsePoolPut("[]", "p", nullptr, Defaults).status().message(),
            "the body must be a JSON object");
  EXPECT_EQ(
      ParsePoolPut(R"({"name":"q","runtime":"python"})", "p", nullptr, Defaults).status().message(),
      "\"name\" differs from the path");
  EXPECT_EQ(ParsePoolPut(R"({"kind":"vm"})", "p", nullptr, Defaults).status().message(),
            "\"kind\" must be \"fncall\", \"container\" or \"microvm\"");
  EXPECT_EQ(ParsePoolPut("{}", "p", nullptr, Defaults).status().message(),
            "\"runtime\" is required");
  EXPECT_FALSE(StoredPoolFromJson("{", "p", Defaults).ok());
}

}  // namespace
}  // namespace dsec::api
