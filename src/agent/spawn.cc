#include "agent/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "agent/agent.h"
#include "base/strings.h"
#include "sys/syscalls.h"

namespace dsec::agent {

namespace {

[[noreturn]] void ChildFail(int err_fd, const std::string& what, int err) {
  std::string msg = "dsec: " + what + ": " + strerror(err) + "\n";
  (void)!write(err_fd, msg.data(), msg.size());
  _exit(err == ENOENT ? 127 : 126);
}

[[noreturn]] void ChildFail(int err_fd, const Status& s) {
  std::string msg = "dsec: " + s.message() + "\n";
  (void)!write(err_fd, msg.data(), msg.size());
  _exit(126);
}

std::string EnvValue(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& e : env)
    if (e.size() > key.size() && e.compare(0, key.size(), key) == 0 && e[key.size()] == '=')
      return e.substr(key.size() + 1);
  return "";
}

// Runs in the forked child. The agent is single-threaded, so allocation is safe here.
[[noreturn]] void ChildMain(Agent& agent, const SpawnRequest& req, int err_fd, int procs_fd,
                            int joined_fd, const char* const* argv, const char* const* envp) {
  const AgentConfig& cfg = agent.config();
  // Join the exec's cgroup before anything else, so nothing it starts can escape it; closing
  // joined_fd then tells the parent (Spawn) that signals to the cgroup reach us.
  if (procs_fd >= 0 && write(procs_fd, "0", 1) != 1) ChildFail(err_fd, "join exec cgroup", errno);
  if (joined_fd >= 0) close(joined_fd);
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  if (setsid() < 0) ChildFail(err_fd, "setsid", errno);
  int devnull = -1;
  auto stdio = [&](int fd, int target) {
    if (fd < 0) {
      if (devnull < 0) devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
      fd = devnull;
    }
    if (dup2(fd, target) < 0) ChildFail(err_fd, "dup2", errno);
  };
  // Extra fds go above everything first so the dup2s below cannot clobber them.
  std::vector<int> extras;
  for (int fd : req.extra_fds) extras.push_back(fcntl(fd, F_DUPFD_CLOEXEC, 100));
  stdio(req.stdin_fd, 0);
  stdio(req.stdout_fd, 1);
  stdio(req.stderr_fd, 2);
  for (size_t i = 0; i < extras.size(); ++i)
    if (dup2(extras[i], 3 + static_cast<int>(i)) < 0) ChildFail(err_fd, "dup2", errno);
  if (req.controlling_tty && ioctl(0, TIOCSCTTY, 0) < 0) ChildFail(err_fd, "TIOCSCTTY", errno);
  // Everything else closes now, before anything taken from the request (the cwd, the program's
  // path) is resolved: the agent's fds include directories outside the sandbox (its cgroup, a
  // host mount), and /proc/self/fd/N/.. would lead from them to the host's root. Only the
  // error pipe stays, moved just above the extras, until exec closes it.
  int first = 3 + static_cast<int>(extras.size());
  if (err_fd != first) {
    if (dup3(err_fd, first, O_CLOEXEC) < 0) ChildFail(err_fd, "dup3 error pipe", errno);
    err_fd = first;
  }
  sys::CloseRange(static_cast<unsigned>(first) + 1, ~0U, 0);
  // User code is the preferred OOM victim, inside the sandbox and on the host. (Raising is
  // always allowed; the agent may sit at -1000.)
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    (void)!write(oom, "500", 3);
    close(oom);
  }
  isolation::ExecCredentials creds;
  creds.uid = req.uid;
  creds.gid = req.gid;
  // In a microVM the kernel is the VM's own: root there keeps every capability (modules,
  // mounts, ptrace: what a task that needs a kernel of its own does); in a container, the
  // reduced set.
  const uint64_t root_caps = cfg.guest_port ? ~uint64_t{0} : isolation::RootCapabilities();
  creds.caps = req.uid == 0 && req.caps ? *req.caps : req.uid == 0 && req.root_caps ? root_caps : 0;
  creds.rlimits = cfg.rlimits;  // seccomp: inherited from the agent
  if (Status s = isolation::ApplyExecCredentials(creds); !s.ok()) ChildFail(err_fd, s);
  umask(022);
  if (chdir(req.cwd.c_str()) < 0) ChildFail(err_fd, "chdir \"" + req.cwd + "\"", errno);
  const std::string& file = req.argv[0];
  if (file.find('/') != std::string::npos) {
    execve(file.c_str(), const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ChildFail(err_fd, "execve \"" + file + "\"", errno);
  }
  std::string path = EnvValue(req.env, "PATH");
  if (path.empty()) path = "/usr/local/bin:/usr/bin:/bin";
  int saved = ENOENT;
  for (auto dir : SplitString(path, ':', true)) {
    std::string cand = std::string(dir) + "/" + file;
    execve(cand.c_str(), const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    if (errno == EACCES)
      saved = EACCES;
    else if (errno != ENOENT && errno != ENOTDIR)
      saved = errno;
  }
  ChildFail(err_fd, "execve \"" + file + "\"", saved);
}

UniqueFd OpenInCgroup(Agent& agent, const std::string& rel, int flags) {
  return UniqueFd(openat(agent.config().cgroup_user.get(), rel.c_str(), flags | O_CLOEXEC));
}

}  // namespace

StatusOr<Spawned> Spawn(Agent& agent, const SpawnRequest& req) {
  if (req.argv.empty()) return InvalidArgument("empty argv");
  const AgentConfig& cfg = agent.config();
  Spawned out;
  // Anything failing after the exec's cgroup exists removes it again.
  auto fail = [&](Status s) {
    if (!out.cgroup.empty()) RemoveCgroup(agent, out.cgroup);
    return s;
  };
  UniqueFd cgroup_dir;
  if (cfg.cgroup_user.valid()) {
    out.cgroup = agent.NextCgroupName(req.cgroup_prefix);
    if (mkdirat(cfg.cgroup_user.get(), out.cgroup.c_str(), 0755) < 0) {
      Status s = ErrnoError("mkdir exec cgroup " + out.cgroup);
      out.cgroup.clear();
      return s;
    }
    cgroup_dir = OpenInCgroup(agent, out.cgroup, O_PATH | O_DIRECTORY);
    if (!cgroup_dir) return fail(ErrnoError("open exec cgroup " + out.cgroup));
  }
  int ep[2];
  if (pipe2(ep, O_CLOEXEC) < 0) return fail(ErrnoError("pipe2"));
  UniqueFd err_r(ep[0]), err_w(ep[1]);

  // argv/envp are built before the clone; the child only reads them.
  std::vector<const char*> argv, envp;
  for (const auto& a : req.argv) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  for (const auto& e : req.env) envp.push_back(e.c_str());
  envp.push_back(nullptr);

  // Born in its cgroup when the kernel can (clone3 CLONE_INTO_CGROUP): joining by a write to
  // cgroup.procs takes the global threadgroup lock, which waits for an RCU grace period.
  // Otherwise the child writes itself into cgroup.procs first thing. The agent is
  // single-threaded, so a fork-like clone3 is as safe here as fork().
  // In the fallback Spawn returns only once the child has joined: until then it sits in the
  // sandbox's top cgroup, where killing the exec's (or every user) cgroup would miss it.
  // (Under the sandbox's seccomp profile clone3 is ENOSYS, so inside a sandbox this is the path
  // every exec takes.)
  pid_t pid = -1;
  UniqueFd procs, joined_r, joined_w;  // only for the fallback
  if (cgroup_dir) {
    clone_args ca{};
    ca.flags = CLONE_INTO_CGROUP;
    ca.exit_signal = SIGCHLD;
    ca.cgroup = static_cast<uint64_t>(cgroup_dir.get());
    pid = static_cast<pid_t>(sys::Clone3(&ca));
    if (pid < 0) {
      procs.Reset(openat(cgroup_dir.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC));
      if (!procs) return fail(ErrnoError("open " + out.cgroup + "/cgroup.procs"));
      int jp[2];
      if (pipe2(jp, O_CLOEXEC) < 0) return fail(ErrnoError("pipe2"));
      joined_r.Reset(jp[0]);
      joined_w.Reset(jp[1]);
    }
  }
  if (pid < 0) pid = fork();
  if (pid < 0) return fail(ErrnoError("fork"));
  if (pid == 0)
    ChildMain(agent, req, err_w.get(), procs ? procs.get() : -1, joined_w ? joined_w.get() : -1,
              argv.data(), envp.data());
  out.pid = pid;
  err_w.Reset();
  if (joined_r) {
    // EOF once the child closed its end after joining, or died trying (its error then comes
    // through err_pipe like any other spawn failure).
    joined_w.Reset();
    char c;
    while (read(joined_r.get(), &c, 1) < 0 && errno == EINTR) {
    }
  }
  fcntl(err_r.get(), F_SETFL, O_NONBLOCK);
  out.err_pipe = std::move(err_r);
  return out;
}

std::string ReadSpawnError(int err_pipe) {
  std::string msg;
  char buf[512];
  while (msg.size() < 4096) {
    ssize_t n = read(err_pipe, buf, sizeof buf);
    if (n <= 0) break;
    msg.append(buf, static_cast<size_t>(n));
  }
  return msg;
}

std::vector<pid_t> CgroupPids(Agent& agent, const std::string& name) {
  std::vector<pid_t> pids;
  if (!agent.config().cgroup_user.valid()) return pids;
  UniqueFd fd =
      OpenInCgroup(agent, name.empty() ? "cgroup.procs" : name + "/cgroup.procs", O_RDONLY);
  if (!fd) return pids;
  std::string content;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0) content.append(buf, static_cast<size_t>(n));
  for (auto tok : SplitString(content, '\n', true))
    if (auto v = ParseInt64(tok)) pids.push_back(static_cast<pid_t>(*v));
  return pids;
}

void KillCgroup(Agent& agent, const std::string& name) {
  if (!agent.config().cgroup_user.valid() || name.empty()) return;
  if (agent.config().cgroup_kill) {
    UniqueFd k = OpenInCgroup(agent, name + "/cgroup.kill", O_WRONLY);
    if (k && write(k.get(), "1", 1) == 1) return;
  }
  // Fallback: freeze so nothing forks, kill every member, thaw so the kills land.
  UniqueFd freeze = OpenInCgroup(agent, name + "/cgroup.freeze", O_WRONLY);
  for (int round = 0; round < 20; ++round) {
    if (freeze) (void)!write(freeze.get(), "1", 1);
    auto pids = CgroupPids(agent, name);
    for (pid_t p : pids) kill(p, SIGKILL);
    if (freeze) (void)!pwrite(freeze.get(), "0", 1, 0);
    if (pids.empty()) return;
  }
}

void FreezeCgroup(Agent& agent, const std::string& name, bool frozen) {
  if (!agent.config().cgroup_user.valid() || name.empty()) return;
  UniqueFd f = OpenInCgroup(agent, name + "/cgroup.freeze", O_WRONLY);
  if (!f || write(f.get(), frozen ? "1" : "0", 1) != 1 || !frozen) return;
  // Freezing completes asynchronously; wait (bounded) until it has.
  for (int i = 0; i < 200; ++i) {
    UniqueFd ev = OpenInCgroup(agent, name + "/cgroup.events", O_RDONLY);
    char buf[256];
    ssize_t n = ev ? read(ev.get(), buf, sizeof buf - 1) : -1;
    if (n <= 0) return;
    buf[n] = '\0';
    if (strstr(buf, "frozen 1")) return;
    usleep(i < 20 ? 100 : 2000);
  }
}

int SignalAllUserProcesses(Agent& agent, int sig) {
  const AgentConfig& cfg = agent.config();
  if (!cfg.cgroup_user.valid()) return -1;
  // Every child cgroup of user/ (one per exec or shell).
  UniqueFd dir = OpenInCgroup(agent, ".", O_RDONLY | O_DIRECTORY);
  std::vector<std::string> names;
  if (dir) {
    DIR* d = fdopendir(dir.Release());
    while (dirent* e = readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') names.emplace_back(e->d_name);
    closedir(d);
  }
  int count = 0;
  for (const auto& n : names) count += static_cast<int>(CgroupPids(agent, n).size());
  if (sig == SIGKILL && cfg.cgroup_kill) {
    UniqueFd k = OpenInCgroup(agent, "cgroup.kill", O_WRONLY);
    if (k && write(k.get(), "1", 1) == 1) return count;
  }
  for (const auto& n : names) {
    if (sig == SIGKILL) {
      KillCgroup(agent, n);
    } else {
      for (pid_t p : CgroupPids(agent, n)) kill(p, sig);
    }
  }
  return count;
}

bool CgroupPopulated(Agent& agent, const std::string& name) {
  if (!agent.config().cgroup_user.valid() || name.empty()) return false;
  UniqueFd ev = OpenInCgroup(agent, name + "/cgroup.events", O_RDONLY);
  char buf[256];
  ssize_t n = ev ? read(ev.get(), buf, sizeof buf - 1) : -1;
  if (n <= 0) return false;
  buf[n] = '\0';
  return strstr(buf, "populated 1") != nullptr;
}

bool RemoveCgroup(Agent& agent, const std::string& name) {
  if (!agent.config().cgroup_user.valid() || name.empty()) return true;
  return unlinkat(agent.config().cgroup_user.get(), name.c_str(), AT_REMOVEDIR) == 0 ||
         errno == ENOENT;
}

}  // namespace dsec::agent
