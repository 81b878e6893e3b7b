// SandboxFusion's /run_code API on its own listener (config sandbox_fusion_listen), so that
// verl's code rewards, SkyRL and other clients of SandboxFusion switch to DSec by changing a
// URL. The protocol (request, response, status rules, languages) is api/sandbox_fusion.h; this
// runs it:
//
//  - python without fetch_files goes to the fncall runtime sandbox_fusion_python_runtime (a
//    warm worker, a fresh forked process per call, files written into its working directory);
//  - everything else runs in a container sandbox of its own (sandbox_fusion_image, or taken
//    from the container pool sandbox_fusion_pool), deleted after the call: the files are
//    written, the compile step runs with compile_timeout, then (if it succeeded) the run step
//    with run_timeout and stdin, then fetch_files are read back.
//
// memory_limit_MB is the sandbox's (or the fncall's) memory limit. Output is captured up to
// 1 MiB per stream, as SandboxFusion does. A language whose toolchain the image lacks answers
// SandboxError naming the tool. POST /run_jupyter runs its cells one after another in the code
// interpreter's python kernel (e2b_interpreter.h) in such a sandbox: each cell's stdout, stderr,
// display data (MIME bundles) and errors, cell_timeout per cell (TimeoutError in the cell),
// total_timeout for all. Routes: POST /run_code, POST /run_jupyter, GET /v1/ping, each also under
// /TOKEN/... (see EdgeConfig::sandbox_fusion_auth); errors of the request itself are FastAPI's
// shapes ({"detail": ...}), as SandboxFusion (a FastAPI server) answers them.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/sandbox_fusion.h"
#include "backends/pools/pool.h"
#include "base/audit_log.h"
#include "base/mutex.h"
#include "edge/config.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "http/server.h"

namespace dsec::images {
class ImageStore;
}

namespace dsec::edge {

class SandboxFusion {
 public:
  struct Deps {
    const EdgeConfig* cfg = nullptr;
    Manager* manager = nullptr;
    pools::PoolSet* pools = nullptr;
    images::ImageStore* images = nullptr;
    boost::asio::thread_pool* workers = nullptr;
    Metrics* metrics = nullptr;
    AuditLog* audit = nullptr;
    std::vector<std::string> tokens;
  };
  explicit SandboxFusion(Deps d) : d_(std::move(d)) {}

  http::Preflight Check(http::HttpRequest& headers_only);
  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);

  // Runs one request in a container sandbox (blocking: a worker thread).
  // `max_output`: captured per stream (0: SandboxFusion's 1 MiB); a language without a source
  // file name gets its code on stdin only.
  api::fusion::RunCodeResult RunInSandbox(const api::fusion::RunCodeRequest& rq,
                                          const api::fusion::Language& lang,
                                          std::optional<std::string>* sandbox_error,
                                          uint64_t max_output = 0);

 private:
  // The path without the token prefix ("/run_code"), or "" when the caller is not allowed.
  std::string Route(const http::HttpRequest& req) const;
  void RunCode(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);
  void RunJupyter(http::HttpRequest&& req, std::shared_ptr<http::Responder> res);
  // Runs `run` on this worker now, or later on another when sandbox_fusion_max_concurrent
  // runs are going (429 past kMaxWaiting waiting).
  void Schedule(std::function<void()> run, const std::shared_ptr<http::Responder>& res);
  bool RunOnFncall(const api::fusion::RunCodeRequest& rq,
                   const std::shared_ptr<http::Responder>& res);

  void Done();  // a run in a sandbox ended: the next waiting one takes its place
  void Reply(const std::shared_ptr<http::Responder>& res, int status, std::string body);

  static constexpr size_t kMaxWaiting = 4096;
  Deps d_;
  Mutex mu_;
  int running_ DSEC_GUARDED_BY(mu_) = 0;  // calls in sandboxes now (sandbox_fusion_max_concurrent)
  std::deque<std::function<void()>> waiting_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::edge
