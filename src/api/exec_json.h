// Execs as the REST API writes them: the one place the bodies of the exec, shell and signal
// routes are parsed into typed requests, and exec results, background execs (jobs) and the
// NDJSON / WebSocket lines of streamed execs are rendered. The edge's exec handlers
// (edge/api_exec.cc) and fncalls (edge/api_fncall.cc) call these; they hold no JSON of their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sandbox_types.h"
#include "base/base64.h"
#include "base/json.h"
#include "base/status.h"
#include "protocol/agent_ops.h"

namespace dsec::api {

inline constexpr uint64_t kDefaultExecOutput = 1 << 20;
inline constexpr int64_t kMaxExecTimeoutMs = 86400000;

// The node's bounds on an exec request (from its config).
struct ExecLimits {
  uint64_t max_stdin_bytes = 0;   // "stdin" as sent (max_json_body_bytes)
  uint64_t max_output_bytes = 0;  // "max_output_bytes" at most
};

// POST /v1/sandboxes/{id}/execs. `req` has exactly one of cmd (non-empty) and shell set.
struct ExecParams {
  backends::ExecRequest req;
  bool base64 = false;  // "encoding": "base64"
  bool background = false;
};
StatusOr<ExecParams> ParseExecRequest(std::string_view body, const ExecLimits& limits);

// POST .../shells: the user of the shell (nullopt: the sandbox's).
StatusOr<std::optional<std::string>> ParseOpenShellRequest(std::string_view body);

// POST .../shells/{sid}/run.
struct ShellRunParams {
  std::string command;
  int64_t timeout_ms = 60000;
  uint64_t max_output = kDefaultExecOutput;
  bool base64 = false;
};
StatusOr<ShellRunParams> ParseShellRunRequest(std::string_view body, uint64_t max_output_bytes);

// POST .../signal: the signal number of its "signal".
StatusOr<int> ParseSignalRequest(std::string_view body);
// A signal as a number (1-64) or a name ("TERM", "SIGTERM"); nullptr: not given.
StatusOr<int> ParseSignal(const Json* v);

// A control frame (a text message) of the WebSocket attach.
struct AttachControl {
  std::optional<std::pair<uint16_t, uint16_t>> resize;  // cols, rows
  std::optional<int> signal;                            // a valid "signal" only
  bool eof = false;
};
// InvalidArgument for a frame that is not a JSON object; malformed fields are ignored.
StatusOr<AttachControl> ParseAttachControl(std::string_view frame);

// "user" names a user of the sandbox ("sandbox", "root", a name or a uid); empty is an error,
// not the default.
Status CheckUser(const std::optional<std::string>& user);

// A request's "stdin" as bytes, by its "stdin_encoding" (utf-8, the default, or base64).
StatusOr<std::string> DecodeStdin(std::optional<std::string> data,
                                  const std::optional<std::string>& encoding);

// Output bytes kept for a JSON string: utf-8 (invalid sequences become U+FFFD when encoded)
// or base64. A multi-byte character split across chunks is carried to the next chunk.
class Encoder {
 public:
  explicit Encoder(bool base64) : base64_(base64) {}
  std::string Take(std::string_view data, bool final) {
    if (base64_) return Base64Encode(data);
    std::string s = carry_ + std::string(data);
    carry_.clear();
    if (!final) {
      // Keep back an incomplete UTF-8 sequence at the end (at most 3 bytes).
      size_t n = s.size(), i = n;
      while (i > 0 && n - i < 3 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
      if (i > 0) {
        unsigned char lead = static_cast<unsigned char>(s[i - 1]);
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (need > 1 && n - (i - 1) < need) {
          carry_ = s.substr(i - 1);
          s.resize(i - 1);
        }
      }
    }
    return s;
  }

 private:
  bool base64_;
  std::string carry_;
};

// The exec result fields shared by every response shape (without the output).
Json ResultJson(const backends::ExecResult& r, bool base64);
// The result with the whole output ("stdout", "stderr"), as a buffered exec answers.
Json ResultJson(const backends::ExecResult& r, bool base64, std::string_view out,
                std::string_view err);

// An error as the last line of a streamed exec or a WebSocket frame: {"error": {code, message}}.
Json ErrorJson(const Status& s);
// The last line of a streamed exec or attach: {"exit": result}, or the error.
Json ExitJson(const StatusOr<backends::ExecResult>& r, bool base64);
// An output line of a streamed exec (or a stderr frame of attach): {"stdout"|"stderr": text}.
Json OutputJson(bool is_stderr, std::string text);
// A JSON line as streams write it (invalid UTF-8 replaced, no newline).
std::string Line(const Json& j);

// A background exec is a job its sandbox's agent keeps; its encoding is kept with it as the
// job's meta.
std::string JobMeta(bool base64);
bool JobBase64(const protocol::JobInfo& i);
// ExecStatus. `out`/`err`: the whole output (the result's stdout and stderr) once it exited;
// without them the result has only the exit fields (lists, live reads).
Json JobJson(const protocol::JobInfo& i, const std::string* out = nullptr,
             const std::string* err = nullptr);
// ExecStatus with the output read so far from the offsets of `read` (a live read), and the
// offsets to read on from.
Json JobReadJson(const protocol::JobReadResponse& read, const std::string& out,
                 const std::string& err);
// The answer of a background exec's start: {"exec_id"}.
Json ExecStartedJson(const std::string& exec_id);
// The answer of a list of a sandbox's execs: {"execs": [ExecStatus without output...]}.
Json ExecListJson(const std::vector<protocol::JobInfo>& jobs);
// The answer of a signal to every process: {"signaled": how many}.
Json SignaledJson(int count);

// The answers of the shell routes, with the API's shell ids ("sh-..."): {"shell_id"} of an
// open, {"shells": [...]} of a list.
Json ShellOpenedJson(const std::string& shell_id);
Json ShellListJson(const std::vector<std::string>& shell_ids);

}  // namespace dsec::api
