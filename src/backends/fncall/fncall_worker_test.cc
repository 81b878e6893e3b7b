// fncall workers through the container backend (privileged): a sandbox with a warm zygote,
// each call in fresh namespaces forked from it. The pool and API on top are tested live in
// tests/integration/test_edge_fncall.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>

#include "backends/container/container_backend.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"

namespace dsec::backends {
namespace {

struct Env {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<container::ContainerBackend> backend;
  std::string error;
};

Env& GetEnv() {
  static Env e;
  if (e.backend || !e.error.empty()) return e;
  if (geteuid() != 0) {
    e.error = "needs root";
    return e;
  }
  auto d = TempDir::Create("/tmp/dsec-fntest-");
  if (!d.ok()) {
    e.error = d.status().ToString();
    return e;
  }
  e.dir = std::make_unique<TempDir>(std::move(*d));
  container::ContainerBackendOptions o;
  o.state_dir = e.dir->path() + "/state";
  o.agent_path = DSEC_TEST_AGENT_PATH;
  o.zygote_path = DSEC_TEST_ZYGOTE_PATH;
  o.orphan_timeout_ms = 0;  // a killed test run leaves no agent behind
  auto b = container::ContainerBackend::Create(o);
  if (!b.ok()) {
    e.error = b.status().ToString();
    return e;
  }
  e.backend = std::move(*b);
  return e;
}

class FnCallWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Env& e = GetEnv();
    if (!e.backend) GTEST_SKIP() << "container backend unavailable: " << e.error;
    if (!e.backend->features().userns)
      GTEST_SKIP() << "fncall workers need user namespaces: "
                   << e.backend->features().userns_reason;
    backend_ = e.backend.get();
  }
  void TearDown() override {
    for (auto& sb : made_) EXPECT_TRUE(sb->Destroy().ok());
  }

  std::shared_ptr<Sandbox> Worker(WorkerSpec w, int64_t memory_mb = 256, int64_t pids = 128) {
    SandboxSpec spec;
    spec.id = NewSandboxId("fn");
    spec.worker = std::move(w);
    spec.resources.memory_mb = memory_mb;
    spec.resources.pids = pids;
    auto sb = backend_->Create(spec);
    EXPECT_TRUE(sb.ok()) << sb.status().ToString();
    if (!sb.ok()) return nullptr;
    made_.push_back(*sb);
    return *sb;
  }
  static std::shared_ptr<Sandbox> Python(FnCallWorkerTest* t) {
    WorkerSpec w;
    w.runtime = FnRuntime::kPython;
    w.preload = {"json"};
    return t->Worker(w);
  }
  static std::shared_ptr<Sandbox> Bash(FnCallWorkerTest* t) {
    WorkerSpec w;
    w.runtime = FnRuntime::kExec;
    w.command = {"/bin/bash", "-c"};
    return t->Worker(w);
  }

  static ExecOutput Call(Sandbox* sb, const std::string& code, int64_t timeout_ms = 10000,
                         std::string stdin_data = "",
                         std::vector<std::pair<std::string, std::string>> files = {},
                         uint64_t max_output = 1 << 20) {
    ExecRequest r;
    r.fncall = protocol::FnCallSpec{code, "", std::move(files)};
    r.timeout_ms = timeout_ms;
    r.stdin_data = std::move(stdin_data);
    r.max_output_bytes = max_output;
    auto out = sb->Exec(r);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : ExecOutput{};
  }

  container::ContainerBackend* backend_ = nullptr;
  std::vector<std::shared_ptr<Sandbox>> made_;
};

TEST_F(FnCallWorkerTest, PythonResultsStdinFilesAndErrors) {
  auto sb = Python(this);
  ASSERT_TRUE(sb);
  auto r = Call(sb.get(), "print(sum(range(10)))");
  EXPECT_EQ(r.result.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "45\n") << r.stderr_data;
  r = Call(sb.get(), "import sys; print(sys.stdin.read().upper())", 10000, "hello");
  EXPECT_EQ(r.stdout_data, "HELLO\n");
  r = Call(sb.get(), "print(open('in/data.txt').read())", 10000, "", {{"in/data.txt", "payload"}});
  EXPECT_EQ(r.stdout_data, "payload\n") << r.stderr_data;
  r = Call(sb.get(), "import sys; sys.exit(3)");
  EXPECT_EQ(r.result.exit_code, 3);
  r = Call(sb.get(), "raise ValueError('boom')");
  EXPECT_EQ(r.result.exit_code, 1);
  EXPECT_NE(r.stderr_data.find("ValueError: boom"), std::string::npos) << r.stderr_data;
  r = Call(sb.get(), "import os; print(os.getuid(), os.getpid(), os.getcwd())");
  EXPECT_EQ(r.stdout_data, "1000 2 /workspace\n") << r.stderr_data;
  // Every call is a fresh fork: random state differs, preloaded modules are there.
  auto a = Call(sb.get(), "import random; print(random.random())");
  auto b = Call(sb.get(), "import random; print(random.random())");
  EXPECT_NE(a.stdout_data, b.stdout_data);
  r = Call(sb.get(), "import sys; print('json' in sys.modules)");
  EXPECT_EQ(r.stdout_data, "True\n");
}

TEST_F(FnCallWorkerTest, NothingCarriesOverBetweenCalls) {
  auto sb = Python(this);
  ASSERT_TRUE(sb);
  auto r = Call(sb.get(),
                "import os, subprocess, json, sys\n"
                "open('/workspace/left.txt','w').write('x')\n"
                "open('/tmp/left.txt','w').write('x')\n"
                "subprocess.Popen(['sleep','600'], start_new_session=True)\n"
                "os.environ['LEFT']='1'\n"
                "json.LEFT = 1\n"
                "sys.modules['leftover'] = json\n");
  EXPECT_EQ(r.result.exit_code, 0) << r.stderr_data;
  r = Call(sb.get(),
           "import os, json, sys\n"
           "print(os.listdir('/workspace'), os.listdir('/tmp'), os.environ.get('LEFT'),\n"
           "      hasattr(json, 'LEFT'), 'leftover' in sys.modules)\n"
           "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n");
  EXPECT_EQ(r.stdout_data, "[] [] None False False\n[1, 2]\n") << r.stderr_data;
  // Nothing outside the fresh directories is writable.
  r = Call(sb.get(), "open('/etc/evil','w')");
  EXPECT_NE(r.stderr_data.find("Read-only file system"), std::string::npos) << r.stderr_data;
  r = Call(sb.get(), "import os; os.mkdir('/var/tmp/x')");
  EXPECT_NE(r.result.exit_code, 0);
}

TEST_F(FnCallWorkerTest, CallsHaveNoPrivileges) {
  auto sb = Python(this);
  ASSERT_TRUE(sb);
  auto r = Call(sb.get(),
                "for l in open('/proc/self/status'):\n"
                "    if l.startswith(('CapEff','CapPrm','CapBnd','Seccomp:','NoNewPrivs')):"
                " print(l.strip())\n");
  EXPECT_NE(r.stdout_data.find("CapEff:\t0000000000000000"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("CapPrm:\t0000000000000000"), std::string::npos);
  EXPECT_NE(r.stdout_data.find("Seccomp:\t2"), std::string::npos);
  EXPECT_NE(r.stdout_data.find("NoNewPrivs:\t1"), std::string::npos);
  // The full profile: no mounts, no new namespaces (the worker's looser one would allow them).
  r = Call(sb.get(),
           "import ctypes, os\n"
           "libc = ctypes.CDLL(None, use_errno=True)\n"
           "print(libc.unshare(0x00020000), ctypes.get_errno())\n"  // CLONE_NEWNS
           "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n");
  EXPECT_EQ(r.stdout_data, "-1 1\n-1 1\n") << r.stderr_data;
}

TEST_F(FnCallWorkerTest, TheCallCannotReachItsInitOrLeaveWritableMounts) {
  auto sb = Python(this);
  ASSERT_TRUE(sb);
  // The only fd the code holds beyond stdio is its exit code pipe: it carries no fds, so the
  // init can never be handed something to block on.
  auto r = Call(sb.get(),
                "import os, socket\n"
                "def kind(f):\n"
                "    try: return os.readlink(f'/proc/self/fd/{f}')\n"
                "    except OSError: return ''\n"
                "fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
                "extra = [f for f in fds if f > 2 and kind(f).startswith('pipe:')]\n"
                "print(len(extra))\n"
                "try:\n"
                "    socket.send_fds(socket.socket(fileno=os.dup(extra[0])), [b'x'], [0])\n"
                "    print('sent')\n"
                "except OSError as e:\n"
                "    print('refused', e.errno)\n");
  EXPECT_EQ(r.stdout_data, "1\nrefused 88\n") << r.stderr_data;  // ENOTSOCK
  // Every mount but the call's own tmpfs, /proc and /dev is read-only.
  r = Call(sb.get(),
           "for line in open('/proc/self/mountinfo'):\n"
           "    f = line.split()\n"
           "    t, opts = f[4], f[5].split(',')\n"
           "    if t in ('/workspace', '/tmp', '/dev/shm') or t.startswith(('/proc', '/dev')):\n"
           "        continue\n"
           "    if 'ro' not in opts: print('writable', t)\n"
           "print('checked')\n");
  EXPECT_EQ(r.stdout_data, "checked\n") << r.stderr_data;
  // The call's own /proc carries the sandbox's masks.
  r = Call(sb.get(),
           "print(len(open('/proc/kallsyms').read()))\n"
           "try:\n"
           "    open('/proc/sysrq-trigger', 'w').write('h')\n"
           "    print('wrote')\n"
           "except OSError as e:\n"
           "    print('refused')\n");
  EXPECT_EQ(r.stdout_data, "0\nrefused\n") << r.stderr_data;
  // A forked child that runs to the end does not end the call; threads are waited for.
  r = Call(sb.get(),
           "import os, time, threading\n"
           "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', flush=True)))"
           ".start()\n"
           "if os.fork() != 0:\n"
           "    time.sleep(0.3)\n"
           "    print('parent', flush=True)\n");
  EXPECT_NE(r.stdout_data.find("parent"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("thread"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.result.exit_code, 0);
}

TEST_F(FnCallWorkerTest, BombsAndTimeoutsAreContainedAndTheWorkerRecovers) {
  auto sb = Python(this);
  ASSERT_TRUE(sb);
  auto r = Call(sb.get(), "import time\nwhile True: time.sleep(1)", 300);
  EXPECT_TRUE(r.result.timed_out);
  r = Call(sb.get(), "x = bytearray(1 << 30)");  // beyond the worker's 256 MiB
  EXPECT_NE(r.result.exit_code, 0);
  EXPECT_TRUE(r.result.oom_killed || r.stderr_data.find("MemoryError") != std::string::npos)
      << r.stderr_data;
  // Contained either way: the pids limit holds it until the timeout, or (processes cost memory,
  // much more under ASan) the memory limit ends it first.
  r = Call(sb.get(), "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass", 1000);
  EXPECT_TRUE(r.result.timed_out || r.result.oom_killed)
      << "exit " << r.result.exit_code << " signal " << r.result.signal;
  r = Call(sb.get(), "import sys\nwhile True: sys.stdout.write('y' * 65536)", 2000, "", {},
           1 << 20);
  EXPECT_TRUE(r.result.stdout_truncated);
  EXPECT_EQ(r.stdout_data.size(), 1u << 20);
  for (int i = 0; i < 3; ++i) {
    r = Call(sb.get(), "print('still here')");
    EXPECT_EQ(r.stdout_data, "still here\n") << i << " " << r.stderr_data;
  }
}

TEST_F(FnCallWorkerTest, BashRuntime) {
  auto sb = Bash(this);
  ASSERT_TRUE(sb);
  auto r = Call(sb.get(), "echo $((6*7)); cat; id -u; sleep 600 & disown", 10000, "in\n");
  EXPECT_EQ(r.stdout_data, "42\nin\n1000\n") << r.stderr_data;
  r = Call(sb.get(), "ps -e -o comm= | grep -c '^sleep$'; ls -A /workspace /tmp");
  EXPECT_EQ(r.stdout_data, "0\n/tmp:\n\n/workspace:\n") << r.stderr_data;
  r = Call(sb.get(), "exit 7");
  EXPECT_EQ(r.result.exit_code, 7);
  // Signals at their defaults: `yes` dies of SIGPIPE instead of failing writes forever.
  r = Call(sb.get(), "yes | head -1; echo ${PIPESTATUS[0]}");
  EXPECT_EQ(r.stdout_data, "y\n141\n") << r.stderr_data;
}

}  // namespace
}  // namespace dsec::backends
