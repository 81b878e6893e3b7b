#include "edge/e2b_interpreter.h"

#include <signal.h>

#include <atomic>
#include <deque>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/e2b_internal.h"
#include "edge/exec_ticket.h"

namespace dsec::edge {

using namespace e2b_detail;  // NOLINT(google-build-using-namespace)

namespace {

constexpr const char* kDefaultContext = "default";
constexpr const char* kNdjson = "application/x-ndjson";
constexpr size_t kErrTail = 4096;

std::string Line(const Json& j) { return Dump(j) + "\n"; }

std::string ErrorLine(const std::string& name, const std::string& value) {
  return Line({{"type", "error"}, {"name", name}, {"value", value}, {"traceback", ""}});
}

const std::string& EndLine() {
  static const std::string end = Line({{"type", "end_of_execution"}});
  return end;
}

}  // namespace

// One execution: its client's stream, started at the kernel's first line for it (or at the
// first keepalive).
struct CodeInterpreter::Run {
  std::shared_ptr<http::Responder> res;
  std::string request;  // the line the kernel reads
  bool started = false;
  bool gone = false;  // the client went away
  int64_t last_write_ms = 0;

  void Write(const std::string& line) {
    if (gone) return;
    if (!started) {
      res->StartStream(200, kNdjson);
      started = true;
    }
    res->Write(line);
    last_write_ms = MonotonicMs();
  }
  // The execution's end; an error first when the kernel could not finish it.
  void Finish(const std::string& error_line = {}) {
    if (gone) return;
    if (!error_line.empty()) Write(error_line);
    Write(EndLine());
    res->End();
    gone = true;
  }
};

struct CodeInterpreter::Registry {
  std::shared_ptr<std::atomic<uint64_t>> held = std::make_shared<std::atomic<uint64_t>>(0);
  Mutex mu;
  std::map<std::string, std::map<std::string, std::shared_ptr<Kernel>>> kernels DSEC_GUARDED_BY(mu);

  std::shared_ptr<Kernel> Find(const std::string& sandbox, const std::string& id) {
    MutexLock l(mu);
    auto it = kernels.find(sandbox);
    if (it == kernels.end()) return nullptr;
    auto k = it->second.find(id);
    return k == it->second.end() ? nullptr : k->second;
  }
  void Forget(const std::string& sandbox, const std::string& id, const Kernel* self) {
    MutexLock l(mu);
    auto it = kernels.find(sandbox);
    if (it == kernels.end()) return;
    if (auto k = it->second.find(id); k != it->second.end() && k->second.get() == self)
      it->second.erase(k);
    if (it->second.empty()) kernels.erase(it);
  }
  std::vector<std::shared_ptr<Kernel>> All() {
    MutexLock l(mu);
    std::vector<std::shared_ptr<Kernel>> out;
    for (const auto& [sb, m] : kernels)
      for (const auto& [id, k] : m) out.push_back(k);
    return out;
  }
};

// A context's kernel: the observer of its exec. Lines it writes go to the execution in
// progress; the next queued one is sent when it ends.
struct CodeInterpreter::Kernel : public backends::ExecObserver,
                                 public std::enable_shared_from_this<Kernel> {
  std::weak_ptr<Registry> reg;
  std::string sandbox, id, cwd;
  uint64_t max_output = 0;
  std::shared_ptr<ExecTicket> ticket;

  Mutex mu;
  std::shared_ptr<backends::ExecHandle> handle DSEC_GUARDED_BY(mu);
  bool ready DSEC_GUARDED_BY(mu) = false;
  bool ended DSEC_GUARDED_BY(mu) = false;
  std::string partial DSEC_GUARDED_BY(mu);  // a line not ended yet
  // Node-wide: the bytes every kernel's partial line holds (kMaxHeldLines at most).
  std::shared_ptr<std::atomic<uint64_t>> held;
  uint64_t charged DSEC_GUARDED_BY(mu) = 0;   // this kernel's part of it
  bool skipping DSEC_GUARDED_BY(mu) = false;  // the rest of a line over kMaxLine
  uint64_t received DSEC_GUARDED_BY(mu) = 0;
  std::string err_tail DSEC_GUARDED_BY(mu);
  std::shared_ptr<Run> current DSEC_GUARDED_BY(mu);
  std::deque<std::shared_ptr<Run>> queue DSEC_GUARDED_BY(mu);
  int64_t interrupted_at DSEC_GUARDED_BY(mu) = 0;

  ~Kernel() {
    if (held) held->fetch_sub(charged);
  }
  bool Charge(uint64_t n) DSEC_REQUIRES(mu) {
    uint64_t cur = held->load();
    do {
      if (cur + n > kMaxHeldLines) return false;
    } while (!held->compare_exchange_weak(cur, cur + n));
    charged += n;
    return true;
  }
  void ClearPartial() DSEC_REQUIRES(mu) {
    partial.clear();
    held->fetch_sub(charged);
    charged = 0;
  }

  // The next request to send, if the kernel is free: it becomes the current execution.
  std::string NextLocked() DSEC_REQUIRES(mu) {
    if (!ready || ended || current || queue.empty()) return {};
    current = std::move(queue.front());
    queue.pop_front();
    interrupted_at = 0;
    return current->request;
  }
  void Send(std::string request) {
    if (request.empty()) return;
    std::shared_ptr<backends::ExecHandle> h;
    {
      MutexLock l(mu);
      h = handle;
    }
    Status s = h ? h->WriteStdin(std::move(request)) : FailedPrecondition("no kernel");
    if (!s.ok()) {
      DSEC_LOG_WARN("code interpreter {} of {}: {}", id, sandbox, s.message());
      if (h) h->Kill();  // its end fails what it holds
    }
  }
  Status Enqueue(std::shared_ptr<Run> run) {
    std::string next;
    {
      MutexLock l(mu);
      if (ended) return Unavailable("the context's kernel has exited");
      if (queue.size() >= kMaxQueued)
        return OverCapacity("context " + id + " already has " + std::to_string(kMaxQueued) +
                            " executions waiting");
      queue.push_back(run);
      next = NextLocked();
    }
    Send(std::move(next));
    return OkStatus();
  }
  // Its client went away: a queued execution is dropped, a running one interrupted.
  void Abandon(const Run* run) {
    std::shared_ptr<backends::ExecHandle> h;
    {
      MutexLock l(mu);
      for (auto it = queue.begin(); it != queue.end(); ++it)
        if (it->get() == run) {
          queue.erase(it);
          return;
        }
      if (current.get() != run || ended) return;
      current->gone = true;
      interrupted_at = MonotonicMs();
      h = handle;
    }
    if (h) h->Signal(SIGINT);
  }
  void Stop() {
    std::shared_ptr<backends::ExecHandle> h;
    {
      MutexLock l(mu);
      h = handle;
    }
    if (h) h->Kill();
  }
  void Tick(int64_t now) {
    std::shared_ptr<backends::ExecHandle> kill;
    {
      MutexLock l(mu);
      if (!current || ended) return;
      if (current->gone) {
        if (interrupted_at && now - interrupted_at > kInterruptGraceMs) kill = handle;
      } else if (now - current->last_write_ms >= kKeepaliveMs) {
        current->Write(Line({{"type", "keepalive"}}));
      }
    }
    if (kill) {
      DSEC_LOG_INFO(
          "code interpreter {} of {}: interrupted execution still running after {} ms; "
          "killing its kernel",
          id, sandbox, kInterruptGraceMs);
      kill->Kill();
    }
  }

  void OnLineLocked(std::string_view line, std::string* next) DSEC_REQUIRES(mu) {
    auto j = ParseJson(line);
    if (!j.ok() || !j->is_object()) return;
    auto t = j->find("type");
    if (t == j->end() || !t->is_string()) return;
    const std::string& type = t->get_ref<const std::string&>();
    if (!ready) {
      if (type == "ready") {
        ready = true;
        *next = NextLocked();
      }
      return;
    }
    if (!current) return;  // output between executions (a child still writing)
    if (type == "end_of_execution") {
      current->Finish();
      current.reset();
      *next = NextLocked();
      return;
    }
    std::string out(line);
    out += '\n';
    current->Write(out);
  }

  void OnOutput(uint8_t stream, std::string_view data) override {
    std::string next;
    std::shared_ptr<backends::ExecHandle> kill;
    {
      MutexLock l(mu);
      if (stream == backends::kStderrStream) {
        err_tail.append(data);
        if (err_tail.size() > kErrTail) err_tail.erase(0, err_tail.size() - kErrTail);
        return;
      }
      received += data.size();
      while (!data.empty()) {
        size_t nl = data.find('\n');
        std::string_view piece = data.substr(0, nl);
        if (!skipping) {
          const bool too_long = partial.size() + piece.size() > kMaxLine;
          if (too_long || !Charge(piece.size())) {
            skipping = true;
            ClearPartial();
            if (current)
              current->Write(ErrorLine(
                  "OutputTooLarge",
                  too_long ? "an output line of the kernel was over " +
                                 std::to_string(kMaxLine >> 20) + " MiB; it was dropped"
                           : "the node holds too many unfinished output lines of kernels now; "
                             "a line was dropped"));
          } else {
            partial.append(piece);
          }
        }
        if (nl == std::string_view::npos) break;
        if (!skipping) OnLineLocked(partial, &next);
        ClearPartial();
        skipping = false;
        data.remove_prefix(nl + 1);
      }
      // The agent stops relaying an exec's output at max_output_bytes: past that the kernel
      // can say nothing more, so it ends now (its context starts a fresh one next time).
      if (max_output && received >= max_output && !ended) {
        if (current) {
          current->Finish(
              ErrorLine("OutputLimit", "this context's kernel has written max_output_bytes (" +
                                           std::to_string(max_output) +
                                           ") in all and was stopped; its state is lost"));
          current.reset();
        }
        kill = handle;
      }
    }
    if (kill) kill->Kill();
    Send(std::move(next));
  }

  void OnExit(const StatusOr<backends::ExecResult>& r) override {
    std::vector<std::shared_ptr<Run>> runs;
    std::string why;
    {
      MutexLock l(mu);
      ended = true;
      handle.reset();
      if (!r.ok()) {
        why = r.status().message();
      } else if (r->oom_killed) {
        why = "it ran out of memory (the sandbox's memory_mb)";
      } else if (r->signal) {
        why = "killed by signal " + std::to_string(r->signal);
      } else {
        why = "exit status " + std::to_string(r->exit_code);
      }
      std::string tail(TrimWhitespace(err_tail));
      if (!tail.empty()) why += ": " + tail;
      if (current) runs.push_back(std::move(current));
      for (auto& q : queue) runs.push_back(std::move(q));
      queue.clear();
      for (const auto& run : runs)
        run->Finish(ErrorLine("DeadKernelError", "the kernel exited (" + why + ")"));
    }
    if (ticket) ticket->Finish(r);
    if (auto g = reg.lock()) g->Forget(sandbox, id, this);
  }
};

CodeInterpreter::CodeInterpreter(Deps d) : d_(std::move(d)), reg_(std::make_shared<Registry>()) {}

void CodeInterpreter::Send(const http::HttpRequest& req, const Res& res, int status,
                           std::string text, const char* content_type) {
  http::HttpResponse r;
  r.status = status;
  r.content_type = content_type;
  r.body = std::move(text);
  d_.metrics->CountRequest(req.method, status);
  res->Send(std::move(r));
}

void CodeInterpreter::Tick() {
  const int64_t now = MonotonicMs();
  for (const auto& k : reg_->All()) k->Tick(now);
}

void CodeInterpreter::Handle(const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
                             const Res& res) {
  std::string path = req.path;
  while (path.size() > 1 && path[1] == '/') path.erase(0, 1);  // "//execute": a trailing '/'
  std::vector<std::string> seg;
  for (auto s : SplitString(path, '/', true)) seg.emplace_back(s);
  if (seg.size() == 1 && seg[0] == "execute") {
    if (req.method != "POST") return Send(req, res, 405, "POST /execute");
    return Execute(req, e, res);
  }
  if (seg.empty() || seg[0] != "contexts" || seg.size() > 3)
    return Send(req, res, 404, "no route " + req.method + " " + req.path);
  if (seg.size() == 1) {
    if (req.method == "POST") return CreateContext(req, e, res);
    if (req.method != "GET") return Send(req, res, 405, "GET or POST /contexts");
    Json list = Json::array();
    {
      MutexLock l(reg_->mu);
      if (auto it = reg_->kernels.find(e->id); it != reg_->kernels.end())
        for (const auto& [id, k] : it->second)
          if (id != kDefaultContext)
            list.push_back({{"id", id}, {"language", "python"}, {"cwd", k->cwd}});
    }
    return Send(req, res, 200, Dump(list), "application/json");
  }
  const std::string& id = seg[1];
  auto k = reg_->Find(e->id, id);
  if (!k) return Send(req, res, 404, "Context " + id + " not found");
  if (seg.size() == 2) {
    if (req.method != "DELETE") return Send(req, res, 405, "DELETE /contexts/{id}");
    reg_->Forget(e->id, id, k.get());
    k->Stop();
    return Send(req, res, 204, "", "");
  }
  if (seg[2] != "restart") return Send(req, res, 404, "no route " + req.method + " " + req.path);
  if (req.method != "POST") return Send(req, res, 405, "POST /contexts/{id}/restart");
  // A fresh kernel in the same context (same id and cwd); the old one is killed, and what it
  // was running ends with a DeadKernelError.
  reg_->Forget(e->id, id, k.get());
  k->Stop();
  auto fresh = StartKernel(req, e, id, k->cwd);
  if (!fresh.ok()) return Send(req, res, 500, fresh.status().message());
  Send(req, res, 200, "null", "application/json");
}

void CodeInterpreter::CreateContext(const http::HttpRequest& req,
                                    const std::shared_ptr<SandboxEntry>& e, const Res& res) {
  Json j = Json::object();
  if (!TrimWhitespace(req.body).empty()) {
    auto p = ParseJson(req.body);
    if (!p.ok() || !p->is_object()) return Send(req, res, 400, "the body is not a JSON object");
    j = std::move(*p);
  }
  auto str = [&](const char* key) -> std::optional<std::string> {
    auto v = j.find(key);
    if (v == j.end() || v->is_null()) return std::string();
    if (!v->is_string()) return std::nullopt;
    return v->get<std::string>();
  };
  auto lang = str("language");
  auto cwd = str("cwd");
  if (!lang || !cwd) return Send(req, res, 400, "language and cwd must be strings");
  if (!lang->empty() && *lang != "python" && *lang != "python3")
    return Send(req, res, 400,
                "language '" + *lang + "' is not served by this code interpreter (python is)");
  auto k = StartKernel(req, e, RandomHex(16), cwd->empty() ? kHome : Resolve(*cwd, "user"));
  if (!k.ok()) {
    int status = k.status().code() == StatusCode::kInvalidArgument ? 400
                 : k.status().code() == StatusCode::kResourceExhausted ||
                         k.status().code() == StatusCode::kOverCapacity
                     ? 429
                     : 500;
    return Send(req, res, status, k.status().message());
  }
  Send(req, res, 200, Dump({{"id", (*k)->id}, {"language", "python"}, {"cwd", (*k)->cwd}}),
       "application/json");
}

StatusOr<std::shared_ptr<CodeInterpreter::Kernel>> CodeInterpreter::StartKernel(
    const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e, const std::string& id,
    const std::string& cwd) {
  DSEC_ASSIGN_OR_RETURN(auto sb, e->Sandbox());
  if (auto st = sb->Stat(cwd); !st.ok() || st->type != "dir")
    return InvalidArgument("cwd '" + cwd + "' is not a directory in the sandbox");
  auto k = std::make_shared<Kernel>();
  k->reg = reg_;
  k->held = reg_->held;
  k->sandbox = e->id;
  k->id = id;
  k->cwd = cwd;
  k->max_output = d_.cfg->max_output_bytes;
  {
    MutexLock l(reg_->mu);
    auto& mine = reg_->kernels[e->id];
    if (!mine.count(id) && mine.size() >= kMaxContexts)
      return Status(StatusCode::kOverCapacity,
                    "a sandbox has at most " + std::to_string(kMaxContexts) + " code contexts");
    mine[id] = k;  // (a restart's replacement takes the old one's place)
  }
  auto fail = [&](Status s) {
    reg_->Forget(e->id, id, k.get());
    return s;
  };
  backends::ExecRequest er;
  er.cmd = {"python3", "-c", kE2bKernelBoot};
  er.user = e->params.user;
  if (er.user != "root") er.env["HOME"] = kHome;
  er.cwd = cwd;
  er.timeout_ms = 0;
  er.stdin_stream = true;
  er.max_output_bytes = d_.cfg->max_output_bytes;
  auto ticket =
      ExecTicket::Take(d_.cfg->max_execs_per_sandbox, d_.audit, d_.metrics, e, "e2b-kernel",
                       Json::array({"python3", "<code interpreter kernel>"}), er.user, cwd,
                       req.principal, req.remote);
  if (!ticket.ok()) return fail(ticket.status());
  k->ticket = *ticket;
  auto h = sb->StartExec(er, k);
  if (!h.ok()) {
    k->ticket->Finish(h.status());
    return fail(Status(h.status().code(),
                       "could not start the code interpreter's kernel "
                       "(python3 in the sandbox): " +
                           h.status().message()));
  }
  {
    MutexLock l(k->mu);
    if (!k->ended) k->handle = *h;
  }
  // The kernel's source, the one line its bootstrap reads; requests follow once it is ready.
  if (Status s = (*h)->WriteStdin(Dump(Json(std::string(kE2bKernelSource))) + "\n"); !s.ok()) {
    (*h)->Kill();
    return fail(s);
  }
  return k;
}

void CodeInterpreter::Execute(const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
                              const Res& res) {
  auto p = ParseJson(req.body);
  if (!p.ok() || !p->is_object()) return Send(req, res, 400, "the body is not a JSON object");
  const Json& j = *p;
  auto code = j.find("code");
  if (code == j.end() || !code->is_string()) return Send(req, res, 400, "code must be a string");
  auto get_str = [&](const char* key) -> std::optional<std::string> {
    auto v = j.find(key);
    if (v == j.end() || v->is_null() || !v->is_string()) return std::nullopt;
    return v->get<std::string>();
  };
  auto ctx = get_str("context_id");
  auto lang = get_str("language");
  if (ctx && lang) return Send(req, res, 400, "give context_id or language, not both");
  if (lang && *lang != "python" && *lang != "python3")
    return Send(req, res, 400,
                "language '" + *lang + "' is not served by this code interpreter (python is)");
  Json request = {{"code", *code}};
  if (auto env = j.find("env_vars"); env != j.end() && !env->is_null()) {
    if (!env->is_object()) return Send(req, res, 400, "env_vars must be an object of strings");
    for (const auto& [k, v] : env->items())
      if (!v.is_string() || k.empty() || k.find('=') != std::string::npos)
        return Send(req, res, 400, "env_vars must map names to strings");
    request["env_vars"] = *env;
  }
  const std::string id = ctx ? *ctx : kDefaultContext;
  auto k = reg_->Find(e->id, id);
  if (!k && ctx) return Send(req, res, 404, "Context " + id + " not found");
  auto run = std::make_shared<Run>();
  run->res = res;
  run->request = Line(request);
  run->last_write_ms = MonotonicMs();
  bool queued = false;
  for (int attempt = 0; attempt < 2 && !queued; ++attempt) {
    if (!k) {
      // The default context's first use, or a context whose kernel exited: a fresh kernel.
      std::string cwd = kHome;
      if (auto sb = e->Sandbox(); sb.ok())
        if (auto st = (*sb)->Stat(cwd); !st.ok() || st->type != "dir") cwd = e->params.workdir;
      auto started = StartKernel(req, e, id, cwd);
      if (!started.ok()) {
        // As an execution's error: runCode returns it (the SDK hides an HTTP error's body).
        Send(req, res, 200,
             Line({{"type", "error"},
                   {"name", "KernelError"},
                   {"value", started.status().message()},
                   {"traceback", ""}}) +
                 EndLine(),
             kNdjson);
        return;
      }
      k = *started;
    }
    Status s = k->Enqueue(run);
    queued = s.ok();
    if (s.code() == StatusCode::kOverCapacity) {
      http::HttpResponse r;
      r.status = 429;
      r.content_type = "text/plain";
      r.body = s.message();
      r.headers.emplace_back("Retry-After", "1");
      d_.metrics->CountRequest(req.method, 429);
      return res->Send(std::move(r));
    }
    if (!queued) k.reset();  // it exited just now: once more with a fresh one
  }
  if (!queued) return Send(req, res, 503, "the context's kernel keeps exiting; try again");
  std::weak_ptr<Kernel> wk = k;
  Run* raw = run.get();
  res->OnDisconnect([wk, raw] {
    if (auto kk = wk.lock()) kk->Abandon(raw);
  });
  d_.metrics->CountRequest(req.method, 200);
}

}  // namespace dsec::edge
