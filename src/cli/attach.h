// Interactive commands through the edge's WebSocket attach endpoint: the caller's stdin is
// streamed in, stdout/stderr come back as they are produced, a terminal is put in raw mode and
// its size follows SIGWINCH; SIGINT/SIGTERM/SIGHUP are forwarded (a second one kills).
// Used by `dsec exec -i/-t`, `dsec shell` and `dsec run` through an edge.
#pragma once

#include <termios.h>

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/edge_client.h"

namespace dsec::cli {

struct AttachOptions {
  std::vector<std::string> cmd;      // or shell
  std::optional<std::string> shell;  // run by /bin/sh -c
  bool tty = false;
  bool forward_stdin = true;  // false: stdin is closed at once
  std::string user, cwd;
  std::vector<std::string> env;  // KEY=VALUE
  int64_t timeout_ms = 0;
};

// Runs the command and returns its exit result object (the `exit` frame's fields).
StatusOr<Json> AttachAndRun(EdgeClient& client, const std::string& sandbox_id,
                            const AttachOptions& o);

// The process exit code for an exec result, printing why on stderr when it was not a plain
// exit (timeout -> 124, OOM, truncated output). timeout_s only words the message.
int ExitCodeForResult(const Json& result, double timeout_s);

// Puts the terminal on stdin in raw mode for its lifetime.
class RawTerminal {
 public:
  RawTerminal();
  ~RawTerminal();
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

// True when both stdin and stdout are terminals.
bool StdioIsTerminal();

}  // namespace dsec::cli
