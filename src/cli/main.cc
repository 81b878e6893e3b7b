// dsec: the command-line interface. Most commands talk to a dsec-edge (see edge_cmds.h,
// fncall_cmds.h and image_cmds.h), `dsec node` to a dsec-apiserver (node_cmds.h); `dsec run`
// goes through an edge when one is reachable and works locally (as root) otherwise.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "base/logging.h"
#include "cli/bench_cmd.h"
#include "cli/edge_cmds.h"
#include "cli/fncall_cmds.h"
#include "cli/image_cmds.h"
#include "cli/node_cmds.h"
#include "cli/project_cmds.h"
#include "cli/run.h"
#include "cli/trajectory_cmds.h"

int main(int argc, char** argv) {
  CLI::App app{"dsec: sandboxes for agentic RL"};
  app.require_subcommand(1);
  dsec::cli::GlobalOptions global;
  const char* env_state = getenv("DSEC_STATE_DIR");
  global.state_dir = env_state && *env_state ? env_state : "/var/lib/dsec/local";
  app.add_option("--state-dir", global.state_dir, "State directory for local sandboxes");
  app.add_option("--log-level", global.log_level, "trace|debug|info|warn|error");
  app.add_option("--url", global.url,
                 "Edge (or, for dsec node, apiserver) URL: http://HOST:PORT or unix:///PATH "
                 "(default $DSEC_URL, then the local edge's socket /run/dsec/edge.sock, then "
                 "http://127.0.0.1:7070)");
  app.add_option("--token", global.token, "Bearer token for a TCP edge (default $DSEC_TOKEN)");
  app.add_option("--project", global.project,
                 "A cluster's project to act in (default $DSEC_PROJECT; a token acts in its own; "
                 "an admin's in default)");
  app.add_flag("--json", global.json, "Machine-readable JSON output");
  app.add_flag("--local", global.local, "dsec run: run here without an edge");
  app.fallthrough();
  app.set_version_flag("--version", std::string("dsec ") + DSEC_VERSION);
  int exit_code = 0;
  dsec::cli::RegisterRun(app, global, &exit_code);
  dsec::cli::RegisterEdgeCommands(app, global, &exit_code);
  dsec::cli::RegisterFnCallCommands(app, global, &exit_code);
  dsec::cli::RegisterImageCommands(app, global, &exit_code);
  dsec::cli::RegisterNodeCommands(app, global, &exit_code);
  dsec::cli::RegisterProjectCommands(app, global, &exit_code);
  dsec::cli::RegisterTrajectoryCommands(app, global, &exit_code);
  dsec::cli::RegisterBenchCommand(app);
  // Everything after the first "--" is the command, verbatim (CLI11 would otherwise give
  // options like "-c" to itself or to a repeatable flag before it).
  int parse_argc = argc;
  if (argc > 1 && std::string_view(argv[1]) == "bench")
    return dsec::cli::RunBench(std::vector<std::string>(argv + 2, argv + argc));
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      global.command.assign(argv + i + 1, argv + argc);
      global.has_command = true;
      parse_argc = i;
      break;
    }
  }
  try {
    app.parse(parse_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dsec: " << e.what() << " (see dsec --help)\n";
    return 2;
  }
  return exit_code;
}
