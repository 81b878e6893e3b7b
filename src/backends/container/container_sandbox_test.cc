// Real sandboxes through the container backend (privileged: needs root). Every test runs
// twice: with the kernel's newer features (user namespace + idmapped layers, clone into
// cgroup, cgroup.kill) and with all of them forced to their fallbacks.
#include "backends/container/container_instance.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "backends/container/container_backend.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"
#include "base/testing/poll.h"
#include "isolation/credentials.h"
#include "protocol/frame.h"

namespace dsec::backends::container {
namespace {

using protocol::kStderr;
using protocol::kStdout;

struct Mode {
  const char* name;
  bool modern;
};

// One backend per mode for the whole run (creating one probes the kernel and seals the agent).
struct Env {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<ContainerBackend> backend;
  std::string error;
};

Env& GetEnv(bool modern) {
  static std::map<bool, Env> envs;
  Env& e = envs[modern];
  if (e.backend || !e.error.empty()) return e;
  if (geteuid() != 0) {
    e.error = "needs root";
    return e;
  }
  auto d = TempDir::Create("/tmp/dsec-sbtest-");
  if (!d.ok()) {
    e.error = d.status().ToString();
    return e;
  }
  e.dir = std::make_unique<TempDir>(std::move(*d));
  ContainerBackendOptions o;
  o.state_dir = e.dir->path() + "/state";
  o.agent_path = DSEC_TEST_AGENT_PATH;
  if (!modern) {
    o.features.userns = false;
    o.features.clone_into_cgroup = false;
    o.features.cgroup_kill = false;
    o.netns_pool = 0;  // and a fresh network namespace per sandbox
  }
  auto b = ContainerBackend::Create(o);
  if (!b.ok()) {
    e.error = b.status().ToString();
    return e;
  }
  e.backend = std::move(*b);
  return e;
}

class ContainerPrivilegedTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    Env& e = GetEnv(GetParam().modern);
    if (!e.backend) GTEST_SKIP() << "container backend unavailable: " << e.error;
    backend_ = e.backend.get();
    if (GetParam().modern && !backend_->features().userns)
      GTEST_SKIP() << "user namespaces unavailable here: " << backend_->features().userns_reason;
  }
  void TearDown() override {
    for (auto& sb : made_) EXPECT_TRUE(sb->Destroy().ok());
  }

  std::shared_ptr<Sandbox> Create(SandboxSpec spec = {}) {
    if (spec.id.empty()) spec.id = NewSandboxId("t");
    auto sb = backend_->Create(spec);
    EXPECT_TRUE(sb.ok()) << sb.status().ToString();
    if (!sb.ok()) return nullptr;
    made_.push_back(*sb);
    return *sb;
  }
  // The container part of a sandbox this backend made.
  static ContainerInstance& Inst(const std::shared_ptr<Sandbox>& sb) {
    return static_cast<ContainerInstance&>(sb->instance());
  }

  static ExecOutput Sh(Sandbox* sb, const std::string& cmd, const std::string& user = "",
                       int64_t timeout_ms = 30000, uint64_t max_output = 1 << 20) {
    ExecRequest r;
    r.shell = cmd;
    r.user = user;
    r.timeout_ms = timeout_ms;
    r.max_output_bytes = max_output;
    auto out = sb->Exec(r);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : ExecOutput{};
  }

  // Copies the static probe into the sandbox and runs the named attempts as `user`.
  std::map<std::string, std::string> Probe(Sandbox* sb, const std::vector<std::string>& names,
                                           const std::string& user = "") {
    auto bin = ReadFileToString(DSEC_TEST_PROBE_PATH, 64 << 20);
    EXPECT_TRUE(bin.ok());
    EXPECT_TRUE(sb->WriteFile("/tmp/dsec-probe", *bin, 0755).ok());
    ExecRequest r;
    r.cmd = {"/tmp/dsec-probe"};
    for (const auto& n : names) r.cmd.push_back(n);
    r.user = user;
    auto out = sb->Exec(r);
    EXPECT_TRUE(out.ok());
    std::map<std::string, std::string> res;
    std::istringstream in(out->stdout_data);
    std::string line;
    while (std::getline(in, line)) {
      auto sp = line.find(' ');
      if (sp != std::string::npos) res[line.substr(0, sp)] = line.substr(sp + 1);
    }
    return res;
  }

  ContainerBackend* backend_ = nullptr;
  std::vector<std::shared_ptr<Sandbox>> made_;
};

std::string Trim(const std::string& s) { return std::string(TrimWhitespace(s)); }

TEST_P(ContainerPrivilegedTest, SeesOnlyItselfAsTheSandboxUser) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto o = Sh(sb.get(),
              "cat /proc/1/comm; hostname; whoami; id -u; echo $HOME; pwd; "
              "ls /proc | grep -c '^[0-9]'");
  EXPECT_EQ(o.result.exit_code, 0) << o.stderr_data;
  auto lines = SplitString(o.stdout_data, '\n', true);
  ASSERT_GE(lines.size(), 7u) << o.stdout_data;
  EXPECT_EQ(lines[0], "dsec-agent");
  EXPECT_EQ(lines[1], sb->id());
  EXPECT_EQ(lines[2], "sandbox");
  EXPECT_EQ(lines[3], "1000");
  EXPECT_EQ(lines[4], "/workspace");
  EXPECT_EQ(lines[5], "/workspace");
  // PID 1, sh, ls and grep: nothing of the host.
  EXPECT_LE(std::stoi(std::string(lines[6])), 5);
  auto py = Sh(sb.get(), "python3 -c 'import getpass; print(getpass.getuser())'");
  EXPECT_EQ(Trim(py.stdout_data), "sandbox") << py.stderr_data;
  auto git = Sh(sb.get(),
                "cd /workspace && git init -q r && cd r && echo x > f && git add f && "
                "git -c user.email=a@b -c user.name=a commit -qm m && git log --oneline | wc -l");
  EXPECT_EQ(Trim(git.stdout_data), "1") << git.stderr_data;
}

TEST_P(ContainerPrivilegedTest, UserCodeHasNoPrivileges) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto st = Sh(sb.get(), "cat /proc/self/status; cat /proc/self/uid_map");
  using isolation::ParseCapLine;
  for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_EQ(ParseCapLine(st.stdout_data, k), 0u) << k;
  EXPECT_NE(st.stdout_data.find("Seccomp:\t2"), std::string::npos);
  EXPECT_NE(st.stdout_data.find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(st.stdout_data.find("Uid:\t1000\t1000\t1000\t1000"), std::string::npos);
  if (GetParam().modern) {
    // uid 0 inside is not host root.
    EXPECT_EQ(st.stdout_data.find("         0          0 4294967295"), std::string::npos);
  }
  // Root in the sandbox keeps only the reduced set.
  auto root = Sh(sb.get(), "cat /proc/self/status", "root");
  EXPECT_EQ(ParseCapLine(root.stdout_data, "CapEff"), isolation::RootCapabilities());
  EXPECT_EQ(ParseCapLine(root.stdout_data, "CapBnd"), isolation::RootCapabilities());
  // Every thread of a multithreaded process is filtered.
  auto th =
      Sh(sb.get(),
         "python3 -c 'import threading,time; t=threading.Thread(target=time.sleep,args=(1,)); "
         "t.start(); import os; "
         "print(sorted(set(open(\"/proc/self/task/%s/status\" % "
         "x).read().split(\"Seccomp:\\t\")[1][0] "
         "for x in os.listdir(\"/proc/self/task\"))))'");
  EXPECT_EQ(Trim(th.stdout_data), "['2']") << th.stderr_data;
}

TEST_P(ContainerPrivilegedTest, EscapeAttemptsAreBlocked) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  std::vector<std::string> names = {"unshare_user",
                                    "unshare_net",
                                    "clone3",
                                    "mount_proc",
                                    "mount_sysfs",
                                    "mount_cgroup",
                                    "umount_proc_mask",
                                    "tiocsti",
                                    "bpf",
                                    "userfaultfd",
                                    "io_uring",
                                    "perf_event_open",
                                    "keyctl",
                                    "open_by_handle_at",
                                    "mknod_dev",
                                    "ptrace_pid1",
                                    "kill_pid1",
                                    "write_pid1_exe",
                                    "read_pid1_environ",
                                    "read_pid1_mem",
                                    "open_pid1_fd0",
                                    "list_pid1_fds",
                                    "readlink_pid1_fd",
                                    "pid1_map_files",
                                    "sysrq",
                                    "proc_sys_write",
                                    "read_kcore",
                                    "dev_mem",
                                    "dev_kvm",
                                    "sethostname",
                                    "chroot"};
  for (const std::string user : {"sandbox", "root"}) {
    auto res = Probe(sb.get(), names, user);
    for (const auto& n : names) {
      ASSERT_TRUE(res.count(n)) << n;
      // Root shares PID 1's uid, so two things "succeed" without giving anything: kill(1)
      // (PID 1 of a pid namespace ignores signals from inside; the agent is checked below)
      // and listing /proc/1/fd, which shows fd numbers, while reading or opening any of them
      // (readlink_pid1_fd, open_pid1_fd0) is refused: the agent is not dumpable.
      if ((n == "kill_pid1" || n == "list_pid1_fds") && user == "root") continue;
      EXPECT_EQ(res[n].rfind("blocked", 0), 0u) << user << ": " << n << " " << res[n];
    }
  }
  // Root inside shares PID 1's uid but cannot make it the OOM killer's first choice: the
  // write lands on a mask, and the agent's real value is untouched.
  Sh(sb.get(), "echo 1000 > /proc/1/oom_score_adj; echo 1000 > /proc/1/task/1/oom_score_adj",
     "root");
  auto adj = ReadFileToString("/proc/" + std::to_string(Inst(sb).agent_pid()) + "/oom_score_adj");
  ASSERT_TRUE(adj.ok());
  EXPECT_NE(Trim(*adj), "1000");
  // x32 syscalls kill the caller outright.
  auto x32 = sb->Exec({.cmd = {"/tmp/dsec-probe", "x32"}});
  ASSERT_TRUE(x32.ok());
  EXPECT_EQ(x32->result.signal, SIGSYS);
  // The agent survived everything and still serves.
  EXPECT_EQ(Trim(Sh(sb.get(), "cat /proc/1/comm").stdout_data), "dsec-agent");
}

TEST_P(ContainerPrivilegedTest, OnlyLoopback) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto o =
      Sh(sb.get(),
         "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
         "python3 - <<'EOF'\n"
         "import socket, threading\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
         "port = s.getsockname()[1]\n"
         "threading.Thread(target=lambda: s.accept()[0].sendall(b'pong'), daemon=True).start()\n"
         "c = socket.create_connection(('127.0.0.1', port)); print(c.recv(4).decode())\n"
         "try:\n"
         "    socket.create_connection(('10.0.0.1', 80), timeout=2); print('reached')\n"
         "except OSError as e:\n"
         "    print('unreachable', e.errno)\n"
         "EOF");
  EXPECT_EQ(o.stdout_data, "lo\npong\nunreachable 101\n") << o.stderr_data;
}

TEST_P(ContainerPrivilegedTest, ImageIsReadOnlyUnderTheOverlay) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  // Root inside writes into /etc (a copy-up in the writable layer; /etc has an upper dir). With
  // a user namespace the host's own directories are not idmapped, so root inside is a stranger
  // to them: writing /usr/bin or appending to /bin/bash is refused; without one (root is host
  // root with reduced capabilities), both are copy-ups. Either way the host never sees them.
  std::string tag = RandomHex(4);
  std::string etc_marker = "/etc/dsec-test-" + tag, marker = "/usr/bin/dsec-test-" + tag;
  auto e = Sh(sb.get(), "echo hi > " + etc_marker + " && cat " + etc_marker, "root");
  EXPECT_EQ(e.stdout_data, "hi\n") << e.stderr_data;
  auto w =
      Sh(sb.get(),
         "echo hi > " + marker + " && cat " + marker + " && echo x >> /bin/bash && echo appended",
         "root");
  if (backend_->features().userns) {
    EXPECT_NE(w.result.exit_code, 0);
    EXPECT_NE(w.stderr_data.find("Permission denied"), std::string::npos) << w.stderr_data;
  } else {
    EXPECT_EQ(w.stdout_data, "hi\nappended\n") << w.stderr_data;
  }
  struct stat st;
  EXPECT_NE(stat(marker.c_str(), &st), 0);  // the host never saw them
  EXPECT_NE(stat(etc_marker.c_str(), &st), 0);
  auto denied = Sh(sb.get(), "echo x > /usr/bin/nope");
  EXPECT_NE(denied.result.exit_code, 0);
  // Secrets and the edge's own state are not there at all.
  auto hidden = Sh(sb.get(),
                   "ls /etc/shadow /etc/gshadow " + backend_->Describe().substr(0, 0) +
                       "/root/.bashrc 2>&1; ls /home | wc -l; ls -d /var/lib 2>&1",
                   "root");
  EXPECT_NE(hidden.stdout_data.find("/etc/shadow': No such file"), std::string::npos)
      << hidden.stdout_data;
}

TEST_P(ContainerPrivilegedTest, MemoryBombIsOomKilledAndReported) {
  SandboxSpec spec;
  spec.resources.memory_mb = 64;
  spec.resources.disk_mb = 16;
  auto sb = Create(spec);
  ASSERT_TRUE(sb);
  auto o = Sh(sb.get(), "exec python3 -c 'x=[]\nwhile True: x.append(b\"x\" * (1<<20))'");
  EXPECT_TRUE(o.result.oom_killed);
  EXPECT_EQ(o.result.signal, SIGKILL);
  EXPECT_EQ(o.result.exit_code, 137);
  auto st = sb->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->oom_kills, 1u);
  // The agent and the sandbox carry on.
  EXPECT_EQ(Trim(Sh(sb.get(), "echo alive").stdout_data), "alive");
  EXPECT_EQ(sb->state(), SandboxState::kRunning);
}

TEST_P(ContainerPrivilegedTest, ForkBombStopsAtThePidsLimit) {
  SandboxSpec spec;
  spec.resources.pids = 64;
  auto sb = Create(spec);
  ASSERT_TRUE(sb);
  auto o = Sh(sb.get(),
              "python3 -c '\n"
              "import os\n"
              "n = 0\n"
              "try:\n"
              "    while True:\n"
              "        if os.fork() == 0:\n"
              "            import time; time.sleep(60)\n"
              "        n += 1\n"
              "except OSError as e:\n"
              "    print(n, e.errno)\n'",
              "", 20000);
  std::string trimmed = Trim(o.stdout_data);  // SplitString returns views into it
  auto parts = SplitString(trimmed, ' ');
  ASSERT_EQ(parts.size(), 2u) << o.stdout_data << o.stderr_data;
  EXPECT_LT(std::stoi(std::string(parts[0])), 64);
  EXPECT_EQ(parts[1], "11");  // EAGAIN
  EXPECT_LE(sb->Stats()->pids, 64u);
  // The way out: kill every user process; the agent survives.
  auto n = sb->SignalAll(SIGKILL);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_GE(*n, 50);
  dsec::testing::PollUntil([&] { return sb->Stats()->pids <= 1; });
  EXPECT_EQ(sb->Stats()->pids, 1u);
  EXPECT_EQ(Trim(Sh(sb.get(), "echo ok").stdout_data), "ok");
}

TEST_P(ContainerPrivilegedTest, DiskAndInodesFillToEnospc) {
  SandboxSpec spec;
  spec.resources.disk_mb = 8;
  auto sb = Create(spec);
  ASSERT_TRUE(sb);
  auto d = Sh(sb.get(), "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; echo rc=$?");
  EXPECT_NE(d.stdout_data.find("No space left on device"), std::string::npos) << d.stdout_data;
  EXPECT_FALSE(d.result.oom_killed);
  auto st = sb->Stats();
  EXPECT_GE(st->disk_used, 6u << 20);
  EXPECT_LE(st->disk_used, 9u << 20);
  Sh(sb.get(), "rm -f /workspace/big");
  auto i = Sh(sb.get(),
              "cd /tmp; n=0; while touch f$n 2>/dev/null; do n=$((n+1)); done; echo $n; "
              "touch again 2>&1");
  auto lines = SplitString(i.stdout_data, '\n', true);
  ASSERT_EQ(lines.size(), 2u) << i.stdout_data;
  EXPECT_LE(std::stoi(std::string(lines[0])), 4096);
  EXPECT_GE(std::stoi(std::string(lines[0])), 3000);
  EXPECT_NE(lines[1].find("No space left"), std::string::npos);
}

TEST_P(ContainerPrivilegedTest, OutputFloodIsCappedAndTheAgentStaysSmall) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto o = Sh(sb.get(), "head -c 300000000 /dev/zero; yes | head -c 100000000 >&2; echo done >&2",
              "", 60000, 1 << 20);
  EXPECT_EQ(o.result.exit_code, 0);
  EXPECT_TRUE(o.result.stdout_truncated);
  EXPECT_TRUE(o.result.stderr_truncated);
  EXPECT_EQ(o.stdout_data.size(), 1u << 20);
  EXPECT_EQ(o.stderr_data.size(), 1u << 20);
  EXPECT_EQ(o.result.stdout_bytes, 300000000u);
  EXPECT_EQ(o.result.stderr_bytes, 100000005u);
  auto status = ReadFileToString("/proc/" + std::to_string(Inst(sb).agent_pid()) + "/status");
  ASSERT_TRUE(status.ok());
  auto pos = status->find("VmHWM:");
  ASSERT_NE(pos, std::string::npos);
#if defined(__SANITIZE_ADDRESS__)
  const unsigned long kMaxAgentRssKb = 128 * 1024;  // ASan's shadow memory and quarantine
#else
  const unsigned long kMaxAgentRssKb = 32 * 1024;
#endif
  EXPECT_LT(std::stoul(status->substr(pos + 6)), kMaxAgentRssKb) << "agent peak RSS in kB";
}

TEST_P(ContainerPrivilegedTest, TimeoutKillsTheWholeTree) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  Stopwatch sw;
  auto o = Sh(sb.get(), "sleep 1000 & setsid sleep 1001 & (sleep 1002 &); sleep 1003", "", 500);
  EXPECT_TRUE(o.result.timed_out);
  EXPECT_LT(sw.ElapsedMs(), 5000);
  EXPECT_TRUE(dsec::testing::PollUntil(
      [&] { return Trim(Sh(sb.get(), "pgrep -c sleep; true").stdout_data) == "0"; }, 5000));
  // Without a timeout, background children outlive the command (their later output is not
  // collected) until something kills them.
  auto bg = Sh(sb.get(), "sleep 30 >/dev/null 2>&1 & echo started");
  EXPECT_EQ(Trim(bg.stdout_data), "started");
  EXPECT_FALSE(bg.result.timed_out);
  EXPECT_EQ(Trim(Sh(sb.get(), "pgrep -c sleep").stdout_data), "1");
  // A background child that keeps writing to the finished command's stdout keeps running: its
  // output is drained and dropped, it does not block or die of SIGPIPE.
  auto noisy =
      Sh(sb.get(),
         "(while true; do echo tick; sleep 0.05; done) & echo $! > /tmp/noisy.pid; echo first");
  EXPECT_NE(noisy.stdout_data.find("first\n"), std::string::npos) << noisy.stdout_data;
  usleep(300000);  // (a while of its writing, not a wait for an event)
  EXPECT_EQ(Sh(sb.get(), "kill -0 $(cat /tmp/noisy.pid)").result.exit_code, 0);
}

// port_connect (what the port proxy of a microVM uses) in any kind's agent: 3 MiB each way
// through a 1 MiB window, both directions at once, ends propagated both ways.
TEST_P(ContainerPrivilegedTest, TheAgentRelaysAPortConnection) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  Sh(sb.get(),
     "python3 -c 'import socket\n"
     "l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
     "l.bind((\"127.0.0.1\", 8765)); l.listen(1); c, _ = l.accept()\n"
     "while True:\n"
     "    d = c.recv(65536)\n"
     "    if not d: break\n"
     "    c.sendall(d)\n"
     "c.shutdown(socket.SHUT_WR)' >/dev/null 2>&1 &");
  EXPECT_EQ(sb->ConnectPortViaAgent(9).status().code(), StatusCode::kUnavailable);
  StatusOr<UniqueFd> conn = Unavailable("not yet");
  for (int i = 0; i < 200 && !conn.ok(); ++i) {
    conn = sb->ConnectPortViaAgent(8765);
    if (!conn.ok()) usleep(50 * 1000);
  }
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  int fd = conn->get();
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string sent(3 << 20, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>((i * 7919) >> 3);
  std::thread writer([&] {
    EXPECT_TRUE(WriteAllFd(fd, sent, "relay").ok());
    shutdown(fd, SHUT_WR);
  });
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  writer.join();
  EXPECT_EQ(got.size(), sent.size());
  EXPECT_TRUE(got == sent) << "the echo differs";
}

TEST_P(ContainerPrivilegedTest, ExitCodesSignalsStdinAndErrors) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  EXPECT_EQ(Sh(sb.get(), "exit 42").result.exit_code, 42);
  auto sig = Sh(sb.get(), "kill -TERM $$");
  EXPECT_EQ(sig.result.signal, SIGTERM);
  EXPECT_EQ(sig.result.exit_code, 128 + SIGTERM);
  ExecRequest r;
  r.cmd = {"nosuchcommand"};
  auto nf = sb->Exec(r);
  ASSERT_TRUE(nf.ok());
  EXPECT_EQ(nf->result.exit_code, 127);
  EXPECT_NE(nf->stderr_data.find("nosuchcommand"), std::string::npos);
  r.cmd = {"tr", "a-z", "A-Z"};
  r.stdin_data = "hello\n";
  EXPECT_EQ(sb->Exec(r)->stdout_data, "HELLO\n");
  // Large stdin is streamed with flow control.
  r.cmd = {"wc", "-c"};
  r.stdin_data = std::string(3 << 20, 'x');
  EXPECT_EQ(Trim(sb->Exec(r)->stdout_data), std::to_string(3 << 20));
  r.cmd = {"pwd"};
  r.stdin_data.clear();
  r.cwd = "/nonexistent";
  auto cwd = sb->Exec(r);
  EXPECT_EQ(cwd->result.exit_code, 127);
  EXPECT_NE(cwd->stderr_data.find("chdir"), std::string::npos);
  r.cwd = "";
  r.env = {{"FOO", "bar"}};
  r.cmd = {"sh", "-c", "echo $FOO $PATH"};
  EXPECT_EQ(sb->Exec(r)->stdout_data,
            "bar /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
  // Bad requests are errors, not crashes.
  ExecRequest bad;
  EXPECT_EQ(sb->Exec(bad).status().code(), StatusCode::kInvalidArgument);
  bad.cmd = {"true"};
  bad.user = "nobody-here";
  EXPECT_EQ(sb->Exec(bad).status().code(), StatusCode::kInvalidArgument);
  bad.user = "";
  bad.cwd = "relative";
  EXPECT_EQ(sb->Exec(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(ContainerPrivilegedTest, InteractiveTty) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  ExecRequest r;
  r.cmd = {"sh", "-c", "tty; stty size; test -t 0 && echo isatty"};
  r.tty = true;
  r.cols = 100;
  r.rows = 30;
  auto o = sb->Exec(r);
  ASSERT_TRUE(o.ok());
  EXPECT_NE(o->stdout_data.find("/dev/pts/"), std::string::npos) << o->stdout_data;
  EXPECT_NE(o->stdout_data.find("30 100"), std::string::npos);
  EXPECT_NE(o->stdout_data.find("isatty"), std::string::npos);
}

TEST_P(ContainerPrivilegedTest, ShellSessionsPersistState) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto sh = sb->OpenShell("");
  ASSERT_TRUE(sh.ok()) << sh.status().ToString();
  EXPECT_EQ(sb->RunShell(*sh, "cd /tmp && export FOO=bar && x() { echo fn; }")->result.exit_code,
            0);
  auto o = sb->RunShell(*sh, "pwd; echo $FOO; x");
  EXPECT_EQ(o->stdout_data, "/tmp\nbar\nfn\n");
  auto nonl = sb->RunShell(*sh, "printf abc; printf err >&2; false");
  EXPECT_EQ(nonl->stdout_data, "abc");
  EXPECT_EQ(nonl->stderr_data, "err");
  EXPECT_EQ(nonl->result.exit_code, 1);
  EXPECT_EQ(sb->RunShell(*sh, "sleep 100 & echo $! > /tmp/bg")->result.exit_code, 0);
  EXPECT_EQ(Trim(sb->RunShell(*sh, "jobs | wc -l")->stdout_data), "1");
  // A timeout kills the command, not the session.
  auto t = sb->RunShell(*sh, "sleep 60", 300);
  EXPECT_TRUE(t->result.timed_out);
  EXPECT_EQ(sb->RunShell(*sh, "echo $FOO")->stdout_data, "bar\n");
  // Markers in output cannot confuse the framing (they are random per command).
  EXPECT_EQ(sb->RunShell(*sh, "echo __DSEC_0123456789abcdef0123456789abcdef__")->stdout_data,
            "__DSEC_0123456789abcdef0123456789abcdef__\n");
  auto bye = sb->RunShell(*sh, "exit 3");
  EXPECT_EQ(bye->result.exit_code, 3);
  EXPECT_FALSE(sb->RunShell(*sh, "echo again").ok());
  EXPECT_TRUE(sb->CloseShell(*sh).ok());
  EXPECT_EQ(sb->CloseShell(*sh).code(), StatusCode::kNotFound);
}

TEST_P(ContainerPrivilegedTest, ShellsCanBeOpenedAndClosedForever) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  for (int i = 0; i < 80; ++i) {  // more than the concurrent exec limit (64)
    auto sh = sb->OpenShell("");
    ASSERT_TRUE(sh.ok()) << i << ": " << sh.status().ToString();
    if (i % 2) {
      EXPECT_EQ(sb->RunShell(*sh, "sleep 30 &")->result.exit_code, 0);
    }
    ASSERT_TRUE(sb->CloseShell(*sh).ok());
  }
  EXPECT_EQ(Trim(Sh(sb.get(), "echo still").stdout_data), "still");
  dsec::testing::PollUntil([&] { return sb->Stats()->pids <= 1; });
  EXPECT_EQ(sb->Stats()->pids, 1u);  // closing a shell ends its background jobs too
}

TEST_P(ContainerPrivilegedTest, HugeDirectoryListingIsBounded) {
  SandboxSpec spec;
  spec.resources.disk_mb = 256;  // 65536 inodes
  auto sb = Create(spec);
  ASSERT_TRUE(sb);
  auto mk = Sh(sb.get(),
               "python3 -c 'import os\nfor i in range(30000): open(\"/workspace/\" + \"n\" * 60 + "
               "str(i), \"w\")'");
  ASSERT_EQ(mk.result.exit_code, 0) << mk.stderr_data;
  auto ls = sb->ListDir("/workspace");  // would be ~3 MB of JSON: truncated, never hung
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  EXPECT_GT(ls->size(), 1000u);
  EXPECT_LT(ls->size(), 30000u);
}

TEST_P(ContainerPrivilegedTest, FilesStayInsideTheSandbox) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  std::string blob;
  for (int i = 0; i < 300000; ++i) blob.push_back(static_cast<char>(i * 7));
  ASSERT_TRUE(sb->WriteFile("/workspace/a/b/c.bin", blob, 0640).ok());
  EXPECT_EQ(*sb->ReadFile("/workspace/a/b/c.bin", 1 << 20), blob);
  EXPECT_EQ(sb->ReadFile("/workspace/a/b/c.bin", 10)->size(), 10u);
  EXPECT_EQ(Trim(Sh(sb.get(), "stat -c '%U %a' /workspace/a/b/c.bin /workspace/a").stdout_data),
            "sandbox 640\nsandbox 755");
  auto ls = sb->ListDir("/workspace/a/b");
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ(ls->size(), 1u);
  EXPECT_EQ((*ls)[0].name, "c.bin");
  EXPECT_EQ((*ls)[0].size, blob.size());
  EXPECT_EQ(sb->Stat("/workspace/a")->type, "dir");
  // Symlinks resolve inside the sandbox: "/" is the sandbox's root, never the host's.
  std::string host_marker = "/tmp/dsec-host-marker-" + RandomHex(4);
  Sh(sb.get(),
     "ln -s / /workspace/root_link; ln -s ../../../../../../tmp /workspace/up_link; "
     "ln -s /proc/self/root /workspace/magic");
  ASSERT_TRUE(sb->WriteFile("/workspace/root_link" + host_marker, "x", 0644).ok());
  ASSERT_TRUE(sb->WriteFile("/workspace/up_link/" + host_marker.substr(5), "y", 0644).ok());
  struct stat st;
  EXPECT_NE(stat(host_marker.c_str(), &st), 0);
  EXPECT_EQ(Trim(Sh(sb.get(), "cat " + host_marker).stdout_data), "y");
  EXPECT_FALSE(sb->ReadFile("/workspace/magic/etc/hostname", 100).ok());  // magic link refused
  // Kernel files, devices and FIFOs are refused without hanging.
  EXPECT_FALSE(sb->ReadFile("/proc/self/mem", 100).ok());
  EXPECT_FALSE(sb->ReadFile("/proc/1/environ", 100).ok());
  EXPECT_FALSE(sb->ReadFile("/dev/zero", 100).ok());
  Sh(sb.get(), "mkfifo /workspace/fifo");
  EXPECT_FALSE(sb->ReadFile("/workspace/fifo", 100).ok());
  EXPECT_FALSE(sb->WriteFile("/proc/sys/kernel/hostname", "x", 0644).ok());
  EXPECT_FALSE(sb->WriteFile("/etc/passwd", "x", 0644).ok());  // as the sandbox user
  EXPECT_EQ(sb->ReadFile("relative", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sb->ReadFile("/nope", 10).status().code(), StatusCode::kNotFound);
  // Tar round trip.
  auto tar = sb->CreateTar("/workspace/a", 64 << 20);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  ASSERT_TRUE(sb->ExtractTar("/workspace/copy", *tar).ok());
  EXPECT_EQ(*sb->ReadFile("/workspace/copy/b/c.bin", 1 << 20), blob);
  ASSERT_TRUE(sb->Remove("/workspace/a", true).ok());
  EXPECT_EQ(sb->Stat("/workspace/a").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(sb->Remove("/", true).ok());
  ASSERT_TRUE(sb->MakeDir("/workspace/m/n", 0700).ok());
  EXPECT_EQ(sb->Stat("/workspace/m/n")->mode, 0700u);
}

// Uploads the edge spooled to a file go to the agent a piece at a time (AgentClient::
// CallSyncUpload): whole files and archives arrive intact; a refused one ends early.
TEST_P(ContainerPrivilegedTest, UploadsStreamFromAFile) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  std::string blob(9 << 20, '\0');  // several windows' worth
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 131) >> 3);
  UniqueFd f(memfd_create("upload", MFD_CLOEXEC));
  ASSERT_TRUE(f.valid());
  ASSERT_TRUE(WriteAllFd(f.get(), blob, "memfd").ok());
  ASSERT_EQ(lseek(f.get(), 123, SEEK_SET), 123);  // read from offset 0 whatever the position
  Status w = sb->WriteFile("/workspace/streamed.bin", UploadBody(f.get(), blob.size()), 0600);
  ASSERT_TRUE(w.ok()) << w.ToString();
  EXPECT_EQ(*sb->ReadFile("/workspace/streamed.bin", 16 << 20), blob);
  EXPECT_EQ(Trim(Sh(sb.get(), "stat -c %a /workspace/streamed.bin").stdout_data), "600");
  // An empty body and a refused one (the target is a directory: the agent answers at once).
  UniqueFd empty(memfd_create("empty", MFD_CLOEXEC));
  ASSERT_TRUE(sb->WriteFile("/workspace/empty", UploadBody(empty.get(), 0), 0644).ok());
  EXPECT_EQ(sb->Stat("/workspace/empty")->size, 0u);
  EXPECT_FALSE(sb->WriteFile("/workspace", UploadBody(f.get(), blob.size()), 0644).ok());
  // A file shorter than the size it claims: an error, never a hang.
  EXPECT_FALSE(sb->WriteFile("/workspace/short", UploadBody(empty.get(), 4096), 0644).ok());
  // An archive from a file.
  auto tar = sb->CreateTar("/workspace", 64 << 20);
  ASSERT_TRUE(tar.ok()) << tar.status().ToString();
  UniqueFd t(memfd_create("tar", MFD_CLOEXEC));
  ASSERT_TRUE(WriteAllFd(t.get(), *tar, "memfd").ok());
  Status x = sb->ExtractTar("/workspace/copy", UploadBody(t.get(), tar->size()));
  ASSERT_TRUE(x.ok()) << x.ToString();
  EXPECT_EQ(*sb->ReadFile("/workspace/copy/streamed.bin", 16 << 20), blob);
  EXPECT_EQ(Trim(Sh(sb.get(), "echo alive").stdout_data), "alive");
}

TEST_P(ContainerPrivilegedTest, PauseResumeStatsAndSignals) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  Sh(sb.get(), "sleep 100 >/dev/null &");
  ASSERT_TRUE(sb->Pause().ok());
  EXPECT_EQ(sb->state(), SandboxState::kPaused);
  auto st = sb->Stats();  // works while frozen
  ASSERT_TRUE(st.ok());
  EXPECT_GE(st->pids, 2u);
  EXPECT_GT(st->memory_current, 0u);
  // Any call resumes transparently.
  EXPECT_EQ(Trim(Sh(sb.get(), "echo back").stdout_data), "back");
  EXPECT_EQ(sb->state(), SandboxState::kRunning);
  EXPECT_GE(sb->Stats()->exec_count, 2u);
  EXPECT_GE(*sb->SignalAll(SIGTERM), 1);
  dsec::testing::PollUntil([&] { return sb->Stats()->pids <= 1; });
  EXPECT_EQ(sb->Stats()->pids, 1u);
}

TEST_P(ContainerPrivilegedTest, AgentChannelReconnectNeedsTheSecret) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  auto connect_and = [&](const std::string& secret) -> protocol::Frame {
    UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    UniqueFd dir(open(Inst(sb).dir().c_str(), O_PATH | O_CLOEXEC));
    snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/agent.sock", dir.get());
    EXPECT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::string f = protocol::EncodeFrameOrDie(protocol::FrameType::kAuth, 0, 0,
                                               protocol::Json({{"secret", secret}}).dump());
    f += protocol::EncodeFrameOrDie(protocol::FrameType::kRequest, 0, 7, R"({"op":"ping"})");
    EXPECT_EQ(write(s.get(), f.data(), f.size()), static_cast<ssize_t>(f.size()));
    protocol::FrameDecoder dec;
    protocol::Frame out;
    char buf[4096];
    timeval tv{5, 0};
    setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (!dec.Next(&out)) {
      ssize_t n = read(s.get(), buf, sizeof buf);
      if (n <= 0) return {};
      (void)dec.Feed(std::string_view(buf, static_cast<size_t>(n)));
    }
    return out;
  };
  EXPECT_EQ(connect_and("wrong").type, protocol::FrameType::kError);
  EXPECT_EQ(Trim(Sh(sb.get(), "echo still").stdout_data), "still");  // unaffected
  auto hello = connect_and(Inst(sb).secret());
  EXPECT_EQ(hello.type, protocol::FrameType::kHello);
  // That edge replaced ours: the original connection is gone and the sandbox reports it.
  dsec::testing::PollUntil([&] { return sb->state() != SandboxState::kRunning; });
  EXPECT_EQ(sb->state(), SandboxState::kFailed);
}

TEST_P(ContainerPrivilegedTest, AgentDeathFailsTheSandbox) {
  auto sb = Create();
  ASSERT_TRUE(sb);
  ASSERT_EQ(kill(Inst(sb).agent_pid(), SIGKILL), 0);
  dsec::testing::PollUntil([&] { return sb->state() != SandboxState::kRunning; });
  EXPECT_EQ(sb->state(), SandboxState::kFailed);
  EXPECT_EQ(sb->reason(), "agent exited");
  EXPECT_EQ(sb->Exec({.cmd = {"true"}}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(sb->Destroy().ok());
  EXPECT_TRUE(sb->Destroy().ok());
}

TEST_P(ContainerPrivilegedTest, BadSpecsAreRejected) {
  SandboxSpec s;
  s.id = "../x";
  EXPECT_EQ(backend_->Create(s).status().code(), StatusCode::kInvalidArgument);
  s.id = NewSandboxId("t");
  s.resources.memory_mb = -1;
  EXPECT_EQ(backend_->Create(s).status().code(), StatusCode::kInvalidArgument);
  s.resources.memory_mb = 512;
  s.image = "nope";
  EXPECT_EQ(backend_->Create(s).status().code(), StatusCode::kNotFound);
  s.image = "host";
  auto a = Create(s);
  ASSERT_TRUE(a);
  EXPECT_EQ(backend_->Create(s).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Trim(Sh(a.get(), "echo fine").stdout_data), "fine");  // the first one is untouched
}

// Counts what sandboxes leave behind on the host.
struct Residue {
  size_t mounts = 0, cgroups = 0, processes = 0, fds = 0, threads = 0, state_entries = 0;
  bool operator==(const Residue& o) const {
    return mounts == o.mounts && cgroups == o.cgroups && processes == o.processes && fds == o.fds &&
           threads == o.threads && state_entries == o.state_entries;
  }
};

size_t CountDir(const std::string& p, bool recursive_dirs) {
  size_t n = 0;
  DIR* d = opendir(p.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (!recursive_dirs) {
      ++n;
    } else if (e->d_type == DT_DIR) {
      n += 1 + CountDir(p + "/" + e->d_name, true);
    }
  }
  closedir(d);
  return n;
}

Residue Measure(const ContainerBackend& b, const std::string& state) {
  Residue r;
  // Destroyed sandboxes' disk images are unmounted a moment later, off the destroy's path.
  dsec::testing::PollUntil([&] { return b.DiskReleasesPending() == 0; });
  // Only mounts under this test's directory (state, sandboxes, disks, lxcfs): other edges on
  // the host mount and unmount their own meanwhile.
  const std::string root = state.substr(0, state.rfind('/')) + "/";
  const std::string mountinfo = ReadFileToString("/proc/self/mountinfo", 1 << 22).value_or("");
  for (std::string_view line : SplitString(mountinfo, '\n', true)) {
    auto fields = SplitString(line, ' ', true);
    if (fields.size() > 4 && fields[4].substr(0, root.size()) == root) ++r.mounts;
  }
  for (const char* h : {"memory", "pids", "cpu", "unified", "freezer", ""})
    r.cgroups += CountDir(std::string("/sys/fs/cgroup/") + h + "/dsec-" + b.instance_id(), true);
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    if (!isdigit(e->d_name[0])) continue;
    // Only this backend's agents: anything else on the host is not ours to count.
    auto comm = ReadFileToString(std::string("/proc/") + e->d_name + "/comm");
    auto cg = ReadFileToString(std::string("/proc/") + e->d_name + "/cgroup");
    if (comm.ok() && Trim(*comm) == "dsec-agent" && cg.ok() &&
        cg->find("dsec-" + b.instance_id()) != std::string::npos)
      ++r.processes;
  }
  closedir(d);
  r.fds = CountDir("/proc/self/fd", false);
  r.threads = CountDir("/proc/self/task", false);
  r.state_entries = CountDir(state + "/sandboxes", false);
  return r;
}

TEST_P(ContainerPrivilegedTest, ManyCyclesLeaveNothingBehind) {
  const int cycles = GetParam().modern ? 1000 : 200;
  std::string state = GetEnv(GetParam().modern).dir->path() + "/state";
  // Warm up (fills the network namespace pool to its steady size).
  for (int i = 0; i < 4; ++i) {
    auto sb = Create();
    ASSERT_TRUE(sb);
  }
  for (auto& sb : made_) ASSERT_TRUE(sb->Destroy().ok());
  made_.clear();
  Residue before = Measure(*backend_, state);
  for (int i = 0; i < cycles; ++i) {
    SandboxSpec spec;
    spec.id = NewSandboxId("cyc");
    auto sb = backend_->Create(spec);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    if (i % 10 == 0) {
      auto o = (*sb)->Exec({.cmd = {"true"}});
      ASSERT_TRUE(o.ok());
    }
    ASSERT_TRUE((*sb)->Destroy().ok());
  }
  // Threads that served the last sandbox end on their own, a moment after its Destroy (slower
  // under ASan on a loaded host): wait for them, then count everything.
  dsec::testing::PollUntil([&] { return CountDir("/proc/self/task", false) <= before.threads; });
  Residue after = Measure(*backend_, state);
  EXPECT_EQ(before.mounts, after.mounts);
  EXPECT_EQ(before.cgroups, after.cgroups);
  EXPECT_EQ(after.processes, 0u);
  EXPECT_EQ(before.fds, after.fds);
  EXPECT_EQ(before.threads, after.threads);
  EXPECT_EQ(after.state_entries, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, ContainerPrivilegedTest,
                         ::testing::Values(Mode{"Modern", true}, Mode{"Fallbacks", false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dsec::backends::container
