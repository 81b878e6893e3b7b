// Exec routes: buffered, streamed (NDJSON) and background execs, signal-all, shell sessions
// and the WebSocket attach. None of them holds a worker thread while a command runs: output
// and the exit arrive through ExecObserver callbacks on the backend's I/O threads.
// Every exec is written to the audit log when it starts and when it ends.
#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <cmath>
#include <csignal>

#include "base/base64.h"
#include "base/clock.h"
#include "base/ids.h"
#include "edge/api.h"
#include "edge/exec_ticket.h"
#include "http/json_body.h"

namespace dsec::edge {

namespace {

using backends::ExecHandle;
using backends::ExecObserver;
using backends::ExecRequest;
using backends::ExecResult;

constexpr uint64_t kDefaultOutput = 1 << 20;
constexpr int64_t kMaxTimeoutMs = 86400000;

struct ExecParams {
  ExecRequest req;
  bool base64 = false;
  bool background = false;
  Json audit_cmd;
};

// "user" names a user of the sandbox ("sandbox", "root", a name or a uid); empty is an error,
// not the default.
Status CheckUser(const std::optional<std::string>& user) {
  if (user && user->empty()) return InvalidArgument("\"user\" must not be empty");
  return OkStatus();
}

StatusOr<ExecParams> ParseExec(const std::string& body, const EdgeConfig& cfg) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  ExecParams p;
  // "cmd" as a string (E2B-style REST users send one) runs as "sh -c STRING", as "shell" does.
  std::optional<std::vector<std::string>> cmd;
  std::optional<std::string> cmd_string;
  if (auto it = b.json().find("cmd"); it != b.json().end() && it->is_string()) {
    DSEC_ASSIGN_OR_RETURN(cmd_string, b.String("cmd", 1 << 20));
  } else {
    DSEC_ASSIGN_OR_RETURN(cmd, b.StringArray("cmd", 4096, 1 << 20));
  }
  DSEC_ASSIGN_OR_RETURN(auto shell, b.String("shell", 1 << 20));
  DSEC_ASSIGN_OR_RETURN(auto stdin_data, b.String("stdin", cfg.max_json_body_bytes));
  DSEC_ASSIGN_OR_RETURN(auto stdin_enc, b.String("stdin_encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto env, b.StringMap("env", 256, 256, 32 << 10));
  DSEC_ASSIGN_OR_RETURN(auto cwd, b.String("cwd", 4096));
  DSEC_ASSIGN_OR_RETURN(auto user, b.String("user", 64));
  DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 0, kMaxTimeoutMs));
  DSEC_ASSIGN_OR_RETURN(auto max_out,
                        b.Int("max_output_bytes", 0, static_cast<int64_t>(cfg.max_output_bytes)));
  DSEC_ASSIGN_OR_RETURN(auto enc, b.String("encoding", 16));
  DSEC_ASSIGN_OR_RETURN(auto background, b.Bool("background"));
  DSEC_ASSIGN_OR_RETURN(auto grader, b.Bool("grader"));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  if ((cmd.has_value() || cmd_string.has_value()) == shell.has_value())
    return InvalidArgument(
        "give exactly one of \"cmd\" (an array, or a string for sh -c) and \"shell\"");
  if (cmd_string) {
    if (cmd_string->empty()) return InvalidArgument("\"cmd\" must not be empty");
    shell = std::move(cmd_string);
  }
  if (cmd) {
    if (cmd->empty() || (*cmd)[0].empty()) return InvalidArgument("\"cmd\" must not be empty");
    p.req.cmd = *cmd;
    p.audit_cmd = AuditLog::Command(*cmd);
  } else {
    p.req.shell = *shell;
    p.audit_cmd = AuditLog::Clip(*shell);
  }
  if (enc && *enc != "utf-8" && *enc != "base64")
    return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
  p.base64 = enc && *enc == "base64";
  DSEC_ASSIGN_OR_RETURN(p.req.stdin_data, DecodeStdin(std::move(stdin_data), stdin_enc));
  if (cwd && (cwd->empty() || (*cwd)[0] != '/'))
    return InvalidArgument("\"cwd\" must be an absolute path");
  DSEC_RETURN_IF_ERROR(CheckUser(user));
  if (env) p.req.env = http::Flatten(*env);
  if (cwd) p.req.cwd = *cwd;
  if (user) p.req.user = *user;
  p.req.timeout_ms = timeout.value_or(30000);
  p.req.max_output_bytes = static_cast<uint64_t>(max_out.value_or(kDefaultOutput));
  p.background = background.value_or(false);
  p.req.grader = grader.value_or(false);  // (with "user": 400 from the backend)
  return p;
}

}  // namespace

StatusOr<std::string> DecodeStdin(std::optional<std::string> data,
                                  const std::optional<std::string>& encoding) {
  if (encoding && *encoding != "utf-8" && *encoding != "base64")
    return InvalidArgument("\"stdin_encoding\" must be \"utf-8\" or \"base64\"");
  if (!data) return std::string();
  if (encoding && *encoding == "base64") {
    auto d = Base64Decode(*data);
    if (!d) return InvalidArgument("\"stdin\" is not valid base64");
    return std::move(*d);
  }
  return std::move(*data);
}

Json ResultJson(const ExecResult& r, bool base64) {
  return {{"exit_code", r.exit_code},
          {"signal", r.signal ? Json(r.signal) : Json(nullptr)},
          {"stdout_truncated", r.stdout_truncated},
          {"stderr_truncated", r.stderr_truncated},
          {"timed_out", r.timed_out},
          {"oom_killed", r.oom_killed},
          {"duration_ms", std::round(r.duration_ms * 1000.0) / 1000.0},  // to the microsecond
          {"stdout_bytes", r.stdout_bytes},
          {"stderr_bytes", r.stderr_bytes},
          {"encoding", base64 ? "base64" : "utf-8"}};
}

namespace {

Json ErrorJson(const Status& s) {
  auto [status, code] = HttpErrorFor(s);
  (void)status;
  return {{"error", {{"code", code}, {"message", s.message()}}}};
}

// An exec ticket (edge/exec_ticket.h) for a request of the API.
StatusOr<std::shared_ptr<ExecTicket>> TakeTicket(const std::shared_ptr<Ctx>& c,
                                                 std::shared_ptr<SandboxEntry> e, const char* kind,
                                                 Json command, const std::string& user,
                                                 const std::string& cwd) {
  const auto& d = c->api->deps();
  return ExecTicket::Take(d.cfg.max_execs_per_sandbox, d.audit, d.metrics, std::move(e), kind,
                          std::move(command), user, cwd, c->req.principal, c->req.remote);
}

// Collects output (capped per stream, and by the node-wide output budget) and calls `done`
// once with the result JSON, or an error. The budget's charge lives as long as the observer,
// or longer if `done` keeps it (charge()) with a background exec's result.
class CollectObserver : public ExecObserver {
 public:
  using Done = std::function<void(const StatusOr<Json>&)>;
  CollectObserver(uint64_t cap, bool base64, Done done, std::shared_ptr<ExecTicket> ticket,
                  OutputBudget* budget)
      : cap_(cap),
        base64_(base64),
        done_(std::move(done)),
        ticket_(std::move(ticket)),
        charge_(budget->NewCharge()) {}

  void OnOutput(uint8_t stream, std::string_view data) override {
    bool is_err = stream == backends::kStderrStream;
    std::string& buf = is_err ? err_ : out_;
    // The agent enforces the cap; this keeps a misbehaving agent from growing us.
    if (buf.size() >= cap_) return;
    data = data.substr(0, cap_ - buf.size());
    uint64_t granted = charge_->Take(data.size());
    if (granted < data.size()) (is_err ? err_dropped_ : out_dropped_) = true;
    buf.append(data.substr(0, granted));
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    ticket_->Finish(r);
    if (!r.ok()) return done_(r.status());
    Json j = ResultJson(*r, base64_);
    Encoder eo(base64_), ee(base64_);
    j["stdout"] = eo.Take(out_, true);
    j["stderr"] = ee.Take(err_, true);
    // What the node's output budget could not hold is cut like what passed the cap.
    if (out_dropped_) j["stdout_truncated"] = true;
    if (err_dropped_) j["stderr_truncated"] = true;
    std::string().swap(out_);
    std::string().swap(err_);
    done_(j);
  }
  const std::shared_ptr<OutputBudget::Charge>& charge() const { return charge_; }

 private:
  uint64_t cap_;
  bool base64_;
  Done done_;
  std::shared_ptr<ExecTicket> ticket_;
  std::shared_ptr<OutputBudget::Charge> charge_;
  std::string out_, err_;
  bool out_dropped_ = false, err_dropped_ = false;
};

// Writes NDJSON events to a streaming response. Events that arrive before the stream is
// started (a fast command) are held and flushed in order by Begin().
class StreamObserver : public ExecObserver {
 public:
  StreamObserver(std::shared_ptr<http::Responder> res, bool base64,
                 std::shared_ptr<ExecTicket> ticket)
      : res_(std::move(res)),
        out_(base64),
        err_(base64),
        base64_(base64),
        ticket_(std::move(ticket)) {}

  void Begin() {
    MutexLock l(mu_);
    res_->StartStream(200, "application/x-ndjson", {{"Cache-Control", "no-store"}});
    started_ = true;
    for (auto& line : pending_) res_->Write(std::move(line));
    pending_.clear();
    if (!final_.empty()) res_->End(std::move(final_));
  }
  void OnOutput(uint8_t stream, std::string_view data) override {
    bool is_err = stream == backends::kStderrStream;
    std::string text = (is_err ? err_ : out_).Take(data, false);
    if (text.empty()) return;
    Emit(Json{{is_err ? "stderr" : "stdout", text}});
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    ticket_->Finish(r);
    for (bool is_err : {false, true}) {
      std::string rest = (is_err ? err_ : out_).Take("", true);
      if (!rest.empty()) Emit(Json{{is_err ? "stderr" : "stdout", rest}});
    }
    Json last = r.ok() ? Json{{"exit", ResultJson(*r, base64_)}} : ErrorJson(r.status());
    std::string line = last.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    MutexLock l(mu_);
    if (started_) {
      res_->End(std::move(line));
    } else {
      final_ = std::move(line);
    }
  }

 private:
  void Emit(const Json& j) {
    std::string line = j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    MutexLock l(mu_);
    if (started_) {
      res_->Write(std::move(line));
    } else {
      pending_.push_back(std::move(line));
    }
  }
  std::shared_ptr<http::Responder> res_;
  Encoder out_, err_;
  bool base64_;
  std::shared_ptr<ExecTicket> ticket_;
  Mutex mu_;
  bool started_ = false;
  std::vector<std::string> pending_;
  std::string final_;
};

// A background exec is a job its sandbox's agent keeps (agent/jobs.h), so that it and its
// output survive a restart of the edge; the edge holds nothing of it but the audit ticket.
// Its encoding is kept with it ("meta").
bool JobBase64(const protocol::JobInfo& i) { return i.meta == "base64"; }

// ExecStatus. `out`/`err`: the whole output (the result's stdout and stderr) once it exited;
// without them the result has only the exit fields (lists, live reads).
Json JobJson(const protocol::JobInfo& i, const std::string* out = nullptr,
             const std::string* err = nullptr) {
  bool base64 = JobBase64(i);
  Json j = {{"exec_id", i.job_id},
            {"state", i.done ? "exited" : "running"},
            {"started_at", i.started_at},
            {"result", nullptr}};
  if (i.done) {
    Json r = ResultJson(i.result, base64);
    if (out && err) {
      r["stdout"] = Encoder(base64).Take(*out, true);
      r["stderr"] = Encoder(base64).Take(*err, true);
    }
    j["result"] = std::move(r);
  }
  return j;
}

// An agent's "job not found" names the exec and its sandbox.
Status ExecStatusFor(const Status& s, const std::string& eid, const std::string& sandbox) {
  if (s.code() == StatusCode::kNotFound)
    return NotFound("exec " + eid + " not found in sandbox " + sandbox);
  return s;
}

// Follows a job until it exits, for its audit line and exec slot (a wait the agent answers
// at least every kMaxJobWaitMs; the connection closing ends it).
void WatchJob(std::weak_ptr<backends::Sandbox> weak, std::string id,
              std::shared_ptr<ExecTicket> ticket) {
  auto sb = weak.lock();
  if (!sb) return ticket->Finish(Unavailable("the sandbox is gone"));
  protocol::JobReadRequest req;
  req.job_id = id;
  req.max_bytes = 0;
  req.wait_ms = protocol::kMaxJobWaitMs;
  req.wait_exit = true;
  sb->ReadJob(req, [weak, id, ticket](StatusOr<backends::AgentSession::JobOutput> r) {
    if (!r.ok()) return ticket->Finish(r.status());
    if (r->read.info.done) return ticket->Finish(r->read.info.result);
    WatchJob(weak, id, ticket);
  });
}

void StartBackground(const std::shared_ptr<Ctx>& c, const std::shared_ptr<SandboxEntry>& e,
                     const std::shared_ptr<backends::Sandbox>& sb, const ExecParams& p,
                     std::shared_ptr<ExecTicket> ticket) {
  const auto& d = c->api->deps();
  protocol::JobStartRequest job;
  job.job_id = "ex-" + RandomBase32(12);
  job.started_at = WallMs();
  job.meta = p.base64 ? "base64" : "";
  job.keep = static_cast<uint32_t>(std::max(1, d.cfg.max_background_execs_kept));
  // Kept in the sandbox's own memory: a quarter of it at most, and 64 MiB.
  job.max_kept_bytes =
      std::min<uint64_t>(64ull << 20, static_cast<uint64_t>(e->params.resources.memory_mb) << 18);
  auto info = sb->StartJob(p.req, std::move(job));
  if (!info.ok()) {
    ticket->Finish(info.status());
    return c->Fail(info.status());
  }
  WatchJob(sb, info->job_id, std::move(ticket));
  c->Reply(202, {{"exec_id", info->job_id}});
}

void Exec(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  auto p = ParseExec(c->req.body, d.cfg);
  if (!p.ok()) return c->Fail(p.status());
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e);
  if (!sb.ok()) return c->Fail(sb.status());
  const std::string& user = p->req.grader         ? "grader"
                            : p->req.user.empty() ? e->params.user
                                                  : p->req.user;
  const std::string& cwd = p->req.cwd.empty() ? e->params.workdir : p->req.cwd;
  auto ticket = TakeTicket(c, e, p->background ? "background" : "exec", p->audit_cmd, user, cwd);
  if (!ticket.ok()) return c->Fail(ticket.status());

  if (c->FlagQuery("stream") && !p->background) {
    auto obs = std::make_shared<StreamObserver>(c->res, p->base64, *ticket);
    auto h = (*sb)->StartExec(p->req, obs);
    if (!h.ok()) {
      (*ticket)->Finish(h.status());
      return c->Fail(h.status());
    }
    obs->Begin();
    // API.md: a client that goes away takes its command with it.
    std::weak_ptr<ExecHandle> weak = *h;
    c->res->OnDisconnect([weak] {
      if (auto handle = weak.lock()) handle->Kill();
    });
    return;
  }
  if (p->background) return StartBackground(c, e, *sb, *p, std::move(*ticket));
  auto obs = std::make_shared<CollectObserver>(
      p->req.max_output_bytes, p->base64,
      [c](const StatusOr<Json>& r) {
        if (!r.ok()) return c->Fail(r.status());
        c->Reply(200, *r);
      },
      *ticket, d.output_budget);
  auto h = (*sb)->StartExec(p->req, obs);
  if (!h.ok()) {
    (*ticket)->Finish(h.status());
    return c->Fail(h.status());
  }
}

// The sandbox of an exec route, and its validated exec id.
StatusOr<std::shared_ptr<backends::Sandbox>> ExecSandbox(const std::shared_ptr<Ctx>& c,
                                                         std::string* eid) {
  DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
  DSEC_RETURN_IF_ERROR(ValidateId("exec id", c->params["eid"]));
  *eid = c->params["eid"];
  return sb;
}

void ListExecs(const std::shared_ptr<Ctx>& c) {
  auto sb = c->Sandbox();
  if (!sb.ok()) return c->Fail(sb.status());
  auto jobs = (*sb)->ListJobs();
  if (!jobs.ok()) return c->Fail(jobs.status());
  Json list = Json::array();
  for (const auto& i : *jobs) list.push_back(JobJson(i));
  c->Reply(200, {{"execs", list}});
}

// Answers with the whole result: reads all the output the agent kept (charged to the node's
// output budget while the answer is built; what it cannot hold is cut and marked truncated).
void ReplyWithResult(const std::shared_ptr<Ctx>& c, const std::shared_ptr<backends::Sandbox>& sb,
                     const protocol::JobInfo& info) {
  if (!info.done) return c->Reply(200, JobJson(info));
  protocol::JobReadRequest req;
  req.job_id = info.job_id;
  req.max_bytes = std::min(protocol::kMaxJobRead, info.stdout_kept + info.stderr_kept);
  std::string sandbox = sb->id();
  OutputBudget* budget = c->api->deps().output_budget;
  sb->ReadJob(req, [c, sandbox, budget](StatusOr<backends::AgentSession::JobOutput> r) {
    if (!r.ok()) return c->Fail(ExecStatusFor(r.status(), c->params["eid"], sandbox));
    auto charge = budget->NewCharge();
    protocol::JobInfo i = r->read.info;
    for (auto [data, cut] : {std::pair{&r->out, &i.result.stdout_truncated},
                             std::pair{&r->err, &i.result.stderr_truncated}}) {
      uint64_t got = charge->Take(data->size());
      if (got < data->size()) {
        data->resize(got);
        *cut = true;
      }
    }
    c->Reply(200, JobJson(i, &r->out, &r->err));
  });
}

// GET .../execs/{eid}: its status, and its result once it exited. With stdout_offset or
// stderr_offset, its output so far from those offsets instead (live, also while it runs):
// wait_ms then waits for output past them, not for the exit. A stream without an offset is
// answered empty at its end.
void GetExec(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> Status {
    std::string eid;
    DSEC_ASSIGN_OR_RETURN(auto sb, ExecSandbox(c, &eid));
    DSEC_ASSIGN_OR_RETURN(int64_t wait, c->IntQuery("wait_ms", 0, 0, protocol::kMaxJobWaitMs));
    bool want_out = false, want_err = false;
    for (const auto& [k, v] : c->req.query) {
      want_out |= k == "stdout_offset";
      want_err |= k == "stderr_offset";
    }
    const bool live = want_out || want_err;
    DSEC_ASSIGN_OR_RETURN(int64_t so, c->IntQuery("stdout_offset", 0, 0, INT64_MAX));
    DSEC_ASSIGN_OR_RETURN(int64_t se, c->IntQuery("stderr_offset", 0, 0, INT64_MAX));
    DSEC_ASSIGN_OR_RETURN(int64_t max, c->IntQuery("max_bytes", 1 << 20, 0, protocol::kMaxJobRead));
    protocol::JobReadRequest req;
    req.job_id = eid;
    req.wait_ms = wait;
    std::string sandbox = sb->id();
    if (!live) {
      req.max_bytes = 0;
      req.wait_exit = true;
      sb->ReadJob(req, [c, sb, eid, sandbox](StatusOr<backends::AgentSession::JobOutput> r) {
        if (!r.ok()) return c->Fail(ExecStatusFor(r.status(), eid, sandbox));
        ReplyWithResult(c, sb, r->read.info);
      });
      return OkStatus();
    }
    // A stream without an offset is read from its end: nothing of it, and a wait wakes only
    // for the streams asked for.
    req.stdout_offset = static_cast<uint64_t>(want_out ? so : INT64_MAX);
    req.stderr_offset = static_cast<uint64_t>(want_err ? se : INT64_MAX);
    req.max_bytes = static_cast<uint64_t>(max);
    sb->ReadJob(req, [c, eid, sandbox](StatusOr<backends::AgentSession::JobOutput> r) {
      if (!r.ok()) return c->Fail(ExecStatusFor(r.status(), eid, sandbox));
      const protocol::JobInfo& i = r->read.info;
      Json j = JobJson(i);
      bool base64 = JobBase64(i);
      for (auto [name, data, start, kept] :
           {std::tuple{"stdout", &r->out, r->read.stdout_offset, i.stdout_kept},
            std::tuple{"stderr", &r->err, r->read.stderr_offset, i.stderr_kept}}) {
        // Text stops before a UTF-8 sequence the next read completes, unless none can follow.
        bool last = i.done && start + data->size() >= kept;
        std::string text = Encoder(base64).Take(*data, last);
        uint64_t used = base64 ? data->size() : text.size();
        j[name] = std::move(text);
        j[std::string(name) + "_offset"] = start + used;
      }
      j["encoding"] = base64 ? "base64" : "utf-8";
      c->Reply(200, j);
    });
    return OkStatus();
  };
  if (Status s = run(); !s.ok()) c->Fail(s);
}

// POST .../execs/{eid}/kill: kills its process tree and answers once it is gone, with its
// result (the exec stays until deleted or forgotten).
void KillExec(const std::shared_ptr<Ctx>& c) {
  std::string eid;
  auto sb = ExecSandbox(c, &eid);
  if (!sb.ok()) return c->Fail(sb.status());
  auto info = (*sb)->KillJob(eid, false);
  if (!info.ok()) return c->Fail(ExecStatusFor(info.status(), eid, (*sb)->id()));
  ReplyWithResult(c, *sb, *info);
}

// DELETE .../execs/{eid}: kills it if it runs, and forgets it (then 404).
void DeleteExec(const std::shared_ptr<Ctx>& c) {
  std::string eid;
  auto sb = ExecSandbox(c, &eid);
  if (!sb.ok()) return c->Fail(sb.status());
  auto info = (*sb)->KillJob(eid, true);
  if (!info.ok()) return c->Fail(ExecStatusFor(info.status(), eid, (*sb)->id()));
  c->NoContent();
}

StatusOr<int> ParseSignal(const Json* v) {
  if (!v) return InvalidArgument("\"signal\" is required");
  if (v->is_number_integer()) {
    int64_t n = v->get<int64_t>();
    if (n < 1 || n > 64) return InvalidArgument("signal numbers are 1-64");
    return static_cast<int>(n);
  }
  if (!v->is_string()) return InvalidArgument("\"signal\" must be a name or a number");
  std::string s = v->get<std::string>();
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  static const std::pair<const char*, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"STOP", SIGSTOP},
      {"CONT", SIGCONT}, {"ALRM", SIGALRM}, {"PIPE", SIGPIPE}, {"WINCH", SIGWINCH}};
  for (const auto& [name, sig] : kNames)
    if (s == name) return sig;
  return InvalidArgument("unknown signal \"" + v->get<std::string>() + "\"");
}

void SignalAll(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<int> {
    DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(c->req.body));
    const Json* sig = b.Raw("signal");
    DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
    (void)rid;
    DSEC_RETURN_IF_ERROR(b.Finish());
    DSEC_ASSIGN_OR_RETURN(int signo, ParseSignal(sig));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    return sb->SignalAll(signo);
  };
  auto n = run();
  if (!n.ok()) return c->Fail(n.status());
  c->Reply(200, {{"signaled", *n}});
}

// --- shells --------------------------------------------------------------------------------

// The API's shell ids are "sh-<...>" (api-ext, openapi ShellId); the agent numbers its shells
// "sh<N>". "sh<N>" <-> "sh-<N>"; any other backend id X <-> "sh-X".
bool AllDigits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::string ApiShellId(const std::string& id) {
  if (id.starts_with("sh") && AllDigits(std::string_view(id).substr(2)))
    return "sh-" + id.substr(2);
  return "sh-" + id;
}

// The backend id for an API shell id; NotFound for anything not shaped like one of ours.
StatusOr<std::string> BackendShellId(const std::string& api_id) {
  DSEC_RETURN_IF_ERROR(ValidateId("shell id", api_id));
  if (!api_id.starts_with("sh-") || api_id.size() == 3)
    return NotFound("shell " + api_id + " not found");
  std::string rest = api_id.substr(3);
  return AllDigits(rest) ? "sh" + rest : rest;
}

void OpenShell(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<std::string> {
    DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(c->req.body));
    DSEC_ASSIGN_OR_RETURN(auto user, b.String("user", 64));
    DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
    (void)rid;
    DSEC_RETURN_IF_ERROR(b.Finish());
    DSEC_RETURN_IF_ERROR(CheckUser(user));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    DSEC_ASSIGN_OR_RETURN(std::string id, sb->OpenShell(user.value_or("")));
    return ApiShellId(id);
  };
  auto id = run();
  if (!id.ok()) return c->Fail(id.status());
  c->Reply(201, {{"shell_id", *id}});
}

void ListShells(const std::shared_ptr<Ctx>& c) {
  auto sb = c->Sandbox();
  if (!sb.ok()) return c->Fail(sb.status());
  Json ids = Json::array();
  for (const auto& id : (*sb)->ListShells()) ids.push_back(ApiShellId(id));
  c->Reply(200, {{"shells", ids}});
}

void RunShell(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  struct Req {
    std::string command;
    int64_t timeout_ms;
    uint64_t max_output;
    bool base64;
  };
  std::string shell_id;
  auto parse = [&]() -> StatusOr<Req> {
    DSEC_ASSIGN_OR_RETURN(shell_id, BackendShellId(c->params["sid"]));
    DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(c->req.body));
    DSEC_ASSIGN_OR_RETURN(auto cmd, b.String("command", 1 << 20));
    DSEC_ASSIGN_OR_RETURN(auto timeout, b.Int("timeout_ms", 0, kMaxTimeoutMs));
    DSEC_ASSIGN_OR_RETURN(
        auto max_out, b.Int("max_output_bytes", 0, static_cast<int64_t>(d.cfg.max_output_bytes)));
    DSEC_ASSIGN_OR_RETURN(auto enc, b.String("encoding", 16));
    DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
    (void)rid;
    DSEC_RETURN_IF_ERROR(b.Finish());
    if (!cmd) return InvalidArgument("\"command\" is required");
    if (enc && *enc != "utf-8" && *enc != "base64")
      return InvalidArgument("\"encoding\" must be \"utf-8\" or \"base64\"");
    return Req{*cmd, timeout.value_or(60000),
               static_cast<uint64_t>(max_out.value_or(kDefaultOutput)), enc && *enc == "base64"};
  };
  auto r = parse();
  if (!r.ok()) return c->Fail(r.status());
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e);
  if (!sb.ok()) return c->Fail(sb.status());
  auto ticket = TakeTicket(c, e, "shell", AuditLog::Clip(r->command), e->params.user,
                           "shell:" + c->params["sid"]);
  if (!ticket.ok()) return c->Fail(ticket.status());
  auto obs = std::make_shared<CollectObserver>(
      r->max_output, r->base64,
      [c](const StatusOr<Json>& res) {
        if (!res.ok()) return c->Fail(res.status());
        c->Reply(200, *res);
      },
      *ticket, c->api->deps().output_budget);
  auto h = (*sb)->RunInShell(shell_id, r->command, r->timeout_ms, r->max_output, obs);
  if (!h.ok()) {
    (*ticket)->Finish(h.status());
    return c->Fail(h.status());
  }
}

void CloseShell(const std::shared_ptr<Ctx>& c) {
  auto shell_id = BackendShellId(c->params["sid"]);
  Status s = shell_id.status();
  if (s.code() == StatusCode::kNotFound) s = OkStatus();  // 404 after the sandbox check
  auto sb = c->Sandbox();
  if (s.ok()) s = sb.status();
  if (s.ok()) s = shell_id.status();
  if (s.ok()) s = (*sb)->CloseShell(*shell_id);
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

// --- attach ------------------------------------------------------------------------------

class AttachSession : public http::WebSocketHandler,
                      public ExecObserver,
                      public std::enable_shared_from_this<AttachSession> {
 public:
  AttachSession(std::shared_ptr<backends::Sandbox> sb, ExecRequest req,
                std::shared_ptr<ExecTicket> ticket)
      : sb_(std::move(sb)), req_(std::move(req)), ticket_(std::move(ticket)) {}

  void OnOpen(std::shared_ptr<http::WebSocketConn> conn) override {
    MutexLock l(mu_);
    conn_ = conn;
    auto h = sb_->StartExec(req_, shared_from_this());
    if (!h.ok()) {
      ticket_->Finish(h.status());
      conn->Send(ErrorJson(h.status()).dump(), false);
      conn->Close();
      return;
    }
    handle_ = *h;
  }
  void OnMessage(std::string data, bool binary) override {
    std::shared_ptr<ExecHandle> h;
    {
      MutexLock l(mu_);
      h = handle_;
    }
    if (!h) return;
    if (binary) {
      if (Status s = h->WriteStdin(std::move(data)); !s.ok()) Abort(s);
      return;
    }
    auto j = ParseJson(data);
    if (!j.ok() || !j->is_object())
      return Abort(InvalidArgument("control frames are JSON objects"));
    if (auto it = j->find("resize"); it != j->end()) {
      if (it->is_array() && it->size() == 2 && (*it)[0].is_number_unsigned() &&
          (*it)[1].is_number_unsigned())
        h->Resize(static_cast<uint16_t>(std::min<uint64_t>((*it)[0].get<uint64_t>(), 65535)),
                  static_cast<uint16_t>(std::min<uint64_t>((*it)[1].get<uint64_t>(), 65535)));
    }
    if (auto it = j->find("signal"); it != j->end()) {
      auto sig = ParseSignal(&*it);
      if (sig.ok()) h->Signal(*sig);
    }
    if (j->value("eof", false)) h->CloseStdin();
  }
  void OnClose() override {
    std::shared_ptr<ExecHandle> h;
    {
      MutexLock l(mu_);
      h = handle_;
      conn_.reset();
    }
    if (h && !exited_) h->Kill();  // the client went away: so does its command
    // Nothing ran (the upgrade failed, or the client left first): the ticket ends here.
    if (!h && !exited_) ticket_->Finish(Unavailable("the WebSocket upgrade did not complete"));
  }
  void OnOutput(uint8_t stream, std::string_view data) override {
    auto conn = Conn();
    if (!conn) return;
    if (stream == backends::kStderrStream && !req_.tty) {
      conn->Send(Json({{"stderr", Base64Encode(data)}}).dump(), false);
    } else {
      conn->Send(std::string(data), true);
    }
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    exited_ = true;
    ticket_->Finish(r);
    auto conn = Conn();
    {
      MutexLock l(mu_);
      handle_.reset();
    }
    if (!conn) return;
    Json last = r.ok() ? Json{{"exit", ResultJson(*r, false)}} : ErrorJson(r.status());
    conn->Send(last.dump(-1, ' ', false, Json::error_handler_t::replace), false);
    conn->Close();
  }

 private:
  std::shared_ptr<http::WebSocketConn> Conn() {
    MutexLock l(mu_);
    return conn_;
  }
  void Abort(const Status& s) {
    if (auto conn = Conn()) {
      conn->Send(ErrorJson(s).dump(), false);
      conn->Close();
    }
  }
  std::shared_ptr<backends::Sandbox> sb_;
  ExecRequest req_;
  std::shared_ptr<ExecTicket> ticket_;
  Mutex mu_;
  std::shared_ptr<http::WebSocketConn> conn_;
  std::shared_ptr<ExecHandle> handle_;
  std::atomic<bool> exited_{false};
};

void Attach(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  if (!c->req.websocket_upgrade)
    return c->Fail(400, "bad_request", "attach needs a WebSocket upgrade request");
  ExecRequest req;
  req.cmd = c->req.QueryAll("cmd");
  if (const std::string* sh = c->req.Query("shell")) req.shell = *sh;
  if (req.cmd.empty() && !req.shell) req.cmd = {"/bin/bash"};
  if (!req.cmd.empty() && req.shell)
    return c->Fail(400, "bad_request", "give \"cmd\" or \"shell\", not both");
  req.tty = c->FlagQuery("tty");
  auto cols = c->IntQuery("cols", 80, 1, 65535);
  auto rows = c->IntQuery("rows", 24, 1, 65535);
  auto timeout = c->IntQuery("timeout_ms", 0, 0, kMaxTimeoutMs);
  for (const auto* s : {&cols, &rows, &timeout})
    if (!s->ok()) return c->Fail(s->status());
  req.cols = static_cast<uint16_t>(*cols);
  req.rows = static_cast<uint16_t>(*rows);
  req.timeout_ms = *timeout;
  req.max_output_bytes = d.cfg.max_output_bytes;
  req.stdin_stream = true;
  if (const std::string* u = c->req.Query("user")) req.user = *u;
  if (const std::string* w = c->req.Query("cwd")) req.cwd = *w;
  for (const auto& kv : c->req.QueryAll("env")) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return c->Fail(400, "bad_request", "env parameters are KEY=VALUE");
    req.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e);
  if (!sb.ok()) return c->Fail(sb.status());
  Json cmd = req.shell ? Json(AuditLog::Clip(*req.shell)) : AuditLog::Command(req.cmd);
  auto ticket = TakeTicket(c, e, "attach", cmd, req.user.empty() ? e->params.user : req.user,
                           req.cwd.empty() ? e->params.workdir : req.cwd);
  if (!ticket.ok()) return c->Fail(ticket.status());
  c->res->AcceptWebSocket(std::make_shared<AttachSession>(*sb, std::move(req), *ticket));
}

}  // namespace

void RegisterExecRoutes(Api* a) {
  a->Bind(api::RouteId::kExec, Exec);
  a->Bind(api::RouteId::kListExecs, ListExecs);
  a->Bind(api::RouteId::kGetExec, GetExec);
  a->Bind(api::RouteId::kKillExec, KillExec);
  a->Bind(api::RouteId::kDeleteExec, DeleteExec);
  a->Bind(api::RouteId::kSignal, SignalAll);
  a->Bind(api::RouteId::kOpenShell, OpenShell);
  a->Bind(api::RouteId::kListShells, ListShells);
  a->Bind(api::RouteId::kRunShell, RunShell);
  a->Bind(api::RouteId::kCloseShell, CloseShell);
  a->Bind(api::RouteId::kAttach, Attach);
}

}  // namespace dsec::edge
