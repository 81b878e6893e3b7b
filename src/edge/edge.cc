#include "edge/edge.h"
#include "base/resources.h"

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
#include "base/audit_log.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "cluster/membership.h"
#include "edge/api.h"
#include "edge/builds.h"
#include "edge/cluster_images.h"
#include "edge/e2b.h"
#include "edge/idempotency.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "edge/node_budget.h"
#include "edge/pg_trajectory_store.h"
#include "edge/sandbox_fusion.h"
#include "edge/state_store.h"
#include "edge/trajectory.h"
#include "edge/trajectory_store.h"
#include "http/client.h"
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
  o.network = containers.network;
  o.nameserver = containers.nameserver;
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

api::MicrovmFeatures MicrovmFeaturesOf(const backends::microvm::MicrovmBackend* b,
                                       const std::string& why) {
  api::MicrovmFeatures f;
  f.available = b != nullptr;
  if (!b) {
    f.reason = why;
    return f;
  }
  f.accel = b->AccelNow();
  f.accel_reason = b->accel_reason();
  f.kernel = b->kernel().version;
  f.templates = static_cast<int64_t>(b->template_count());
  f.templates_loaded = b->templates_loaded();
  return f;
}

// What GET /v1/node reports about the kernel features the backend found (fixed at start).
api::KernelFeatures KernelFeaturesOf(const container::ContainerBackend& backend) {
  const auto& f = backend.features();
  api::KernelFeatures k;
  k.kernel = f.kernel_release;
  k.userns = f.userns;
  k.clone_into_cgroup = f.clone_into_cgroup;
  k.cgroup_kill = f.cgroup_kill;
  k.socket_budget = backend.socket_budget();
  if (!k.socket_budget) k.socket_budget_reason = backend.socket_budget_error();
  k.proc_views_reason = backend.ProcViewsState();
  return k;
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
// (`kept`: other holders that stay, a trajectory's checkpoints.)
void ReleaseLostLayers(const Manager& manager, images::ImageStore* image_store,
                       const std::vector<std::string>& kept) {
  auto ids = manager.Ids();
  std::set<std::string> alive(ids.begin(), ids.end());
  alive.insert(kept.begin(), kept.end());
  image_store->RetainHolders(alive);
  if (auto n = image_store->Collect(); n.ok() && *n > 0)
    DSEC_LOG_INFO("image store: removed {} unreferenced layers", *n);
}

// The edge's own upkeep until `done`: idempotency records are bounded by count and age, and
// the heap gives back what a burst of output left in it.
void Housekeep(const std::atomic<bool>& done, Idempotency* idem, const OutputBudget& output,
               Trajectories* trajectories) {
  int64_t next = 0, next_trajectories = 0;
  uint64_t output_peak = 0;
  while (!done) {
    if (MonotonicMs() >= next) {
      idem->Prune();
      next = MonotonicMs() + 60000;
    }
    // Bindings of sandboxes that went, and expired trajectories.
    if (trajectories && MonotonicMs() >= next_trajectories) {
      trajectories->Housekeep();
      next_trajectories = MonotonicMs() + 5000;
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
  net_opts.bandwidth_mbit = static_cast<uint32_t>(cfg.network_bandwidth_mbit);
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
    if (p.ipv6) e["dst"] = "ipv6";
    // Refused at connect()/send by the cgroup program, or a packet nftables refused.
    e["layer"] = p.at_connect ? "connect" : "packet";
    log->Record(std::move(e));
  };
  return net_opts;
}

// What this node registers in the cluster (and renews with its lease).
// Where apiservers reach a compatibility listener of this node: its port, on its listen host,
// or on the advertised API's host when it listens on every address.
std::string AdvertisedUrlOf(const std::string& advertise, const std::string& listen,
                            const http::HttpServer* server) {
  std::string host;
  uint16_t port = 0;
  if (!server || listen.empty() || !http::ParseHostPort(listen, &host, &port).ok()) return "";
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    if (!http::ParseHttpUrl(advertise, &host, &port).ok()) return "";
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(server->tcp_port());
}

cluster::NodeRecord NodeRecordOf(const EdgeConfig& cfg, const Manager& manager,
                                 const pools::PoolSet& pools, const std::string& instance,
                                 int64_t started_at, const http::HttpServer* e2b,
                                 const http::HttpServer* fusion) {
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
  r.default_memory_mb = cfg.defaults.memory_mb;
  r.default_cpu_milli = CpuMilli(cfg.defaults.cpu);
  r.sandboxes = n.sandboxes;
  r.used_memory_mb = n.used_memory_mb;
  r.started_at = started_at;
  r.e2b_url = AdvertisedUrlOf(cfg.cluster_advertise, cfg.e2b_listen, e2b);
  r.sandbox_fusion_url = AdvertisedUrlOf(cfg.cluster_advertise, cfg.sandbox_fusion_listen, fusion);
  return r;
}

// The edge's services, as members in the order they start: the destructor stops what was
// started in the reverse order (the shutdown order), on every way out, a failed start-up
// included. `serving` tells a stop at the end (sandboxes go, unless --persist) from a start-up
// that failed (nothing was served: adopted sandboxes are left as they were, for the next edge).
class EdgeServices {
 public:
  explicit EdgeServices(EdgeConfig cfg) : cfg_(std::move(cfg)) {}
  EdgeServices(const EdgeServices&) = delete;
  EdgeServices& operator=(const EdgeServices&) = delete;
  ~EdgeServices();

  // Each step fails with a Status whose message starts with what failed.
  Status Open();          // state dir, tokens, state DB, audit log, images, budgets, network
  Status StartKinds();    // the container backend and, where it can run, the microVM one
  Status StartManager();  // timers, workers, the manager (re-adopting), builds, pools
  Status Serve();         // the API, its listeners, cluster membership, housekeeping
  void Announce() const;

 private:
  api::NodeFeatures Features() const;
  Status StartCompatListeners(const http::HttpServerOptions& ho);

  EdgeConfig cfg_;
  bool serving_ = false;
  UniqueFd lock_;
  std::vector<std::string> tokens_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<AuditLog> audit_;
  // Before the backends: exec observers still inside one when it is torn down report to these.
  Metrics metrics_;
  std::unique_ptr<OutputBudget> output_budget_;
  std::unique_ptr<images::ImageStore> images_;
  // The trajectory log: destroyed after the manager, the backends and the workers (a recorded
  // call's answer may come while they go); stopped explicitly once the workers are joined. The
  // store goes first: its committer's last callbacks still find the log.
  std::unique_ptr<Trajectories> trajectories_;
  std::unique_ptr<TrajectoryStore> trajectory_store_;
  Budgets budgets_;
  // The sandbox network: started by the first sandbox that needs one, removed after every
  // sandbox is gone, left in place for --persist.
  std::unique_ptr<net::LazyNodeNetwork> network_;
  std::thread dns_probe_;
  container::ContainerBackendOptions container_opts_;
  std::unique_ptr<container::ContainerBackend> containers_;
  std::string no_microvms_;
  api::KernelFeatures kernel_features_;  // found at start
  std::unique_ptr<backends::microvm::MicrovmBackend> microvms_;
  // Timers and workers outlive the manager's shutdown: handlers blocked on a sandbox finish
  // when it goes, and only then are the workers joined.
  boost::asio::io_context timers_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      timers_work_;
  std::thread timer_thread_;
  std::optional<boost::asio::thread_pool> workers_;
  std::unique_ptr<Manager> manager_;
  int adopted_ = 0;
  std::unique_ptr<Builds> builds_;
  std::unique_ptr<pools::PoolSet> pools_;
  std::optional<Idempotency> idem_;
  std::optional<Api> api_;
  std::vector<std::string> made_dirs_;  // the socket's, deepest first: removed while empty
  std::unique_ptr<http::HttpServer> server_;
  std::optional<SandboxFusion> fusion_;  // SandboxFusion's /run_code, when asked for
  std::unique_ptr<http::HttpServer> fusion_server_;
  std::optional<E2b> e2b_;  // the E2B-compatible API, when asked for
  std::unique_ptr<http::HttpServer> e2b_server_;
  std::unique_ptr<ClusterImages> cluster_images_;    // in a cluster: images across nodes
  std::unique_ptr<cluster::Membership> membership_;  // gone from placement first at shutdown
  std::atomic<bool> done_{false};
  std::thread housekeeper_;
};

EdgeServices::~EdgeServices() {
  if (housekeeper_.joinable()) {
    done_ = true;
    housekeeper_.join();
  }
  if (membership_) membership_->Stop();
  if (e2b_server_) e2b_server_->Stop();
  if (fusion_server_) fusion_server_->Stop();
  if (server_) server_->Stop();
  if (cluster_images_) cluster_images_->Stop();             // (its transfers to peers end)
  for (const auto& d : made_dirs_) (void)rmdir(d.c_str());  // only while empty
  if (pools_) pools_->Shutdown();    // workers and pooled sandboxes go even with --persist
  if (builds_) builds_->Shutdown();  // a build in progress goes
  if (manager_) manager_->Shutdown(serving_ ? cfg_.persist : true);
  if (membership_) membership_->Finish();
  if (workers_) workers_->join();
  if (trajectory_store_) trajectory_store_->Stop();  // later answers are not recorded
  if (trajectories_) trajectories_->Stop();          // no checkpoint runs any more
  if (timer_thread_.joinable()) {
    timers_work_.reset();
    timers_.stop();
    timer_thread_.join();
  }
  if (serving_ && !cfg_.persist) {
    if (Status s = containers_->Shutdown(); !s.ok())
      DSEC_LOG_WARN("parent cgroups not removed: {}", s.message());
    if (microvms_)
      if (Status s = microvms_->Shutdown(); !s.ok())
        DSEC_LOG_WARN("microVM parent cgroups not removed: {}", s.message());
  }
  if (serving_) DSEC_LOG_INFO("stopped");
  if (dns_probe_.joinable()) dns_probe_.join();
  if (network_ && serving_ && !cfg_.persist) network_->Stop();
}

Status EdgeServices::Open() {
  auto failed = [](const std::string& what, const Status& s) {
    return Status(s.code(), what + ": " + s.message());
  };
  if (geteuid() != 0) return PermissionDenied("start: dsec-edge must run as root");
  if (Status s = LockStateDir(cfg_.state_dir, &lock_); !s.ok()) return failed("state dir", s);
  auto tokens = LoadOrCreateTokens(cfg_.token_file);
  if (!tokens.ok()) return failed("tokens", tokens.status());
  tokens_ = std::move(*tokens);
  // Best effort: the OOM killer takes sandboxes before the edge. Some hosts (containers, VMs
  // without CAP_SYS_RESOURCE) refuse a lower value even to root: then it stays as it is, which
  // is worth a line in the debug log only.
  if (Status s = WriteStringToFile("/proc/self/oom_score_adj", "-1000"); !s.ok())
    DSEC_LOG_DEBUG("oom_score_adj stays as it was (this host refused -1000: {})", s.message());
  auto store = StateStore::Open(JoinPath(cfg_.state_dir, "state.db"));
  if (!store.ok()) return failed("state db", store.status());
  store_ = std::move(*store);
  auto audit = AuditLog::Open(cfg_.audit_log, cfg_.audit_max_bytes, cfg_.audit_keep);
  if (!audit.ok()) return failed("audit log", audit.status());
  audit_ = std::move(*audit);
  output_budget_ = std::make_unique<OutputBudget>(
      static_cast<uint64_t>(cfg_.output_memory_mb > 0 ? cfg_.output_memory_mb
                                                      : std::max<int64_t>(256, NodeMemoryMb() / 32))
      << 20);
  images::StoreOptions iso;
  iso.root = JoinPath(cfg_.state_dir, "images");
  iso.default_format = cfg_.layer_format;
  iso.max_layer_bytes = cfg_.image_max_layer_bytes;
  auto image_store = images::ImageStore::Open(iso);
  if (!image_store.ok()) return failed("image store", image_store.status());
  images_ = std::move(*image_store);
  auto budgets = PrepareBudgets(cfg_);
  if (!budgets.ok()) return failed("node budgets", budgets.status());
  budgets_ = std::move(*budgets);
  network_ = std::make_unique<net::LazyNodeNetwork>(NetworkOptions(cfg_, audit_.get()));
  // Checked now, not at the first networked create: a setting that does not parse stops the
  // start; a problem of the node (no default route, a clashing network_cidr) is logged and
  // shown in GET /v1/node, and creates that need the network answer 503 with it. The DNS
  // upstream is probed in the background (up to 2 s).
  if (cfg_.network) {
    net::NetworkCheck check = network_->Check();
    if (!check.config.ok()) return failed("network", check.config);
    if (check.dns_addr) dns_probe_ = std::thread([n = network_.get()] { n->ProbeDns(); });
  }
  return OkStatus();
}

Status EdgeServices::StartKinds() {
  container_opts_ = BackendOptions(cfg_, images_.get(), budgets_);
  if (cfg_.network) {
    container_opts_.network = [n = network_.get()] { return n->Get(); };
    container_opts_.nameserver = net::Ipv4ToString(cfg_.network_range.gateway());
  }
  auto backend = container::ContainerBackend::Create(container_opts_);
  if (!backend.ok())
    return Status(backend.status().code(), "container backend: " + backend.status().message());
  containers_ = std::move(*backend);
  DSEC_LOG_INFO("{}", containers_->Describe());
  microvms_ = StartMicrovms(cfg_, container_opts_, &no_microvms_);
  return OkStatus();
}

Status EdgeServices::StartManager() {
  timers_work_.emplace(boost::asio::make_work_guard(timers_));
  timer_thread_ = std::thread([this] { timers_.run(); });
  workers_.emplace(static_cast<size_t>(cfg_.worker_threads));
  std::vector<backends::Backend*> kinds = {containers_.get()};
  if (microvms_) kinds.push_back(microvms_.get());
  manager_ = std::make_unique<Manager>(cfg_, kinds, store_.get(), &metrics_);
  manager_->SetNodeBudget(budgets_.node);
  manager_->SetFileBudget(budgets_.files);
  auto recovered = manager_->Recover();
  if (!recovered.ok())
    return Status(recovered.status().code(), "recover: " + recovered.status().message());
  adopted_ = recovered->first;
  DSEC_LOG_INFO("recovered: adopted={} cleaned_up={}", recovered->first, recovered->second);
  std::vector<std::string> trajectory_holders;
  if (cfg_.trajectory_log) {
    if (!cfg_.trajectory_postgres.empty()) {
      // The cluster's: every node reads and writes the same database.
      auto ts =
          PgTrajectoryStore::Open(cfg_.trajectory_postgres, cfg_.trajectory_collect_grace_s * 1000);
      if (!ts.ok()) return Status(ts.status().code(), "trajectory log: " + ts.status().message());
      trajectory_store_ = std::move(*ts);
    } else {
      auto ts = SqliteTrajectoryStore::Open(JoinPath(cfg_.state_dir, "trajectories.db"),
                                            JoinPath(cfg_.state_dir, "trajectory-bodies"),
                                            cfg_.trajectory_fsync);
      if (!ts.ok()) return Status(ts.status().code(), "trajectory log: " + ts.status().message());
      trajectory_store_ = std::move(*ts);
    }
    TrajectoryOptions to;
    to.checkpoint_every = cfg_.trajectory_checkpoint_every;
    to.ttl_s = cfg_.trajectory_ttl_s;
    to.project_ttl_s = cfg_.trajectory_project_ttl;
    to.max_body_bytes = cfg_.trajectory_max_body_bytes;
    to.max_bytes = cfg_.trajectory_max_bytes;
    to.node = cfg_.node;
    trajectories_ = std::make_unique<Trajectories>(to, trajectory_store_.get(), manager_.get(),
                                                   images_.get(), nullptr);
    trajectories_->SetMetrics(&metrics_);
    trajectory_holders = trajectories_->Recover();
  }
  ReleaseLostLayers(*manager_, images_.get(), trajectory_holders);
  builds_ = std::make_unique<Builds>(cfg_, manager_.get(), images_.get());
  if (int n = builds_->CleanupLost(); n > 0)
    DSEC_LOG_INFO("deleted {} sandboxes of builds a previous edge left", n);
  // After Recover: a previous edge's pool workers are never adopted, only cleaned up.
  pools_ = std::make_unique<pools::PoolSet>(
      [this](backends::Kind k) -> backends::Backend* {
        if (k == backends::Kind::kMicrovm) return microvms_.get();
        return containers_.get();
      },
      cfg_.node);
  pools_->SetAdmission([m = manager_.get()](int64_t mb) { return m->AdmitPoolSandbox(mb); });
  pools_->SetWorkerMaxCalls(cfg_.fncall_worker_max_calls);
  manager_->SetPools(pools_.get());
  LoadPools(cfg_, containers_->features().userns, pools_.get(), store_.get(), images_.get());
  pools_->WaitWarm(30000);  // "ready" means the runtimes answer their first calls warm
  return OkStatus();
}

api::NodeFeatures EdgeServices::Features() const {
  api::NodeFeatures f;
  f.kernel = kernel_features_;
  f.microvm = MicrovmFeaturesOf(microvms_.get(), no_microvms_);
  f.network.enabled = cfg_.network;
  if (cfg_.network) f.network.info = network_->Describe();
  // Each kind this node serves, with what it can do: the table creates are checked against.
  f.kinds.emplace_back(backends::Kind::kContainer, containers_->Capabilities());
  if (microvms_) f.kinds.emplace_back(backends::Kind::kMicrovm, microvms_->Capabilities());
  return f;
}

Status EdgeServices::Serve() {
  idem_.emplace(store_.get(), cfg_.idempotency_max_records, cfg_.idempotency_max_age_s,
                cfg_.idempotency_max_body_bytes, cfg_.idempotency_max_total_bytes);
  Api::Deps deps;
  deps.cfg = cfg_;
  deps.manager = manager_.get();
  deps.backend = containers_.get();
  deps.idempotency = &*idem_;
  deps.metrics = &metrics_;
  deps.output_budget = output_budget_.get();
  deps.audit = audit_.get();
  deps.workers = &*workers_;
  deps.timers = &timers_;
  deps.pools = pools_.get();
  deps.store = store_.get();
  deps.images = images_.get();
  deps.builds = builds_.get();
  deps.trajectories = trajectories_.get();
  if (!cfg_.cluster_etcd.empty() && images_) {
    auto endpoints = etcd::ParseEndpoints(cfg_.cluster_etcd);  // checked by FinalizeConfig
    if (!endpoints.ok())
      return Status(endpoints.status().code(), "cluster: " + endpoints.status().message());
    cluster_images_ = std::make_unique<ClusterImages>(
        ClusterImagesOptions{
            .etcd = *endpoints,
            .node = cfg_.node,
            .token = tokens_.empty() ? std::string() : tokens_.front(),
            .cache_bytes = static_cast<uint64_t>(cfg_.cluster_layer_cache_mb) << 20,
            .max_serves = static_cast<int>(cfg_.cluster_layer_serves),
            .serve_bytes_per_s = static_cast<uint64_t>(cfg_.cluster_layer_serve_bytes_per_s)},
        images_.get(), &metrics_);
    deps.cluster_images = cluster_images_.get();
    if (builds_) builds_->SetCluster(cluster_images_.get());
    // A checkpoint's base images, on a node that resumes a trajectory another recorded.
    if (trajectories_)
      trajectories_->SetEnsureImages(
          [c = cluster_images_.get()](const std::string& project,
                                      const std::vector<std::string>& names) {
            return c->Ensure(project, names);
          });
  }
  deps.tokens = tokens_;
  deps.instance = containers_->instance_id();
  kernel_features_ = KernelFeaturesOf(*containers_);
  deps.features = [this] { return Features(); };
  api_.emplace(std::move(deps));
  if (trajectories_) trajectories_->SetApi(&*api_);

  http::HttpServerOptions ho = ServerOptions(cfg_, budgets_.files);
  if (Status s = MakeDirs(ho.spool_dir, 0700); !s.ok())
    return Status(s.code(), "spool dir: " + s.message());
  made_dirs_ = MakeSocketDir(cfg_.socket);
  http::HttpServerOptions api_opts = ho;
  // The connections the edge's descriptors allow are shared by its listeners: the API keeps
  // half when a compatibility listener runs beside it, and they split the other half.
  if (!cfg_.sandbox_fusion_listen.empty() || !cfg_.e2b_listen.empty())
    api_opts.max_connections = std::max(16, ho.max_connections / 2);
  auto server = http::HttpServer::Start(
      api_opts, [this](http::HttpRequest& r) { return api_->Check(r); },
      [this](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
        api_->Handle(std::move(r), std::move(res));
      });
  if (!server.ok()) return Status(server.status().code(), "serve: " + server.status().message());
  server_ = std::move(*server);
  serving_ = true;
  metrics_.SetNetworkDenied([n = network_.get()] {
    net::NodeNetwork* started = n->IfStarted();
    return started ? started->DeniedTotal() : 0;
  });
  api_->deps().connections = [s = server_.get()] { return s->connections(); };
  api_->deps().accepted = [s = server_.get()] { return s->tcp_accepted(); };
  api_->deps().proxy_io = &server_->io();
  manager_->StartReaper();
  DSEC_RETURN_IF_ERROR(StartCompatListeners(ho));

  // In a cluster: registered once serving, and gone from placement first at shutdown.
  if (!cfg_.cluster_etcd.empty()) {
    auto endpoints = etcd::ParseEndpoints(cfg_.cluster_etcd);  // checked by FinalizeConfig
    if (!endpoints.ok())
      return Status(endpoints.status().code(), "cluster: " + endpoints.status().message());
    membership_ = std::make_unique<cluster::Membership>(
        *endpoints, cfg_.cluster_lease_ttl_s,
        [this, instance = containers_->instance_id(), started_at = WallMs()] {
          return NodeRecordOf(cfg_, *manager_, *pools_, instance, started_at, e2b_server_.get(),
                              fusion_server_.get());
        },
        [this] { return manager_->Usage(); },
        [c = cluster_images_.get()] { return c ? c->HoldersText() : std::string(); });
    if (cluster_images_) cluster_images_->Start();
    membership_->Start();
  }
  housekeeper_ =
      std::thread([this] { Housekeep(done_, &*idem_, *output_budget_, trajectories_.get()); });
  return OkStatus();
}

// SandboxFusion's /run_code and the E2B-compatible API, each on its own listener when asked
// for, sharing half of the connections `ho` allows.
Status EdgeServices::StartCompatListeners(const http::HttpServerOptions& ho) {
  const int listeners = !cfg_.sandbox_fusion_listen.empty() + !cfg_.e2b_listen.empty();
  if (listeners == 0) return OkStatus();
  const int connections = std::max(16, ho.max_connections / 2 / listeners);
  if (!cfg_.sandbox_fusion_listen.empty()) {
    fusion_.emplace(SandboxFusion::Deps{.cfg = &cfg_,
                                        .manager = manager_.get(),
                                        .pools = pools_.get(),
                                        .images = images_.get(),
                                        .workers = &*workers_,
                                        .metrics = &metrics_,
                                        .audit = audit_.get(),
                                        .tokens = tokens_});
    auto fs = StartCompatServer(ho, cfg_.sandbox_fusion_listen, connections, &*fusion_);
    if (!fs.ok())
      return Status(fs.status().code(), "sandbox fusion listener: " + fs.status().message());
    fusion_server_ = std::move(*fs);
  }
  if (!cfg_.e2b_listen.empty()) {
    e2b_.emplace(E2b::Deps{.cfg = &cfg_,
                           .manager = manager_.get(),
                           .workers = &*workers_,
                           .timers = &timers_,
                           .metrics = &metrics_,
                           .audit = audit_.get(),
                           .tokens = tokens_});
    auto es = StartCompatServer(ho, cfg_.e2b_listen, connections, &*e2b_);
    if (!es.ok()) return Status(es.status().code(), "e2b listener: " + es.status().message());
    e2b_server_ = std::move(*es);
  }
  return OkStatus();
}

// One line on stdout when ready, for scripts.
void EdgeServices::Announce() const {
  std::string where = UrlOf(cfg_.listen, *server_);
  std::cout << "dsec-edge ready node=" << cfg_.node << " url=" << where << " socket=" << cfg_.socket
            << " adopted=" << adopted_ << " token_file=" << cfg_.token_file
            << (fusion_server_
                    ? " sandbox_fusion=" + UrlOf(cfg_.sandbox_fusion_listen, *fusion_server_)
                    : "")
            << (e2b_server_ ? " e2b=" + UrlOf(cfg_.e2b_listen, *e2b_server_) : "") << std::endl;
  DSEC_LOG_INFO("serving: url={} socket={} node={} state_dir={}", where, cfg_.socket, cfg_.node,
                cfg_.state_dir);
}

}  // namespace

int RunEdge(EdgeConfig cfg) {
  const bool persist = cfg.persist;
  EdgeServices edge(std::move(cfg));
  Status s = edge.Open();
  if (s.ok()) s = edge.StartKinds();
  if (s.ok()) s = edge.StartManager();
  if (s.ok()) s = edge.Serve();
  if (!s.ok()) {
    std::cerr << "dsec-edge: " << s.message() << "\n";
    return 1;  // what started stops as `edge` goes; adopted sandboxes stay for the next edge
  }
  edge.Announce();
  int sig = WaitForSignal();
  DSEC_LOG_INFO("signal {}: shutting down{}", sig, persist ? " (persist)" : "");
  return 0;  // everything stops as `edge` goes, in the reverse order of its start
}

}  // namespace dsec::edge
