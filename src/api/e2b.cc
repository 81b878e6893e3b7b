#include "api/e2b.h"

#include <sys/stat.h>

#include <cctype>
#include <ctime>

#include "base/base64.h"
#include "base/strings.h"
#include "http/server.h"

namespace dsec::api::e2b {

namespace {

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

std::string ApiError(int status, std::string_view message) {
  return Dump(Json{{"code", status}, {"message", message}});
}

StatusOr<std::map<std::string, std::string>> ParseMetadataFilter(std::string_view once_decoded) {
  std::string whole;
  if (!http::PercentDecode(once_decoded, true, &whole))
    return InvalidArgument("metadata: malformed percent-encoding");
  std::map<std::string, std::string> out;
  for (auto pair : SplitString(whole, '&', true)) {
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos) return InvalidArgument("metadata: use key=value pairs");
    std::string k, v;
    if (!http::PercentDecode(pair.substr(0, eq), true, &k) ||
        !http::PercentDecode(pair.substr(eq + 1), true, &v) || k.empty())
      return InvalidArgument("metadata: malformed key or value");
    out[k] = v;
  }
  return out;
}

std::string Rfc3339(int64_t ms) {
  time_t t = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[40];
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

int ConnectHttpStatus(std::string_view code) {
  if (code == "invalid_argument" || code == "failed_precondition" || code == "out_of_range")
    return 400;
  if (code == "unauthenticated") return 401;
  if (code == "permission_denied") return 403;
  if (code == "not_found") return 404;
  if (code == "already_exists" || code == "aborted") return 409;
  if (code == "resource_exhausted") return 429;
  if (code == "canceled") return 499;
  if (code == "unimplemented") return 501;
  if (code == "unavailable") return 503;
  if (code == "deadline_exceeded") return 504;
  return 500;
}

std::string_view ConnectCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
    case StatusCode::kGone:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kPermissionDenied:
      return "permission_denied";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kResourceExhausted:
    case StatusCode::kOverCapacity:
      return "resource_exhausted";
    case StatusCode::kTooLarge:
      return "out_of_range";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kAborted:
      return "aborted";
    default:
      return "internal";
  }
}

std::string ConnectErrorBody(std::string_view code, std::string_view message) {
  return Dump(Json{{"code", code}, {"message", message}});
}

std::string Envelope(uint8_t flags, std::string_view json) {
  std::string out(5, '\0');
  out[0] = static_cast<char>(flags);
  uint32_t n = static_cast<uint32_t>(json.size());
  out[1] = static_cast<char>((n >> 24) & 0xff);
  out[2] = static_cast<char>((n >> 16) & 0xff);
  out[3] = static_cast<char>((n >> 8) & 0xff);
  out[4] = static_cast<char>(n & 0xff);
  out.append(json);
  return out;
}

std::string EndStream(std::optional<std::pair<std::string, std::string>> error) {
  Json j = Json::object();
  if (error) j["error"] = {{"code", error->first}, {"message", error->second}};
  return Envelope(kEndStream, Dump(j));
}

StatusOr<Json> ParseRequestEnvelope(std::string_view body) {
  if (body.size() < 5) return InvalidArgument("the request is not a Connect envelope");
  uint8_t flags = static_cast<uint8_t>(body[0]);
  if (flags != 0) return InvalidArgument("compressed or end-stream request envelopes are refused");
  uint32_t n = (static_cast<uint32_t>(static_cast<uint8_t>(body[1])) << 24) |
               (static_cast<uint32_t>(static_cast<uint8_t>(body[2])) << 16) |
               (static_cast<uint32_t>(static_cast<uint8_t>(body[3])) << 8) |
               static_cast<uint32_t>(static_cast<uint8_t>(body[4]));
  if (body.size() - 5 != n)
    return InvalidArgument("the request holds more or less than one envelope");
  auto j = ParseJson(body.substr(5));
  if (!j.ok() || !j->is_object())
    return InvalidArgument("the request message is not a JSON object");
  return std::move(*j);
}

namespace {

StatusOr<std::optional<std::string>> OptString(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return InvalidArgument(std::string(key) + " must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace

StatusOr<StartRequest> ParseStartRequest(const Json& j) {
  StartRequest r;
  auto p = j.find("process");
  if (p == j.end() || !p->is_object()) return InvalidArgument("process is required");
  DSEC_ASSIGN_OR_RETURN(auto cmd, OptString(*p, "cmd"));
  if (!cmd || cmd->empty()) return InvalidArgument("process.cmd is required");
  r.cmd = *cmd;
  if (auto a = p->find("args"); a != p->end() && !a->is_null()) {
    if (!a->is_array()) return InvalidArgument("process.args must be a list of strings");
    for (const auto& v : *a) {
      if (!v.is_string()) return InvalidArgument("process.args must be a list of strings");
      r.args.push_back(v.get<std::string>());
    }
  }
  if (auto e = p->find("envs"); e != p->end() && !e->is_null()) {
    if (!e->is_object()) return InvalidArgument("process.envs must be a map of strings");
    for (const auto& [k, v] : e->items()) {
      if (!v.is_string() || k.empty() || k.find('=') != std::string::npos)
        return InvalidArgument("process.envs must be a map of strings (names without '=')");
      r.envs[k] = v.get<std::string>();
    }
  }
  DSEC_ASSIGN_OR_RETURN(r.cwd, OptString(*p, "cwd"));
  DSEC_ASSIGN_OR_RETURN(r.tag, OptString(j, "tag"));
  if (auto s = j.find("stdin"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return InvalidArgument("stdin must be a boolean");
    r.stdin_open = s->get<bool>();
  }
  if (auto t = j.find("pty"); t != j.end() && !t->is_null()) {
    if (!t->is_object()) return InvalidArgument("pty must be an object");
    r.pty = true;
    if (auto sz = t->find("size"); sz != t->end() && sz->is_object()) {
      r.cols = static_cast<uint16_t>(sz->value("cols", 80));
      r.rows = static_cast<uint16_t>(sz->value("rows", 24));
    }
  }
  return r;
}

StatusOr<Selector> ParseSelector(const Json& request) {
  auto p = request.find("process");
  if (p == request.end() || !p->is_object()) return InvalidArgument("process is required");
  Selector s;
  if (auto pid = p->find("pid"); pid != p->end() && !pid->is_null()) {
    if (!pid->is_number_unsigned() || pid->get<uint64_t>() > UINT32_MAX)
      return InvalidArgument("process.pid must be a number");
    s.pid = pid->get<uint32_t>();
  } else if (auto tag = p->find("tag"); tag != p->end() && tag->is_string()) {
    s.tag = tag->get<std::string>();
  } else {
    return InvalidArgument("process needs a pid or a tag");
  }
  return s;
}

std::string StartEvent(uint32_t pid) { return Dump(Json{{"event", {{"start", {{"pid", pid}}}}}}); }

std::string DataEvent(bool stderr_stream, std::string_view bytes, bool pty) {
  const char* key = pty ? "pty" : stderr_stream ? "stderr" : "stdout";
  return Dump(Json{{"event", {{"data", {{key, Base64Encode(bytes)}}}}}});
}

std::string KeepaliveEvent() { return Dump(Json{{"event", {{"keepalive", Json::object()}}}}); }

std::string EndEvent(int exit_code, int signal) {
  Json end = Json::object();
  if (signal != 0) {
    std::string why = signal == 9 ? "signal: killed" : "signal: " + std::to_string(signal);
    end["exitCode"] = -1;
    end["status"] = why;
    end["error"] = why;
  } else {
    end["exited"] = true;
    end["status"] = "exit status " + std::to_string(exit_code);
    if (exit_code != 0) {
      end["exitCode"] = exit_code;
      end["error"] = "exit status " + std::to_string(exit_code);
    }
  }
  return Dump(Json{{"event", {{"end", end}}}});
}

std::string Permissions(uint32_t m) {
  std::string s = S_ISDIR(m) ? "d" : S_ISLNK(m) ? "L" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (m & (0400u >> i)) ? rwx[i] : '-';
  return s;
}

Json EntryJson(const Entry& e) {
  const char* type = e.type == "dir"       ? "FILE_TYPE_DIRECTORY"
                     : e.type == "symlink" ? "FILE_TYPE_SYMLINK"
                                           : "FILE_TYPE_FILE";
  Json j = {{"name", e.name},
            {"type", type},
            {"path", e.path},
            {"size", std::to_string(e.size)},
            {"mode", e.mode & 0777},
            {"permissions", Permissions((e.mode & 07777) | (e.type == "dir"       ? S_IFDIR
                                                            : e.type == "symlink" ? S_IFLNK
                                                                                  : S_IFREG))},
            {"owner", e.owner},
            {"group", e.group},
            {"modifiedTime", Rfc3339(e.mtime_ms)}};
  if (e.symlink_target) j["symlinkTarget"] = *e.symlink_target;
  return j;
}

namespace {

// The value of `param` in a header like `multipart/form-data; boundary=x` (quotes removed).
std::string HeaderParam(std::string_view header, std::string_view param) {
  for (auto part : SplitString(header, ';', true)) {
    std::string_view p = TrimWhitespace(part);
    if (p.size() > param.size() && p[param.size()] == '=' &&
        EqualsIgnoreCase(p.substr(0, param.size()), param)) {
      std::string_view v = p.substr(param.size() + 1);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      return std::string(v);
    }
  }
  return "";
}

}  // namespace

StatusOr<std::vector<Part>> ParseMultipart(std::string_view content_type, std::string_view body) {
  std::string boundary = HeaderParam(content_type, "boundary");
  if (boundary.empty() || boundary.size() > 200)
    return InvalidArgument("multipart/form-data needs a boundary");
  const std::string delim = "--" + boundary;
  std::vector<Part> parts;
  size_t pos = body.find(delim);
  if (pos == std::string_view::npos) return InvalidArgument("no multipart boundary in the body");
  pos += delim.size();
  for (;;) {
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(pos, 2) != "\r\n") return InvalidArgument("malformed multipart delimiter");
    pos += 2;
    size_t head_end = body.find("\r\n\r\n", pos);
    if (head_end == std::string_view::npos) return InvalidArgument("malformed multipart part");
    Part part;
    for (auto line : SplitString(body.substr(pos, head_end - pos), '\n', true)) {
      std::string_view l = TrimWhitespace(line);
      size_t colon = l.find(':');
      if (colon == std::string_view::npos) continue;
      if (EqualsIgnoreCase(TrimWhitespace(l.substr(0, colon)), "content-disposition")) {
        std::string_view v = l.substr(colon + 1);
        part.name = HeaderParam(v, "name");
        part.filename = HeaderParam(v, "filename");
      }
    }
    size_t data_start = head_end + 4;
    size_t next = body.find("\r\n" + delim, data_start);
    if (next == std::string_view::npos) return InvalidArgument("a multipart part is cut short");
    part.data = body.substr(data_start, next - data_start);
    parts.push_back(std::move(part));
    if (parts.size() > 1024) return InvalidArgument("more than 1024 multipart parts");
    pos = next + 2 + delim.size();
  }
}

}  // namespace dsec::api::e2b
