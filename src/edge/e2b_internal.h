// Internal to the E2B-compatible API (e2b.h): what its files share. Not for other callers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "api/e2b.h"
#include "backends/sandbox_types.h"
#include "base/json.h"
#include "base/status.h"
#include "http/server.h"

namespace dsec::edge::e2b_detail {

inline constexpr const char* kHome = "/home/user";
inline constexpr int64_t kDefaultTimeoutS = 300;
inline constexpr int64_t kMaxTimeoutS = 86400;
inline constexpr const char* kCompatLabel = "dsec.compat";
inline constexpr const char* kTemplateLabel = "e2b.template";
inline constexpr int kKeepaliveS = 15;  // well inside undici's 300 s body timeout
inline constexpr uint64_t kMaxFilesBody = 64 << 20;

std::string Dump(const Json& j);
http::HttpResponse JsonResponse(int status, std::string body);
http::HttpResponse NoContent();
// A control-plane error ({"code": N, "message"}), from one of ours.
http::HttpResponse ApiFail(const Status& s);
// A unary Connect error, from one of ours.
http::HttpResponse RpcFail(const Status& s);
http::HttpResponse RpcOk(const Json& j);
// A Connect error's code and message (an end-of-stream trailer's), from one of ours.
std::pair<std::string, std::string> ConnectError(const Status& s);
// E2B's user of a call: the Authorization header's Basic "<user>:" (sent only when the caller
// names one), else the default user; "root" is root, anything else the sandbox's user.
std::string UserOf(const http::HttpRequest& req, const std::string& sandbox_user);
// A path of a call: relative ones are relative to the home of E2B's user.
std::string Resolve(const std::string& path, const std::string& user);
std::string BaseName(const std::string& p);
api::e2b::Entry EntryOf(const backends::FileEntry& f, const std::string& path);

}  // namespace dsec::edge::e2b_detail
