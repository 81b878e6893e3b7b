// Pools as the REST API and the state DB write them (PUT/GET /v1/pools): the one place a pool's
// JSON is parsed and rendered; backends/pools/pool.h holds the typed config and status.
#pragma once

#include <functional>
#include <string>
#include <string_view>
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
// The answer of GET /v1/pools: {"pools": [...]}.
Json PoolListJson(const std::vector<pools::PoolStatus>& all);

// A new pool's config of a kind (the node's defaults).
using PoolDefaultsFn = std::function<pools::PoolConfig(pools::PoolKind)>;
// The body of PUT /v1/pools/{name} over what it changes: the pool there now (`existing`;
// nullptr: none) when the kind stays, else a new pool of the kind. A body without "kind"
// keeps the existing pool's (fncall for a new one); a new fncall pool needs "runtime" or
// "command" (a command pool).
StatusOr<pools::PoolConfig> ParsePoolPut(std::string_view body, const std::string& name,
                                         const pools::PoolConfig* existing,
                                         const PoolDefaultsFn& defaults);
// A pool as the state DB keeps it (ToJson(PoolConfig)) in its row `name`.
StatusOr<pools::PoolConfig> StoredPoolFromJson(std::string_view text, const std::string& name,
                                               const PoolDefaultsFn& defaults);

}  // namespace dsec::api
