#include "edge/trajectory.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <set>

#include "base/clock.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "http/auth.h"
#include "images/store.h"

namespace dsec::edge {

struct Trajectories::Binding {
  std::string sandbox, project, id;
  Mutex mu;
  CondVar cv;
  bool busy DSEC_GUARDED_BY(mu) = false;  // a recorded call holds the turn
  // (Read without the turn: Unbind's, from a delete or the housekeeper.)
  std::atomic<int64_t> branch{0};
  std::atomic<bool> live{true};     // false: replaying (the sandbox is not made yet)
  std::atomic<bool> gone{false};    // unbound (deleted, preempted, failed)
  std::atomic<bool> broken{false};  // an entry could not be recorded: calls are refused
  std::atomic<int64_t> bytes{0};    // bodies kept (before de-duplication)
  // The rest is read and written by the turn's holder only.
  int64_t next_seq = 1;
  std::function<void()> create;  // a replaying sandbox's create, run at materialization
  int64_t checkpoint_every = 0;
  int64_t since_checkpoint = 0;           // mutating calls since the last checkpoint
  std::map<std::string, int64_t> jobs;    // background exec id -> the seq that started it
  std::map<std::string, int64_t> shells;  // open shell (as the log knows it) -> its open's seq
  // A shell opened again after a materialization may get another id: the log's -> the live one.
  std::map<std::string, std::string> shell_ids;
  // While replaying: the log's next entries with their bodies, read ahead in one go (a resumed
  // episode asks for them in order).
  std::deque<TrajectoryAnswer> ahead;
};

namespace {

using api::RouteId;

enum class Recording { kNo, kRead, kMutating };

Recording RecordedAs(RouteId r) {
  switch (r) {
    case RouteId::kExec:
    case RouteId::kKillExec:
    case RouteId::kDeleteExec:
    case RouteId::kSignal:
    case RouteId::kOpenShell:
    case RouteId::kRunShell:
    case RouteId::kCloseShell:
    case RouteId::kPutFile:
    case RouteId::kDeleteFile:
    case RouteId::kMakeDir:
    case RouteId::kPutArchive:
      return Recording::kMutating;
    case RouteId::kListExecs:
    case RouteId::kGetExec:
    case RouteId::kListShells:
    case RouteId::kGetFile:
    case RouteId::kListFiles:
    case RouteId::kStatFile:
    case RouteId::kGetArchive:
      return Recording::kRead;
    default:
      return Recording::kNo;
  }
}

// "/v1/sandboxes/<id>/files?path=/a" -> "/files?path=/a": the path after the sandbox (as
// decoded: a re-run's target then names the route whatever escapes the caller used) and the
// query as sent. nullopt for a path that does not start with the sandbox's own.
std::optional<std::string> TargetSuffix(const http::HttpRequest& req, const std::string& sandbox) {
  const std::string prefix = "/v1/sandboxes/" + sandbox;
  if (!req.path.starts_with(prefix) || req.path.find('?') != std::string::npos) return {};
  std::string out = req.path.substr(prefix.size());
  if (auto q = req.target.find('?'); q != std::string::npos) out += req.target.substr(q);
  return out;
}

// The request's body as the log keeps it (the spooled file read back, bounded).
StatusOr<std::string> BodyOf(const http::HttpRequest& req, uint64_t max) {
  if (!req.body_file) return req.body;
  if (req.body_size > max)
    return Status(StatusCode::kResourceExhausted,
                  "an upload into a sandbox recording a trajectory is kept in its log: at most " +
                      std::to_string(max) + " bytes (trajectory_max_body_bytes)");
  std::string out;
  out.reserve(req.body_size);
  DSEC_RETURN_IF_ERROR(ReadFileChunks(
      req.body_file.get(), req.body_size, 1 << 20,
      [&](std::string_view piece) {
        out.append(piece);
        return OkStatus();
      },
      "the upload"));
  return out;
}

// The fingerprint: method, path after the sandbox, the query in order of names, and the body
// (JSON without its request_id, keys sorted; anything else as sent).
std::string Fingerprint(const http::HttpRequest& req, const std::string& sandbox,
                        const std::string& body) {
  const std::string prefix = "/v1/sandboxes/" + sandbox;
  std::string path = req.path.starts_with(prefix) ? req.path.substr(prefix.size()) : req.path;
  auto query = req.query;
  std::stable_sort(query.begin(), query.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string canon = req.method + "\n" + path + "\n";
  for (const auto& [k, v] : query) canon += k + "=" + v + "&";
  canon += "\n";
  Json j = body.empty() || body[0] != '{' ? Json() : Json::parse(body, nullptr, false);
  if (j.is_object()) {
    j.erase("request_id");
    canon += j.dump();
  } else {
    canon += body;
  }
  return http::Sha256Hex(canon);
}

// Collects an answer a re-run call gives (internal; nobody reads it but its status).
class Collector : public http::Responder {
 public:
  void Send(http::HttpResponse r) override { Done(r.status, std::move(r.body)); }
  void StartStream(int status, std::string,
                   std::vector<std::pair<std::string, std::string>>) override {
    MutexLock l(mu_);
    status_ = status;
  }
  void Write(std::string chunk) override {
    MutexLock l(mu_);
    if (body_.size() < 4096) body_ += chunk;
  }
  void End(std::string last) override {
    int st;
    std::string body;
    {
      MutexLock l(mu_);
      st = status_;
      body = body_ + last;
    }
    Done(st, std::move(body));
  }
  void OnDisconnect(std::function<void()>) override {}
  void AcceptWebSocket(std::shared_ptr<http::WebSocketHandler>) override { Done(400, "websocket"); }

  // The status and the start of the body, once answered (or 504 past the deadline).
  std::pair<int, std::string> Wait(int64_t timeout_ms) {
    MutexLock l(mu_);
    if (!cv_.WaitFor(l, std::chrono::milliseconds(timeout_ms),
                     [&]() DSEC_REQUIRES(mu_) { return done_; }))
      return {504, "no answer in time"};
    return {status_, body_.substr(0, 512)};
  }

 private:
  void Done(int status, std::string body) {
    MutexLock l(mu_);
    status_ = status;
    body_ = std::move(body);
    done_ = true;
    cv_.NotifyAll();
  }
  Mutex mu_;
  CondVar cv_;
  bool done_ DSEC_GUARDED_BY(mu_) = false;
  int status_ DSEC_GUARDED_BY(mu_) = 0;
  std::string body_ DSEC_GUARDED_BY(mu_);
};

// "{"shell_id": "sh-1"}" -> "sh-1".
std::string ShellIdOf(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  return j.is_object() && j.contains("shell_id") && j["shell_id"].is_string()
             ? j["shell_id"].get<std::string>()
             : std::string();
}

bool IsShellOpen(const TrajectoryEntry& e) {
  return e.method == "POST" && (e.target == "/shells" || e.target.starts_with("/shells?"));
}

// "/shells/<sid>..." -> "<sid>" ("" for another target).
std::string ShellOfTarget(const std::string& target) {
  if (!target.starts_with("/shells/")) return "";
  std::string rest = target.substr(8);
  return rest.substr(0, rest.find_first_of("/?"));
}

Json HeadersJson(const std::vector<std::pair<std::string, std::string>>& h) {
  Json a = Json::array();
  for (const auto& [k, v] : h) a.push_back({k, v});
  return a;
}

std::vector<std::pair<std::string, std::string>> HeadersFrom(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  Json a = Json::parse(text, nullptr, false);
  if (!a.is_array()) return out;
  for (const auto& p : a)
    if (p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_string())
      out.emplace_back(p[0].get<std::string>(), p[1].get<std::string>());
  return out;
}

}  // namespace

// What an entry tells of the sandbox's background execs and shells (`response`: its answer).
void Follow(Trajectories::Binding& b, const TrajectoryEntry& e, const std::string& response) {
  if (!e.exec_id.empty()) b.jobs[e.exec_id] = e.seq;
  if (IsShellOpen(e) && e.status == 201) {
    if (std::string id = ShellIdOf(response); !id.empty()) b.shells[id] = e.seq;
  } else if (e.method == "DELETE" && e.status < 300) {
    if (std::string sid = ShellOfTarget(e.target); !sid.empty()) b.shells.erase(sid);
  }
}

// A logged target with the live id of the shell it names.
std::string MapShell(const Trajectories::Binding& b, const std::string& target) {
  std::string sid = ShellOfTarget(target);
  auto it = sid.empty() ? b.shell_ids.end() : b.shell_ids.find(sid);
  if (it == b.shell_ids.end()) return target;
  return "/shells/" + it->second + target.substr(8 + sid.size());
}

// Wraps a recorded call's responder: keeps what is sent, and sends it on only once the entry is
// durable; the turn goes to the next call after that (and after a checkpoint that was due).
//
// What is recorded: every answer but 401/403 (the caller), 409 and 429 (not done now: the same
// call may work later) and 503 (nothing was done). A mutating call's other 5xx, or a stream
// that ended in an error, is recorded as not kept: the call may have changed the sandbox, and a
// resume goes live there.
class TrajectoryRecorder : public http::Responder {
 public:
  TrajectoryRecorder(Trajectories* t, std::shared_ptr<Trajectories::Binding> b,
                     std::shared_ptr<http::Responder> inner, TrajectoryEntry e,
                     std::vector<TrajectoryBlob> request_blobs, uint64_t max_body)
      : t_(t),
        b_(std::move(b)),
        inner_(std::move(inner)),
        e_(std::move(e)),
        blobs_(std::move(request_blobs)),
        max_body_(max_body) {}
  ~TrajectoryRecorder() override {
    // A handler that never answered (it cannot happen, but the turn must not be lost).
    if (!finished_.exchange(true)) t_->Recorded(b_, false);
  }

  void Send(http::HttpResponse r) override {
    if (finished_.exchange(true)) return;
    e_.status = r.status;
    if (!Recordable()) {
      inner_->Send(std::move(r));
      return t_->Recorded(b_, false);
    }
    e_.content_type = r.content_type;
    e_.headers = HeadersJson(r.headers).dump();
    Keep(r.body, r.status < 500);
    auto inner = inner_;
    auto shared = std::make_shared<http::HttpResponse>(std::move(r));
    Commit([inner, shared](bool ok) {
      if (ok) return inner->Send(std::move(*shared));
      inner->Send(http::JsonError(503, "unavailable",
                                  "the call ran but its trajectory log could not record it"));
    });
  }
  void StartStream(int status, std::string ct,
                   std::vector<std::pair<std::string, std::string>> headers) override {
    e_.status = status;
    e_.content_type = ct;
    e_.headers = HeadersJson(headers).dump();
    e_.streamed = true;
    inner_->StartStream(status, std::move(ct), std::move(headers));
  }
  void Write(std::string chunk) override {
    Capture(chunk);
    inner_->Write(std::move(chunk));
  }
  void End(std::string last) override {
    if (finished_.exchange(true)) return;
    if (!Recordable()) {
      inner_->End(std::move(last));
      return t_->Recorded(b_, false);
    }
    const bool failed = last.starts_with("{\"error\"");
    Capture(last);
    std::string body = std::move(captured_);
    Keep(body, !failed);
    auto inner = inner_;
    auto shared = std::make_shared<std::string>(std::move(last));
    // A stream's last chunk (its exit event) goes once the entry is durable.
    Commit([inner, shared](bool ok) {
      if (!ok)
        *shared +=
            "{\"error\": {\"code\": \"unavailable\", \"message\": \"the call ran but its "
            "trajectory log could not record it\"}}\n";
      inner->End(std::move(*shared));
    });
  }
  void OnDisconnect(std::function<void()> cb) override { inner_->OnDisconnect(std::move(cb)); }
  void AcceptWebSocket(std::shared_ptr<http::WebSocketHandler> h) override {
    inner_->AcceptWebSocket(std::move(h));
  }

 private:
  bool Recordable() const {
    const int s = e_.status;
    if (s == 401 || s == 403 || s == 409 || s == 429 || s == 503) return false;
    return s < 500 || e_.mutating;
  }
  void Capture(const std::string& c) {
    if (too_big_) return;
    if (captured_.size() + c.size() > max_body_) {
      too_big_ = true;
      captured_.clear();
      captured_.shrink_to_fit();
      return;
    }
    captured_ += c;
  }
  // `replayable`: an answer a resume may give again (else it is noted, not kept).
  void Keep(const std::string& body, bool replayable) {
    if (IsShellOpen(e_)) opened_ = body;
    if (!replayable || too_big_ || body.size() > max_body_ ||
        !t_->Charge(b_, static_cast<int64_t>(body.size()))) {
      e_.kept = false;
      return;
    }
    e_.kept = true;
    if (body.empty()) return;
    e_.response = http::Sha256Hex(body);
    blobs_.push_back({e_.response, body});
  }
  void Commit(std::function<void(bool)> send) {
    // A background exec's start: its id, for a checkpoint to know it and a re-run to give it.
    if (!exec_id.empty() && e_.status == 202) e_.exec_id = exec_id;
    e_.created_ms = WallMs();
    Trajectories* t = t_;
    auto b = b_;
    const int64_t seq = e_.seq;
    e_.follower = b_->sandbox;
    TrajectoryEntry meta = e_;  // (digests, not bodies)
    t_->store_->Append(b_->project, b_->id, b_->branch, std::move(e_), std::move(blobs_),
                       [t, b, seq, meta = std::move(meta), opened = std::move(opened_),
                        send = std::move(send)](Status s) {
                         if (!s.ok()) {
                           // The log no longer matches the sandbox: it stops recording (its calls
                           // are refused) rather than go on with a hole.
                           DSEC_LOG_ERROR(
                               "trajectory {}: entry {} not recorded, the sandbox stops: {}", b->id,
                               seq, s.ToString());
                           b->broken = true;
                           t->Count("not_recorded");
                         } else {
                           t->Count("recorded");
                           b->next_seq = seq + 1;
                           Follow(*b, meta, opened);
                           if (meta.mutating) ++b->since_checkpoint;
                         }
                         send(s.ok());
                         t->Recorded(b, s.ok() && meta.mutating && b->checkpoint_every > 0 &&
                                            b->since_checkpoint >= b->checkpoint_every);
                       });
  }

 public:
  std::string exec_id;  // the id a background exec of this call gets

 private:
  Trajectories* t_;
  std::shared_ptr<Trajectories::Binding> b_;
  std::shared_ptr<http::Responder> inner_;
  TrajectoryEntry e_;
  std::vector<TrajectoryBlob> blobs_;
  uint64_t max_body_;
  std::string captured_;
  std::string opened_;  // a shell open's answer
  bool too_big_ = false;
  std::atomic<bool> finished_{false};
};

Trajectories::Trajectories(TrajectoryOptions opts, TrajectoryStore* store, Manager* manager,
                           images::ImageStore* images, Api* api)
    : opts_(std::move(opts)), store_(store), manager_(manager), images_(images), api_(api) {}

Trajectories::~Trajectories() = default;

std::string Trajectories::HolderOf(const std::string& project, const std::string& id) {
  return "trajectory:" + http::Sha256Hex(project + "/" + id).substr(0, 32);
}

std::string Trajectories::ExecIdFor(const std::string& project, const std::string& id,
                                    int64_t seq) {
  return "ex-t" + http::Sha256Hex(project + "/" + id + "#" + std::to_string(seq)).substr(0, 16);
}

void Trajectories::Count(const char* event) const {
  if (metrics_) metrics_->CountTrajectory(event);
}

int64_t Trajectories::TtlFor(const std::string& project) const {
  auto it = opts_.project_ttl_s.find(project);
  return it == opts_.project_ttl_s.end() ? opts_.ttl_s : it->second;
}

std::shared_ptr<Trajectories::Binding> Trajectories::Find(const std::string& sandbox) {
  MutexLock l(mu_);
  auto it = bindings_.find(sandbox);
  return it == bindings_.end() ? nullptr : it->second;
}

std::vector<std::string> Trajectories::Recover() {
  std::vector<std::string> holders;
  auto all = store_->List();
  if (!all.ok()) {
    DSEC_LOG_ERROR("trajectory db: {}", all.status().ToString());
    return holders;
  }
  for (TrajectoryInfo& t : *all) {
    holders.push_back(HolderOf(t.project, t.id));
    if (t.sandbox.empty()) continue;
    if (!Ours(t.sandbox)) continue;  // another node's (a shared store)
    const std::string sandbox = t.sandbox;
    if (t.state == "recording" && manager_->Has(sandbox)) {
      auto b = std::make_shared<Binding>();
      b->sandbox = sandbox;
      b->project = t.project;
      b->id = t.id;
      b->branch = t.head;
      b->checkpoint_every = t.checkpoint_every;
      auto entries = store_->Entries(t.project, t.id, t.head, 1, INT64_MAX);
      auto cps = store_->Checkpoints(t.project, t.id, t.head);
      int64_t last_cp = cps.ok() && !cps->empty() ? cps->back().seq : 0;
      if (entries.ok())
        for (const auto& e : *entries) {
          b->next_seq = e.seq + 1;
          Follow(*b, e, IsShellOpen(e) ? store_->ReadBlob(e.response).value_or("") : "");
          if (e.mutating && e.seq > last_cp) ++b->since_checkpoint;
        }
      MutexLock l(mu_);
      bindings_[sandbox] = b;
      continue;
    }
    // Its sandbox did not come back, or was being made from the log when the edge died (its
    // replayed calls' place is lost with it): the log stays, for a resume.
    if (t.state != "recording" && manager_->Has(sandbox)) (void)manager_->Delete(sandbox, "lost");
    t.state = "stopped";
    t.sandbox.clear();
    t.updated_ms = WallMs();
    (void)store_->Update(t, sandbox);
  }
  return holders;
}

Status Trajectories::Begin(const std::string& sandbox, const CreateParams& p,
                           const api::TrajectorySpec& spec) {
  TrajectoryInfo t;
  t.project = p.project;
  t.id = spec.id;
  t.params = ToJson(p).dump();
  t.checkpoint_every = spec.checkpoint_every.value_or(opts_.checkpoint_every);
  t.state = "recording";
  t.sandbox = sandbox;
  t.created_ms = t.updated_ms = WallMs();
  t.expires_ms = t.created_ms + TtlFor(p.project) * 1000;
  if (Status s = store_->Create(t); !s.ok()) {
    if (s.code() == StatusCode::kAlreadyExists)
      return Status(
          StatusCode::kAlreadyExists,
          "trajectory \"" + spec.id + "\" exists: resume it (\"resume\": true) or take another id");
    return s;
  }
  auto b = std::make_shared<Binding>();
  b->sandbox = sandbox;
  b->project = p.project;
  b->id = spec.id;
  b->checkpoint_every = t.checkpoint_every;
  MutexLock l(mu_);
  bindings_[sandbox] = b;
  return OkStatus();
}

StatusOr<CreateParams> Trajectories::ResumeParams(const CreateParams& request,
                                                  const api::TrajectorySpec& spec,
                                                  const std::string& takeover) {
  DSEC_ASSIGN_OR_RETURN(TrajectoryInfo t, store_->Get(request.project, spec.id));
  if (!t.sandbox.empty() && t.sandbox == takeover && !Ours(t.sandbox)) {
    // Its sandbox's node is gone (an apiserver says so): the log stays where it was written
    // last; the new sandbox follows it from here (only if no one else took it meanwhile).
    const std::string lost = t.sandbox;
    t.state = "stopped";
    t.sandbox.clear();
    t.updated_ms = WallMs();
    DSEC_RETURN_IF_ERROR(store_->Update(t, lost));
    DSEC_LOG_INFO("trajectory {}: taken over from sandbox {} (its node is gone)", spec.id, lost);
    Count("taken_over");
  }
  if (!t.sandbox.empty())
    return FailedPrecondition("trajectory \"" + spec.id + "\" is followed by sandbox " + t.sandbox +
                              " now: delete it (or preempt its job) first");
  if (spec.branch && *spec.branch >= t.branches)
    return NotFound("trajectory \"" + spec.id + "\" has no branch " + std::to_string(*spec.branch));
  Json j = Json::parse(t.params, nullptr, false);
  DSEC_ASSIGN_OR_RETURN(CreateParams p, CreateParamsFromJson(j));
  p.labels = request.labels;
  p.ttl_s = request.ttl_s;
  p.idle_ttl_s = request.idle_ttl_s;
  p.project = request.project;
  p.owner = request.owner;
  p.quota_hold = request.quota_hold;
  p.pool.clear();
  if (p.config_from.empty()) p.config_from = p.image;
  return p;
}

Status Trajectories::Resumed(const std::string& sandbox, const std::string& project,
                             const api::TrajectorySpec& spec, std::function<void()> create) {
  DSEC_ASSIGN_OR_RETURN(TrajectoryInfo t, store_->Get(project, spec.id));
  DSEC_ASSIGN_OR_RETURN(auto entry, manager_->Get(sandbox));
  entry->deferred = true;  // made at its first live call; its TTLs apply meanwhile
  auto b = std::make_shared<Binding>();
  b->sandbox = sandbox;
  b->project = project;
  b->id = spec.id;
  b->branch = spec.branch.value_or(t.head);
  b->checkpoint_every = t.checkpoint_every;
  b->live = false;
  b->create = std::move(create);
  t.head = b->branch;
  t.state = "replaying";
  t.sandbox = sandbox;
  t.updated_ms = WallMs();
  t.expires_ms = t.updated_ms + TtlFor(project) * 1000;
  // Only while no other sandbox took it since ResumeParams looked (two resumes at once).
  if (Status s = store_->Update(t, ""); !s.ok())
    return FailedPrecondition("trajectory \"" + spec.id +
                              "\" was resumed by another sandbox meanwhile");
  MutexLock l(mu_);
  bindings_[sandbox] = b;
  return OkStatus();
}

void Trajectories::Unbind(const std::shared_ptr<Binding>& b, const std::string& state) {
  {
    MutexLock l(mu_);
    auto it = bindings_.find(b->sandbox);
    if (it == bindings_.end() || it->second != b) return;
    bindings_.erase(it);
  }
  b->gone = true;
  auto t = store_->Get(b->project, b->id);
  if (!t.ok() || t->sandbox != b->sandbox) return;
  t->state = state;
  t->sandbox.clear();
  t->head = b->branch;
  t->updated_ms = WallMs();
  t->expires_ms = t->updated_ms + TtlFor(b->project) * 1000;
  if (Status s = store_->Update(*t, b->sandbox); !s.ok())
    DSEC_LOG_ERROR("trajectory {}: {}", b->id, s.ToString());
}

Status Trajectories::TakeTurn(const std::shared_ptr<Binding>& b, int wait_s) {
  MutexLock l(b->mu);
  if (!b->cv.WaitFor(l, std::chrono::seconds(wait_s),
                     [&]() DSEC_REQUIRES(b->mu) { return !b->busy; }))
    return FailedPrecondition(
        "calls on a sandbox that records a trajectory run one at a time, in order, and another "
        "has been running for " +
        std::to_string(wait_s) + " s");
  b->busy = true;
  return OkStatus();
}

void Trajectories::ReleaseTurn(const std::shared_ptr<Binding>& b) {
  MutexLock l(b->mu);
  b->busy = false;
  b->cv.NotifyAll();
}

bool Trajectories::Charge(const std::shared_ptr<Binding>& b, int64_t n) {
  if (b->bytes + n > static_cast<int64_t>(opts_.max_bytes)) return false;
  b->bytes += n;
  return true;
}

void Trajectories::Recorded(const std::shared_ptr<Binding>& b, bool checkpoint_due) {
  if (!checkpoint_due) return ReleaseTurn(b);
  // The checkpoint blocks (a capture of the writable layer): on its own thread, in the turn.
  boost::asio::post(checkpointer_, [this, b] {
    if (Status s = Checkpoint(b, b->next_seq - 1); !s.ok())
      DSEC_LOG_WARN("trajectory {}: checkpoint at {} failed: {}", b->id, b->next_seq - 1,
                    s.ToString());
    ReleaseTurn(b);
  });
}

void Trajectories::Stop() { checkpointer_.join(); }

bool Trajectories::Ours(const std::string& sandbox) const {
  if (!store_->shared() || opts_.node.empty()) return true;
  // "sb-<node>-<12 base32>": the random part has no '-', so "sb-n1-..." of a node "n1-x" is not
  // node n1's.
  const std::string prefix = "sb-" + opts_.node + "-";
  return sandbox.starts_with(prefix) && sandbox.size() == prefix.size() + 12 &&
         sandbox.find('-', prefix.size()) == std::string::npos;
}

Status Trajectories::PutCheckpointLayers(const std::vector<std::string>& stack) {
  if (!store_->shared() || !images_) return OkStatus();
  for (const auto& name : stack) {
    if (!name.starts_with("sha256:")) continue;  // an image by name: the cluster's images
    DSEC_ASSIGN_OR_RETURN(images::LayerInfo info, images_->Blob(name));
    DSEC_RETURN_IF_ERROR(store_->PutLayer({info.digest, info.size, info.blob, info.blob_size},
                                          images_->BlobPath(info)));
  }
  return OkStatus();
}

Status Trajectories::FetchCheckpointLayers(const std::string& project, const std::string& stack) {
  if (!images_) return OkStatus();
  std::vector<std::string> names;
  for (auto n : SplitString(stack, ',', true)) {
    const std::string name(n);
    if (!name.starts_with("sha256:")) {
      if (name != "host") names.push_back(name);
      continue;
    }
    if (!store_->shared() || images_->GetLayer(name).ok()) continue;
    const std::string tmp = images_->TempPath("checkpoint");
    auto layer = store_->FetchLayer(name, tmp);
    if (!layer.ok()) {
      unlink(tmp.c_str());
      return layer.status();
    }
    auto added = images_->AddBlobLayer(
        tmp, images::LayerInfo{layer->digest, layer->size, images::LayerFormat::kErofs, layer->blob,
                               layer->blob_size});
    if (!added.ok()) {
      unlink(tmp.c_str());
      return added.status();
    }
    Count("layer_fetched");
  }
  // Images by name (the trajectory's first image, a checkpoint's base): the cluster's, fetched
  // like a create's.
  if (ensure_images_ && !names.empty()) DSEC_RETURN_IF_ERROR(ensure_images_(project, names));
  return OkStatus();
}

void Trajectories::ReleaseGoneHolders() {
  // (The holders first: one a checkpoint adds after the list is then in the list.)
  const std::vector<std::string> holders =
      images_ ? images_->HolderNames() : std::vector<std::string>{};
  auto all = store_->List();
  if (!all.ok()) return;
  std::set<std::string> alive;
  for (auto& t : *all) {
    alive.insert(HolderOf(t.project, t.id));
    // Followed by a sandbox of this node that is gone and bound to nothing here (its unbind
    // could not reach the store): let go, or it could never be resumed.
    if (t.sandbox.empty() || !Ours(t.sandbox) || manager_->Has(t.sandbox) || Find(t.sandbox))
      continue;
    const std::string gone = t.sandbox;
    t.state = "stopped";
    t.sandbox.clear();
    t.updated_ms = WallMs();
    if (store_->Update(t, gone).ok())
      DSEC_LOG_INFO("trajectory {}: let go of sandbox {} (gone)", t.id, gone);
  }
  int released = 0;
  for (const auto& h : holders)
    if (h.starts_with("trajectory:") && !alive.count(h)) {
      images_->Release(h);
      ++released;
    }
  if (released > 0) collect_ = true;
}

Status Trajectories::HoldCheckpoints(const std::string& project, const std::string& id) {
  if (!images_) return OkStatus();
  std::set<std::string> digests;
  DSEC_ASSIGN_OR_RETURN(auto branches, store_->Branches(project, id));
  for (const auto& br : branches) {
    DSEC_ASSIGN_OR_RETURN(auto cps, store_->Checkpoints(project, id, br.branch));
    for (const auto& c : cps)
      for (auto n : SplitString(c.image, ',', true))
        if (n.starts_with("sha256:")) digests.insert(std::string(n));
  }
  // (A shared store's checkpoints may be another node's: this one holds what it has.)
  if (store_->shared())
    std::erase_if(digests, [&](const std::string& d) { return !images_->GetLayer(d).ok(); });
  return images_->Hold(HolderOf(project, id),
                       std::vector<std::string>(digests.begin(), digests.end()));
}

Status Trajectories::Checkpoint(const std::shared_ptr<Binding>& b, int64_t seq) {
  DSEC_ASSIGN_OR_RETURN(auto e, manager_->Get(b->sandbox));
  DSEC_ASSIGN_OR_RETURN(auto caps, manager_->Capabilities(e->params.kind));
  if (!caps.snapshot) return backends::NoSnapshot(e->params.kind);
  DSEC_ASSIGN_OR_RETURN(auto sb, e->Sandbox(Op::kSnapshot));
  std::optional<images::ImageStore::Lease> lease;
  if (images_) lease.emplace(images_);  // the new layer is unreferenced until held
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> stack, sb->CaptureStack());
  DSEC_RETURN_IF_ERROR(PutCheckpointLayers(stack));
  TrajectoryCheckpoint c;
  c.seq = seq;
  c.image = JoinStrings(stack, ",");
  c.created_ms = WallMs();
  // The background execs still running: started again when a sandbox is made from it.
  if (auto jobs = sb->ListJobs(); jobs.ok()) {
    for (const auto& j : *jobs) {
      if (j.done) continue;
      auto it = b->jobs.find(j.job_id);
      if (it != b->jobs.end()) c.jobs.push_back(it->second);
    }
  }
  // The shells open (opened again, fresh, when a sandbox is made from it).
  for (const auto& [sid, seq_open] : b->shells) c.jobs.push_back(seq_open);
  std::sort(c.jobs.begin(), c.jobs.end());
  c.follower = b->sandbox;
  DSEC_RETURN_IF_ERROR(store_->AddCheckpoint(b->project, b->id, b->branch, c));
  DSEC_RETURN_IF_ERROR(HoldCheckpoints(b->project, b->id));
  b->since_checkpoint = 0;
  Count("checkpointed");
  return OkStatus();
}

Status Trajectories::Rerun(const std::shared_ptr<Binding>& b, const TrajectoryEntry& e) {
  http::HttpRequest req;
  req.method = e.method;
  req.target = "/v1/sandboxes/" + b->sandbox + MapShell(*b, e.target);
  DSEC_ASSIGN_OR_RETURN(req.body, store_->ReadBlob(e.request));
  req.principal = "trajectory";
  auto collector = std::make_shared<Collector>();
  DSEC_RETURN_IF_ERROR(
      api_->RunInternal(std::move(req), collector, ExecIdFor(b->project, b->id, e.seq)));
  auto [status, body] = collector->Wait(15 * 60 * 1000);
  // What it answered first is what it should answer again; anything else is noted, not fatal
  // (a command whose exit code depends on time, say).
  if (status != e.status)
    DSEC_LOG_WARN("trajectory {}: call {} ({} {}) answered {} again, {} first: {}", b->id, e.seq,
                  e.method, e.target, status, e.status, body);
  // A shell opened again: calls naming the log's id go to the one it got now.
  if (IsShellOpen(e) && e.status == 201 && status == 201) {
    std::string logged = ShellIdOf(store_->ReadBlob(e.response).value_or(""));
    std::string now = ShellIdOf(body);
    if (!logged.empty() && !now.empty() && logged != now) b->shell_ids[logged] = now;
  }
  return OkStatus();
}

TrajectoryAnswer* Trajectories::Logged(const std::shared_ptr<Binding>& b, int64_t seq) {
  // At most this many entries and bytes of bodies held per replaying sandbox (or one entry,
  // served at once): a thousand replaying sandboxes whose clients went quiet hold 64 MiB.
  constexpr int64_t kAheadEntries = 32;
  constexpr size_t kAheadBytes = 64 << 10;
  while (!b->ahead.empty() && b->ahead.front().e.seq < seq) b->ahead.pop_front();
  if (b->ahead.empty() || b->ahead.front().e.seq != seq) {
    b->ahead.clear();
    auto got =
        store_->Answers(b->project, b->id, b->branch, seq, seq + kAheadEntries - 1, kAheadBytes);
    if (!got.ok()) {
      DSEC_LOG_WARN("trajectory {}: reading the log at {}: {}", b->id, seq,
                    got.status().ToString());
      return nullptr;
    }
    b->ahead.assign(std::make_move_iterator(got->begin()), std::make_move_iterator(got->end()));
  }
  if (b->ahead.empty() || b->ahead.front().e.seq != seq) return nullptr;
  return &b->ahead.front();
}

Status Trajectories::Materialize(const std::shared_ptr<Binding>& b, int64_t seq) {
  b->ahead.clear();  // (the log's entries past here are another branch's from now on)
  const int64_t from_branch = b->branch;
  Status s = MaterializeSteps(b, seq);
  if (s.ok()) return s;
  // Half made is worse than not made: the sandbox goes (its id then answers 404), the
  // trajectory's head is the branch it was, and it can be resumed again.
  DSEC_LOG_WARN("trajectory {}: making sandbox {} at call {} failed: {}", b->id, b->sandbox, seq,
                s.ToString());
  b->branch = from_branch;
  Unbind(b, "stopped");
  (void)manager_->Delete(b->sandbox, "api");
  return Status(s.code(), "the sandbox resuming trajectory \"" + b->id +
                              "\" could not be made from its log (it is deleted; resume the "
                              "trajectory again): " +
                              s.message());
}

Status Trajectories::MaterializeSteps(const std::shared_ptr<Binding>& b, int64_t seq) {
  Stopwatch sw;
  DSEC_ASSIGN_OR_RETURN(auto entry, store_->Entry(b->project, b->id, b->branch, seq));
  if (entry) {
    // The call differs from the log here: a new branch holds what came before, the old one
    // stays as it was.
    DSEC_ASSIGN_OR_RETURN(int64_t fork, store_->Fork(b->project, b->id, b->branch, seq));
    b->branch = fork;
    DSEC_RETURN_IF_ERROR(HoldCheckpoints(b->project, b->id));
  }
  DSEC_ASSIGN_OR_RETURN(auto cps, store_->Checkpoints(b->project, b->id, b->branch));
  const TrajectoryCheckpoint* from = nullptr;
  for (const auto& c : cps)
    if (c.seq <= seq - 1) from = &c;
  DSEC_ASSIGN_OR_RETURN(auto e, manager_->Get(b->sandbox));
  // (Its layers stay until the create below holds them.)
  std::optional<images::ImageStore::Lease> lease;
  if (images_) lease.emplace(images_);
  DSEC_RETURN_IF_ERROR(FetchCheckpointLayers(b->project, from ? from->image : e->params.image));
  if (from) e->SetStartImage(from->image);
  auto create = std::move(b->create);
  b->create = nullptr;
  if (!create) return FailedPrecondition("it was made already");
  e->deferred = false;
  create();
  DSEC_ASSIGN_OR_RETURN(auto sb, e->Sandbox(Op::kUse, 0));
  (void)sb;
  lease.reset();  // (the sandbox holds its layers now)
  const int64_t base = from ? from->seq : 0;
  b->jobs.clear();
  b->shells.clear();
  b->shell_ids.clear();
  auto follow = [&](const TrajectoryEntry& le) {
    Follow(*b, le, IsShellOpen(le) ? store_->ReadBlob(le.response).value_or("") : "");
  };
  // The background execs running and the shells open at the checkpoint, then the calls after
  // it.
  if (from)
    for (int64_t job : from->jobs) {
      DSEC_ASSIGN_OR_RETURN(auto je, store_->Entry(b->project, b->id, b->branch, job));
      if (!je) continue;
      DSEC_RETURN_IF_ERROR(Rerun(b, *je));
      follow(*je);
    }
  DSEC_ASSIGN_OR_RETURN(auto after,
                        store_->Entries(b->project, b->id, b->branch, base + 1, seq - 1));
  int rerun = 0;
  b->since_checkpoint = 0;
  for (const auto& le : after) {
    if (le.mutating) {
      DSEC_RETURN_IF_ERROR(Rerun(b, le));
      ++rerun;
      ++b->since_checkpoint;
    }
    follow(le);
  }
  DSEC_ASSIGN_OR_RETURN(auto t, store_->Get(b->project, b->id));
  t.state = "recording";
  t.head = b->branch;
  t.updated_ms = WallMs();
  // (Only while this sandbox still follows it: deleted meanwhile, it fails here.)
  DSEC_RETURN_IF_ERROR(store_->Update(t, b->sandbox));
  b->next_seq = seq;
  b->live = true;
  Count("materialized");
  DSEC_LOG_INFO(
      "trajectory {}: sandbox {} live at call {} (branch {}) from checkpoint {}, {} calls run "
      "again, in {:.1f} ms",
      b->id, b->sandbox, seq, b->branch.load(), base, rerun, sw.ElapsedMs());
  return OkStatus();
}

void Trajectories::Serve(const std::shared_ptr<Ctx>& c, RouteFn fn, api::RouteId route) {
  auto id = c->params.find("id");
  auto b = id == c->params.end() ? nullptr : Find(id->second);
  if (!b || c->internal) return fn(c);
  const Recording kind = RecordedAs(route);
  if (kind == Recording::kNo) {
    if (route == RouteId::kDeleteSandbox) {
      // A delete waits for the call before it and the checkpoint that call made due (on its
      // own thread, in the turn): the log is then whole when the sandbox goes. Not for long: a
      // delete is never refused for a busy turn.
      const bool turn = TakeTurn(b, 30).ok();
      fn(c);
      if (!manager_->Has(b->sandbox)) Unbind(b, "stopped");
      if (turn) ReleaseTurn(b);
      return;
    }
    // (A replaying sandbox is not made yet: what needs it is refused, SandboxEntry::Sandbox.)
    return fn(c);
  }
  auto suffix = TargetSuffix(c->req, b->sandbox);
  if (!suffix)
    return c->Fail(400, "bad_request",
                   "a sandbox that records a trajectory takes its calls at "
                   "/v1/sandboxes/" +
                       b->sandbox + "/... as it is written");
  auto body = BodyOf(c->req, opts_.max_body_bytes);
  if (!body.ok()) return c->Fail(body.status());
  const std::string fp = Fingerprint(c->req, b->sandbox, *body);
  if (Status s = TakeTurn(b); !s.ok()) return c->Fail(s);
  // Until the recorder has it, the turn is this function's to give back.
  bool handed = false;
  auto release = MakeScopeGuard([&] {
    if (!handed) ReleaseTurn(b);
  });
  if (b->gone)  // preempted or deleted while it waited
    return c->Fail(Gone("sandbox " + b->sandbox + " no longer follows trajectory \"" + b->id +
                        "\" (its job was preempted or it was deleted)"));
  if (b->broken)
    return c->Fail(Unavailable("the trajectory log could not record a call of sandbox " +
                               b->sandbox + ": it records no more (resume trajectory \"" + b->id +
                               "\" from its log)"));
  const int64_t seq = b->next_seq;
  if (!b->live) {
    TrajectoryAnswer* logged = Logged(b, seq);
    if (logged && logged->e.fingerprint == fp && logged->e.kept && logged->body) {
      // Answered from the log, exactly as first returned.
      TrajectoryAnswer a = std::move(*logged);
      b->ahead.pop_front();
      const TrajectoryEntry& e = a.e;
      b->next_seq = seq + 1;
      Count("replayed");
      auto headers = HeadersFrom(e.headers);
      headers.emplace_back("Dsec-Trajectory-Seq", std::to_string(seq));
      headers.emplace_back("Dsec-Trajectory-Replayed", "1");
      if (e.streamed) {
        c->res->StartStream(e.status, e.content_type, std::move(headers));
        return c->res->End(std::move(*a.body));
      }
      http::HttpResponse r;
      r.status = e.status;
      r.content_type = e.content_type;
      r.headers = std::move(headers);
      r.body = std::move(*a.body);
      return c->res->Send(std::move(r));
    }
    if (Status s = Materialize(b, seq); !s.ok()) return c->Fail(s);
  }
  TrajectoryEntry e;
  e.seq = seq;
  e.fingerprint = fp;
  e.method = c->req.method;
  e.target = std::move(*suffix);
  e.mutating = kind == Recording::kMutating;
  std::vector<TrajectoryBlob> blobs;
  if (!body->empty()) {
    // A request is what a re-run needs: an upload past the trajectory's bytes is refused.
    if (!Charge(b, static_cast<int64_t>(body->size())))
      return c->Fail(TooLarge("trajectory \"" + b->id + "\" keeps " +
                              std::to_string(opts_.max_bytes) +
                              " bytes at most (trajectory_max_bytes), and this call's body does "
                              "not fit"));
    e.request = http::Sha256Hex(*body);
    blobs.push_back({e.request, std::move(*body)});
  }
  if (auto sid = c->params.find("sid"); sid != c->params.end())
    if (auto it = b->shell_ids.find(sid->second); it != b->shell_ids.end())
      sid->second = it->second;
  auto rec = std::make_shared<TrajectoryRecorder>(this, b, c->res, std::move(e), std::move(blobs),
                                                  opts_.max_body_bytes);
  c->exec_id = ExecIdFor(b->project, b->id, seq);
  rec->exec_id = c->exec_id;
  c->res = rec;
  handed = true;  // the recorder gives the turn back once the answer is sent
  rec.reset();
  fn(c);
}

StatusOr<Json> Trajectories::Preempt(const std::string& job, const std::string& project,
                                     const std::string& others) {
  // The job's sandboxes, every page.
  std::vector<std::string> ids;
  ListFilter f;
  f.project = project;
  f.labels = {{"job", job}};
  f.limit = 1000;
  for (;;) {
    DSEC_ASSIGN_OR_RETURN(auto page, manager_->List(f));
    for (const auto& r : page.sandboxes) ids.push_back(r.id);
    if (page.next_cursor.empty()) break;
    f.cursor = page.next_cursor;
  }
  Json checkpointed = Json::array(), snapshots = Json::array(), failed = Json::array();
  int deleted = 0;
  for (const auto& id : ids) {
    auto b = Find(id);
    if (b) {
      if (Status s = TakeTurn(b); !s.ok()) {
        failed.push_back({{"sandbox", id}, {"error", std::string(s.message())}});
        continue;
      }
      // A live one's state since its last checkpoint is captured; a replaying one changed
      // nothing (its log is as it was).
      Status s = OkStatus();
      const int64_t last = b->next_seq - 1;
      if (b->live && last > 0 && !b->broken) {
        auto cps = store_->Checkpoints(b->project, b->id, b->branch);
        bool have = cps.ok() && !cps->empty() && cps->back().seq == last;
        if (!have) s = Checkpoint(b, last);
      }
      if (!s.ok()) {
        ReleaseTurn(b);
        failed.push_back({{"sandbox", id}, {"error", "checkpoint: " + std::string(s.message())}});
        continue;
      }
      Unbind(b, "preempted");
      // Deleted before the turn goes: a call waiting for it finds the sandbox gone.
      if (manager_->Delete(id, "preempted").ok()) ++deleted;
      ReleaseTurn(b);
      checkpointed.push_back(
          {{"sandbox", id}, {"trajectory", b->id}, {"branch", b->branch.load()}, {"seq", last}});
      continue;
    }
    if (others == "snapshot") {
      auto e = manager_->Get(id);
      if (!e.ok()) continue;
      auto sb = (*e)->Sandbox(Op::kSnapshot);
      auto caps = manager_->Capabilities((*e)->params.kind);
      if (!sb.ok() || !caps.ok() || !caps->snapshot || !images_) {
        failed.push_back({{"sandbox", id}, {"error", "this sandbox cannot be snapshotted"}});
        continue;
      }
      images::ImageStore::Lease lease(images_);
      auto stack = (*sb)->CaptureStack();
      if (!stack.ok()) {
        failed.push_back({{"sandbox", id}, {"error", std::string(stack.status().message())}});
        continue;
      }
      images::Image img;
      img.name = "preempted-" + id + ":latest";
      img.source = "snapshot";
      img.project = (*e)->params.project;
      for (const auto& n : *stack) {
        if (n == "host")
          img.base = "host";
        else
          img.layers.push_back(n);
      }
      if (Status st = images_->PutImage(img, /*replace=*/true); !st.ok()) {
        failed.push_back({{"sandbox", id}, {"error", std::string(st.message())}});
        continue;
      }
      snapshots.push_back({{"sandbox", id}, {"image", img.name}});
    }
    if (manager_->Delete(id, "preempted").ok()) ++deleted;
  }
  // "200 when all of that is done": a sandbox that could not be preempted makes it a 503 (a
  // retry does the rest; what was preempted is gone).
  if (!failed.empty())
    return Unavailable("not every sandbox of job " + job + " was preempted (" + failed.dump() +
                       "); " + std::to_string(deleted) + " were: retry");
  return Json{{"affected", deleted},
              {"checkpointed", std::move(checkpointed)},
              {"snapshots", std::move(snapshots)},
              {"failed", std::move(failed)}};
}

StatusOr<Json> Trajectories::Describe(const std::string& project, const std::string& id,
                                      std::optional<int64_t> branch, int64_t from, int64_t limit) {
  DSEC_ASSIGN_OR_RETURN(TrajectoryInfo t, store_->Get(project, id));
  const int64_t br = branch.value_or(t.head);
  if (br < 0 || br >= t.branches)
    return NotFound("trajectory \"" + id + "\" has no branch " + std::to_string(br));
  DSEC_ASSIGN_OR_RETURN(auto branches, store_->Branches(project, id));
  DSEC_ASSIGN_OR_RETURN(auto entries, store_->Entries(project, id, br, from, from + limit - 1));
  DSEC_ASSIGN_OR_RETURN(auto cps, store_->Checkpoints(project, id, br));
  Json j = {{"id", t.id},
            {"project", t.project},
            {"state", t.state},
            {"sandbox", t.sandbox.empty() ? Json() : Json(t.sandbox)},
            {"head", t.head},
            {"branch", br},
            {"checkpoint_every", t.checkpoint_every},
            {"created_ms", t.created_ms},
            {"updated_ms", t.updated_ms},
            {"expires_ms", t.expires_ms},
            // "cluster": every node reads it (a resume may go anywhere); "node": this one only.
            {"store", store_->shared() ? "cluster" : "node"}};
  // What a resume makes (a cluster's quotas count it before it is sent to this node).
  Json params = Json::parse(t.params, nullptr, false);
  if (auto p = CreateParamsFromJson(params); p.ok())
    j["made_as"] = {{"kind", backends::KindName(p->kind)},
                    {"image", p->image},
                    {"memory_mb", p->resources.memory_mb},
                    {"cpu", p->resources.cpu}};
  else
    j["made_as"] = Json::object();
  Json bj = Json::array();
  for (const auto& b : branches)
    bj.push_back({{"branch", b.branch},
                  {"parent", b.parent < 0 ? Json() : Json(b.parent)},
                  {"fork_seq", b.parent < 0 ? Json() : Json(b.fork_seq)},
                  {"entries", b.entries},
                  {"last_seq", b.last_seq},
                  {"created_ms", b.created_ms}});
  j["branches"] = std::move(bj);
  Json ej = Json::array();
  for (const auto& e : entries)
    ej.push_back({{"seq", e.seq},
                  {"method", e.method},
                  {"target", e.target},
                  {"fingerprint", e.fingerprint},
                  {"mutating", e.mutating},
                  {"status", e.status},
                  {"kept", e.kept},
                  {"streamed", e.streamed},
                  {"exec_id", e.exec_id.empty() ? Json() : Json(e.exec_id)},
                  {"request_digest", e.request.empty() ? Json() : Json("sha256:" + e.request)},
                  {"response_digest", e.response.empty() ? Json() : Json("sha256:" + e.response)},
                  {"created_ms", e.created_ms}});
  j["entries"] = std::move(ej);
  Json cj = Json::array();
  for (const auto& c : cps)
    cj.push_back(
        {{"seq", c.seq}, {"image", c.image}, {"jobs", c.jobs}, {"created_ms", c.created_ms}});
  j["checkpoints"] = std::move(cj);
  return j;
}

StatusOr<Json> Trajectories::List(const std::string& project) {
  DSEC_ASSIGN_OR_RETURN(auto all, store_->List());
  Json a = Json::array();
  for (const auto& t : all) {
    if (t.project != project) continue;
    a.push_back({{"id", t.id},
                 {"state", t.state},
                 {"sandbox", t.sandbox.empty() ? Json() : Json(t.sandbox)},
                 {"head", t.head},
                 {"branches", t.branches},
                 {"updated_ms", t.updated_ms},
                 {"expires_ms", t.expires_ms}});
  }
  return Json{{"trajectories", std::move(a)}};
}

Status Trajectories::Delete(const std::string& project, const std::string& id) {
  // (The store refuses while a sandbox follows it.)
  DSEC_RETURN_IF_ERROR(store_->Delete(project, id));
  if (images_) images_->Release(HolderOf(project, id));
  collect_ = true;  // bodies and layers: by the housekeeper, not on this call
  return OkStatus();
}

void Trajectories::Housekeep() {
  std::vector<std::shared_ptr<Binding>> all;
  {
    MutexLock l(mu_);
    for (const auto& [sid, b] : bindings_) all.push_back(b);
  }
  for (const auto& b : all)
    if (!manager_->Has(b->sandbox)) Unbind(b, "stopped");
  auto expired = store_->Expire(WallMs());
  if (!expired.ok()) {
    DSEC_LOG_WARN("trajectories: expiry failed: {}", expired.status().ToString());
    return;
  }
  for (const auto& [project, id] : *expired)
    if (images_) images_->Release(HolderOf(project, id));
  if (store_->shared() && MonotonicMs() >= next_gone_check_ms_) {
    next_gone_check_ms_ = MonotonicMs() + 30000;
    ReleaseGoneHolders();
  }
  if (expired->empty() && !collect_.exchange(false)) return;
  auto n = store_->CollectBlobs();
  if (images_) (void)images_->Collect();
  DSEC_LOG_INFO("trajectories: {} expired, {} bodies collected", expired->size(), n.ok() ? *n : 0);
}

}  // namespace dsec::edge
