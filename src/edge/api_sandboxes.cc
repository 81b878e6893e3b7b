// Sandbox lifecycle routes: create/get/list/patch/delete, stats, pause/resume, jobs, and the
// node-level endpoints (health, node, metrics). Bodies are parsed and answers rendered by
// api/sandboxes_json.h; these check the typed requests against the node.
#include <boost/asio/post.hpp>

#include "api/quota_room.h"
#include "api/sandboxes_json.h"
#include "base/resources.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/builds.h"
#include "edge/cluster_images.h"
#include "edge/trajectory.h"
#include "http/auth.h"
#include "http/json_body.h"
#include "images/store.h"

namespace dsec::edge {

namespace {

// A failed build of the node's microVM image is started again this long after it ended.
constexpr int64_t kMicrovmImageRetryPauseMs = 5 * 60 * 1000;

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

// The fields of a create that a pool may fix are the request's (api/sandboxes_json.h).
using CreateFields = api::CreateRequest;

// A create from a container pool: the pool fixed what its sandboxes are made with, so the
// request may leave those fields out or send the pool's values, and nothing else.
Status TakeFromPool(const std::string& name, pools::PoolSet* pools, CreateFields* f,
                    CreateParams* p) {
  auto src = pools ? pools->Get(name) : nullptr;
  if (!src) return NotFound("pool " + name + " not found");
  if (!pools::HoldsSandboxes(src->config().kind))
    return InvalidArgument("pool " + name + " is an fncall runtime, not a pool of sandboxes");
  const backends::Kind kind = pools::SandboxKindOf(src->config().kind);
  if (f->kind && *f->kind != kind)
    return InvalidArgument("\"kind\" is set by pool " + name + " (" +
                           std::string(backends::KindName(kind)) +
                           "); leave it out or make it equal");
  f->kind = kind;
  p->kind = kind;
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

// The microVM image of a create that names none (config microvm_image), made by the image
// builder at its first use: Unavailable (with `*retry_after_s` set) while it is being built.
Status NodeMicrovmImage(const EdgeConfig& cfg, images::ImageStore* images, Builds* builds,
                        int* retry_after_s) {
  if (!images || images->GetImage(cfg.microvm_image).ok()) return OkStatus();
  if (!builds)
    return NotFound("image \"" + cfg.microvm_image +
                    "\" (the microVM image of creates that name none) is not on this node");
  api::BuildRequest req;
  req.name = cfg.microvm_image;
  req.suite = "bookworm";
  req.packages = {"bash", "coreutils", "procps", "python3"};
  auto r = builds->Ensure(std::move(req), kMicrovmImageRetryPauseMs);
  if (!r.ok() && r.status().code() == StatusCode::kAlreadyExists &&
      images->GetImage(cfg.microvm_image).ok())
    return OkStatus();  // made meanwhile
  DSEC_RETURN_IF_ERROR(r.status().WithContext("the microVM image of creates that name none, \"" +
                                              cfg.microvm_image + "\", cannot be made"));
  // Long enough for a client's retries (the SDK waits at most 30 s each) to span a build.
  *retry_after_s = 30;
  return Unavailable("image \"" + cfg.microvm_image +
                     "\", the microVM image of creates that name none, is being built (build " +
                     r->id + ": GET /v1/images/builds/" + r->id +
                     "); retry when it is made (a few minutes at most), or name an image");
}

StatusOr<std::pair<CreateParams, int>> ParseCreate(
    const std::string& body, const EdgeConfig& cfg, const Manager& manager, pools::PoolSet* pools,
    images::ImageStore* images, Builds* builds, bool* count_given, bool* node_image,
    bool* image_shape, int* retry_after_s, std::optional<api::TrajectorySpec>* trajectory,
    ClusterImages* cluster, const std::string& project) {
  CreateParams p;
  p.resources = cfg.defaults;
  p.ttl_s = cfg.default_ttl_s;
  api::CreateLimits limits{
      .max_count = cfg.max_count,
      .kinds = manager.Kinds(),
      .network = cfg.network,
      .check_kind = [&](const api::CreateRequest& r) -> Status {
        backends::Kind kind = r.kind.value_or(p.kind);
        DSEC_ASSIGN_OR_RETURN(backends::KindCapabilities caps, manager.Capabilities(kind));
        // (admission checks it again for every other way in)
        const std::string& image = kind == backends::Kind::kMicrovm ? cfg.microvm_image : p.image;
        return backends::CheckCapabilities(kind, caps, r.image.value_or(image), r.network,
                                           /*worker=*/false);
      }};
  DSEC_ASSIGN_OR_RETURN(CreateFields f, api::ParseCreateRequest(body, limits));
  // In a cluster, an image another node made is fetched first: its layers from nodes that hold
  // them.
  if (cluster && f.image) {
    std::vector<std::string> names;
    for (auto n : SplitString(*f.image, ',', /*skip_empty=*/true)) names.emplace_back(n);
    DSEC_RETURN_IF_ERROR(cluster->Ensure(project, names));
  }
  if (f.node && *f.node != cfg.node)
    return Unimplemented("this is node " + cfg.node + ", not " + *f.node +
                         " (an apiserver places a create pinned to a node there)");
  if (f.kind) p.kind = *f.kind;
  p.network = f.network;
  if (f.pool) DSEC_RETURN_IF_ERROR(TakeFromPool(*f.pool, pools, &f, &p));
  DSEC_RETURN_IF_ERROR(ApplyFields(f, &p));
  if (p.kind == backends::Kind::kMicrovm && !f.image) {
    p.image = cfg.microvm_image;
    *node_image = true;
    if (cluster) DSEC_RETURN_IF_ERROR(cluster->Ensure("default", {p.image}));
    DSEC_RETURN_IF_ERROR(NodeMicrovmImage(cfg, images, builds, retry_after_s));
  }
  if (f.ttl_s) p.ttl_s = *f.ttl_s;
  if (f.idle_ttl_s) p.idle_ttl_s = *f.idle_ttl_s;
  if (f.labels) {
    DSEC_RETURN_IF_ERROR(api::ValidateLabels(*f.labels));
    p.labels = http::Flatten(*f.labels);
  }
  // A pool made its sandboxes already, with what it fixes (checked above).
  if (p.pool.empty() && p.image != "host" && images)
    DSEC_RETURN_IF_ERROR(ApplyImageConfig(images, f.workdir.has_value(), f.user.has_value(), &p));
  *count_given = f.count.has_value();
  *image_shape = !f.user && !f.workdir && (!f.env || f.env->empty());
  *trajectory = f.trajectory;
  if (f.trajectory && f.count && *f.count != 1)
    return InvalidArgument("a trajectory is recorded by one sandbox: \"count\" must be 1");
  if (f.trajectory && f.trajectory->resume && (f.image || f.kind || f.pool))
    return InvalidArgument(
        "a resumed trajectory's sandbox is made as its first one was: no image, kind or pool");
  return std::make_pair(p, static_cast<int>(f.count.value_or(1)));
}

// The standby pool of a microVM create's shape: a digest of its image's layers (another image
// under the same name is another shape) and its limits.
std::string StandbyPoolName(images::ImageStore* images, const CreateParams& p) {
  std::string key = p.image;
  for (auto n : SplitString(p.image, ',', /*skip_empty=*/true))
    if (auto img = images->GetImage(std::string(n)); img.ok())
      for (const auto& layer : img->layers) key += " " + layer;
  key += " cpu=" + std::to_string(p.resources.cpu) +
         " memory=" + std::to_string(p.resources.memory_mb) +
         " pids=" + std::to_string(p.resources.pids) +
         " disk=" + std::to_string(p.resources.disk_mb);
  return "standby-" + http::Sha256Hex(key).substr(0, 16);
}

// Starts the standby pool `name` of the shape `p` was made with (its image's workdir, user and
// env, network none): the node's own, not kept in the state DB, gone when unused.
void StartStandby(const Api::Deps& deps, const CreateParams& p, const std::string& name) {
  pools::PoolConfig cfg;
  cfg.name = name;
  cfg.kind = pools::PoolKind::kMicrovm;
  cfg.image = p.image;
  cfg.resources = p.resources;
  cfg.min_idle = cfg.max = deps.cfg.microvm_standby;
  cfg.expire_unused_s = deps.cfg.microvm_standby_expiry_s;
  Status s = ResolvePoolImage(deps.images, &cfg);
  if (s.ok()) s = deps.pools->Put(cfg).status();
  if (!s.ok()) DSEC_LOG_WARN("standby pool {} of {}: {}", name, p.image, s.ToString());
}

StatusOr<std::string> RequestProject(const http::HttpRequest& req) {
  std::string p = req.Header("dsec-project");
  if (p.empty()) return std::string("default");
  if (!api::IsDnsLabel(p))
    return InvalidArgument("Dsec-Project must be a project name (a-z 0-9 -), not \"" + p + "\"");
  return p;
}

void CreateSandbox(const std::shared_ptr<Ctx>& c) {
  bool count_given = false;
  const auto& deps = c->api->deps();
  auto project = RequestProject(c->req);
  if (!project.ok()) return c->Fail(project.status());
  std::optional<api::TrajectorySpec> trajectory;
  bool node_image = false, image_shape = false;
  int retry_after_s = 0;
  auto parsed = ParseCreate(c->req.body, deps.cfg, *deps.manager, deps.pools, deps.images,
                            deps.builds, &count_given, &node_image, &image_shape, &retry_after_s,
                            &trajectory, deps.cluster_images, *project);
  if (!parsed.ok() && retry_after_s > 0)
    return c->Fail(503, "unavailable", parsed.status().message(), retry_after_s);
  if (!parsed.ok()) return c->Fail(parsed.status());
  parsed->first.project = *project;
  if (trajectory && !deps.trajectories)
    return c->Fail(FailedPrecondition("this edge keeps no trajectory log"));
  // A cluster's quotas: who made it (the caller's token name), and the room an apiserver
  // admitted it in ("hold=<tag>;sandboxes=N;memory_mb=M;cpu_milli=C"): a create that takes more
  // than that room is refused with what it needs (Dsec-Quota-Need), for the apiserver to admit
  // that much and send it again.
  if (std::string owner = c->req.Header("dsec-owner"); !owner.empty()) {
    if (!api::IsDnsLabel(owner))
      return c->Fail(400, "bad_request", "Dsec-Owner must be a token name (a-z 0-9 -)");
    parsed->first.owner = owner;
  }
  // A resume is made as the trajectory's first sandbox was (its quota room is checked on that).
  if (trajectory && trajectory->resume) {
    auto p = deps.trajectories->ResumeParams(parsed->first, *trajectory,
                                             c->req.Header("dsec-trajectory-takeover"));
    if (!p.ok()) return c->Fail(p.status());
    parsed->first = std::move(*p);
  }
  if (std::string quota = c->req.Header("dsec-quota"); !quota.empty()) {
    auto room = api::ParseQuotaRoom(quota, /*with_hold=*/true);
    if (!room.ok()) return c->Fail(room.status());
    const CreateParams& p = parsed->first;
    const int64_t n = parsed->second;
    const int64_t cpu_milli = CpuMilli(p.resources.cpu);
    if (n > room->sandboxes || n * p.resources.memory_mb > room->memory_mb ||
        n * cpu_milli > room->cpu_milli) {
      http::HttpResponse r = http::JsonError(
          409, "conflict", "the create takes more than the quota room its apiserver admitted");
      r.headers.emplace_back("Dsec-Quota-Need",
                             api::QuotaRoomText({.sandboxes = n,
                                                 .memory_mb = n * p.resources.memory_mb,
                                                 .cpu_milli = n * cpu_milli}));
      return c->res->Send(std::move(r));
    }
    parsed->first.quota_hold = room->hold;
  }
  // Another project's snapshot is an image this project does not have (the same words).
  // (The node's microVM image is every project's.)
  if (!c->req.Header("dsec-project").empty() && deps.images && parsed->first.pool.empty() &&
      !node_image) {
    for (auto n : SplitString(parsed->first.image, ',', /*skip_empty=*/true)) {
      if (n == "host") continue;
      auto img = deps.images->GetImage(std::string(n));
      if (img.ok() && !img->project.empty() && img->project != *project)
        return c->Fail(NotFound("image \"" + img->name + "\" not found"));
    }
  }
  // A microVM of a shape created lately comes from the node's standby pool of that shape, if
  // it has one ready (the rest are made fresh); the first create of a shape starts that pool.
  std::string standby;
  const CreateParams& cp = parsed->first;
  if (deps.cfg.microvm_standby > 0 && deps.pools && deps.images && image_shape && !trajectory &&
      cp.kind == backends::Kind::kMicrovm && cp.pool.empty() &&
      cp.network.mode == net::NetMode::kNone) {
    standby = StandbyPoolName(deps.images, cp);
    if (deps.pools->Get(standby)) {
      parsed->first.pool = standby;
      standby.clear();
    }
  }
  const std::string* wait = c->req.Query("wait");
  bool wait_ready = !(wait && (*wait == "0" || *wait == "false"));
  auto* workers = c->api->deps().workers;
  auto post = [workers](std::function<void()> task) {
    boost::asio::post(*workers, std::move(task));
  };
  StatusOr<std::vector<SandboxRecord>> made = InternalError("not made");
  if (trajectory && trajectory->resume) {
    // Made at its first live call (Trajectories::Serve); until then the log answers.
    std::function<void()> create;
    made =
        deps.manager->Create(parsed->first, 1, /*wait=*/false,
                             [&create](std::function<void()> task) { create = std::move(task); });
    if (!made.ok()) return c->Fail(made.status());
    if (Status s =
            deps.trajectories->Resumed(made->front().id, *project, *trajectory, std::move(create));
        !s.ok()) {
      (void)deps.manager->Delete(made->front().id);
      return c->Fail(s);
    }
  } else {
    made = deps.manager->Create(parsed->first, parsed->second, wait_ready || trajectory.has_value(),
                                post);
    if (!made.ok()) return c->Fail(made.status());
    if (trajectory) {
      if (Status s = deps.trajectories->Begin(made->front().id, parsed->first, *trajectory);
          !s.ok()) {
        (void)deps.manager->Delete(made->front().id);
        return c->Fail(s);
      }
    }
  }
  if (!standby.empty()) StartStandby(deps, parsed->first, standby);
  http::HttpResponse r;
  r.status = 201;
  r.body = (count_given ? api::SandboxListJson(*made) : ToJson(made->front()))
               .dump(-1, ' ', false, Json::error_handler_t::replace);
  // The usage generation that counts it (or a later one): an apiserver's quota hold lets go of
  // it once the node's published usage has reached that.
  r.headers.emplace_back("Dsec-Usage-Gen", std::to_string(c->api->deps().manager->usage_gen()));
  c->res->Send(std::move(r));
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
  bool none = false;
  if (const std::string* s = c->req.Query("state")) {
    for (Phase p : {Phase::kCreating, Phase::kRunning, Phase::kPaused, Phase::kFailed})
      if (*s == PhaseName(p)) f.state = p;
    // ("unavailable" is an apiserver's word for a lost node's sandboxes: an edge has none)
    none = *s == "unavailable";
    if (!f.state && !none)
      return c->Fail(400, "bad_request",
                     "state must be creating, running, paused, failed or unavailable");
  }
  if (const std::string* k = c->req.Query("kind")) {
    f.kind = backends::KindFromName(*k);
    if (!f.kind) return c->Fail(400, "bad_request", "kind must be container or microvm");
  }
  auto limit = c->IntQuery("limit", 100, 1, 1000);
  if (!limit.ok()) return c->Fail(limit.status());
  f.limit = static_cast<size_t>(*limit);
  if (const std::string* cur = c->req.Query("cursor")) f.cursor = *cur;
  // Named by an apiserver: only that project's; a lone edge's caller sees all.
  if (!c->req.Header("dsec-project").empty()) {
    auto project = RequestProject(c->req);
    if (!project.ok()) return c->Fail(project.status());
    f.project = *project;
  }
  if (none) return c->Reply(200, ToJson(api::SandboxPage{}));
  auto r = c->api->deps().manager->List(f);
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, ToJson(*r));
}

void PatchSandbox(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<SandboxRecord> {
    DSEC_RETURN_IF_ERROR(ValidateId("sandbox id", c->params["id"]));
    DSEC_ASSIGN_OR_RETURN(PatchParams p,
                          api::ParsePatchRequest(c->req.body, c->api->deps().cfg.network));
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
  c->Reply(200, api::StatsJson(*st));
}

using api::CheckActionBody;

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
  auto n = c->api->deps().manager->JobAction(job, op, c->req.Header("dsec-project"));
  if (!n.ok()) return c->Fail(n.status());
  c->Reply(200, api::JobActionJson(*n));
}
void PauseJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kPause); }
void ResumeJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kResume); }
void DeleteJob(const std::shared_ptr<Ctx>& c) { Job(c, JobOp::kDelete); }

void Health(const std::shared_ptr<Ctx>& c) { c->Reply(200, api::HealthJson()); }

void Node(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  api::NodeInfo n;
  n.report = d.manager->NodeInfo();
  n.version = DSEC_VERSION;
  n.instance = d.instance;
  n.backends = d.manager->Kinds();
  if (d.pools) n.pools = d.pools->List();
  if (d.features) n.features = d.features();
  c->Reply(200, api::ToJson(n));
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
