// E2B's code interpreter (`@e2b/code-interpreter`'s runCode and contexts), served on the E2B
// listener for calls with `E2b-Sandbox-Port: 49999`: POST /execute streams NDJSON lines
// (number_of_executions, stdout, stderr, result, error, keepalive, end_of_execution), and
// /contexts creates, lists, restarts and removes contexts. Wire details:
// docs/e2b-protocol.md section 7.
//
// A context is a kernel: a persistent `python3` process inside the sandbox (kE2bKernelSource,
// standard library only, no Jupyter), run as one of the sandbox's execs (audited, under the
// per-sandbox exec cap, in the sandbox's cgroup) as the sandbox's user. Its variables live
// from one execution to the next; executions on one context run one at a time, in order.
// The default python context is made by the first /execute that names none. A client that
// goes away mid-execution interrupts it (SIGINT to the kernel's process group, as Jupyter
// does); a kernel that has not finished 5 s later is killed, and the context starts a fresh
// kernel on its next use. A kernel that exits ends its execution with a DeadKernelError.
//
// What a kernel writes is untrusted (user code runs in it and can write to the protocol's
// descriptor): the edge forwards only whole lines that are JSON objects with a string "type",
// at most kMaxLine bytes each, and holds at most one partial line per kernel (kMaxHeldLines
// for all of them together).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "base/audit_log.h"
#include "base/mutex.h"
#include "edge/config.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "http/server.h"

namespace dsec::edge {

extern const char kE2bKernelBoot[];
extern const char kE2bKernelSource[];

class CodeInterpreter {
 public:
  static constexpr size_t kMaxContexts = 8;      // per sandbox, the default one included
  static constexpr size_t kMaxQueued = 16;       // executions waiting on one context
  static constexpr size_t kMaxLine = 16u << 20;  // one NDJSON line from a kernel
  // What all kernels' unfinished lines may hold in the edge at once (a sandbox's kernels could
  // otherwise hold kMaxContexts x kMaxLine each).
  static constexpr uint64_t kMaxHeldLines = 256u << 20;
  static constexpr int64_t kInterruptGraceMs = 5000;
  static constexpr int64_t kKeepaliveMs = 5000;  // of silence, as E2B's server

  struct Deps {
    const EdgeConfig* cfg = nullptr;
    Metrics* metrics = nullptr;
    AuditLog* audit = nullptr;
  };
  explicit CodeInterpreter(Deps d);

  // A call on port 49999 of a running sandbox (the listener checked its token).
  void Handle(const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
              const std::shared_ptr<http::Responder>& res);
  // About once a second: keepalive lines on quiet executions, and kernels that ignored an
  // interrupt killed.
  void Tick();

  struct Run;       // one execution (e2b_interpreter.cc)
  struct Kernel;    // one context's kernel
  struct Registry;  // the kernels by sandbox and context, shared with them (weakly)

 private:
  using Res = std::shared_ptr<http::Responder>;
  void Execute(const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
               const Res& res);
  void CreateContext(const http::HttpRequest& req, const std::shared_ptr<SandboxEntry>& e,
                     const Res& res);
  // A kernel for context `id` of the sandbox, started now.
  StatusOr<std::shared_ptr<Kernel>> StartKernel(const http::HttpRequest& req,
                                                const std::shared_ptr<SandboxEntry>& e,
                                                const std::string& id, const std::string& cwd);
  void Send(const http::HttpRequest& req, const Res& res, int status, std::string text,
            const char* content_type = "text/plain");

  Deps d_;
  std::shared_ptr<Registry> reg_;
};

}  // namespace dsec::edge
