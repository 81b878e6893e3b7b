// The CLI's trajectory-log commands: `dsec preempt --job JOB [--others delete|snapshot]`,
// `dsec trajectory ls|get ID [--branch N]|resume ID [--branch N]|rm ID` (and
// `dsec create --trajectory ID`, in edge_cmds.cc).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterTrajectoryCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
