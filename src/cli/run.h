// `dsec run`: one-shot sandboxed command. Creates a sandbox, runs CMD with the caller's
// stdin/stdout/stderr streamed (a pty when both ends are terminals), destroys the sandbox and
// exits with CMD's exit code (128+signal when killed; 124 on timeout).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::cli {

struct GlobalOptions {
  std::string state_dir;
  std::string log_level = "warn";
  std::string url, token;  // the edge (default: $DSEC_URL / $DSEC_TOKEN, then the local edge)
  std::string project;     // a cluster's project to act in (default $DSEC_PROJECT)
  bool json = false;       // machine-readable output
  bool local = false;      // `run` without an edge even when one is reachable
  std::vector<std::string> command;  // after "--"
  bool has_command = false;
};

void RegisterRun(CLI::App& app, GlobalOptions& global, int* exit_code);

// Repeated KEY=VALUE flags (--env, --label) into a map; `flag` names them in the error.
StatusOr<std::map<std::string, std::string>> ParseKeyValues(const std::vector<std::string>& kvs,
                                                            const char* flag);

}  // namespace dsec::cli
