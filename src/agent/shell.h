// Persistent shell sessions: one bash process per session keeps cwd, environment, functions
// and background jobs between commands. Commands arrive NUL-terminated on fd 3 with a fresh
// random marker; bash evals each and prints the marker on stdout and stderr and
// "<marker> <status>" on fd 4. A command's output is complete when all three arrived, so
// output is delimited exactly even without trailing newlines. Output while no command runs
// (background jobs) is discarded. One command at a time per session.
// On timeout the command's processes (everything in the session's cgroup but bash) are
// killed and bash carries on; if bash itself is stuck (a builtin loop), the session ends.
#pragma once

#include <memory>
#include <string>

#include "agent/agent.h"
#include "agent/spawn.h"
#include "protocol/messages.h"

namespace dsec::agent {

class ShellRunOp;

class ShellSession {
 public:
  // spec.argv is ignored; env, cwd, uid, gid and root_caps are used.
  static StatusOr<std::unique_ptr<ShellSession>> Open(Agent* agent, std::string id,
                                                      const protocol::ExecSpec& spec);
  ~ShellSession();
  const std::string& id() const { return id_; }
  bool alive() const { return alive_; }
  bool busy() const { return run_ != nullptr; }

  // Starts a command for `channel`. The returned op answers with an ExecResult.
  StatusOr<std::unique_ptr<Op>> Run(uint32_t channel, const std::string& command,
                                    int64_t timeout_ms, uint64_t max_output);
  void Close();  // kills the session's processes

 private:
  friend class ShellRunOp;
  class Reader;
  ShellSession(Agent* agent, std::string id);
  void OnReadable(int which);
  void OnExit(int status);
  void Feed(int which, const char* data, size_t n);
  void CheckDone();
  void DetachRun() { run_ = nullptr; }

  Agent* agent_;
  std::string id_;
  Spawned proc_;
  UniqueFd cmd_w_;  // fd 3 in bash
  std::unique_ptr<Reader> out_, err_, status_;
  bool alive_ = true;
  bool posix_ = false;  // /bin/sh (no bash in the image): commands are sent escaped
  ShellRunOp* run_ = nullptr;
  std::string marker_;
  std::string tail_[2];  // unforwarded bytes that may be the start of a marker
  bool marker_seen_[2] = {false, false};
  std::string status_buf_;
  int status_code_ = -1;
  bool status_seen_ = false;
  class ExitWatcher;
  std::unique_ptr<Op> watcher_;
};

}  // namespace dsec::agent
