#include "agent/zygote_link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/spawn.h"
#include "base/base64.h"
#include "base/clock.h"
#include "base/fd_passing.h"
#include "protocol/messages.h"

namespace dsec::agent {

using protocol::Json;

namespace {
constexpr int kZygoteReadyTimeoutMs = 60000;  // python with heavy preloads
constexpr size_t kMaxMessage = 64 << 10;
}  // namespace

Status StartZygote(Agent& agent) {
  AgentConfig& cfg = agent.mutable_config();
  if (!cfg.zygote) return OkStatus();
  if (!cfg.zygote_binary) return InvalidArgument("zygote configured without its binary");
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
    return ErrnoError("socketpair zygote");
  UniqueFd ours(sp[0]), theirs(sp[1]);
  SpawnRequest req;
  // The binary is the fd after the control socket: 3 = control, 4 = binary.
  req.argv.push_back("/proc/self/fd/4");
  for (const auto& a : cfg.zygote->args) req.argv.push_back(a);
  req.env = cfg.zygote->env;
  req.cwd = "/";
  req.uid = 0;
  req.gid = 0;
  req.caps = cfg.zygote->caps;
  req.extra_fds = {theirs.get(), cfg.zygote_binary.get()};
  req.cgroup_prefix = 'z';
  DSEC_ASSIGN_OR_RETURN(Spawned z, Spawn(agent, req));
  theirs.Reset();
  cfg.zygote_binary.Reset();
  agent.SetZygote(z.pid, std::move(ours));
  int control = agent.zygote_control();

  Json init = {{"init",
                {{"seccomp", Json::array()},
                 {"rlimits",
                  {{"nofile", cfg.rlimits.nofile},
                   {"fsize", cfg.rlimits.fsize},
                   {"core", cfg.rlimits.core},
                   {"stack", cfg.rlimits.stack}}}}}};
  for (const auto& p : cfg.zygote->call_seccomp) init["init"]["seccomp"].push_back(Base64Encode(p));
  DSEC_RETURN_IF_ERROR(SendWithFds(control, init.dump(), {}));

  int64_t deadline = MonotonicMs() + kZygoteReadyTimeoutMs;
  while (true) {
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return DeadlineExceeded("fncall zygote did not become ready");
    pollfd p{control, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("poll zygote");
    if (r == 0) continue;
    std::string buf;
    std::vector<UniqueFd> fds;
    DSEC_ASSIGN_OR_RETURN(size_t n, RecvWithFds(control, kMaxMessage, 0, &buf, &fds));
    std::string err = ReadSpawnError(z.err_pipe.get());
    if (!err.empty()) return Unavailable("fncall zygote: " + err);
    if (n == 0) return Unavailable("fncall zygote exited during start");
    auto j = protocol::ParseJson(buf);
    if (!j.ok()) return Unavailable("fncall zygote sent malformed JSON");
    if (j->contains("ready")) return OkStatus();
    if (auto e = j->find("error"); e != j->end() && e->is_string())
      return Unavailable("fncall zygote: " + e->get<std::string>());
  }
}

StatusOr<UniqueFd> SendZygoteCall(Agent& agent, const std::string& request_json, int stdin_fd,
                                  int stdout_fd, int stderr_fd) {
  if (!agent.ZygoteAlive()) return Unavailable("the fncall zygote is not running");
  UniqueFd req(memfd_create("dsec-fncall", MFD_CLOEXEC));
  if (!req) return ErrnoError("memfd_create");
  size_t off = 0;
  while (off < request_json.size()) {
    ssize_t n = write(req.get(), request_json.data() + off, request_json.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write call request");
    off += static_cast<size_t>(n);
  }
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
    return ErrnoError("socketpair call");
  UniqueFd ours(sp[0]), theirs(sp[1]);
  UniqueFd devnull;
  if (stdin_fd < 0) {
    devnull.Reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
    stdin_fd = devnull.get();
  }
  Status s = SendWithFds(agent.zygote_control(), "{\"call\":{}}",
                         {theirs.get(), req.get(), stdin_fd, stdout_fd, stderr_fd});
  if (!s.ok()) return Unavailable("fncall zygote: " + s.message());
  return ours;
}

std::string ZygoteError(Agent& agent) {
  if (agent.zygote_control() < 0) return "";
  char buf[4096];
  ssize_t n = recv(agent.zygote_control(), buf, sizeof buf, MSG_DONTWAIT);
  if (n <= 0) return "";
  auto j = protocol::ParseJson(std::string_view(buf, static_cast<size_t>(n)));
  if (!j.ok()) return "";
  auto e = j->find("error");
  return e != j->end() && e->is_string() ? e->get<std::string>() : "";
}

}  // namespace dsec::agent
