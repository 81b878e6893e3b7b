// How the API answers errors: the HTTP status and error code of a Status (../shared/API.md's
// table), and the check of ids that arrive in paths. Shared by the edge and the apiserver.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/status.h"

namespace dsec::api {

// HTTP status and API error code for a Status code.
std::pair<int, std::string_view> HttpErrorFor(StatusCode code);
// The same for a Status, where an error of one of the edge's own system calls (it carries an
// errno; the agent's answers and the checks of a request do not) is the node's failure, never
// the client's: 500 internal, whatever its errno would map to (an EACCES of the edge is not a
// 403 for the caller). Exhaustion (ENOSPC, EMFILE, ENOMEM...) keeps its own answer.
std::pair<int, std::string_view> HttpErrorFor(const Status& s);
// The body of an error about a sandbox the node removed by itself (410 gone), for programs:
// {"error": {"code", "message", "reason", "at"}} (`at`: ms since the epoch).
std::string TombstoneErrorBody(std::string_view code, std::string_view message,
                               const std::string& reason, int64_t at_ms);
// A 1-128 char id of [A-Za-z0-9._-] without "..".
Status ValidateId(std::string_view what, std::string_view id);

}  // namespace dsec::api
