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

// Where a detached exec (a background job, jobs.h) sends its output and its end instead of a
// channel. OnOutput gets only what passed the exec's own cap; OnExit runs once, after which the
// sink may retire the op (Agent::RetireOwned), not delete it.
class ExecSink {
 public:
  virtual ~ExecSink() = default;
  virtual void OnOutput(uint8_t stream, std::string_view data) = 0;
  virtual void OnExit(const protocol::ExecResult& r) = 0;
};
// Starts an exec bound to no channel (stdin inline only). *pid: the command's pid.
std::unique_ptr<Op> StartDetachedExec(Agent* agent, protocol::ExecSpec spec, ExecSink* sink,
                                      int* pid, Status* error);
// Kills a detached exec's whole process tree; its sink's OnExit follows once it is gone.
void KillDetachedExec(Op* op);

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
