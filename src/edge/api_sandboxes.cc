// Sandbox lifecycle routes: create/get/list/patch/delete, stats, pause/resume, jobs, and the
// node-level endpoints (health, node, images, metrics).
#include <boost/asio/post.hpp>

#include "api/network_json.h"
#include "api/pool_json.h"
#include "base/strings.h"
#include "edge/api.h"
#include "http/json_body.h"
#include "images/store.h"

namespace dsec::edge {

namespace {

constexpr int64_t kMaxTtlS = 30 * 86400;

Status ValidateLabels(const std::map<std::string, std::optional<std::string>>& labels) {
  for (const auto& [k, v] : labels)
    for (char c : k)
      if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '/')
        return InvalidArgument("label keys are 1-63 characters of A-Z a-z 0-9 . _ - /");
  return OkStatus();
}

// "network": a policy (net/policy.h) this node can enforce.
StatusOr<net::NetworkPolicy> ParseNetwork(const Json* n, bool node_has_network) {
  DSEC_ASSIGN_OR_RETURN(net::NetworkPolicy p, api::NetworkPolicyFromJson(n));
  if (p.mode != net::NetMode::kNone && !node_has_network)
    return Unimplemented("network mode \"" + std::string(net::NetModeName(p.mode)) +
                         "\" is not available: this edge runs with network: false");
  return p;
}

// "image": a name, or a list of images stacked in order (the first at the bottom), kept as one
// comma-separated string of normalized names ("host", "name:tag" or "sha256:<hex>" layers).
StatusOr<std::optional<std::string>> ParseImage(const Json* j) {
  if (!j) return std::optional<std::string>();
  std::vector<std::string> names;
  if (j->is_string()) {
    names.push_back(j->get<std::string>());
  } else if (j->is_array() && !j->empty() && j->size() <= 16) {
    for (const auto& e : *j) {
      if (!e.is_string()) return InvalidArgument("\"image\" entries must be strings");
      names.push_back(e.get<std::string>());
    }
  } else {
    return InvalidArgument("\"image\" must be a name or a list of 1 to 16 names");
  }
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string n = names[i];
    if (n == "host" || n == "host:latest") {
      if (i != 0) return InvalidArgument("\"host\" can only be the first image of a stack");
      n = "host";
    } else if (StartsWith(n, "sha256:")) {
      if (n.size() != 71 || n.find_first_not_of("0123456789abcdef", 7) != std::string::npos)
        return InvalidArgument("bad layer digest in \"image\"");
    } else {
      DSEC_ASSIGN_OR_RETURN(n, images::NormalizeName(n));
    }
    out += (i ? "," : "") + n;
  }
  return std::optional<std::string>(out);
}

// A workdir from an image's config (imported, so untrusted): the same shape a caller may give.
bool UsableWorkdir(const std::string& w) {
  if (w.empty() || w[0] != '/' || w.size() > 1024 || w.find('\0') != std::string::npos)
    return false;
  for (auto c : SplitString(w, '/', /*skip_empty=*/true))
    if (c == "." || c == "..") return false;
  return true;
}

// What the request left out comes from the image's config (for a stack, the topmost image that
// sets it, as ImageStore::Acquire merges them): the workdir and the user, and its env under the
// caller's. It goes into the params rather than only the backend's spec so that the sandbox's
// record, its execs' default cwd and its forks (made from layer digests, which carry no config)
// all agree. A user the node cannot resolve (a name like "node": only "sandbox", "root" and
// numeric ids are known) leaves the default; so does a workdir that is not a clean absolute path.
Status ApplyImageConfig(images::ImageStore* store, bool workdir_given, bool user_given,
                        CreateParams* p) {
  DSEC_ASSIGN_OR_RETURN(ImageDefaults d, ImageDefaultsOf(store, p->image));
  if (!workdir_given && d.workdir) p->workdir = *d.workdir;
  if (!user_given && d.user) p->user = *d.user;
  p->env.insert(d.env.begin(), d.env.end());  // the caller's value wins
  return OkStatus();
}

// The fields of a create that a pool may fix, as the request sent them.
struct CreateFields {
  std::optional<std::string> image;
  std::optional<double> cpu;
  std::optional<int64_t> memory_mb, pids, disk_mb;
  std::optional<std::string> user, workdir;
  std::optional<std::map<std::string, std::optional<std::string>>> env;
};

// A create from a container pool: the pool fixed what its sandboxes are made with, so the
// request may leave those fields out or send the pool's values, and nothing else.
Status TakeFromPool(const std::string& name, pools::PoolSet* pools, CreateFields* f,
                    CreateParams* p) {
  auto src = pools ? pools->Get(name) : nullptr;
  if (!src) return NotFound("pool " + name + " not found");
  if (src->config().kind != pools::PoolKind::kContainer)
    return InvalidArgument("pool " + name + " is an fncall runtime, not a container pool");
  const backends::SandboxShape ps = src->config().Shape();
  auto differs = [&](const char* field, bool same) -> Status {
    if (same) return OkStatus();
    return InvalidArgument("\"" + std::string(field) + "\" is set by pool " + name +
                           "; leave it out or make it equal");
  };
  const Resources& pr = ps.resources;
  DSEC_RETURN_IF_ERROR(differs("image", !f->image || *f->image == ps.image));
  DSEC_RETURN_IF_ERROR(differs("cpu", !f->cpu || *f->cpu == pr.cpu));
  DSEC_RETURN_IF_ERROR(differs("memory_mb", !f->memory_mb || *f->memory_mb == pr.memory_mb));
  DSEC_RETURN_IF_ERROR(differs("pids", !f->pids || *f->pids == pr.pids));
  DSEC_RETURN_IF_ERROR(differs("disk_mb", !f->disk_mb || *f->disk_mb == pr.disk_mb));
  DSEC_RETURN_IF_ERROR(differs("user", !f->user || *f->user == ps.user));
  DSEC_RETURN_IF_ERROR(differs("workdir", !f->workdir || *f->workdir == ps.workdir));
  DSEC_RETURN_IF_ERROR(differs("env", !f->env || f->env->empty()));
  p->pool = name;
  f->image = ps.image;
  f->cpu = pr.cpu;
  f->memory_mb = pr.memory_mb;
  f->pids = pr.pids;
  f->disk_mb = pr.disk_mb;
  // Made with its image's config (or the defaults): the record says so.
  p->workdir = ps.workdir;
  p->user = ps.user;
  p->env = ps.env;
  return OkStatus();
}

// Checks the fields the request (or its pool) gave and puts them over the defaults in `p`.
Status ApplyFields(const CreateFields& f, CreateParams* p) {
  if (f.image) p->image = *f.image;
  if (f.cpu) p->resources.cpu = *f.cpu;
  if (f.memory_mb) p->resources.memory_mb = *f.memory_mb;
  if (f.pids) p->resources.pids = *f.pids;
  if (f.disk_mb) p->resources.disk_mb = *f.disk_mb;
  if (f.user) {
    if (f.user->empty()) return InvalidArgument("\"user\" must not be empty");
    DSEC_RETURN_IF_ERROR(backends::ResolveUser(*f.user).status());
    p->user = *f.user;
  }
  if (const auto& w = f.workdir) {
    if (w->empty() || (*w)[0] != '/' || w->find('\0') != std::string::npos)
      return InvalidArgument("\"workdir\" must be an absolute path");
    p->workdir = *w;
  }
  if (f.env && !f.env->empty()) {  // (a pool's env stays: a pooled create may only send {})
    for (const auto& [k, v] : *f.env)
      if (k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
          (v && v->find('\0') != std::string::npos))
        return InvalidArgument("env names must not contain '=' or NUL, values no NUL");
    p->env = http::Flatten(*f.env);
  }
  return OkStatus();
}

StatusOr<std::pair<CreateParams, int>> ParseCreate(const std::string& body, const EdgeConfig& cfg,
                                                   const Manager& manager, pools::PoolSet* pools,
                                                   images::ImageStore* images, bool* count_given) {
  const std::vector<backends::Kind> served = manager.Kinds();
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  CreateParams p;
  p.resources = cfg.defaults;
  p.ttl_s = cfg.default_ttl_s;
  CreateFields f;
  DSEC_ASSIGN_OR_RETURN(auto kind, b.String("kind", 32));
  DSEC_ASSIGN_OR_RETURN(f.image, ParseImage(b.Raw("image")));
  DSEC_ASSIGN_OR_RETURN(f.cpu, b.Number("cpu", 0.01, 64));
  DSEC_ASSIGN_OR_RETURN(f.memory_mb, b.Int("memory_mb", 16, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(f.pids, b.Int("pids", 8, 1 << 22));
  DSEC_ASSIGN_OR_RETURN(f.disk_mb, b.Int("disk_mb", 1, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto ttl, b.Int("ttl_s", 0, kMaxTtlS));  // 0: no TTL
  DSEC_ASSIGN_OR_RETURN(auto idle, b.Int("idle_ttl_s", 0, kMaxTtlS));
  DSEC_ASSIGN_OR_RETURN(f.user, b.String("user", 64));
  DSEC_ASSIGN_OR_RETURN(f.workdir, b.String("workdir", 1024));
  DSEC_ASSIGN_OR_RETURN(f.env, b.StringMap("env", 256, 256, 32 << 10));
  DSEC_ASSIGN_OR_RETURN(auto labels, b.StringMap("labels", 64, 63, 256));
  DSEC_ASSIGN_OR_RETURN(auto count, b.Int("count", 1, cfg.max_count));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  const Json* network = b.Raw("network");
  const Json* pool = b.Raw("pool");
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (kind) {
    auto k = backends::KindFromName(*kind);
    if (!k) return InvalidArgument("kind must be \"container\" or \"microvm\"");
    if (std::find(served.begin(), served.end(), *k) == served.end())
      return Unimplemented("kind \"" + *kind +
                           "\" is not available on this node (GET /v1/node says why)");
    p.kind = *k;
  }
  DSEC_ASSIGN_OR_RETURN(p.network, ParseNetwork(network, cfg.network));
  // What the kind cannot do is refused now, before its image is looked up (and admission
  // checks it again for every other way in).
  {
    DSEC_ASSIGN_OR_RETURN(backends::KindCapabilities caps, manager.Capabilities(p.kind));
    DSEC_RETURN_IF_ERROR(backends::CheckCapabilities(p.kind, caps, f.image.value_or(p.image),
                                                     p.network, /*worker=*/false));
  }
  if (pool && !pool->is_null()) {
    if (!pool->is_string()) return InvalidArgument("\"pool\" must be a pool name");
    DSEC_RETURN_IF_ERROR(TakeFromPool(pool->get<std::string>(), pools, &f, &p));
  }
  DSEC_RETURN_IF_ERROR(ApplyFields(f, &p));
  if (ttl) p.ttl_s = *ttl;
  if (idle) p.idle_ttl_s = *idle;
  if (labels) {
    DSEC_RETURN_IF_ERROR(ValidateLabels(*labels));
    p.labels = http::Flatten(*labels);
  }
  // A pool made its sandboxes already, with what it fixes (checked above).
  if (p.pool.empty() && p.image != "host" && images)
    DSEC_RETURN_IF_ERROR(ApplyImageConfig(images, f.workdir.has_value(), f.user.has_value(), &p));
  *count_given = count.has_value();
  return std::make_pair(p, static_cast<int>(count.value_or(1)));
}

void CreateSandbox(const std::shared_ptr<Ctx>& c) {
  bool count_given = false;
  const auto& deps = c->api->deps();
  auto parsed =
      ParseCreate(c->req.body, deps.cfg, *deps.manager, deps.pools, deps.images, &count_given);
  if (!parsed.ok()) return c->Fail(parsed.status());
  const std::string* wait = c->req.Query("wait");
  bool wait_ready = !(wait && (*wait == "0" || *wait == "false"));
  auto* workers = c->api->deps().workers;
  auto made = c->api->deps().manager->Create(
      parsed->first, parsed->second, wait_ready,
      [workers](std::function<void()> task) { boost::asio::post(*workers, std::move(task)); });
  if (!made.ok()) return c->Fail(made.status());
  if (count_given) return c->Reply(201, {{"sandboxes", ToJson(*made)}});
  c->Reply(201, ToJson(made->front()));
}

void GetSandbox(const std::shared_ptr<Ctx>& c) {
  auto e = c->Entry();
  if (!e.ok()) return c->Fail(e.status());
  c->Reply(200, ToJson(c->api->deps().manager->Record(**e)));
}

void ListSandboxes(const std::shared_ptr<Ctx>& c) {
  ListFilter f;
  for (const auto& l : c->req.QueryAll("label")) {
    size_t eq = l.find('=');
    if (eq == std::string::npos || eq == 0)
      return c->Fail(400, "bad_request", "label filters are key=value");
    f.labels.emplace_back(l.substr(0, eq), l.substr(eq + 1));
  }
  if (const std::string* s = c->req.Query("state")) {
    for (Phase p : {Phase::kCreating, Phase::kRunning, Phase::kPaused, Phase::kFailed})
      if (*s == PhaseName(p)) f.state = p;
    if (!f.state)
      return c->Fail(400, "bad_request", "state must be creating, running, paused or failed");
  }
  if (const std::string* k = c->req.Query("kind")) {
    f.kind = backends::KindFromName(*k);
    if (!f.kind) return c->Fail(400, "bad_request", "kind must be container or microvm");
  }
  auto limit = c->IntQuery("limit", 100, 1, 1000);
  if (!limit.ok()) return c->Fail(limit.status());
  f.limit = static_cast<size_t>(*limit);
  if (const std::string* cur = c->req.Query("cursor")) f.cursor = *cur;
  auto r = c->api->deps().manager->List(f);
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, ToJson(*r));
}

void PatchSandbox(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<SandboxRecord> {
    DSEC_RETURN_IF_ERROR(ValidateId("sandbox id", c->params["id"]));
    DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(c->req.body));
    PatchParams p;
    DSEC_ASSIGN_OR_RETURN(p.ttl_s, b.Int("ttl_s", 0, kMaxTtlS));
    DSEC_ASSIGN_OR_RETURN(p.idle_ttl_s, b.Int("idle_ttl_s", 0, kMaxTtlS));
    DSEC_ASSIGN_OR_RETURN(auto labels, b.StringMap("labels", 64, 63, 256, /*null_deletes=*/true));
    DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
    (void)rid;
    const Json* network = b.Raw("network");
    DSEC_RETURN_IF_ERROR(b.Finish());
    if (network) {
      DSEC_ASSIGN_OR_RETURN(p.network, ParseNetwork(network, c->api->deps().cfg.network));
    }
    if (labels) {
      DSEC_RETURN_IF_ERROR(ValidateLabels(*labels));
      p.labels = *labels;
    }
    return c->api->deps().manager->Patch(c->params["id"], p);
  };
  auto r = run();
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, ToJson(*r));
}

void DeleteSandbox(const std::shared_ptr<Ctx>& c) {
  Status s = ValidateId("sandbox id", c->params["id"]);
  if (s.ok()) s = c->api->deps().manager->Delete(c->params["id"]);
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

void Stats(const std::shared_ptr<Ctx>& c) {
  auto sb = c->Sandbox();
  if (!sb.ok()) return c->Fail(sb.status());
  auto st = (*sb)->Stats();
  if (!st.ok()) return c->Fail(st.status());
  c->Reply(200, {{"cpu_time_ms", static_cast<double>(st->cpu_usage_us) / 1000.0},
                 {"memory_current", st->memory_current},
                 {"memory_peak", st->memory_peak},
                 {"memory_limit", st->memory_limit},
                 {"disk_used", st->disk_used},
                 {"disk_limit", st->disk_limit},
                 {"disk_kind", st->disk_kind},
                 {"pids", st->pids},
                 {"oom_kills", st->oom_kills},
                 {"exec_count", st->exec_count},
                 {"network_denied", st->network_denied}});
}

// Body-less actions still take an optional JSON body, strictly: only "request_id".
Status CheckActionBody(const std::string& body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  return b.Finish();
}

void PauseOrResume(const std::shared_ptr<Ctx>& c, bool pause) {
  Status s = ValidateId("sandbox id", c->params["id"]);
  if (s.ok()) s = CheckActionBody(c->req.body);
  if (!s.ok()) return c->Fail(s);
  auto* m = c->api->deps().manager;
  auto r = pause ? m->Pause(c->params["id"]) : m->Resume(c->params["id"]);
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, ToJson(*r));
}
void Pause(const std::shared_ptr<Ctx>& c) { PauseOrResume(c, true); }
void Resume(const std::shared_ptr<Ctx>& c) { PauseOrResume(c, false); }

void Job(const std::shared_ptr<Ctx>& c, JobOp op) {
  const std::string& job = c->params["job"];
  if (job.empty() || job.size() > 256) return c->Fail(400, "bad_request", "bad job name");
  if (Status s = CheckActionBody(c->req.body); !s.ok()) return c->Fail(s);
  auto n = c->api->deps().manager->JobAction(job, op);
  if (!n.ok()) return c->Fail(n.status());
  c->Reply(200, {{"affected", *n}});
}
void PauseJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kPause); }
void ResumeJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kResume); }
void DeleteJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kDelete); }

void Health(const std::shared_ptr<Ctx>& c) { c->Reply(200, {{"ok", true}}); }

void Node(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  Json j = ToJson(d.manager->NodeInfo());
  j["version"] = DSEC_VERSION;
  j["instance"] = d.instance;
  j["backends"] = Json::array();
  for (backends::Kind k : d.manager->Kinds()) j["backends"].push_back(backends::KindName(k));
  j["pools"] = d.pools ? api::ToJson(d.pools->List()) : Json::array();
  j["features"] = d.features;  // open connections are in /metrics (dsec_http_connections)
  if (d.live_features) {
    Json live = d.live_features();
    for (const auto& item : live.items()) j["features"][item.key()] = item.value();
  }
  c->Reply(200, j);
}

void MetricsText(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  c->Raw(200, "text/plain; version=0.0.4; charset=utf-8",
         d.metrics->Render(d.manager->Gauges(), d.connections ? d.connections() : 0,
                           d.accepted ? d.accepted() : 0));
}

}  // namespace

StatusOr<ImageDefaults> ImageDefaultsOf(images::ImageStore* store, const std::string& image) {
  std::vector<std::string> names;
  for (auto n : SplitString(image, ',', /*skip_empty=*/true)) names.emplace_back(n);
  DSEC_ASSIGN_OR_RETURN(images::Stack stack, store->Acquire(names, /*holder=*/""));
  const images::ImageConfig& c = stack.config;
  ImageDefaults d;
  if (UsableWorkdir(c.workdir)) d.workdir = c.workdir;
  if (!c.user.empty() && backends::ResolveUser(c.user).ok()) d.user = c.user;
  for (const auto& kv : c.env) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || kv.find('\0') != std::string::npos) continue;
    d.env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return d;
}

void RegisterSandboxRoutes(Api* a) {
  a->Bind(api::RouteId::kCreateSandbox, CreateSandbox);
  a->Bind(api::RouteId::kListSandboxes, ListSandboxes);
  a->Bind(api::RouteId::kGetSandbox, GetSandbox);
  a->Bind(api::RouteId::kPatchSandbox, PatchSandbox);
  a->Bind(api::RouteId::kDeleteSandbox, DeleteSandbox);
  a->Bind(api::RouteId::kStats, Stats);
  a->Bind(api::RouteId::kPause, Pause);
  a->Bind(api::RouteId::kResume, Resume);
  a->Bind(api::RouteId::kPauseJob, PauseJob);
  a->Bind(api::RouteId::kResumeJob, ResumeJob);
  a->Bind(api::RouteId::kDeleteJob, DeleteJob);
  a->Bind(api::RouteId::kHealth, Health);
  a->Bind(api::RouteId::kNode, Node);
  a->Bind(api::RouteId::kMetrics, MetricsText);
}

}  // namespace dsec::edge
