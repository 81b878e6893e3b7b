// The CLI commands that talk to a running dsec-edge: create, ls, get, exec, shell, cp, pause,
// resume, rm (and `run` when an edge is reachable). Human tables by default, --json for
// scripts; the edge is found through --url/DSEC_URL and --token/DSEC_TOKEN (see edge_client.h).
#pragma once

#include <CLI/CLI.hpp>

#include "base/resources.h"
#include "cli/run.h"

namespace dsec::cli {

void RegisterEdgeCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

struct RunThroughEdge {
  std::string image, user, workdir, tty;
  Resources resources;
  double timeout_s = 0;
  std::vector<std::string> env, cmd;
};
// `dsec run` through an edge: -1 when no edge is configured or reachable (run locally then),
// else the exit code.
int MaybeRunThroughEdge(const GlobalOptions& g, const RunThroughEdge& r);

}  // namespace dsec::cli
