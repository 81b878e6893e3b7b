// The CLI commands for function calls and warm pools on a dsec-edge: `dsec fn` runs code on a
// runtime's warm worker (POST /v1/fncalls); `dsec pool ls|get|put|rm` manages the pools.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterFnCallCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
