// E2B's protocols as data (docs/e2b-protocol.md has the wire details, as the pinned JS SDK
// speaks them): the control plane's JSON (sandboxes, errors, the metadata filter), envd's
// Connect RPC with the JSON codec (envelopes, end-of-stream trailers, error codes, process and
// filesystem messages) and its REST /files multipart bodies. The edge's E2B listener
// (edge/e2b.cc) runs them on sandboxes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::api::e2b {

// The envd version we report: the SDK switches features on by it (>= 0.5.7: stdin close and
// octet-stream uploads; >= 0.4.0: no default user sent, the server applies its own).
inline constexpr const char* kEnvdVersion = "0.6.13";
inline constexpr int kEnvdPort = 49983;
inline constexpr int kCodeInterpreterPort = 49999;

// ---- control plane -------------------------------------------------------------------------

// {"code": <HTTP status>, "message": ...}: the SDK reads the numeric code from the body.
std::string ApiError(int status, std::string_view message);

// The metadata filter of GET /v2/sandboxes ("k%3Dv%26a%2520b%3Dc": after the query decode,
// unescaped once more as a whole, then per key and value). InvalidArgument when malformed.
StatusOr<std::map<std::string, std::string>> ParseMetadataFilter(std::string_view once_decoded);

// Seconds since the epoch (ms) as RFC 3339 UTC, "2026-12-06T02:40:00.123Z".
std::string Rfc3339(int64_t ms);

// ---- Connect (JSON codec) ------------------------------------------------------------------

// A Connect error code's name ("not_found") and its HTTP status, as connect-go maps them.
int ConnectHttpStatus(std::string_view code);
// The Connect code for one of our errors.
std::string_view ConnectCodeFor(const Status& s);
// A unary error response body {"code": "<name>", "message": ...}.
std::string ConnectErrorBody(std::string_view code, std::string_view message);

// One envelope of a streamed body: [flags][uint32 BE length][json].
std::string Envelope(uint8_t flags, std::string_view json);
inline constexpr uint8_t kEndStream = 0x02;
// The end-of-stream envelope: {} or {"error": {"code", "message"}}.
std::string EndStream(std::optional<std::pair<std::string, std::string>> error = std::nullopt);
// The one message envelope of a server-streaming request body. InvalidArgument when the body
// is not exactly one uncompressed envelope of a JSON object.
StatusOr<Json> ParseRequestEnvelope(std::string_view body);

// process.Process: the StartRequest, as we run it.
struct StartRequest {
  std::string cmd;
  std::vector<std::string> args;
  std::map<std::string, std::string> envs;
  std::optional<std::string> cwd;
  std::optional<std::string> tag;
  bool stdin_open = true;  // "stdin" unset or true: a pipe stays open; false: /dev/null
  bool pty = false;
  uint16_t cols = 80, rows = 24;
};
StatusOr<StartRequest> ParseStartRequest(const Json& j);

// A ProcessSelector ({"pid": N} or {"tag": "t"}) of a request's "process" field.
struct Selector {
  std::optional<uint32_t> pid;
  std::optional<std::string> tag;
};
StatusOr<Selector> ParseSelector(const Json& request);

// Events of a process stream ({"event": {...}}), as JSON text.
std::string StartEvent(uint32_t pid);
std::string DataEvent(bool stderr_stream, std::string_view bytes, bool pty = false);
std::string KeepaliveEvent();
// envd's end values: exit 0 {"exited":true,"status":"exit status 0"}; exit N adds exitCode and
// error "exit status N"; a signal is exitCode -1, "signal: killed" (no "exited").
std::string EndEvent(int exit_code, int signal);

// filesystem.Filesystem's EntryInfo.
struct Entry {
  std::string name, path;
  std::string type;  // "file", "dir", "symlink" (the target's type goes in `type` for envd)
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits and file type bits (st_mode)
  int64_t mtime_ms = 0;
  std::string owner, group;
  std::optional<std::string> symlink_target;
};
Json EntryJson(const Entry& e);
// Go's FileMode.String() of st_mode: "-rw-r--r--", "drwxr-xr-x".
std::string Permissions(uint32_t st_mode);

// ---- envd REST -----------------------------------------------------------------------------

// One part of a multipart/form-data body: its field name, filename and bytes (a view into the
// body, which must outlive it).
struct Part {
  std::string name, filename;
  std::string_view data;
};
// Parses a multipart/form-data body with the boundary of `content_type`.
StatusOr<std::vector<Part>> ParseMultipart(std::string_view content_type, std::string_view body);

}  // namespace dsec::api::e2b
