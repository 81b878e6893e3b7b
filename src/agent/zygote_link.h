// The agent's side of an fncall worker's zygote (backends/fncall/zygote.h): starts it once
// setup is done, hands it the call profile, waits until it is warm, and passes each call's
// fds and request to it.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::agent {

class Agent;

// Starts the zygote configured at setup and waits (bounded) for it to report ready.
Status StartZygote(Agent& agent);

// Sends one call: the request (FnCallSpec JSON, via a memfd) and the call's stdio. Returns the
// agent's end of the call socket, which reports {"status": N} | {"error": "..."}; closing it
// ends the call.
StatusOr<UniqueFd> SendZygoteCall(Agent& agent, const std::string& request_json, int stdin_fd,
                                  int stdout_fd, int stderr_fd);

// An error the zygote reported on its control socket since (non-blocking); "" if none.
std::string ZygoteError(Agent& agent);

}  // namespace dsec::agent
