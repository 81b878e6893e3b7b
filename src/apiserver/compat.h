// The compatibility listeners on an apiserver (--e2b-listen, --sandbox-fusion-listen): the
// E2B-compatible API and SandboxFusion's /run_code and /run_jupyter for a whole cluster, served
// by relaying to the same listeners of the edges (each publishes their URLs in its node record,
// cluster/node_record.h). What the edges do with a call is theirs (edge/e2b.h,
// edge/sandbox_fusion.h); the apiserver chooses the edge:
//
//  - E2B envd and code-interpreter calls (E2b-Sandbox-Id header), and control-plane calls on
//    one sandbox (/sandboxes/<id>/..., /v2/sandboxes/<id>/connect): the node named in the id,
//    relayed byte for byte (streams included). envd's own token (X-Access-Token) is the edge's
//    to check; E2B's user (Authorization: Basic) passes through.
//  - E2B creates and SandboxFusion runs: a node chosen by power-of-two choices among the ready,
//    uncordoned nodes running that listener (by published load plus this apiserver's own
//    relays to it), relayed byte for byte.
//  - E2B lists: every node's list, merged by start time and id, paged with a cursor of each
//    node's position (nextToken); SandboxFusion's /v1/ping: answered here.
//
// Callers present a cluster token (X-API-KEY for E2B's control plane; a bearer token or the
// first path segment for SandboxFusion); the apiserver presents the node token to edges.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/thread_pool.hpp>

#include "apiserver/view.h"
#include "base/mutex.h"
#include "http/server.h"

namespace dsec::apiserver {

class CompatFront {
 public:
  enum class Protocol { kE2b, kSandboxFusion };
  struct Options {
    Protocol protocol = Protocol::kE2b;
    std::vector<std::string> tokens;  // the cluster tokens
    std::string node_token;
    ClusterView* view = nullptr;
    boost::asio::thread_pool* workers = nullptr;  // lists wait on nodes there
    int64_t call_timeout_ms = 30000;
    int64_t max_relays = 8192;
  };
  explicit CompatFront(Options o);

  http::Preflight Check(http::HttpRequest& headers_only);
  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);
  void SetServer(http::HttpServer* server) { server_ = server; }

 private:
  const char* name() const;
  const std::string& UrlOf(const NodeState& n) const;
  // The path without SandboxFusion's token prefix, or "" when the caller is not allowed.
  std::string FusionRoute(const http::HttpRequest& req) const;
  // For a call that names no sandbox: a ready node running the listener (power of two).
  std::optional<NodeState> Choose();
  void Relay(http::HttpRequest req);
  void E2bList(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res);

  Options o_;
  // A list's calls to every node at once, on threads of their own (never the workers a list
  // waits on).
  boost::asio::thread_pool fanout_{8};
  http::HttpServer* server_ = nullptr;
  std::atomic<int64_t> relays_{0};
  Mutex mu_;
  std::mt19937_64 rng_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, int64_t> inflight_ DSEC_GUARDED_BY(mu_);  // relays per node now
};

// The node a compatibility call is for, from its E2b-Sandbox-Id header or its path's sandbox
// id; "" for a call that names none (a create, a list, a SandboxFusion run). Exposed for tests.
std::string E2bSandboxOf(const http::HttpRequest& req);

}  // namespace dsec::apiserver
