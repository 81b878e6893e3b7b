#include "api/exec_json.h"

#include <gtest/gtest.h>

#include <csignal>

namespace dsec::api {
namespace {

const ExecLimits kExecLimits{.max_stdin_bytes = 1 << 20, .max_output_bytes = 1 << 20};

std::string ExecParseError(std::string_view body) {
  auto p = ParseExecRequest(body, kExecLimits);
  EXPECT_FALSE(p.ok()) << body;
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << body;
  return std::string(p.status().message());
}

TEST(ExecJsonTest, ParsesAnExec) {
  auto p = ParseExecRequest(
      R"({"cmd":["echo","hi"],"stdin":"aGk=","stdin_encoding":"base64","env":{"A":"1"},
          "cwd":"/tmp","user":"root","timeout_ms":5,"max_output_bytes":7,"encoding":"base64",
          "background":true,"request_id":"r1"})",
      kExecLimits);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->req.cmd, (std::vector<std::string>{"echo", "hi"}));
  EXPECT_FALSE(p->req.shell);
  EXPECT_EQ(p->req.stdin_data, "hi");
  EXPECT_EQ(p->req.env.at("A"), "1");
  EXPECT_EQ(p->req.cwd, "/tmp");
  EXPECT_EQ(p->req.user, "root");
  EXPECT_EQ(p->req.timeout_ms, 5);
  EXPECT_EQ(p->req.max_output_bytes, 7u);
  EXPECT_TRUE(p->base64);
  EXPECT_TRUE(p->background);
  EXPECT_FALSE(p->req.grader);
}

TEST(ExecJsonTest, DefaultsAndShellForms) {
  auto p = ParseExecRequest(R"({"shell":"echo hi"})", kExecLimits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->req.shell, "echo hi");
  EXPECT_TRUE(p->req.cmd.empty());
  EXPECT_EQ(p->req.timeout_ms, 30000);
  EXPECT_EQ(p->req.max_output_bytes, kDefaultExecOutput);
  EXPECT_FALSE(p->base64);
  EXPECT_FALSE(p->background);
  // "cmd" as a string runs as sh -c.
  p = ParseExecRequest(R"({"cmd":"ls | wc -l","grader":true})", kExecLimits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->req.shell, "ls | wc -l");
  EXPECT_TRUE(p->req.grader);
}

TEST(ExecJsonTest, RejectsBadExecs) {
  EXPECT_EQ(ExecParseError("[]").empty(), false);
  EXPECT_EQ(ExecParseError("{}"),
            "give exactly one of \"cmd\" (an array, or a string for sh -c) and \"shell\"");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"shell":"b"})"),
            "give exactly one of \"cmd\" (an array, or a string for sh -c) and \"shell\"");
  EXPECT_EQ(ExecParseError(R"({"cmd":[]})"), "\"cmd\" must not be empty");
  EXPECT_EQ(ExecParseError(R"({"cmd":[""]})"), "\"cmd\" must not be empty");
  EXPECT_EQ(ExecParseError(R"({"cmd":""})"), "\"cmd\" must not be empty");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"encoding":"hex"})"),
            "\"encoding\" must be \"utf-8\" or \"base64\"");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"stdin_encoding":"hex"})"),
            "\"stdin_encoding\" must be \"utf-8\" or \"base64\"");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"stdin":"*","stdin_encoding":"base64"})"),
            "\"stdin\" is not valid base64");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"cwd":"tmp"})"), "\"cwd\" must be an absolute path");
  EXPECT_EQ(ExecParseError(R"({"cmd":["a"],"user":""})"), "\"user\" must not be empty");
  ExecParseError(R"({"cmd":["a"],"timeout_ms":86400001})");
  ExecParseError(R"({"cmd":["a"],"max_output_bytes":1048577})");
  ExecParseError(R"({"cmd":["a"],"memroy_mb":1})");  // an unknown field
  ExecParseError(R"({"cmd":[1]})");
}

TEST(ExecJsonTest, ShellRequests) {
  auto user = ParseOpenShellRequest("");
  ASSERT_TRUE(user.ok());
  EXPECT_FALSE(*user);
  user = ParseOpenShellRequest(R"({"user":"root","request_id":"x"})");
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(**user, "root");
  EXPECT_FALSE(ParseOpenShellRequest(R"({"user":""})").ok());
  EXPECT_FALSE(ParseOpenShellRequest(R"({"shell":"x"})").ok());

  auto run = ParseShellRunRequest(R"({"command":"ls","encoding":"base64"})", 100);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->command, "ls");
  EXPECT_EQ(run->timeout_ms, 60000);
  EXPECT_EQ(run->max_output, kDefaultExecOutput);
  EXPECT_TRUE(run->base64);
  EXPECT_EQ(ParseShellRunRequest("{}", 100).status().message(), "\"command\" is required");
  EXPECT_FALSE(ParseShellRunRequest(R"({"command":"ls","max_output_bytes":101})", 100).ok());
  EXPECT_EQ(ParseShellRunRequest(R"({"command":"ls","encoding":"x"})", 100).status().message(),
            "\"encoding\" must be \"utf-8\" or \"base64\"");
}

TEST(ExecJsonTest, Signals) {
  EXPECT_EQ(*ParseSignalRequest(R"({"signal":"TERM"})"), SIGTERM);
  EXPECT_EQ(*ParseSignalRequest(R"({"signal":"SIGKILL"})"), SIGKILL);
  EXPECT_EQ(*ParseSignalRequest(R"({"signal":9})"), 9);
  EXPECT_EQ(ParseSignalRequest("{}").status().message(), "\"signal\" is required");
  EXPECT_EQ(ParseSignalRequest(R"({"signal":0})").status().message(), "signal numbers are 1-64");
  EXPECT_EQ(ParseSignalRequest(R"({"signal":65})").status().message(), "signal numbers are 1-64");
  EXPECT_EQ(ParseSignalRequest(R"({"signal":true})").status().message(),
            "\"signal\" must be a name or a number");
  EXPECT_EQ(ParseSignalRequest(R"({"signal":"SIGFOO"})").status().message(),
            "unknown signal \"SIGFOO\"");
  EXPECT_FALSE(ParseSignalRequest(R"({"signal":"TERM","x":1})").ok());
}

TEST(ExecJsonTest, AttachControlFrames) {
  auto c = ParseAttachControl(R"({"resize":[100,70000],"signal":"INT","eof":true})");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->resize);
  EXPECT_EQ(c->resize->first, 100);
  EXPECT_EQ(c->resize->second, 65535);
  EXPECT_EQ(c->signal, SIGINT);
  EXPECT_TRUE(c->eof);
  // Malformed fields are ignored.
  c = ParseAttachControl(R"({"resize":[-1,2],"signal":"NOPE"})");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->resize);
  EXPECT_FALSE(c->signal);
  EXPECT_FALSE(c->eof);
  EXPECT_EQ(ParseAttachControl("[1]").status().message(), "control frames are JSON objects");
  EXPECT_EQ(ParseAttachControl("{").status().message(), "control frames are JSON objects");
}

backends::ExecResult Result() {
  backends::ExecResult r;
  r.exit_code = 3;
  r.stdout_bytes = 5;
  r.duration_ms = 1.23456789;
  return r;
}

TEST(ExecJsonTest, Results) {
  EXPECT_EQ(ResultJson(Result(), false).dump(),
            R"({"duration_ms":1.235,"encoding":"utf-8","exit_code":3,"oom_killed":false,)"
            R"("signal":null,"stderr_bytes":0,"stderr_truncated":false,"stdout_bytes":5,)"
            R"("stdout_truncated":false,"timed_out":false})");
  Json j = ResultJson(Result(), true, "hello", "");
  EXPECT_EQ(j["stdout"], "aGVsbG8=");
  EXPECT_EQ(j["stderr"], "");
  EXPECT_EQ(j["encoding"], "base64");
  EXPECT_EQ(ExitJson(Result(), false)["exit"], ResultJson(Result(), false));
  EXPECT_EQ(ExitJson(NotFound("gone"), false).dump(),
            R"({"error":{"code":"not_found","message":"gone"}})");
  EXPECT_EQ(ErrorJson(InvalidArgument("x")).dump(),
            R"({"error":{"code":"bad_request","message":"x"}})");
  EXPECT_EQ(OutputJson(true, "e").dump(), R"({"stderr":"e"})");
  EXPECT_EQ(OutputJson(false, "o").dump(), R"({"stdout":"o"})");
  EXPECT_EQ(Line(OutputJson(false, "\xff")), "{\"stdout\":\"\xef\xbf\xbd\"}");
}

TEST(ExecJsonTest, EncoderCarriesSplitCharacters) {
  Encoder e(false);
  EXPECT_EQ(e.Take("a\xc3", false), "a");
  EXPECT_EQ(e.Take("\xa9", false), "\xc3\xa9");
  EXPECT_EQ(Encoder(true).Take("hi", false), "aGk=");
}

TEST(ExecJsonTest, Jobs) {
  protocol::JobInfo i;
  i.job_id = "ex-1";
  i.started_at = 42;
  i.meta = JobMeta(true);
  EXPECT_TRUE(JobBase64(i));
  EXPECT_FALSE(JobBase64(protocol::JobInfo{}));
  EXPECT_EQ(JobJson(i).dump(),
            R"({"exec_id":"ex-1","result":null,"started_at":42,"state":"running"})");
  i.done = true;
  i.result = Result();
  i.stdout_kept = 2;
  std::string out = "hi", err;
  Json done = JobJson(i, &out, &err);
  EXPECT_EQ(done["state"], "exited");
  EXPECT_EQ(done["result"], ResultJson(i.result, true, "hi", ""));
  EXPECT_FALSE(JobJson(i)["result"].contains("stdout"));

  protocol::JobReadResponse read;
  read.info = i;
  read.info.meta = JobMeta(false);
  read.stdout_offset = 1;
  Json live = JobReadJson(read, "i", "");
  EXPECT_EQ(live["stdout"], "i");
  EXPECT_EQ(live["stdout_offset"], 2);
  EXPECT_EQ(live["stderr"], "");
  EXPECT_EQ(live["stderr_offset"], 0);
  EXPECT_EQ(live["encoding"], "utf-8");
  // A running job's text stops before a split character.
  read.info.done = false;
  live = JobReadJson(read, "a\xc3", "");
  EXPECT_EQ(live["stdout"], "a");
  EXPECT_EQ(live["stdout_offset"], 2);
}

TEST(ExecJsonTest, SmallAnswers) {
  EXPECT_EQ(ExecStartedJson("ex-1").dump(), R"({"exec_id":"ex-1"})");
  EXPECT_EQ(SignaledJson(3).dump(), R"({"signaled":3})");
  EXPECT_EQ(ShellOpenedJson("sh-1").dump(), R"({"shell_id":"sh-1"})");
  EXPECT_EQ(ShellListJson({}).dump(), R"({"shells":[]})");
  EXPECT_EQ(ShellListJson({"sh-1", "sh-x"}).dump(), R"({"shells":["sh-1","sh-x"]})");
  EXPECT_EQ(ExecListJson({}).dump(), R"({"execs":[]})");
  protocol::JobInfo i;
  i.job_id = "ex-2";
  Json list = ExecListJson({i});
  ASSERT_EQ(list["execs"].size(), 1u);
  EXPECT_EQ(list["execs"][0], JobJson(i));
}

}  // namespace
}  // namespace dsec::api
