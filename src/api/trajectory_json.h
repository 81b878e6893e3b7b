// The trajectory log's requests (edge/trajectory.h): the `trajectory` field of a create, a
// resume, and a job's preemption.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

// "trajectory": {"id": "...", "resume": false, "branch": N, "checkpoint_every": N}
struct TrajectorySpec {
  std::string id;  // 1-128 of A-Z a-z 0-9 . _ - (ValidateId)
  bool resume = false;
  std::optional<int64_t> branch;            // resume: which branch (default: the head)
  std::optional<int64_t> checkpoint_every;  // a new one: mutating calls between checkpoints
};

// nullopt for an absent or null field; InvalidArgument naming what is wrong.
StatusOr<std::optional<TrajectorySpec>> ParseTrajectorySpec(const Json* j);

// POST /v1/trajectories/{id}/resume: {"branch", "ttl_s", "idle_ttl_s", "labels", "request_id"}
// (all optional), as a create's body with `trajectory: {"id", "resume": true, "branch"}`.
StatusOr<std::string> ResumeAsCreateBody(std::string_view body, const std::string& id);

// POST /v1/jobs/{job}/preempt: {"others": "delete" | "snapshot"} (default "delete").
StatusOr<std::string> ParsePreemptRequest(std::string_view body);

}  // namespace dsec::api
