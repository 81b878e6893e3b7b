#include "edge/config.h"

#include "cluster/etcd.h"
#include "http/client.h"

#include "net/policy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <variant>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::edge {

namespace {

using Field = std::variant<std::string*, bool*, int*, int64_t*, uint64_t*, double*>;

std::vector<std::pair<const char*, Field>> Fields(EdgeConfig* c) {
  return {
      {"listen", &c->listen},
      {"socket", &c->socket},
      {"state_dir", &c->state_dir},
      {"token_file", &c->token_file},
      {"node", &c->node},
      {"cluster_etcd", &c->cluster_etcd},
      {"cluster_advertise", &c->cluster_advertise},
      {"cluster_lease_ttl_s", &c->cluster_lease_ttl_s},
      {"sandbox_fusion_listen", &c->sandbox_fusion_listen},
      {"sandbox_fusion_auth", &c->sandbox_fusion_auth},
      {"sandbox_fusion_image", &c->sandbox_fusion_image},
      {"sandbox_fusion_pool", &c->sandbox_fusion_pool},
      {"sandbox_fusion_python_runtime", &c->sandbox_fusion_python_runtime},
      {"sandbox_fusion_max_body_bytes", &c->sandbox_fusion_max_body_bytes},
      {"sandbox_fusion_max_concurrent", &c->sandbox_fusion_max_concurrent},
      {"e2b_listen", &c->e2b_listen},
      {"persist", &c->persist},
      {"log_level", &c->log_level},
      {"max_sandboxes", &c->max_sandboxes},
      {"memory_overcommit", &c->memory_overcommit},
      {"reserve_memory_mb", &c->reserve_memory_mb},
      {"node_sysctls", &c->node_sysctls},
      {"reserve_pids", &c->reserve_pids},
      {"pty_max_per_sandbox", &c->pty_max_per_sandbox},
      {"uid_lock_file", &c->uid_lock_file},
      {"sockets_per_mb", &c->sockets_per_mb},
      {"default_cpu", &c->defaults.cpu},
      {"default_memory_mb", &c->defaults.memory_mb},
      {"default_pids", &c->defaults.pids},
      {"default_disk_mb", &c->defaults.disk_mb},
      {"tmpfs_disk_max_mb", &c->tmpfs_disk_max_mb},
      {"disk_dir", &c->disk_dir},
      {"disk_preallocate", &c->disk_preallocate},
      {"default_ttl_s", &c->default_ttl_s},
      {"max_header_bytes", &c->max_header_bytes},
      {"max_json_body_bytes", &c->max_json_body_bytes},
      {"max_upload_bytes", &c->max_upload_bytes},
      {"max_import_bytes", &c->max_import_bytes},
      {"max_download_bytes", &c->max_download_bytes},
      {"max_output_bytes", &c->max_output_bytes},
      {"max_execs_per_sandbox", &c->max_execs_per_sandbox},
      {"max_background_execs_kept", &c->max_background_execs_kept},
      {"output_memory_mb", &c->output_memory_mb},
      {"max_connections", &c->max_connections},
      {"idle_timeout_s", &c->idle_timeout_s},
      {"max_count", &c->max_count},
      {"io_threads", &c->io_threads},
      {"worker_threads", &c->worker_threads},
      {"agent_io_threads", &c->agent_io_threads},
      {"idempotency_max_records", &c->idempotency_max_records},
      {"idempotency_max_age_s", &c->idempotency_max_age_s},
      {"idempotency_max_body_bytes", &c->idempotency_max_body_bytes},
      {"idempotency_max_total_bytes", &c->idempotency_max_total_bytes},
      {"audit_log", &c->audit_log},
      {"audit_max_bytes", &c->audit_max_bytes},
      {"audit_keep", &c->audit_keep},
      {"orphan_timeout_s", &c->orphan_timeout_s},
      {"reap_interval_ms", &c->reap_interval_ms},
      {"tombstone_ttl_s", &c->tombstone_ttl_s},
      {"tombstone_max", &c->tombstone_max},
      {"cgroup_mode", &c->cgroup_mode},
      {"userns", &c->userns},
      {"clone_into_cgroup", &c->clone_into_cgroup},
      {"cgroup_kill", &c->cgroup_kill},
      {"netns_pool", &c->netns_pool},
      {"image_layer_format", &c->image_layer_format},
      {"image_max_layer_bytes", &c->image_max_layer_bytes},
      {"max_builds", &c->max_builds},
      {"build_mirror", &c->build_mirror},
      {"port_proxy_connect_timeout_ms", &c->port_proxy_connect_timeout_ms},
      {"port_proxy_max_conns", &c->port_proxy_max_conns},
      {"port_proxy_max_conns_per_sandbox", &c->port_proxy_max_conns_per_sandbox},
      {"max_workers_per_sandbox", &c->max_workers_per_sandbox},
      {"agent_path", &c->agent_path},
      {"microvm", &c->microvm},
      {"microvm_accel", &c->microvm_accel},
      {"microvm_kernel_dir", &c->microvm_kernel_dir},
      {"zygote_path", &c->zygote_path},
      {"network", &c->network},
      {"network_cidr", &c->network_cidr},
      {"network_uplink", &c->network_uplink},
      {"network_dns", &c->network_dns},
      {"network_dns_max_ttl_s", &c->network_dns_max_ttl_s},
      {"network_max_conns", &c->network_max_conns},
      {"network_new_conns_per_s", &c->network_new_conns_per_s},
      {"fncall_pools", &c->fncall_pools},
      {"fncall_python_preload", &c->fncall_python_preload},
      {"fncall_min_idle", &c->fncall_min_idle},
      {"fncall_max", &c->fncall_max},
      {"fncall_max_queue", &c->fncall_max_queue},
      {"fncall_queue_timeout_ms", &c->fncall_queue_timeout_ms},
      {"fncall_memory_mb", &c->fncall_memory_mb},
      {"fncall_worker_max_calls", &c->fncall_worker_max_calls},
  };
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

}  // namespace

Status LoadConfigFile(const std::string& path, EdgeConfig* cfg) {
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("config file \"" + path + "\" is not a JSON object");
  auto fields = Fields(cfg);
  for (const auto& item : j.items()) {
    // (Not a structured binding: clang 14, the fuzz build's compiler, cannot capture those.)
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto it =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return key == f.first; });
    if (it == fields.end()) return InvalidArgument("config file: unknown key \"" + key + "\"");
    DSEC_RETURN_IF_ERROR(SetField(key, value, it->second));
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
  if (c->image_layer_format != "dir" && c->image_layer_format != "erofs")
    return InvalidArgument("image_layer_format must be \"dir\" or \"erofs\"");
  if (!c->build_mirror.empty() && c->build_mirror.rfind("http://", 0) != 0 &&
      c->build_mirror.rfind("https://", 0) != 0 && c->build_mirror.rfind("file://", 0) != 0)
    return InvalidArgument("build_mirror must be an http://, https:// or file:// URL");
  struct Range {
    const char* name;
    double v, lo, hi;
  };
  {
    uint32_t base = 0;
    uint8_t prefix = 0;
    bool host_bits = false;
    if (!net::ParseCidr(c->network_cidr, &base, &prefix, &host_bits) || host_bits || prefix < 8 ||
        prefix > 28)
      return InvalidArgument(
          "network_cidr must be an IPv4 network from /8 to /28, e.g. "
          "10.213.0.0/16");
  }
  if (c->network_max_conns < 1 || c->network_new_conns_per_s < 1)
    return InvalidArgument("network_max_conns and network_new_conns_per_s must be at least 1");
  if (c->microvm_accel != "auto" && c->microvm_accel != "kvm" && c->microvm_accel != "tcg")
    return InvalidArgument("microvm_accel must be auto, kvm or tcg");
  for (const Range& r : std::initializer_list<Range>{
           {"max_sandboxes", double(c->max_sandboxes), 1, 1 << 20},
           {"cluster_lease_ttl_s", double(c->cluster_lease_ttl_s), 2, 600},
           {"port_proxy_connect_timeout_ms", double(c->port_proxy_connect_timeout_ms), 1, 600000},
           {"port_proxy_max_conns", double(c->port_proxy_max_conns), 1, 1 << 20},
           {"max_workers_per_sandbox", double(c->max_workers_per_sandbox), 1, 1 << 16},
           {"port_proxy_max_conns_per_sandbox", double(c->port_proxy_max_conns_per_sandbox), 1,
            1 << 20},
           {"pty_max_per_sandbox", double(c->pty_max_per_sandbox), 1, 1 << 20},
           {"reserve_pids", double(c->reserve_pids), -1, 1 << 22},
           {"sockets_per_mb", double(c->sockets_per_mb), 0, 1024},
           {"output_memory_mb", double(c->output_memory_mb), 0, 1 << 20},
           {"fncall_worker_max_calls", double(c->fncall_worker_max_calls), 0, 1e9},
           {"memory_overcommit", c->memory_overcommit, 0.1, 1000},
           {"default_cpu", c->defaults.cpu, 0.01, 64},
           {"default_memory_mb", double(c->defaults.memory_mb), 16, 1 << 20},
           {"default_pids", double(c->defaults.pids), 8, 1 << 22},
           {"default_disk_mb", double(c->defaults.disk_mb), 1, 1 << 20},
           {"tmpfs_disk_max_mb", double(c->tmpfs_disk_max_mb), 0, 1 << 20},
           {"default_ttl_s", double(c->default_ttl_s), 1, 2592000},
           {"max_header_bytes", double(c->max_header_bytes), 1024, 1 << 20},
           {"max_json_body_bytes", double(c->max_json_body_bytes), 1024, 1 << 30},
           {"max_execs_per_sandbox", double(c->max_execs_per_sandbox), 1, 4096},
           {"max_connections", double(c->max_connections), 1, 1 << 20},
           {"io_threads", double(c->io_threads), 1, 64},
           {"worker_threads", double(c->worker_threads), 1, 1024},
           {"agent_io_threads", double(c->agent_io_threads), 1, 64},
           {"max_count", double(c->max_count), 1, 4096},
           {"reap_interval_ms", double(c->reap_interval_ms), 10, 60000},
           {"tombstone_ttl_s", double(c->tombstone_ttl_s), 0, 2592000},
           {"tombstone_max", double(c->tombstone_max), 0, 10000000},
           {"sandbox_fusion_max_concurrent", double(c->sandbox_fusion_max_concurrent), 1, 4096},
           {"orphan_timeout_s", double(c->orphan_timeout_s), -1, 1e9},
           {"idle_timeout_s", double(c->idle_timeout_s), 1, 86400},
           {"network_dns_max_ttl_s", double(c->network_dns_max_ttl_s), 1, 86400},
           {"fncall_min_idle", double(c->fncall_min_idle), 0, 1024},
           {"fncall_max", double(c->fncall_max), 0, 4096},
           {"fncall_max_queue", double(c->fncall_max_queue), 0, 1 << 20},
           {"fncall_queue_timeout_ms", double(c->fncall_queue_timeout_ms), 0, 600000},
           {"fncall_memory_mb", double(c->fncall_memory_mb), 16, 1 << 20},
           {"max_builds", double(c->max_builds), 1, 64},
       }) {
    if (!(r.v >= r.lo && r.v <= r.hi))
      return InvalidArgument(std::string(r.name) + " must be between " + FormatNumber(r.lo) +
                             " and " + FormatNumber(r.hi));
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
