#include "api/exec_json.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <tuple>

#include "api/errors.h"
#include "http/json_body.h"

namespace dsec::api {

StatusOr<ExecParams> ParseExecRequest(std::string_view body, const ExecLimits& limits) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  ExecParams p;
  // "cmd" as a string (E2B-style REST users send one) runs as "sh -c STRING", as "shell" does.
  std::optional<std::vector<std::string>> cmd;
  std::optional<std::string> cmd_string;
  if (auto it = b.json().find("cmd"); it != b.json().end() && it->is_string()) {
    DSEC_ASSIGN_OR_RETURN(cmd_string, b.String("cmd", 1 << 20));
  } else {
    DSEC_ASSIGN_OR_RETURN(cmd, b.StringArray("cmd", 4096, 1 << 20));
  }
  DSEC_ASSIGN_OR_RETURN(auto shell, b.String("shell", 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto stdin_data, b.String("stdin", limits.max_stdin_bytes));
  DSEC_ASSIGN_OR_RETURN(auto stdin_enc, b.String("stdin_encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto env, b.StringMap("env", 256, 256, 32 << 10));
  DSEC_ASSIGN_OR_RETURN(auto cwd, b.String("cwd", 4096));
  DSEC_ASSIGN_OR_RETURN(auto user, b.String("user", 64));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 0, kMaxExecTimeoutMs));
  DSEC_ASSIGN_OR_RETURN(
      auto max_out, b.Int("max_output_bytes", 0, static_cast<int64_t>(limits.max_output_bytes)));
  DSEC_ASSIGN_OR_RETURN(auto enc, b.String("encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto background, b.Bool("background"));
  DSEC_ASSIGN_OR_RETURN(auto grader, b.Bool("grader"));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  if ((cmd.has_value() || cmd_string.has_value()) == shell.has_value())
    return InvalidArgument(
        "give exactly one of \"cmd\" (an array, or a string for sh -c) and \"shell\"");
  if (cmd_string) {
    if (cmd_string->empty()) return InvalidArgument("\"cmd\" must not be empty");
    shell = std::move(cmd_string);
  }
  if (cmd) {
    if (cmd->empty() || (*cmd)[0].empty()) return InvalidArgument("\"cmd\" must not be empty");
    p.req.cmd = *cmd;
  } else {
    p.req.shell = *shell;
  }
  if (enc && *enc != "utf-8" && *enc != "base64")
    return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
  p.base64 = enc && *enc == "base64";
  DSEC_ASSIGN_OR_RETURN(p.req.stdin_data, DecodeStdin(std::move(stdin_data), stdin_enc));
  if (cwd && (cwd->empty() || (*cwd)[0] != '/'))
    return InvalidArgument("\"cwd\" must be an absolute path");
  DSEC_RETURN_IF_ERROR(CheckUser(user));
  if (env) p.req.env = http::Flatten(*env);
  if (cwd) p.req.cwd = *cwd;
  if (user) p.req.user = *user;
  p.req.timeout_ms = timeout.value_or(30000);
  p.req.max_output_bytes = static_cast<uint64_t>(max_out.value_or(kDefaultExecOutput));
  p.background = background.value_or(false);
  p.req.grader = grader.value_or(false);  // (with "user": 400 from the backend)
  return p;
}

StatusOr<std::optional<std::string>> ParseOpenShellRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto user, b.String("user", 64));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  DSEC_RETURN_IF_ERROR(CheckUser(user));
  return user;
}

StatusOr<ShellRunParams> ParseShellRunRequest(std::string_view body, uint64_t max_output_bytes) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto cmd, b.String("command", 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 0, kMaxExecTimeoutMs));
  DSEC_ASSIGN_OR_RETURN(auto max_out,
                        b.Int("max_output_bytes", 0, static_cast<int64_t>(max_output_bytes)));
  DSEC_ASSIGN_OR_RETURN(auto enc, b.String("encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!cmd) return InvalidArgument("\"command\" is required");
  if (enc && *enc != "utf-8" && *enc != "base64")
    return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
  return ShellRunParams{*cmd, timeout.value_or(60000),
                        static_cast<uint64_t>(max_out.value_or(kDefaultExecOutput)),
                        enc && *enc == "base64"};
}

StatusOr<int> ParseSignalRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  const Json* sig = b.Raw("signal");
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  return ParseSignal(sig);
}

StatusOr<int> ParseSignal(const Json* v) {
  if (!v) return InvalidArgument("\"signal\" is required");
  if (v->is_number_integer()) {
    int64_t n = v->get<int64_t>();
    if (n < 1 || n > 64) return InvalidArgument("signal numbers are 1-64");
    return static_cast<int>(n);
  }
  if (!v->is_string()) return InvalidArgument("\"signal\" must be a name or a number");
  std::string s = v->get<std::string>();
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  static const std::pair<const char*, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"STOP", SIGSTOP},
      {"CONT", SIGCONT}, {"ALRM", SIGALRM}, {"PIPE", SIGPIPE}, {"WINCH", SIGWINCH}};
  for (const auto& [name, sig] : kNames)
    if (s == name) return sig;
  return InvalidArgument("unknown signal \"" + v->get<std::string>() + "\"");
}

StatusOr<AttachControl> ParseAttachControl(std::string_view frame) {
  auto j = ParseJson(frame);
  if (!j.ok() || !j->is_object()) return InvalidArgument("control frames are JSON objects");
  AttachControl ctl;
  if (auto it = j->find("resize"); it != j->end()) {
    if (it->is_array() && it->size() == 2 && (*it)[0].is_number_unsigned() &&
        (*it)[1].is_number_unsigned())
      ctl.resize = {static_cast<uint16_t>(std::min<uint64_t>((*it)[0].get<uint64_t>(), 65535)),
                    static_cast<uint16_t>(std::min<uint64_t>((*it)[1].get<uint64_t>(), 65535))};
  }
  if (auto it = j->find("signal"); it != j->end()) {
    auto sig = ParseSignal(&*it);
    if (sig.ok()) ctl.signal = *sig;
  }
  ctl.eof = j->value("eof", false);
  return ctl;
}

Status CheckUser(const std::optional<std::string>& user) {
  if (user && user->empty()) return InvalidArgument("\"user\" must not be empty");
  return OkStatus();
}

StatusOr<std::string> DecodeStdin(std::optional<std::string> data,
                                  const std::optional<std::string>& encoding) {
  if (encoding && *encoding != "utf-8" && *encoding != "base64")
    return InvalidArgument("\"stdin_encoding\" must be \"utf-8\" or \"base64\"");
  if (!data) return std::string();
  if (encoding && *encoding == "base64") {
    auto d = Base64Decode(*data);
    if (!d) return InvalidArgument("\"stdin\" is not valid base64");
    return std::move(*d);
  }
  return std::move(*data);
}

Json ResultJson(const backends::ExecResult& r, bool base64) {
  return {{"exit_code", r.exit_code},
          {"signal", r.signal ? Json(r.signal) : Json(nullptr)},
          {"stdout_truncated", r.stdout_truncated},
          {"stderr_truncated", r.stderr_truncated},
          {"timed_out", r.timed_out},
          {"oom_killed", r.oom_killed},
          {"duration_ms", std::round(r.duration_ms * 1000.0) / 1000.0},  // to the microsecond
          {"stdout_bytes", r.stdout_bytes},
          {"stderr_bytes", r.stderr_bytes},
          {"encoding", base64 ? "base64" : "utf-8"}};
}

Json ResultJson(const backends::ExecResult& r, bool base64, std::string_view out,
                std::string_view err) {
  Json j = ResultJson(r, base64);
  j["stdout"] = Encoder(base64).Take(out, true);
  j["stderr"] = Encoder(base64).Take(err, true);
  return j;
}

Json ErrorJson(const Status& s) {
  auto [status, code] = HttpErrorFor(s);
  (void)status;
  return {{"error", {{"code", code}, {"message", s.message()}}}};
}

Json ExitJson(const StatusOr<backends::ExecResult>& r, bool base64) {
  return r.ok() ? Json{{"exit", ResultJson(*r, base64)}} : ErrorJson(r.status());
}

Json OutputJson(bool is_stderr, std::string text) {
  return Json{{is_stderr ? "stderr" : "stdout", std::move(text)}};
}

std::string Line(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string JobMeta(bool base64) { return base64 ? "base64" : ""; }

bool JobBase64(const protocol::JobInfo& i) { return i.meta == "base64"; }

Json JobJson(const protocol::JobInfo& i, const std::string* out, const std::string* err) {
  bool base64 = JobBase64(i);
  Json j = {{"exec_id", i.job_id},
            {"state", i.done ? "exited" : "running"},
            {"started_at", i.started_at},
            {"result", nullptr}};
  if (i.done)
    j["result"] =
        out && err ? ResultJson(i.result, base64, *out, *err) : ResultJson(i.result, base64);
  return j;
}

Json JobReadJson(const protocol::JobReadResponse& read, const std::string& out,
                 const std::string& err) {
  const protocol::JobInfo& i = read.info;
  Json j = JobJson(i);
  bool base64 = JobBase64(i);
  for (auto [name, data, start, kept] :
       {std::tuple{"stdout", &out, read.stdout_offset, i.stdout_kept},
        std::tuple{"stderr", &err, read.stderr_offset, i.stderr_kept}}) {
    // Text stops before a UTF-8 sequence the next read completes, unless none can follow.
    bool last = i.done && start + data->size() >= kept;
    std::string text = Encoder(base64).Take(*data, last);
    uint64_t used = base64 ? data->size() : text.size();
    j[name] = std::move(text);
    j[std::string(name) + "_offset"] = start + used;
  }
  j["encoding"] = base64 ? "base64" : "utf-8";
  return j;
}

Json ExecStartedJson(const std::string& exec_id) { return {{"exec_id", exec_id}}; }

Json ExecListJson(const std::vector<protocol::JobInfo>& jobs) {
  Json list = Json::array();
  for (const auto& i : jobs) list.push_back(JobJson(i));
  return {{"execs", list}};
}

Json SignaledJson(int count) { return {{"signaled", count}}; }

Json ShellOpenedJson(const std::string& shell_id) { return {{"shell_id", shell_id}}; }

Json ShellListJson(const std::vector<std::string>& shell_ids) {
  Json ids = Json::array();
  for (const auto& id : shell_ids) ids.push_back(id);
  return {{"shells", ids}};
}

}  // namespace dsec::api
