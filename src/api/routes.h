// The routes of the /v1 API as one table, shared by the edge (which binds a handler to each)
// and the apiserver (which answers cluster-wide routes itself, relays the routes of one sandbox
// to its node, and refuses a node's own routes). Matching is the same for both: the raw path is
// split on '/', then each segment is percent-decoded ("a%2Fb" stays one segment, an invalid id).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dsec::api {

enum class RouteId : uint8_t {
  // Sandboxes, jobs, the node (api_sandboxes.cc on the edge).
  kCreateSandbox,
  kListSandboxes,
  kGetSandbox,
  kPatchSandbox,
  kDeleteSandbox,
  kStats,
  kPause,
  kResume,
  kPauseJob,
  kResumeJob,
  kDeleteJob,
  kHealth,
  kNode,
  kNodes,
  kGetNode,
  kCordonNode,
  kUncordonNode,
  kDrainNode,
  // Projects and tokens (cluster step 2; apiservers only).
  kListProjects,
  kCreateProject,
  kGetProject,
  kDeleteProject,
  kListTokens,
  kCreateToken,
  kDeleteToken,
  // Quotas at each level: /v1/quota (org), .../projects/{p}/quota, .../tokens/{name}/quota.
  kGetOrgQuota,
  kSetOrgQuota,
  kGetProjectQuota,
  kSetProjectQuota,
  kReplaceProjectQuota,
  kGetTokenQuota,
  kSetTokenQuota,
  kMetrics,
  // Execs, shells, attach.
  kExec,
  kListExecs,
  kGetExec,
  kKillExec,
  kDeleteExec,
  kSignal,
  kOpenShell,
  kListShells,
  kRunShell,
  kCloseShell,
  kAttach,
  // Files and archives.
  kPutFile,
  kGetFile,
  kDeleteFile,
  kListFiles,
  kStatFile,
  kMakeDir,
  kPutArchive,
  kGetArchive,
  // Fncalls and pools.
  kFnCall,
  kListPools,
  kGetPool,
  kPutPool,
  kDeletePool,
  // Images, builds, snapshots, forks.
  kStartBuild,
  kListBuilds,
  kGetBuild,
  kBuildLog,
  kCancelBuild,
  kListImages,
  kGetImage,
  kDeleteImage,
  kImportImage,
  kSnapshot,
  kFork,
  kPortUrl,
  // The trajectory log (edge/trajectory.h).
  kPreemptJob,
  kListTrajectories,
  kGetTrajectory,
  kResumeTrajectory,
  kDeleteTrajectory,
  kCount,  // (the number of routes)
};

// Who answers a route in a cluster.
enum class Scope : uint8_t {
  kSandbox,    // a call on one existing sandbox: the node named in its id
  kCluster,    // the API as a whole: an apiserver (fanned out or placed), or the lone edge
  kLocal,      // one node's own state (images, pools, builds, metrics): the edge only, for now
  kApiserver,  // the cluster's own (/v1/nodes, /v1/projects): apiservers only; no edge route
};

enum RouteFlags : unsigned {
  kUpload = 1,      // raw body up to the sandbox's disk (and max_upload_bytes)
  kOnIoThread = 2,  // cheap and never blocks: answered without a worker
  kImport = 4,      // raw body up to max_import_bytes (image archives)
};

struct RouteSpec {
  const char* method;
  const char* pattern;  // "/v1/sandboxes/:id/exec": a literal or ":name" per segment
  RouteId id;
  Scope scope;
  unsigned flags = 0;
  std::vector<std::string> segments;  // the pattern split

  bool upload() const { return (flags & kUpload) != 0; }
  bool import() const { return (flags & kImport) != 0; }
  bool on_io_thread() const { return (flags & kOnIoThread) != 0; }
};

// Every route, in RouteId order (Routes()[static_cast<size_t>(id)].id == id).
const std::vector<RouteSpec>& Routes();
const RouteSpec& RouteOf(RouteId id);

struct RouteMatch {
  const RouteSpec* route = nullptr;           // the route for this method and path, if any
  bool path_known = false;                    // some method has a route for this path
  bool bad_encoding = false;                  // a segment's percent-encoding is malformed
  std::set<std::string> allowed;              // the methods that have a route for this path
  std::map<std::string, std::string> params;  // decoded, from the route's ":name" segments
};

enum class Server : uint8_t { kEdge, kApiserver };

// The route for a method and a raw target (origin-form, query ignored) on `server` (an edge
// knows no kApiserver route). The most literal pattern wins ("/v1/images/builds/:id" over
// "/v1/images/:name").
RouteMatch MatchRoute(std::string_view method, std::string_view target, Server server);

// The port proxy's target "/v1/sandboxes/{id}/ports/{port}[/rest][?query]": false when the
// target is not one; otherwise the raw id and port text, and the target the server in the
// sandbox gets ("/" + rest + query). The id and port are checked by whoever serves it.
bool ParsePortTarget(std::string_view target, std::string* id, std::string* port,
                     std::string* upstream);

// A signed port URL's target "/v1/p/{id}.{port}.{expires}.{mac}[/rest][?query]" (POST
// /v1/sandboxes/{id}/port-urls makes them; they need no bearer token): false when the target is
// not one. `prefix` is "/v1/p/{token}"; `upstream` as ParsePortTarget's. Nothing is verified.
struct SignedPortTarget {
  std::string id, port, expires, mac, prefix, upstream;
};
bool ParseSignedPortTarget(std::string_view target, SignedPortTarget* out);

// "Allow" header value for a 405: the methods, comma-separated.
std::string AllowHeader(const std::set<std::string>& methods);

}  // namespace dsec::api
