#include "edge/sandbox_fusion.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cmath>
#include <set>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/e2b_interpreter.h"
#include "edge/idempotency.h"
#include "http/auth.h"

namespace dsec::edge {

namespace fusion = api::fusion;

namespace {

constexpr uint64_t kMaxCaptured = 1 << 20;        // per stream, as SandboxFusion captures
constexpr uint64_t kMaxJupyterOutput = 16 << 20;  // a /run_jupyter kernel's output lines
constexpr uint64_t kMaxFetched = 64 << 20;        // per fetched file
constexpr uint64_t kMaxFetchedTotal = 64 << 20;   // all of a call's fetched files

http::HttpResponse Detail(int status, std::string_view detail) {
  http::HttpResponse r;
  r.status = status;
  r.body = Json{{"detail", detail}}.dump();
  return r;
}

int64_t Ms(double seconds) { return std::max<int64_t>(1, std::llround(seconds * 1000)); }

fusion::CommandResult FromExec(const backends::ExecResult& r, std::string out, std::string err) {
  fusion::CommandResult c;
  c.execution_time_s = std::round(r.duration_ms * 1000.0) / 1e6;  // seconds, to the microsecond
  if (r.timed_out) {
    c.status = fusion::CommandStatus::kTimeLimitExceeded;
  } else {
    c.status = fusion::CommandStatus::kFinished;
    // As Python's subprocess reports it: -N for a process killed by signal N.
    c.return_code = r.signal ? -r.signal : r.exit_code;
  }
  c.stdout_data = std::move(out);
  c.stderr_data = std::move(err);
  return c;
}

const char* kSupported =
    "python, pytest, bash, cpp, c, nodejs (js), typescript (ts), go, java, rust, php, lua, "
    "perl, ruby, R";

}  // namespace

std::string SandboxFusion::Route(const http::HttpRequest& req) const {
  if (d_.cfg->sandbox_fusion_auth == "none") return req.path;
  return http::PathBehindToken(req, d_.tokens);
}

http::Preflight SandboxFusion::Check(http::HttpRequest& req) {
  http::Preflight pf;
  pf.body_limit = d_.cfg->sandbox_fusion_max_body_bytes;
  pf.limit_why = "sandbox_fusion_max_body_bytes";
  if (Route(req).empty()) {
    d_.metrics->CountRequest(req.method, 401);
    pf.ok = false;
    pf.error = Detail(401,
                      "Not authenticated: a DSec token as a bearer token, or as the first "
                      "path segment (http://HOST:PORT/TOKEN/run_code)");
    pf.error.headers.emplace_back("WWW-Authenticate", "Bearer");
    pf.error.close = true;
    return pf;
  }
  pf.principal = "sandbox-fusion";
  return pf;
}

void SandboxFusion::Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  const std::string path = Route(req);
  auto send = [&](http::HttpResponse r) {
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  if (path == "/v1/ping") {
    if (req.method != "GET") return send(Detail(405, "Method Not Allowed"));
    http::HttpResponse r;
    r.body = "\"pong\"";
    return send(std::move(r));
  }
  if (path == "/run_code" || path == "/run_jupyter") {
    if (req.method != "POST") return send(Detail(405, "Method Not Allowed"));
    // Parsing (up to sandbox_fusion_max_body_bytes of JSON and base64) is a worker's job, not
    // the listener's I/O thread's.
    auto shared = std::make_shared<http::HttpRequest>(std::move(req));
    const bool jupyter = path == "/run_jupyter";
    boost::asio::post(*d_.workers, [this, shared, res, jupyter] {
      if (jupyter) return RunJupyter(std::move(*shared), res);
      RunCode(std::move(*shared), res);
    });
    return;
  }
  send(Detail(404, "Not Found"));
}

void SandboxFusion::RunCode(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  auto reply = [this, res](int status, std::string body) { Reply(res, status, std::move(body)); };
  auto rq = std::make_shared<fusion::RunCodeRequest>();
  std::vector<fusion::FieldError> errors;
  if (!fusion::ParseRunCode(req.body, rq.get(), &errors))
    return reply(422, fusion::RenderDetail(errors));
  d_.audit->Record({{"event", "run_code"},
                    {"sandbox", "sandbox-fusion"},
                    {"language", rq->language},
                    {"code_bytes", rq->code.size()},
                    {"code_hash", Idempotency::Hash(rq->code)},
                    {"remote", req.remote}});
  auto lang = fusion::LanguageOf(rq->language, rq->args);
  if (!lang)
    return reply(200, fusion::RenderRunCode({}, "language " + rq->language +
                                                    " is not supported by this server (it runs " +
                                                    kSupported + ")"));
  if (rq->language == "python" && rq->fetch_files.empty() && RunOnFncall(*rq, res)) return;
  Schedule(
      [this, rq, lang = *lang, reply] {
        std::optional<std::string> sandbox_error;
        fusion::RunCodeResult r;
        try {
          r = RunInSandbox(*rq, lang, &sandbox_error);
        } catch (const std::exception& e) {
          DSEC_LOG_ERROR("sandbox fusion: {}", e.what());
          sandbox_error = "internal error";
        }
        reply(200, fusion::RenderRunCode(r, sandbox_error));
      },
      res);
}

// A run in a sandbox holds a worker for its steps (up to their timeouts): at most
// sandbox_fusion_max_concurrent at once, so that the node's own API keeps workers; the others
// wait their turn without a worker (SandboxFusion's clients do not retry a 429), up to
// kMaxWaiting of them.
void SandboxFusion::Schedule(std::function<void()> run,
                             const std::shared_ptr<http::Responder>& res) {
  auto job = [this, run = std::move(run)] {
    run();
    Done();
  };
  {
    MutexLock l(mu_);
    if (running_ >= d_.cfg->sandbox_fusion_max_concurrent) {
      if (waiting_.size() >= kMaxWaiting) {
        l.Unlock();
        http::HttpResponse busy = Detail(
            429, "the node already runs " + std::to_string(d_.cfg->sandbox_fusion_max_concurrent) +
                     " calls in sandboxes and " + std::to_string(kMaxWaiting) +
                     " wait: retry later");
        busy.headers.emplace_back("Retry-After", "1");
        d_.metrics->CountRequest("POST", 429);
        return res->Send(std::move(busy));
      }
      waiting_.push_back(std::move(job));
      return;
    }
    running_++;
  }
  job();
}

void SandboxFusion::RunJupyter(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  auto reply = [this, res](int status, std::string body) { Reply(res, status, std::move(body)); };
  fusion::RunJupyterRequest jr;
  std::vector<fusion::FieldError> errors;
  if (!fusion::ParseRunJupyter(req.body, &jr, &errors))
    return reply(422, fusion::RenderDetail(errors));
  // The cells run in the code interpreter's kernel (e2b_interpreter.h), in a sandbox of their
  // own as /run_code's other languages: its source, then one request a cell, on its stdin; it
  // ends at the end of its input, or at total_timeout.
  auto rq = std::make_shared<fusion::RunCodeRequest>();
  rq->language = "jupyter";
  rq->run_timeout_s = jr.total_timeout_s;
  rq->files = std::move(jr.files);
  rq->fetch_files = std::move(jr.fetch_files);
  std::string in = Json(std::string(kE2bKernelSource)).dump() + "\n";
  std::string code_hash_input;
  for (const auto& cell : jr.cells) {
    Json r = {{"code", cell}};
    if (jr.cell_timeout_s > 0) r["timeout_s"] = jr.cell_timeout_s;
    in += r.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    code_hash_input += cell + "\n";
  }
  rq->stdin_data = std::move(in);
  d_.audit->Record({{"event", "run_jupyter"},
                    {"sandbox", "sandbox-fusion"},
                    {"cells", jr.cells.size()},
                    {"code_hash", Idempotency::Hash(code_hash_input)},
                    {"remote", req.remote}});
  const size_t want = jr.cells.size();
  Schedule(
      [this, rq, want, reply] {
        fusion::Language kernel{"jupyter", "", {}, {"python3", "-c", kE2bKernelBoot}, "python3"};
        std::optional<std::string> sandbox_error;
        fusion::RunCodeResult r;
        try {
          r = RunInSandbox(*rq, kernel, &sandbox_error, kMaxJupyterOutput);
        } catch (const std::exception& e) {
          DSEC_LOG_ERROR("sandbox fusion: {}", e.what());
          sandbox_error = "internal error";
        }
        if (sandbox_error || !r.run)
          return reply(
              200, fusion::RenderRunJupyter(fusion::RunStatus::kSandboxError,
                                            sandbox_error.value_or("no result"), r.run, {}, {}));
        std::string lines = std::move(r.run->stdout_data);
        r.run->stdout_data.clear();  // the kernel's protocol, given as cells
        if (r.run->status != fusion::CommandStatus::kFinished)
          return reply(200,
                       fusion::RenderRunJupyter(fusion::RunStatus::kFailed, "", r.run, {}, {}));
        auto cells = fusion::CellsFromKernel(lines);
        if (cells.size() < want)
          return reply(200, fusion::RenderRunJupyter(fusion::RunStatus::kFailed,
                                                     "the kernel exited after " +
                                                         std::to_string(cells.size()) + " of " +
                                                         std::to_string(want) + " cells",
                                                     r.run, cells, r.files));
        reply(200,
              fusion::RenderRunJupyter(fusion::RunStatus::kSuccess, "", r.run, cells, r.files));
      },
      res);
}

void SandboxFusion::Reply(const std::shared_ptr<http::Responder>& res, int status,
                          std::string body) {
  d_.metrics->CountRequest("POST", status);
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  res->Send(std::move(r));
}

void SandboxFusion::Done() {
  std::function<void()> next;
  {
    MutexLock l(mu_);
    if (waiting_.empty()) {
      running_--;
      return;
    }
    next = std::move(waiting_.front());  // its slot is the one this run gives up
    waiting_.pop_front();
  }
  boost::asio::post(*d_.workers, std::move(next));
}

bool SandboxFusion::RunOnFncall(const fusion::RunCodeRequest& rq,
                                const std::shared_ptr<http::Responder>& res) {
  auto pool = d_.pools ? d_.pools->Get(d_.cfg->sandbox_fusion_python_runtime) : nullptr;
  if (!pool || pool->config().kind != pools::PoolKind::kFncall) return false;
  const int64_t mem = rq.memory_limit_mb > 0 ? std::max<int64_t>(rq.memory_limit_mb, 16) : 0;
  if (mem > pool->config().resources.memory_mb) return false;  // a sandbox of that size
  pools::CallRequest cr;
  cr.call.code = rq.code;
  cr.call.filename = "main.py";
  cr.call.files = rq.files;
  cr.stdin_data = rq.stdin_data.value_or("");
  cr.timeout_ms = Ms(rq.run_timeout_s);
  cr.memory_mb = mem;
  cr.max_output_bytes = kMaxCaptured;
  Metrics* metrics = d_.metrics;
  std::string runtime = d_.cfg->sandbox_fusion_python_runtime;
  pool->Submit(std::move(cr), [res, metrics, runtime](StatusOr<pools::CallResult> r) {
    fusion::RunCodeResult out;
    std::optional<std::string> error;
    if (!r.ok()) {
      error = r.status().message();
      metrics->CountFnCall(runtime,
                           r.status().code() == StatusCode::kOverCapacity ? "rejected" : "error");
    } else {
      metrics->CountFnCall(runtime, r->out.result.timed_out ? "timeout" : "done");
      out.run =
          FromExec(r->out.result, std::move(r->out.stdout_data), std::move(r->out.stderr_data));
    }
    metrics->CountRequest("POST", 200);
    http::HttpResponse resp;
    resp.body = fusion::RenderRunCode(out, error);
    res->Send(std::move(resp));
  });
  return true;
}

fusion::RunCodeResult SandboxFusion::RunInSandbox(const fusion::RunCodeRequest& rq,
                                                  const fusion::Language& lang,
                                                  std::optional<std::string>* sandbox_error,
                                                  uint64_t max_output) {
  const EdgeConfig& cfg = *d_.cfg;
  fusion::RunCodeResult out;
  auto fail = [&](std::string why) {
    *sandbox_error = std::move(why);
    return out;
  };
  const int64_t mem = rq.memory_limit_mb > 0 ? std::max<int64_t>(rq.memory_limit_mb, 16) : 0;
  CreateParams p;
  p.image = cfg.sandbox_fusion_image;
  p.resources = cfg.defaults;
  p.ttl_s = static_cast<int64_t>(std::ceil(rq.compile_timeout_s + rq.run_timeout_s)) + 300;
  p.labels = {{"dsec.compat", "sandbox-fusion"}};
  auto pool = cfg.sandbox_fusion_pool.empty() ? nullptr : d_.pools->Get(cfg.sandbox_fusion_pool);
  if (pool && pool->config().kind == pools::PoolKind::kContainer &&
      (mem == 0 || mem <= pool->config().resources.memory_mb)) {
    static_cast<backends::SandboxShape&>(p) = pool->config().Shape();
    p.pool = cfg.sandbox_fusion_pool;
  } else {
    if (mem > 0) p.resources.memory_mb = mem;
    if (p.image != "host") {
      auto defaults = ImageDefaultsOf(d_.images, p.image);
      if (!defaults.ok()) return fail("sandbox_fusion_image: " + defaults.status().message());
      if (defaults->workdir) p.workdir = *defaults->workdir;
      if (defaults->user) p.user = *defaults->user;
      p.env = defaults->env;
    }
  }
  auto* workers = d_.workers;
  auto made = d_.manager->Create(p, 1, /*wait=*/true, [workers](std::function<void()> task) {
    boost::asio::post(*workers, std::move(task));
  });
  if (!made.ok()) return fail("no sandbox for the code: " + made.status().message());
  const std::string id = made->front().id;
  auto remove = MakeScopeGuard([&] { (void)d_.manager->Delete(id, "sandbox-fusion"); });
  auto entry = d_.manager->Get(id);
  if (!entry.ok()) return fail(entry.status().message());
  auto sb = (*entry)->Sandbox();
  if (!sb.ok()) return fail(sb.status().message());
  auto in_workdir = [&](const std::string& name) {
    return !name.empty() && name[0] == '/' ? name : JoinPath(p.workdir, name);
  };
  // Is the toolchain there? Asked before anything of the caller's is in the sandbox: what the
  // caller's code prints or exits with can never make its own failure a SandboxError.
  {
    backends::ExecRequest er;
    er.cmd = {"/bin/sh", "-c", "command -v -- \"$1\" >/dev/null", "sh", lang.tool};
    er.cwd = p.workdir;
    er.timeout_ms = 10000;
    auto r = (*sb)->Exec(er);
    if (!r.ok()) return fail("could not check for " + lang.tool + ": " + r.status().message());
    if (r->result.exit_code != 0)
      return fail("language " + lang.name + " needs " + lang.tool + ", which image " + p.image +
                  " does not have");
  }
  for (const auto& [name, data] : rq.files) {
    if (Status s = (*sb)->WriteFile(in_workdir(name), data, 0644); !s.ok())
      return fail("file " + name + ": " + s.message());
  }
  std::string code = rq.code;
  if (lang.name == "php" && code.find("<?php") == std::string::npos) code = "<?php\n" + code;
  if (!lang.source.empty())
    if (Status s = (*sb)->WriteFile(in_workdir(lang.source), code, 0644); !s.ok())
      return fail("the code's file: " + s.message());

  // memory_limit_MB is what the step's processes may use: a sandbox's cgroup also holds its
  // tmpfs disk's pages, so the limit is set before each step to the asked memory plus what the
  // disk holds by then (SandboxFusion limits the address space; files do not count).
  auto limit_memory = [&]() -> Status {
    if (mem <= 0) return OkStatus();
    DSEC_ASSIGN_OR_RETURN(backends::SandboxStats st, (*sb)->Stats());
    uint64_t disk = st.disk_kind == "tmpfs" ? st.disk_used : 0;
    return (*sb)->SetMemoryLimit(static_cast<int64_t>((static_cast<uint64_t>(mem) << 20) + disk));
  };
  auto step =
      [&](const std::vector<std::string>& argv, double timeout_s,
          const std::optional<std::string>& stdin_data) -> std::optional<fusion::CommandResult> {
    if (Status s = limit_memory(); !s.ok()) {
      *sandbox_error = "memory_limit_MB: " + s.message();
      return std::nullopt;
    }
    backends::ExecRequest er;
    er.cmd = argv;
    er.cwd = p.workdir;
    er.timeout_ms = Ms(timeout_s);
    er.max_output_bytes = max_output ? max_output : kMaxCaptured;
    er.stdin_data = stdin_data.value_or("");
    auto r = (*sb)->Exec(er);
    if (!r.ok()) {
      fusion::CommandResult c;
      c.status = fusion::CommandStatus::kError;
      c.stderr_data = r.status().message();
      return c;
    }
    return FromExec(r->result, std::move(r->stdout_data), std::move(r->stderr_data));
  };
  if (!lang.compile.empty()) {
    out.compile = step(lang.compile, rq.compile_timeout_s, std::nullopt);
    if (!out.compile) return out;
    if (out.compile->status != fusion::CommandStatus::kFinished || out.compile->return_code != 0)
      return out;  // no run after a failed compile
  }
  out.run = step(lang.run, rq.run_timeout_s, rq.stdin_data);
  if (!out.run) return out;
  // Fetched files: each at most kMaxFetched, all together at most kMaxFetchedTotal, each path
  // once; what is not a regular file, or too large, is left out (SandboxFusion skips what it
  // cannot read).
  uint64_t total = 0;
  std::set<std::string> seen;
  for (const auto& name : rq.fetch_files) {
    const std::string path = in_workdir(name);
    if (!seen.insert(path).second) continue;
    auto st = (*sb)->Stat(path);
    if (!st.ok() || st->type != "file" || st->size > kMaxFetched ||
        total + st->size > kMaxFetchedTotal)
      continue;
    auto data = (*sb)->ReadFile(path, kMaxFetched + 1);
    if (!data.ok() || data->size() > kMaxFetched || total + data->size() > kMaxFetchedTotal)
      continue;  // (it grew since the stat)
    total += data->size();
    out.files[name] = std::move(*data);
  }
  return out;
}

}  // namespace dsec::edge
