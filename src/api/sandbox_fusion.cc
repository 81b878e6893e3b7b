#include "api/sandbox_fusion.h"

#include <array>
#include <cmath>

#include "base/base64.h"
#include "base/json.h"
#include "base/strings.h"

namespace dsec::api::fusion {
namespace {

// SandboxFusion's Language literal (sandbox/runners/types.py).
constexpr std::array<std::string_view, 29> kLanguageNames = {
    "python",  "cpp",        "nodejs", "go",         "go_test",       "java",
    "php",     "csharp",     "bash",   "typescript", "sql",           "rust",
    "cuda",    "lua",        "R",      "perl",       "D_ut",          "ruby",
    "scala",   "julia",      "pytest", "junit",      "kotlin_script", "jest",
    "verilog", "python_gpu", "lean",   "swift",      "racket"};

void Add(std::vector<FieldError>* errors, std::string field, std::string msg, std::string type) {
  errors->push_back({{"body", std::move(field)}, std::move(msg), std::move(type)});
}

// A float field (pydantic accepts integers too); absent or null keeps *out.
void Float(const Json& j, const char* key, double lo, double hi, double* out,
           std::vector<FieldError>* errors) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_number() || it->is_boolean())
    return Add(errors, key, "Input should be a valid number", "float_parsing");
  double v = it->get<double>();
  if (!std::isfinite(v) || v <= lo || v > hi)
    return Add(errors, key,
               "Input should be greater than " + std::to_string(static_cast<int>(lo)) +
                   " and at most " + std::to_string(static_cast<int>(hi)),
               "value_error");
  *out = v;
}

void StringList(const Json& j, const char* key, size_t max, std::vector<std::string>* out,
                std::vector<FieldError>* errors) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array() || it->size() > max)
    return Add(errors, key, "Input should be a valid list of at most " + std::to_string(max),
               "list_type");
  for (const auto& v : *it) {
    if (!v.is_string()) return Add(errors, key, "Input should be a valid string", "string_type");
    out->push_back(v.get<std::string>());
  }
}

// files: path -> base64 content; null contents and names holding "IGNORE_THIS_FILE" are
// skipped, as SandboxFusion does.
void Files(const Json& j, std::vector<std::pair<std::string, std::string>>* out,
           std::vector<FieldError>* errors) {
  if (auto f = j.find("files"); f != j.end() && !f->is_null()) {
    if (!f->is_object() || f->size() > 1024) {
      Add(errors, "files", "Input should be a valid dictionary of at most 1024 files", "dict_type");
    } else {
      for (const auto& [name, v] : f->items()) {
        if (v.is_null()) continue;  // SandboxFusion skips these
        if (!v.is_string()) {
          errors->push_back(
              {{"body", "files", name}, "Input should be a valid string", "string_type"});
          continue;
        }
        auto data = Base64Decode(v.get<std::string>());
        if (!data) {
          errors->push_back(
              {{"body", "files", name}, "Input should be valid base64", "value_error"});
          continue;
        }
        if (name.find("IGNORE_THIS_FILE") != std::string::npos) continue;
        out->emplace_back(name, std::move(*data));
      }
    }
  }
}

// The body as a JSON object, or the error pydantic gives for one that is not.
std::optional<Json> ParseBody(std::string_view body, std::vector<FieldError>* errors) {
  auto parsed = ParseJson(body);
  if (parsed.ok() && parsed->is_object()) return std::move(*parsed);
  errors->push_back({{"body"},
                     parsed.ok() ? "Input should be a valid dictionary" : "JSON decode error",
                     parsed.ok() ? "model_attributes_type" : "json_invalid"});
  return std::nullopt;
}

const char* StatusName(CommandStatus s) {
  switch (s) {
    case CommandStatus::kFinished:
      return "Finished";
    case CommandStatus::kError:
      return "Error";
    case CommandStatus::kTimeLimitExceeded:
      return "TimeLimitExceeded";
  }
  return "Error";
}

Json CommandJson(const std::optional<CommandResult>& c) {
  if (!c) return nullptr;
  Json j = {{"status", StatusName(c->status)},
            {"execution_time", nullptr},
            {"return_code", nullptr},
            {"stdout", c->stdout_data},
            {"stderr", c->stderr_data}};
  if (c->execution_time_s) j["execution_time"] = *c->execution_time_s;
  if (c->return_code) j["return_code"] = *c->return_code;
  return j;
}

}  // namespace

bool IsLanguageName(std::string_view name) {
  for (auto n : kLanguageNames)
    if (n == name) return true;
  // SandboxFusion's runners also answer to "js" and "ts"; "c" is ours.
  return name == "js" || name == "ts" || name == "c";
}

bool ParseRunCode(std::string_view body, RunCodeRequest* out, std::vector<FieldError>* errors) {
  auto parsed = ParseBody(body, errors);
  if (!parsed) return false;
  const Json& j = *parsed;
  auto code = j.find("code");
  if (code == j.end() || code->is_null())
    Add(errors, "code", "Field required", "missing");
  else if (!code->is_string())
    Add(errors, "code", "Input should be a valid string", "string_type");
  else
    out->code = code->get<std::string>();
  out->language = "python";
  if (auto l = j.find("language"); l != j.end() && !l->is_null()) {
    if (!l->is_string() || !IsLanguageName(l->get<std::string>()))
      Add(errors, "language",
          "Input should be one of SandboxFusion's languages ('python', 'cpp', 'nodejs', 'go', "
          "'java', 'bash', ...)",
          "literal_error");
    else
      out->language = l->get<std::string>();
  }
  Float(j, "compile_timeout", 0, 3600, &out->compile_timeout_s, errors);
  Float(j, "run_timeout", 0, 3600, &out->run_timeout_s, errors);
  if (auto m = j.find("memory_limit_MB"); m != j.end() && !m->is_null()) {
    if (!m->is_number_integer())
      Add(errors, "memory_limit_MB", "Input should be a valid integer", "int_type");
    else
      out->memory_limit_mb = m->get<int64_t>();
  }
  if (auto s = j.find("stdin"); s != j.end() && !s->is_null()) {
    if (!s->is_string())
      Add(errors, "stdin", "Input should be a valid string", "string_type");
    else
      out->stdin_data = s->get<std::string>();
  }
  Files(j, &out->files, errors);
  StringList(j, "fetch_files", 1024, &out->fetch_files, errors);
  StringList(j, "args", 256, &out->args, errors);
  return errors->empty();
}

bool ParseRunJupyter(std::string_view body, RunJupyterRequest* out,
                     std::vector<FieldError>* errors) {
  auto parsed = ParseBody(body, errors);
  if (!parsed) return false;
  const Json& j = *parsed;
  auto cells = j.find("cells");
  if (cells == j.end() || cells->is_null())
    Add(errors, "cells", "Field required", "missing");
  else
    StringList(j, "cells", 1024, &out->cells, errors);
  // cell_timeout may be 0 (none); total_timeout must be positive.
  if (auto c = j.find("cell_timeout"); c != j.end() && !c->is_null() && c->is_number() &&
                                       !c->is_boolean() && c->get<double>() == 0) {
    out->cell_timeout_s = 0;
  } else {
    Float(j, "cell_timeout", 0, 3600, &out->cell_timeout_s, errors);
  }
  Float(j, "total_timeout", 0, 3600, &out->total_timeout_s, errors);
  if (auto k = j.find("kernel");
      k != j.end() && !k->is_null() && (!k->is_string() || k->get<std::string>() != "python3"))
    Add(errors, "kernel", "Input should be 'python3'", "literal_error");
  Files(j, &out->files, errors);
  StringList(j, "fetch_files", 1024, &out->fetch_files, errors);
  return errors->empty();
}

std::vector<CellResult> CellsFromKernel(std::string_view ndjson) {
  // E2B's result formats -> Jupyter's MIME bundle keys.
  static const std::pair<const char*, const char*> kMime[] = {
      {"text", "text/plain"},        {"html", "text/html"},
      {"markdown", "text/markdown"}, {"svg", "image/svg+xml"},
      {"png", "image/png"},          {"jpeg", "image/jpeg"},
      {"pdf", "application/pdf"},    {"latex", "text/latex"},
      {"json", "application/json"},  {"javascript", "application/javascript"}};
  std::vector<CellResult> cells;
  std::optional<CellResult> cur;
  while (!ndjson.empty()) {
    size_t nl = ndjson.find('\n');
    std::string_view line = ndjson.substr(0, nl);
    ndjson.remove_prefix(nl == std::string_view::npos ? ndjson.size() : nl + 1);
    auto j = ParseJson(line);
    if (!j.ok() || !j->is_object()) continue;
    std::string type = j->value("type", "");
    if (type == "number_of_executions") {
      cur = CellResult{};
    } else if (!cur) {
      continue;
    } else if (type == "stdout" || type == "stderr") {
      (type == "stdout" ? cur->stdout_data : cur->stderr_data) += j->value("text", "");
    } else if (type == "result") {
      Json bundle = Json::object();
      for (const auto& [key, mime] : kMime)
        if (auto v = j->find(key); v != j->end() && !v->is_null()) bundle[mime] = *v;
      cur->display.push_back(std::move(bundle));
    } else if (type == "error") {
      Json tb = Json::array();
      for (auto piece : SplitString(j->value("traceback", ""), '\n', true)) tb.push_back(piece);
      cur->error.push_back(
          {{"ename", j->value("name", "")}, {"evalue", j->value("value", "")}, {"traceback", tb}});
    } else if (type == "end_of_execution") {
      cells.push_back(std::move(*cur));
      cur.reset();
    }
  }
  return cells;
}

std::string RenderRunJupyter(RunStatus status, const std::string& message,
                             const std::optional<CommandResult>& driver,
                             const std::vector<CellResult>& cells,
                             const std::map<std::string, std::string>& files) {
  Json c = Json::array();
  for (const auto& cell : cells)
    c.push_back({{"stdout", cell.stdout_data},
                 {"stderr", cell.stderr_data},
                 {"display", cell.display},
                 {"error", cell.error}});
  Json f = Json::object();
  for (const auto& [name, data] : files) f[name] = Base64Encode(data);
  Json j = {{"status", status == RunStatus::kSuccess  ? "Success"
                       : status == RunStatus::kFailed ? "Failed"
                                                      : "SandboxError"},
            {"message", message},
            {"driver", CommandJson(driver)},
            {"cells", c},
            {"executor_pod_name", nullptr},
            {"files", f}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string RenderDetail(const std::vector<FieldError>& errors) {
  Json d = Json::array();
  for (const auto& e : errors) d.push_back({{"type", e.type}, {"loc", e.loc}, {"msg", e.msg}});
  return Json{{"detail", d}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::pair<RunStatus, std::string> StatusOf(const RunCodeResult& r) {
  for (const auto* c : {&r.compile, &r.run})
    if (*c && (*c)->status == CommandStatus::kError)
      return {RunStatus::kSandboxError, (*c)->stderr_data};
  for (const auto* c : {&r.compile, &r.run})
    if (*c && (*c)->status == CommandStatus::kTimeLimitExceeded) return {RunStatus::kFailed, ""};
  for (const auto* c : {&r.compile, &r.run})
    if (*c && (*c)->return_code && *(*c)->return_code != 0) return {RunStatus::kFailed, ""};
  return {RunStatus::kSuccess, ""};
}

std::string RenderRunCode(const RunCodeResult& r, const std::optional<std::string>& sandbox_error) {
  auto [status, message] = StatusOf(r);
  if (sandbox_error) status = RunStatus::kSandboxError, message = *sandbox_error;
  Json files = Json::object();
  for (const auto& [name, data] : r.files) files[name] = Base64Encode(data);
  Json j = {{"status", status == RunStatus::kSuccess  ? "Success"
                       : status == RunStatus::kFailed ? "Failed"
                                                      : "SandboxError"},
            {"message", message},
            {"compile_result", CommandJson(r.compile)},
            {"run_result", CommandJson(r.run)},
            {"executor_pod_name", nullptr},
            {"files", files}};
  // Output that is not UTF-8 is shown with U+FFFD, as SandboxFusion's try_decode falls back.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::optional<Language> LanguageOf(std::string_view name, const std::vector<std::string>& args) {
  using V = std::vector<std::string>;
  if (name == "python") return Language{"python", "main.py", {}, {"python3", "main.py"}, "python3"};
  if (name == "pytest") {
    V run = {"python3", "-m", "pytest", "test_main.py"};
    run.insert(run.end(), args.begin(), args.end());
    return Language{"pytest", "test_main.py", {}, run, "python3"};
  }
  if (name == "bash") return Language{"bash", "main.sh", {}, {"/bin/bash", "main.sh"}, "bash"};
  if (name == "cpp")
    return Language{"cpp",
                    "main.cpp",
                    {"g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lpthread"},
                    {"./main"},
                    "g++"};
  if (name == "c")
    return Language{
        "c", "main.c", {"gcc", "-O2", "main.c", "-o", "main", "-lm"}, {"./main"}, "gcc"};
  if (name == "nodejs" || name == "js")
    return Language{std::string(name), "main.js", {}, {"node", "main.js"}, "node"};
  if (name == "typescript" || name == "ts")
    return Language{std::string(name), "main.ts", {}, {"tsx", "main.ts"}, "tsx"};
  if (name == "go")
    return Language{"go", "main.go", {"go", "build", "-o", "main", "main.go"}, {"./main"}, "go"};
  if (name == "java")
    return Language{"java", "Main.java", {"javac", "Main.java"}, {"java", "-ea", "Main"}, "javac"};
  if (name == "rust")
    return Language{
        "rust", "main.rs", {"rustc", "-O", "main.rs", "-o", "main"}, {"./main"}, "rustc"};
  if (name == "php") return Language{"php", "main.php", {}, {"php", "-f", "main.php"}, "php"};
  if (name == "lua") return Language{"lua", "main.lua", {}, {"lua", "main.lua"}, "lua"};
  if (name == "perl") return Language{"perl", "main.pl", {}, {"perl", "main.pl"}, "perl"};
  if (name == "ruby") return Language{"ruby", "main.rb", {}, {"ruby", "main.rb"}, "ruby"};
  if (name == "R") return Language{"R", "main.R", {}, {"Rscript", "main.R"}, "Rscript"};
  return std::nullopt;
}

}  // namespace dsec::api::fusion
