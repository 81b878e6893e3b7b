// The agent's side of capture_layer (protocol/agent_ops.h): a microVM guest's writable layer as
// an OCI layer tar, written by a child of the agent while the sandbox's processes are frozen.
#pragma once

#include "agent/agent.h"
#include "protocol/agent_ops.h"

namespace dsec::agent {

StatusOr<Reply> HandleCaptureLayer(Agent* agent, uint32_t ch, protocol::CaptureLayerRequest req);

}  // namespace dsec::agent
