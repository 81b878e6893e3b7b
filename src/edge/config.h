// dsec-edge configuration: defaults, then a JSON config file, then command-line flags.
// Every bound the daemon enforces on callers lives here so it can be tuned per node.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backends/microvm/qemu_cmd.h"
#include "base/resources.h"
#include "base/status.h"
#include "http/server.h"
#include "images/store.h"
#include "isolation/cgroup.h"
#include "net/ruleset.h"

namespace dsec::edge {

struct EdgeConfig {
  // Where it serves. An empty listen or socket turns that side off.
  std::string listen = "127.0.0.1:7070";
  std::string socket = "/run/dsec/edge.sock";  // root-only, no token
  std::string state_dir = "/var/lib/dsec/edge";
  std::string token_file;  // default <state_dir>/token, created (0600) if missing
  std::string config_file;
  std::string node;      // node name in sandbox ids; default: the host name
  bool persist = false;  // on SIGTERM leave sandboxes running for the next edge
  std::string log_level = "info";

  // Admission.
  int64_t max_sandboxes = 4096;
  double memory_overcommit = 8.0;
  int64_t reserve_memory_mb = -1;  // kept out of the parent cgroup; -1: max(1 GiB, 10%)
  // Node-wide kernel budgets (edge/node_budget.h): raise fs.file-max, kernel.pid_max and
  // kernel.pty.max at start (never lowered); the processes all sandboxes may hold together
  // leave reserve_pids (-1: max(4096, 10%)) of min(pid_max, threads-max) to the host; each
  // sandbox's devpts hands out at most pty_max_per_sandbox pseudo-terminals.
  bool node_sysctls = true;
  int64_t reserve_pids = -1;
  int pty_max_per_sandbox = 256;
  // Inet sockets one sandbox may hold: this many per MiB of its memory limit, at least 256
  // (a cgroup BPF budget; 0: off). Bounds the socket memory the kernel lets escape the memory
  // cgroup (forced segments, connections not yet accepted).
  int sockets_per_mb = 4;
  // Host-wide lease file of user-namespace uid ranges, shared by every edge on the host.
  std::string uid_lock_file = "/run/dsec/uid-ranges.lock";

  // Defaults for new sandboxes (config keys default_cpu, default_memory_mb, default_pids and
  // default_disk_mb).
  Resources defaults;
  // Writable layers of up to this many MB are a tmpfs charged to the sandbox's memory (memory
  // limit = memory_mb + disk_mb); bigger ones (all, at 0) are ext4 disk images in disk_dir
  // ("" = <state_dir>/disks), which must have room for what such sandboxes write.
  int64_t tmpfs_disk_max_mb = 0;
  // Disk images kept ready for each recently used size, so a create does not make one.
  int64_t disk_pool = 4;
  // Sandboxes see their memory limit in /proc/meminfo (and their own uptime) through lxcfs,
  // when it is installed.
  bool proc_views = true;
  std::string disk_dir;
  // Disk images take their whole size on disk_dir's filesystem at create (a node without room
  // answers 429), so sandboxes can never fill the host's disk; false: sparse (overcommitted).
  bool disk_preallocate = true;
  int64_t default_ttl_s = 3600;

  // Bounds on callers.
  uint64_t max_header_bytes = 16 << 10;
  uint64_t max_json_body_bytes = 1 << 20;
  // File and archive uploads into a sandbox are bounded by its disk (disk_mb); this caps them
  // node-wide (0: no cap beyond the disk).
  uint64_t max_upload_bytes = 0;
  uint64_t max_import_bytes = 2ull << 30;      // image archives (POST /v1/images/import)
  uint64_t max_download_bytes = 256ull << 20;  // file reads and archives
  uint64_t max_output_bytes = 256ull << 20;    // per stream per exec
  int max_execs_per_sandbox = 64;
  int max_background_execs_kept = 256;  // finished ones are forgotten beyond this, per sandbox
  // Exec output the edge holds in memory at once, all sandboxes together (results being
  // collected, background results kept); past it output is dropped and marked truncated.
  // 0: max(256, node memory / 32) MiB.
  int64_t output_memory_mb = 0;
  int max_connections = 16384;
  int idle_timeout_s = 120;  // keep-alive connections with no request
  int max_count = 256;       // "count" on create

  // Threads.
  int io_threads = 2;       // HTTP
  int worker_threads = 64;  // blocking handlers (create, files)
  int agent_io_threads = 1;

  // Idempotency records.
  int64_t idempotency_max_records = 100000;
  int64_t idempotency_max_age_s = 86400;
  uint64_t idempotency_max_body_bytes = 8 << 20;
  uint64_t idempotency_max_total_bytes = 1ull << 30;  // all recorded bodies together

  // Exec audit log (outside every sandbox).
  std::string audit_log;  // default <state_dir>/audit/exec.log
  uint64_t audit_max_bytes = 64ull << 20;
  int audit_keep = 4;

  // Sandboxes outlive a crashed edge this long, waiting to be re-adopted.
  int64_t orphan_timeout_s = 3600;
  int reap_interval_ms = 500;
  // Sandboxes the node removed by itself (ttl, idle, failed, job, lost at a restart) answer
  // 410 gone with the reason and time for tombstone_ttl_s; at most tombstone_max are kept.
  int64_t tombstone_ttl_s = 3600;
  int64_t tombstone_max = 65536;

  // The trajectory log (edge/trajectory.h).
  bool trajectory_log = true;
  int64_t trajectory_checkpoint_every = 20;
  int64_t trajectory_ttl_s = 7 * 86400;
  std::string trajectory_ttl_by_project;                  // "project=seconds,..."
  std::map<std::string, int64_t> trajectory_project_ttl;  // (parsed from the above)
  uint64_t trajectory_max_body_bytes = 16 << 20;
  uint64_t trajectory_max_bytes = 1ull << 30;
  bool trajectory_fsync = true;
  std::string trajectory_postgres;  // a cluster's store (libpq conninfo); "": the node's own
  int64_t trajectory_collect_grace_s = 600;

  // Container backend.
  std::string cgroup_mode = "auto";
  isolation::CgroupMode cgroup = isolation::CgroupMode::kAuto;  // cgroup_mode, parsed
  bool userns = true;             // false forces the no-user-namespace fallback
  bool clone_into_cgroup = true;  // false forces the fallback
  bool cgroup_kill = true;        // false forces the fallback
  int netns_pool = 256;
  // Image store (<state_dir>/images): how new layers are stored, "dir" or "erofs".
  std::string image_layer_format = "dir";
  images::LayerFormat layer_format = images::LayerFormat::kDir;  // image_layer_format, parsed
  // Largest layer (bytes of unpacked file content) an import, snapshot or build may make.
  uint64_t image_max_layer_bytes = 16ull << 30;
  // Image builds (POST /v1/images/build): how many run at once (more wait in a queue), and
  // the Debian mirror mmdebstrap uses ("" = deb.debian.org).
  int max_builds = 2;
  std::string build_mirror;
  // The port proxy (http/relay.h): how long a connect into a sandbox may take (then 504), and
  // how many proxied connections the node and one sandbox may hold at once (then 429).
  int64_t port_proxy_connect_timeout_ms = 5000;
  int port_proxy_max_conns = 1024;
  int port_proxy_max_conns_per_sandbox = 64;
  // Host-based port URLs: a request whose Host is "<port>-<sandbox id>.<port_domain>" goes to
  // that port as a whole (absolute links work), authenticated by a per-host cookie that a
  // signed URL sets ("" = off; the domain's wildcard must resolve to the edge).
  std::string port_domain;
  // Worker threads one sandbox's requests may hold at once (of worker_threads; then 429).
  int max_workers_per_sandbox = 16;
  std::string agent_path;  // default: dsec-agent beside dsec-edge
  // MicroVM sandboxes (kind "microvm"), served when QEMU and the guest kernel are there
  // (scripts/install-deps fetches both); off, or missing either, kind microvm is 422.
  bool microvm = true;
  std::string microvm_accel = "auto";                                // auto | kvm | tcg
  backends::microvm::Accel accel = backends::microvm::Accel::kAuto;  // microvm_accel, parsed
  std::string microvm_kernel_dir = "/var/cache/dsec/guest-kernel/current";
  // The image of a microVM create that names none: made by the image builder at its first use
  // (Debian bookworm with bash, coreutils and python3) when the store lacks it.
  std::string microvm_image = "dsec-microvm:bookworm";
  // Ready microVMs the edge keeps for each shape (image, limits) that creates naming no pool
  // asked for lately (0: none): an automatic pool ("standby-<hash>"), removed when no create
  // of that shape came for microvm_standby_expiry_s.
  int microvm_standby = 1;
  int64_t microvm_standby_expiry_s = 600;
  std::string zygote_path;  // default: dsec-zygote beside dsec-edge

  // Sandbox networking (net/node_network.h): modes allowlist and open. Set up at the first
  // sandbox that needs it (nothing changes on the host before) and removed at shutdown.
  bool network = true;
  std::string network_cidr = "10.213.0.0/16";  // node-local sandbox addresses
  net::Ipv4Net network_range{0x0ad50000, 16};  // network_cidr, parsed (by FinalizeConfig)
  std::string network_uplink;                  // "" = the interface of the default route
  int network_max_conns = 1024;                // tracked connections per sandbox
  int network_new_conns_per_s = 200;           // new connections per second per sandbox
  int network_bandwidth_mbit = 0;  // per sandbox and direction (tc tbf on its veth); 0: none
  std::string network_dns;  // the forwarder's upstream "a.b.c.d[:port]"; "" = /etc/resolv.conf
  // An address from a DNS answer stays allowed for the answer's TTL, at most this long (1 to
  // 86400): names move between addresses others then own.
  int network_dns_max_ttl_s = 3600;

  // Function calls: the built-in "python" and "bash" runtimes (pools of warm workers; more
  // pools come from PUT /v1/pools and are kept in the state DB).
  bool fncall_pools = true;
  std::string fncall_python_preload =
      "json,math,re,collections,itertools,functools,random,string,typing,dataclasses,heapq,"
      "bisect,fractions,decimal,statistics,operator,copy,traceback,io,os,sys,time,datetime";
  int fncall_min_idle = 2;
  int fncall_max = 0;  // 0: 4 x cores, at least 8
  int fncall_max_queue = 256;
  int64_t fncall_queue_timeout_ms = 10000;
  int64_t fncall_memory_mb = 512;
  // An fncall worker is replaced after this many calls (0: never): its calls are forked from
  // one warm interpreter and share what fork cannot renew (Python's hash secret).
  int64_t fncall_worker_max_calls = 256;

  // Cluster membership (edge/membership.h): with cluster_etcd set ("etcd://h:p[,h:p]", the
  // --cluster flag), the edge registers in etcd under a lease of cluster_lease_ttl_s seconds,
  // with cluster_advertise as the URL apiservers reach it at ("" = http://<listen>, which must
  // then not be a wildcard address).
  std::string cluster_etcd;
  std::string cluster_advertise;
  int64_t cluster_lease_ttl_s = 5;
  // Images across the cluster (edge/cluster_images.h): the layers this node fetched from its
  // peers are kept up to this many MiB (least recently used go first); at most
  // cluster_layer_serves layer transfers to peers at once, each paced to
  // cluster_layer_serve_bytes_per_s (0: unpaced).
  int64_t cluster_layer_cache_mb = 20480;
  int64_t cluster_layer_serves = 4;
  int64_t cluster_layer_serve_bytes_per_s = 0;

  // SandboxFusion's /run_code API (edge/sandbox_fusion.h) on its own listener ("" = off).
  // Callers authenticate with a token of token_file, as a bearer token or as the first path
  // segment ("http://HOST:PORT/TOKEN/run_code", for clients that only take a URL, like verl's
  // sandbox_fusion_url); sandbox_fusion_auth "none" lets anyone who reaches the listener run
  // code. Python runs on the fncall runtime sandbox_fusion_python_runtime; every other language
  // (and python with fetch_files or more memory than that runtime's) in a fresh container
  // sandbox of sandbox_fusion_image, or one taken from the container pool sandbox_fusion_pool.
  std::string sandbox_fusion_listen;
  std::string sandbox_fusion_auth = "token";
  std::string sandbox_fusion_image = "host";
  std::string sandbox_fusion_pool;
  std::string sandbox_fusion_python_runtime = "python";
  uint64_t sandbox_fusion_max_body_bytes = 16 << 20;  // a request with its base64 files
  int sandbox_fusion_max_concurrent = 16;  // calls running in sandboxes at once (more: 429)

  // The E2B-compatible API (edge/e2b.h) on its own listener ("" = off): E2B_API_URL and
  // E2B_SANDBOX_URL point at it, E2B_API_KEY is a token of token_file.
  std::string e2b_listen;
};

// Reads the JSON config file into cfg (unknown keys and wrong types are errors; an unknown key
// close to a known one names it, a syntax error its line and column).
Status LoadConfigFile(const std::string& path, EdgeConfig* cfg);
// Fills derived defaults (token file, audit log, node name) and checks ranges.
Status FinalizeConfig(EdgeConfig* cfg);

// The member of *c a config key names (nullopt for an unknown key), for code that sets keys by
// name: main.cc's flags.
using ConfigField = std::variant<std::string*, bool*, int*, int64_t*, uint64_t*, double*>;
std::optional<ConfigField> ConfigFieldOf(EdgeConfig* c, std::string_view key);

// A command-line flag of dsec-edge. One with a config key sets that key (main.cc adds it to the
// command line with the key's type and default); the others main.cc handles by name.
struct EdgeFlag {
  std::string_view name;  // "--listen"
  std::string_view key;   // "listen"; "" for a flag of its own
  std::string_view help;
};
const std::vector<EdgeFlag>& EdgeFlags();

// One config key as the reference shows it.
struct ConfigKeyDoc {
  std::string group, key, type, default_value, unit, range, description;
};
std::vector<ConfigKeyDoc> ConfigKeyDocs();
// Every config key, flag and environment variable of dsec-edge as Markdown: what
// `dsec-edge --config-reference` prints and docs/config.md holds.
std::string ConfigReference();
using http::ParseHostPort;

}  // namespace dsec::edge
