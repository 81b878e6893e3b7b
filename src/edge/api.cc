#include "edge/api.h"

#include <boost/asio/post.hpp>

#include "api/request_json.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "edge/cluster_images.h"
#include "edge/trajectory.h"
#include "http/auth.h"

namespace dsec::edge {

namespace {

// GET /v1/layers/<digest>: a peer edge's fetch of a layer blob (not a public route).
constexpr std::string_view kLayersPath = "/v1/layers/";

// Uploads up to this size are read into memory; larger ones (and chunked ones) are spooled.
constexpr uint64_t kUploadInMemoryMax = 1 << 20;

bool Mutating(const std::string& m) {
  return m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE";
}

// Wraps the server's Responder: counts every answer, and records it for idempotency.
class ApiResponder : public http::Responder {
 public:
  ApiResponder(std::shared_ptr<http::Responder> inner, Metrics* metrics, std::string method,
               Idempotency* idem = nullptr, std::string key = {}, std::string hash = {},
               uint64_t capture_max = 0)
      : inner_(std::move(inner)),
        metrics_(metrics),
        method_(std::move(method)),
        idem_(idem),
        key_(std::move(key)),
        hash_(std::move(hash)),
        capture_max_(capture_max) {}

  void Send(http::HttpResponse r) override {
    metrics_->CountRequest(method_, r.status);
    if (idem_) idem_->Finish(key_, hash_, r);
    inner_->Send(std::move(r));
  }
  void StartStream(int status, std::string ct,
                   std::vector<std::pair<std::string, std::string>> headers) override {
    metrics_->CountRequest(method_, status);
    status_ = status;
    ct_ = ct;
    inner_->StartStream(status, std::move(ct), std::move(headers));
  }
  void Write(std::string chunk) override {
    Capture(chunk);
    inner_->Write(std::move(chunk));
  }
  void End(std::string last) override {
    if (idem_) {
      Capture(last);
      http::HttpResponse r;
      r.status = status_;
      r.content_type = ct_;
      r.body = std::move(captured_);
      idem_->Finish(key_, hash_, r);
    }
    inner_->End(std::move(last));
  }
  void OnDisconnect(std::function<void()> cb) override { inner_->OnDisconnect(std::move(cb)); }
  void AcceptWebSocket(std::shared_ptr<http::WebSocketHandler> h) override {
    metrics_->CountRequest(method_, 101);
    inner_->AcceptWebSocket(std::move(h));
  }

 private:
  void Capture(const std::string& c) {
    // Past the cap the record becomes a 409 anyway; stop copying.
    if (idem_ && captured_.size() <= capture_max_) captured_ += c;
  }
  std::shared_ptr<http::Responder> inner_;
  Metrics* metrics_;
  std::string method_;
  Idempotency* idem_;
  std::string key_, hash_;
  uint64_t capture_max_;
  int status_ = 200;
  std::string ct_, captured_;
};

}  // namespace

// --- Ctx ---------------------------------------------------------------------------------

void Ctx::Reply(int status, const Json& body) {
  http::HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  res->Send(std::move(r));
}

void Ctx::NoContent() {
  http::HttpResponse r;
  r.status = 204;
  res->Send(std::move(r));
}

void Ctx::Raw(int status, std::string content_type, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  res->Send(std::move(r));
}

void Ctx::Fail(int status, std::string_view code, std::string_view message, int retry_after_s) {
  api->deps().metrics->CountError(std::string(code));
  http::HttpResponse r = http::JsonError(status, code, message);
  if (status == 429 || status == 503)
    r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  if (status >= 500) DSEC_LOG_WARN("{} {} -> {}: {}", req.method, req.path, status, message);
  res->Send(std::move(r));
}

void Ctx::Fail(const Status& s) {
  auto [status, code] = HttpErrorFor(s);
  if (s.code() == StatusCode::kGone && api->deps().manager) {
    // A tombstone's reason and time, for programs: {"error": {..., "reason", "at"}}.
    auto id = params.find("id");
    auto t = id == params.end() ? std::nullopt : api->deps().manager->TombstoneOf(id->second);
    if (t) {
      api->deps().metrics->CountError(std::string(code));
      http::HttpResponse r;
      r.status = status;
      r.body = api::TombstoneErrorBody(code, s.message(), t->reason, t->at_ms);
      return res->Send(std::move(r));
    }
  }
  Fail(status, code, s.message());
}

StatusOr<std::shared_ptr<SandboxEntry>> Ctx::Entry() {
  const std::string& id = params["id"];
  DSEC_RETURN_IF_ERROR(ValidateId("sandbox id", id));
  return api->deps().manager->Get(id);
}

StatusOr<std::shared_ptr<backends::Sandbox>> Ctx::Sandbox(std::shared_ptr<SandboxEntry>* entry,
                                                          Op op) {
  DSEC_ASSIGN_OR_RETURN(auto e, Entry());
  if (entry) *entry = e;
  return e->Sandbox(op);
}

StatusOr<std::string> Ctx::RequiredQuery(const char* name) const {
  const std::string* v = req.Query(name);
  if (!v || v->empty())
    return InvalidArgument(std::string("query parameter \"") + name + "\" is required");
  if (v->find('\0') != std::string::npos)
    return InvalidArgument(std::string("\"") + name + "\" contains NUL");
  return *v;
}

StatusOr<int64_t> Ctx::IntQuery(const char* name, int64_t def, int64_t lo, int64_t hi) const {
  const std::string* v = req.Query(name);
  if (!v || v->empty()) return def;
  auto n = ParseInt64(*v);
  if (!n || *n < lo || *n > hi)
    return InvalidArgument(std::string("query parameter \"") + name +
                           "\" must be an integer between " + std::to_string(lo) + " and " +
                           std::to_string(hi));
  return *n;
}

bool Ctx::FlagQuery(const char* name) const {
  const std::string* v = req.Query(name);
  return v && (*v == "1" || *v == "true");
}

// --- Api ---------------------------------------------------------------------------------

Api::Api(Deps deps)
    : d_(std::move(deps)),
      port_url_key_(http::DerivedKey(d_.tokens, "dsec port url key v1")),
      proxy_slots_({.what = "proxied connections",
                    .max_total = d_.cfg.port_proxy_max_conns,
                    .total_knob = "port_proxy_max_conns",
                    .max_per_sandbox = d_.cfg.port_proxy_max_conns_per_sandbox,
                    .per_knob = "port_proxy_max_conns_per_sandbox"}),
      worker_slots_({.what = "requests in progress on worker threads",
                     .max_per_sandbox = d_.cfg.max_workers_per_sandbox,
                     .per_knob = "max_workers_per_sandbox"}) {
  RegisterSandboxRoutes(this);
  RegisterExecRoutes(this);
  RegisterFileRoutes(this);
  RegisterFnCallRoutes(this);
  RegisterImageRoutes(this);
  RegisterPortRoutes(this);
  RegisterTrajectoryRoutes(this);
  // Every route of the shared table that an edge serves has its handler.
  for (const auto& r : api::Routes())
    if (r.scope != api::Scope::kApiserver && !HandlerOf(r.id)) {
      DSEC_LOG_ERROR("no handler for {} {}", r.method, r.pattern);
      std::abort();
    }
}

void Api::Bind(api::RouteId id, RouteFn fn) {
  // One handler per route, bound once (a second Bind is a wiring bug).
  if (api::RouteOf(id).scope == api::Scope::kApiserver || handlers_[static_cast<size_t>(id)])
    std::abort();
  handlers_[static_cast<size_t>(id)] = fn;
}

http::Preflight Api::Check(http::HttpRequest& req) {
  http::Preflight pf = Authenticate(req);
  if (!pf.ok || !pf.upload_sandbox) return pf;
  // An upload into a sandbox is bounded by what it could hold, its disk, and by the node's
  // cap when one is set. Only now, once the caller is known: to anyone else, whether a
  // sandbox exists is none of their business.
  if (!d_.manager) {  // (the HTTP fuzzer's Api has none)
    uint64_t dflt = static_cast<uint64_t>(d_.cfg.defaults.disk_mb) << 20;
    pf.body_limit = d_.cfg.max_upload_bytes ? std::min(d_.cfg.max_upload_bytes, dflt) : dflt;
    return pf;
  }
  auto m = api::MatchRoute(req.method, req.target, api::Server::kEdge);
  Status in_project = d_.manager->CheckProject(m.params["id"], req.Header("dsec-project"));
  auto e = in_project.ok() ? d_.manager->Get(m.params["id"])
                           : StatusOr<std::shared_ptr<SandboxEntry>>(in_project);
  if (!e.ok()) {
    auto [status, code] = HttpErrorFor(e.status());
    d_.metrics->CountRequest(req.method, status);
    pf.ok = false;
    pf.error = http::JsonError(status, code, e.status().message());
    return pf;
  }
  uint64_t disk = static_cast<uint64_t>((*e)->params.resources.disk_mb) << 20;
  uint64_t cap = d_.cfg.max_upload_bytes;
  pf.body_limit = cap ? std::min(cap, disk) : disk;
  pf.limit_why = cap && cap < disk ? "the node's max_upload_bytes"
                                   : "the sandbox's disk, disk_mb " +
                                         std::to_string((*e)->params.resources.disk_mb) +
                                         ": create it with a bigger disk_mb";
  return pf;
}

http::Preflight Api::Authenticate(http::HttpRequest& req) {
  http::Preflight pf;
  pf.body_limit = d_.cfg.max_json_body_bytes;
  pf.limit_why = "max_json_body_bytes";
  if (req.target.empty() || req.target[0] != '/') {
    // Only origin-form ("/v1/..."): "v1/node", "*" and absolute URLs route nowhere.
    d_.metrics->CountRequest(req.method, 400);
    d_.metrics->CountError("bad_request");
    pf.ok = false;
    pf.error =
        http::JsonError(400, "bad_request", "the request target must be a path starting with /");
    return pf;
  }
  // A port host (port_domain): every request on it goes to the sandbox's port, with the API
  // token, the signed URL's port token or the cookie it set as the credential.
  // The port proxy's own credentials: the connection is taken over once `s` is OK.
  auto port_credential = [&](const Status& s, std::string principal) {
    pf.takeover = true;
    if (!s.ok()) {
      auto [status, code] = HttpErrorFor(s);
      d_.metrics->CountRequest(req.method, status);
      d_.metrics->CountError(std::string(code));
      pf.ok = false;
      pf.error = http::JsonError(status, code, s.message());
      return pf;
    }
    pf.principal = std::move(principal);
    return pf;
  };
  if (std::string id, port;
      api::ParsePortHost(req.Header("host"), d_.cfg.port_domain, &id, &port)) {
    return port_credential(req.via_unix && req.peer_uid == 0 ? OkStatus()
                           : d_.manager                      ? VerifyPortHost(req, id, port)
                                        : PermissionDenied("no sandboxes here"),
                           "port-host:" + id);
  }
  // A signed port URL is its own credential (any method; the proxy takes the connection).
  if (api::SignedPortTarget spt; api::ParseSignedPortTarget(req.target, &spt))
    return port_credential(d_.manager ? VerifyPortUrl(spt) : PermissionDenied("no sandboxes here"),
                           "port-url:" + spt.id);
  const api::RouteSpec* r = api::MatchRoute(req.method, req.target, api::Server::kEdge).route;
  std::string port_id, port, port_target;
  // The port proxy takes the connection once authenticated (below): any method, no body limit.
  pf.takeover = api::ParsePortTarget(req.target, &port_id, &port, &port_target);
  if (r && r->upload()) {
    pf.upload_sandbox = true;  // the limit is the sandbox's (Check)
    // A large upload (or one of unknown length) goes to disk and then to the sandbox a piece at
    // a time; a small one stays in memory.
    auto len = ParseUint64(req.Header("content-length"));
    if (!len || *len > kUploadInMemoryMax) pf.spool = http::Preflight::Spool::kUpload;
  } else if (r && r->import()) {
    pf.body_limit = d_.cfg.max_import_bytes;  // up to GiBs: to disk, not memory
    pf.limit_why = "max_import_bytes";
    pf.spool = http::Preflight::Spool::kImport;
  }
  auto deny = [&](int status, std::string_view code, std::string_view msg) {
    d_.metrics->CountRequest(req.method, status);
    d_.metrics->CountError(std::string(code));
    pf.ok = false;
    pf.error = http::JsonError(status, code, msg);
    if (status == 401) pf.error.headers.emplace_back("WWW-Authenticate", "Bearer");
    return pf;
  };
  // A peer's fetch of a layer blob (cluster_images.h): sent from the blob file once the caller
  // is authenticated, on the connection taken over.
  pf.takeover = pf.takeover || (req.method == "GET" && StartsWith(req.path, kLayersPath));
  if (req.via_unix) {
    if (req.peer_uid != 0) return deny(403, "forbidden", "the edge socket is for root only");
    pf.principal = "unix";
    return pf;
  }
  if (req.method == "GET" && (req.path == "/v1/health" || req.path == "/v1/health/")) {
    pf.principal = "anonymous";
    return pf;
  }
  // One credential per request: with two Authorization headers, a proxy in front and the edge
  // could each check a different one.
  int auth_headers = 0;
  for (const auto& [k, v] : req.headers) auth_headers += k == "authorization";
  if (auth_headers > 1) return deny(401, "unauthorized", "more than one Authorization header");
  const std::string token = http::BearerToken(req);
  for (const auto& t : d_.tokens) {
    if (!token.empty() && http::ConstantTimeEquals(token, t)) {
      pf.principal = "token:" + Idempotency::Hash(t);
      return pf;
    }
  }
  return deny(401, "unauthorized", token.empty() ? "missing bearer token" : "invalid token");
}

void Api::Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  if (req.takeover_fd && StartsWith(req.path, kLayersPath)) {
    std::string digest = req.path.substr(kLayersPath.size());
    if (!d_.cluster_images)
      return http::SendErrorAndClose(std::move(req.takeover_fd), 404, "not_found",
                                     "this edge is in no cluster: it serves no layers");
    return d_.cluster_images->StartServe(std::move(req.takeover_fd), std::move(digest));
  }
  if (req.takeover_fd) {
    // Finding the sandbox may wait (a create in progress): on a worker.
    auto shared = std::make_shared<http::HttpRequest>(std::move(req));
    boost::asio::post(*d_.workers, [this, shared] { ServePort(this, std::move(*shared)); });
    return;
  }
  auto ctx = std::make_shared<Ctx>();
  ctx->api = this;
  api::RouteMatch match = api::MatchRoute(req.method, req.target, api::Server::kEdge);
  const api::RouteSpec* route = match.route;
  ctx->params = std::move(match.params);
  ctx->req = std::move(req);
  if (!route) {
    ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
    if (!match.path_known)
      return ctx->Fail(404, "not_found", "no route for " + ctx->req.method + " " + ctx->req.path);
    // A known path asked with a method it does not take: 405 and the methods it does take.
    std::string allow = api::AllowHeader(match.allowed);
    d_.metrics->CountError("method_not_allowed");
    http::HttpResponse r = http::JsonError(
        405, "method_not_allowed",
        ctx->req.method + " is not a method of " + ctx->req.path + " (it takes " + allow + ")");
    r.headers.emplace_back("Allow", allow);
    return ctx->res->Send(std::move(r));
  }

  // A call naming a project (an apiserver relays its caller's) finds only that project's
  // sandboxes: another's id is 404 as an unknown one.
  const std::string project = ctx->req.Header("dsec-project");
  if (!project.empty() && route->scope == api::Scope::kSandbox && d_.manager) {
    if (Status s = d_.manager->CheckProject(ctx->params["id"], project); !s.ok()) {
      ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
      return ctx->Fail(s);
    }
  }

  std::string key;
  if (Mutating(ctx->req.method)) {
    key = ctx->req.Header("idempotency-key");
    if (!route->upload() && !route->import() && !ctx->req.body.empty()) {
      // request_id in a JSON body (api/request_json.h); JSON errors are left for the handler
      // to report.
      auto rid = api::BodyRequestId(ctx->req.body);
      if (!rid.ok()) {
        ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
        return ctx->Fail(rid.status());
      }
      if (*rid) {
        if (!key.empty() && key != **rid) {
          ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
          return ctx->Fail(400, "bad_request",
                           "\"request_id\" and the Idempotency-Key header differ");
        }
        key = **rid;
      }
    }
    bool printable = key.size() <= 128;
    for (char c : key) printable = printable && c >= 0x20 && c < 0x7f;
    if (!printable) {
      ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
      return ctx->Fail(400, "bad_request", "request ids are 1-128 printable ASCII characters");
    }
  }
  if (key.empty()) {
    ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
    if (!ctx->req.Header("dsec-replay-only").empty())
      return ctx->Fail(400, "bad_request", "Dsec-Replay-Only needs a request id");
  } else {
    // (Per project too: an apiserver's callers share its node token.)
    std::string scoped = ctx->req.principal + "\n" + project + "\n" + ctx->req.method + "\n" +
                         ctx->req.target + "\n" + key;
    std::string hash = Idempotency::Hash(ctx->req.body);
    auto plain = std::make_shared<ApiResponder>(res, d_.metrics, ctx->req.method);
    const bool replay_only = ctx->req.Header("dsec-replay-only") == "1";
    auto decision = d_.idempotency->Begin(
        scoped, hash, [plain](http::HttpResponse r) { plain->Send(std::move(r)); },
        /*run_if_new=*/!replay_only);
    if (decision == Idempotency::Decision::kAbsent) {
      ctx->res = plain;
      return ctx->Fail(404, "not_found", "no request with this id was made here");
    }
    if (decision != Idempotency::Decision::kRun) return;
    ctx->res =
        std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method, d_.idempotency,
                                       scoped, hash, d_.cfg.idempotency_max_body_bytes);
  }
  RouteFn fn = HandlerOf(route->id);
  if (route->on_io_thread()) return fn(ctx);
  // What one sandbox's requests may hold of the shared workers at once (its own calls wait on
  // its agent, which its processes can slow down).
  std::shared_ptr<void> slot;
  if (auto id = ctx->params.find("id");
      id != ctx->params.end() && route->scope == api::Scope::kSandbox) {
    auto taken = worker_slots_.Take(id->second);
    if (!taken.ok()) return ctx->Fail(taken.status());
    slot = std::move(*taken);
  }
  const bool recordable = d_.trajectories && route->scope == api::Scope::kSandbox;
  boost::asio::post(
      *d_.workers, [this, ctx, fn, recordable, rid = route->id, slot = std::move(slot)]() mutable {
        auto release = MakeScopeGuard([&slot] { slot.reset(); });
        try {
          if (recordable)
            d_.trajectories->Serve(ctx, fn, rid);
          else
            fn(ctx);
        } catch (const std::exception& e) {
          // Handlers return Status; this is a bug, but the daemon stays up.
          DSEC_LOG_ERROR("handler threw: {} {}: {}", ctx->req.method, ctx->req.path, e.what());
          ctx->Fail(500, "internal", "internal error");
        }
      });
}

Status Api::RunInternal(http::HttpRequest req, std::shared_ptr<http::Responder> res,
                        std::string exec_id) {
  auto ctx = std::make_shared<Ctx>();
  ctx->api = this;
  if (http::HttpResponse error; !http::DecodeTarget(&req, &error))
    return InvalidArgument("bad request target " + req.target);
  api::RouteMatch match = api::MatchRoute(req.method, req.target, api::Server::kEdge);
  if (!match.route || match.route->scope != api::Scope::kSandbox)
    return NotFound("no sandbox route for " + req.method + " " + req.target);
  ctx->params = std::move(match.params);
  ctx->req = std::move(req);
  ctx->internal = true;
  ctx->exec_id = std::move(exec_id);
  ctx->res = std::make_shared<ApiResponder>(std::move(res), d_.metrics, ctx->req.method);
  HandlerOf(match.route->id)(ctx);
  return OkStatus();
}

}  // namespace dsec::edge
