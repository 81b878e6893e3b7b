// The REST API of ../shared/API.md on top of the HTTP server: routing, authentication,
// idempotency, error mapping and metrics here; the handlers live in api_sandboxes.cc
// (sandboxes, jobs, node), api_exec.cc (execs, shells, attach), api_files.cc (files and
// archives), api_images.cc (images, snapshots, builds) and api_fncall.cc (fncall and pools).
// Handlers run on the worker pool (they may block on sandbox
// setup or agent calls); long-running ones (exec, streams, attach) return early and finish
// from the backend's callbacks.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/errors.h"
#include "api/exec_json.h"
#include "api/ports_json.h"
#include "api/routes.h"
#include "api/sandboxes_json.h"
#include "backends/pools/pool.h"
#include "base/audit_log.h"
#include "base/base64.h"
#include "edge/config.h"
#include "edge/idempotency.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "edge/output_budget.h"
#include "edge/sandbox_slots.h"
#include "edge/state_store.h"
#include "http/relay.h"
#include "http/server.h"

namespace dsec::images {
class ImageStore;
}

namespace dsec::edge {

class Api;
class Builds;
class Trajectories;
class ClusterImages;

// One request being handled. Shared: async handlers keep it until they answer.
class Ctx {
 public:
  http::HttpRequest req;
  std::map<std::string, std::string> params;  // from the route pattern
  std::shared_ptr<http::Responder> res;
  Api* api = nullptr;
  // A call the edge makes itself (a trajectory's logged call run again): not recorded again.
  bool internal = false;
  // The id a background exec started by this call gets ("": a random one). A recorded call's
  // is derived from its trajectory and sequence number, so that running it again gives the
  // same id.
  std::string exec_id;

  void Reply(int status, const Json& body);
  void NoContent();
  void Raw(int status, std::string content_type, std::string body);
  void Fail(const Status& s);
  // 429 and 503 say Retry-After: retry_after_s.
  void Fail(int status, std::string_view code, std::string_view message, int retry_after_s = 1);

  // The sandbox named by the {id} path parameter (validated; touched for idle TTL).
  StatusOr<std::shared_ptr<SandboxEntry>> Entry();
  // Its backend sandbox for `op` (edge/lifecycle.h), waiting while it is still being created.
  StatusOr<std::shared_ptr<backends::Sandbox>> Sandbox(
      std::shared_ptr<SandboxEntry>* entry = nullptr, Op op = Op::kUse);
  // A query parameter that must be given.
  StatusOr<std::string> RequiredQuery(const char* name) const;
  // An integer query parameter (default when absent).
  StatusOr<int64_t> IntQuery(const char* name, int64_t def, int64_t lo, int64_t hi) const;
  bool FlagQuery(const char* name) const;  // "1" or "true"
};

using RouteFn = void (*)(const std::shared_ptr<Ctx>&);

// The port proxy (api_ports.cc): serving a taken-over connection (its target is
// api::ParsePortTarget's).
class Api;
void ServePort(Api* api, http::HttpRequest req);

class Api {
 public:
  struct Deps {
    EdgeConfig cfg;
    Manager* manager = nullptr;
    backends::Backend* backend = nullptr;
    Idempotency* idempotency = nullptr;
    Metrics* metrics = nullptr;
    OutputBudget* output_budget = nullptr;  // exec output held in memory, node-wide
    AuditLog* audit = nullptr;
    boost::asio::thread_pool* workers = nullptr;
    boost::asio::io_context* timers = nullptr;  // for waits with deadlines
    pools::PoolSet* pools = nullptr;
    StateStore* store = nullptr;
    images::ImageStore* images = nullptr;
    Builds* builds = nullptr;
    std::vector<std::string> tokens;
    std::string instance;
    // GET /v1/node's features, read per request (some change while the edge runs).
    std::function<api::NodeFeatures()> features;
    std::function<int64_t()> connections;
    std::function<int64_t()> accepted;  // TCP connections accepted since the start
    // Where proxied connections (api_ports.cc) are relayed: the HTTP server's I/O.
    boost::asio::io_context* proxy_io = nullptr;
    Trajectories* trajectories = nullptr;  // the trajectory log (null: none)
    // In a cluster: images across nodes (publish, fetch, serve layers); null otherwise.
    ClusterImages* cluster_images = nullptr;
  };
  explicit Api(Deps deps);

  http::Preflight Check(http::HttpRequest& headers_only);
  // Check without the per-sandbox upload limit.
  http::Preflight Authenticate(http::HttpRequest& headers_only);
  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);
  // Runs a sandbox call the edge makes itself (Ctx::internal) on this thread, answering to
  // `res`; `exec_id` as Ctx::exec_id. NotFound for a target no route takes.
  Status RunInternal(http::HttpRequest req, std::shared_ptr<http::Responder> res,
                     std::string exec_id);

  const Deps& deps() const { return d_; }
  Deps& deps() { return d_; }
  // Proxied connections held now, per sandbox and in all (the port proxy's caps).
  SandboxSlots& proxy_slots() { return proxy_slots_; }

  // Signed port URLs (api_ports.cc): the path for `port` of sandbox `e` until `expires_s` (Unix
  // seconds), and the check of one (NotFound, PermissionDenied: forged, expired).
  std::string PortUrlPath(const SandboxEntry& e, uint16_t port, int64_t expires_s) const;
  Status VerifyPortUrl(const api::SignedPortTarget& t) const;
  // The host-based form (api::ParsePortHost; port_domain): the credential "<expires>.<mac>" of
  // a sandbox's port, as the URL's query carries it and the cookie keeps it.
  std::string PortToken(const SandboxEntry& e, uint16_t port, int64_t expires_s) const;
  // A request for a port host: a valid API token, the query's port token or one of the port
  // cookies (PermissionDenied, Unauthenticated when none is there, NotFound).
  Status VerifyPortHost(const http::HttpRequest& req, const std::string& id,
                        const std::string& port) const;

  // The handler of a route of api::Routes() (nullptr for the apiserver's own routes).
  RouteFn HandlerOf(api::RouteId id) const { return handlers_[static_cast<size_t>(id)]; }

 private:
  // Binds the handler of a route of the shared table (src/api/routes.h).
  void Bind(api::RouteId id, RouteFn fn);
  friend void RegisterSandboxRoutes(Api* api);
  friend void RegisterExecRoutes(Api* api);
  friend void RegisterFileRoutes(Api* api);
  friend void RegisterFnCallRoutes(Api* api);
  friend void RegisterImageRoutes(Api* api);
  friend void RegisterPortRoutes(Api* api);
  friend void RegisterTrajectoryRoutes(Api* api);

  Deps d_;
  std::string port_url_key_;  // derived from the first token (http::DerivedKey)
  std::array<RouteFn, static_cast<size_t>(api::RouteId::kCount)> handlers_{};
  SandboxSlots proxy_slots_;
  // Workers running a handler on a sandbox now: one sandbox whose agent answers slowly (its
  // CPU starved by its own processes, say) holds at most max_workers_per_sandbox of them.
  SandboxSlots worker_slots_;
};

void RegisterSandboxRoutes(Api* api);
void RegisterExecRoutes(Api* api);
void RegisterFileRoutes(Api* api);
void RegisterFnCallRoutes(Api* api);
void RegisterImageRoutes(Api* api);
void RegisterPortRoutes(Api* api);
void RegisterTrajectoryRoutes(Api* api);

// What an image stack's config (the topmost image that sets each) gives a new sandbox by
// default: a workdir and a user when usable on this node (a clean absolute path; a user the
// node resolves), and env. NotFound for an image the store does not have.
struct ImageDefaults {
  std::optional<std::string> workdir, user;
  std::map<std::string, std::string> env;
};
StatusOr<ImageDefaults> ImageDefaultsOf(images::ImageStore* store, const std::string& image);

// A pool's image: "host", or (pools of sandboxes) an image of this node's store, normalized;
// its sandboxes get that image config's workdir, user and env, as a create of it would.
Status ResolvePoolImage(images::ImageStore* store, pools::PoolConfig* cfg);
// Defaults for a new pool of `kind` (fncall | container) from the node config.
pools::PoolConfig PoolDefaults(const EdgeConfig& cfg, pools::PoolKind kind);
// Starts the built-in runtimes (python, bash) unless turned off, and the pools kept in the
// state DB (which override built-ins of the same name).
void LoadPools(const EdgeConfig& cfg, bool userns, pools::PoolSet* pools, StateStore* store,
               images::ImageStore* images);

// The exec codecs the handlers share (api/exec_json.h).
using api::DecodeStdin;
using api::Encoder;
using api::ResultJson;

using api::HttpErrorFor;
using api::ValidateId;

}  // namespace dsec::edge
