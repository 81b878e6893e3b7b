#include "cli/bench_cmd.h"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace dsec::cli {

namespace {

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

// The source tree holding bench/run: $DSEC_SOURCE_DIR, then a directory above this binary
// (build trees live inside the checkout), then the tree it was built from.
std::string FindSourceTree(const std::string& exe) {
  std::vector<std::string> candidates;
  if (const char* env = getenv("DSEC_SOURCE_DIR"); env && *env) candidates.push_back(env);
  for (std::string d = Parent(exe); d != "/"; d = Parent(d)) candidates.push_back(d);
  candidates.push_back(DSEC_SOURCE_DIR);
  for (const auto& c : candidates)
    if (access((c + "/bench/run").c_str(), X_OK) == 0) return c;
  return "";
}

}  // namespace

int RunBench(const std::vector<std::string>& bench_args) {
  std::string exe = SelfExe();
  std::string tree = FindSourceTree(exe);
  if (tree.empty()) {
    std::cerr << "dsec: bench: bench/run not found (set DSEC_SOURCE_DIR to a DSec checkout)\n";
    return 1;
  }
  // This binary's build tree (<build>/src/cli/dsec) supplies the benchmarked binaries.
  std::string build = Parent(Parent(Parent(exe)));
  if (!getenv("DSEC_BUILD_DIR") && access((build + "/src/edge/dsec-edge").c_str(), X_OK) == 0)
    setenv("DSEC_BUILD_DIR", build.c_str(), 1);
  std::vector<std::string> args = {tree + "/bench/run"};
  args.insert(args.end(), bench_args.begin(), bench_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (chdir(tree.c_str()) < 0) {
    std::cerr << "dsec: bench: cannot enter " << tree << "\n";
    return 1;
  }
  execv(argv[0], argv.data());
  std::cerr << "dsec: bench: cannot run " << argv[0] << "\n";
  return 1;
}

void RegisterBenchCommand(CLI::App& app) {
  // Listed for --help only: main() hands `dsec bench ...` to RunBench before parsing, so
  // every argument (--help included) reaches bench/run as it is.
  app.add_subcommand("bench",
                     "Run the benchmarks side by side with peers (bench/run; `dsec bench --help` "
                     "lists its options): writes bench/RESULTS.md and bench/plots/ after a full "
                     "run");
}

}  // namespace dsec::cli
