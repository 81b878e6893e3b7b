#include "agent/jobs.h"

#include <algorithm>

#include "base/clock.h"

namespace dsec::agent {

using protocol::FrameType;
using protocol::Json;

namespace {

// A kill answers once the job ended; a process that ignores its SIGKILL that long (stuck in
// uninterruptible sleep) gets an answer that says it still runs.
constexpr int64_t kKillAnswerMs = 5000;

class ReadOp : public JobWaiter {
 public:
  ReadOp(Agent* agent, uint32_t channel, protocol::JobReadRequest req)
      : JobWaiter(agent, channel), req_(std::move(req)) {}

  void Begin() override { Try(false); }
  void OnJobNews(bool gone) override {
    if (gone) {
      registered_ = false;
      return agent_->FinishWithError(this, NotFound("job " + req_.job_id + " was forgotten"));
    }
    Try(false);
  }
  void OnDeadline() override { Try(true); }
  void Cancel() override { Unregister(); }

 private:
  Job* job() { return agent_->jobs().Find(req_.job_id); }
  void Unregister() {
    if (!registered_) return;
    registered_ = false;
    if (Job* j = job()) j->RemoveWaiter(this);
  }

  void Try(bool deadline) {
    Job* j = job();
    if (!j) return agent_->FinishWithError(this, NotFound("job " + req_.job_id + " not found"));
    bool news = j->output(protocol::kStdout).size() > req_.stdout_offset ||
                j->output(protocol::kStderr).size() > req_.stderr_offset;
    bool ready = j->done() || deadline || req_.wait_ms == 0 || (!req_.wait_exit && news);
    if (!ready) {
      if (!registered_) {
        registered_ = true;
        j->AddWaiter(this);
        agent_->SetDeadline(this, MonotonicMs() + req_.wait_ms);
      }
      return;
    }
    Unregister();
    protocol::JobReadResponse r;
    r.info = j->info();
    uint64_t budget = req_.max_bytes;
    auto send = [&](uint8_t stream, uint64_t offset, uint64_t* start, uint64_t* sent) {
      const std::string& data = j->output(stream);
      *start = std::min<uint64_t>(offset, data.size());
      size_t n = static_cast<size_t>(std::min<uint64_t>(data.size() - *start, budget));
      for (size_t off = 0; off < n; off += protocol::kDataChunk)
        agent_->Send(
            FrameType::kData, stream, channel_,
            std::string_view(data).substr(*start + off, std::min(protocol::kDataChunk, n - off)));
      *sent = n;
      budget -= n;
    };
    send(protocol::kStdout, req_.stdout_offset, &r.stdout_offset, &r.stdout_sent);
    send(protocol::kStderr, req_.stderr_offset, &r.stderr_offset, &r.stderr_sent);
    agent_->Finish(this, protocol::Encode(r));
  }

  protocol::JobReadRequest req_;
  bool registered_ = false;
};

class KillOp : public JobWaiter {
 public:
  KillOp(Agent* agent, uint32_t channel, protocol::JobKillRequest req)
      : JobWaiter(agent, channel), req_(std::move(req)) {}

  void Begin() override {
    Job* j = agent_->jobs().Find(req_.job_id);
    if (!j) return agent_->FinishWithError(this, NotFound("job " + req_.job_id + " not found"));
    if (j->done()) return Answer(j);
    registered_ = true;
    j->AddWaiter(this);
    agent_->SetDeadline(this, MonotonicMs() + kKillAnswerMs);
    j->Kill();
  }
  void OnJobNews(bool gone) override {
    if (gone) {
      registered_ = false;
      return agent_->FinishWithError(this, NotFound("job " + req_.job_id + " was forgotten"));
    }
    Job* j = agent_->jobs().Find(req_.job_id);
    if (j && j->done()) Answer(j);
  }
  void OnDeadline() override {
    if (Job* j = agent_->jobs().Find(req_.job_id)) Answer(j);
  }
  void Cancel() override {
    if (!registered_) return;
    registered_ = false;
    if (Job* j = agent_->jobs().Find(req_.job_id)) j->RemoveWaiter(this);
  }

 private:
  void Answer(Job* j) {
    if (registered_) {
      registered_ = false;
      j->RemoveWaiter(this);
    }
    Json info = protocol::Encode(j->info());
    if (req_.forget) agent_->jobs().Forget(req_.job_id);
    agent_->Finish(this, info);
  }

  protocol::JobKillRequest req_;
  bool registered_ = false;
};

}  // namespace

Job::~Job() {
  if (exec_) {
    exec_->Cancel();  // kills the process tree
    jobs_->agent()->RetireOwned(std::move(exec_));
  }
}

protocol::JobInfo Job::info() const {
  protocol::JobInfo i = info_;
  i.stdout_kept = out_.size();
  i.stderr_kept = err_.size();
  if (i.done) {
    i.result.stdout_truncated = i.result.stdout_truncated || out_dropped_;
    i.result.stderr_truncated = i.result.stderr_truncated || err_dropped_;
  }
  return i;
}

void Job::Kill() {
  if (exec_ && !info_.done) KillDetachedExec(exec_.get());
}

void Job::OnOutput(uint8_t stream, std::string_view data) {
  uint64_t max = jobs_->max_kept_bytes(), held = jobs_->kept_bytes();
  size_t room = held >= max ? 0 : static_cast<size_t>(std::min<uint64_t>(max - held, data.size()));
  bool is_err = stream == protocol::kStderr;
  if (room < data.size()) (is_err ? err_dropped_ : out_dropped_) = true;
  if (room == 0) return;
  (is_err ? err_ : out_).append(data.substr(0, room));
  jobs_->AddKept(static_cast<int64_t>(room));
  Notify(false);
}

void Job::OnExit(const protocol::ExecResult& r) {
  info_.done = true;
  info_.result = r;
  if (exec_) jobs_->agent()->RetireOwned(std::move(exec_));
  Notify(false);
}

void Job::Notify(bool gone) {
  std::set<JobWaiter*> ws = waiters_;
  for (JobWaiter* w : ws) {
    if (!waiters_.count(w)) continue;  // answered (and removed) by an earlier one's news
    if (gone) waiters_.erase(w);
    w->OnJobNews(gone);
  }
}

StatusOr<protocol::JobInfo> Jobs::Start(protocol::JobStartRequest req) {
  if (Find(req.job_id)) return Status(StatusCode::kAlreadyExists, "job " + req.job_id + " exists");
  max_kept_bytes_ = req.max_kept_bytes;
  // Room for it: finished jobs go oldest first, past the count or past 3/4 of the output bound.
  while (jobs_.size() >= req.keep || kept_bytes_ > max_kept_bytes_ / 4 * 3) {
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const auto& j) { return j->done(); });
    if (it == jobs_.end()) break;
    Forget((*it)->id());
  }
  if (jobs_.size() >= req.keep)
    return ResourceExhausted("this sandbox already runs " + std::to_string(jobs_.size()) +
                             " background jobs (at most " + std::to_string(req.keep) + " kept)");
  auto job = std::make_unique<Job>(this, req.job_id, req.started_at, std::move(req.meta));
  Status err;
  int pid = 0;
  job->exec_ = StartDetachedExec(agent_, std::move(req.spec), job.get(), &pid, &err);
  if (!job->exec_) return err;
  job->info_.pid = pid;
  protocol::JobInfo info = job->info();
  jobs_.push_back(std::move(job));
  return info;
}

Job* Jobs::Find(const std::string& id) {
  for (auto& j : jobs_)
    if (j->id() == id) return j.get();
  return nullptr;
}

void Jobs::Forget(const std::string& id) {
  auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& j) { return j->id() == id; });
  if (it == jobs_.end()) return;
  std::unique_ptr<Job> job = std::move(*it);
  jobs_.erase(it);
  kept_bytes_ -= job->kept();
  job->Notify(true);
  // Destroyed at the end of this loop round: a caller up the stack may be inside it.
  forgotten_.push_back(std::move(job));
}

protocol::JobListResponse Jobs::List() const {
  protocol::JobListResponse r;
  for (const auto& j : jobs_) r.jobs.push_back(j->info());
  return r;
}

StatusOr<Reply> HandleJobStart(Agent* agent, uint32_t, protocol::JobStartRequest req) {
  DSEC_ASSIGN_OR_RETURN(protocol::JobInfo info, agent->jobs().Start(std::move(req)));
  return Reply(protocol::Encode(info));
}

StatusOr<Reply> HandleJobRead(Agent* agent, uint32_t ch, protocol::JobReadRequest req) {
  return Reply(std::make_unique<ReadOp>(agent, ch, std::move(req)));
}

StatusOr<Reply> HandleJobKill(Agent* agent, uint32_t ch, protocol::JobKillRequest req) {
  return Reply(std::make_unique<KillOp>(agent, ch, std::move(req)));
}

StatusOr<Reply> HandleJobList(Agent* agent, uint32_t, protocol::JobListRequest) {
  return Reply(protocol::Encode(agent->jobs().List()));
}

}  // namespace dsec::agent
