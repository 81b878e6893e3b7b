// The "exec" operation: runs one command with stdin/stdout/stderr (or a pty), streams its
// output to the edge as kData frames up to max_output_bytes per stream (the rest is counted
// and dropped), enforces its timeout by killing the command's whole cgroup (background
// children included), and answers with an ExecResult. Children the command left running keep
// running after it exits; their pipes are drained and discarded so they never block or die of
// SIGPIPE, and their cgroup is removed once empty.
#pragma once

#include <memory>
#include <string>

#include "agent/agent.h"
#include "agent/spawn.h"
#include "protocol/messages.h"

namespace dsec::agent {

// Starts an exec for `channel`; on failure answers with an error and returns nullptr.
std::unique_ptr<Op> StartExec(Agent* agent, uint32_t channel, protocol::ExecSpec spec,
                              Status* error);

// Reads an fd until EOF and discards the bytes (output of background children).
class Drain : public EventHandler {
 public:
  Drain(Agent* agent, UniqueFd fd, std::string cgroup);
  ~Drain() override;
  void OnEvent(uint32_t events) override;

 private:
  Agent* agent_;
  UniqueFd fd_;
  std::string cgroup_;
};

}  // namespace dsec::agent
