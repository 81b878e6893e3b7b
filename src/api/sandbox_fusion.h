// SandboxFusion's HTTP protocol (github.com/bytedance/SandboxFusion, the /run_code API that
// verl's code rewards and SkyRL call), as data: the request read into a typed struct, the
// result rendered as its response, its status rules, and the languages with how each is
// compiled and run. The edge's compat listener (edge/sandbox_fusion.cc) runs them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/json.h"

namespace dsec::api::fusion {

struct RunCodeRequest {
  std::string code;
  std::string language;  // one of SandboxFusion's language names (IsLanguageName)
  double compile_timeout_s = 10;
  double run_timeout_s = 10;
  int64_t memory_limit_mb = -1;  // <= 0: the server's default
  std::optional<std::string> stdin_data;
  // Relative (or absolute) path -> bytes (decoded from base64); a null content is skipped, as
  // SandboxFusion does, and so is a name holding "IGNORE_THIS_FILE".
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> fetch_files;
  std::vector<std::string> args;  // pytest's extra arguments
};

// One field SandboxFusion's request model (FastAPI/pydantic) would refuse: its 422 entry.
struct FieldError {
  std::vector<std::string> loc;  // "body", then the field
  std::string msg;
  std::string type;
};

// The request, or the fields that are wrong (a 422 {"detail": [...]}, RenderDetail).
bool ParseRunCode(std::string_view body, RunCodeRequest* out, std::vector<FieldError>* errors);
std::string RenderDetail(const std::vector<FieldError>& errors);

// /run_jupyter: cells run one after another in one python kernel.
struct RunJupyterRequest {
  std::vector<std::string> cells;
  double cell_timeout_s = 0;  // 0: none
  double total_timeout_s = 45;
  std::vector<std::pair<std::string, std::string>> files;  // as RunCodeRequest's
  std::vector<std::string> fetch_files;
};
bool ParseRunJupyter(std::string_view body, RunJupyterRequest* out,
                     std::vector<FieldError>* errors);

// One cell's output as SandboxFusion reports it: streams, display data (MIME bundles: the
// cell's value and what display() showed) and errors ({ename, evalue, traceback: [lines]}).
struct CellResult {
  std::string stdout_data, stderr_data;
  Json display = Json::array();
  Json error = Json::array();
};
// The cells of a code-interpreter kernel's NDJSON output (edge/e2b_kernel.cc: E2B's lines), one
// per finished execution; lines that are not JSON objects are skipped.
std::vector<CellResult> CellsFromKernel(std::string_view ndjson);

enum class CommandStatus { kFinished, kError, kTimeLimitExceeded };

struct CommandResult {
  CommandStatus status = CommandStatus::kFinished;
  std::optional<double> execution_time_s;
  std::optional<int> return_code;  // absent on a time limit or an error
  std::string stdout_data, stderr_data;
};

struct RunCodeResult {
  std::optional<CommandResult> compile, run;
  std::map<std::string, std::string> files;  // fetched: path as asked -> bytes
};

enum class RunStatus { kSuccess, kFailed, kSandboxError };

// SandboxFusion's rules (parse_run_status): an Error step is SandboxError with that step's
// stderr as the message; else a time limit or a non-zero return code is Failed; else Success.
std::pair<RunStatus, std::string> StatusOf(const RunCodeResult& r);

// The 200 response: {status, message, compile_result, run_result, executor_pod_name, files}.
// A `sandbox_error` (the server could not run the code at all) makes it SandboxError with that
// message whatever the steps say.
std::string RenderRunCode(const RunCodeResult& r,
                          const std::optional<std::string>& sandbox_error = std::nullopt);

// The 200 response of /run_jupyter: {status, message, driver, cells, executor_pod_name, files}.
std::string RenderRunJupyter(RunStatus status, const std::string& message,
                             const std::optional<CommandResult>& driver,
                             const std::vector<CellResult>& cells,
                             const std::map<std::string, std::string>& files);

// How a language runs: its source file, the compile step (empty: none) and the run step, each
// an argv in the working directory; `tool` is what must be on PATH (for the error that names
// a missing toolchain).
struct Language {
  std::string name;
  std::string source;  // file name the code is written to
  std::vector<std::string> compile;
  std::vector<std::string> run;
  std::string tool;
};

// True for every language name SandboxFusion's API accepts (its request model refuses others).
bool IsLanguageName(std::string_view name);
// The languages this server runs (nullopt for a name it accepts but cannot run, e.g. cuda).
// `args` are pytest's extra arguments.
std::optional<Language> LanguageOf(std::string_view name, const std::vector<std::string>& args);

}  // namespace dsec::api::fusion
