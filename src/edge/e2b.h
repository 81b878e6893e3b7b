// An E2B-compatible listener (config e2b_listen, off by default): teams with E2B's SDKs switch
// by setting E2B_API_URL and E2B_SANDBOX_URL to it (and E2B_API_KEY to a DSec token). One
// plain HTTP/1.1 listener serves both E2B's control plane (POST /v2/sandboxes, GET
// /v2/sandboxes, GET/DELETE /sandboxes/{id}, .../timeout, .../pause, /v2/.../connect) and
// envd, the in-sandbox API, for the sandbox named by the E2b-Sandbox-Id header: the
// process.Process and filesystem.Filesystem Connect RPCs (JSON codec) and REST /files and
// /health. Wire details: docs/e2b-protocol.md; the protocol's data: api/e2b.h.
//
// An E2B sandbox is a DSec container sandbox (same id, same limits and lifecycle): templates
// map to images ("base" and "code-interpreter-v1" to "host", any other name to that image),
// `timeout` is its ttl_s, `metadata` its labels (so label rules apply to keys), `envVars` its
// env. E2B's user "user" is the sandbox user, with /home/user its home and working directory;
// "root" is root. envdAccessToken is a keyed hash of the sandbox id under the edge's first
// token: nothing to store, the same after an edge restart, and useless for another sandbox.
// Port 49999 of a sandbox is E2B's code interpreter (e2b_interpreter.h).
// Processes are the sandbox's execs (the audit log and the per-sandbox exec cap apply); they
// live on when the client's stream goes, until they exit or are killed, and can be reattached
// (Connect) by pid.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/e2b.h"
#include "base/audit_log.h"
#include "base/mutex.h"
#include "edge/config.h"
#include "edge/e2b_interpreter.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "edge/sandbox_slots.h"
#include "http/server.h"

namespace dsec::edge {

class E2b {
 public:
  struct Deps {
    const EdgeConfig* cfg = nullptr;
    Manager* manager = nullptr;
    boost::asio::thread_pool* workers = nullptr;
    boost::asio::io_context* timers = nullptr;  // keepalives of process streams
    Metrics* metrics = nullptr;
    AuditLog* audit = nullptr;
    std::vector<std::string> tokens;
  };
  explicit E2b(Deps d);
  ~E2b();

  http::Preflight Check(http::HttpRequest& headers_only);
  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);

  // The envdAccessToken of a sandbox: HMAC-SHA256 of its id under a key derived from the
  // edge's first token.
  std::string AccessToken(const std::string& sandbox_id) const;
  // Its trafficAccessToken (another keyed hash of the id): what the code interpreter's SDK
  // sends on every port-49999 call (its /contexts calls carry no envd token).
  std::string TrafficToken(const std::string& sandbox_id) const;

  struct Process;   // a running command (e2b.cc)
  struct Watch;     // a WatchDir stream
  struct Watches;   // the open ones, for keepalives and deadlines
  struct Registry;  // the running commands, shared with them (they may outlive the listener)

 private:
  using Res = std::shared_ptr<http::Responder>;
  void ControlPlane(http::HttpRequest& req, const Res& res);
  void Envd(http::HttpRequest& req, const Res& res);
  void Create(const http::HttpRequest& req, const Res& res);
  void List(const http::HttpRequest& req, const Res& res);
  Json SandboxJson(const SandboxRecord& r, bool detail) const;

  void Rpc(const std::string& method, http::HttpRequest& req,
           const std::shared_ptr<SandboxEntry>& e, const Res& res);
  void Start(const api::e2b::StartRequest& sr, const http::HttpRequest& req,
             const std::shared_ptr<SandboxEntry>& e, const Res& res);
  void Files(http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e, const Res& res);
  void StreamFail(const http::HttpRequest& req, const Res& res, const Status& s);
  void WatchDir(const Json& j, const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
                const Res& res);

  Deps d_;
  std::string token_key_;  // the access tokens' HMAC key
  std::shared_ptr<Registry> reg_;
  // envd requests in progress per sandbox (each takes a worker and may wait on its agent): at
  // most max_workers_per_sandbox, as for the REST API.
  SandboxSlots slots_;
  CodeInterpreter interpreter_;  // port 49999
  std::shared_ptr<Watches> watches_;
  // Keepalive events on every process stream, every few seconds (undici drops a response
  // body silent for 300 s).
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread keepalive_;
};

}  // namespace dsec::edge
