#include "api/routes.h"

#include <cstdlib>

#include "base/strings.h"
#include "http/server.h"

namespace dsec::api {
namespace {

using enum RouteId;
using enum Scope;

std::vector<RouteSpec> Table() {
  std::vector<RouteSpec> t = {
      {"POST", "/v1/sandboxes", kCreateSandbox, kCluster},
      {"GET", "/v1/sandboxes", kListSandboxes, kCluster},
      {"GET", "/v1/sandboxes/:id", kGetSandbox, kSandbox},
      {"PATCH", "/v1/sandboxes/:id", kPatchSandbox, kSandbox},
      {"DELETE", "/v1/sandboxes/:id", kDeleteSandbox, kSandbox},
      {"GET", "/v1/sandboxes/:id/stats", kStats, kSandbox},
      {"POST", "/v1/sandboxes/:id/pause", kPause, kSandbox},
      {"POST", "/v1/sandboxes/:id/resume", kResume, kSandbox},
      {"POST", "/v1/jobs/:job/pause", kPauseJob, kCluster},
      {"POST", "/v1/jobs/:job/resume", kResumeJob, kCluster},
      {"DELETE", "/v1/jobs/:job", kDeleteJob, kCluster},
      // On the IO thread: health must stay truthful while every worker is busy.
      {"GET", "/v1/health", kHealth, kCluster, kOnIoThread},
      {"GET", "/v1/node", kNode, kCluster},
      {"GET", "/v1/nodes", kNodes, kApiserver},
      {"GET", "/v1/nodes/:node", kGetNode, kApiserver},
      {"POST", "/v1/nodes/:node/cordon", kCordonNode, kApiserver},
      {"POST", "/v1/nodes/:node/uncordon", kUncordonNode, kApiserver},
      {"POST", "/v1/nodes/:node/drain", kDrainNode, kApiserver},
      {"GET", "/v1/projects", kListProjects, kApiserver},
      {"POST", "/v1/projects", kCreateProject, kApiserver},
      {"GET", "/v1/projects/:project", kGetProject, kApiserver},
      {"DELETE", "/v1/projects/:project", kDeleteProject, kApiserver},
      {"GET", "/v1/projects/:project/tokens", kListTokens, kApiserver},
      {"POST", "/v1/projects/:project/tokens", kCreateToken, kApiserver},
      {"DELETE", "/v1/projects/:project/tokens/:name", kDeleteToken, kApiserver},
      {"GET", "/v1/quota", kGetOrgQuota, kApiserver},
      {"PATCH", "/v1/quota", kSetOrgQuota, kApiserver},
      {"GET", "/v1/projects/:project/quota", kGetProjectQuota, kApiserver},
      {"PATCH", "/v1/projects/:project/quota", kSetProjectQuota, kApiserver},
      {"PUT", "/v1/projects/:project/quota", kReplaceProjectQuota, kApiserver},
      {"GET", "/v1/projects/:project/tokens/:name/quota", kGetTokenQuota, kApiserver},
      {"PATCH", "/v1/projects/:project/tokens/:name/quota", kSetTokenQuota, kApiserver},
      {"GET", "/metrics", kMetrics, kLocal},

      {"POST", "/v1/sandboxes/:id/exec", kExec, kSandbox},
      {"GET", "/v1/sandboxes/:id/execs", kListExecs, kSandbox},
      {"GET", "/v1/sandboxes/:id/execs/:eid", kGetExec, kSandbox},
      {"POST", "/v1/sandboxes/:id/execs/:eid/kill", kKillExec, kSandbox},
      {"DELETE", "/v1/sandboxes/:id/execs/:eid", kDeleteExec, kSandbox},
      {"POST", "/v1/sandboxes/:id/signal", kSignal, kSandbox},
      {"POST", "/v1/sandboxes/:id/shells", kOpenShell, kSandbox},
      {"GET", "/v1/sandboxes/:id/shells", kListShells, kSandbox},
      {"POST", "/v1/sandboxes/:id/shells/:sid/run", kRunShell, kSandbox},
      {"DELETE", "/v1/sandboxes/:id/shells/:sid", kCloseShell, kSandbox},
      {"GET", "/v1/sandboxes/:id/attach", kAttach, kSandbox},

      {"PUT", "/v1/sandboxes/:id/files", kPutFile, kSandbox, kUpload},
      {"GET", "/v1/sandboxes/:id/files", kGetFile, kSandbox},
      {"DELETE", "/v1/sandboxes/:id/files", kDeleteFile, kSandbox},
      {"GET", "/v1/sandboxes/:id/files/list", kListFiles, kSandbox},
      {"GET", "/v1/sandboxes/:id/files/stat", kStatFile, kSandbox},
      {"POST", "/v1/sandboxes/:id/files/mkdir", kMakeDir, kSandbox},
      {"PUT", "/v1/sandboxes/:id/archive", kPutArchive, kSandbox, kUpload},
      {"GET", "/v1/sandboxes/:id/archive", kGetArchive, kSandbox},

      {"POST", "/v1/fncalls", kFnCall, kCluster, kOnIoThread},
      {"GET", "/v1/pools", kListPools, kLocal, kOnIoThread},
      {"GET", "/v1/pools/:name", kGetPool, kLocal, kOnIoThread},
      {"PUT", "/v1/pools/:name", kPutPool, kLocal},
      {"DELETE", "/v1/pools/:name", kDeletePool, kLocal},

      {"POST", "/v1/images/build", kStartBuild, kCluster},
      {"GET", "/v1/images/builds", kListBuilds, kCluster},
      {"GET", "/v1/images/builds/:id", kGetBuild, kCluster},
      {"GET", "/v1/images/builds/:id/log", kBuildLog, kCluster},
      {"DELETE", "/v1/images/builds/:id", kCancelBuild, kCluster},
      {"GET", "/v1/images", kListImages, kCluster},
      {"GET", "/v1/images/:name", kGetImage, kCluster},
      {"DELETE", "/v1/images/:name", kDeleteImage, kCluster},
      {"POST", "/v1/images/import", kImportImage, kCluster, kImport},
      {"POST", "/v1/sandboxes/:id/snapshot", kSnapshot, kSandbox},
      {"POST", "/v1/sandboxes/:id/fork", kFork, kSandbox},
      {"POST", "/v1/sandboxes/:id/port-urls", kPortUrl, kSandbox},
      {"POST", "/v1/jobs/:job/preempt", kPreemptJob, kCluster},
      // (An apiserver finds the node that keeps the trajectory and passes the call to it.)
      {"GET", "/v1/trajectories", kListTrajectories, kCluster},
      {"GET", "/v1/trajectories/:tid", kGetTrajectory, kCluster},
      {"POST", "/v1/trajectories/:tid/resume", kResumeTrajectory, kCluster},
      {"DELETE", "/v1/trajectories/:tid", kDeleteTrajectory, kCluster},
  };
  for (size_t i = 0; i < t.size(); ++i) {
    // The table is in RouteId order, one entry per id: RouteOf indexes it.
    if (static_cast<size_t>(t[i].id) != i) std::abort();
    for (auto s : SplitString(t[i].pattern, '/', true)) t[i].segments.emplace_back(s);
  }
  if (t.size() != static_cast<size_t>(RouteId::kCount)) std::abort();
  return t;
}

}  // namespace

const std::vector<RouteSpec>& Routes() {
  static const std::vector<RouteSpec> table = Table();
  return table;
}

const RouteSpec& RouteOf(RouteId id) { return Routes()[static_cast<size_t>(id)]; }

RouteMatch MatchRoute(std::string_view method, std::string_view target, Server server) {
  RouteMatch m;
  std::string_view raw = target.substr(0, target.find('?'));
  std::vector<std::string> segs;
  for (auto s : SplitString(raw, '/', true)) {
    std::string d;
    if (!http::PercentDecode(s, false, &d)) {
      m.bad_encoding = true;
      return m;
    }
    segs.push_back(std::move(d));
  }
  int best_literals = -1;
  for (const auto& r : Routes()) {
    if (r.segments.size() != segs.size()) continue;
    if (server == Server::kEdge && r.scope == Scope::kApiserver) continue;
    int literals = 0;
    bool ok = true;
    for (size_t i = 0; i < segs.size() && ok; ++i) {
      if (r.segments[i][0] == ':') continue;
      ok = r.segments[i] == segs[i];
      ++literals;
    }
    if (!ok) continue;
    m.path_known = true;
    m.allowed.insert(r.method);
    if (r.method != method || literals <= best_literals) continue;
    m.route = &r;
    best_literals = literals;
  }
  if (m.route) {
    for (size_t i = 0; i < segs.size(); ++i)
      if (m.route->segments[i][0] == ':') m.params[m.route->segments[i].substr(1)] = segs[i];
  }
  return m;
}

bool ParsePortTarget(std::string_view target, std::string* id, std::string* port,
                     std::string* upstream) {
  constexpr std::string_view kPrefix = "/v1/sandboxes/";
  if (!StartsWith(target, kPrefix)) return false;
  size_t id_end = target.find('/', kPrefix.size());
  if (id_end == std::string_view::npos || target.substr(id_end, 7) != "/ports/") return false;
  size_t port_start = id_end + 7;
  size_t port_end = target.find_first_of("/?", port_start);
  if (port_end == std::string_view::npos) port_end = target.size();
  *id = std::string(target.substr(kPrefix.size(), id_end - kPrefix.size()));
  *port = std::string(target.substr(port_start, port_end - port_start));
  std::string rest(target.substr(port_end));
  *upstream = rest.empty() || rest[0] != '/' ? "/" + rest : rest;
  return true;
}

bool ParseSignedPortTarget(std::string_view target, SignedPortTarget* out) {
  constexpr std::string_view kPrefix = "/v1/p/";
  if (!StartsWith(target, kPrefix)) return false;
  size_t end = target.find_first_of("/?", kPrefix.size());
  if (end == std::string_view::npos) end = target.size();
  std::string_view token = target.substr(kPrefix.size(), end - kPrefix.size());
  // From the right: the id may hold anything but the three fields after it.
  size_t c = token.rfind('.');
  size_t b =
      c == std::string_view::npos || c == 0 ? std::string_view::npos : token.rfind('.', c - 1);
  size_t a =
      b == std::string_view::npos || b == 0 ? std::string_view::npos : token.rfind('.', b - 1);
  if (a == std::string_view::npos || a == 0) return false;
  out->id = std::string(token.substr(0, a));
  out->port = std::string(token.substr(a + 1, b - a - 1));
  out->expires = std::string(token.substr(b + 1, c - b - 1));
  out->mac = std::string(token.substr(c + 1));
  out->prefix = std::string(target.substr(0, end));
  std::string rest(target.substr(end));
  out->upstream = rest.empty() || rest[0] != '/' ? "/" + rest : rest;
  return true;
}

std::string AllowHeader(const std::set<std::string>& methods) {
  std::string allow;
  for (const auto& m : methods) allow += (allow.empty() ? "" : ", ") + m;
  return allow;
}

}  // namespace dsec::api
