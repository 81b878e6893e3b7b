// What the front door needs to know of a create (POST /v1/sandboxes) to place it: the kind,
// the size, how many, the pool and the request id. Read leniently (fields it does not need
// are left alone): the node that takes the create reads the whole body strictly and answers
// for it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec::api {

struct CreateShape {
  std::string kind = "container";
  int64_t memory_mb = 0;  // 0: not given (the node's default)
  int64_t cpu_milli = 0;  // "cpu" in thousandths of a core; 0: not given (the node's default)
  int64_t count = 1;
  bool count_given = false;
  std::string pool;        // a container pool: only nodes that have it
  std::string request_id;  // "" when not given
  // A resume (`trajectory: {"id", "resume": true}`): the trajectory's id ("" for none).
  std::string resume_trajectory;
  // A new trajectory (`trajectory: {"id"}`): its id ("" for none).
  std::string new_trajectory;
  // An admin's pin (`"node": "<name>"`): only that node ("" for any).
  std::string node;
  // The images of its stack that may be the cluster's ("name:tag"; not "host" nor layers).
  std::vector<std::string> images;
};

// InvalidArgument for a body that is not a JSON object or has these fields of the wrong type.
StatusOr<CreateShape> ParseCreateShape(std::string_view body);

}  // namespace dsec::api
