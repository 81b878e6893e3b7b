// A sandbox's network policy as the REST API, builds and the state DB write it (`network`):
// the one place its JSON is parsed and rendered; net/policy.h holds the typed policy.
//
//   {"mode": "none"}
//   {"mode": "allowlist", "rules": [{"cidr": "198.51.100.0/24", "ports": "443,8000-8100",
//    "proto": "tcp"}], "domains": ["pypi.org", "*.pythonhosted.org"]}
//   {"mode": "open", "rules": [...]}
// `ports`: a number, "a-b", a comma-separated list of those, or a JSON list of them.
#pragma once

#include "base/json.h"
#include "base/status.h"
#include "net/policy.h"

namespace dsec::api {

// Null or absent JSON is mode none. Errors are InvalidArgument naming the field.
StatusOr<net::NetworkPolicy> NetworkPolicyFromJson(const Json* j);
Json ToJson(const net::NetworkPolicy& p);

}  // namespace dsec::api
