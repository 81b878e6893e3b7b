#include "edge/builds.h"

#include <algorithm>
#include <future>

#include "base/clock.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/cluster_images.h"
#include "images/bootstrap.h"
#include "images/import.h"

namespace dsec::edge {

namespace {

constexpr size_t kMaxQueued = 16;
constexpr size_t kMaxKeptJobs = 100;
constexpr size_t kMaxLogBytes = 4 << 20;  // the tail kept per build
constexpr const char* kBuildLabel = "dsec.build";

std::string Short(const std::string& cmd) {
  std::string s = cmd.substr(0, std::min<size_t>(cmd.size(), 60));
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  return cmd.size() > 60 ? s + "..." : s;
}

void SetEnvEntry(std::vector<std::string>* env, const std::string& k, const std::string& v) {
  std::string prefix = k + "=";
  for (auto& e : *env)
    if (e.rfind(prefix, 0) == 0) {
      e = prefix + v;
      return;
    }
  env->push_back(prefix + v);
}

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The length of the UTF-8 sequence a lead byte starts (1 for ASCII and bytes that lead none).
size_t SequenceLength(char lead) {
  auto b = static_cast<unsigned char>(lead);
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace

namespace internal {

size_t TrimLogHead(std::string* log, size_t max) {
  if (log->size() <= max) return 0;
  size_t drop = log->size() - max + max / 4;
  size_t nl = log->find('\n', drop - 1);
  if (nl != std::string::npos && nl + 1 - drop <= max / 4) {
    drop = nl + 1;
  } else {
    while (drop < log->size() && IsContinuation((*log)[drop])) ++drop;
  }
  log->erase(0, drop);
  return drop;
}

size_t Utf8Prefix(std::string_view text, size_t max_bytes, bool final) {
  size_t cut = std::min(text.size(), max_bytes);
  if (cut == text.size() && final) return cut;
  // The last character before `cut`: back over its continuation bytes to its lead byte.
  size_t k = cut;
  while (k > 0 && cut - k < 3 && IsContinuation(text[k - 1])) --k;
  if (k == 0 || IsContinuation(text[k - 1])) return cut;  // not UTF-8: as it is
  size_t lead = k - 1, len = SequenceLength(text[lead]);
  if (lead + len <= cut || (len == 1 && k < cut)) return cut;  // whole (or not UTF-8)
  if (lead > 0) return lead;  // it continues past `cut`: stop before it
  // The first character is longer than max_bytes: it comes whole, once it is all there.
  if (len <= text.size()) return len;
  return final ? text.size() : 0;
}

}  // namespace internal

struct Builds::Job {
  std::string id;
  BuildRequest req;
  std::string project;           // whose ("" : the node's own caller)
  std::string state = "queued";  // queued running canceling succeeded failed canceled
  struct Step {
    std::string name, state = "pending";  // pending running done failed canceled
  };
  std::vector<Step> steps;
  int current = -1;
  std::string log;         // the kept tail
  uint64_t log_start = 0;  // offset of log[0] in the whole log
  std::string error;
  std::string image;       // the image made, once succeeded
  std::string sandbox_id;  // the build sandbox while it exists
  std::shared_ptr<backends::ExecHandle> exec;
  std::atomic<bool> cancel{false};
  bool saving = false;  // the image is being saved: too late to cancel
  int64_t created_at = 0, started_at = 0, finished_at = 0, deadline_ms = 0;
  uint64_t seq = 0;  // the order builds were started in (List: newest first)

  // Appends to the log, keeping its bounded tail (the caller holds Builds::mu_).
  void Append(std::string_view d) {
    log.append(d);
    log_start += internal::TrimLogHead(&log, kMaxLogBytes);
  }
};

Builds::Builds(const EdgeConfig& cfg, Manager* manager, images::ImageStore* store)
    : cfg_(cfg), manager_(manager), store_(store) {
  for (int i = 0; i < cfg_.max_builds; ++i) workers_.emplace_back([this] { Worker(); });
}

Builds::~Builds() { Shutdown(); }

void Builds::Shutdown() {
  {
    MutexLock l(mu_);
    stopping_ = true;
    for (auto& j : queue_) {
      j->state = "canceled";
      j->error = "the edge shut down";
      j->finished_at = WallMs();
    }
    queue_.clear();
    for (auto& [id, j] : jobs_)
      if (!j->finished_at) CancelRunningLocked(*j);
  }
  cv_.NotifyAll();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

int Builds::CleanupLost() {
  int n = 0;
  for (const auto& id : manager_->Ids()) {
    auto e = manager_->Get(id);
    if (!e.ok() || !(*e)->params.labels.count(kBuildLabel)) continue;
    if (manager_->Delete(id, "its build was lost when the edge restarted").ok()) ++n;
  }
  return n;
}

BuildRecord Builds::RecordLocked(const Job& j) const {
  BuildRecord r;
  r.id = j.id;
  r.name = j.req.name;
  r.state = j.state;
  for (const auto& s : j.steps) r.steps.push_back({s.name, s.state});
  r.step = j.current;
  r.error = j.error;
  r.image = j.image;
  r.sandbox = j.sandbox_id;
  r.log_bytes = j.log_start + j.log.size();
  r.created_at = j.created_at;
  r.started_at = j.started_at;
  r.finished_at = j.finished_at;
  return r;
}

void Builds::PruneLocked() {
  if (jobs_.size() <= kMaxKeptJobs) return;
  std::vector<std::shared_ptr<Job>> finished;
  for (const auto& [id, j] : jobs_)
    if (j->finished_at) finished.push_back(j);
  std::sort(finished.begin(), finished.end(),
            [](const auto& a, const auto& b) { return a->finished_at < b->finished_at; });
  for (const auto& j : finished) {
    if (jobs_.size() <= kMaxKeptJobs) break;
    jobs_.erase(j->id);
  }
}

void Builds::SetCluster(ClusterImages* cluster) { cluster_ = cluster; }

std::shared_ptr<Builds::Job> Builds::FindLocked(const std::string& id,
                                                const std::string& project) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end() ||
      (!project.empty() && !it->second->project.empty() && it->second->project != project))
    return nullptr;
  return it->second;
}

StatusOr<BuildRecord> Builds::Start(BuildRequest req, const std::string& project) {
  if (store_->GetImage(req.name).ok())  // checked again when the image is added
    return Status(StatusCode::kAlreadyExists, "image \"" + req.name + "\" already exists");
  if (cluster_)
    DSEC_RETURN_IF_ERROR(cluster_->CheckName(req.name, project.empty() ? "default" : project));
  auto j = std::make_shared<Job>();
  // (In a cluster the id names the node: apiservers route a build's calls by it.)
  j->id = "bld-" + (cluster_ ? cfg_.node + "-" : std::string()) + RandomHex(8);
  j->project = project;
  j->req = std::move(req);
  j->created_at = WallMs();
  if (!j->req.suite.empty()) j->steps.push_back({"bootstrap debian:" + j->req.suite});
  if (!j->req.run.empty()) {
    j->steps.push_back({"start a build sandbox"});
    for (const auto& c : j->req.run) j->steps.push_back({"run: " + Short(c)});
    j->steps.push_back({"capture the sandbox's files"});
  }
  j->steps.push_back({"save image " + j->req.name});
  MutexLock l(mu_);
  if (stopping_) return Unavailable("the edge is shutting down");
  // A conflict first: retrying it later would not help, so it must not look like a 429.
  for (const auto& [id, other] : jobs_)
    if (other->req.name == j->req.name && !other->finished_at)
      return Status(StatusCode::kAlreadyExists,
                    "build " + id + " is already making image \"" + j->req.name + "\"");
  if (queue_.size() >= kMaxQueued)
    return OverCapacity(std::to_string(kMaxQueued) + " builds are already waiting");
  j->seq = ++next_seq_;
  jobs_[j->id] = j;
  queue_.push_back(j);
  PruneLocked();
  cv_.NotifyOne();
  return RecordLocked(*j);
}

StatusOr<BuildRecord> Builds::Get(const std::string& id, const std::string& project) {
  MutexLock l(mu_);
  auto j = FindLocked(id, project);
  if (!j) return NotFound("build " + id + " not found");
  return RecordLocked(*j);
}

StatusOr<BuildRecord> Builds::Ensure(BuildRequest req, int64_t pause_ms) {
  for (int attempt = 0;; ++attempt) {
    {
      MutexLock l(mu_);
      const Job* failed = nullptr;
      for (const auto& [id, j] : jobs_) {
        if (j->req.name != req.name || !j->project.empty()) continue;
        if (!j->finished_at) return RecordLocked(*j);
        if (j->state != "succeeded" && (!failed || j->seq > failed->seq)) failed = j.get();
      }
      if (int64_t ago = failed ? WallMs() - failed->finished_at : 0; failed && ago < pause_ms)
        return Unavailable("build " + failed->id + " of image \"" + req.name + "\" " +
                           failed->state + " " + std::to_string(ago / 1000) +
                           " s ago (another starts " + std::to_string(pause_ms / 1000) +
                           " s after it): " + failed->error);
    }
    auto r = Start(req);
    // Another caller started it (or it was just made) meanwhile: look again, once.
    if (r.ok() || r.status().code() != StatusCode::kAlreadyExists || attempt > 0) return r;
  }
}

std::vector<BuildRecord> Builds::List(const std::string& state, const std::string& project) {
  MutexLock l(mu_);
  std::vector<const Job*> all;
  for (const auto& [id, j] : jobs_)
    if (FindLocked(id, project)) all.push_back(j.get());
  std::sort(all.begin(), all.end(), [](const Job* a, const Job* b) { return a->seq > b->seq; });
  std::vector<BuildRecord> out;
  for (const Job* j : all)
    if (state.empty() || j->state == state) out.push_back(RecordLocked(*j));
  return out;
}

StatusOr<BuildLogPiece> Builds::Log(const std::string& id, uint64_t offset, uint64_t max_bytes,
                                    const std::string& project) {
  MutexLock l(mu_);
  auto found = FindLocked(id, project);
  if (!found) return NotFound("build " + id + " not found");
  const Job& j = *found;
  uint64_t from = std::max(offset, j.log_start);
  uint64_t end = j.log_start + j.log.size();
  if (from > end) from = end;
  std::string_view rest = std::string_view(j.log).substr(from - j.log_start);
  // Whole UTF-8 characters only (the next call continues where this one stopped).
  std::string text(rest.substr(0, internal::Utf8Prefix(rest, max_bytes, j.finished_at != 0)));
  BuildLogPiece p;
  p.offset = from;
  p.next_offset = from + text.size();
  p.text = std::move(text);
  p.done = j.finished_at != 0;
  return p;
}

StatusOr<BuildRecord> Builds::Cancel(const std::string& id, const std::string& project) {
  MutexLock l(mu_);
  auto found = FindLocked(id, project);
  if (!found) return NotFound("build " + id + " not found");
  Job& j = *found;
  if (j.finished_at) return RecordLocked(j);  // nothing to cancel
  auto q = std::find(queue_.begin(), queue_.end(), found);
  if (q != queue_.end()) {
    queue_.erase(q);
    j.cancel = true;
    j.state = "canceled";
    j.error = "canceled before it started";
    j.finished_at = WallMs();
    for (auto& s : j.steps) s.state = "canceled";
  } else {
    CancelRunningLocked(j);
  }
  return RecordLocked(j);
}

void Builds::CancelRunningLocked(Job& j) {
  // Once its image is being saved the build ends as that goes (it is quick), not canceled.
  if (j.saving) return;
  j.cancel = true;
  j.state = "canceling";  // Run() makes it "canceled" once the sandbox and layers are gone
  if (j.exec) j.exec->Kill();
}

void Builds::Worker() {
  for (;;) {
    std::shared_ptr<Job> j;
    {
      MutexLock l(mu_);
      cv_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      j = queue_.front();
      queue_.pop_front();
      j->state = "running";
      j->started_at = WallMs();
      j->deadline_ms = MonotonicMs() + j->req.timeout_s * 1000;
    }
    Run(j);
  }
}

void Builds::Run(const std::shared_ptr<Job>& j) {
  DSEC_LOG_INFO("build {} of {} started", j->id, j->req.name);
  Status s = RunSteps(j);
  std::string sid;
  {
    MutexLock l(mu_);
    sid = j->sandbox_id;
    j->exec.reset();
  }
  bool sandbox_gone = true;
  if (!sid.empty()) {
    if (Status d = manager_->Delete(sid, "build finished");
        !d.ok() && d.code() != StatusCode::kNotFound) {
      // Its TTL (the build's timeout and then some) or the next edge's cleanup removes it.
      DSEC_LOG_WARN("build {}: delete sandbox {}: {}", j->id, sid, d.ToString());
      sandbox_gone = false;
    }
  }
  if (!s.ok()) (void)store_->Collect();  // the layers a failed build stored
  MutexLock l(mu_);
  if (sandbox_gone) j->sandbox_id.clear();  // a finished build names no deleted sandbox
  if (s.ok()) {
    j->state = "succeeded";
  } else {
    bool canceled = j->cancel.load();
    j->state = canceled ? "canceled" : "failed";
    j->error = canceled ? "canceled" : s.message();
    for (auto& st : j->steps)
      if (st.state == "running" || st.state == "pending")
        st.state = canceled ? "canceled" : "failed";
    j->Append("\n[dsec] build " + j->state + ": " + j->error + "\n");
  }
  j->finished_at = WallMs();
  DSEC_LOG_INFO("build {} of {}: {}{}", j->id, j->req.name, j->state,
                j->error.empty() ? "" : " (" + j->error + ")");
}

struct Builds::Steps {
  Builds* b;
  std::shared_ptr<Job> j;
  int k = 0;  // the current step

  void Append(std::string_view d) {
    MutexLock l(b->mu_);
    j->Append(d);
  }
  void Begin() {
    std::string line;
    {
      MutexLock l(b->mu_);
      j->current = k;
      j->steps[k].state = "running";
      line = "[dsec] step " + std::to_string(k + 1) + "/" + std::to_string(j->steps.size()) + ": " +
             j->steps[k].name + "\n";
    }
    Append(line);
  }
  void Done() {
    MutexLock l(b->mu_);
    j->steps[k].state = "done";
    ++k;
  }
  Status Check() const {
    if (j->cancel) return Status(StatusCode::kAborted, "canceled");
    if (MonotonicMs() > j->deadline_ms)
      return DeadlineExceeded("the build ran past its timeout of " +
                              std::to_string(j->req.timeout_s) + " s");
    return OkStatus();
  }
};

Status Builds::RunSteps(const std::shared_ptr<Job>& j) {
  const BuildRequest& r = j->req;
  Steps s{this, j};
  images::ImageStore::Lease lease(store_);  // its new layers are referenced only at the end
  images::Image img;
  img.name = r.name;
  img.source = "build";
  std::vector<std::string> stack;  // what the build sandbox starts from
  if (!r.suite.empty()) {
    DSEC_RETURN_IF_ERROR(BootstrapStep(s, &img, &stack));
  } else {
    DSEC_ASSIGN_OR_RETURN(images::Stack from, store_->Acquire(r.from, ""));
    img.base = from.base;
    img.config = from.config;
    stack = r.from;
  }
  DSEC_RETURN_IF_ERROR(s.Check());
  if (!r.run.empty()) {
    DSEC_ASSIGN_OR_RETURN(auto sb, SandboxStep(s, stack));
    for (const auto& cmd : r.run) {
      DSEC_RETURN_IF_ERROR(s.Check());
      DSEC_RETURN_IF_ERROR(CommandStep(s, *sb, cmd));
    }
    DSEC_RETURN_IF_ERROR(CaptureStep(s, *sb, &img));
  }
  DSEC_RETURN_IF_ERROR(s.Check());
  return SaveStep(s, &img);
}

Status Builds::BootstrapStep(Steps& s, images::Image* img, std::vector<std::string>* stack) {
  const BuildRequest& r = s.j->req;
  s.Begin();
  images::ImportOptions io;
  io.name = r.name;
  io.format = "rootfs";
  io.add_image = false;
  io.skip_dev_nodes = true;
  io.max_archive_bytes = cfg_.image_max_layer_bytes;
  DSEC_ASSIGN_OR_RETURN(auto imp, images::Importer::Start(store_, io));
  images::BootstrapOptions bo;
  bo.suite = r.suite;
  bo.variant = r.variant;
  bo.packages = r.packages;
  bo.mirror = cfg_.build_mirror;
  bo.deadline_ms = s.j->deadline_ms;
  DSEC_RETURN_IF_ERROR(images::Bootstrap(
      bo, [&](std::string_view d) { return imp->Feed(d); },
      [&](std::string_view d) { s.Append(d); }, &s.j->cancel));
  DSEC_ASSIGN_OR_RETURN(images::Image made, imp->Finish());
  img->layers = made.layers;
  img->config = made.config;
  *stack = made.layers;
  s.Append("[dsec] root filesystem stored as layer " + made.layers.back() + "\n");
  s.Done();
  return OkStatus();
}

StatusOr<std::shared_ptr<backends::Sandbox>> Builds::SandboxStep(
    Steps& s, const std::vector<std::string>& stack) {
  const BuildRequest& r = s.j->req;
  s.Begin();
  CreateParams p;
  p.image = JoinStrings(stack, ",");
  p.resources = {.cpu = std::max(2.0, cfg_.defaults.cpu),
                 .memory_mb = r.memory_mb,
                 .pids = std::max<int64_t>(1024, cfg_.defaults.pids),
                 .disk_mb = r.disk_mb};
  p.ttl_s = r.timeout_s + 600;
  p.env = r.env;
  p.labels = {{kBuildLabel, s.j->id}};
  p.network = r.network;
  DSEC_ASSIGN_OR_RETURN(
      std::vector<SandboxRecord> made,
      manager_->Create(p, 1, /*wait=*/true, [](std::function<void()> f) { f(); }));
  std::string sid = made.at(0).id;
  {
    MutexLock l(mu_);
    s.j->sandbox_id = sid;
  }
  DSEC_ASSIGN_OR_RETURN(auto entry, manager_->Get(sid));
  DSEC_ASSIGN_OR_RETURN(auto sb, entry->Sandbox());
  if (!r.workdir.empty()) {
    // Made by root like the rest of the build (the sandbox's own workdir is the user's).
    backends::ExecRequest mk;
    mk.cmd = {"/bin/mkdir", "-p", "--", r.workdir};
    mk.user = "root";
    mk.cwd = "/";
    DSEC_ASSIGN_OR_RETURN(backends::ExecOutput o, sb->Exec(mk));
    if (o.result.exit_code != 0)
      return InvalidArgument("cannot make the workdir " + r.workdir + ": " + Short(o.stderr_data));
  }
  s.Append("[dsec] sandbox " + sid + " from " + JoinStrings(r.from.empty() ? stack : r.from, ",") +
           "\n");
  s.Done();
  return sb;
}

Status Builds::CommandStep(Steps& s, backends::Sandbox& sb, const std::string& cmd) {
  const BuildRequest& r = s.j->req;
  s.Begin();
  s.Append("$ " + cmd + "\n");
  struct Observer : backends::ExecObserver {
    std::function<void(std::string_view)> out;
    std::promise<StatusOr<backends::ExecResult>> result;
    void OnOutput(uint8_t, std::string_view d) override { out(d); }
    void OnExit(const StatusOr<backends::ExecResult>& r) override { result.set_value(r); }
  };
  auto obs = std::make_shared<Observer>();
  obs->out = [&s](std::string_view d) { s.Append(d); };
  auto fut = obs->result.get_future();
  backends::ExecRequest er;
  er.shell = cmd;
  er.user = "root";
  er.cwd = r.workdir.empty() ? "/" : r.workdir;
  er.timeout_ms = std::max<int64_t>(1000, s.j->deadline_ms - MonotonicMs());
  er.max_output_bytes = cfg_.max_output_bytes;  // the log keeps its own bounded tail
  auto started = sb.StartExec(er, obs);
  if (!started.ok()) return started.status().WithContext("step \"" + Short(cmd) + "\"");
  auto handle = *started;
  {
    MutexLock l(mu_);
    s.j->exec = handle;
    if (s.j->cancel) handle->Kill();
  }
  while (fut.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready)
    if (s.j->cancel) handle->Kill();
  {
    MutexLock l(mu_);
    s.j->exec.reset();
  }
  StatusOr<backends::ExecResult> res = fut.get();
  DSEC_RETURN_IF_ERROR(s.Check());
  const std::string what = "step \"" + Short(cmd) + "\"";
  if (!res.ok()) return res.status().WithContext(what);
  if (res->timed_out) return DeadlineExceeded(what + " timed out");
  if (res->oom_killed)
    return ResourceExhausted(what + " ran out of memory (memory_mb " + std::to_string(r.memory_mb) +
                             ")");
  if (res->exit_code != 0)
    return InvalidArgument(what + " " +
                           (res->signal ? "was killed by signal " + std::to_string(res->signal)
                                        : "exited with status " + std::to_string(res->exit_code)));
  s.Done();
  return OkStatus();
}

Status Builds::CaptureStep(Steps& s, backends::Sandbox& sb, images::Image* img) {
  s.Begin();
  // A big layer takes a while to read and store: a line every 5 s says how far it is.
  int64_t next_line = MonotonicMs() + 5000;
  auto progress = [&](uint64_t bytes, bool read_all) {
    const std::string mib = std::to_string(bytes >> 20) + " MiB";
    if (read_all) {
      s.Append("[dsec] layer read (" + mib + "), storing it\n");
    } else if (MonotonicMs() >= next_line) {
      s.Append("[dsec] capturing the layer: " + mib + " read so far\n");
      next_line = MonotonicMs() + 5000;
    }
  };
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> captured,
                        sb.CaptureStack(/*keep_setuid=*/true, progress));
  img->layers.clear();
  img->base.clear();
  for (const auto& d : captured) {
    if (d == "host")
      img->base = "host";
    else
      img->layers.push_back(d);
  }
  s.Append("[dsec] captured layer " + img->layers.back() + "\n");
  s.Done();
  return OkStatus();
}

Status Builds::SaveStep(Steps& s, images::Image* img) {
  const BuildRequest& r = s.j->req;
  s.Begin();
  {
    // Past this point the build is not canceled (Cancel() sees `saving`): its image may be
    // stored at any moment, and a canceled build must not leave one.
    MutexLock l(mu_);
    if (s.j->cancel) return Status(StatusCode::kAborted, "canceled");
    s.j->saving = true;
  }
  for (const auto& [key, v] : r.env) SetEnvEntry(&img->config.env, key, v);
  if (!r.workdir.empty()) img->config.workdir = r.workdir;
  // In a cluster the image is its project's, and the cluster's once published (else not kept).
  if (cluster_) img->project = s.j->project.empty() ? "default" : s.j->project;
  DSEC_RETURN_IF_ERROR(store_->PutImage(*img));
  if (cluster_) DSEC_RETURN_IF_ERROR(cluster_->Publish(*img));
  {
    MutexLock l(mu_);
    s.j->image = img->name;
  }
  s.Append("[dsec] image " + img->name + " saved (" + std::to_string(img->layers.size()) +
           " layers)\n");
  s.Done();
  return OkStatus();
}

}  // namespace dsec::edge
