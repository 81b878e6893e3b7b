// The trajectory log's routes (edge/trajectory.h): a job's preemption, and the trajectories
// of the caller's project (GET, resume, DELETE).
#include <boost/asio/post.hpp>

#include "api/trajectory_json.h"
#include "edge/api.h"
#include "edge/trajectory.h"

namespace dsec::edge {

namespace {

// The caller's project: the one an apiserver names, else "default" (a lone edge's).
std::string ProjectOf(const Ctx& c) {
  std::string p = c.req.Header("dsec-project");
  return p.empty() ? "default" : p;
}

// 409 on an edge without a trajectory log, else `fn`'s answer.
template <typename Fn>
void WithLog(const std::shared_ptr<Ctx>& c, Fn&& fn) {
  Trajectories* t = c->api->deps().trajectories;
  if (!t) return c->Fail(FailedPrecondition("this edge keeps no trajectory log"));
  fn(t);
}

void PreemptJob(const std::shared_ptr<Ctx>& c) {
  WithLog(c, [&](Trajectories* t) {
    auto others = api::ParsePreemptRequest(c->req.body);
    if (!others.ok()) return c->Fail(others.status());
    const std::string& job = c->params["job"];
    if (job.empty() || job.size() > 256) return c->Fail(400, "bad_request", "bad job name");
    std::string project = c->req.Header("dsec-project");
    auto r = t->Preempt(job, project, *others);
    if (!r.ok()) return c->Fail(r.status());
    c->Reply(200, *r);
  });
}

void ListTrajectories(const std::shared_ptr<Ctx>& c) {
  WithLog(c, [&](Trajectories* t) {
    auto r = t->List(ProjectOf(*c));
    if (!r.ok()) return c->Fail(r.status());
    c->Reply(200, *r);
  });
}

void GetTrajectory(const std::shared_ptr<Ctx>& c) {
  WithLog(c, [&](Trajectories* t) {
    const std::string& id = c->params["tid"];
    if (Status s = ValidateId("trajectory id", id); !s.ok()) return c->Fail(s);
    std::optional<int64_t> branch;
    if (c->req.Query("branch")) {
      auto b = c->IntQuery("branch", 0, 0, 1 << 20);
      if (!b.ok()) return c->Fail(b.status());
      branch = *b;
    }
    auto from = c->IntQuery("from", 1, 1, INT64_MAX / 2);
    if (!from.ok()) return c->Fail(from.status());
    auto limit = c->IntQuery("limit", 1000, 1, 10000);
    if (!limit.ok()) return c->Fail(limit.status());
    auto r = t->Describe(ProjectOf(*c), id, branch, *from, *limit);
    if (!r.ok()) return c->Fail(r.status());
    c->Reply(200, *r);
  });
}

void ResumeTrajectory(const std::shared_ptr<Ctx>& c) {
  WithLog(c, [&](Trajectories*) {
    const std::string& id = c->params["tid"];
    if (Status s = ValidateId("trajectory id", id); !s.ok()) return c->Fail(s);
    auto body = api::ResumeAsCreateBody(c->req.body, id);
    if (!body.ok()) return c->Fail(body.status());
    // A create of the resumed sandbox: the same checks and answer.
    c->req.body = std::move(*body);
    c->api->HandlerOf(api::RouteId::kCreateSandbox)(c);
  });
}

void DeleteTrajectory(const std::shared_ptr<Ctx>& c) {
  WithLog(c, [&](Trajectories* t) {
    const std::string& id = c->params["tid"];
    if (Status s = ValidateId("trajectory id", id); !s.ok()) return c->Fail(s);
    if (Status s = t->Delete(ProjectOf(*c), id); !s.ok()) return c->Fail(s);
    c->NoContent();
  });
}

}  // namespace

void RegisterTrajectoryRoutes(Api* a) {
  using api::RouteId;
  a->Bind(RouteId::kPreemptJob, PreemptJob);
  a->Bind(RouteId::kListTrajectories, ListTrajectories);
  a->Bind(RouteId::kGetTrajectory, GetTrajectory);
  a->Bind(RouteId::kResumeTrajectory, ResumeTrajectory);
  a->Bind(RouteId::kDeleteTrajectory, DeleteTrajectory);
}

}  // namespace dsec::edge
