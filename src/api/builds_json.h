// Image builds as the REST API writes and shows them (POST /v1/images/build, GET
// /v1/images/builds...): the one place a build's body is parsed into a typed request and its
// records and log pieces are rendered. The edge's builder (edge/builds.h) runs it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "net/policy.h"

namespace dsec::api {

struct BuildRequest {
  std::string name;                        // "name:tag" (normalized)
  std::string suite;                       // base "debian:<suite>": bootstrap with mmdebstrap
  std::string variant = "minbase";         // mmdebstrap --variant
  std::vector<std::string> from;           // or start from these images (stacked)
  std::vector<std::string> packages;       // with a Debian base
  std::vector<std::string> run;            // shell commands, run as root in a build sandbox
  std::map<std::string, std::string> env;  // for the commands, and kept in the image
  std::string workdir;                     // for the commands, and kept in the image
  int64_t memory_mb = 2048, disk_mb = 4096;
  int64_t timeout_s = 3600;    // the whole build
  net::NetworkPolicy network;  // of the build sandbox (its run steps); default none
};

// Parses and validates a POST /v1/images/build body (InvalidArgument naming the field). Whether
// the node can give the build its network and has its "from" images is the edge's to check.
StatusOr<BuildRequest> ParseBuildRequest(std::string_view body);

// A build as GET /v1/images/builds/{id} shows it.
struct BuildRecord {
  struct Step {
    std::string name;
    std::string state;  // "pending", "running", "done", "failed", "canceled"
    bool operator==(const Step&) const = default;
  };
  std::string id, name;
  std::string state;  // "queued", "running", "canceling", "succeeded", "failed", "canceled"
  std::vector<Step> steps;
  int step = -1;  // the step running (shown while running or canceling; -1: none)
  std::string error, image, sandbox;  // empty: none (null)
  uint64_t log_bytes = 0;
  int64_t created_at = 0, started_at = 0, finished_at = 0;  // ms; 0 (null) until then
  bool operator==(const BuildRecord&) const = default;
};
Json ToJson(const BuildRecord& r);
// {"builds": [...]}
Json BuildListJson(const std::vector<BuildRecord>& all);

// A piece of a build's log (GET .../log?offset=): whole UTF-8 characters from `offset`.
struct BuildLogPiece {
  uint64_t offset = 0, next_offset = 0;
  std::string text;
  bool done = false;  // the build finished: nothing more will be appended
};
Json ToJson(const BuildLogPiece& p);

}  // namespace dsec::api
