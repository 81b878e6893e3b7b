#include "api/sandbox_fusion.h"

#include <gtest/gtest.h>

#include "base/json.h"

namespace dsec::api::fusion {
namespace {

TEST(SandboxFusion, AllEightFieldsOfVerlsRequest) {
  RunCodeRequest r;
  std::vector<FieldError> errors;
  const std::string body =
      "{\"code\": \"print(input())\", \"language\": \"python\", \"compile_timeout\": 5, "
      "\"run_timeout\": 2.5, \"memory_limit_MB\": 256, \"stdin\": \"hi\\n\", \"files\": "
      "{\"data/in.txt\": \"aGVsbG8=\", \"skip\": null, \"x_IGNORE_THIS_FILE\": \"YQ==\"}, "
      "\"fetch_files\": [\"out.txt\"], \"extra\": 1}";
  ASSERT_TRUE(ParseRunCode(body, &r, &errors));
  EXPECT_EQ(r.code, "print(input())");
  EXPECT_EQ(r.language, "python");
  EXPECT_EQ(r.compile_timeout_s, 5);
  EXPECT_EQ(r.run_timeout_s, 2.5);
  EXPECT_EQ(r.memory_limit_mb, 256);
  EXPECT_EQ(r.stdin_data, "hi\n");
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].first, "data/in.txt");
  EXPECT_EQ(r.files[0].second, "hello");
  EXPECT_EQ(r.fetch_files, std::vector<std::string>{"out.txt"});
}

TEST(SandboxFusion, JustCodeIsPythonWithDefaults) {
  RunCodeRequest r;
  std::vector<FieldError> errors;
  ASSERT_TRUE(ParseRunCode(R"j({"code": "print(1)"})j", &r, &errors));
  EXPECT_EQ(r.language, "python");
  EXPECT_EQ(r.run_timeout_s, 10);
  EXPECT_EQ(r.compile_timeout_s, 10);
  EXPECT_EQ(r.memory_limit_mb, -1);
  EXPECT_FALSE(r.stdin_data);
}

TEST(SandboxFusion, BadFieldsAreFastApiDetails) {
  RunCodeRequest r;
  std::vector<FieldError> errors;
  const std::string bad =
      "{\"language\": \"brainfuck\", \"run_timeout\": \"x\", \"files\": {\"a\": \"!!\"}, "
      "\"fetch_files\": \"a\"}";
  EXPECT_FALSE(ParseRunCode(bad, &r, &errors));
  Json d = Json::parse(RenderDetail(errors));
  ASSERT_TRUE(d["detail"].is_array());
  std::set<std::string> fields;
  for (const auto& e : d["detail"]) {
    EXPECT_EQ(e["loc"][0], "body");
    EXPECT_TRUE(e["msg"].is_string());
    EXPECT_TRUE(e["type"].is_string());
    fields.insert(e["loc"].back().get<std::string>());
  }
  EXPECT_EQ(fields, (std::set<std::string>{"code", "language", "run_timeout", "a", "fetch_files"}));
  errors.clear();
  EXPECT_FALSE(ParseRunCode("[1]", &r, &errors));
  EXPECT_FALSE(ParseRunCode("{", &r, &errors));
  errors.clear();
  EXPECT_FALSE(ParseRunCode(R"({"code": "x", "run_timeout": 0})", &r, &errors));
  EXPECT_FALSE(ParseRunCode(R"({"code": "x", "run_timeout": 1e9})", &r, &errors));
}

CommandResult Finished(int rc, std::string err = "") {
  CommandResult c;
  c.return_code = rc;
  c.execution_time_s = 0.01;
  c.stderr_data = std::move(err);
  return c;
}

TEST(SandboxFusion, StatusRules) {
  RunCodeResult r;
  r.run = Finished(0);
  EXPECT_EQ(StatusOf(r).first, RunStatus::kSuccess);
  r.run = Finished(1);
  EXPECT_EQ(StatusOf(r).first, RunStatus::kFailed);
  r.run = CommandResult{CommandStatus::kTimeLimitExceeded, 1.0, std::nullopt, "", ""};
  EXPECT_EQ(StatusOf(r).first, RunStatus::kFailed);
  // A failed compile and no run: Failed.
  r.run.reset();
  r.compile = Finished(1, "error: expected ';'");
  EXPECT_EQ(StatusOf(r), std::make_pair(RunStatus::kFailed, std::string()));
  // An Error step wins, with its stderr as the message.
  r.compile = CommandResult{CommandStatus::kError, std::nullopt, std::nullopt, "", "boom"};
  r.run = Finished(1);
  EXPECT_EQ(StatusOf(r), std::make_pair(RunStatus::kSandboxError, std::string("boom")));
}

TEST(SandboxFusion, RendersSandboxFusionsResponse) {
  RunCodeResult r;
  r.run = Finished(0);
  r.run->stdout_data = "hi\n\xff";
  r.files["out.bin"] = std::string("\x00\x01", 2);
  Json j = Json::parse(RenderRunCode(r));
  EXPECT_EQ(j["status"], "Success");
  EXPECT_EQ(j["message"], "");
  EXPECT_TRUE(j["compile_result"].is_null());
  EXPECT_EQ(j["run_result"]["status"], "Finished");
  EXPECT_EQ(j["run_result"]["return_code"], 0);
  EXPECT_EQ(j["run_result"]["stdout"], "hi\n\xEF\xBF\xBD");  // not UTF-8: U+FFFD
  EXPECT_EQ(j["files"]["out.bin"], "AAE=");
  EXPECT_TRUE(j.contains("executor_pod_name"));
  j = Json::parse(RenderRunCode({}, std::string("no toolchain")));
  EXPECT_EQ(j["status"], "SandboxError");
  EXPECT_EQ(j["message"], "no toolchain");
  EXPECT_TRUE(j["run_result"].is_null());
}

TEST(SandboxFusion, RunJupyter) {
  RunJupyterRequest r;
  std::vector<FieldError> errors;
  ASSERT_TRUE(ParseRunJupyter(R"({"cells": ["a = 1", "a"], "cell_timeout": 0,
                                  "files": {"x": "AAE="}, "fetch_files": ["y"]})",
                              &r, &errors));
  EXPECT_EQ(r.cells.size(), 2u);
  EXPECT_EQ(r.cell_timeout_s, 0);
  EXPECT_EQ(r.total_timeout_s, 45);
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].second, std::string("\x00\x01", 2));
  for (const char* bad : {R"({})", R"({"cells": [1]})", R"({"cells": [], "kernel": "r"})",
                          R"({"cells": [], "total_timeout": 0})", "[]"}) {
    RunJupyterRequest x;
    std::vector<FieldError> e;
    EXPECT_FALSE(ParseRunJupyter(bad, &x, &e)) << bad;
    EXPECT_FALSE(e.empty()) << bad;
  }
  // E2B's kernel lines to cells; junk and lines outside an execution are skipped.
  auto cells = CellsFromKernel(
      "{\"type\": \"ready\"}\njunk\n"
      "{\"type\": \"number_of_executions\", \"execution_count\": 1}\n"
      "{\"type\": \"stdout\", \"text\": \"a\"}\n{\"type\": \"stdout\", \"text\": \"b\\n\"}\n"
      "{\"type\": \"result\", \"text\": \"2\", \"html\": \"<i>2</i>\", \"is_main_result\": true}\n"
      "{\"type\": \"end_of_execution\"}\n"
      "{\"type\": \"number_of_executions\", \"execution_count\": 2}\n"
      "{\"type\": \"error\", \"name\": \"E\", \"value\": \"v\", \"traceback\": \"l1\\nl2\\n\"}\n"
      "{\"type\": \"end_of_execution\"}\n"
      "{\"type\": \"number_of_executions\", \"execution_count\": 3}\n");
  ASSERT_EQ(cells.size(), 2u);  // the third never ended
  EXPECT_EQ(cells[0].stdout_data, "ab\n");
  EXPECT_EQ(cells[0].display, Json::parse(R"([{"text/plain": "2", "text/html": "<i>2</i>"}])"));
  EXPECT_EQ(cells[1].error,
            Json::parse(R"([{"ename": "E", "evalue": "v", "traceback": ["l1", "l2"]}])"));
  auto j = Json::parse(RenderRunJupyter(RunStatus::kSuccess, "", std::nullopt, cells, {}));
  EXPECT_EQ(j["status"], "Success");
  EXPECT_EQ(j["cells"][0]["stdout"], "ab\n");
  EXPECT_TRUE(j["driver"].is_null());
}

TEST(SandboxFusion, Languages) {
  EXPECT_TRUE(IsLanguageName("cuda"));
  EXPECT_FALSE(LanguageOf("cuda", {}));  // accepted by the protocol, not run here
  EXPECT_FALSE(IsLanguageName("cobol"));
  auto cpp = LanguageOf("cpp", {});
  ASSERT_TRUE(cpp);
  EXPECT_FALSE(cpp->compile.empty());
  EXPECT_EQ(cpp->tool, "g++");
  auto py = LanguageOf("pytest", {"-x"});
  ASSERT_TRUE(py);
  EXPECT_EQ(py->run.back(), "-x");
  for (const char* l : {"python", "bash", "c", "nodejs", "js", "go", "java", "rust", "php"})
    EXPECT_TRUE(IsLanguageName(l) && LanguageOf(l, {})) << l;
}

}  // namespace
}  // namespace dsec::api::fusion
