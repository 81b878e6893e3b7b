// One command in a sandbox: it holds one of the sandbox's concurrent-exec slots and its
// audit record (a line when it starts, one when it ends). Finish — with the command's exit, or
// why it never ran — writes the end line and gives the slot back, exactly once; a ticket
// dropped unfinished finishes itself, so no path (a failed start, a WebSocket upgrade that
// never completed) can keep a slot. Shared by the REST exec routes and the E2B listener.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/audit_log.h"
#include "base/ids.h"
#include "base/json.h"
#include "edge/api.h"
#include "edge/manager.h"
#include "edge/metrics.h"

namespace dsec::edge {

class ExecTicket {
 public:
  // OverCapacity when the sandbox already runs max_execs commands.
  static StatusOr<std::shared_ptr<ExecTicket>> Take(
      int max_execs, AuditLog* audit, Metrics* metrics, std::shared_ptr<SandboxEntry> e,
      const char* kind, Json command, const std::string& user, const std::string& cwd,
      const std::string& principal, const std::string& remote) {
    if (e->active_execs.fetch_add(1) >= max_execs) {
      e->active_execs--;
      metrics->CountReject("execs_per_sandbox");
      return OverCapacity("sandbox " + e->id + " already runs " + std::to_string(max_execs) +
                          " commands at once");
    }
    auto t = std::shared_ptr<ExecTicket>(new ExecTicket(std::move(e), audit, metrics));
    t->base_ = {{"exec", RandomBase32(12)},
                {"sandbox", t->entry_->id},
                {"kind", kind},
                {"principal", principal},
                {"remote", remote}};
    Json start = t->base_;
    start["event"] = "start";
    start["command"] = std::move(command);
    start["user"] = user;
    start["cwd"] = cwd;
    t->log_->Record(std::move(start));
    return t;
  }
  ~ExecTicket() { Finish(Status(StatusCode::kAborted, "the command never started")); }

  void Finish(const StatusOr<backends::ExecResult>& r) {
    if (finished_.exchange(true)) return;
    Json end = base_;
    end["event"] = "exit";
    if (r.ok()) {
      end.update(ResultJson(*r, false));
      end.erase("encoding");
      metrics_->ObserveExec(r->duration_ms / 1000.0);
    } else {
      end["error"] = r.status().ToString();
    }
    log_->Record(std::move(end));
    entry_->active_execs--;
    entry_->Touch();
  }

 private:
  ExecTicket(std::shared_ptr<SandboxEntry> e, AuditLog* log, Metrics* metrics)
      : entry_(std::move(e)), log_(log), metrics_(metrics) {}

  std::shared_ptr<SandboxEntry> entry_;
  AuditLog* log_;
  Metrics* metrics_;
  Json base_;  // exec, sandbox, kind, principal, remote
  std::atomic<bool> finished_{false};
};

}  // namespace dsec::edge
