// Exec routes: buffered, streamed (NDJSON) and background execs, signal-all, shell sessions
// and the WebSocket attach. None of them holds a worker thread while a command runs: output
// and the exit arrive through ExecObserver callbacks on the backend's I/O threads.
// Every exec is written to the audit log when it starts and when it ends.
#include <algorithm>
#include <boost/asio/steady_timer.hpp>

#include "api/exec_json.h"
#include "base/base64.h"
#include "base/clock.h"
#include "base/ids.h"
#include "edge/api.h"
#include "edge/exec_ticket.h"

namespace dsec::edge {

namespace {

using backends::ExecHandle;
using backends::ExecObserver;
using backends::ExecRequest;
using backends::ExecResult;

using api::ExecParams;

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
    // What the node's output budget could not hold is cut like what passed the cap.
    ExecResult result = *r;
    result.stdout_truncated |= out_dropped_;
    result.stderr_truncated |= err_dropped_;
    Json j = api::ResultJson(result, base64_, out_, err_);
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
    Emit(api::OutputJson(is_err, std::move(text)));
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    ticket_->Finish(r);
    for (bool is_err : {false, true}) {
      std::string rest = (is_err ? err_ : out_).Take("", true);
      if (!rest.empty()) Emit(api::OutputJson(is_err, std::move(rest)));
    }
    std::string line = api::Line(api::ExitJson(r, base64_)) + "\n";
    MutexLock l(mu_);
    if (started_) {
      res_->End(std::move(line));
    } else {
      final_ = std::move(line);
    }
  }

 private:
  void Emit(const Json& j) {
    std::string line = api::Line(j) + "\n";
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
// Its encoding is kept with it (api::JobMeta).
using api::JobJson;

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
  job.job_id = c->exec_id.empty() ? "ex-" + RandomBase32(12) : c->exec_id;
  job.started_at = WallMs();
  job.meta = api::JobMeta(p.base64);
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
  c->Reply(202, api::ExecStartedJson(info->job_id));
}

void Exec(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  auto p = api::ParseExecRequest(c->req.body, {.max_stdin_bytes = d.cfg.max_json_body_bytes,
                                               .max_output_bytes = d.cfg.max_output_bytes});
  if (!p.ok()) return c->Fail(p.status());
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e);
  if (!sb.ok()) return c->Fail(sb.status());
  const std::string& user = p->req.grader         ? "grader"
                            : p->req.user.empty() ? e->params.user
                                                  : p->req.user;
  const std::string& cwd = p->req.cwd.empty() ? e->params.workdir : p->req.cwd;
  Json audit_cmd =
      p->req.shell ? Json(AuditLog::Clip(*p->req.shell)) : AuditLog::Command(p->req.cmd);
  auto ticket = TakeTicket(c, e, p->background ? "background" : "exec", audit_cmd, user, cwd);
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
  c->Reply(200, api::ExecListJson(*jobs));
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
      c->Reply(200, api::JobReadJson(r->read, r->out, r->err));
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

void SignalAll(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<int> {
    DSEC_ASSIGN_OR_RETURN(int signo, api::ParseSignalRequest(c->req.body));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    return sb->SignalAll(signo);
  };
  auto n = run();
  if (!n.ok()) return c->Fail(n.status());
  c->Reply(200, api::SignaledJson(*n));
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
    DSEC_ASSIGN_OR_RETURN(auto user, api::ParseOpenShellRequest(c->req.body));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    DSEC_ASSIGN_OR_RETURN(std::string id, sb->OpenShell(user.value_or("")));
    return ApiShellId(id);
  };
  auto id = run();
  if (!id.ok()) return c->Fail(id.status());
  c->Reply(201, api::ShellOpenedJson(*id));
}

void ListShells(const std::shared_ptr<Ctx>& c) {
  auto sb = c->Sandbox();
  if (!sb.ok()) return c->Fail(sb.status());
  std::vector<std::string> ids;
  for (const auto& id : (*sb)->ListShells()) ids.push_back(ApiShellId(id));
  c->Reply(200, api::ShellListJson(ids));
}

void RunShell(const std::shared_ptr<Ctx>& c) {
  const auto& d = c->api->deps();
  std::string shell_id;
  auto parse = [&]() -> StatusOr<api::ShellRunParams> {
    DSEC_ASSIGN_OR_RETURN(shell_id, BackendShellId(c->params["sid"]));
    return api::ParseShellRunRequest(c->req.body, d.cfg.max_output_bytes);
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
      conn->Send(api::ErrorJson(h.status()).dump(), false);
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
    auto ctl = api::ParseAttachControl(data);
    if (!ctl.ok()) return Abort(ctl.status());
    if (ctl->resize) h->Resize(ctl->resize->first, ctl->resize->second);
    if (ctl->signal) h->Signal(*ctl->signal);
    if (ctl->eof) h->CloseStdin();
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
      conn->Send(api::OutputJson(true, Base64Encode(data)).dump(), false);
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
    conn->Send(api::Line(api::ExitJson(r, false)), false);
    conn->Close();
  }

 private:
  std::shared_ptr<http::WebSocketConn> Conn() {
    MutexLock l(mu_);
    return conn_;
  }
  void Abort(const Status& s) {
    if (auto conn = Conn()) {
      conn->Send(api::ErrorJson(s).dump(), false);
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
  auto timeout = c->IntQuery("timeout_ms", 0, 0, api::kMaxExecTimeoutMs);
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
