// Function calls and pools: POST /v1/fncalls runs code on a warm worker of the runtime's pool
// (backends/pools/pool.h); GET/PUT/DELETE /v1/pools manage the pools, fncall runtimes and
// container pools alike. Pools made through the API are kept in the state DB.
#include "api/fncall_json.h"
#include "api/pool_json.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "images/store.h"

namespace dsec::edge {

namespace {

// Runs on the I/O thread: parsing and handing the call to its pool never block.
void RunFnCall(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  auto parsed = api::ParseFnCallRequest(c->req.body, {.max_body_bytes = d.cfg.max_json_body_bytes,
                                                      .max_output_bytes = d.cfg.max_output_bytes});
  if (!parsed.ok()) return c->Fail(parsed.status());
  auto pool = d.pools->Get(parsed->runtime);
  if (!pool || pool->config().kind != pools::PoolKind::kFncall)
    return c->Fail(NotFound("no fncall runtime \"" + parsed->runtime + "\" on this node"));
  if (parsed->req.memory_mb > pool->config().resources.memory_mb)
    return c->Fail(InvalidArgument("\"memory_mb\" must be at most " +
                                   std::to_string(pool->config().resources.memory_mb) +
                                   " for runtime " + parsed->runtime));
  Json audit = {{"exec", RandomBase32(12)},
                {"sandbox", "fncall:" + parsed->runtime},
                {"kind", "fncall"},
                {"principal", c->req.principal},
                {"remote", c->req.remote}};
  Json start = audit;
  start["event"] = "start";
  start["code_bytes"] = parsed->req.call.code.size();
  start["code_sha256"] = Idempotency::Hash(parsed->req.call.code);
  d.audit->Record(std::move(start));
  bool base64 = parsed->base64;
  std::string runtime = parsed->runtime;
  pool->Submit(
      std::move(parsed->req), [c, base64, runtime, audit](StatusOr<pools::CallResult> r) mutable {
        const auto& d = c->api->deps();
        Json end = std::move(audit);
        end["event"] = "exit";
        if (!r.ok()) {
          end["error"] = r.status().ToString();
          d.audit->Record(std::move(end));
          d.metrics->CountFnCall(
              runtime, r.status().code() == StatusCode::kOverCapacity ? "rejected" : "error");
          return c->Fail(r.status());
        }
        end.update(ResultJson(r->out.result, base64));
        end.erase("encoding");
        d.audit->Record(std::move(end));
        d.metrics->CountFnCall(runtime, r->out.result.timed_out ? "timeout" : "done");
        d.metrics->ObserveFnCall(r->out.result.duration_ms / 1000.0);
        c->Reply(200, api::FnCallResultJson(*r, base64, runtime));
      });
}

void ListPools(const std::shared_ptr<Ctx>& c) {
  c->Reply(200, api::PoolListJson(c->api->deps().pools->List()));
}

void GetPool(const std::shared_ptr<Ctx>& c) {
  const std::string& name = c->params["name"];
  if (Status s = ValidateId("pool name", name); !s.ok()) return c->Fail(s);
  auto pool = c->api->deps().pools->Get(name);
  if (!pool) return c->Fail(NotFound("pool " + name + " not found"));
  c->Reply(200, api::ToJson(pool->State()));
}

}  // namespace

pools::PoolConfig PoolDefaults(const EdgeConfig& cfg, pools::PoolKind kind) {
  pools::PoolConfig p;
  p.kind = kind;
  if (pools::HoldsSandboxes(kind)) {
    p.resources = cfg.defaults;
    p.min_idle = 8;
    p.max = 64;
  } else {
    p.resources.memory_mb = cfg.fncall_memory_mb;
    p.min_idle = cfg.fncall_min_idle;
    p.max = cfg.fncall_max;
    p.max_queue = cfg.fncall_max_queue;
    p.queue_timeout_ms = cfg.fncall_queue_timeout_ms;
  }
  return p;
}

// A pool's image: "host", or (container pools) an image of this node's store, normalized; the
// pool's sandboxes get that image config's defaults, as a create of the image would.
Status ResolvePoolImage(images::ImageStore* store, pools::PoolConfig* cfg) {
  cfg->workdir = "/workspace";
  cfg->user = "sandbox";
  cfg->env.clear();
  if (cfg->image == "host" || cfg->image == "host:latest") {
    cfg->image = "host";
    if (cfg->kind == pools::PoolKind::kMicrovm)
      return Unimplemented(
          "image \"host\" cannot be used by microvm pools (it is a live view of the host's "
          "directories, not layers): name an image of this node's store");
    return OkStatus();
  }
  // The fncall zygote needs the host image's runtime (its workers fail to start elsewhere).
  if (!pools::HoldsSandboxes(cfg->kind))
    return Unimplemented("image \"" + cfg->image +
                         "\": fncall pools run on the \"host\" image only (container pools may "
                         "use any image)");
  if (!store)
    return NotFound("image \"" + cfg->image +
                    "\" not found (this node has the built-in \"host\" image only)");
  DSEC_ASSIGN_OR_RETURN(cfg->image, images::NormalizeName(cfg->image));
  DSEC_ASSIGN_OR_RETURN(ImageDefaults d, ImageDefaultsOf(store, cfg->image));
  if (d.workdir) cfg->workdir = *d.workdir;
  if (d.user) cfg->user = *d.user;
  cfg->env = std::move(d.env);
  return OkStatus();
}

void LoadPools(const EdgeConfig& cfg, bool userns, pools::PoolSet* pools, StateStore* store,
               images::ImageStore* images) {
  std::vector<pools::PoolConfig> want;
  if (cfg.fncall_pools && !userns) {
    DSEC_LOG_WARN("no built-in fncall runtimes: their workers need user namespaces");
  } else if (cfg.fncall_pools) {
    pools::PoolConfig py = PoolDefaults(cfg, pools::PoolKind::kFncall);
    py.name = "python";
    py.runtime = backends::FnRuntime::kPython;
    for (auto m : SplitString(cfg.fncall_python_preload, ',', true))
      py.preload.emplace_back(TrimWhitespace(m));
    pools::PoolConfig sh = PoolDefaults(cfg, pools::PoolKind::kFncall);
    sh.name = "bash";
    sh.runtime = backends::FnRuntime::kBash;
    want = {py, sh};
  }
  auto stored = store->ListPools();
  if (!stored.ok()) DSEC_LOG_ERROR("state db: pools not loaded: {}", stored.status().ToString());
  std::vector<std::pair<std::string, std::string>> rows;
  if (stored.ok()) rows = std::move(*stored);
  for (const auto& row : rows) {
    const std::string& name = row.first;  // (clang 14 cannot capture structured bindings)
    const std::string& text = row.second;
    if (text == "null") {  // a deleted built-in
      std::erase_if(want, [&](const pools::PoolConfig& w) { return w.name == name; });
      continue;
    }
    auto c = api::StoredPoolFromJson(text, name,
                                     [&](pools::PoolKind kind) { return PoolDefaults(cfg, kind); });
    Status ok = c.ok() ? ResolvePoolImage(images, &*c) : c.status();
    if (!ok.ok()) {
      DSEC_LOG_WARN("stored pool {} ignored: {}", name, ok.message());
      continue;
    }
    std::erase_if(want, [&](const pools::PoolConfig& w) { return w.name == name; });
    want.push_back(*c);
  }
  for (const auto& c : want) {
    if (auto p = pools->Put(c); !p.ok())
      DSEC_LOG_WARN("pool {} not started: {}", c.name, p.status().message());
    else
      DSEC_LOG_INFO("pool {}: kind={} runtime={} min_idle={} max={}", c.name,
                    pools::PoolKindName(c.kind), backends::FnRuntimeName(c.runtime), c.min_idle,
                    c.max);
  }
}

namespace {

void PutPool(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  const std::string& name = c->params["name"];
  if (Status s = ValidateId("pool name", name); !s.ok()) return c->Fail(s);
  auto existing = d.pools->Get(name);
  // A PUT without "kind" changes the pool that is there (of whatever kind).
  auto cfg = api::ParsePoolPut(c->req.body, name, existing ? &existing->config() : nullptr,
                               [&](pools::PoolKind kind) { return PoolDefaults(d.cfg, kind); });
  if (!cfg.ok()) return c->Fail(cfg.status());
  cfg->expire_unused_s = 0;  // a pool PUT by a caller is kept (also a standby pool taken over)
  if (Status s = ResolvePoolImage(d.images, &*cfg); !s.ok()) return c->Fail(s);
  if (pools::HoldsSandboxes(cfg->kind)) {
    backends::SandboxSpec spec = pools::ContainerSpecFor(*cfg);
    spec.id = "sb-check";  // only the limits are checked here
    if (Status s = backends::ValidateSandboxSpec(spec); !s.ok()) return c->Fail(s);
  }
  auto pool = d.pools->Put(*cfg);
  if (!pool.ok()) return c->Fail(pool.status());
  if (Status s = d.store->PutPool(name, api::ToJson(*cfg).dump()); !s.ok())
    DSEC_LOG_ERROR("state db: pool {} not saved: {}", name, s.ToString());
  c->Reply(existing ? 200 : 201, api::ToJson((*pool)->State()));
}

void DeletePool(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  const std::string& name = c->params["name"];
  if (Status s = ValidateId("pool name", name); !s.ok()) return c->Fail(s);
  if (Status s = d.pools->Remove(name); !s.ok()) return c->Fail(s);
  // A built-in runtime stays deleted across restarts: its row says so ("null").
  bool builtin = d.cfg.fncall_pools && (name == "python" || name == "bash");
  Status s = builtin ? d.store->PutPool(name, "null") : d.store->DeletePool(name);
  if (!s.ok()) DSEC_LOG_ERROR("state db: pool {} not removed: {}", name, s.ToString());
  c->NoContent();
}

}  // namespace

void RegisterFnCallRoutes(Api* api) {
  api->Bind(api::RouteId::kFnCall, RunFnCall);
  api->Bind(api::RouteId::kListPools, ListPools);
  api->Bind(api::RouteId::kGetPool, GetPool);
  api->Bind(api::RouteId::kPutPool, PutPool);
  api->Bind(api::RouteId::kDeletePool, DeletePool);
}

}  // namespace dsec::edge
