// Function calls and pools: POST /v1/fncalls runs code on a warm worker of the runtime's pool
// (backends/pools/pool.h); GET/PUT/DELETE /v1/pools manage the pools, fncall runtimes and
// container pools alike. Pools made through the API are kept in the state DB.
#include <cmath>

#include "api/pool_json.h"
#include "base/base64.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "http/json_body.h"
#include "images/store.h"

namespace dsec::edge {

namespace {

constexpr int64_t kMaxCallTimeoutMs = 600000;
constexpr uint64_t kDefaultCallOutput = 64 << 10;

struct FnCallParams {
  std::string runtime;
  pools::CallRequest req;
  bool base64 = false;
};

StatusOr<FnCallParams> ParseFnCall(const std::string& body, const EdgeConfig& cfg) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  FnCallParams p;
  DSEC_ASSIGN_OR_RETURN(auto runtime, b.String("runtime", 128));
  DSEC_ASSIGN_OR_RETURN(auto code, b.String("code", cfg.max_json_body_bytes));
  DSEC_ASSIGN_OR_RETURN(auto filename, b.String("filename", 256));
  DSEC_ASSIGN_OR_RETURN(auto stdin_data, b.String("stdin", cfg.max_json_body_bytes));
  DSEC_ASSIGN_OR_RETURN(auto stdin_enc, b.String("stdin_encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 1, kMaxCallTimeoutMs));
  DSEC_ASSIGN_OR_RETURN(auto memory, b.Int("memory_mb", 16, 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto max_out,
                        b.Int("max_output_bytes", 0, static_cast<int64_t>(cfg.max_output_bytes)));
  DSEC_ASSIGN_OR_RETURN(auto encoding, b.String("encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  const Json* files = b.Raw("files");
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!runtime || runtime->empty()) return InvalidArgument("\"runtime\" is required");
  if (!code) return InvalidArgument("\"code\" is required");
  p.runtime = *runtime;
  p.req.call.code = std::move(*code);
  if (filename) {
    if (filename->find('\0') != std::string::npos)
      return InvalidArgument("\"filename\" must not contain NUL");
    p.req.call.filename = *filename;
  }
  DSEC_ASSIGN_OR_RETURN(p.req.stdin_data, DecodeStdin(std::move(stdin_data), stdin_enc));
  if (files) {
    if (!files->is_object() || files->size() > 256)
      return InvalidArgument("\"files\" must be an object of at most 256 name: content entries");
    for (const auto& [name, v] : files->items()) {
      if (name.empty() || name.size() > 1024 || name[0] == '/' || name.find('\0') != name.npos)
        return InvalidArgument("file names are relative paths: \"" + name + "\"");
      for (auto part : SplitString(name, '/', false))
        if (part.empty() || part == "." || part == "..")
          return InvalidArgument("file names are relative paths without . or ..: \"" + name + "\"");
      std::string data;
      if (v.is_string()) {
        data = v.get<std::string>();
      } else if (v.is_object() && v.size() == 1 && v.contains("base64") &&
                 v["base64"].is_string()) {
        auto d = Base64Decode(v["base64"].get<std::string>());
        if (!d) return InvalidArgument("file \"" + name + "\" is not valid base64");
        data = std::move(*d);
      } else {
        return InvalidArgument("file \"" + name + "\" must be a string or {\"base64\": ...}");
      }
      p.req.call.files.emplace_back(name, std::move(data));
    }
  }
  p.req.timeout_ms = timeout.value_or(5000);
  p.req.memory_mb = memory.value_or(0);
  p.req.max_output_bytes = static_cast<uint64_t>(max_out.value_or(kDefaultCallOutput));
  if (encoding && *encoding != "utf-8" && *encoding != "base64")
    return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
  p.base64 = encoding && *encoding == "base64";
  return p;
}

// Runs on the I/O thread: parsing and handing the call to its pool never block.
void RunFnCall(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  auto parsed = ParseFnCall(c->req.body, d.cfg);
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
        Json j = ResultJson(r->out.result, base64);
        end.update(j);
        end.erase("encoding");
        d.audit->Record(std::move(end));
        d.metrics->CountFnCall(runtime, r->out.result.timed_out ? "timeout" : "done");
        d.metrics->ObserveFnCall(r->out.result.duration_ms / 1000.0);
        Encoder eo(base64), ee(base64);
        j["stdout"] = eo.Take(r->out.stdout_data, true);
        j["stderr"] = ee.Take(r->out.stderr_data, true);
        j["runtime"] = runtime;
        j["queue_ms"] = std::round(r->queue_ms * 1000.0) / 1000.0;
        c->Reply(200, j);
      });
}

void ListPools(const std::shared_ptr<Ctx>& c) {
  c->Reply(200, {{"pools", api::ToJson(c->api->deps().pools->List())}});
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
  if (kind == pools::PoolKind::kContainer) {
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
    return OkStatus();
  }
  // The fncall zygote needs the host image's runtime (its workers fail to start elsewhere).
  if (cfg->kind != pools::PoolKind::kContainer)
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
    auto j = ParseJson(text);
    // A stored kind that is not valid is refused by PoolConfigFromJson below.
    auto kind = pools::PoolKindFromName(j.ok() && j->is_object() && (*j)["kind"].is_string()
                                            ? (*j)["kind"].get<std::string>()
                                            : "fncall");
    pools::PoolConfig base = PoolDefaults(cfg, kind.value_or(pools::PoolKind::kFncall));
    base.name = name;
    auto c = j.ok() ? api::PoolConfigFromJson(*j, base) : StatusOr<pools::PoolConfig>(j.status());
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
  auto j = ParseJson(c->req.body.empty() ? "{}" : c->req.body);
  if (!j.ok() || !j->is_object()) return c->Fail(InvalidArgument("the body must be a JSON object"));
  if (j->contains("name") && (*j)["name"] != name)
    return c->Fail(InvalidArgument("\"name\" differs from the path"));
  auto existing = d.pools->Get(name);
  // A PUT without "kind" changes the pool that is there (of whatever kind).
  pools::PoolKind kind = existing ? existing->config().kind : pools::PoolKind::kFncall;
  if (auto k = j->find("kind"); k != j->end() && k->is_string()) {
    auto named = pools::PoolKindFromName(k->get<std::string>());
    if (!named) return c->Fail(InvalidArgument("\"kind\" must be \"fncall\" or \"container\""));
    kind = *named;
  }
  pools::PoolConfig base =
      existing && existing->config().kind == kind ? existing->config() : PoolDefaults(d.cfg, kind);
  if (!j->contains("runtime") && kind == pools::PoolKind::kFncall && !existing) {
    if (!j->contains("command")) return c->Fail(InvalidArgument("\"runtime\" is required"));
    base.runtime = backends::FnRuntime::kExec;
  }
  base.name = name;
  auto cfg = api::PoolConfigFromJson(*j, base);
  if (!cfg.ok()) return c->Fail(cfg.status());
  if (Status s = ResolvePoolImage(d.images, &*cfg); !s.ok()) return c->Fail(s);
  if (cfg->kind == pools::PoolKind::kContainer) {
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
