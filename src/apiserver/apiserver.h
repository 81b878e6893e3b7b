// dsec-apiserver: the cluster's front door. Stateless; any number of replicas serve the public
// /v1 API over the same HTTP transport as an edge (src/http), from an in-memory view of the
// cluster kept by one etcd watch (view.h):
//
//  - POST /v1/sandboxes is placed (placement.h) and forwarded to a node; a 429, a 503 or a
//    too-small node moves it to the next candidate. With a request id, the nodes an earlier
//    attempt could have gone to are first asked (Dsec-Replay-Only) for its recorded answer, so
//    a retry through any apiserver yields the same sandbox and never a second one, without a
//    write to etcd. `count: N` is spread over nodes.
//  - Every call on an existing sandbox (/v1/sandboxes/<id>[/...]) goes to the node named in
//    its id, relayed byte for byte after the head (http/relay.h): streamed exec, WebSocket
//    attach, file and archive streams, the port proxy; nothing is buffered whole and a client
//    that goes away closes the node-side call.
//  - Lists and job operations fan out over the nodes in parallel; GET /v1/nodes shows the view;
//    POST /v1/nodes/<node>/cordon|uncordon|drain change placement.
//
// Auth: callers present the cluster token; the apiserver calls edges with the node token.
#pragma once

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "api/routes.h"
#include "apiserver/placement.h"
#include "apiserver/record_cache.h"
#include "apiserver/view.h"
#include "base/audit_log.h"
#include "base/mutex.h"
#include "cluster/etcd.h"
#include "http/server.h"

namespace dsec::apiserver {

struct ApiserverConfig {
  std::string listen = "127.0.0.1:7080";
  std::string etcd = "http://127.0.0.1:2379";
  std::string token_file;       // the cluster token(s) callers present
  std::string node_token_file;  // the token the apiserver presents to edges
  // The key of the project tokens' keyed hash (the same file on every apiserver of the
  // cluster; at least 32 characters on its first line). "" = derived from the node token
  // (then rotating the node token invalidates every project token).
  std::string token_hash_key_file;
  std::string log_level = "info";
  int io_threads = 2;
  int workers = 64;  // threads for calls that wait on nodes (creates, lists, jobs)
  PlacementOptions placement;
  int64_t create_timeout_ms = 300000;  // a create may wait for a microVM to boot
  int64_t call_timeout_ms = 30000;     // lists, jobs, probes
  // How long project tokens are still taken while the view is out of step with etcd (a revoke
  // elsewhere could be missed beyond that); the cluster tokens are always taken.
  int64_t access_stale_ms = 30000;
  uint64_t max_json_body_bytes = 1 << 20;
  // Calls on sandboxes being relayed at once (each holds two sockets and two pipes); more are
  // refused with 429 before their bodies are read.
  int64_t max_relays = 8192;
  // Sandbox records kept to show while their node is unavailable (record_cache.h).
  int64_t record_cache = 100000;
  // Host-based port URLs ("<port>-<id>.<port_domain>", the edges' port_domain): relayed to the
  // sandbox's node with their Host, as signed /v1/p/ URLs are ("" = off).
  std::string port_domain;
  // The access log (base/audit_log.h): one JSON line per change a caller asks for (any method
  // but GET/HEAD, and attach): who (token name, project, role), what, which sandbox. Off when
  // empty; rotated at audit_max_bytes, keeping audit_keep old files.
  std::string audit_log;
  uint64_t audit_max_bytes = 64ull << 20;
  int audit_keep = 5;
  // The compatibility listeners (compat.h), relayed to the edges' own: off when empty.
  std::string e2b_listen;
  std::string sandbox_fusion_listen;
};

class Apiserver {
 public:
  Apiserver(ApiserverConfig cfg, std::vector<std::string> tokens, std::string node_token,
            etcd::Client* etcd, ClusterView* view, AccessView* access, Quotas* quotas,
            AuditLog* audit = nullptr);

  http::Preflight Check(http::HttpRequest& headers_only);
  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);
  // The server it answers on: relays run on its I/O threads, and a client's connection goes
  // back to it after a relayed exchange (keep-alive).
  void SetServer(http::HttpServer* server) { server_ = server; }
  void Shutdown();

 private:
  void Relay(http::HttpRequest req);
  // The caller showed one of the cluster tokens.
  bool CallerIsCluster(const http::HttpRequest& req) const;
  // Whether the record kept of `id` (if any) is of the caller's project: only then may what
  // the caller did or saw (a delete, a 404) drop it.
  bool KeptIsCallers(const http::HttpRequest& req, const std::string& id);
  // One access-log line for a request that changes something (nothing for reads).
  void Audit(const http::HttpRequest& req, const std::string& sandbox) const;
  // Who calls (a cluster token: admin of default; a project token), or nullopt.
  std::optional<Principal> Caller(const http::HttpRequest& req) const;
  // The project a request acts in: the caller's, or for an admin the one it names in
  // Dsec-Project (default: "default"); "" for an admin's call on one sandbox without a name
  // (any project). 403/404 when the caller may not act there.
  StatusOr<std::string> ProjectOf(const http::HttpRequest& req, bool on_one_sandbox) const;
  // Projects and tokens (access.h), admins only but for a caller's own project's listing.
  void Projects(const http::HttpRequest& req, api::RouteId id,
                const std::map<std::string, std::string>& params,
                const std::shared_ptr<http::Responder>& res);
  // A level's quota (quota.h): GET for the admin or the project's own tokens, PATCH admins.
  void Quota(const http::HttpRequest& req, api::RouteId id,
             const std::map<std::string, std::string>& params,
             const std::shared_ptr<http::Responder>& res);
  void Create(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);
  void FnCall(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);
  // `counted`: a create of sandboxes, admitted under the caller's quota chain (quota.h); an
  // fncall is not (its workers are the node's pools').
  void PlaceAndForward(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res,
                       api::CreateShape shape, bool counted);
  // Who a counted create is for: the project it acts in and the caller's token name.
  struct QuotaCaller {
    std::string project, owner;
  };
  // One create (`count` sandboxes) sent to node `n`: admitted under `q`'s quotas first (a
  // refusal is answered as the node would, 429 quota_exceeded), settled by the answer. A node
  // that finds the create takes more than the room (a pool's sizes, say) says what it needs:
  // admitted again for that, once.
  StatusOr<http::ClientResponse> SendCreate(const NodeState& n, const std::string& target,
                                            const http::Headers& headers, const std::string& body,
                                            const api::CreateShape& shape, int64_t count,
                                            const QuotaCaller* q);
  void List(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);
  void GetSandbox(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);
  // Why a record of `node`'s is shown with state "unavailable".
  std::string UnavailableWhy(const std::string& node) const;
  // A node's create answer: its records are kept, then it goes to the client.
  void PassOnCreate(const std::shared_ptr<http::Responder>& res, const http::ClientResponse& r,
                    const std::string& node);
  void Jobs(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);
  // The trajectory log's routes (and a create that resumes one): a trajectory lives on the node
  // that recorded it, found by asking every node; its calls, and the resumed sandbox, go there.
  void TrajectoryCall(const http::HttpRequest& req, api::RouteId id, const std::string& tid,
                      const std::shared_ptr<http::Responder>& res);
  // The node keeping trajectory `tid` of the caller's project (the most recently used one when
  // several do: ids are unique per node) and its GET answer; NotFound, or Unavailable when a
  // node that may keep it did not answer.
  StatusOr<std::pair<NodeState, http::ClientResponse>> FindTrajectory(const http::HttpRequest& req,
                                                                      const std::string& tid,
                                                                      const std::string& target);
  // The cluster's images (cluster/image_record.h): listed and shown from the view, deleted in
  // etcd (every node drops its copy); an import is relayed to the node ImportNode picks, which
  // publishes it.
  void Images(const http::HttpRequest& req, api::RouteId id, const std::string& name,
              const std::shared_ptr<http::Responder>& res);
  // Image builds: a new one goes where an import would (ImportNode); the others to the node
  // named in the build's id ("bld-<node>-<hex>"); the list is merged from every node's.
  void BuildCall(const http::HttpRequest& req, api::RouteId id, const std::string& build,
                 const std::shared_ptr<http::Responder>& res);
  // Where an import goes: the node an admin names (?node=), else the least loaded ready one.
  StatusOr<NodeState> ImportNode(const http::HttpRequest& req) const;
  void Nodes(const std::shared_ptr<http::Responder>& res);
  void GetNode(const std::string& node, const std::shared_ptr<http::Responder>& res);
  void ClusterAsNode(const std::shared_ptr<http::Responder>& res);
  void NodeAction(const http::HttpRequest& req, const std::string& node, const std::string& action,
                  const std::shared_ptr<http::Responder>& res);

  http::Headers NodeHeaders(const http::HttpRequest& req) const;
  // Runs `fn` on the fan-out threads (calls to several nodes at once; they never wait on each
  // other, so a worker waiting for them cannot starve them).
  template <class F>
  auto Fanout(F fn) -> std::future<decltype(fn())> {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto f = task->get_future();
    boost::asio::post(fanout_, [task] { (*task)(); });
    return f;
  }

  ApiserverConfig cfg_;
  std::vector<std::string> tokens_;
  std::string node_token_;
  etcd::Client* etcd_;
  ClusterView* view_;
  AccessView* access_;
  Quotas* quotas_;
  AuditLog* audit_;
  http::HttpServer* server_ = nullptr;
  std::atomic<int64_t> relays_{0};
  // What a project token has open (relays: exec streams, attach, port proxy...), by
  // "project/name", as duplicates of the clients' sockets: a revoke shuts them down.
  Mutex open_mu_;
  uint64_t next_open_ DSEC_GUARDED_BY(open_mu_) = 0;
  std::map<std::string, std::map<uint64_t, UniqueFd>> open_ DSEC_GUARDED_BY(open_mu_);
  void CutRelaysOf(const std::string& project, const std::string& name);
  // When each open relay's token expires (0: never), by "project/name".
  std::map<std::string, int64_t> open_expiry_ DSEC_GUARDED_BY(open_mu_);

 public:
  // Closes what expired tokens have open (main calls it every second).
  void CutExpiredRelays(int64_t now_ms);

 private:
  RecordCache records_;
  boost::asio::thread_pool workers_;
  boost::asio::thread_pool fanout_;
};

// The node named in a sandbox id ("sb-<node>-<12 random>"); "" if the id has no such shape.
std::string NodeOfSandbox(std::string_view id);

// A query value, percent-encoded.
std::string PercentEncode(std::string_view s);
// A list cursor over nodes: where each node's listing stopped ("~": it has no more).
std::string EncodeCursor(const std::map<std::string, std::string>& at);
StatusOr<std::map<std::string, std::string>> DecodeCursor(const std::string& text);
// After a page merged from several nodes' pages: `page` holds the node and the node's own
// cursor key of each item kept, in order; `returned` each node's (items it gave, whether it
// has more). Moves each node's place in `at` ("~": listed to its end); true if any has more.
bool AdvanceListCursor(const std::vector<std::pair<std::string, std::string>>& page,
                       const std::map<std::string, std::pair<size_t, bool>>& returned,
                       std::map<std::string, std::string>* at);

}  // namespace dsec::apiserver
