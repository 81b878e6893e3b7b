// The helper-process jail: a shell in it reports what it sees, and the test checks each item of
// the JailSpec held (namespaces, root, descriptors, credentials, rlimits, the error path).
#include "isolation/jail.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_util.h"
#include "base/unique_fd.h"

namespace dsec::isolation {
namespace {

class JailPrivilegedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for namespaces and mounts";
    if (access("/bin/sh", X_OK) != 0) GTEST_SKIP() << "no /bin/sh";
    char tmpl[] = "/tmp/dsec-jail-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) (void)RemoveTree(dir_);
  }
  // Runs `script` under /bin/sh in the jail; its stdout (fd 1) goes to a file returned.
  std::string Run(JailSpec spec, const std::string& script, int* exit_code) {
    std::string out = dir_ + "/out";
    UniqueFd o(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
    UniqueFd null(open("/dev/null", O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(o && null);
    spec.exe = "/bin/sh";
    spec.argv = {"sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.fds.insert(spec.fds.begin(), {{0, null.get()}, {1, o.get()}, {2, o.get()}});
    auto p = SpawnJailed(spec);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return "";
    auto e = p->Wait();
    EXPECT_TRUE(e.ok());
    *exit_code = e.ok() ? e->exit_code : -1;
    return ReadFileToString(out).value_or("");
  }
  JailSpec Minimal() {
    JailSpec s;
    s.namespaces = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
    s.root_at = dir_ + "/root";
    EXPECT_TRUE(mkdir(s.root_at.c_str(), 0755) == 0 || errno == EEXIST);
    s.ro_paths = {"/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/no/such/path"};
    s.devices = {"/dev/null"};
    s.proc = true;
    return s;
  }

  std::string dir_;
};

TEST_F(JailPrivilegedTest, TheMinimalRootNamespacesAndCredentials) {
  UniqueFd extra(open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd stray(open("/dev/null", O_RDONLY));  // not CLOEXEC: must still not reach the jail
  JailSpec s = Minimal();
  s.fds = {{7, extra.get()}};
  s.rlimits = {{RLIMIT_CORE, 0}, {RLIMIT_NOFILE, 77}};
  int rc = -1;
  std::string script = R"SH(
    echo "root: $(ls / | tr '\n' ' ')"
    echo "procs: $(ls /proc | grep -c '^[0-9]')"
    echo "self: $$"
    echo "fd7: $(readlink /proc/$$/fd/7)"
    test -e /proc/$$/fd/STRAY && echo "stray: inherited" || echo "stray: closed"
    echo "nofile: $(ulimit -n) core: $(ulimit -c)"
    echo "links: $(ls /proc/self/net 2>/dev/null | wc -l)"
    touch /usr/x 2>/dev/null && echo "usr: writable" || echo "usr: read-only"
    touch /x 2>/dev/null && echo "root: writable" || echo "root: read-only"
    echo hi > /dev/null && echo "devnull: ok"
    test -e /etc/passwd && echo "etc: leaked" || echo "etc: only what was listed"
  )SH";
  script.replace(script.find("STRAY"), 5, std::to_string(stray.get()));
  std::string out = Run(s, script, &rc);
  EXPECT_EQ(rc, 0) << out;
  // Only what was listed (and the skipped path made nothing).
  EXPECT_NE(out.find("root: bin dev etc lib lib64 proc usr "), std::string::npos) << out;
  // Its own pid namespace: it is PID 1 there, and /proc shows its processes only.
  EXPECT_NE(out.find("self: 1\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("procs: 0\n"), std::string::npos) << out;
  // The map's descriptors are there; one the edge left inheritable is not.
  EXPECT_NE(out.find("fd7: /dev/null"), std::string::npos) << out;
  EXPECT_NE(out.find("stray: closed"), std::string::npos) << out;
  EXPECT_NE(out.find("nofile: 77 core: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("usr: read-only"), std::string::npos) << out;
  EXPECT_NE(out.find("root: read-only"), std::string::npos) << out;
  EXPECT_NE(out.find("devnull: ok"), std::string::npos) << out;
  EXPECT_NE(out.find("etc: only what was listed"), std::string::npos) << out;
  // The host's tree is untouched: nothing was mounted over root_at out here.
  auto left = ListDir(s.root_at);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << s.root_at;
}

TEST_F(JailPrivilegedTest, CredentialsAreDroppedForGood) {
  JailSpec s = Minimal();
  s.uid = 65534;
  s.gid = 65533;
  s.groups = {65532};
  int rc = -1;
  std::string out = Run(s, R"SH(
    echo "ids: $(id -u) $(id -g) [$(id -G)]"
    grep -E '^(NoNewPrivs|CapEff):' /proc/self/status | tr -s '\t' ' '
  )SH",
                        &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ids: 65534 65533 [65533 65532]"), std::string::npos) << out;
  EXPECT_NE(out.find("NoNewPrivs: 1"), std::string::npos) << out;
  EXPECT_NE(out.find("CapEff: 0000000000000000"), std::string::npos) << out;
}

TEST_F(JailPrivilegedTest, SignalsStartAtTheirDefaults) {
  // What the edge ignores or blocks is not the helper's.
  struct sigaction ign {
  }, old_usr1{};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGUSR1, &ign, &old_usr1), 0);
  sigset_t usr2, old_mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &usr2, &old_mask), 0);
  int rc = -1;
  std::string out = Run(Minimal(), "grep -E '^Sig(Ign|Blk):' /proc/self/status", &rc);
  sigaction(SIGUSR1, &old_usr1, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SigBlk:\t0000000000000000"), std::string::npos) << out;
  EXPECT_NE(out.find("SigIgn:\t0000000000000000"), std::string::npos) << out;
}

TEST_F(JailPrivilegedTest, ItsOwnNetworkNamespaceHasOnlyLoopback) {
  int rc = -1;
  std::string out = Run(Minimal(), "cat /proc/self/net/dev", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("lo:"), std::string::npos) << out;
  // No other interface of the node.
  size_t lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 3u) << out;
}

TEST_F(JailPrivilegedTest, BeforeExecRunsFirstAndItsErrorKills) {
  JailSpec s = Minimal();
  pid_t seen = 0;
  s.before_exec = [&](pid_t pid) {
    seen = pid;
    return OkStatus();
  };
  int rc = -1;
  Run(s, "exit 3", &rc);
  EXPECT_GT(seen, 0);
  EXPECT_EQ(rc, 3);

  JailSpec bad = Minimal();
  bad.root_at = dir_ + "/root2";
  ASSERT_EQ(mkdir(bad.root_at.c_str(), 0755), 0);
  bad.exe = "/bin/sh";
  bad.argv = {"sh"};
  bad.before_exec = [](pid_t) { return FailedPrecondition("no cgroup for you"); };
  auto p = SpawnJailed(bad);
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(JailPrivilegedTest, FailuresInsideSayWhichStep) {
  JailSpec s = Minimal();
  s.exe = "/usr/bin/definitely-not-here";
  s.argv = {"x"};
  auto p = SpawnJailed(s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("exec"), std::string::npos) << p.status().ToString();

  JailSpec d = Minimal();
  d.devices = {"/usr"};  // not a device
  d.exe = "/bin/sh";
  d.argv = {"sh"};
  EXPECT_EQ(SpawnJailed(d).status().code(), StatusCode::kInvalidArgument);
  JailSpec r = Minimal();
  r.root_at = dir_ + "/missing";
  r.exe = "/bin/sh";
  r.argv = {"sh"};
  EXPECT_EQ(SpawnJailed(r).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::isolation
