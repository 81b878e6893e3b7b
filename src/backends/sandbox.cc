#include "backends/sandbox.h"

#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <future>

#include "base/enum_names.h"
#include "base/ids.h"
#include "base/strings.h"
#include "net/sandbox_net.h"
#include "protocol/frame.h"

namespace dsec::backends {

namespace {
constexpr EnumName<Kind> kKindNames[] = {{Kind::kContainer, "container"},
                                         {Kind::kMicrovm, "microvm"}};
constexpr EnumName<FnRuntime> kFnRuntimes[] = {
    {FnRuntime::kPython, "python"}, {FnRuntime::kBash, "bash"}, {FnRuntime::kExec, "exec"}};
}  // namespace

std::string_view KindName(Kind k) { return NameIn(kKindNames, k); }

std::optional<Kind> KindFromName(std::string_view name) { return ValueIn(kKindNames, name); }

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
    MutexLock l(mu_);
    (stream == protocol::kStderr ? out_.stderr_data : out_.stdout_data).append(data);
  }
  void OnExit(const StatusOr<ExecResult>& r) override {
    MutexLock l(mu_);
    if (r.ok()) {
      out_.result = *r;
      promise_.set_value(std::move(out_));
    } else {
      promise_.set_value(r.status());
    }
  }
  std::future<StatusOr<ExecOutput>> future() { return promise_.get_future(); }

 private:
  Mutex mu_;
  ExecOutput out_;
  std::promise<StatusOr<ExecOutput>> promise_;
};

constexpr uint64_t kMaxOutputCap = 256ull << 20;

Status ValidateEnv(const std::map<std::string, std::string>& env) {
  for (const auto& [k, v] : env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return InvalidArgument("env names must be non-empty without '=' or NUL, values without NUL");
  return OkStatus();
}

}  // namespace

Sandbox::Sandbox(std::unique_ptr<Instance> instance, IoRunner& io)
    : instance_(std::move(instance)), io_(io) {}

Sandbox::~Sandbox() { (void)Destroy(); }

StatusOr<std::shared_ptr<Sandbox>> Sandbox::Start(std::unique_ptr<Instance> instance,
                                                  IoRunner& io) {
  std::shared_ptr<Sandbox> sb(new Sandbox(std::move(instance), io));
  MutexLock l(sb->mu_);
  StatusOr<AgentLink> link = sb->instance_->Start();
  if (!link.ok()) {
    l.Unlock();
    (void)sb->Destroy();
    return link.status();
  }
  sb->Connect(std::move(*link), 0);
  return sb;
}

StatusOr<std::shared_ptr<Sandbox>> Sandbox::Adopt(std::unique_ptr<Instance> instance, IoRunner& io,
                                                  const std::string& handle) {
  std::shared_ptr<Sandbox> sb(new Sandbox(std::move(instance), io));
  MutexLock l(sb->mu_);
  StatusOr<AgentLink> link = sb->instance_->Adopt(handle);
  if (!link.ok()) {
    l.Unlock();
    (void)sb->Destroy();  // the instance leaves alone what another live process owns
    return link.status();
  }
  // Only OOM kills from now on are this edge's to attribute.
  sb->Connect(std::move(*link), sb->instance_->OomKills()());
  return sb;
}

void Sandbox::Connect(AgentLink link, uint64_t oom_seen) {
  shells_.insert(link.shells.begin(), link.shells.end());
  std::weak_ptr<Sandbox> weak = weak_from_this();
  session_ = AgentSession::Start(io_, std::move(link.stream), instance_->OomKills(), oom_seen,
                                 [weak](bool oom) {
                                   // The agent is PID 1: if it is gone, so is everything else.
                                   if (auto self = weak.lock())
                                     self->MarkFailed(oom ? "oom" : "agent exited");
                                 });
  state_ = link.paused ? SandboxState::kPaused : SandboxState::kRunning;
}

std::string Sandbox::reason() const {
  MutexLock l(mu_);
  return reason_;
}

void Sandbox::MarkFailed(const std::string& why) {
  if (state_.load() == SandboxState::kDestroyed) return;  // a Destroy closed the session
  {
    MutexLock l(mu_);
    SandboxState s = state_.load();
    if (s != SandboxState::kRunning && s != SandboxState::kPaused) return;
    state_ = SandboxState::kFailed;
    reason_ = why;
  }
  Notify();
}

StatusOr<std::shared_ptr<AgentSession>> Sandbox::Ready() {
  if (state_.load() == SandboxState::kPaused) DSEC_RETURN_IF_ERROR(Resume());
  MutexLock l(mu_);
  SandboxState st = state_.load();
  if (st != SandboxState::kRunning)
    return FailedPrecondition("sandbox " + id() + " is " + std::string(SandboxStateName(st)) +
                              (reason_.empty() ? "" : " (" + reason_ + ")"));
  return session_;
}

StatusOr<protocol::RunAs> Sandbox::RunAsUser(const std::string& user) const {
  // The agent has no default user: a user that does not resolve is an error here too.
  DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(user.empty() ? spec().user : user));
  return protocol::RunAs{u.uid, u.gid};
}

StatusOr<protocol::ExecSpec> Sandbox::BuildExecSpec(const ExecRequest& req) const {
  const SandboxSpec& sp = spec();
  protocol::ExecSpec s;
  if (req.fncall) {
    if (!sp.worker) return InvalidArgument("sandbox " + sp.id + " is not an fncall worker");
    s.fncall = req.fncall;
  } else if (req.shell) {
    s.argv = {"/bin/sh", "-c", *req.shell};
  } else {
    if (req.cmd.empty() || req.cmd[0].empty()) return InvalidArgument("cmd must not be empty");
    s.argv = req.cmd;
  }
  for (const auto& a : s.argv)
    if (a.find('\0') != std::string::npos) return InvalidArgument("cmd must not contain NUL bytes");
  UserIds u;
  if (req.grader) {
    if (!req.user.empty())
      return InvalidArgument("a grader exec runs as its own user: no \"user\"");
    u.uid = u.gid = kGraderUid;
    u.name = "grader";
    u.home = "/";
  } else {
    DSEC_ASSIGN_OR_RETURN(u, ResolveUser(req.user.empty() ? sp.user : req.user));
  }
  s.uid = u.uid;
  s.gid = u.gid;
  s.root_caps = u.root;
  s.cwd = req.cwd.empty() ? sp.workdir : req.cwd;
  if (s.cwd[0] != '/' || s.cwd.find('\0') != std::string::npos)
    return InvalidArgument("cwd must be an absolute path");
  DSEC_RETURN_IF_ERROR(ValidateEnv(req.env));
  s.env = BaseEnv(u, sp.hostname, req.tty);
  if (!req.grader)
    for (const auto& [k, v] : sp.env) SetEnv(&s.env, k, v);
  for (const auto& [k, v] : req.env) SetEnv(&s.env, k, v);
  if (req.timeout_ms < 0) return InvalidArgument("timeout_ms must not be negative");
  s.timeout_ms = req.timeout_ms;
  if (req.max_output_bytes > kMaxOutputCap)
    return InvalidArgument("max_output_bytes must be at most " + std::to_string(kMaxOutputCap));
  s.max_output_bytes = req.max_output_bytes;
  s.tty = req.tty;
  s.cols = req.cols;
  s.rows = req.rows;
  s.stdin_stream = req.stdin_stream;
  return s;
}

StatusOr<std::shared_ptr<ExecHandle>> Sandbox::StartExec(const ExecRequest& req,
                                                         std::shared_ptr<ExecObserver> observer) {
  DSEC_ASSIGN_OR_RETURN(protocol::ExecSpec s, BuildExecSpec(req));
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  if (req.grader) DSEC_RETURN_IF_ERROR(KillEveryUserProcess());
  DSEC_ASSIGN_OR_RETURN(auto handle,
                        session->StartExec(std::move(s), req.stdin_data, std::move(observer)));
  exec_count_++;
  return handle;
}

StatusOr<ExecOutput> Sandbox::Exec(const ExecRequest& req) {
  auto obs = std::make_shared<BufferingObserver>();
  auto fut = obs->future();
  DSEC_RETURN_IF_ERROR(StartExec(req, obs).status());
  return fut.get();
}

StatusOr<std::string> Sandbox::OpenShell(const std::string& user) {
  const SandboxSpec& sp = spec();
  DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(user.empty() ? sp.user : user));
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  protocol::ExecSpec s;
  s.argv = {"/bin/bash"};
  s.uid = u.uid;
  s.gid = u.gid;
  s.root_caps = u.root;
  s.cwd = sp.workdir;
  s.env = BaseEnv(u, sp.hostname, false);
  for (const auto& [k, v] : sp.env) SetEnv(&s.env, k, v);
  DSEC_ASSIGN_OR_RETURN(std::string shell_id, session->OpenShell(std::move(s)));
  MutexLock l(mu_);
  shells_.insert(shell_id);
  return shell_id;
}

StatusOr<std::shared_ptr<ExecHandle>> Sandbox::RunInShell(const std::string& shell_id,
                                                          const std::string& command,
                                                          int64_t timeout_ms,
                                                          uint64_t max_output_bytes,
                                                          std::shared_ptr<ExecObserver> observer) {
  if (timeout_ms < 0) return InvalidArgument("timeout_ms must not be negative");
  if (max_output_bytes > kMaxOutputCap) return InvalidArgument("max_output_bytes is too large");
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(
      auto handle, session->RunInShell(
                       protocol::ShellRunRequest{shell_id, command, timeout_ms, max_output_bytes},
                       std::move(observer)));
  exec_count_++;
  return handle;
}

StatusOr<ExecOutput> Sandbox::RunShell(const std::string& shell_id, const std::string& command,
                                       int64_t timeout_ms, uint64_t max_output_bytes) {
  auto obs = std::make_shared<BufferingObserver>();
  auto fut = obs->future();
  DSEC_RETURN_IF_ERROR(RunInShell(shell_id, command, timeout_ms, max_output_bytes, obs).status());
  return fut.get();
}

Status Sandbox::CloseShell(const std::string& shell_id) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  Status s = session->CloseShell(shell_id);
  if (s.ok() || s.code() == StatusCode::kNotFound) {
    MutexLock l(mu_);
    shells_.erase(shell_id);
  }
  return s;
}

std::vector<std::string> Sandbox::ListShells() {
  MutexLock l(mu_);
  return {shells_.begin(), shells_.end()};
}

StatusOr<std::string> Sandbox::ReadFile(const std::string& path, uint64_t max_bytes,
                                        const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->ReadFile(as, path, max_bytes);
}

Status Sandbox::WriteFile(const std::string& path, const UploadBody& data, uint32_t mode,
                          const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->WriteFile(as, path, data, mode);
}

StatusOr<std::vector<FileEntry>> Sandbox::ListDir(const std::string& path,
                                                  const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->ListDir(as, path);
}

StatusOr<std::shared_ptr<WatchHandle>> Sandbox::WatchDir(const std::string& path, bool recursive,
                                                         bool include_entry,
                                                         std::shared_ptr<WatchObserver> observer,
                                                         const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  protocol::WatchDirRequest req;
  req.as = as;
  req.path = path;
  req.recursive = recursive;
  req.include_entry = include_entry;
  return session->WatchDir(std::move(req), std::move(observer));
}

StatusOr<FileEntry> Sandbox::Stat(const std::string& path, const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->Stat(as, path);
}

Status Sandbox::MakeDir(const std::string& path, uint32_t mode, const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->MakeDir(as, path, mode);
}

Status Sandbox::Remove(const std::string& path, bool recursive, const std::string& user) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(user));
  return session->Remove(as, path, recursive);
}

Status Sandbox::ExtractTar(const std::string& dir, const UploadBody& tar) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  return session->ExtractTar(as, dir, tar, static_cast<uint64_t>(spec().resources.disk_mb) << 20);
}

StatusOr<std::string> Sandbox::CreateTar(const std::string& dir, uint64_t max_bytes) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  DSEC_ASSIGN_OR_RETURN(protocol::RunAs as, RunAsUser(""));
  return session->CreateTar(as, dir, max_bytes);
}

StatusOr<int> Sandbox::SignalAll(int sig) {
  if (sig <= 0 || sig >= 65) return InvalidArgument("bad signal number");
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  return session->SignalAll(sig);
}

StatusOr<protocol::JobInfo> Sandbox::StartJob(const ExecRequest& req,
                                              protocol::JobStartRequest job) {
  DSEC_ASSIGN_OR_RETURN(job.spec, BuildExecSpec(req));
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  if (req.grader) DSEC_RETURN_IF_ERROR(KillEveryUserProcess());
  DSEC_ASSIGN_OR_RETURN(auto info, session->StartJob(std::move(job), req.stdin_data));
  exec_count_++;
  return info;
}

void Sandbox::ReadJob(const protocol::JobReadRequest& req,
                      std::function<void(StatusOr<AgentSession::JobOutput>)> done) {
  auto session = Ready();
  if (!session.ok()) return done(session.status());
  (*session)->ReadJob(req, std::move(done));
}

StatusOr<protocol::JobInfo> Sandbox::KillJob(const std::string& job_id, bool forget) {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  return session->KillJob(job_id, forget);
}

StatusOr<std::vector<protocol::JobInfo>> Sandbox::ListJobs() {
  DSEC_ASSIGN_OR_RETURN(auto session, Ready());
  return session->ListJobs();
}

Status Sandbox::KillEveryUserProcess() {
  DSEC_RETURN_IF_ERROR(SignalAll(SIGKILL).status());
  // Until only the agent is left (a process in uninterruptible sleep may take a moment).
  for (int i = 0; i < 400; ++i) {
    auto st = Stats();
    if (st.ok() && st->pids <= 1) return OkStatus();
    usleep(i < 20 ? 500 : 5000);
  }
  return Unavailable("sandbox " + id() + ": processes survived SIGKILL; the grader did not start");
}

Status Sandbox::Pause() {
  {
    MutexLock l(mu_);
    SandboxState st = state_.load();
    if (st == SandboxState::kPaused) return OkStatus();
    if (st != SandboxState::kRunning)
      return FailedPrecondition("sandbox " + id() + " is " + std::string(SandboxStateName(st)));
    DSEC_RETURN_IF_ERROR(instance_->Pause());
    state_ = SandboxState::kPaused;
  }
  Notify();
  return OkStatus();
}

Status Sandbox::Resume() {
  {
    MutexLock l(mu_);
    if (state_.load() != SandboxState::kPaused) return OkStatus();
    DSEC_RETURN_IF_ERROR(instance_->Resume());
    state_ = SandboxState::kRunning;
  }
  Notify();
  return OkStatus();
}

StatusOr<SandboxStats> Sandbox::Stats() {
  std::shared_ptr<AgentSession> session;
  SandboxStats s;
  {
    MutexLock l(mu_);
    if (state_.load() == SandboxState::kDestroyed)
      return FailedPrecondition("sandbox is destroyed");
    DSEC_ASSIGN_OR_RETURN(s, instance_->Stats());
    s.exec_count = exec_count_.load();
    if (net::SandboxNet* n = instance_->Network()) s.network_denied = n->Denied();
    // Only a running agent is asked (a paused sandbox stays paused).
    if ((!s.disk_used_known || s.ask_guest) && state_.load() == SandboxState::kRunning)
      session = session_;
  }
  if (session) {
    // One agent round trip: its root's filesystem, and for a guest its own account.
    auto fs = session->StatFs({0, 0}, "/", s.ask_guest);
    if (fs.ok() && fs->fs_bytes > 0 && !s.disk_used_known) s.disk_used = fs->fs_used;
    if (fs.ok() && s.ask_guest && fs->mem_total > 0 && fs->mem_available <= fs->mem_total)
      s.guest =
          SandboxStats::Guest{fs->mem_total, fs->mem_total - fs->mem_available, fs->user_pids};
  }
  return s;
}

Status Sandbox::SetMemoryLimit(int64_t bytes) {
  MutexLock l(mu_);
  if (state_.load() == SandboxState::kDestroyed)
    return FailedPrecondition("sandbox " + id() + " is destroyed");
  return instance_->SetMemoryLimit(bytes);
}

Status Sandbox::SetNetwork(const net::NetworkPolicy& p) {
  MutexLock l(mu_);
  if (state_.load() == SandboxState::kDestroyed)
    return FailedPrecondition("sandbox " + id() + " is destroyed");
  net::SandboxNet* n = instance_->Network();
  if (!n) return p.mode == net::NetMode::kNone ? OkStatus() : NoNetwork(kind(), p.mode);
  return n->Apply(p);
}

StatusOr<UniqueFd> Sandbox::ConnectPort(uint16_t port, int64_t timeout_ms) {
  DSEC_RETURN_IF_ERROR(Ready().status());
  {
    MutexLock l(mu_);
    if (state_.load() == SandboxState::kDestroyed)
      return FailedPrecondition("sandbox " + id() + " is destroyed");
    net::SandboxNet* n = instance_->Network();
    if (n && n->has_namespace()) return n->ConnectPort(port);  // from inside, no agent involved
  }
  return ConnectPortViaAgent(port, timeout_ms);  // a microVM's
}

StatusOr<UniqueFd> Sandbox::ConnectPortViaAgent(uint16_t port, int64_t timeout_ms) {
  // The session, not the lock, is held while the agent connects.
  DSEC_ASSIGN_OR_RETURN(std::shared_ptr<AgentSession> session, Ready());
  return session->OpenPort(port, timeout_ms);
}

std::string Sandbox::network_address() const {
  MutexLock l(mu_);
  net::SandboxNet* n = instance_->Network();
  return n ? n->Address() : std::string();
}

StatusOr<std::vector<std::string>> Sandbox::CaptureStack(bool keep_setuid,
                                                         const CaptureProgress& progress) {
  MutexLock l(mu_);
  SandboxState st = state_.load();
  if (st != SandboxState::kRunning && st != SandboxState::kPaused)
    return FailedPrecondition("sandbox " + id() + " is " + std::string(SandboxStateName(st)));
  const bool running = st == SandboxState::kRunning;
  return instance_->CaptureStack(keep_setuid, running, progress,
                                 running ? session_.get() : nullptr);
}

StatusOr<std::shared_ptr<const MachineState>> Sandbox::SaveMachine() {
  MutexLock l(mu_);
  SandboxState st = state_.load();
  if (st != SandboxState::kRunning && st != SandboxState::kPaused)
    return FailedPrecondition("sandbox " + id() + " is " + std::string(SandboxStateName(st)));
  return instance_->SaveMachine(st == SandboxState::kRunning);
}

Status Sandbox::Destroy() {
  MutexLock l(mu_);
  if (state_.load() == SandboxState::kDestroyed) return OkStatus();
  state_ = SandboxState::kDestroyed;
  if (session_) session_->Close();
  return instance_->Destroy();
}

std::string Sandbox::AdoptionHandle() const { return instance_->AdoptionHandle(); }

void Sandbox::Detach() {
  MutexLock l(mu_);
  if (state_.load() == SandboxState::kDestroyed) return;
  state_ = SandboxState::kDestroyed;
  // The agent sees its edge go and waits (orphan timeout) for the next one to reconnect.
  if (session_) session_->Close();
  instance_->Detach();
}

std::vector<std::string> BaseEnv(const UserIds& u, const std::string& hostname, bool tty) {
  std::vector<std::string> env = {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=" + u.home,
      "USER=" + u.name,
      "LOGNAME=" + u.name,
      "SHELL=/bin/bash",
      "LANG=C.UTF-8",
      "HOSTNAME=" + hostname};
  if (tty) env.push_back("TERM=xterm-256color");
  return env;
}

void SetEnv(std::vector<std::string>* env, const std::string& k, const std::string& v) {
  for (auto& e : *env) {
    if (e.size() > k.size() && e.compare(0, k.size(), k) == 0 && e[k.size()] == '=') {
      e = k + "=" + v;
      return;
    }
  }
  env->push_back(k + "=" + v);
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
  u.name = u.uid == 0 ? "root" : u.uid == kSandboxUid ? "sandbox" : std::to_string(u.uid);
  u.home = u.uid == 0 ? "/root" : "/workspace";
  return u;
}

Status ValidateSandboxSpec(const SandboxSpec& s) {
  DSEC_RETURN_IF_ERROR(ValidateSafeName("sandbox id", s.id));
  const Resources& r = s.resources;
  if (!(r.cpu > 0 && r.cpu <= 1024)) return InvalidArgument("cpu must be > 0 and <= 1024");
  if (r.memory_mb < 16 || r.memory_mb > (1 << 22))
    return InvalidArgument("memory_mb must be between 16 and 4194304");
  if (r.pids < 8 || r.pids > (1 << 22))
    return InvalidArgument("pids must be between 8 and 4194304");
  if (r.disk_mb < 1 || r.disk_mb > (1 << 22))
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

// A helper binary: $<env>, else installed beside this binary, else in the build tree
// (src/cli/dsec -> src/<subdir>/<name>).
std::string HelperBinaryPath(const char* env_name, const std::string& name,
                             const std::string& subdir) {
  if (const char* env = getenv(env_name); env && *env) return env;
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return name;
  std::string self(buf, static_cast<size_t>(n));
  std::string dir = self.substr(0, self.rfind('/'));
  for (const std::string& cand :
       {dir + "/" + name, dir + "/../" + subdir + "/" + name,
        dir + "/../src/" + subdir + "/" + name, dir + "/src/" + subdir + "/" + name}) {
    if (access(cand.c_str(), X_OK) == 0) return cand;
  }
  return dir + "/" + name;
}

std::string_view FnRuntimeName(FnRuntime r) { return NameIn(kFnRuntimes, r); }

std::optional<FnRuntime> FnRuntimeFromName(std::string_view name) {
  return ValueIn(kFnRuntimes, name);
}

Status NoNetwork(Kind kind, net::NetMode mode) {
  return Unimplemented("network mode \"" + std::string(net::NetModeName(mode)) +
                       "\" is not available for " + std::string(KindName(kind)) +
                       " sandboxes yet (containers have it)");
}

Status NoPortProxy(Kind kind) {
  return Unimplemented("the port proxy is not available for " + std::string(KindName(kind)) +
                       " sandboxes yet (container sandboxes have it)");
}

Status NoSnapshot(Kind kind) {
  return Unimplemented(std::string(KindName(kind)) +
                       " sandboxes cannot be snapshotted or forked yet (container sandboxes can)");
}

Status CheckCapabilities(Kind kind, const KindCapabilities& caps, const std::string& image,
                         const net::NetworkPolicy& network, bool worker) {
  if (!caps.host_image && (image == "host" || image.rfind("host,", 0) == 0))
    return Unimplemented("image \"host\" cannot be used by " + std::string(KindName(kind)) +
                         " sandboxes (it is a live view of the host's directories, not layers): "
                         "give an image from the store, e.g. one made by `dsec image build`");
  if (!caps.network && network.mode != net::NetMode::kNone) return NoNetwork(kind, network.mode);
  if (!caps.fncall_workers && worker)
    return Unimplemented("fncall workers run as containers, not " + std::string(KindName(kind)) +
                         " sandboxes");
  return OkStatus();
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0
             ? CPU_COUNT(&set)
             : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

void MergeImageEnv(const std::vector<std::string>& image_env,
                   std::map<std::string, std::string>* env) {
  for (const auto& kv : image_env) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env->emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
}

}  // namespace dsec::backends
