// The agent's side of port_connect (protocol/agent_ops.h): a TCP connection to a server inside
// the sandbox, relayed over the channel with a window each way.
#pragma once

#include "agent/agent.h"
#include "protocol/agent_ops.h"

namespace dsec::agent {

StatusOr<Reply> HandlePortConnect(Agent* agent, uint32_t ch, protocol::PortConnectRequest req);

}  // namespace dsec::agent
