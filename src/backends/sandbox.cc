#include "backends/sandbox.h"

#include <future>
#include <mutex>

#include "base/ids.h"
#include "base/strings.h"
#include "protocol/frame.h"

namespace dsec::backends {

std::string_view SandboxStateName(SandboxState s) {
  switch (s) {
    case SandboxState::kCreating:
      return "creating";
    case SandboxState::kRunning:
      return "running";
    case SandboxState::kPaused:
      return "paused";
    case SandboxState::kFailed:
      return "failed";
    case SandboxState::kDestroyed:
      return "destroyed";
  }
  return "unknown";
}

namespace {

// Collects a streaming exec into an ExecOutput and hands it to a waiting thread.
class BufferingObserver : public ExecObserver {
 public:
  void OnOutput(uint8_t stream, std::string_view data) override {
    std::lock_guard<std::mutex> l(mu_);
    (stream == protocol::kStderr ? out_.stderr_data : out_.stdout_data).append(data);
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    std::lock_guard<std::mutex> l(mu_);
    if (r.ok()) {
      out_.result = *r;
      promise_.set_value(std::move(out_));
    } else {
      promise_.set_value(r.status());
    }
  }
  std::future<StatusOr<ExecOutput>> future() { return promise_.get_future(); }

 private:
  std::mutex mu_;
  ExecOutput out_;
  std::promise<StatusOr<ExecOutput>> promise_;
};

}  // namespace

StatusOr<ExecOutput> Sandbox::Exec(const ExecRequest& req) {
  auto obs = std::make_shared<BufferingObserver>();
  auto fut = obs->future();
  DSEC_RETURN_IF_ERROR(StartExec(req, obs).status());
  return fut.get();
}

StatusOr<ExecOutput> Sandbox::RunShell(const std::string& shell_id, const std::string& command,
                                       int64_t timeout_ms, uint64_t max_output_bytes) {
  auto obs = std::make_shared<BufferingObserver>();
  auto fut = obs->future();
  DSEC_RETURN_IF_ERROR(RunInShell(shell_id, command, timeout_ms, max_output_bytes, obs).status());
  return fut.get();
}

StatusOr<UserIds> ResolveUser(const std::string& user) {
  UserIds u;
  if (user.empty() || user == "sandbox") {
    u.name = "sandbox";
    u.home = "/workspace";
    return u;
  }
  if (user == "root") {
    u.uid = u.gid = 0;
    u.root = true;
    u.name = "root";
    u.home = "/root";
    return u;
  }
  auto colon = user.find(':');
  auto uid = ParseUint64(user.substr(0, colon));
  auto gid = colon == std::string::npos ? uid : ParseUint64(user.substr(colon + 1));
  if (!uid || !gid || *uid > 65535 || *gid > 65535)
    return InvalidArgument(
        "user must be \"sandbox\", \"root\" or a numeric uid[:gid] below 65536, not \"" + user +
        "\"");
  u.uid = static_cast<uint32_t>(*uid);
  u.gid = static_cast<uint32_t>(*gid);
  u.root = u.uid == 0;
  u.name = u.uid == 0 ? "root" : u.uid == 1000 ? "sandbox" : std::to_string(u.uid);
  u.home = u.uid == 0 ? "/root" : "/workspace";
  return u;
}

Status ValidateSandboxSpec(const SandboxSpec& s) {
  DSEC_RETURN_IF_ERROR(ValidateSafeName("sandbox id", s.id));
  if (!(s.cpus > 0 && s.cpus <= 1024)) return InvalidArgument("cpu must be > 0 and <= 1024");
  if (s.memory_mb < 16 || s.memory_mb > (1 << 22))
    return InvalidArgument("memory_mb must be between 16 and 4194304");
  if (s.pids < 8 || s.pids > (1 << 22))
    return InvalidArgument("pids must be between 8 and 4194304");
  if (s.disk_mb < 1 || s.disk_mb > (1 << 22))
    return InvalidArgument("disk_mb must be between 1 and 4194304");
  if (!s.hostname.empty() && (s.hostname.size() > 63 || !IsSafeName(s.hostname)))
    return InvalidArgument("hostname must be 1-63 characters of [A-Za-z0-9._-]");
  if (s.workdir.empty() || s.workdir[0] != '/' || s.workdir.find('\0') != std::string::npos)
    return InvalidArgument("workdir must be an absolute path");
  for (const auto& [k, v] : s.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return InvalidArgument("env names must be non-empty without '=' or NUL");
  }
  return OkStatus();
}

}  // namespace dsec::backends
