// The CLI's access commands, through a dsec-apiserver (DSEC_URL names it, DSEC_TOKEN an admin's
// token): `dsec project create|ls|rm` and `dsec token create|ls|revoke --project P` (the global
// --project, or $DSEC_PROJECT); `dsec quota get|set [--org | --project P [--token NAME]]`.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterProjectCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
