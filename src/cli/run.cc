#include "cli/run.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "backends/container/container_backend.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/mutex.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "cli/attach.h"
#include "cli/cmd_util.h"
#include "cli/edge_cmds.h"

namespace dsec::cli {

namespace {

struct RunOptions {
  std::string image = "host";
  Resources resources;
  double timeout_s = 0;
  std::string user = "sandbox";
  std::string workdir = "/workspace";
  std::vector<std::string> env;
  std::string tty = "auto";
  bool no_userns = false;
  std::vector<std::string> cmd;
};

class StreamObserver : public backends::ExecObserver {
 public:
  // capture (--json): the output is kept for the result instead of written as it comes.
  explicit StreamObserver(bool capture = false) : capture_(capture) {}
  void OnOutput(uint8_t stream, std::string_view data) override {
    if (capture_) {
      MutexLock l(mu_);
      (stream == backends::kStderrStream ? err_ : out_).append(data);
      return;
    }
    (void)WriteAllFd(stream == backends::kStderrStream ? STDERR_FILENO : STDOUT_FILENO, data,
                     "output");
  }
  std::pair<std::string, std::string> Captured() {
    MutexLock l(mu_);
    return {out_, err_};
  }
  void OnExit(const StatusOr<backends::ExecResult>& r) override {
    MutexLock l(mu_);
    result_ = r;
    done_ = true;
    cv_.NotifyAll();
  }
  StatusOr<backends::ExecResult> Wait() {
    MutexLock l(mu_);
    cv_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return done_; });
    return result_;
  }
  bool done() {
    MutexLock l(mu_);
    return done_;
  }

 private:
  const bool capture_;
  Mutex mu_;
  CondVar cv_;
  std::string out_, err_;
  bool done_ = false;
  StatusOr<backends::ExecResult> result_ = InternalError("no result");
};

// The local sandbox of `dsec run` (no edge): its spec from the flags, checked.
StatusOr<backends::SandboxSpec> LocalSpec(const RunOptions& o) {
  backends::SandboxSpec spec;
  spec.id = NewSandboxId("local");
  spec.image = o.image;
  spec.resources = o.resources;
  spec.user = o.user;
  spec.workdir = o.workdir;
  DSEC_ASSIGN_OR_RETURN(spec.env, ParseKeyValues(o.env, "--env"));
  DSEC_RETURN_IF_ERROR(backends::ValidateSandboxSpec(spec));
  DSEC_RETURN_IF_ERROR(backends::ResolveUser(o.user).status());
  if (o.timeout_s < 0) return InvalidArgument("--timeout must not be negative");
  return spec;
}

backends::ExecRequest LocalExecRequest(const RunOptions& o, bool tty) {
  backends::ExecRequest req;
  req.cmd = o.cmd;
  req.timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  req.max_output_bytes = 256ull << 20;
  req.stdin_stream = true;
  req.tty = tty;
  if (tty) {
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
      req.cols = ws.ws_col;
      req.rows = ws.ws_row;
    }
  }
  return req;
}

// stdin goes to the command until it ends; forwarded signals are taken by the returned
// thread (SIGINT and SIGTERM once, then SIGKILL; SIGWINCH resizes) until *finished.
std::thread ForwardStdinAndSignals(const std::shared_ptr<backends::ExecHandle>& h,
                                   const sigset_t& sigs, std::atomic<bool>* finished, bool tty) {
  std::thread stdin_thread([h, finished] {
    char buf[65536];
    while (!*finished) {
      ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (!h->WriteStdin(std::string(buf, static_cast<size_t>(n))).ok()) break;
    }
    h->CloseStdin();
  });
  stdin_thread.detach();  // may sit in read(2) on a terminal; the process exits anyway
  return std::thread([h, &sigs, finished, tty] {
    int interrupts = 0;
    while (!*finished) {
      timespec ts{0, 200 * 1000 * 1000};
      int sig = sigtimedwait(&sigs, nullptr, &ts);
      if (sig <= 0 || sig == SIGUSR1) continue;  // (SIGUSR1: look at *finished again)
      if (sig == SIGWINCH) {
        winsize ws{};
        if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) h->Resize(ws.ws_col, ws.ws_row);
        continue;
      }
      if (++interrupts > 1 || sig == SIGQUIT) {
        h->Kill();
      } else {
        h->Signal(sig);
      }
    }
  });
}

// Prints why the command ended when that is not its own exit status; returns the exit code.
int ReportResult(const StatusOr<backends::ExecResult>& result, const RunOptions& o,
                 uint64_t max_output_bytes) {
  int code;
  if (!result.ok()) {
    std::cerr << "dsec: " << result.status().message() << "\n";
    code = 125;
  } else {
    code = result->exit_code;
    if (result->timed_out) {
      std::cerr << "dsec: command timed out after " << o.timeout_s << " s\n";
      code = 124;
    } else if (result->oom_killed) {
      std::cerr << "dsec: command was killed by the OOM killer (limit " << o.resources.memory_mb
                << " MB memory + " << o.resources.disk_mb << " MB disk)\n";
    }
    if (result->stdout_truncated || result->stderr_truncated)
      std::cerr << "dsec: output was truncated at " << max_output_bytes << " bytes\n";
  }
  return code;
}

int Run(const GlobalOptions& g, RunOptions o) {
  if (!o.cmd.empty()) {
    // Through the edge when one is configured (DSEC_URL) or running here; locally otherwise.
    RunThroughEdge r{o.image, o.user, o.workdir, o.tty, o.resources, o.timeout_s, o.env, o.cmd};
    if (!o.no_userns) {
      if (int code = MaybeRunThroughEdge(g, r); code >= 0) return code;
    }
  }
  if (geteuid() != 0) {
    std::cerr << "dsec: run needs root (it creates namespaces and cgroups); try sudo\n";
    return 125;
  }
  if (o.cmd.empty()) {
    std::cerr << "dsec: run needs a command: dsec run [flags] -- CMD [ARGS...]\n";
    return 125;
  }
  auto spec = LocalSpec(o);
  if (!spec.ok()) {
    std::cerr << "dsec: " << spec.status().message() << "\n";
    return 125;
  }

  // Signals the CLI forwards are handled by one thread; everything else blocks them.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGUSR1})
    sigaddset(&sigs, s);  // USR1: wake
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  backends::container::ContainerBackendOptions bo;
  bo.state_dir = g.state_dir;
  bo.features.userns = !o.no_userns;
  bo.orphan_timeout_ms = 0;            // nothing re-adopts a dsec run sandbox: it ends with us
  bo.socket_table_entries = 1u << 16;  // one sandbox (the edge's 2M costs ~50 ms to allocate)
  auto backend = backends::container::ContainerBackend::Create(bo);
  if (!backend.ok()) {
    std::cerr << "dsec: " << backend.status().message() << "\n";
    return 125;
  }
  auto shutdown = MakeScopeGuard([&] { (void)(*backend)->Shutdown(); });
  (void)(*backend)->CleanupOrphans();
  auto sb = (*backend)->Create(*spec);
  if (!sb.ok()) {
    std::cerr << "dsec: " << sb.status().message() << "\n";
    return 125;
  }

  bool tty =
      o.tty == "always" || (o.tty == "auto" && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO));
  backends::ExecRequest req = LocalExecRequest(o, tty);
  auto obs = std::make_shared<StreamObserver>(g.json && !tty);
  std::unique_ptr<RawTerminal> raw;
  if (tty) raw = std::make_unique<RawTerminal>();
  auto handle = (*sb)->StartExec(req, obs);
  if (!handle.ok()) {
    raw.reset();
    std::cerr << "dsec: " << handle.status().message() << "\n";
    (void)(*sb)->Destroy();
    return 125;
  }
  std::shared_ptr<backends::ExecHandle> h = *handle;

  std::atomic<bool> finished{false};
  std::thread signal_thread = ForwardStdinAndSignals(h, sigs, &finished, tty);

  auto result = obs->Wait();
  finished = true;
  pthread_kill(signal_thread.native_handle(), SIGUSR1);  // no wait for its 200 ms timeout
  signal_thread.join();
  raw.reset();
  int code = ReportResult(result, o, req.max_output_bytes);
  if (g.json && !tty && result.ok()) {
    auto [out, err] = obs->Captured();
    PrintResultJson(protocol::ToJson(*result), out, err);
  }
  if (Status s = (*sb)->Destroy(); !s.ok()) std::cerr << "dsec: cleanup: " << s.message() << "\n";
  return code;
}

}  // namespace

StatusOr<std::map<std::string, std::string>> ParseKeyValues(const std::vector<std::string>& kvs,
                                                            const char* flag) {
  std::map<std::string, std::string> out;
  for (const auto& kv : kvs) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument(std::string(flag) + " takes KEY=VALUE, not \"" + kv + "\"");
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

void RegisterRun(CLI::App& app, GlobalOptions& global, int* exit_code) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand("run", "Run a command in a fresh sandbox, then destroy it");
  run->add_option("--image", opts->image, "Image (default: host)");
  run->add_option("--cpu", opts->resources.cpu, "CPU cap in cores")->check(CLI::PositiveNumber);
  run->add_option("--memory", opts->resources.memory_mb, "Memory limit in MB")
      ->check(CLI::Range(16, 1 << 22));
  run->add_option("--pids", opts->resources.pids, "Process limit")->check(CLI::Range(8, 1 << 22));
  run->add_option("--disk", opts->resources.disk_mb, "Writable layer size in MB")
      ->check(CLI::Range(1, 1 << 22));
  run->add_option("--timeout", opts->timeout_s, "Kill the command after this many seconds")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--user", opts->user, "sandbox (default), root, or uid[:gid]");
  run->add_option("--workdir", opts->workdir, "Working directory (default /workspace)");
  run->add_option("--env", opts->env, "KEY=VALUE (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  run->add_option("--tty", opts->tty, "auto|always|never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  run->add_flag("--no-userns", opts->no_userns, "Force the no-user-namespace fallback");
  run->add_option("cmd", opts->cmd, "Command and arguments (after --)");
  run->callback([opts, &global, exit_code] {
    if (global.has_command) {
      if (!opts->cmd.empty()) {
        std::cerr << "dsec: unexpected argument \"" << opts->cmd[0] << "\" before --\n";
        *exit_code = 2;
        return;
      }
      opts->cmd = global.command;
    }
    *exit_code = Run(global, *opts);
  });
}

}  // namespace dsec::cli
