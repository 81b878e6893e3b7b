// The agent's start ("InitInChild"), run as PID 1 in the sandbox's fresh namespaces right
// after exec from the sealed memfd: hello -> receive the setup spec and fds -> hostname,
// loopback up, root filesystem + pivot_root, close what is no longer needed, seccomp and a
// reduced capability set for the agent itself -> ready.
#pragma once

#include "agent/agent.h"
#include "base/status.h"
#include "protocol/messages.h"

namespace dsec::agent {

inline constexpr int kChannelFd = 3;  // the inherited edge connection

struct SetupResult {
  AgentConfig config;
  UniqueFd listen;
};

// Receives one frame with its SCM_RIGHTS fds (blocking). Used for the kSetup frame.
Status ReceiveFrameWithFds(int sock, protocol::Frame* frame, std::vector<UniqueFd>* fds);
// Performs the setup steps; on success the process runs inside the new root.
StatusOr<SetupResult> RunSetup(const protocol::SetupSpec& spec, std::vector<UniqueFd>& fds);
Status BringUpLoopback();

}  // namespace dsec::agent
