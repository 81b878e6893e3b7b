// dsec-apiserver: the cluster's front door (apiserver.h). Flags only; it keeps no state of its
// own (etcd holds membership and cordons), so any number of them can run.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "api/ports_json.h"
#include "apiserver/apiserver.h"
#include "apiserver/compat.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "http/auth.h"

namespace {

int WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0 && sig != SIGHUP) return sig;
  }
}

}  // namespace

int main(int argc, char** argv) {
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  using namespace dsec;
  apiserver::ApiserverConfig cfg;
  CLI::App app{"dsec-apiserver: the DSec cluster front door"};
  app.set_version_flag("--version", std::string("dsec-apiserver ") + DSEC_VERSION);
  app.add_option("--listen", cfg.listen, "TCP HOST:PORT");
  app.add_option("--etcd", cfg.etcd, "etcd endpoints: http://HOST:PORT[,...] (or etcd://)");
  app.add_option("--token-file", cfg.token_file, "Cluster tokens callers present, one per line")
      ->required();
  app.add_option("--node-token-file", cfg.node_token_file,
                 "The token the apiserver presents to edges (first line)")
      ->required();
  app.add_option("--token-hash-key-file", cfg.token_hash_key_file,
                 "Key of the project tokens' keyed hash, the same file on every apiserver (first "
                 "line, 32+ characters; default: derived from the node token)");
  app.add_option("--log-level", cfg.log_level, "trace|debug|info|warn|error");
  app.add_option("--io-threads", cfg.io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  app.add_option("--workers", cfg.workers, "Threads for calls that wait on nodes")
      ->check(CLI::Range(4, 4096));
  app.add_option("--placement-k", cfg.placement.k, "Power-of-k choices")->check(CLI::Range(1, 64));
  app.add_option("--e2b-listen", cfg.e2b_listen,
                 "HOST:PORT for the E2B-compatible API, relayed to the edges' (off when empty)");
  app.add_option("--sandbox-fusion-listen", cfg.sandbox_fusion_listen,
                 "HOST:PORT for SandboxFusion's /run_code and /run_jupyter, relayed to the "
                 "edges' (off when empty)");
  app.add_option("--port-domain", cfg.port_domain,
                 "Host-based port URLs: <port>-<sandbox id>.DOMAIN, relayed to the sandbox's node "
                 "(the edges' port_domain; off when empty)");
  app.add_option("--audit-log", cfg.audit_log,
                 "Access log: a JSON line per change a caller asks for (who: token name, "
                 "project, role; what; which sandbox); off when empty");
  app.add_option("--access-stale-ms", cfg.access_stale_ms,
                 "Project tokens wait (503) once the view has been out of step with etcd this "
                 "long (a revoke could be missed); cluster tokens always work")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}));
  app.add_option("--max-relays", cfg.max_relays, "Calls on sandboxes relayed at once (then 429)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--record-cache", cfg.record_cache,
                 "Sandbox records kept to show while their node is unavailable")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}));
  app.add_option("--placement-tries", cfg.placement.max_tries,
                 "Nodes one create is sent to before its 429 is the answer")
      ->check(CLI::Range(1, 64));
  app.add_option("--placement-layer-weight", cfg.placement.layer_weight,
                 "What lacking a create's image costs a node beside its load (0..1 of its "
                 "capacity; 0: images do not matter)")
      ->check(CLI::Range(0.0, 1.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "dsec-apiserver: " << e.what() << " (see dsec-apiserver --help)\n";
    return 2;
  }
  log::Init(cfg.log_level);
  // Every relayed call holds two descriptors: the soft limit goes up to the hard one.
  if (rlimit rl; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  auto fail = [](const std::string& what, const Status& s) {
    std::cerr << "dsec-apiserver: " << what << ": " << s.message() << "\n";
    return 2;
  };
  if (!cfg.port_domain.empty()) {
    for (char& ch : cfg.port_domain)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (Status s = api::ValidatePortDomain(cfg.port_domain); !s.ok())
      return fail("--port-domain", s);
  }
  auto endpoints = etcd::ParseEndpoints(cfg.etcd);
  if (!endpoints.ok()) return fail("--etcd", endpoints.status());
  std::string host;
  uint16_t port = 0;
  if (Status s = http::ParseHostPort(cfg.listen, &host, &port); !s.ok()) return fail("--listen", s);
  auto tokens = http::LoadOrCreateTokens(cfg.token_file);
  if (!tokens.ok()) return fail("--token-file", tokens.status());
  auto node_tokens = http::LoadOrCreateTokens(cfg.node_token_file);
  if (!node_tokens.ok()) return fail("--node-token-file", node_tokens.status());

  etcd::Client etcd(*endpoints);
  // Project tokens are kept as keyed hashes; the key comes from the node token, which every
  // apiserver of the cluster has and etcd does not.
  std::string hash_key = http::DerivedKey(*node_tokens, "dsec-project-token-hash");
  if (!cfg.token_hash_key_file.empty()) {
    // Read, never made here: every apiserver must have the same key.
    struct stat st {};
    if (stat(cfg.token_hash_key_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
      return fail("--token-hash-key-file",
                  PermissionDenied(cfg.token_hash_key_file +
                                   " is readable by others: chmod 600 it (it keys every project "
                                   "token's hash)"));
    auto text = ReadFileToString(cfg.token_hash_key_file);
    if (!text.ok()) return fail("--token-hash-key-file", text.status());
    std::string key = std::string(TrimWhitespace(text->substr(0, text->find('\n'))));
    if (key.size() < 32)
      return fail("--token-hash-key-file",
                  InvalidArgument("its first line must hold at least 32 characters"));
    hash_key = http::DerivedKey({key}, "dsec-project-token-hash");
  }
  apiserver::AccessView access(hash_key);
  // Quota holds are this process's (its id names them; its lease bounds them).
  std::string id;
  {
    std::random_device rd;
    for (int i = 0; i < 2; ++i) id += fmt::format("{:08x}", rd());
  }
  apiserver::Quotas quotas(&etcd, id);
  apiserver::ClusterView view(&etcd, &access, &quotas);
  view.Start();
  quotas.Start();
  std::unique_ptr<AuditLog> audit;
  if (!cfg.audit_log.empty()) {
    auto a = AuditLog::Open(cfg.audit_log, cfg.audit_max_bytes, cfg.audit_keep);
    if (!a.ok()) return fail("--audit-log", a.status());
    audit = std::move(*a);
  }
  apiserver::Apiserver api(cfg, *tokens, node_tokens->front(), &etcd, &view, &access, &quotas,
                           audit.get());
  http::HttpServerOptions ho;
  ho.listen = cfg.listen;
  ho.io_threads = cfg.io_threads;
  ho.server_name = "dsec-apiserver";
  auto server = http::HttpServer::Start(
      ho, [&api](http::HttpRequest& r) { return api.Check(r); },
      [&api](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
        api.Handle(std::move(r), std::move(res));
      });
  if (!server.ok()) {
    view.Stop();
    return fail("serve", server.status());
  }
  api.SetServer(server->get());
  // The compatibility listeners: their relays and lists on a pool of their own.
  boost::asio::thread_pool compat_workers(8);
  std::vector<std::unique_ptr<apiserver::CompatFront>> fronts;
  std::vector<std::unique_ptr<http::HttpServer>> compat_servers;
  std::string compat_urls;
  for (auto [listen, protocol, label] :
       {std::tuple{cfg.e2b_listen, apiserver::CompatFront::Protocol::kE2b, "e2b"},
        std::tuple{cfg.sandbox_fusion_listen, apiserver::CompatFront::Protocol::kSandboxFusion,
                   "sandbox_fusion"}}) {
    if (listen.empty()) continue;
    auto front = std::make_unique<apiserver::CompatFront>(
        apiserver::CompatFront::Options{.protocol = protocol,
                                        .tokens = *tokens,
                                        .node_token = node_tokens->front(),
                                        .view = &view,
                                        .workers = &compat_workers,
                                        .call_timeout_ms = cfg.call_timeout_ms,
                                        .max_relays = cfg.max_relays});
    http::HttpServerOptions co = ho;
    co.listen = listen;
    auto* f = front.get();
    auto cs = http::HttpServer::Start(
        co, [f](http::HttpRequest& r) { return f->Check(r); },
        [f](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
          f->Handle(std::move(r), std::move(res));
        });
    if (!cs.ok()) {
      (*server)->Stop();
      for (auto& s : compat_servers) s->Stop();
      api.Shutdown();
      view.Stop();
      return fail(std::string("--") + (protocol == apiserver::CompatFront::Protocol::kE2b
                                           ? "e2b-listen"
                                           : "sandbox-fusion-listen"),
                  cs.status());
    }
    f->SetServer(cs->get());
    std::string h;
    uint16_t p = 0;
    (void)http::ParseHostPort(listen, &h, &p);
    compat_urls += StrCat({" ", label, "=http://", h, ":", std::to_string((*cs)->tcp_port())});
    fronts.push_back(std::move(front));
    compat_servers.push_back(std::move(*cs));
  }
  std::cout << "dsec-apiserver ready listen=" << host << ":" << (*server)->tcp_port()
            << " etcd=" << JoinStrings(*endpoints, ",") << compat_urls << std::endl;
  // Tokens' last uses to etcd, at most a write a minute per token (AccessView::TokenUses).
  std::atomic<bool> stopping{false};
  std::thread uses([&] {
    while (!stopping) {
      for (int i = 0; i < 50 && !stopping; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (i % 10 == 9) api.CutExpiredRelays(WallMs());  // (an expired token keeps nothing open)
      }
      for (const auto& [key, ms] : access.TokenUses(WallMs()))
        (void)etcd.Put(key, std::to_string(ms));
    }
  });
  int sig = WaitForSignal();
  DSEC_LOG_INFO("signal {}: shutting down", sig);
  stopping = true;
  uses.join();
  for (auto& s : compat_servers) s->Stop();
  compat_workers.stop();
  compat_workers.join();
  (*server)->Stop();
  api.Shutdown();
  quotas.Stop();
  view.Stop();
  return 0;
}
