#include "edge/edge.h"

#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "backends/container/container_backend.h"
#include "backends/microvm/microvm_backend.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/audit_log.h"
#include "edge/builds.h"
#include "edge/e2b.h"
#include "edge/idempotency.h"
#include "edge/manager.h"
#include "edge/membership.h"
#include "edge/metrics.h"
#include "edge/node_budget.h"
#include "edge/sandbox_fusion.h"
#include "edge/state_store.h"
#include "http/server.h"

namespace dsec::edge {

namespace {

namespace container = backends::container;

int WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGHUP) {
      DSEC_LOG_INFO("SIGHUP ignored (restart the edge to reload its config)");
      continue;
    }
    return sig;
  }
}

// One edge per state dir: the second one would fight the first over every sandbox. The lock
// is held for as long as `lock` stays open.
Status LockStateDir(const std::string& state_dir, UniqueFd* lock) {
  DSEC_RETURN_IF_ERROR(MakeDirs(state_dir, 0700));
  (void)chmod(state_dir.c_str(), 0700);
  *lock = UniqueFd(open(JoinPath(state_dir, "edge.lock").c_str(),
                        O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!*lock || flock(lock->get(), LOCK_EX | LOCK_NB) < 0)
    return Status(StatusCode::kAlreadyExists, "another dsec-edge is running on " + state_dir);
  return OkStatus();
}

struct Budgets {
  NodeBudget node;
  FileBudget files;
};

// The node's shared budgets (pids, ptys, sockets, open files), sized for max_sandboxes.
StatusOr<Budgets> PrepareBudgets(const EdgeConfig& cfg) {
  NodeBudgetOptions nbo;
  nbo.apply_sysctls = cfg.node_sysctls;
  nbo.max_sandboxes = cfg.max_sandboxes;
  nbo.pty_per_sandbox = static_cast<uint32_t>(cfg.pty_max_per_sandbox);
  nbo.reserve_pids = cfg.reserve_pids;
  nbo.memory_mb = NodeMemoryMb();
  Budgets b;
  DSEC_ASSIGN_OR_RETURN(b.node, PrepareNodeBudget(nbo));
  for (const auto& c : b.node.changes) DSEC_LOG_INFO("node budget: {}", c);
  if (b.node.aio_max_nr != 0 && b.node.aio_max_nr < (uint64_t{1} << 40))
    DSEC_LOG_WARN(
        "fs.aio-max-nr {} is one count for the whole node: a sandbox can take all of it and "
        "leave the host's io_setup EAGAIN (enable node_sysctls, or raise it)",
        b.node.aio_max_nr);
  auto files = PrepareFileBudget(cfg.max_sandboxes, cfg.max_connections, cfg.node_sysctls);
  if (!files.ok())
    return Status(files.status().code(), "open-file budget: " + files.status().message());
  b.files = std::move(*files);
  for (const auto& c : b.files.changes) DSEC_LOG_INFO("open-file budget: {}", c);
  if (b.files.max_sandboxes < cfg.max_sandboxes)
    DSEC_LOG_WARN(
        "RLIMIT_NOFILE {} holds {} sandboxes, not max_sandboxes {}: creates beyond are 429 "
        "(raise the hard limit, or run the edge with CAP_SYS_RESOURCE)",
        b.files.nofile, b.files.max_sandboxes, cfg.max_sandboxes);
  return b;
}

container::ContainerBackendOptions BackendOptions(const EdgeConfig& cfg,
                                                  images::ImageStore* image_store,
                                                  const Budgets& budgets) {
  container::ContainerBackendOptions bo;
  bo.image_store = image_store;
  bo.state_dir = cfg.state_dir;
  bo.agent_path = cfg.agent_path;
  bo.zygote_path = cfg.zygote_path;
  bo.features.userns = cfg.userns;
  bo.features.clone_into_cgroup = cfg.clone_into_cgroup;
  bo.features.cgroup_kill = cfg.cgroup_kill;
  bo.cgroup_mode = cfg.cgroup;
  bo.parent_memory_bytes = SandboxMemoryMb(NodeMemoryMb(), cfg.reserve_memory_mb) << 20;
  bo.parent_pids = budgets.node.sandbox_pids;
  bo.parent_socket_bytes = budgets.node.sandbox_tcp_bytes;
  bo.pty_max = budgets.node.pty_per_sandbox;
  bo.uid_lock_file = cfg.uid_lock_file;
  bo.sockets_per_mb = static_cast<uint32_t>(cfg.sockets_per_mb);
  // Nothing the edge keeps for itself is visible in a sandbox of the host image.
  bo.hidden_paths = {cfg.token_file, cfg.audit_log.substr(0, cfg.audit_log.rfind('/'))};
  if (!cfg.config_file.empty()) bo.hidden_paths.push_back(cfg.config_file);
  if (!cfg.socket.empty()) bo.hidden_paths.push_back(cfg.socket);
  bo.orphan_timeout_ms = cfg.orphan_timeout_s < 0 ? -1 : cfg.orphan_timeout_s * 1000;
  bo.netns_pool = static_cast<size_t>(std::max(0, cfg.netns_pool));
  bo.io_threads = cfg.agent_io_threads;
  bo.max_execs_per_sandbox = static_cast<uint32_t>(cfg.max_execs_per_sandbox);
  bo.tmpfs_disk_max_mb = cfg.tmpfs_disk_max_mb;
  bo.disk_preallocate = cfg.disk_preallocate;
  bo.disk_pool = static_cast<size_t>(cfg.disk_pool);
  bo.proc_views = cfg.proc_views;
  bo.disk_dir = cfg.disk_dir;
  return bo;
}

backends::microvm::MicrovmBackendOptions MicrovmOptions(
    const EdgeConfig& cfg, const container::ContainerBackendOptions& containers) {
  backends::microvm::MicrovmBackendOptions o;
  o.state_dir = cfg.state_dir;
  o.agent_path = cfg.agent_path;
  o.kernel_dir = cfg.microvm_kernel_dir;
  o.accel = cfg.accel;
  o.cgroup_mode = cfg.cgroup;
  o.parent_memory_bytes = containers.parent_memory_bytes;
  o.uid_lock_file = cfg.uid_lock_file;
  o.max_execs_per_sandbox = containers.max_execs_per_sandbox;
  o.orphan_timeout_ms = containers.orphan_timeout_ms;
  o.io_threads = cfg.agent_io_threads;
  o.image_store = containers.image_store;
  return o;
}

// The microVM backend when this node can run one; otherwise why not (in *why).
std::unique_ptr<backends::microvm::MicrovmBackend> StartMicrovms(
    const EdgeConfig& cfg, const container::ContainerBackendOptions& containers, std::string* why) {
  if (!cfg.microvm) {
    *why = "off in the config (microvm: false)";
    return nullptr;
  }
  auto b = backends::microvm::MicrovmBackend::Create(MicrovmOptions(cfg, containers));
  if (!b.ok()) {
    *why = b.status().message();
    DSEC_LOG_WARN("no microVM sandboxes on this node: {}", *why);
    return nullptr;
  }
  DSEC_LOG_INFO("{}", (*b)->Describe());
  return std::move(*b);
}

// What a kind can do (Backend::Capabilities: the table creates are checked against).
Json CapabilitiesJson(const backends::KindCapabilities& c) {
  return {{"host_image", c.host_image},
          {"network", c.network},
          {"port_proxy", c.port_proxy},
          {"snapshot", c.snapshot},
          {"fncall_workers", c.fncall_workers}};
}

Json MicrovmFeatures(const backends::microvm::MicrovmBackend* b, const std::string& why) {
  if (!b) return {{"available", false}, {"reason", why}};
  Json f = {{"available", true},
            {"accel", b->AccelNow()},
            {"kernel", b->kernel().version},
            {"templates", b->template_count()}};
  if (std::string why = b->accel_reason(); !why.empty()) f["accel_reason"] = why;
  return f;
}

// GET /v1/node's features.network: the settings, and whether it works (or why not).
Json NetworkFeatures(bool enabled, net::LazyNodeNetwork* network) {
  if (!enabled) return {{"enabled", false}, {"reason", "network: false in the edge's config"}};
  net::LazyNodeNetwork::Info i = network->Describe();
  Json dns = {{"upstream", i.dns_upstream.empty() ? Json(nullptr) : Json(i.dns_upstream)},
              {"state", i.dns_state}};
  if (!i.dns_error.empty()) dns["error"] = i.dns_error;
  Json j = {{"enabled", true},
            {"available", i.reason.empty()},
            {"started", i.started},
            {"cidr", i.cidr},
            {"uplink", i.uplink.empty() ? Json(nullptr) : Json(i.uplink)},
            {"dns_upstream", i.dns_upstream.empty() ? Json(nullptr) : Json(i.dns_upstream)},
            {"dns", dns}};
  if (!i.reason.empty()) j["reason"] = i.reason;
  return j;
}

// What GET /v1/node reports about the kernel features the backend found.
Json FeaturesOf(const container::ContainerBackend& backend) {
  const auto& f = backend.features();
  Json features = {{"kernel", f.kernel_release},
                   {"userns", f.userns},
                   {"clone_into_cgroup", f.clone_into_cgroup},
                   {"cgroup_kill", f.cgroup_kill},
                   {"socket_budget", backend.socket_budget()}};
  if (!backend.socket_budget()) features["socket_budget_reason"] = backend.socket_budget_error();
  std::string views = backend.ProcViewsState();
  features["proc_views"] = views.empty();
  if (!views.empty()) features["proc_views_reason"] = views;
  return features;
}

http::HttpServerOptions ServerOptions(const EdgeConfig& cfg, const FileBudget& files) {
  http::HttpServerOptions ho;
  ho.listen = cfg.listen;
  ho.unix_path = cfg.socket;
  // Image archives arrive here (unlinked files) rather than in memory.
  ho.spool_dir = JoinPath(cfg.state_dir, "spool");
  ho.max_header_bytes = cfg.max_header_bytes;
  // Connections get what the sandboxes leave of the edge's descriptors (PrepareFileBudget).
  ho.max_connections = files.max_connections;
  if (ho.max_connections < cfg.max_connections)
    DSEC_LOG_INFO("max_connections {} -> {} (RLIMIT_NOFILE {}, {} sandboxes)", cfg.max_connections,
                  ho.max_connections, files.nofile, files.max_sandboxes);
  ho.idle_timeout_s = cfg.idle_timeout_s;
  ho.io_threads = cfg.io_threads;
  return ho;
}

// Creates the unix socket's directory; returns the directories it made, deepest first, for
// the caller to remove again on exit.
std::vector<std::string> MakeSocketDir(const std::string& socket) {
  if (socket.empty()) return {};
  std::string dir = socket.substr(0, socket.rfind('/'));
  std::vector<std::string> missing;
  for (std::string d = dir; d.size() > 1 && access(d.c_str(), F_OK) != 0;
       d = d.substr(0, d.rfind('/')))
    missing.push_back(d);
  if (dir.empty() || !MakeDirs(dir, 0755).ok()) return {};
  return missing;
}

// Layers held by sandboxes that did not come back are free again.
void ReleaseLostLayers(const Manager& manager, images::ImageStore* image_store) {
  auto ids = manager.Ids();
  image_store->RetainHolders(std::set<std::string>(ids.begin(), ids.end()));
  if (auto n = image_store->Collect(); n.ok() && *n > 0)
    DSEC_LOG_INFO("image store: removed {} unreferenced layers", *n);
}

// The edge's own upkeep until `done`: idempotency records are bounded by count and age, and
// the heap gives back what a burst of output left in it.
void Housekeep(const std::atomic<bool>& done, Idempotency* idem, const OutputBudget& output) {
  int64_t next = 0;
  uint64_t output_peak = 0;
  while (!done) {
    if (MonotonicMs() >= next) {
      idem->Prune();
      next = MonotonicMs() + 60000;
    }
    // Output buffers are mmap'd (see main.cc) and go back at once; whatever smaller pieces
    // a burst of output left in the heap goes back once most of it was freed again.
    uint64_t used = output.used();
    output_peak = std::max(output_peak, used);
    if (output_peak - used > (64u << 20)) {
      malloc_trim(0);
      output_peak = used;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// A compatibility listener (SandboxFusion, E2B) on its own TCP address: the API's server
// options but no unix socket, one I/O thread and its share of the connections.
template <typename Listener>
StatusOr<std::unique_ptr<http::HttpServer>> StartCompatServer(http::HttpServerOptions opts,
                                                              const std::string& listen,
                                                              int max_connections, Listener* l) {
  opts.listen = listen;
  opts.unix_path.clear();
  opts.io_threads = 1;
  opts.max_connections = max_connections;
  return http::HttpServer::Start(
      opts, [l](http::HttpRequest& r) { return l->Check(r); },
      [l](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
        l->Handle(std::move(r), std::move(res));
      });
}

// "http://HOST:PORT" of a listener (its bound port when it was asked for port 0).
std::string UrlOf(const std::string& listen, const http::HttpServer& server) {
  if (listen.empty()) return "";
  if (listen.ends_with(":0"))
    return "http://" + listen.substr(0, listen.size() - 1) + std::to_string(server.tcp_port());
  return "http://" + listen;
}

// One line on stdout when ready, for scripts.
void AnnounceReady(const EdgeConfig& cfg, const http::HttpServer& server, int adopted,
                   const http::HttpServer* fusion, const http::HttpServer* e2b) {
  std::string where = UrlOf(cfg.listen, server);
  std::cout << "dsec-edge ready node=" << cfg.node << " url=" << where << " socket=" << cfg.socket
            << " adopted=" << adopted << " token_file=" << cfg.token_file
            << (fusion ? " sandbox_fusion=" + UrlOf(cfg.sandbox_fusion_listen, *fusion) : "")
            << (e2b ? " e2b=" + UrlOf(cfg.e2b_listen, *e2b) : "") << std::endl;
  DSEC_LOG_INFO("serving: url={} socket={} node={} state_dir={}", where, cfg.socket, cfg.node,
                cfg.state_dir);
}

}  // namespace

namespace {

// The node network's settings; refused packets are logged to `audit`.
net::NodeNetworkOptions NetworkOptions(const EdgeConfig& cfg, AuditLog* audit) {
  net::NodeNetworkOptions net_opts;
  net_opts.range = cfg.network_range;
  net_opts.uplink = cfg.network_uplink;
  net_opts.dns_upstream = cfg.network_dns;
  net_opts.dns_max_ttl_s = static_cast<uint32_t>(cfg.network_dns_max_ttl_s);
  {
    // Named after the edge instance (what the container backend derives from the same path).
    char real[PATH_MAX];
    net_opts.tag = InstanceIdForPath(realpath(cfg.state_dir.c_str(), real) ? real : cfg.state_dir)
                       .substr(0, 6);
  }
  net_opts.state_file = JoinPath(cfg.state_dir, "network.json");
  net_opts.max_conns = static_cast<uint32_t>(cfg.network_max_conns);
  net_opts.new_conns_per_s = static_cast<uint32_t>(cfg.network_new_conns_per_s);
  // Refused connections in the audit log, beside the execs (a few a minute per sandbox).
  net_opts.on_denied = [log = audit](const std::string& sandbox, const net::DeniedPacket& p) {
    Json e = {{"event", "network_denied"},
              {"sandbox", sandbox},
              {"dst", net::Ipv4ToString(p.dst)},
              {"proto", p.proto == IPPROTO_TCP    ? "tcp"
                        : p.proto == IPPROTO_UDP  ? "udp"
                        : p.proto == IPPROTO_ICMP ? "icmp"
                                                  : std::to_string(p.proto)}};
    if (p.dport) e["port"] = p.dport;
    log->Record(std::move(e));
  };
  return net_opts;
}

// What this node registers in the cluster (and renews with its lease).
cluster::NodeRecord NodeRecordOf(const EdgeConfig& cfg, const Manager& manager,
                                 const pools::PoolSet& pools, const std::string& instance,
                                 int64_t started_at) {
  NodeReport n = manager.NodeInfo();
  cluster::NodeRecord r;
  r.node = cfg.node;
  r.url = cfg.cluster_advertise;
  r.instance = instance;
  r.version = DSEC_VERSION;
  for (backends::Kind k : manager.Kinds()) r.kinds.emplace_back(backends::KindName(k));
  for (const auto& p : pools.List()) r.pools.push_back(p.config.name);
  r.max_sandboxes = std::min(n.max_sandboxes,
                             n.files.max_sandboxes > 0 ? n.files.max_sandboxes : n.max_sandboxes);
  r.memory_mb = n.memory_mb;
  r.admit_memory_mb = n.admit_memory_mb;
  r.max_memory_mb = n.admit_memory_mb;
  r.sandboxes = n.sandboxes;
  r.used_memory_mb = n.used_memory_mb;
  r.started_at = started_at;
  return r;
}

}  // namespace

int RunEdge(EdgeConfig cfg) {
  auto fail = [](const std::string& what, const Status& s) {
    std::cerr << "dsec-edge: " << what << ": " << s.message() << "\n";
    return 1;
  };
  if (geteuid() != 0) return fail("start", PermissionDenied("dsec-edge must run as root"));
  UniqueFd lock;
  if (Status s = LockStateDir(cfg.state_dir, &lock); !s.ok()) return fail("state dir", s);
  auto tokens = LoadOrCreateTokens(cfg.token_file);
  if (!tokens.ok()) return fail("tokens", tokens.status());
  // Best effort: the OOM killer takes sandboxes before the edge. Some hosts (containers, VMs
  // without CAP_SYS_RESOURCE) refuse a lower value even to root: then it stays as it is, which
  // is worth a line in the debug log only.
  if (Status s = WriteStringToFile("/proc/self/oom_score_adj", "-1000"); !s.ok())
    DSEC_LOG_DEBUG("oom_score_adj stays as it was (this host refused -1000: {})", s.message());

  auto store = StateStore::Open(JoinPath(cfg.state_dir, "state.db"));
  if (!store.ok()) return fail("state db", store.status());
  auto audit = AuditLog::Open(cfg.audit_log, cfg.audit_max_bytes, cfg.audit_keep);
  if (!audit.ok()) return fail("audit log", audit.status());
  // Before the backend: exec observers still inside it when it is torn down report to these.
  Metrics metrics;
  OutputBudget output_budget(
      static_cast<uint64_t>(cfg.output_memory_mb > 0 ? cfg.output_memory_mb
                                                     : std::max<int64_t>(256, NodeMemoryMb() / 32))
      << 20);

  images::StoreOptions iso;
  iso.root = JoinPath(cfg.state_dir, "images");
  iso.default_format = cfg.image_layer_format;
  iso.max_layer_bytes = cfg.image_max_layer_bytes;
  auto image_store = images::ImageStore::Open(iso);
  if (!image_store.ok()) return fail("image store", image_store.status());
  auto budgets = PrepareBudgets(cfg);
  if (!budgets.ok()) return fail("node budgets", budgets.status());
  // The sandbox network: started by the first sandbox that needs one, removed after every
  // sandbox is gone (the guard outlives the manager), left in place for --persist.
  net::LazyNodeNetwork network(NetworkOptions(cfg, audit->get()));
  bool network_stays = true;  // set once serving, unless --persist
  auto stop_network = MakeScopeGuard([&] {
    if (!network_stays) network.Stop();
  });
  // Checked now, not at the first networked create: a setting that does not parse stops the
  // start; a problem of the node (no default route, a clashing network_cidr) is logged and
  // shown in GET /v1/node, and creates that need the network answer 503 with it. The DNS
  // upstream is probed in the background (up to 2 s).
  std::thread dns_probe;
  auto join_probe = MakeScopeGuard([&] {
    if (dns_probe.joinable()) dns_probe.join();
  });
  if (cfg.network) {
    net::NetworkCheck check = network.Check();
    if (!check.config.ok()) return fail("network", check.config);
    if (check.dns_addr) dns_probe = std::thread([&network] { network.ProbeDns(); });
  }
  container::ContainerBackendOptions container_opts =
      BackendOptions(cfg, image_store->get(), *budgets);
  if (cfg.network) {
    container_opts.network = [&network] { return network.Get(); };
    container_opts.nameserver = net::Ipv4ToString(cfg.network_range.gateway());
  }
  auto backend = container::ContainerBackend::Create(container_opts);
  if (!backend.ok()) return fail("container backend", backend.status());
  DSEC_LOG_INFO("{}", (*backend)->Describe());
  std::string no_microvms;
  std::unique_ptr<backends::microvm::MicrovmBackend> microvms =
      StartMicrovms(cfg, container_opts, &no_microvms);

  // From here on every service is stopped by the guard made right after it, in reverse order
  // of their start, on every way out: a failed start-up included. `serving` tells a stop at
  // the end (sandboxes go, unless --persist) from a start-up that failed (nothing was served:
  // adopted sandboxes are left as they were, for the next edge).
  bool serving = false;
  auto log_stopped = MakeScopeGuard([&] {
    if (serving) DSEC_LOG_INFO("stopped");
  });
  auto stop_backend = MakeScopeGuard([&] {
    if (!serving || cfg.persist) return;
    if (Status s = (*backend)->Shutdown(); !s.ok())
      DSEC_LOG_WARN("parent cgroups not removed: {}", s.message());
    if (microvms)
      if (Status s = microvms->Shutdown(); !s.ok())
        DSEC_LOG_WARN("microVM parent cgroups not removed: {}", s.message());
  });
  // Declared before the workers, so that they outlive every handler the workers still run.
  std::optional<Idempotency> idem;
  std::optional<Api> api;
  std::optional<SandboxFusion> fusion;  // SandboxFusion's /run_code, when asked for
  std::optional<E2b> e2b;               // the E2B-compatible API, when asked for
  // Timers and workers outlive the manager's shutdown: handlers blocked on a sandbox finish
  // when it goes, and only then are the workers joined.
  boost::asio::io_context timers;
  auto timers_work = boost::asio::make_work_guard(timers);
  std::thread timer_thread([&] { timers.run(); });
  auto stop_timers = MakeScopeGuard([&] {
    timers_work.reset();
    timers.stop();
    timer_thread.join();
  });
  boost::asio::thread_pool workers(static_cast<size_t>(cfg.worker_threads));
  auto stop_workers = MakeScopeGuard([&] { workers.join(); });

  std::vector<backends::Backend*> kinds = {backend->get()};
  if (microvms) kinds.push_back(microvms.get());
  Manager manager(cfg, kinds, store->get(), &metrics);
  auto stop_manager = MakeScopeGuard([&] { manager.Shutdown(serving ? cfg.persist : true); });
  manager.SetNodeBudget(budgets->node);
  manager.SetFileBudget(budgets->files);
  auto recovered = manager.Recover();
  if (!recovered.ok()) return fail("recover", recovered.status());
  DSEC_LOG_INFO("recovered: adopted={} cleaned_up={}", recovered->first, recovered->second);
  ReleaseLostLayers(manager, image_store->get());
  Builds builds(cfg, &manager, image_store->get());
  auto stop_builds = MakeScopeGuard([&] { builds.Shutdown(); });  // a build in progress goes
  if (int n = builds.CleanupLost(); n > 0)
    DSEC_LOG_INFO("deleted {} sandboxes of builds a previous edge left", n);
  // After Recover: a previous edge's pool workers are never adopted, only cleaned up.
  pools::PoolSet pools(backend->get(), cfg.node);
  // Workers and pooled sandboxes go even with --persist: pools restart.
  auto stop_pools = MakeScopeGuard([&] { pools.Shutdown(); });
  pools.SetAdmission([&manager](int64_t mb) { return manager.AdmitPoolSandbox(mb); });
  pools.SetWorkerMaxCalls(cfg.fncall_worker_max_calls);
  manager.SetPools(&pools);
  LoadPools(cfg, (*backend)->features().userns, &pools, store->get(), image_store->get());
  pools.WaitWarm(30000);  // "ready" means the runtimes answer their first calls warm

  idem.emplace(store->get(), cfg.idempotency_max_records, cfg.idempotency_max_age_s,
               cfg.idempotency_max_body_bytes, cfg.idempotency_max_total_bytes);
  Api::Deps deps;
  deps.cfg = cfg;
  deps.manager = &manager;
  deps.backend = backend->get();
  deps.idempotency = &*idem;
  deps.metrics = &metrics;
  deps.output_budget = &output_budget;
  deps.audit = audit->get();
  deps.workers = &workers;
  deps.timers = &timers;
  deps.pools = &pools;
  deps.store = store->get();
  deps.images = image_store->get();
  deps.builds = &builds;
  deps.tokens = *tokens;
  deps.instance = (*backend)->instance_id();
  deps.features = FeaturesOf(**backend);
  deps.live_features = [ct = backend->get(), vm = microvms.get(), &no_microvms, &network, &cfg] {
    // Each kind this node serves, with what it can do: the table creates are checked against.
    Json kinds = {{"container", CapabilitiesJson(ct->Capabilities())}};
    if (vm) kinds["microvm"] = CapabilitiesJson(vm->Capabilities());
    return Json{{"microvm", MicrovmFeatures(vm, no_microvms)},
                {"network", NetworkFeatures(cfg.network, &network)},
                {"kinds", kinds}};
  };
  api.emplace(std::move(deps));

  http::HttpServerOptions ho = ServerOptions(cfg, budgets->files);
  // The connections the edge's descriptors allow are shared by its listeners: the API keeps
  // half when a compatibility listener runs beside it, and they split the other half.
  const int compat_listeners = !cfg.sandbox_fusion_listen.empty() + !cfg.e2b_listen.empty();
  const int compat_connections =
      compat_listeners ? std::max(16, ho.max_connections / 2 / compat_listeners) : 0;
  if (compat_listeners) ho.max_connections = std::max(16, ho.max_connections / 2);
  if (Status s = MakeDirs(ho.spool_dir, 0700); !s.ok()) return fail("spool dir", s);
  // The socket's directory and whichever of its parents we create are removed again on exit.
  std::vector<std::string> made_dirs = MakeSocketDir(cfg.socket);
  auto remove_dirs = MakeScopeGuard([&] {
    for (const auto& d : made_dirs) (void)rmdir(d.c_str());  // only while empty
  });
  auto server = http::HttpServer::Start(
      ho, [&api](http::HttpRequest& r) { return api->Check(r); },
      [&api](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
        api->Handle(std::move(r), std::move(res));
      });
  if (!server.ok()) return fail("serve", server.status());
  auto stop_server = MakeScopeGuard([&] { (*server)->Stop(); });
  serving = true;
  network_stays = cfg.persist;
  metrics.SetNetworkDenied([&network] {
    net::NodeNetwork* n = network.IfStarted();
    return n ? n->DeniedTotal() : 0;
  });
  api->deps().connections = [s = server->get()] { return s->connections(); };
  api->deps().proxy_io = &(*server)->io();
  manager.StartReaper();

  // SandboxFusion's /run_code, on its own listener when asked for.
  std::unique_ptr<http::HttpServer> fusion_server;
  auto stop_fusion = MakeScopeGuard([&] {
    if (fusion_server) fusion_server->Stop();
  });
  if (!cfg.sandbox_fusion_listen.empty()) {
    fusion.emplace(SandboxFusion::Deps{.cfg = &cfg,
                                       .manager = &manager,
                                       .pools = &pools,
                                       .images = image_store->get(),
                                       .workers = &workers,
                                       .metrics = &metrics,
                                       .audit = audit->get(),
                                       .tokens = *tokens});
    auto fs = StartCompatServer(ho, cfg.sandbox_fusion_listen, compat_connections, &*fusion);
    if (!fs.ok()) return fail("sandbox fusion listener", fs.status());
    fusion_server = std::move(*fs);
  }
  std::unique_ptr<http::HttpServer> e2b_server;
  auto stop_e2b = MakeScopeGuard([&] {
    if (e2b_server) e2b_server->Stop();
  });
  if (!cfg.e2b_listen.empty()) {
    e2b.emplace(E2b::Deps{.cfg = &cfg,
                          .manager = &manager,
                          .workers = &workers,
                          .timers = &timers,
                          .metrics = &metrics,
                          .audit = audit->get(),
                          .tokens = *tokens});
    auto es = StartCompatServer(ho, cfg.e2b_listen, compat_connections, &*e2b);
    if (!es.ok()) return fail("e2b listener", es.status());
    e2b_server = std::move(*es);
  }

  // In a cluster: registered once serving, and gone from placement first at shutdown.
  std::unique_ptr<Membership> membership;
  if (!cfg.cluster_etcd.empty()) {
    auto endpoints = etcd::ParseEndpoints(cfg.cluster_etcd);  // checked by FinalizeConfig
    if (!endpoints.ok()) return fail("cluster", endpoints.status());
    const int64_t started_at = WallMs();
    membership = std::make_unique<Membership>(
        *endpoints, cfg.cluster_lease_ttl_s,
        [&cfg, &manager, &pools, instance = (*backend)->instance_id(), started_at] {
          return NodeRecordOf(cfg, manager, pools, instance, started_at);
        });
    membership->Start();
  }
  auto stop_membership = MakeScopeGuard([&] {
    if (membership) membership->Stop();
  });

  std::atomic<bool> done{false};
  std::thread housekeeper([&] { Housekeep(done, &*idem, output_budget); });
  auto stop_housekeeper = MakeScopeGuard([&] {
    done = true;
    housekeeper.join();
  });
  AnnounceReady(cfg, **server, recovered->first, fusion_server.get(), e2b_server.get());

  int sig = WaitForSignal();
  DSEC_LOG_INFO("signal {}: shutting down{}", sig, cfg.persist ? " (persist)" : "");
  // Everything stops as the guards go, in reverse order: the housekeeper, the server, its
  // directories, pools, builds, the manager, workers, timers, the backend's parent cgroups.
  return 0;
}

}  // namespace dsec::edge
