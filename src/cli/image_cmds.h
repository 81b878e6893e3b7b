// The CLI's image commands, all through a dsec-edge: `dsec image ls|inspect|rm|import`, image
// builds (`dsec image build|build-status|build-log|build-cancel`), and the ones that turn a
// sandbox into images or sandboxes: `dsec snapshot` and `dsec fork`.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterImageCommands(CLI::App& app, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
