// The edge's side of port_connect (protocol/agent_ops.h): a connection to a server inside a
// sandbox, relayed by its agent, handed out as one end of a socketpair (what the port proxy
// relays to its client, as it would a socket connected inside a container's namespace).
#pragma once

#include <cstdint>
#include <memory>

#include "backends/session/agent_client.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::backends {

// Asks the agent to connect to 127.0.0.1:port and waits (up to timeout_ms) for the answer:
// the caller's end of the relay, or kUnavailable when nothing listens. The relay then runs on
// `io` until both sides have ended; the caller closing its end ends it.
StatusOr<UniqueFd> OpenPortRelay(boost::asio::io_context& io, std::shared_ptr<AgentClient> client,
                                 uint16_t port, int64_t timeout_ms);

}  // namespace dsec::backends
