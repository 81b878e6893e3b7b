#include "backends/session/agent_session.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>

#include "backends/session/port_bridge.h"
#include "base/mutex.h"
#include "protocol/frame.h"

namespace dsec::backends {

using protocol::Json;

namespace {

constexpr uint64_t kStdinWindow = 1 << 20;
constexpr uint64_t kMaxPendingStdin = 16 << 20;
constexpr uint32_t kListDirLimit = 10000;  // entries one ListDir returns

}  // namespace

// Attributes SIGKILLed execs to the OOM killer when the sandbox's OOM count went up.
struct AgentSession::OomTracker {
  OomCounter count;
  std::atomic<uint64_t> seen{0};
  bool CheckNewKill() {
    uint64_t n = count ? count() : 0;
    return n > seen.exchange(n);
  }
  bool KilledSince() const { return count && count() > seen.load(); }
};

// A SIGKILLed job's OOM attribution is decided when the session first sees it ended (the
// cgroup's OOM counter moved since the last check) and kept, so every later read says the same.
struct AgentSession::JobOom {
  std::shared_ptr<OomTracker> oom;
  Mutex mu;
  std::map<std::string, bool> killed DSEC_GUARDED_BY(mu);
  std::deque<std::string> order DSEC_GUARDED_BY(mu);

  void Attribute(protocol::JobInfo* info) {
    if (!info->done || info->result.signal != SIGKILL || info->result.timed_out) return;
    MutexLock l(mu);
    auto [it, fresh] = killed.emplace(info->job_id, false);
    if (fresh) {
      it->second = oom->CheckNewKill();
      order.push_back(info->job_id);
      if (order.size() > 4096) {  // far more than an agent keeps (JobStartRequest::keep)
        killed.erase(order.front());
        order.pop_front();
      }
    }
    info->result.oom_killed = it->second;
  }
};

namespace {

class ExecHandleImpl : public ExecHandle {
 public:
  ExecHandleImpl(std::weak_ptr<AgentClient> client, uint32_t channel)
      : client_(std::move(client)), channel_(channel) {}

  Status WriteStdin(std::string data) override {
    MutexLock l(mu_);
    if (eof_requested_) return FailedPrecondition("stdin is closed");
    if (pending_.size() + data.size() > kMaxPendingStdin)
      return ResourceExhausted("too much stdin buffered; the command is not reading it");
    pending_ += data;
    PumpLocked();
    return OkStatus();
  }
  void CloseStdin() override {
    MutexLock l(mu_);
    eof_requested_ = true;
    PumpLocked();
  }
  void OnAck(uint64_t n) {
    MutexLock l(mu_);
    inflight_ -= std::min(inflight_, n);
    PumpLocked();
  }
  void Signal(int sig) override { Control({{"signal", sig}}); }
  void Resize(uint16_t cols, uint16_t rows) override { Control({{"resize", {cols, rows}}}); }
  void Kill() override { Control({{"kill", true}}); }

 private:
  void Control(const Json& j) {
    if (auto c = client_.lock()) c->SendControl(channel_, j);
  }
  void PumpLocked() DSEC_REQUIRES(mu_) {
    auto c = client_.lock();
    if (!c) return;
    while (inflight_ < kStdinWindow && !pending_.empty()) {
      size_t n =
          std::min<uint64_t>({kStdinWindow - inflight_, pending_.size(), protocol::kDataChunk});
      c->SendData(channel_, protocol::kStdin, pending_.substr(0, n), false);
      pending_.erase(0, n);
      inflight_ += n;
    }
    if (pending_.empty() && eof_requested_ && !eof_sent_) {
      c->SendData(channel_, protocol::kStdin, "", true);
      eof_sent_ = true;
    }
  }

  std::weak_ptr<AgentClient> client_;
  uint32_t channel_;
  Mutex mu_;
  std::string pending_ DSEC_GUARDED_BY(mu_);
  uint64_t inflight_ DSEC_GUARDED_BY(mu_) = 0;
  bool eof_requested_ DSEC_GUARDED_BY(mu_) = false;
  bool eof_sent_ DSEC_GUARDED_BY(mu_) = false;
};

// Relays one exec's (or shell command's) frames to its observer.
class ExecCall : public AgentClient::Call {
 public:
  ExecCall(std::shared_ptr<ExecObserver> obs, std::shared_ptr<AgentSession::OomTracker> oom)
      : obs_(std::move(obs)), oom_(std::move(oom)) {}
  // The call keeps the stdin state alive until the command finishes: a caller may drop its
  // handle right after starting (buffered Exec does) while stdin is still being streamed.
  void set_handle(std::shared_ptr<ExecHandleImpl> h) { handle_ = std::move(h); }

  void OnEvent(const Json& e) override {
    if (auto it = e.find("started"); it != e.end() && it->is_object())
      obs_->OnStart(it->value("pid", 0));
    if (auto it = e.find("stdin_ack"); it != e.end() && it->is_number_unsigned() && handle_)
      handle_->OnAck(it->get<uint64_t>());
  }
  void OnData(uint8_t stream, std::string_view data) override { obs_->OnOutput(stream, data); }
  void OnResponse(StatusOr<Json> r) override {
    handle_.reset();
    if (!r.ok()) return obs_->OnExit(r.status());
    auto res = protocol::ExecResultFromJson(*r);
    if (res.ok() && res->signal == SIGKILL) res->oom_killed = oom_->CheckNewKill();
    obs_->OnExit(res);
  }

 private:
  std::shared_ptr<ExecObserver> obs_;
  std::shared_ptr<AgentSession::OomTracker> oom_;
  std::shared_ptr<ExecHandleImpl> handle_;
};

// Starts a streaming call and its handle.
std::shared_ptr<ExecHandleImpl> StartStreaming(const std::shared_ptr<AgentClient>& client,
                                               std::string payload,
                                               std::shared_ptr<ExecObserver> observer,
                                               std::shared_ptr<AgentSession::OomTracker> oom) {
  auto call = std::make_shared<ExecCall>(std::move(observer), std::move(oom));
  uint32_t ch = client->StartCall(std::move(payload), call);
  auto handle = std::make_shared<ExecHandleImpl>(client, ch);
  call->set_handle(handle);
  return handle;
}

}  // namespace

std::shared_ptr<AgentSession> AgentSession::Start(IoRunner& io, UniqueFd stream,
                                                  OomCounter oom_kills, uint64_t oom_seen,
                                                  std::function<void(bool oom)> on_closed) {
  std::shared_ptr<AgentSession> s(new AgentSession());
  s->oom_ = std::make_shared<OomTracker>();
  s->oom_->count = std::move(oom_kills);
  s->oom_->seen = oom_seen;
  s->job_oom_ = std::make_shared<JobOom>();
  s->job_oom_->oom = s->oom_;
  s->io_ = &io.io();
  s->client_ = AgentClient::Create(io.io(), std::move(stream));
  s->client_->Start([oom = s->oom_, cb = std::move(on_closed)](const Status&) {
    if (cb) cb(oom->KilledSince());
  });
  return s;
}

AgentSession::~AgentSession() { Close(); }

void AgentSession::Close() {
  if (client_) client_->Close();
}

StatusOr<std::shared_ptr<ExecHandle>> AgentSession::StartExec(
    protocol::ExecSpec spec, const std::string& stdin_data,
    std::shared_ptr<ExecObserver> observer) {
  bool stream_stdin = stdin_data.size() > kInlineStdinMax;
  if (stream_stdin) {
    spec.stdin_stream = true;
  } else {
    spec.stdin_data = stdin_data;
  }
  Json j = protocol::Encode(protocol::ExecRequest{std::move(spec)});
  // One request frame to the agent: command, environment, inline stdin and an fncall's code
  // and files (base64) must fit.
  std::string payload = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (payload.size() > protocol::kMaxPayload)
    return TooLarge("the request is too large for one agent frame (" +
                    std::to_string(payload.size()) + " bytes encoded, at most " +
                    std::to_string(protocol::kMaxPayload) + ")");
  auto handle = StartStreaming(client_, std::move(payload), std::move(observer), oom_);
  if (stream_stdin) {
    DSEC_RETURN_IF_ERROR(handle->WriteStdin(stdin_data));
    handle->CloseStdin();
  }
  return std::shared_ptr<ExecHandle>(handle);
}

StatusOr<std::string> AgentSession::OpenShell(protocol::ExecSpec spec) {
  DSEC_ASSIGN_OR_RETURN(Json r,
                        client_->CallSync(protocol::Encode(protocol::ShellOpenRequest{spec})));
  DSEC_ASSIGN_OR_RETURN(auto opened, protocol::DecodeAs<protocol::ShellOpenResponse>(r));
  return opened.shell_id;
}

StatusOr<std::shared_ptr<ExecHandle>> AgentSession::RunInShell(
    const protocol::ShellRunRequest& req, std::shared_ptr<ExecObserver> observer) {
  return std::shared_ptr<ExecHandle>(StartStreaming(
      client_, protocol::Encode(req).dump(-1, ' ', false, Json::error_handler_t::replace),
      std::move(observer), oom_));
}

Status AgentSession::CloseShell(const std::string& shell_id) {
  return client_->CallSync(protocol::Encode(protocol::ShellCloseRequest{shell_id})).status();
}

Status AgentSession::Upload(const Json& request, const UploadBody& body) {
  if (body.fd >= 0)
    return client_->CallSyncUpload(request, body.fd, body.offset, body.size).status();
  return client_->CallSync(request, body.data, nullptr, 0, /*has_upload=*/true).status();
}

StatusOr<std::string> AgentSession::ReadFile(protocol::RunAs as, const std::string& path,
                                             uint64_t max_bytes) {
  protocol::ReadFileRequest req{as, path, max_bytes, 0};
  std::string data;
  DSEC_RETURN_IF_ERROR(client_->CallSync(protocol::Encode(req), {}, &data, max_bytes).status());
  return data;
}

Status AgentSession::WriteFile(protocol::RunAs as, const std::string& path, const UploadBody& data,
                               uint32_t mode) {
  return Upload(protocol::Encode(protocol::WriteFileRequest{as, path, mode, true, false}), data);
}

StatusOr<std::vector<FileEntry>> AgentSession::ListDir(protocol::RunAs as,
                                                       const std::string& path) {
  protocol::ListDirRequest req{as, path, kListDirLimit};
  DSEC_ASSIGN_OR_RETURN(Json r, client_->CallSync(protocol::Encode(req)));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::ListDirResponse>(r));
  return std::move(resp.entries);
}

StatusOr<FileEntry> AgentSession::Stat(protocol::RunAs as, const std::string& path) {
  DSEC_ASSIGN_OR_RETURN(Json r,
                        client_->CallSync(protocol::Encode(protocol::StatRequest{as, path})));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::StatResponse>(r));
  return std::move(resp.entry);
}

StatusOr<protocol::StatResponse> AgentSession::StatFs(protocol::RunAs as, const std::string& path,
                                                      bool machine) {
  DSEC_ASSIGN_OR_RETURN(
      Json r, client_->CallSync(protocol::Encode(protocol::StatRequest{as, path, machine})));
  return protocol::DecodeAs<protocol::StatResponse>(r);
}

Status AgentSession::MakeDir(protocol::RunAs as, const std::string& path, uint32_t mode) {
  return client_->CallSync(protocol::Encode(protocol::MakeDirRequest{as, path, mode, true}))
      .status();
}

Status AgentSession::Remove(protocol::RunAs as, const std::string& path, bool recursive) {
  return client_->CallSync(protocol::Encode(protocol::RemoveRequest{as, path, recursive})).status();
}

Status AgentSession::ExtractTar(protocol::RunAs as, const std::string& dir, const UploadBody& tar,
                                uint64_t max_bytes) {
  return Upload(protocol::Encode(protocol::TarExtractRequest{as, dir, max_bytes}), tar);
}

StatusOr<std::string> AgentSession::CreateTar(protocol::RunAs as, const std::string& dir,
                                              uint64_t max_bytes) {
  // The agent stops at this bound too, instead of streaming the rest for nothing (a sparse 1 TB
  // file would keep it busy until the call timed out).
  protocol::TarCreateRequest req{as, dir, max_bytes};
  std::string data;
  DSEC_RETURN_IF_ERROR(client_->CallSync(protocol::Encode(req), {}, &data, max_bytes).status());
  if (data.size() >= max_bytes)
    return TooLarge("archive is larger than " + std::to_string(max_bytes) + " bytes");
  return data;
}

StatusOr<UniqueFd> AgentSession::OpenPort(uint16_t port, int64_t timeout_ms) {
  return OpenPortRelay(*io_, client_, port, timeout_ms);
}

namespace {

// A watch_dir call: its events to the observer; Stop asks the agent to end it.
class WatchCall : public AgentClient::Call, public WatchHandle {
 public:
  WatchCall(std::weak_ptr<AgentClient> client, std::shared_ptr<WatchObserver> obs)
      : client_(std::move(client)), obs_(std::move(obs)) {}
  void set_channel(uint32_t ch) { channel_ = ch; }

  void OnEvent(const Json& e) override {
    if (e.contains("watching")) return obs_->OnWatching();
    auto fs = e.find("fs");
    if (fs == e.end() || !fs->is_array()) return;  // "overflow": nothing E2B could say
    std::vector<protocol::WatchEvent> events;
    for (const auto& j : *fs)
      if (auto ev = protocol::WatchEventFromJson(j); ev.ok()) events.push_back(std::move(*ev));
    if (!events.empty()) obs_->OnEvents(std::move(events));
  }
  void OnResponse(StatusOr<Json> r) override {
    Status s = r.ok() ? OkStatus() : r.status();
    if (s.code() == StatusCode::kInvalidArgument &&
        s.message().find("unknown operation") != std::string::npos)
      s = FailedPrecondition(
          "this sandbox's agent predates directory watches (it was started by an older edge)");
    obs_->OnEnd(s);
  }
  void Stop() override {
    if (auto c = client_.lock(); c && channel_) c->SendControl(channel_, {{"close", true}});
  }

 private:
  std::weak_ptr<AgentClient> client_;
  std::shared_ptr<WatchObserver> obs_;
  std::atomic<uint32_t> channel_{0};
};

}  // namespace

StatusOr<uint64_t> AgentSession::CaptureLayer(const protocol::CaptureLayerRequest& req,
                                              std::function<Status(std::string_view)> sink) {
  // A large layer takes a while: as long as an archive may (10 minutes).
  auto r = client_->CallSyncStream(protocol::Encode(req), std::move(sink), 600000);
  if (!r.ok() && r.status().code() == StatusCode::kInvalidArgument &&
      r.status().message().find("unknown operation") != std::string::npos)
    return FailedPrecondition(
        "this sandbox's agent predates snapshots of microVMs (it was started by an older edge)");
  DSEC_RETURN_IF_ERROR(r.status());
  return r->value("bytes", uint64_t{0});
}

std::shared_ptr<WatchHandle> AgentSession::WatchDir(protocol::WatchDirRequest req,
                                                    std::shared_ptr<WatchObserver> observer) {
  auto call = std::make_shared<WatchCall>(client_, std::move(observer));
  call->set_channel(client_->StartCall(protocol::Encode(req), call));
  return call;
}

namespace {

// An agent that predates jobs does not know their operations.
Status JobStatus(const Status& s) {
  if (s.code() == StatusCode::kInvalidArgument &&
      s.message().find("unknown operation") != std::string::npos)
    return FailedPrecondition(
        "this sandbox's agent predates background execs kept across edge restarts (it was "
        "started by an older edge); create a new sandbox for background execs");
  return s;
}

class JobReadCall : public AgentClient::Call {
 public:
  JobReadCall(std::function<void(StatusOr<AgentSession::JobOutput>)> done,
              std::function<void(protocol::JobInfo*)> attribute)
      : done_(std::move(done)), attribute_(std::move(attribute)) {}
  void OnData(uint8_t stream, std::string_view data) override {
    std::string& buf = stream == protocol::kStderr ? out_.err : out_.out;
    if (buf.size() + data.size() <= protocol::kMaxJobRead) buf.append(data);
  }
  void OnResponse(StatusOr<Json> r) override {
    if (!r.ok()) return done_(JobStatus(r.status()));
    auto read = protocol::DecodeAs<protocol::JobReadResponse>(*r);
    if (!read.ok()) return done_(JobStatus(read.status()));
    out_.read = std::move(*read);
    attribute_(&out_.read.info);
    done_(std::move(out_));
  }

 private:
  std::function<void(StatusOr<AgentSession::JobOutput>)> done_;
  std::function<void(protocol::JobInfo*)> attribute_;
  AgentSession::JobOutput out_;
};

}  // namespace

StatusOr<protocol::JobInfo> AgentSession::StartJob(protocol::JobStartRequest req,
                                                   const std::string& stdin_data) {
  req.spec.stdin_data = stdin_data;
  req.spec.stdin_stream = false;
  std::string payload = protocol::Encode(req).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (payload.size() > protocol::kMaxPayload)
    return TooLarge(
        "a background exec's command, environment and stdin must fit in one agent "
        "frame: " +
        std::to_string(payload.size()) + " bytes encoded, at most " +
        std::to_string(protocol::kMaxPayload));
  auto r = client_->CallSync(Json::parse(payload));
  if (!r.ok()) return JobStatus(r.status());
  auto info = protocol::DecodeAs<protocol::JobInfo>(*r);
  if (!info.ok()) return JobStatus(info.status());
  return info;
}

void AgentSession::ReadJob(const protocol::JobReadRequest& req,
                           std::function<void(StatusOr<JobOutput>)> done) {
  client_->StartCall(
      protocol::Encode(req),
      std::make_shared<JobReadCall>(
          std::move(done), [memo = job_oom_](protocol::JobInfo* i) { memo->Attribute(i); }));
}

StatusOr<protocol::JobInfo> AgentSession::KillJob(const std::string& job_id, bool forget) {
  auto r = client_->CallSync(protocol::Encode(protocol::JobKillRequest{job_id, forget}));
  if (!r.ok()) return JobStatus(r.status());
  auto info = protocol::DecodeAs<protocol::JobInfo>(*r);
  if (!info.ok()) return JobStatus(info.status());
  job_oom_->Attribute(&*info);
  return info;
}

StatusOr<std::vector<protocol::JobInfo>> AgentSession::ListJobs() {
  auto r = client_->CallSync(protocol::Encode(protocol::JobListRequest{}));
  if (!r.ok()) return JobStatus(r.status());
  auto list = protocol::DecodeAs<protocol::JobListResponse>(*r);
  if (!list.ok()) return JobStatus(list.status());
  for (auto& i : list->jobs) job_oom_->Attribute(&i);
  return std::move(list->jobs);
}

StatusOr<int> AgentSession::SignalAll(int sig) {
  DSEC_ASSIGN_OR_RETURN(Json r,
                        client_->CallSync(protocol::Encode(protocol::SignalAllRequest{sig})));
  DSEC_ASSIGN_OR_RETURN(auto resp, protocol::DecodeAs<protocol::SignalAllResponse>(r));
  return resp.processes;
}

}  // namespace dsec::backends
