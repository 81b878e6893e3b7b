// The CLI's cluster node commands, through a dsec-apiserver (DSEC_URL names it, DSEC_TOKEN is
// the cluster token): `dsec node ls|get|cordon|uncordon|drain`.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterNodeCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
