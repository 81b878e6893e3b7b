#include "edge/config.h"

#include "api/ports_json.h"
#include "cluster/etcd.h"
#include "http/client.h"

#include "net/policy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>
#include <variant>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::edge {

namespace {

using Field = ConfigField;

// A config key: the member it sets, its unit ("" for none), a one-line description, what the
// default stands for when it is a placeholder (`""`, 0 or -1), and what FinalizeConfig or the
// backend accepts beyond the numeric bounds of kRanges.
struct Key {
  const char* name;
  Field field;
  const char* unit = nullptr;
  const char* doc = nullptr;
  const char* means = nullptr;
  const char* values = nullptr;
};

struct Group {
  const char* title;
  std::vector<Key> keys;
};

// Every config key, in the reference's groups and order. The one place a key is named: the
// config file, main.cc's flags and docs/config.md (dsec-edge --config-reference) all read it.
std::vector<Group> Fields(EdgeConfig* c) {
  return {
      {"Serving",
       {
           {"listen", &c->listen, "", "TCP `HOST:PORT` of the API (bearer-token auth); `\"\"`: off",
            nullptr, "`HOST:PORT` or `\"\"`"},
           {"socket", &c->socket, "",
            "Unix socket of the API (root only, no token); `\"\"`: off (not with `listen` off "
            "too)"},
           {"state_dir", &c->state_dir, "",
            "State directory: state DB, default token file, images, disks, audit log", nullptr,
            "absolute path"},
           {"token_file", &c->token_file, "",
            "Bearer tokens, one per line; created (0600) with a random token if missing",
            "`<state_dir>/token`"},
           {"node", &c->node, "", "Node name in sandbox ids (`sb-<node>-...`)",
            "the host name's letters and digits, lowercased", "1-24 lowercase letters and digits"},
           {"persist", &c->persist, "",
            "On SIGTERM leave sandboxes running for the next edge (false: destroy them)"},
           {"log_level", &c->log_level, "",
            "Log level on stderr: `trace`, `debug`, `info`, `warn` or `error`"},
       }},
      {"Admission and node budgets",
       {
           {"max_sandboxes", &c->max_sandboxes, "count",
            "Sandboxes at once, fncall workers and pooled sandboxes included; also sizes "
            "`RLIMIT_NOFILE` and `kernel.pty.max`"},
           {"memory_overcommit", &c->memory_overcommit, "ratio",
            "Sandboxes may ask for (node memory - `reserve_memory_mb`) x this much memory "
            "together, "
            "one sandbox for at most that"},
           {"reserve_memory_mb", &c->reserve_memory_mb, "MiB",
            "Memory kept out of the sandboxes' parent cgroup", "max(1 GiB, 10% of memory)"},
           {"node_sysctls", &c->node_sysctls, "",
            "Raise `fs.file-max`, `fs.aio-max-nr`, `kernel.pid_max` and `kernel.pty.max` at start "
            "(never lowered); false: leave host sysctls alone"},
           {"reserve_pids", &c->reserve_pids, "count",
            "Processes left to the host of min(`kernel.pid_max`, `threads-max`); all sandboxes "
            "together get the rest",
            "max(4096, 10% of that)"},
           {"pty_max_per_sandbox", &c->pty_max_per_sandbox, "count",
            "Pseudo-terminals each sandbox's devpts hands out"},
           {"sockets_per_mb", &c->sockets_per_mb, "per MiB",
            "Inet sockets one sandbox may hold per MiB of its memory limit, at least 256 (a cgroup "
            "BPF budget); 0: off"},
           {"uid_lock_file", &c->uid_lock_file, "",
            "Host-wide lease file of user-namespace uid ranges, shared by every edge on the host",
            nullptr, "absolute path"},
       }},
      {"Sandbox defaults and disks",
       {
           {"default_cpu", &c->defaults.cpu, "cores", "CPU cap of a sandbox created without one"},
           {"default_memory_mb", &c->defaults.memory_mb, "MiB",
            "Memory limit of a sandbox created without one"},
           {"default_pids", &c->defaults.pids, "count",
            "Processes and threads of a sandbox created without a limit"},
           {"default_disk_mb", &c->defaults.disk_mb, "MiB",
            "Writable layer of a sandbox created without a size"},
           {"tmpfs_disk_max_mb", &c->tmpfs_disk_max_mb, "MiB",
            "Writable layers up to this size are a tmpfs whose pages count as the sandbox's "
            "memory (its memory limit is then memory_mb + disk_mb); bigger ones, all at 0, are "
            "ext4 disk images in `disk_dir` and memory_mb is what the processes may use"},
           {"proc_views", &c->proc_views, "",
            "Sandboxes see their own memory (memory_mb as MemTotal) in /proc/meminfo and their "
            "own uptime, served by lxcfs (Debian: lxcfs) that the edge runs in "
            "`<state_dir>/lxcfs`; without lxcfs installed they see the node's"},
           {"disk_pool", &c->disk_pool, "count",
            "Disk images kept ready (made in the background) for each recently used disk size, "
            "so a create does not wait for one; 0: made at create"},
           {"disk_dir", &c->disk_dir, "",
            "Where disk images go; it needs room for what such sandboxes write",
            "`<state_dir>/disks`", "absolute path or `\"\"`"},
           {"disk_preallocate", &c->disk_preallocate, "",
            "Disk images take their whole size at create (no room: 429), so sandboxes never fill "
            "the host's disk; false: sparse (overcommitted)"},
           {"default_ttl_s", &c->default_ttl_s, "s",
            "Lifetime of a sandbox created without `ttl_s`"},
       }},
      {"Bounds on callers",
       {
           {"max_header_bytes", &c->max_header_bytes, "bytes", "Largest HTTP request head"},
           {"max_json_body_bytes", &c->max_json_body_bytes, "bytes",
            "Largest JSON request body (and an exec's `stdin`, an fncall's `code`)"},
           {"max_upload_bytes", &c->max_upload_bytes, "bytes",
            "Node-wide cap on a file or archive upload into a sandbox, which its `disk_mb` bounds "
            "anyway",
            "no cap beyond the sandbox's disk"},
           {"max_import_bytes", &c->max_import_bytes, "bytes",
            "Largest image archive (`POST /v1/images/import`)"},
           {"max_download_bytes", &c->max_download_bytes, "bytes",
            "Largest file read or archive out of a sandbox"},
           {"max_output_bytes", &c->max_output_bytes, "bytes",
            "Largest `max_output_bytes` an exec may ask for (per stream)"},
           {"max_execs_per_sandbox", &c->max_execs_per_sandbox, "count",
            "Execs and shell sessions running at once in one sandbox"},
           {"max_background_execs_kept", &c->max_background_execs_kept, "count",
            "Finished background execs remembered per sandbox; older ones are forgotten"},
           {"output_memory_mb", &c->output_memory_mb, "MiB",
            "Exec output the edge holds in memory, all sandboxes together; beyond, output is "
            "dropped and marked truncated",
            "max(256, node memory / 32)"},
           {"max_connections", &c->max_connections, "count",
            "Open HTTP connections (fewer when `RLIMIT_NOFILE` cannot hold them beside "
            "`max_sandboxes`)"},
           {"idle_timeout_s", &c->idle_timeout_s, "s",
            "A keep-alive connection with no request is closed after this"},
           {"max_count", &c->max_count, "count", "Largest `count` of one create"},
       }},
      {"Threads",
       {
           {"io_threads", &c->io_threads, "count", "HTTP I/O threads"},
           {"worker_threads", &c->worker_threads, "count",
            "Threads for blocking handlers (create, files)"},
           {"max_workers_per_sandbox", &c->max_workers_per_sandbox, "count",
            "Of `worker_threads`, the most one sandbox's requests hold at once (then 429)"},
           {"agent_io_threads", &c->agent_io_threads, "count",
            "I/O threads of each backend (container, microVM) for its agents' connections"},
       }},
      {"Idempotency records",
       {
           {"idempotency_max_records", &c->idempotency_max_records, "count",
            "Responses kept of requests with a `request_id` or `Idempotency-Key`"},
           {"idempotency_max_age_s", &c->idempotency_max_age_s, "s",
            "How long such a response is kept"},
           {"idempotency_max_body_bytes", &c->idempotency_max_body_bytes, "bytes",
            "Largest response kept; a bigger one is replaced by a 409 that says so"},
           {"idempotency_max_total_bytes", &c->idempotency_max_total_bytes, "bytes",
            "All kept responses together; the oldest go first beyond it"},
       }},
      {"Exec audit log",
       {
           {"audit_log", &c->audit_log, "",
            "One JSON line per exec, shell command and attach session, outside every sandbox",
            "`<state_dir>/audit/exec.log`"},
           {"audit_max_bytes", &c->audit_max_bytes, "bytes",
            "Size at which the log rotates (`exec.log` -> `exec.log.1` ...)"},
           {"audit_keep", &c->audit_keep, "count", "Rotated logs kept"},
       }},
      {"Sandbox lifecycle",
       {
           {"orphan_timeout_s", &c->orphan_timeout_s, "s",
            "How long sandboxes outlive a crashed edge, waiting to be re-adopted; -1: forever, 0: "
            "not "
            "at all"},
           {"reap_interval_ms", &c->reap_interval_ms, "ms",
            "How often expired, idle and failed sandboxes are looked for"},
           {"tombstone_ttl_s", &c->tombstone_ttl_s, "s",
            "A sandbox the node removed by itself (ttl, idle, failed, job, lost at a restart) "
            "answers 410 gone with the reason this long"},
           {"tombstone_max", &c->tombstone_max, "count",
            "Most such sandboxes remembered (the oldest go first); 0: none"},
       }},
      {"Trajectory log",
       {
           {"trajectory_log", &c->trajectory_log, "",
            "Keep the trajectory log (`<state_dir>/trajectories.db`): sandboxes created with "
            "`trajectory` record their calls, preempted jobs resume from it"},
           {"trajectory_checkpoint_every", &c->trajectory_checkpoint_every, "count",
            "Mutating calls between two checkpoints of a recording sandbox (a trajectory's own "
            "`checkpoint_every` overrides it); 0: only when its job is preempted"},
           {"trajectory_ttl_s", &c->trajectory_ttl_s, "s",
            "A trajectory is kept this long after its last use, then it and its bodies and "
            "checkpoints are collected"},
           {"trajectory_ttl_by_project", &c->trajectory_ttl_by_project, "",
            "Per project over `trajectory_ttl_s`: `\"project=seconds,...\"`"},
           {"trajectory_max_body_bytes", &c->trajectory_max_body_bytes, "bytes",
            "Largest request or response body a log keeps (a larger answer is not kept: that "
            "call runs live on a resume; a larger upload is refused)"},
           {"trajectory_max_bytes", &c->trajectory_max_bytes, "bytes",
            "All the bodies one trajectory keeps: past it, answers are not kept (those calls run "
            "live on a resume) and uploads are refused"},
           {"trajectory_fsync", &c->trajectory_fsync, "",
            "fsync each group commit of entries (a power loss keeps what was answered); false: "
            "an edge killed loses nothing, a power loss may"},
           {"trajectory_postgres", &c->trajectory_postgres, "",
            "A cluster's trajectory store: a libpq connection string (`host=... port=... "
            "dbname=... user=...`). Every edge of the cluster names the same database: entries, "
            "bodies and checkpoint layers live there, so a trajectory outlives the node that "
            "recorded it and any node resumes it. '' (default): the node's own SQLite log"},
           {"trajectory_collect_grace_s", &c->trajectory_collect_grace_s, "s",
            "With `trajectory_postgres`: a body or checkpoint layer no entry names is collected "
            "only once nothing touched it this long (another node may be about to name it)"},
       }},
      {"Container backend",
       {
           {"cgroup_mode", &c->cgroup_mode, "",
            "cgroup hierarchy: `auto` is v2 when its memory controller is there, else v1", nullptr,
            "`auto`, `v1`, `v2`"},
           {"userns", &c->userns, "",
            "User namespaces with idmapped image layers (fncall workers need them); false forces "
            "the fallback without (`--no-userns`)"},
           {"clone_into_cgroup", &c->clone_into_cgroup, "",
            "clone3(CLONE_INTO_CGROUP) where the kernel has it; false forces the fallback"},
           {"cgroup_kill", &c->cgroup_kill, "",
            "cgroup.kill where the kernel has it; false forces the fallback (freeze, kill each, "
            "thaw)"},
           {"netns_pool", &c->netns_pool, "count",
            "Loopback-only network namespaces kept for reuse; 0: a fresh one per sandbox"},
           {"agent_path", &c->agent_path, "", "The dsec-agent binary",
            "`$DSEC_AGENT_PATH`, else `dsec-agent` beside dsec-edge"},
           {"zygote_path", &c->zygote_path, "",
            "The dsec-zygote binary (fncall workers; without it the node has none)",
            "`$DSEC_ZYGOTE_PATH`, else `dsec-zygote` beside dsec-edge"},
       }},
      {"Images and builds",
       {
           {"image_layer_format", &c->image_layer_format, "",
            "How the image store (`<state_dir>/images`) stores new layers", nullptr,
            "`dir`, `erofs`"},
           {"image_max_layer_bytes", &c->image_max_layer_bytes, "bytes",
            "Largest layer (unpacked file content) an import, snapshot or build may make"},
           {"max_builds", &c->max_builds, "count",
            "Image builds (`POST /v1/images/build`) running at once; more wait in a queue"},
           {"build_mirror", &c->build_mirror, "", "The Debian mirror builds' mmdebstrap uses",
            "`deb.debian.org`", "`http://`, `https://` or `file://` URL, or `\"\"`"},
       }},
      {"Port proxy",
       {
           {"port_proxy_connect_timeout_ms", &c->port_proxy_connect_timeout_ms, "ms",
            "Longest a connect into a sandbox may take (then 504)"},
           {"port_proxy_max_conns", &c->port_proxy_max_conns, "count",
            "Proxied connections the node holds at once (then 429)"},
           {"port_proxy_max_conns_per_sandbox", &c->port_proxy_max_conns_per_sandbox, "count",
            "Proxied connections one sandbox holds at once (then 429)"},
           {"port_domain", &c->port_domain, "",
            "Host-based port URLs: Host `<port>-<sandbox id>.<port_domain>` reaches that port "
            "with absolute links working; signed URLs set a per-host cookie (its wildcard DNS "
            "must point at the edge)",
            "`\"\"` (off)", "a DNS name"},
       }},
      {"MicroVMs",
       {
           {"microvm", &c->microvm, "",
            "Serve kind `microvm` where QEMU and the guest kernel are there (scripts/install-deps "
            "fetches both); false, or either missing: 422"},
           {"microvm_accel", &c->microvm_accel, "", "QEMU's accelerator", nullptr,
            "`auto`, `kvm`, `tcg`"},
           {"microvm_kernel_dir", &c->microvm_kernel_dir, "", "Directory of the guest kernel"},
           {"microvm_image", &c->microvm_image, "",
            "The image of a microVM create that names none; when the store lacks it, the first "
            "such create starts its build (Debian bookworm with bash, coreutils and python3, "
            "from `build_mirror`) and such creates are 503 until it is made",
            nullptr, "an image name"},
           {"microvm_standby", &c->microvm_standby, "count",
            "Ready microVMs kept for each shape (image and limits, network none, the image's "
            "user, workdir and env) a create naming no pool asked for: the next such create "
            "takes one (~1 ms instead of a restore) and the pool `standby-<hash>` makes "
            "another; 0: none"},
           {"microvm_standby_expiry_s", &c->microvm_standby_expiry_s, "s",
            "A standby pool no create took from for this long is removed"},
       }},
      {"Sandbox networking",
       {
           {"network", &c->network, "",
            "Modes `allowlist` and `open`, set up at the first sandbox that needs one; false: "
            "every mode but `none` is 422"},
           {"network_cidr", &c->network_cidr, "",
            "Node-local sandbox addresses (a /32 each; the gateway is the first address)", nullptr,
            "IPv4 network, /8 to /28"},
           {"network_uplink", &c->network_uplink, "", "Interface sandbox traffic leaves by (NAT)",
            "the interface of the default route"},
           {"network_max_conns", &c->network_max_conns, "count", "Tracked connections per sandbox",
            nullptr, "at least 1"},
           {"network_new_conns_per_s", &c->network_new_conns_per_s, "per s",
            "New connections per second per sandbox (burst twice that)", nullptr, "at least 1"},
           {"network_bandwidth_mbit", &c->network_bandwidth_mbit, "Mbit/s",
            "Bandwidth of a container sandbox's network, each direction (a token bucket on "
            "each end of its veth); 0: no cap"},
           {"network_dns", &c->network_dns, "",
            "Upstream `a.b.c.d[:port]` of the sandboxes' DNS forwarder",
            "the first nameserver of `/etc/resolv.conf`"},
           {"network_dns_max_ttl_s", &c->network_dns_max_ttl_s, "s",
            "Longest an address from a DNS answer stays allowed (the answer's TTL, capped)"},
       }},
      {"Function calls",
       {
           {"fncall_pools", &c->fncall_pools, "",
            "Start the built-in `python` and `bash` runtimes (pools of warm workers)"},
           {"fncall_python_preload", &c->fncall_python_preload, "",
            "Modules each python worker imports once (comma-separated)"},
           {"fncall_min_idle", &c->fncall_min_idle, "count",
            "Idle workers a runtime keeps warm (built-in runtimes; default of new fncall pools)",
            nullptr, "at most `fncall_max`"},
           {"fncall_max", &c->fncall_max, "count",
            "Workers a runtime grows to while calls wait (built-in; default of new fncall pools)",
            "4 x cores, at least 8"},
           {"fncall_max_queue", &c->fncall_max_queue, "count",
            "Calls that may wait for a worker of a runtime; beyond, 429"},
           {"fncall_queue_timeout_ms", &c->fncall_queue_timeout_ms, "ms",
            "Longest a call waits for a worker (then 429)"},
           {"fncall_memory_mb", &c->fncall_memory_mb, "MiB",
            "Memory of a call: the default and the most a call may ask for"},
           {"fncall_worker_max_calls", &c->fncall_worker_max_calls, "count",
            "Calls after which a worker is replaced (they share what fork cannot renew: Python's "
            "hash secret); 0: never"},
       }},
      {"Cluster membership",
       {
           {"cluster_etcd", &c->cluster_etcd, "",
            "Register in etcd at `etcd://HOST:PORT[,HOST:PORT]` (the `--cluster` flag)",
            "not in a cluster"},
           {"cluster_advertise", &c->cluster_advertise, "",
            "The `http://HOST:PORT` apiservers reach this edge at",
            "`http://<listen>`, which must then not be a wildcard address"},
           {"cluster_lease_ttl_s", &c->cluster_lease_ttl_s, "s",
            "TTL of the etcd lease the edge registers under"},
           {"cluster_layer_cache_mb", &c->cluster_layer_cache_mb, "MiB",
            "Image layers fetched from other nodes kept here at most (least recently used "
            "images go first)"},
           {"cluster_layer_serves", &c->cluster_layer_serves, "",
            "Layer transfers to other nodes at once (more are refused: the peer tries another "
            "holder)"},
           {"cluster_layer_serve_bytes_per_s", &c->cluster_layer_serve_bytes_per_s, "B/s",
            "Pace of each layer transfer to another node", "unpaced"},
       }},
      {"SandboxFusion /run_code API",
       {
           {"sandbox_fusion_listen", &c->sandbox_fusion_listen, "",
            "`HOST:PORT` of SandboxFusion's `/run_code` API", "off", "`HOST:PORT` or `\"\"`"},
           {"sandbox_fusion_auth", &c->sandbox_fusion_auth, "",
            "`token`: a token of `token_file` as bearer token or first path segment; `none`: "
            "anyone who reaches the listener runs code",
            nullptr, "`token`, `none`"},
           {"sandbox_fusion_image", &c->sandbox_fusion_image, "",
            "Image of the fresh container sandbox of calls that do not run on the fncall runtime"},
           {"sandbox_fusion_pool", &c->sandbox_fusion_pool, "",
            "Container pool those calls take their sandbox from instead",
            "a fresh sandbox of `sandbox_fusion_image`"},
           {"sandbox_fusion_python_runtime", &c->sandbox_fusion_python_runtime, "",
            "fncall runtime of Python calls (without `fetch_files`, within its memory)"},
           {"sandbox_fusion_max_body_bytes", &c->sandbox_fusion_max_body_bytes, "bytes",
            "Largest request, its base64 files included"},
           {"sandbox_fusion_max_concurrent", &c->sandbox_fusion_max_concurrent, "count",
            "Calls running in sandboxes at once; more wait their turn (a bounded queue, then 429)"},
       }},
      {"E2B-compatible API",
       {
           {"e2b_listen", &c->e2b_listen, "",
            "`HOST:PORT` of E2B's control plane and envd; `E2B_API_KEY` is a token of `token_file`",
            "off", "`HOST:PORT` or `\"\"`"},
       }},
  };
}

// The numeric bounds FinalizeConfig checks, in the order it checks them (the reference shows
// them too).
struct KeyRange {
  const char* key;
  double lo, hi;
};
constexpr KeyRange kRanges[] = {
    {"max_sandboxes", 1, 1 << 20},
    {"microvm_standby", 0, 8},
    {"microvm_standby_expiry_s", 1, 30 * 86400.0},
    {"trajectory_checkpoint_every", 0, 1 << 20},
    {"trajectory_ttl_s", 1, 10 * 365 * 86400.0},
    {"trajectory_max_body_bytes", 1 << 10, 4e9},
    {"trajectory_max_bytes", 1 << 20, 1e12},
    {"trajectory_collect_grace_s", 0, 30 * 86400.0},
    {"cluster_lease_ttl_s", 2, 600},
    {"cluster_layer_cache_mb", 0, 1 << 30},
    {"cluster_layer_serves", 1, 1024},
    {"cluster_layer_serve_bytes_per_s", 0, 1e12},
    {"port_proxy_connect_timeout_ms", 1, 600000},
    {"port_proxy_max_conns", 1, 1 << 20},
    {"network_bandwidth_mbit", 0, 1000000},
    {"max_workers_per_sandbox", 1, 1 << 16},
    {"port_proxy_max_conns_per_sandbox", 1, 1 << 20},
    {"pty_max_per_sandbox", 1, 1 << 20},
    {"reserve_pids", -1, 1 << 22},
    {"sockets_per_mb", 0, 1024},
    {"output_memory_mb", 0, 1 << 20},
    {"fncall_worker_max_calls", 0, 1e9},
    {"memory_overcommit", 0.1, 1000},
    {"default_cpu", 0.01, 64},
    {"default_memory_mb", 16, 1 << 20},
    {"default_pids", 8, 1 << 22},
    {"default_disk_mb", 1, 1 << 20},
    {"tmpfs_disk_max_mb", 0, 1 << 20},
    {"disk_pool", 0, 256},
    {"default_ttl_s", 1, 2592000},
    {"max_header_bytes", 1024, 1 << 20},
    {"max_json_body_bytes", 1024, 1 << 30},
    {"max_execs_per_sandbox", 1, 4096},
    {"max_connections", 1, 1 << 20},
    {"io_threads", 1, 64},
    {"worker_threads", 1, 1024},
    {"agent_io_threads", 1, 64},
    {"max_count", 1, 4096},
    {"reap_interval_ms", 10, 60000},
    {"tombstone_ttl_s", 0, 2592000},
    {"tombstone_max", 0, 10000000},
    {"sandbox_fusion_max_concurrent", 1, 4096},
    {"orphan_timeout_s", -1, 1e9},
    {"idle_timeout_s", 1, 86400},
    {"network_dns_max_ttl_s", 1, 86400},
    {"fncall_min_idle", 0, 1024},
    {"fncall_max", 0, 4096},
    {"fncall_max_queue", 0, 1 << 20},
    {"fncall_queue_timeout_ms", 0, 600000},
    {"fncall_memory_mb", 16, 1 << 20},
    {"max_builds", 1, 64},
};

const Key* FindKey(const std::vector<Group>& groups, std::string_view name) {
  for (const Group& g : groups)
    for (const Key& k : g.keys)
      if (name == k.name) return &k;
  return nullptr;
}

// Edits (insertions, deletions, substitutions) that turn a into b.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The known key an unknown one most likely meant: the closest within a few edits, or "".
std::string ClosestKey(const std::vector<Group>& groups, const std::string& unknown) {
  std::string lower = unknown;
  for (char& ch : lower) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  const size_t max_edits = std::clamp<size_t>(lower.size() / 4, 1, 3);
  std::string best;
  size_t best_edits = max_edits + 1;
  for (const Group& g : groups) {
    for (const Key& k : g.keys) {
      // (At least the lengths' difference: a long key costs nothing.)
      size_t len = strlen(k.name);
      if (std::max(len, lower.size()) - std::min(len, lower.size()) > max_edits) continue;
      size_t d = EditDistance(lower, k.name);
      if (d < best_edits) {
        best_edits = d;
        best = k.name;
      }
    }
  }
  return best;
}

// Line and column (1-based, in bytes) of the character at offset in text.
std::pair<size_t, size_t> LineAndColumn(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, offset - line_start + 1};
}

// nlohmann's message without its prefixes ("[json.exception.parse_error.101] parse error at
// line 1, column 3: syntax error while parsing object key - ") and bounded.
std::string ShortParseError(std::string what) {
  if (size_t p = what.find("syntax error"); p != std::string::npos) what.erase(0, p);
  if (what.rfind("syntax error while parsing ", 0) == 0) {
    if (size_t p = what.find(" - "); p != std::string::npos) what.erase(0, p + 3);
  }
  if (what.size() > 160) what = what.substr(0, 157) + "...";
  return what;
}

Status SetField(const std::string& key, const nlohmann::json& v, Field f) {
  auto bad = [&](const char* want) {
    return InvalidArgument("config \"" + key + "\" must be " + want);
  };
  if (auto* s = std::get_if<std::string*>(&f)) {
    if (!v.is_string()) return bad("a string");
    **s = v.get<std::string>();
  } else if (auto* b = std::get_if<bool*>(&f)) {
    if (!v.is_boolean()) return bad("true or false");
    **b = v.get<bool>();
  } else if (auto* d = std::get_if<double*>(&f)) {
    if (!v.is_number()) return bad("a number");
    **d = v.get<double>();
  } else {
    if (!v.is_number_integer()) return bad("an integer");
    if (auto* i = std::get_if<int*>(&f)) {
      if (v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) return bad("in range");
      **i = v.get<int>();
    } else if (auto* i64 = std::get_if<int64_t*>(&f)) {
      **i64 = v.get<int64_t>();
    } else if (auto* u = std::get_if<uint64_t*>(&f)) {
      if (v.get<int64_t>() < 0) return bad("non-negative");
      **u = v.get<uint64_t>();
    }
  }
  return OkStatus();
}

std::string SanitizeNode(const std::string& raw) {
  std::string out;
  for (char c : raw) {
    if (isalnum(static_cast<unsigned char>(c))) out += static_cast<char>(tolower(c));
    if (out.size() == 24) break;
  }
  return out.empty() ? "node" : out;
}

const char* TypeName(const Field& f) {
  static constexpr const char* kNames[] = {"string", "bool", "int32", "int64", "uint64", "number"};
  static_assert(std::variant_size_v<Field> == std::size(kNames));
  return kNames[f.index()];
}

// A key's value as the reference shows it: `value`, with the size of a byte count in KiB, MiB
// or GiB when it is a whole one.
std::string RenderValue(const Field& f, const char* unit) {
  std::string v = std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return "\"" + *p + "\"";
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          return FormatNumber(*p);
        } else {
          return std::to_string(*p);
        }
      },
      f);
  std::string out = "`" + v + "`";
  if (const auto* u = std::get_if<uint64_t*>(&f); u && std::string_view(unit) == "bytes") {
    uint64_t n = **u;
    int shift = 30;
    for (const char* name : {"GiB", "MiB", "KiB"}) {
      if (n >= (uint64_t{1} << shift) && n % (uint64_t{1} << shift) == 0) {
        out += " (" + std::to_string(n >> shift) + " " + name + ")";
        break;
      }
      shift -= 10;
    }
  }
  return out;
}

// Text for a Markdown table cell: pipes escaped, and '<' outside code spans (a placeholder such
// as <state_dir> would be taken for an HTML tag).
std::string Cell(std::string_view s) {
  std::string out;
  bool code = false;
  for (char ch : s) {
    if (ch == '`') code = !code;
    if (ch == '|' || (ch == '<' && !code)) out += '\\';
    out += ch;
  }
  return out;
}

std::string Row(std::initializer_list<std::string_view> cells) {
  std::string out = "|";
  for (std::string_view c : cells) out += " " + Cell(c) + " |";
  return out + "\n";
}

}  // namespace

std::optional<ConfigField> ConfigFieldOf(EdgeConfig* c, std::string_view key) {
  std::vector<Group> groups = Fields(c);
  const Key* k = FindKey(groups, key);
  if (!k) return std::nullopt;
  return k->field;
}

const std::vector<EdgeFlag>& EdgeFlags() {
  static const std::vector<EdgeFlag> flags = {
      {"--config", "", "JSON config file: an object of the config keys; flags override it"},
      {"--listen", "listen", "TCP HOST:PORT (token auth); '' = off"},
      {"--socket", "socket", "Unix socket path (root only); '' = off"},
      {"--state-dir", "state_dir", "State directory"},
      {"--token-file", "token_file", "Bearer tokens, one per line; default <state-dir>/token"},
      {"--node", "node", "Node name in sandbox ids; default: the host name"},
      {"--persist", "persist", "On SIGTERM leave sandboxes running for the next edge"},
      {"--log-level", "log_level", "trace|debug|info|warn|error"},
      {"--max-sandboxes", "max_sandboxes", "Admission: sandboxes at once"},
      {"--memory-overcommit", "memory_overcommit", "Admission: memory overcommit ratio"},
      {"--agent", "agent_path",
       "dsec-agent binary; default: $DSEC_AGENT_PATH, else beside dsec-edge"},
      {"--cluster", "cluster_etcd", "Join a cluster: etcd://HOST:PORT[,HOST:PORT]"},
      {"--trajectory-postgres", "trajectory_postgres",
       "The cluster's trajectory store: a libpq connection string"},
      {"--sandbox-fusion-listen", "sandbox_fusion_listen",
       "Serve SandboxFusion's /run_code API on HOST:PORT; off by default"},
      {"--e2b-listen", "e2b_listen",
       "Serve the E2B-compatible API (control plane and envd) on HOST:PORT; off by default"},
      {"--no-userns", "", "Force the no-user-namespace fallback (config userns: false)"},
      {"--config-reference", "",
       "Print the reference of config keys, flags and environment variables (docs/config.md) "
       "and exit"},
  };
  return flags;
}

std::vector<ConfigKeyDoc> ConfigKeyDocs() {
  EdgeConfig defaults;
  std::vector<ConfigKeyDoc> out;
  for (const Group& g : Fields(&defaults)) {
    for (const Key& k : g.keys) {
      ConfigKeyDoc d;
      d.group = g.title;
      d.key = k.name;
      d.type = TypeName(k.field);
      d.default_value = RenderValue(k.field, k.unit ? k.unit : "");
      if (k.means) d.default_value += std::string(" (") + k.means + ")";
      d.unit = k.unit ? k.unit : "";
      for (const KeyRange& r : kRanges)
        if (d.key == r.key) d.range = FormatNumber(r.lo) + " to " + FormatNumber(r.hi);
      if (k.values) d.range += (d.range.empty() ? "" : "; ") + std::string(k.values);
      d.description = k.doc ? k.doc : "";
      out.push_back(std::move(d));
    }
  }
  return out;
}

std::string ConfigReference() {
  std::string md =
      "# dsec-edge configuration reference\n"
      "\n"
      "<!-- Generated by `dsec-edge --config-reference` from src/edge/config.cc: edit that, "
      "then regenerate this file (config_test fails while it differs). -->\n"
      "\n"
      "dsec-edge takes its settings from the defaults below, then the JSON config file "
      "(`--config FILE`, an object of the keys below), then its command-line flags, each "
      "overriding the one before. An unknown key, a value of the wrong type or a file that is "
      "not JSON stops the start with an error; so does a value outside its range, checked once "
      "everything is read.\n"
      "\n"
      "```json\n"
      "{\"listen\": \"10.0.1.5:7070\", \"max_sandboxes\": 2000, \"network_dns\": \"10.0.0.2\"}\n"
      "```\n"
      "\n"
      "## Command-line flags\n"
      "\n"
      "Also `--help` and `--version`.\n"
      "\n"
      "| flag | config key | default | description |\n"
      "|---|---|---|---|\n";
  std::vector<ConfigKeyDoc> keys = ConfigKeyDocs();
  for (const EdgeFlag& f : EdgeFlags()) {
    std::string key, dflt;
    for (const ConfigKeyDoc& k : keys) {
      if (k.key == f.key) {
        key = "`" + k.key + "`";
        dflt = k.default_value;
      }
    }
    md += Row({"`" + std::string(f.name) + "`", key, dflt, f.help});
  }
  md +=
      "\n"
      "## Environment variables\n"
      "\n"
      "| variable | used for |\n"
      "|---|---|\n";
  md += Row({"`DSEC_AGENT_PATH`", "The dsec-agent binary when `agent_path` is `\"\"`"});
  md += Row({"`DSEC_ZYGOTE_PATH`", "The dsec-zygote binary when `zygote_path` is `\"\"`"});
  md += Row({"`PATH`",
             "Where the programs the edge runs are found: `qemu-system-x86_64` (microVMs), "
             "`mmdebstrap` (image builds), `mkfs.ext4` (disk images), `mkfs.erofs` (erofs "
             "layers)"});
  md +=
      "\n"
      "## Config file keys\n"
      "\n"
      "Types: `int32` and `int64` are JSON integers of that range, `uint64` non-negative ones, "
      "`number` any JSON number. A default in parentheses says what the placeholder value "
      "stands for. Ranges are inclusive.\n";
  std::string group;
  for (const ConfigKeyDoc& k : keys) {
    if (k.group != group) {
      group = k.group;
      md += "\n### " + group +
            "\n\n"
            "| key | type | default | unit | range | description |\n"
            "|---|---|---|---|---|---|\n";
    }
    md += Row({"`" + k.key + "`", k.type, k.default_value, k.unit, k.range, k.description});
  }
  return md;
}

Status LoadConfigFile(const std::string& path, EdgeConfig* cfg) {
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts the characters read, the one that failed included.
    auto [line, column] = LineAndColumn(text, e.byte > 0 ? e.byte - 1 : 0);
    return InvalidArgument("config file \"" + path + "\": JSON syntax error at line " +
                           std::to_string(line) + ", column " + std::to_string(column) + ": " +
                           ShortParseError(e.what()));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("config file \"" + path + "\": " + ShortParseError(e.what()));
  }
  if (!j.is_object()) return InvalidArgument("config file \"" + path + "\" is not a JSON object");
  auto groups = Fields(cfg);
  for (const auto& item : j.items()) {
    // (Not a structured binding: clang 14, the fuzz build's compiler, cannot capture those.)
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    const Key* k = FindKey(groups, key);
    if (!k) {
      std::string near = ClosestKey(groups, key);
      return InvalidArgument("config file: unknown key \"" + key + "\"" +
                             (near.empty() ? "" : " (did you mean \"" + near + "\"?)"));
    }
    DSEC_RETURN_IF_ERROR(SetField(key, value, k->field));
  }
  return OkStatus();
}

Status FinalizeConfig(EdgeConfig* c) {
  if (c->state_dir.empty() || c->state_dir[0] != '/')
    return InvalidArgument("--state-dir must be an absolute path");
  if (c->token_file.empty()) c->token_file = JoinPath(c->state_dir, "token");
  if (c->audit_log.empty()) c->audit_log = JoinPath(c->state_dir, "audit/exec.log");
  if (c->node.empty()) {
    char host[256] = {};
    (void)gethostname(host, sizeof host - 1);
    c->node = SanitizeNode(host);
  } else if (SanitizeNode(c->node) != c->node) {
    return InvalidArgument("node name must be 1-24 lowercase letters and digits");
  }
  if (!c->listen.empty()) {
    std::string h;
    uint16_t p;
    DSEC_RETURN_IF_ERROR(ParseHostPort(c->listen, &h, &p));
  }
  if (c->listen.empty() && c->socket.empty())
    return InvalidArgument("nothing to serve: both --listen and --socket are empty");
  if (c->fncall_max == 0)
    c->fncall_max = std::max<int>(8, 4 * static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (c->fncall_min_idle > c->fncall_max)
    return InvalidArgument("fncall_min_idle must not exceed fncall_max");
  if (c->uid_lock_file.empty() || c->uid_lock_file[0] != '/')
    return InvalidArgument("uid_lock_file must be an absolute path");
  if (!c->disk_dir.empty() && c->disk_dir[0] != '/')
    return InvalidArgument("disk_dir must be an absolute path");
  auto layer_format = images::ParseLayerFormat(c->image_layer_format);
  if (!layer_format.ok())
    return InvalidArgument("image_layer_format must be dir or erofs, not \"" +
                           c->image_layer_format + "\"");
  c->layer_format = *layer_format;
  if (!c->build_mirror.empty() && c->build_mirror.rfind("http://", 0) != 0 &&
      c->build_mirror.rfind("https://", 0) != 0 && c->build_mirror.rfind("file://", 0) != 0)
    return InvalidArgument("build_mirror must be an http://, https:// or file:// URL");
  DSEC_ASSIGN_OR_RETURN(c->network_range, net::ParseSandboxRange(c->network_cidr));
  DSEC_ASSIGN_OR_RETURN(c->cgroup, isolation::ParseCgroupMode(c->cgroup_mode));
  if (c->network_max_conns < 1 || c->network_new_conns_per_s < 1)
    return InvalidArgument("network_max_conns and network_new_conns_per_s must be at least 1");
  DSEC_ASSIGN_OR_RETURN(c->accel, backends::microvm::ParseAccel(c->microvm_accel));
  if (auto n = images::NormalizeName(c->microvm_image); n.ok() && c->microvm_image != "host")
    c->microvm_image = *n;
  else
    return InvalidArgument("microvm_image must be an image name (not host), not \"" +
                           c->microvm_image + "\"");
  auto groups = Fields(c);
  for (const KeyRange& r : kRanges) {
    const Key* k = FindKey(groups, r.key);
    std::optional<double> v;
    if (k) {
      std::visit(
          [&](auto* p) {
            if constexpr (std::is_arithmetic_v<std::remove_pointer_t<decltype(p)>> &&
                          !std::is_same_v<decltype(p), bool*>)
              v = static_cast<double>(*p);
          },
          k->field);
    }
    if (!v) return InternalError(std::string("no numeric config key ") + r.key + " for its range");
    if (!(*v >= r.lo && *v <= r.hi))
      return InvalidArgument(std::string(r.key) + " must be between " + FormatNumber(r.lo) +
                             " and " + FormatNumber(r.hi));
  }
  if (!c->port_domain.empty()) {
    for (char& ch : c->port_domain)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (Status s = api::ValidatePortDomain(c->port_domain); !s.ok())
      return InvalidArgument("port_domain: " + s.message());
  }
  if (!c->cluster_etcd.empty()) {
    DSEC_RETURN_IF_ERROR(etcd::ParseEndpoints(c->cluster_etcd).status());
    if (c->cluster_advertise.empty()) {
      std::string host;
      uint16_t port = 0;
      if (c->listen.empty() || !ParseHostPort(c->listen, &host, &port).ok() || port == 0 ||
          host == "0.0.0.0" || host == "::" || host.empty())
        return InvalidArgument(
            "in a cluster (cluster_etcd) the edge needs cluster_advertise, the http://HOST:PORT "
            "apiservers reach it at (listen \"" +
            c->listen + "\" does not name one)");
      c->cluster_advertise = "http://" + c->listen;
    }
    std::string host;
    uint16_t port = 0;
    if (Status s = http::ParseHttpUrl(c->cluster_advertise, &host, &port); !s.ok())
      return InvalidArgument("cluster_advertise: " + s.message());
  }
  c->trajectory_project_ttl.clear();
  for (auto part : SplitString(c->trajectory_ttl_by_project, ',', /*skip_empty=*/true)) {
    auto eq = part.find('=');
    auto secs = eq == std::string_view::npos ? std::nullopt : ParseInt64(part.substr(eq + 1));
    if (!secs || *secs < 1 || !api::IsDnsLabel(part.substr(0, eq)))
      return InvalidArgument(
          "trajectory_ttl_by_project must be \"project=seconds,...\" (at least 1 s each), not \"" +
          c->trajectory_ttl_by_project + "\"");
    c->trajectory_project_ttl[std::string(part.substr(0, eq))] = *secs;
  }
  if (c->sandbox_fusion_auth != "token" && c->sandbox_fusion_auth != "none")
    return InvalidArgument("sandbox_fusion_auth must be \"token\" or \"none\", not \"" +
                           c->sandbox_fusion_auth + "\"");
  if (!c->e2b_listen.empty()) {
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(c->e2b_listen, &host, &port); !s.ok())
      return InvalidArgument("e2b_listen: " + s.message());
  }
  if (!c->sandbox_fusion_listen.empty()) {
    std::string host;
    uint16_t port = 0;
    if (Status s = ParseHostPort(c->sandbox_fusion_listen, &host, &port); !s.ok())
      return InvalidArgument("sandbox_fusion_listen: " + s.message());
  }
  return OkStatus();
}

}  // namespace dsec::edge
