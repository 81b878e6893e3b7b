#include "api/fncall_json.h"

#include <cmath>

#include "api/exec_json.h"
#include "base/base64.h"
#include "base/strings.h"
#include "http/json_body.h"

namespace dsec::api {

StatusOr<FnCallParams> ParseFnCallRequest(std::string_view body, const FnCallLimits& limits) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  FnCallParams p;
  DSEC_ASSIGN_OR_RETURN(auto runtime, b.String("runtime", 128));
  DSEC_ASSIGN_OR_RETURN(auto code, b.String("code", limits.max_body_bytes));
  DSEC_ASSIGN_OR_RETURN(auto filename, b.String("filename", 256));
  DSEC_ASSIGN_OR_RETURN(auto stdin_data, b.String("stdin", limits.max_body_bytes));
  DSEC_ASSIGN_OR_RETURN(auto stdin_enc, b.String("stdin_encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 1, kMaxCallTimeoutMs));
  DSEC_ASSIGN_OR_RETURN(auto memory, b.Int("memory_mb", 16, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(
      auto max_out, b.Int("max_output_bytes", 0, static_cast<int64_t>(limits.max_output_bytes)));
  DSEC_ASSIGN_OR_RETURN(auto encoding, b.String("encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  const Json* files = b.Raw("files");
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!runtime || runtime->empty()) return InvalidArgument("\"runtime\" is required");
  if (!code) return InvalidArgument("\"code\" is required");
  p.runtime = *runtime;
  p.req.call.code = std::move(*code);
  if (filename) {
    if (filename->find('\0') != std::string::npos)
      return InvalidArgument("\"filename\" must not contain NUL");
    p.req.call.filename = *filename;
  }
  DSEC_ASSIGN_OR_RETURN(p.req.stdin_data, DecodeStdin(std::move(stdin_data), stdin_enc));
  if (files) {
    if (!files->is_object() || files->size() > 256)
      return InvalidArgument("\"files\" must be an object of at most 256 name: content entries");
    for (const auto& [name, v] : files->items()) {
      if (name.empty() || name.size() > 1024 || name[0] == '/' || name.find('\0') != name.npos)
        return InvalidArgument("file names are relative paths: \"" + name + "\"");
      for (auto part : SplitString(name, '/', false))
        if (part.empty() || part == "." || part == "..")
          return InvalidArgument("file names are relative paths without . or ..: \"" + name + "\"");
      std::string data;
      if (v.is_string()) {
        data = v.get<std::string>();
      } else if (v.is_object() && v.size() == 1 && v.contains("base64") &&
                 v["base64"].is_string()) {
        auto d = Base64Decode(v["base64"].get<std::string>());
        if (!d) return InvalidArgument("file \"" + name + "\" is not valid base64");
        data = std::move(*d);
      } else {
        return InvalidArgument("file \"" + name + "\" must be a string or {\"base64\": ...}");
      }
      p.req.call.files.emplace_back(name, std::move(data));
    }
  }
  p.req.timeout_ms = timeout.value_or(5000);
  p.req.memory_mb = memory.value_or(0);
  p.req.max_output_bytes = static_cast<uint64_t>(max_out.value_or(kDefaultCallOutput));
  if (encoding && *encoding != "utf-8" && *encoding != "base64")
    return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
  p.base64 = encoding && *encoding == "base64";
  return p;
}

Json FnCallResultJson(const pools::CallResult& r, bool base64, const std::string& runtime) {
  Json j = ResultJson(r.out.result, base64, r.out.stdout_data, r.out.stderr_data);
  j["runtime"] = runtime;
  j["queue_ms"] = std::round(r.queue_ms * 1000.0) / 1000.0;
  return j;
}

}  // namespace dsec::api
