// Background jobs (protocol/agent_ops.h, job_*): execs the agent owns instead of a channel.
// A job keeps running when the edge's connection drops, so a restarted edge finds it again
// (job_list, job_read), like a shell session. Its output is kept here, in the sandbox's own
// memory (the agent is charged to the sandbox's cgroup): each stream up to the exec's
// max_output_bytes, all jobs together up to the max_kept_bytes the latest job_start gave; past
// either, output is counted and dropped and the result says truncated. Finished jobs beyond
// `keep` are forgotten oldest first; running ones are bounded by the exec cap.
//
// Reads and kills that wait are channel-bound ops (JobWaiter) registered on their job; they
// answer when it has news, when it ends or is forgotten, or at their deadline, and a dropped
// connection cancels them, never the job.
#pragma once

#include <deque>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/exec.h"
#include "protocol/agent_ops.h"

namespace dsec::agent {

class Jobs;

// An op waiting on a job: called when the job has new output, ended, or is forgotten (gone).
class JobWaiter : public Op {
 public:
  using Op::Op;
  virtual void OnJobNews(bool gone) = 0;
};

class Job : public ExecSink {
 public:
  Job(Jobs* jobs, std::string id, int64_t started_at, std::string meta)
      : jobs_(jobs), id_(std::move(id)) {
    info_.job_id = id_;
    info_.started_at = started_at;
    info_.meta = std::move(meta);
  }
  ~Job() override;
  const std::string& id() const { return id_; }
  bool done() const { return info_.done; }
  protocol::JobInfo info() const;
  const std::string& output(uint8_t stream) const {
    return stream == protocol::kStderr ? err_ : out_;
  }
  size_t kept() const { return out_.size() + err_.size(); }
  void Kill();
  void AddWaiter(JobWaiter* w) { waiters_.insert(w); }
  void RemoveWaiter(JobWaiter* w) { waiters_.erase(w); }

  void OnOutput(uint8_t stream, std::string_view data) override;
  void OnExit(const protocol::ExecResult& r) override;

 private:
  friend class Jobs;
  void Notify(bool gone);

  Jobs* jobs_;
  std::string id_;
  protocol::JobInfo info_;
  std::string out_, err_;
  bool out_dropped_ = false, err_dropped_ = false;  // by the agent-wide bound
  std::unique_ptr<Op> exec_;                        // while running
  std::set<JobWaiter*> waiters_;
};

class Jobs {
 public:
  explicit Jobs(Agent* agent) : agent_(agent) {}
  Agent* agent() const { return agent_; }
  StatusOr<protocol::JobInfo> Start(protocol::JobStartRequest req);
  Job* Find(const std::string& id);
  // Drops a job (killing it if it still runs); its waiters are told it is gone.
  void Forget(const std::string& id);
  protocol::JobListResponse List() const;
  // Output bytes held by all jobs, and the bound on them.
  uint64_t kept_bytes() const { return kept_bytes_; }
  uint64_t max_kept_bytes() const { return max_kept_bytes_; }
  void AddKept(int64_t delta) { kept_bytes_ += delta; }
  // Destroys the jobs forgotten during this loop round (Agent::FlushRetired).
  void Flush() { forgotten_.clear(); }

 private:
  Agent* agent_;
  std::vector<std::unique_ptr<Job>> forgotten_;
  std::deque<std::unique_ptr<Job>> jobs_;  // oldest first
  uint64_t kept_bytes_ = 0;
  uint64_t max_kept_bytes_ = 64 << 20;
};

// The job_* request handlers (agent.cc's operation table).
StatusOr<Reply> HandleJobStart(Agent* agent, uint32_t channel, protocol::JobStartRequest req);
StatusOr<Reply> HandleJobRead(Agent* agent, uint32_t channel, protocol::JobReadRequest req);
StatusOr<Reply> HandleJobKill(Agent* agent, uint32_t channel, protocol::JobKillRequest req);
StatusOr<Reply> HandleJobList(Agent* agent, uint32_t channel, protocol::JobListRequest req);

}  // namespace dsec::agent
