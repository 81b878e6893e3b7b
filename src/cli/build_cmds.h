// The CLI's image-build commands (`dsec image build|build-status|build-log|build-cancel`),
// registered under `dsec image` by RegisterImageCommands.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace dsec::cli {

void RegisterBuildCommands(CLI::App* image, GlobalOptions& global, int* exit_code);

}  // namespace dsec::cli
