// dsec-edge: the node daemon. Flags override the config file, which overrides defaults.
#include <malloc.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "base/logging.h"
#include "edge/config.h"
#include "edge/edge.h"

int main(int argc, char** argv) {
  // Before any thread exists: termination signals are taken by sigwait in RunEdge, and a
  // client hanging up must not kill the daemon.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Exec output, uploads and responses come in buffers that grow to megabytes and go again:
  // a fixed mmap threshold (glibc raises it as big blocks are freed, keeping them in the heap
  // for good) serves those from mmap, so their memory goes back to the host when freed.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);

  // The flags that set a config key get its type and default from EdgeConfig (--help shows
  // them); the others are handled here by name.
  dsec::edge::EdgeConfig flags;
  CLI::App app{"dsec-edge: the DSec node daemon"};
  app.set_version_flag("--version", std::string("dsec-edge ") + DSEC_VERSION);
  app.option_defaults()->always_capture_default();
  app.footer(
      "Every config file key, with its default and range: docs/config.md (or dsec-edge "
      "--config-reference).");
  std::string config_file;
  bool no_userns = false;
  bool reference = false;
  std::vector<std::pair<CLI::Option*, std::string_view>> keyed;
  for (const dsec::edge::EdgeFlag& f : dsec::edge::EdgeFlags()) {
    std::string name(f.name), help(f.help);
    if (f.key.empty()) {
      if (f.name == "--config") {
        app.add_option(name, config_file, help);
      } else if (f.name == "--no-userns") {
        app.add_flag(name, no_userns, help);
      } else if (f.name == "--config-reference") {
        app.add_flag(name, reference, help);
      } else {
        std::cerr << "dsec-edge: no handler for flag " << name << "\n";
        return 2;
      }
      continue;
    }
    auto field = dsec::edge::ConfigFieldOf(&flags, f.key);
    if (!field) {
      std::cerr << "dsec-edge: flag " << name << " names no config key\n";
      return 2;
    }
    help += " (config " + std::string(f.key) + ")";
    auto* opt = std::visit(
        [&](auto* p) -> CLI::Option* {
          if constexpr (std::is_same_v<decltype(p), bool*>)
            return app.add_flag(name, *p, help);
          else
            return app.add_option(name, *p, help);
        },
        *field);
    keyed.emplace_back(opt, f.key);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "dsec-edge: " << e.what() << " (see dsec-edge --help)\n";
    return 2;
  }
  if (reference) {
    std::cout << dsec::edge::ConfigReference();
    return 0;
  }

  dsec::edge::EdgeConfig cfg;
  if (!config_file.empty()) {
    if (auto s = dsec::edge::LoadConfigFile(config_file, &cfg); !s.ok()) {
      std::cerr << "dsec-edge: " << s.message() << "\n";
      return 2;
    }
    cfg.config_file = config_file;
  }
  // A flag given on the command line overrides the config file.
  for (const auto& [opt, key] : keyed) {
    if (!opt->count()) continue;
    auto from = *dsec::edge::ConfigFieldOf(&flags, key);
    std::visit([&](auto* to) { *to = *std::get<decltype(to)>(from); },
               *dsec::edge::ConfigFieldOf(&cfg, key));
  }
  if (no_userns) cfg.userns = false;
  if (auto s = dsec::edge::FinalizeConfig(&cfg); !s.ok()) {
    std::cerr << "dsec-edge: " << s.message() << "\n";
    return 2;
  }
  dsec::log::Init(cfg.log_level);
  return dsec::edge::RunEdge(std::move(cfg));
}
