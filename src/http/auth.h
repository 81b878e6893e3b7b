// Bearer tokens, as the edge and the apiserver check them: the token file, the header, and a
// comparison that does not tell by its time how much of a guess matched.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "http/server.h"

namespace dsec::http {

// Reads the tokens in `path` (one per line, at least 16 characters; '#' comments); creates the
// file with one random token (0600, parent 0700) if it does not exist.
StatusOr<std::vector<std::string>> LoadOrCreateTokens(const std::string& path);

// The token of "Authorization: Bearer <token>" (any case of "Bearer"); "" if there is none.
std::string BearerToken(const HttpRequest& req);

// The path of a request whose caller holds one of `tokens`: as a bearer token (one
// Authorization header), or as the path's first segment, which is then cut off
// ("/TOKEN/run_code" -> "/run_code", for clients that take a URL and nothing else); "" when
// it holds neither.
std::string PathBehindToken(const HttpRequest& req, const std::vector<std::string>& tokens);

// Compares without an early exit; an empty `b` never matches.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// HMAC-SHA256 of `msg` under `key` (32 raw bytes).
std::string HmacSha256(std::string_view key, std::string_view msg);
// SHA-256 of `data`, lowercase hex (64 characters).
std::string Sha256Hex(std::string_view data);
// A key for one purpose, derived from the edge's first token under `label`: the token itself is
// never the key of anything else, and a new token file invalidates what was signed with it.
std::string DerivedKey(const std::vector<std::string>& tokens, std::string_view label);

}  // namespace dsec::http
