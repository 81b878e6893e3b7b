// `dsec bench`: runs the benchmark harness (bench/run in the source tree) with the arguments
// given, against the build this dsec binary belongs to.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace dsec::cli {

void RegisterBenchCommand(CLI::App& app);
// Execs bench/run with `args`; returns an exit code only if that fails.
int RunBench(const std::vector<std::string>& args);

}  // namespace dsec::cli
