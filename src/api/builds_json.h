// Image builds as the REST API writes them (POST /v1/images/build): the one place a build's
// body is parsed into a typed request. The edge's builder (edge/builds.h) runs it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace dsec::api
