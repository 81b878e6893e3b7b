// dsec-edge: the node daemon. Flags override the config file, which overrides defaults.
#include <malloc.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <iostream>

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

  dsec::edge::EdgeConfig flags;
  CLI::App app{"dsec-edge: the DSec node daemon"};
  app.set_version_flag("--version", std::string("dsec-edge ") + DSEC_VERSION);
  std::string config_file;
  app.add_option("--config", config_file, "JSON config file");
  auto* listen = app.add_option("--listen", flags.listen, "TCP HOST:PORT (token auth); '' = off");
  auto* sock = app.add_option("--socket", flags.socket, "Unix socket path (root only); '' = off");
  auto* state = app.add_option("--state-dir", flags.state_dir, "State directory");
  auto* token = app.add_option("--token-file", flags.token_file, "Bearer tokens, one per line");
  auto* node = app.add_option("--node", flags.node, "Node name in sandbox ids");
  auto* persist = app.add_flag("--persist", flags.persist,
                               "On SIGTERM leave sandboxes running for the next edge");
  auto* level = app.add_option("--log-level", flags.log_level, "trace|debug|info|warn|error");
  auto* max_sb = app.add_option("--max-sandboxes", flags.max_sandboxes, "Admission: sandboxes");
  auto* overcommit =
      app.add_option("--memory-overcommit", flags.memory_overcommit, "Admission: memory ratio");
  auto* agent = app.add_option("--agent", flags.agent_path, "dsec-agent binary");
  auto* cluster =
      app.add_option("--cluster", flags.cluster_etcd,
                     "Join a cluster: etcd://HOST:PORT[,HOST:PORT] (config cluster_etcd)");
  auto* fusion = app.add_option(
      "--sandbox-fusion-listen", flags.sandbox_fusion_listen,
      "Serve SandboxFusion's /run_code API on HOST:PORT (config sandbox_fusion_listen); off by "
      "default");
  auto* e2b = app.add_option(
      "--e2b-listen", flags.e2b_listen,
      "Serve the E2B-compatible API (control plane and envd) on HOST:PORT (config e2b_listen); "
      "off by default");
  bool no_userns = false;
  app.add_flag("--no-userns", no_userns, "Force the no-user-namespace fallback");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "dsec-edge: " << e.what() << " (see dsec-edge --help)\n";
    return 2;
  }

  dsec::edge::EdgeConfig cfg;
  if (!config_file.empty()) {
    if (auto s = dsec::edge::LoadConfigFile(config_file, &cfg); !s.ok()) {
      std::cerr << "dsec-edge: " << s.message() << "\n";
      return 2;
    }
    cfg.config_file = config_file;
  }
  auto set = [](CLI::Option* o, auto& dst, const auto& src) {
    if (o->count()) dst = src;
  };
  set(listen, cfg.listen, flags.listen);
  set(sock, cfg.socket, flags.socket);
  set(state, cfg.state_dir, flags.state_dir);
  set(token, cfg.token_file, flags.token_file);
  set(node, cfg.node, flags.node);
  set(persist, cfg.persist, flags.persist);
  set(level, cfg.log_level, flags.log_level);
  set(max_sb, cfg.max_sandboxes, flags.max_sandboxes);
  set(overcommit, cfg.memory_overcommit, flags.memory_overcommit);
  set(agent, cfg.agent_path, flags.agent_path);
  set(cluster, cfg.cluster_etcd, flags.cluster_etcd);
  set(fusion, cfg.sandbox_fusion_listen, flags.sandbox_fusion_listen);
  set(e2b, cfg.e2b_listen, flags.e2b_listen);
  if (no_userns) cfg.userns = false;
  if (auto s = dsec::edge::FinalizeConfig(&cfg); !s.ok()) {
    std::cerr << "dsec-edge: " << s.message() << "\n";
    return 2;
  }
  dsec::log::Init(cfg.log_level);
  return dsec::edge::RunEdge(std::move(cfg));
}
