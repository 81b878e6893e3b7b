#include "isolation/credentials.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file_util.h"

namespace dsec::isolation {
namespace {

TEST(CredentialsTest, RootSetIsReduced) {
  uint64_t r = RootCapabilities();
  EXPECT_TRUE(r & CapMask({CAP_CHOWN}));
  EXPECT_TRUE(r & CapMask({CAP_SETUID}));
  for (int c : {CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_MKNOD, CAP_NET_ADMIN, CAP_NET_RAW,
                CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_DAC_READ_SEARCH, CAP_SYS_CHROOT})
    EXPECT_FALSE(r & CapMask({c})) << c;
}

TEST(CredentialsTest, ParseCapLine) {
  EXPECT_EQ(ParseCapLine("Name:\tx\nCapEff:\t00000000000005fb\n", "CapEff"), 0x5fbu);
  EXPECT_EQ(ParseCapLine("CapEff:\t0\n", "CapPrm"), ~0ULL);
}

// The full sequence in a forked child: the child reports its /proc/self/status.
std::string StatusAfter(const ExecCredentials& c) {
  int p[2];
  EXPECT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    Status s = ApplyExecCredentials(c);
    std::string out = s.ok() ? *ReadFileToString("/proc/self/status") : "ERROR " + s.ToString();
    (void)!write(p[1], out.data(), out.size());
    _exit(0);
  }
  close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  waitpid(pid, nullptr, 0);
  return out;
}

TEST(CredentialsPrivilegedTest, UnprivilegedUserEndsWithNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  ExecCredentials c;
  c.uid = c.gid = 1000;
  std::string st = StatusAfter(c);
  ASSERT_EQ(st.find("ERROR"), std::string::npos) << st;
  for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_EQ(ParseCapLine(st, k), 0u) << k;
  EXPECT_NE(st.find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(st.find("Uid:\t1000\t1000\t1000\t1000"), std::string::npos);
  EXPECT_NE(st.find("Groups:\t \n"), std::string::npos);  // no supplementary groups
}

TEST(CredentialsPrivilegedTest, RootKeepsOnlyTheReducedSet) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  ExecCredentials c;
  c.uid = c.gid = 0;
  c.caps = RootCapabilities();
  c.rlimits.nofile = 1024;
  c.rlimits.fsize = 1 << 20;
  std::string st = StatusAfter(c);
  EXPECT_EQ(ParseCapLine(st, "CapEff"), RootCapabilities());
  EXPECT_EQ(ParseCapLine(st, "CapBnd"), RootCapabilities());
  EXPECT_EQ(ParseCapLine(st, "CapInh"), 0u);
}

TEST(CredentialsTest, RlimitsOnlyGoDown) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    rlimit low{64, 64};
    setrlimit(RLIMIT_NOFILE, &low);
    Rlimits r;
    r.nofile = 1 << 20;  // above the hard limit: clamped, not an error
    Status s = ApplyRlimits(r);
    rlimit now{};
    getrlimit(RLIMIT_NOFILE, &now);
    rlimit core{};
    getrlimit(RLIMIT_CORE, &core);
    uint64_t out[3] = {s.ok() ? 1u : 0u, now.rlim_max, core.rlim_max};
    (void)!write(p[1], out, sizeof out);
    _exit(0);
  }
  close(p[1]);
  uint64_t out[3] = {};
  ASSERT_EQ(read(p[0], out, sizeof out), static_cast<ssize_t>(sizeof out));
  close(p[0]);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 64u);
  EXPECT_EQ(out[2], 0u);
}

}  // namespace
}  // namespace dsec::isolation
