#include "edge/e2b.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/base64.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/e2b_internal.h"
#include "edge/exec_ticket.h"
#include "edge/idempotency.h"
#include "http/auth.h"

namespace dsec::edge {

namespace e2b = api::e2b;

namespace e2b_detail {

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

http::HttpResponse JsonResponse(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

http::HttpResponse NoContent() {
  http::HttpResponse r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

// A control-plane error ({"code": N, "message"}), from one of ours.
http::HttpResponse ApiFail(const Status& s) {
  auto [status, code] = api::HttpErrorFor(s);
  if (s.code() == StatusCode::kGone) status = 404;  // E2B knows "not found" only
  return JsonResponse(status, e2b::ApiError(status, s.message()));
}

// A unary Connect error, from one of ours.
http::HttpResponse RpcFail(const Status& s) {
  std::string_view code = e2b::ConnectCodeFor(s);
  return JsonResponse(e2b::ConnectHttpStatus(code), e2b::ConnectErrorBody(code, s.message()));
}

http::HttpResponse RpcOk(const Json& j) { return JsonResponse(200, Dump(j)); }

std::pair<std::string, std::string> ConnectError(const Status& s) {
  return {std::string(e2b::ConnectCodeFor(s)), s.message()};
}

// E2B's user of a call: the Authorization header's Basic "<user>:" (sent only when the caller
// names one), else the default user; "root" is root, anything else the sandbox's user.
std::string UserOf(const http::HttpRequest& req, const std::string& sandbox_user) {
  std::string a = req.Header("authorization");
  if (a.size() > 6 && (a.compare(0, 6, "Basic ") == 0 || a.compare(0, 6, "basic ") == 0)) {
    auto d = Base64Decode(std::string_view(a).substr(6));
    if (d && d->substr(0, d->find(':')) == "root") return "root";
  }
  if (const std::string* u = req.Query("username"); u && *u == "root") return "root";
  return sandbox_user;
}

// A path of a call: relative ones are relative to the home of E2B's user.
std::string Resolve(const std::string& path, const std::string& user) {
  if (!path.empty() && path[0] == '/') return path;
  std::string home = user == "root" ? "/root" : kHome;
  return path.empty() ? home : JoinPath(home, path);
}

std::string BaseName(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

e2b::Entry EntryOf(const backends::FileEntry& f, const std::string& path) {
  e2b::Entry e;
  e.name = f.name.empty() ? BaseName(path) : f.name;
  e.path = path;
  e.type = f.type == "dir" ? "dir" : f.type == "symlink" ? "symlink" : "file";
  e.size = f.size;
  e.mode = f.mode;
  e.mtime_ms = f.mtime_ms;
  return e;
}

}  // namespace e2b_detail

using namespace e2b_detail;  // NOLINT(google-build-using-namespace)

// ---- processes ------------------------------------------------------------------------------

// The running commands by sandbox and pid. Shared with each command (a weak reference): a
// command's end may come from the backend after the listener is gone (an edge shutting down).
struct E2b::Registry {
  Mutex mu;
  std::map<std::string, std::map<uint32_t, std::shared_ptr<Process>>> procs DSEC_GUARDED_BY(mu);
  std::map<Process*, std::shared_ptr<Process>> pending DSEC_GUARDED_BY(mu);  // not started yet

  void Register(Process* p, uint32_t pid);
  void Forget(const std::string& sandbox, uint32_t pid, Process* self) {
    MutexLock l(mu);
    pending.erase(self);
    auto it = procs.find(sandbox);
    if (it == procs.end()) return;
    if (auto p = it->second.find(pid); p != it->second.end() && p->second.get() == self)
      it->second.erase(p);  // (a newer process may have its pid by now)
    if (it->second.empty()) procs.erase(it);
  }
  std::shared_ptr<Process> Find(const std::string& sandbox, const e2b::Selector& s);
  std::vector<std::shared_ptr<Process>> All(const std::string& sandbox = "") {
    MutexLock l(mu);
    std::vector<std::shared_ptr<Process>> out;
    for (const auto& [sb, m] : procs)
      if (sandbox.empty() || sb == sandbox)
        for (const auto& [pid, p] : m) out.push_back(p);
    return out;
  }
};

// One running command: the exec's observer, fanning its events out to every stream attached
// to it (the Start that made it, and Connects by pid), as Connect envelopes.
struct E2b::Process : public backends::ExecObserver,
                      public std::enable_shared_from_this<E2b::Process> {
  static constexpr size_t kMaxStreams = 16;
  std::weak_ptr<Registry> reg;
  std::string sandbox;
  e2b::StartRequest cfg;
  std::shared_ptr<ExecTicket> ticket;

  Mutex mu;
  CondVar cv;  // the handle is set, or the command ended
  uint32_t pid DSEC_GUARDED_BY(mu) = 0;
  bool started DSEC_GUARDED_BY(mu) = false;
  bool ended DSEC_GUARDED_BY(mu) = false;
  std::shared_ptr<backends::ExecHandle> handle DSEC_GUARDED_BY(mu);
  std::vector<Res> streams DSEC_GUARDED_BY(mu);
  std::vector<std::string> early DSEC_GUARDED_BY(mu);  // output before the start event

  void Send(const std::string& envelope) DSEC_REQUIRES(mu) {
    for (const auto& s : streams) s->Write(envelope);
  }
  void Keepalive() {
    MutexLock l(mu);
    if (started && !ended) Send(e2b::Envelope(0, e2b::KeepaliveEvent()));
  }
  // A stream goes from the list when its client does.
  void Watch(const Res& res) {
    std::weak_ptr<Process> self = weak_from_this();
    http::Responder* raw = res.get();
    res->OnDisconnect([self, raw] {
      if (auto p = self.lock()) {
        MutexLock l(p->mu);
        auto& v = p->streams;
        v.erase(std::remove_if(v.begin(), v.end(), [raw](const Res& r) { return r.get() == raw; }),
                v.end());
      }
    });
  }
  // A stream attached by Connect: the start event first, then whatever comes.
  Status Attach(const Res& res) {
    {
      MutexLock l(mu);
      if (ended) return NotFound("process not found");
      if (streams.size() >= kMaxStreams)
        return ResourceExhausted("process already has " + std::to_string(kMaxStreams) +
                                 " streams attached");
      res->StartStream(200, "application/connect+json");
      res->Write(e2b::Envelope(0, e2b::StartEvent(pid)));
      streams.push_back(res);
    }
    Watch(res);
    return OkStatus();
  }
  // The command's handle: StartExec may not have returned it yet when its start event went
  // out (and a client acts on that event at once): waits a little for it.
  std::shared_ptr<backends::ExecHandle> Handle() {
    MutexLock l(mu);
    cv.WaitFor(l, std::chrono::seconds(5), [this]() DSEC_REQUIRES(mu) { return handle || ended; });
    return handle;
  }
  void SetHandle(std::shared_ptr<backends::ExecHandle> h) {
    MutexLock l(mu);
    if (!ended) handle = std::move(h);
    cv.NotifyAll();
  }

  void OnStart(int p) override {
    // Findable by pid before the start event goes out: a client acts on it at once
    // (SendInput on another connection may arrive before this thread runs again).
    if (auto r = reg.lock()) r->Register(this, static_cast<uint32_t>(p));
    MutexLock l(mu);
    pid = static_cast<uint32_t>(p);
    started = true;
    Send(e2b::Envelope(0, e2b::StartEvent(pid)));  // the first message of the stream
    for (const auto& env : early) Send(env);
    early.clear();
  }
  void OnOutput(uint8_t stream, std::string_view data) override {
    MutexLock l(mu);
    std::string env =
        e2b::Envelope(0, e2b::DataEvent(stream == backends::kStderrStream, data, cfg.pty));
    if (!started) {
      early.push_back(std::move(env));
      return;
    }
    Send(env);
  }
  void OnExit(const StatusOr<backends::ExecResult>& r) override {
    uint32_t p;
    {
      MutexLock l(mu);
      ended = true;
      p = pid;
      std::string tail;
      if (!r.ok()) {
        tail = e2b::EndStream(ConnectError(r.status()));
      } else if (r->timed_out) {
        // As envd at the request's deadline: no end event, deadline_exceeded (TimeoutError).
        tail = e2b::EndStream(std::make_pair(std::string("deadline_exceeded"),
                                             std::string("context deadline exceeded")));
      } else {
        tail = e2b::Envelope(0, e2b::EndEvent(r->exit_code, r->signal)) + e2b::EndStream();
      }
      for (const auto& s : streams) {
        s->Write(tail);
        s->End();
      }
      streams.clear();
      handle.reset();
      cv.NotifyAll();
    }
    if (ticket) ticket->Finish(r);
    if (auto g = reg.lock()) g->Forget(sandbox, p, this);
  }
};

void E2b::Registry::Register(Process* p, uint32_t pid) {
  MutexLock l(mu);
  auto it = pending.find(p);
  if (it == pending.end()) return;
  procs[it->second->sandbox][pid] = it->second;
  pending.erase(it);
}

std::shared_ptr<E2b::Process> E2b::Registry::Find(const std::string& sandbox,
                                                  const e2b::Selector& s) {
  MutexLock l(mu);
  auto it = procs.find(sandbox);
  if (it == procs.end()) return nullptr;
  if (s.pid) {
    auto p = it->second.find(*s.pid);
    return p == it->second.end() ? nullptr : p->second;
  }
  for (const auto& [pid, p] : it->second)
    if (p->cfg.tag && s.tag && *p->cfg.tag == *s.tag) return p;
  return nullptr;
}

// One WatchDir stream: the agent's watch events as Connect envelopes ({"start":{}} first, once
// the watches are set), keepalives, and its end: the client gone (the watch stopped), its
// Connect-Timeout-Ms passed (deadline_exceeded, as envd), or the agent's error.
struct E2b::Watch : public backends::WatchObserver {
  Res res;
  std::string dir;  // the watched directory, for the entries' paths
  int64_t deadline_ms = 0;
  Mutex mu;
  std::shared_ptr<backends::WatchHandle> handle DSEC_GUARDED_BY(mu);
  bool started DSEC_GUARDED_BY(mu) = false;
  bool ended DSEC_GUARDED_BY(mu) = false;

  void OnWatching() override {
    MutexLock l(mu);
    if (ended || started) return;
    started = true;
    res->Write(e2b::Envelope(0, Dump(Json{{"start", Json::object()}})));
  }
  void OnEvents(std::vector<protocol::WatchEvent> events) override {
    std::string out;
    for (const auto& ev : events) {
      std::string type = "EVENT_TYPE_";
      for (char c : ev.type) type += static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
      Json fs = {{"name", ev.name}, {"type", type}};
      if (ev.entry) fs["entry"] = e2b::EntryJson(EntryOf(*ev.entry, JoinPath(dir, ev.name)));
      out += e2b::Envelope(0, Dump(Json{{"filesystem", fs}}));
    }
    MutexLock l(mu);
    if (!ended && started) res->Write(std::move(out));
  }
  void OnEnd(const Status& s) override {
    MutexLock l(mu);
    End(s.ok() ? std::nullopt : std::make_optional(ConnectError(s)));
  }
  void End(std::optional<std::pair<std::string, std::string>> error) DSEC_REQUIRES(mu) {
    if (ended) return;
    ended = true;
    res->End(e2b::EndStream(std::move(error)));
    handle.reset();
  }
  // Stops the agent's watch; the stream ends now with `error` (if the client is still there).
  void Stop(std::optional<std::pair<std::string, std::string>> error = std::nullopt) {
    std::shared_ptr<backends::WatchHandle> h;
    {
      MutexLock l(mu);
      h = handle;
      End(std::move(error));
    }
    if (h) h->Stop();
  }
  void Tick(int64_t now, bool keepalive) {
    if (deadline_ms && now >= deadline_ms)
      return Stop(std::make_pair(std::string("deadline_exceeded"),
                                 std::string("context deadline exceeded")));
    MutexLock l(mu);
    if (keepalive && started && !ended)
      res->Write(e2b::Envelope(0, Dump(Json{{"keepalive", Json::object()}})));
  }
};

struct E2b::Watches {
  Mutex mu;
  std::vector<std::weak_ptr<Watch>> open DSEC_GUARDED_BY(mu);
  void Add(const std::shared_ptr<Watch>& w) {
    MutexLock l(mu);
    open.push_back(w);
  }
  void Tick(bool keepalive) {
    std::vector<std::shared_ptr<Watch>> live;
    {
      MutexLock l(mu);
      std::vector<std::weak_ptr<Watch>> keep;
      for (auto& w : open)
        if (auto p = w.lock()) {
          bool ended;
          {
            MutexLock wl(p->mu);
            ended = p->ended;
          }
          if (!ended) {
            keep.push_back(w);
            live.push_back(std::move(p));
          }
        }
      open = std::move(keep);
    }
    const int64_t now = MonotonicMs();
    for (const auto& w : live) w->Tick(now, keepalive);
  }
};

E2b::E2b(Deps d)
    : d_(std::move(d)),
      token_key_(http::DerivedKey(d_.tokens, "dsec e2b envd access token key v1")),
      reg_(std::make_shared<Registry>()),
      slots_({.what = "E2B requests in progress",
              .max_per_sandbox = d_.cfg->max_workers_per_sandbox,
              .per_knob = "max_workers_per_sandbox"}),
      interpreter_({.cfg = d_.cfg, .metrics = d_.metrics, .audit = d_.audit}),
      watches_(std::make_shared<Watches>()) {
  keepalive_ = std::thread([this] {
    std::unique_lock<std::mutex> l(stop_mu_);
    for (int tick = 1; !stop_cv_.wait_for(l, std::chrono::seconds(1), [this] { return stop_; });
         ++tick) {
      interpreter_.Tick();
      watches_->Tick(tick % kKeepaliveS == 0);
      if (tick % kKeepaliveS == 0)
        for (const auto& p : reg_->All()) p->Keepalive();
    }
  });
}

E2b::~E2b() {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  keepalive_.join();
}

std::string E2b::AccessToken(const std::string& sandbox_id) const {
  return HexEncode(http::HmacSha256(token_key_, "e2b-envd-access\n" + sandbox_id));
}

std::string E2b::TrafficToken(const std::string& sandbox_id) const {
  return HexEncode(http::HmacSha256(token_key_, "e2b-traffic-access\n" + sandbox_id));
}

// A streaming call that fails before its first message: HTTP 200, the error in the trailer.
void E2b::StreamFail(const http::HttpRequest& req, const Res& res, const Status& s) {
  res->StartStream(200, "application/connect+json");
  res->End(e2b::EndStream(ConnectError(s)));
  d_.metrics->CountRequest(req.method, 200);
}

// ---- the listener ---------------------------------------------------------------------------

http::Preflight E2b::Check(http::HttpRequest& req) {
  http::Preflight pf;
  pf.principal = "e2b";
  const bool envd = !req.Header("e2b-sandbox-id").empty();
  if (envd && req.path == "/files" && req.method == "POST") {
    // Spooled to disk as it arrives (the server's max_spooled_uploads bounds how many at
    // once), then parsed where it lies by the handler: at most the sandbox's disk_mb (plus
    // room for the multipart framing), and the node's max_upload_bytes when set.
    pf.body_limit = kMaxFilesBody;
    pf.limit_why = "the E2B listener's 64 MiB per /files upload for an unknown sandbox";
    if (auto e = d_.manager->Get(req.Header("e2b-sandbox-id")); e.ok()) {
      pf.body_limit = (static_cast<uint64_t>((*e)->params.resources.disk_mb) << 20) + (1 << 20);
      pf.limit_why = "the sandbox's disk_mb";
    }
    if (d_.cfg->max_upload_bytes && d_.cfg->max_upload_bytes < pf.body_limit) {
      pf.body_limit = d_.cfg->max_upload_bytes;
      pf.limit_why = "max_upload_bytes";
    }
    pf.spool = http::Preflight::Spool::kUpload;
  } else if (envd && req.path == "/health") {
    pf.body_limit = 0;
  } else {
    pf.body_limit = d_.cfg->max_json_body_bytes;
    pf.limit_why = "max_json_body_bytes";
  }
  if (envd) {
    // The sandbox's own token, before any body is read: a wrong one is 401 whether or not
    // the sandbox exists. /health too (envd's own answers it without one, but the SDK sends
    // it, and an anonymous probe would keep the sandbox from its idle TTL).
    const std::string id = req.Header("e2b-sandbox-id");
    bool ok = http::ConstantTimeEquals(req.Header("x-access-token"), AccessToken(id));
    if (!ok && req.Header("e2b-sandbox-port") == std::to_string(e2b::kCodeInterpreterPort))
      ok = http::ConstantTimeEquals(req.Header("e2b-traffic-access-token"), TrafficToken(id));
    if (!ok) {
      d_.metrics->CountRequest(req.method, 401);
      pf.ok = false;
      pf.error = JsonResponse(401, e2b::ApiError(401, "unauthorized access: wrong X-Access-Token"));
      pf.error.close = true;
    }
    return pf;
  }
  const std::string key = req.Header("x-api-key");
  bool ok = false;
  for (const auto& t : d_.tokens) ok = ok || (!key.empty() && http::ConstantTimeEquals(key, t));
  if (!ok) {
    d_.metrics->CountRequest(req.method, 401);
    pf.ok = false;
    pf.error = JsonResponse(
        401, e2b::ApiError(401, key.empty() ? "missing X-API-KEY" : "invalid X-API-KEY"));
    pf.error.close = true;
  }
  return pf;
}

void E2b::Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  auto shared = std::make_shared<http::HttpRequest>(std::move(req));
  // What one sandbox's envd calls may hold of the shared workers at once (its own processes
  // can slow its agent): taken before queueing, so the queue is bounded too.
  std::shared_ptr<void> slot;
  if (std::string id = shared->Header("e2b-sandbox-id"); !id.empty()) {
    auto taken = slots_.Take(id);
    if (!taken.ok()) {
      http::HttpResponse r = JsonResponse(429, e2b::ApiError(429, taken.status().message()));
      r.headers.emplace_back("Retry-After", "1");
      d_.metrics->CountRequest(shared->method, 429);
      return res->Send(std::move(r));
    }
    slot = std::move(*taken);
  }
  // Everything may wait on a sandbox (a create, an agent call): on a worker.
  boost::asio::post(*d_.workers, [this, shared, res, slot = std::move(slot)] {
    try {
      if (!shared->Header("e2b-sandbox-id").empty()) {
        Envd(*shared, res);
      } else {
        ControlPlane(*shared, res);
      }
    } catch (const std::exception& e) {
      DSEC_LOG_ERROR("e2b handler threw: {} {}: {}", shared->method, shared->path, e.what());
      res->Send(JsonResponse(500, e2b::ApiError(500, "internal error")));
    }
  });
}

// ---- envd -----------------------------------------------------------------------------------

void E2b::Envd(http::HttpRequest& req, const Res& res) {
  auto send = [&](http::HttpResponse r) {
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  const std::string id = req.Header("e2b-sandbox-id");
  const std::string port = req.Header("e2b-sandbox-port");
  if (Status s = api::ValidateId("sandbox id", id); !s.ok())
    return send(JsonResponse(400, e2b::ApiError(400, s.message())));
  const bool interpreter = port == std::to_string(e2b::kCodeInterpreterPort);
  if (!port.empty() && port != std::to_string(e2b::kEnvdPort) && !interpreter)
    return send(JsonResponse(
        501,
        e2b::ApiError(501, "port " + port + " of a sandbox is not served here (envd, " +
                               std::to_string(e2b::kEnvdPort) + ", and the code interpreter, " +
                               std::to_string(e2b::kCodeInterpreterPort) + ", are)")));
  auto e = d_.manager->Get(id);
  // As E2B's proxy answers for a sandbox that is not running: 502.
  if (!e.ok() || (*e)->phase() == Phase::kPaused || (*e)->phase() == Phase::kFailed)
    return send(JsonResponse(
        502,
        Dump(Json{{"sandboxId", id}, {"code", 502}, {"message", "The sandbox was not found"}})));
  (*e)->Touch();
  if (interpreter) return interpreter_.Handle(req, *e, res);
  if (req.path == "/health") return send(NoContent());
  if (req.path == "/files") return Files(req, *e, res);
  // Connect RPCs: /process.Process/Start, /filesystem.Filesystem/Stat, ...
  std::string path = req.path;
  while (path.size() > 1 && path[1] == '/') path.erase(0, 1);  // "//x" (a trailing '/' in a URL)
  if (StartsWith(path, "/process.Process/") || StartsWith(path, "/filesystem.Filesystem/")) {
    if (req.method != "POST")
      return send(RpcFail(InvalidArgument("Connect RPCs are POST requests")));
    return Rpc(path.substr(1), req, *e, res);
  }
  send(JsonResponse(404, e2b::ApiError(404, "no route " + req.method + " " + req.path)));
}

void E2b::Rpc(const std::string& method, http::HttpRequest& req,
              const std::shared_ptr<SandboxEntry>& e, const Res& res) {
  auto send = [&](http::HttpResponse r) {
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  const bool streaming = StartsWith(req.Header("content-type"), "application/connect+json");
  StatusOr<Json> msg = streaming ? e2b::ParseRequestEnvelope(req.body) : ParseJson(req.body);
  if (msg.ok() && !msg->is_object()) msg = InvalidArgument("the request message is not an object");
  // A streaming call's error goes in its end-of-stream trailer, with HTTP 200.
  auto stream_fail = [&](const Status& s) { StreamFail(req, res, s); };
  if (!msg.ok()) return streaming ? stream_fail(msg.status()) : send(RpcFail(msg.status()));
  const Json& j = *msg;
  auto sb = e->Sandbox();
  if (!sb.ok()) return streaming ? stream_fail(sb.status()) : send(RpcFail(sb.status()));
  const std::string user = UserOf(req, e->params.user);

  if (method == "process.Process/Start") {
    auto sr = e2b::ParseStartRequest(j);
    if (!sr.ok()) return stream_fail(sr.status());
    return Start(*sr, req, e, res);
  }
  if (method == "filesystem.Filesystem/WatchDir") return WatchDir(j, req, e, res);
  if (method == "process.Process/Connect") {
    auto sel = e2b::ParseSelector(j);
    if (!sel.ok()) return stream_fail(sel.status());
    auto p = reg_->Find(e->id, *sel);
    if (!p) return stream_fail(NotFound("process not found"));
    if (Status s = p->Attach(res); !s.ok()) return stream_fail(s);
    d_.metrics->CountRequest(req.method, 200);
    return;
  }
  if (method == "process.Process/List") {
    Json procs = Json::array();
    for (const auto& p : reg_->All(e->id)) {
      uint32_t pid;
      {
        MutexLock l(p->mu);
        pid = p->pid;
      }
      Json cfg = {{"cmd", p->cfg.cmd}, {"args", p->cfg.args}, {"envs", p->cfg.envs}};
      if (p->cfg.cwd) cfg["cwd"] = *p->cfg.cwd;
      Json info = {{"config", cfg}, {"pid", pid}};
      if (p->cfg.tag) info["tag"] = *p->cfg.tag;
      procs.push_back(std::move(info));
    }
    return send(RpcOk({{"processes", procs}}));
  }
  if (method == "process.Process/SendInput" || method == "process.Process/SendSignal" ||
      method == "process.Process/CloseStdin" || method == "process.Process/Update") {
    auto sel = e2b::ParseSelector(j);
    if (!sel.ok()) return send(RpcFail(sel.status()));
    auto p = reg_->Find(e->id, *sel);
    auto h = p ? p->Handle() : nullptr;
    if (!h) return send(RpcFail(NotFound("process not found")));
    if (method == "process.Process/SendInput") {
      auto in = j.find("input");
      std::string data;
      if (in != j.end() && in->is_object()) {
        for (const char* k : {"stdin", "pty"})
          if (auto v = in->find(k); v != in->end() && v->is_string()) {
            auto d = Base64Decode(v->get<std::string>());
            if (!d) return send(RpcFail(InvalidArgument("input is not base64")));
            data = std::move(*d);
          }
      }
      if (Status s = h->WriteStdin(std::move(data)); !s.ok()) return send(RpcFail(s));
    } else if (method == "process.Process/SendSignal") {
      // The enum by name, or by number (proto3 JSON allows both).
      auto sig = j.find("signal");
      std::string name = sig == j.end() || sig->is_null() ? "SIGNAL_SIGKILL"
                         : sig->is_string()               ? sig->get<std::string>()
                         : sig->is_number_integer()       ? std::to_string(sig->get<int64_t>())
                                                          : "";
      if (name == "SIGNAL_SIGTERM" || name == "15") {
        h->Signal(15);
      } else if (name == "SIGNAL_SIGKILL" || name == "9") {
        h->Kill();
      } else {
        return send(RpcFail(InvalidArgument("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")));
      }
    } else if (method == "process.Process/CloseStdin") {
      h->CloseStdin();
    } else if (auto pty = j.find("pty"); pty != j.end() && pty->is_object()) {
      auto sz = pty->find("size");
      auto dim = [&](const char* k, int64_t def) -> int64_t {
        if (sz == pty->end() || !sz->is_object()) return def;
        auto v = sz->find(k);
        return v != sz->end() && v->is_number_unsigned() ? v->get<int64_t>() : -1;
      };
      int64_t cols = dim("cols", 80), rows = dim("rows", 24);
      if (cols < 1 || cols > 4096 || rows < 1 || rows > 4096)
        return send(RpcFail(InvalidArgument("pty.size needs cols and rows of 1-4096")));
      h->Resize(static_cast<uint16_t>(cols), static_cast<uint16_t>(rows));
    }
    return send(RpcOk(Json::object()));
  }

  // filesystem.Filesystem
  auto path_of = [&](const char* key) -> StatusOr<std::string> {
    auto v = j.find(key);
    if (v == j.end() || !v->is_string() || v->get<std::string>().empty())
      return InvalidArgument(std::string(key) + " is required");
    return Resolve(v->get<std::string>(), user);
  };
  auto entry_of = [&](const std::string& path) -> StatusOr<Json> {
    DSEC_ASSIGN_OR_RETURN(backends::FileEntry f, (*sb)->Stat(path, user));
    return e2b::EntryJson(EntryOf(f, path));
  };
  // A command as E2B's user, for what the agent has no call for (mv): an exec of the sandbox
  // like any other (its audit record, the per-sandbox exec cap).
  auto run = [&](std::vector<std::string> argv) -> Status {
    backends::ExecRequest er;
    er.cmd = std::move(argv);
    er.user = user;
    er.timeout_ms = 30000;
    Json command = Json::array();
    for (const auto& a : er.cmd) command.push_back(a);
    DSEC_ASSIGN_OR_RETURN(
        auto ticket, ExecTicket::Take(d_.cfg->max_execs_per_sandbox, d_.audit, d_.metrics, e, "e2b",
                                      std::move(command), user, "", req.principal, req.remote));
    auto done = (*sb)->Exec(er);
    ticket->Finish(done.ok() ? StatusOr<backends::ExecResult>(done->result)
                             : StatusOr<backends::ExecResult>(done.status()));
    DSEC_ASSIGN_OR_RETURN(backends::ExecOutput out, std::move(done));
    if (out.result.exit_code != 0)
      return InvalidArgument(TrimWhitespace(out.stderr_data).empty()
                                 ? "exit status " + std::to_string(out.result.exit_code)
                                 : std::string(TrimWhitespace(out.stderr_data)));
    return OkStatus();
  };
  if (method == "filesystem.Filesystem/Stat") {
    auto p = path_of("path");
    if (!p.ok()) return send(RpcFail(p.status()));
    auto en = entry_of(*p);
    if (!en.ok()) return send(RpcFail(en.status()));
    return send(RpcOk({{"entry", *en}}));
  }
  if (method == "filesystem.Filesystem/ListDir") {
    auto p = path_of("path");
    if (!p.ok()) return send(RpcFail(p.status()));
    int64_t depth = 1;
    if (auto d = j.find("depth"); d != j.end() && !d->is_null()) {
      if (!d->is_number_integer()) return send(RpcFail(InvalidArgument("depth must be a number")));
      depth = d->get<int64_t>();
    }
    if (depth < 1 || depth > 64) return send(RpcFail(InvalidArgument("depth must be 1-64")));
    Json entries = Json::array();
    std::vector<std::pair<std::string, int64_t>> todo = {{*p, 1}};
    while (!todo.empty()) {
      auto [dir, level] = todo.back();
      todo.pop_back();
      auto list = (*sb)->ListDir(dir, user);
      if (!list.ok()) {
        if (level == 1) return send(RpcFail(list.status()));
        continue;
      }
      for (const auto& f : *list) {
        std::string child = JoinPath(dir, f.name);
        entries.push_back(e2b::EntryJson(EntryOf(f, child)));
        if (f.type == "dir" && level < depth) todo.emplace_back(child, level + 1);
        if (entries.size() > 100000)
          return send(RpcFail(ResourceExhausted("more than 100000 entries")));
      }
    }
    return send(RpcOk({{"entries", entries}}));
  }
  if (method == "filesystem.Filesystem/MakeDir") {
    auto p = path_of("path");
    if (!p.ok()) return send(RpcFail(p.status()));
    if (auto st = (*sb)->Stat(*p, user); st.ok())
      return send(RpcFail(st->type == "dir"
                              ? Status(StatusCode::kAlreadyExists, "directory " + *p + " exists")
                              : InvalidArgument("path " + *p + " exists and is not a directory")));
    if (Status s = (*sb)->MakeDir(*p, 0755, user); !s.ok()) return send(RpcFail(s));
    auto en = entry_of(*p);
    if (!en.ok()) return send(RpcFail(en.status()));
    return send(RpcOk({{"entry", *en}}));
  }
  if (method == "filesystem.Filesystem/Move") {
    auto src = path_of("source");
    auto dst = path_of("destination");
    if (!src.ok()) return send(RpcFail(src.status()));
    if (!dst.ok()) return send(RpcFail(dst.status()));
    if (auto st = (*sb)->Stat(*src, user); !st.ok()) return send(RpcFail(st.status()));
    if (Status s =
            run({"/bin/sh", "-c", "mkdir -p -- \"$(dirname -- \"$2\")\" && mv -f -- \"$1\" \"$2\"",
                 "sh", *src, *dst});
        !s.ok())
      return send(RpcFail(s));
    auto en = entry_of(*dst);
    if (!en.ok()) return send(RpcFail(en.status()));
    return send(RpcOk({{"entry", *en}}));
  }
  if (method == "filesystem.Filesystem/Remove") {
    auto p = path_of("path");
    if (!p.ok()) return send(RpcFail(p.status()));
    if (*p == "/") return send(RpcFail(InvalidArgument("refusing to remove /")));
    Status s = (*sb)->Remove(*p, /*recursive=*/true, user);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return send(RpcFail(s));
    return send(RpcOk(Json::object()));
  }
  if (streaming) return stream_fail(Unimplemented(method + " is not served"));
  send(RpcFail(Unimplemented(method + " is not served")));
}

void E2b::Start(const e2b::StartRequest& sr, const http::HttpRequest& req,
                const std::shared_ptr<SandboxEntry>& e, const Res& res) {
  auto stream_fail = [&](const Status& s) { StreamFail(req, res, s); };
  auto sb = e->Sandbox();
  if (!sb.ok()) return stream_fail(sb.status());
  const std::string user = UserOf(req, e->params.user);
  backends::ExecRequest er;
  er.cmd = {sr.cmd};
  er.cmd.insert(er.cmd.end(), sr.args.begin(), sr.args.end());
  er.env = sr.envs;
  if (user != "root" && !er.env.count("HOME")) er.env["HOME"] = kHome;
  er.user = user;
  // envd's default: the sandbox's workdir (/home/user for those made through E2B).
  er.cwd = sr.cwd ? Resolve(*sr.cwd, user) : e->params.workdir;
  if (auto st = (*sb)->Stat(er.cwd, user); !st.ok() || st->type != "dir")
    return stream_fail(InvalidArgument("cwd '" + er.cwd + "' does not exist"));
  // Connect-Timeout-Ms: the call's deadline, the command's too (envd kills it then).
  er.timeout_ms = 0;
  if (std::string t = req.Header("connect-timeout-ms"); !t.empty()) {
    auto ms = ParseInt64(t);
    if (!ms || *ms < 0) return stream_fail(InvalidArgument("Connect-Timeout-Ms must be a number"));
    er.timeout_ms = *ms;
  }
  er.max_output_bytes = d_.cfg->max_output_bytes;
  er.stdin_stream = sr.stdin_open || sr.pty;
  er.tty = sr.pty;
  er.cols = sr.cols;
  er.rows = sr.rows;
  Json command = Json::array();
  for (const auto& a : er.cmd) command.push_back(a);
  auto ticket = ExecTicket::Take(d_.cfg->max_execs_per_sandbox, d_.audit, d_.metrics, e, "e2b",
                                 std::move(command), user, er.cwd, req.principal, req.remote);
  if (!ticket.ok()) return stream_fail(ticket.status());
  auto p = std::make_shared<Process>();
  p->reg = reg_;
  p->sandbox = e->id;
  p->cfg = sr;
  p->ticket = *ticket;
  {
    MutexLock l(p->mu);
    res->StartStream(200, "application/connect+json");
    p->streams.push_back(res);
  }
  p->Watch(res);
  {
    MutexLock l(reg_->mu);
    reg_->pending[p.get()] = p;  // registered by pid once it starts (Process::OnStart)
  }
  auto h = (*sb)->StartExec(er, p);
  if (!h.ok()) {
    reg_->Forget(e->id, 0, p.get());
    {
      MutexLock l(p->mu);
      if (!p->ended) {
        p->ended = true;
        res->End(e2b::EndStream(ConnectError(h.status())));
        p->streams.clear();
      }
      p->cv.NotifyAll();
    }
    p->ticket->Finish(h.status());
    return;
  }
  p->SetHandle(*h);
  d_.metrics->CountRequest(req.method, 200);
}

void E2b::WatchDir(const Json& j, const http::HttpRequest& req,
                   const std::shared_ptr<SandboxEntry>& e, const Res& res) {
  auto stream_fail = [&](const Status& s) { StreamFail(req, res, s); };
  auto sb = e->Sandbox();
  if (!sb.ok()) return stream_fail(sb.status());
  auto path = j.find("path");
  if (path == j.end() || !path->is_string() || path->get<std::string>().empty())
    return stream_fail(InvalidArgument("path is required"));
  auto flag = [&](const char* camel, const char* snake) {
    for (const char* k : {camel, snake})
      if (auto v = j.find(k); v != j.end() && v->is_boolean() && v->get<bool>()) return true;
    return false;
  };
  auto w = std::make_shared<Watch>();
  w->res = res;
  const std::string user = UserOf(req, e->params.user);
  w->dir = Resolve(path->get<std::string>(), user);
  if (std::string t = req.Header("connect-timeout-ms"); !t.empty()) {
    auto ms = ParseInt64(t);
    if (!ms || *ms < 0) return stream_fail(InvalidArgument("Connect-Timeout-Ms must be a number"));
    if (*ms > 0) w->deadline_ms = MonotonicMs() + *ms;
  }
  if (auto st = (*sb)->Stat(w->dir, user); !st.ok())
    return stream_fail(st.status());
  else if (st->type != "dir")
    return stream_fail(InvalidArgument("path '" + w->dir + "' is not a directory"));
  res->StartStream(200, "application/connect+json");
  auto h = (*sb)->WatchDir(w->dir, flag("recursive", "recursive"),
                           flag("includeEntry", "include_entry"), w, user);
  if (!h.ok()) {
    MutexLock l(w->mu);
    return w->End(ConnectError(h.status()));
  }
  bool ended;
  {
    MutexLock l(w->mu);
    if (!w->ended) w->handle = *h;
    ended = w->ended;
  }
  if (ended) (*h)->Stop();
  watches_->Add(w);
  std::weak_ptr<Watch> weak = w;
  res->OnDisconnect([weak] {
    if (auto p = weak.lock()) p->Stop();
  });
  d_.metrics->CountRequest(req.method, 200);
}

// ---- REST /files ----------------------------------------------------------------------------

void E2b::Files(http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e, const Res& res) {
  auto send = [&](http::HttpResponse r) {
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  auto fail = [&](int status, const std::string& msg) {
    send(JsonResponse(status, e2b::ApiError(status, msg)));
  };
  auto sb = e->Sandbox();
  if (!sb.ok()) return fail(502, sb.status().message());
  const std::string user = UserOf(req, e->params.user);
  const std::string* qpath = req.Query("path");
  if (req.method == "GET") {
    if (!qpath || qpath->empty()) return fail(400, "path is required");
    std::string path = Resolve(*qpath, user);
    auto st = (*sb)->Stat(path, user);
    if (!st.ok()) {
      if (st.status().code() == StatusCode::kNotFound)
        return fail(404, "path '" + path + "' does not exist");
      return fail(ApiFail(st.status()).status, st.status().message());
    }
    if (st->type == "dir") return fail(400, "path '" + path + "' is a directory");
    if (st->type != "file" && st->type != "symlink")
      return fail(400, "path '" + path + "' is not a regular file");
    uint64_t cap = d_.cfg->max_download_bytes;
    if (st->type == "file" && st->size > cap)
      return fail(413, "'" + path + "' is larger than the node's max_download_bytes");
    // One byte past the cap tells a file that grew since the stat (or a symlink's target).
    auto data = (*sb)->ReadFile(path, cap + 1, user);
    if (!data.ok()) return fail(ApiFail(data.status()).status, data.status().message());
    if (data->size() > cap)
      return fail(413, "'" + path + "' is larger than the node's max_download_bytes");
    http::HttpResponse r;
    r.content_type = "application/octet-stream";
    r.body = std::move(*data);
    return send(std::move(r));
  }
  if (req.method != "POST") return fail(405, "GET or POST");
  const std::string ct = req.Header("content-type");
  if (!StartsWith(ct, "multipart/form-data")) {
    // An octet-stream body goes from its spooled file to the sandbox a piece at a time.
    if (!qpath || qpath->empty()) return fail(400, "path is required for an octet-stream body");
    if (!req.Header("content-encoding").empty() && req.Header("content-encoding") != "identity")
      return fail(400, "compressed uploads (Content-Encoding) are not accepted");
    std::string path = Resolve(*qpath, user);
    Status s = req.body_file
                   ? (*sb)->WriteFile(path, {req.body_file.get(), req.body_size}, 0644, user)
                   : (*sb)->WriteFile(path, req.body, 0644, user);
    req.body_file.Reset();
    if (!s.ok()) return fail(ApiFail(s).status, s.message());
    Json out = Json::array();
    out.push_back({{"name", BaseName(path)}, {"type", "file"}, {"path", path}});
    return send(JsonResponse(200, Dump(out)));
  }
  // A multipart body is parsed where it lies: a spooled one mapped read-only (page cache, not
  // the edge's memory), its parts then sent from the spool file a window at a time.
  std::string_view body = req.body;
  const char* base = nullptr;
  auto unmap = MakeScopeGuard([&] {
    if (base) munmap(const_cast<char*>(base), req.body_size);
  });
  if (req.body_file && req.body_size > 0) {
    void* m = mmap(nullptr, req.body_size, PROT_READ, MAP_PRIVATE, req.body_file.get(), 0);
    if (m == MAP_FAILED) return fail(500, "could not map the spooled upload");
    base = static_cast<const char*>(m);
    body = std::string_view(base, req.body_size);
  }
  auto upload_of = [&](std::string_view part) {
    return base ? backends::UploadBody(req.body_file.get(), part.size(),
                                       static_cast<uint64_t>(part.data() - base))
                : backends::UploadBody(part);
  };
  std::vector<std::pair<std::string, std::string_view>> files;  // target, bytes
  {
    auto parts = e2b::ParseMultipart(ct, body);
    if (!parts.ok()) return fail(400, parts.status().message());
    for (auto& p : *parts) {
      if (p.name != "file") continue;
      std::string target = qpath && !qpath->empty() ? *qpath : p.filename;
      if (target.empty()) return fail(400, "a file part without a path (filename or ?path=)");
      files.emplace_back(Resolve(target, user), p.data);
    }
    if (qpath && files.size() > 1) return fail(400, "several files for one ?path=");
  }
  if (files.empty()) return fail(400, "no file in the request");
  Json out = Json::array();
  for (const auto& [path, data] : files) {
    if (Status s = (*sb)->WriteFile(path, upload_of(data), 0644, user); !s.ok())
      return fail(ApiFail(s).status, s.message());
    out.push_back({{"name", BaseName(path)}, {"type", "file"}, {"path", path}});
  }
  send(JsonResponse(200, Dump(out)));
}

}  // namespace dsec::edge
