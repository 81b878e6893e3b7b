#include "api/e2b.h"

#include <gtest/gtest.h>

namespace dsec::api::e2b {
namespace {

TEST(E2b, MetadataFilterIsDecodedAsTheRealApiDoes) {
  // GET /v2/sandboxes?metadata=k%3Dv%26a%252520b%3Dc%252526d, after the query decode:
  auto f = ParseMetadataFilter("k=v&a%2520b=c%2526d");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f, (std::map<std::string, std::string>{{"k", "v"}, {"a b", "c&d"}}));
  EXPECT_FALSE(ParseMetadataFilter("novalue").ok());
  EXPECT_FALSE(ParseMetadataFilter("k=%zz").ok());
}

TEST(E2b, EnvelopesRoundTrip) {
  std::string env = Envelope(0, R"({"process":{"cmd":"/bin/bash"},"stdin":false})");
  EXPECT_EQ(env[0], 0);
  EXPECT_EQ(static_cast<uint8_t>(env[4]), env.size() - 5);
  auto j = ParseRequestEnvelope(env);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["process"]["cmd"], "/bin/bash");
  EXPECT_FALSE(ParseRequestEnvelope(env + "x").ok());               // more than one message
  EXPECT_FALSE(ParseRequestEnvelope(env.substr(0, 7)).ok());        // cut short
  EXPECT_FALSE(ParseRequestEnvelope("\x01" + env.substr(1)).ok());  // compressed
  std::string end = EndStream(std::make_pair(std::string("deadline_exceeded"), std::string("x")));
  EXPECT_EQ(static_cast<uint8_t>(end[0]), kEndStream);
  EXPECT_EQ(Json::parse(end.substr(5))["error"]["code"], "deadline_exceeded");
  EXPECT_EQ(EndStream().substr(5), "{}");
}

TEST(E2b, EndEventsAreEnvds) {
  EXPECT_EQ(Json::parse(EndEvent(0, 0)),
            Json::parse(R"({"event":{"end":{"exited":true,"status":"exit status 0"}}})"));
  EXPECT_EQ(Json::parse(EndEvent(3, 0)),
            Json::parse(R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3",
                            "error":"exit status 3"}}})"));
  EXPECT_EQ(Json::parse(EndEvent(137, 9)),
            Json::parse(R"({"event":{"end":{"exitCode":-1,"status":"signal: killed",
                            "error":"signal: killed"}}})"));
  EXPECT_EQ(Json::parse(DataEvent(false, "out\n"))["event"]["data"]["stdout"], "b3V0Cg==");
  EXPECT_EQ(Json::parse(StartEvent(42))["event"]["start"]["pid"], 42);
}

TEST(E2b, StartRequest) {
  auto j = Json::parse(R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],
      "envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"tag":"t"})");
  auto r = ParseStartRequest(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->cmd, "/bin/bash");
  EXPECT_EQ(r->args, (std::vector<std::string>{"-l", "-c", "echo hi"}));
  EXPECT_EQ(r->envs.at("A"), "1");
  EXPECT_EQ(r->cwd, "/tmp");
  EXPECT_EQ(r->tag, "t");
  EXPECT_FALSE(r->stdin_open);
  EXPECT_FALSE(ParseStartRequest(Json::parse(R"({"process":{}})")).ok());
  EXPECT_FALSE(ParseStartRequest(Json::parse(R"({"process":{"cmd":"x","args":[1]}})")).ok());
  auto s = ParseSelector(Json::parse(R"({"process":{"pid":7}})"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pid, 7u);
  EXPECT_FALSE(ParseSelector(Json::parse(R"({"process":{}})")).ok());
}

TEST(E2b, ConnectCodesAndStatuses) {
  EXPECT_EQ(ConnectHttpStatus("not_found"), 404);
  EXPECT_EQ(ConnectHttpStatus("already_exists"), 409);
  EXPECT_EQ(ConnectHttpStatus("deadline_exceeded"), 504);
  EXPECT_EQ(ConnectHttpStatus("whatever"), 500);
  EXPECT_EQ(ConnectCodeFor(NotFound("x")), "not_found");
  EXPECT_EQ(ConnectCodeFor(Status(StatusCode::kAlreadyExists, "x")), "already_exists");
  EXPECT_EQ(Json::parse(ConnectErrorBody("not_found", "m")),
            Json::parse(R"({"code":"not_found","message":"m"})"));
  EXPECT_EQ(Json::parse(ApiError(404, "gone")), Json::parse(R"({"code":404,"message":"gone"})"));
}

TEST(E2b, EntryInfo) {
  Entry e{.name = "a.txt",
          .path = "/home/user/a.txt",
          .type = "file",
          .size = 5,
          .mode = 0644,
          .mtime_ms = 1767225600123};
  Json j = EntryJson(e);
  EXPECT_EQ(j["type"], "FILE_TYPE_FILE");
  EXPECT_EQ(j["size"], "5");
  EXPECT_EQ(j["mode"], 420);
  EXPECT_EQ(j["permissions"], "-rw-r--r--");
  EXPECT_EQ(j["modifiedTime"], "2026-01-01T00:00:00.123Z");
  e.type = "dir";
  e.mode = 0755;
  EXPECT_EQ(EntryJson(e)["permissions"], "drwxr-xr-x");
  EXPECT_EQ(EntryJson(e)["type"], "FILE_TYPE_DIRECTORY");
}

TEST(E2b, MultipartAsUndiciSendsIt) {
  const std::string ct = "multipart/form-data; boundary=----formdata-undici-045114538276";
  const std::string body =
      "------formdata-undici-045114538276\r\nContent-Disposition: form-data; name=\"file\"; "
      "filename=\"/home/user/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n"
      "------formdata-undici-045114538276\r\nContent-Disposition: form-data; name=\"file\"; "
      "filename=\"x/1.txt\"\r\nContent-Type: application/octet-stream\r\n\r\none\r\ntwo\r\n"
      "------formdata-undici-045114538276--\r\n";
  auto parts = ParseMultipart(ct, body);
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "file");
  EXPECT_EQ((*parts)[0].filename, "/home/user/a.txt");
  EXPECT_EQ((*parts)[0].data, "hello");
  EXPECT_EQ((*parts)[1].filename, "x/1.txt");
  EXPECT_EQ((*parts)[1].data, "one\r\ntwo");
  EXPECT_FALSE(ParseMultipart("multipart/form-data", body).ok());
  EXPECT_FALSE(ParseMultipart(ct, body.substr(0, 120)).ok());
}

}  // namespace
}  // namespace dsec::api::e2b
