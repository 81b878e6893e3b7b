// Pools as the REST API and the state DB write them (PUT/GET /v1/pools): the one place a pool's
// JSON is parsed and rendered; backends/pools/pool.h holds the typed config and status.
#pragma once

#include <vector>

#include "backends/pools/pool.h"
#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

Json ToJson(const pools::PoolConfig& c);
// Fields missing from `j` keep the values in `base` (so a PUT may change only some).
StatusOr<pools::PoolConfig> PoolConfigFromJson(const Json& j, pools::PoolConfig base);
Json ToJson(const pools::PoolStatus& st);
Json ToJson(const std::vector<pools::PoolStatus>& all);

}  // namespace dsec::api
