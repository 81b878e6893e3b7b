// PrepareNodeBudget against a fake /proc/sys tree: what it raises, what it leaves, and how it
// sizes the per-sandbox shares from the values in force.
#include "edge/node_budget.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "base/file_util.h"

namespace dsec::edge {
namespace {

class NodeBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Create("/tmp/dsec-nodebudget-");
    ASSERT_TRUE(t.ok());
    dir_.emplace(std::move(*t));
    for (const char* d : {"fs", "kernel/pty", "net/ipv4"})
      ASSERT_TRUE(MakeDirs(dir_->path() + "/" + d, 0755).ok());
    Put("fs/file-max", "2466093\n");
    Put("fs/aio-max-nr", "65536\n");
    Put("kernel/pid_max", "32768\n");
    Put("kernel/threads-max", "192724\n");
    Put("kernel/pty/max", "4096\n");
    Put("kernel/pty/reserve", "1024\n");
    Put("net/ipv4/tcp_mem", "287889\t383855\t575778\n");
  }
  void Put(const std::string& name, const std::string& v) {
    ASSERT_TRUE(WriteStringToFile(dir_->path() + "/" + name, v, O_WRONLY | O_CREAT | O_TRUNC).ok());
  }
  std::string Get(const std::string& name) {
    return ReadFileToString(dir_->path() + "/" + name).value_or("?");
  }
  NodeBudgetOptions Opts(bool apply) {
    NodeBudgetOptions o;
    o.apply_sysctls = apply;
    o.proc_sys = dir_->path();
    return o;
  }
  std::optional<TempDir> dir_;
};

TEST_F(NodeBudgetTest, RaisesHostLimitsAndSizesTheShares) {
  auto b = PrepareNodeBudget(Opts(true));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(Get("fs/file-max"), "9223372036854775807");
  EXPECT_EQ(Get("fs/aio-max-nr"), "9223372036854775807");
  EXPECT_EQ(b->aio_max_nr, 9223372036854775807u);
  EXPECT_EQ(Get("kernel/pid_max"), "4194304");
  EXPECT_EQ(b->changes.size(), 4u);
  // min(pid_max, threads-max) minus a 10% reserve (at least 4096).
  EXPECT_EQ(b->sandbox_pids, 192724 - 19272);
  // 4096 sandboxes of 256 ptys do not fit the kernel's 2^20: each gets what fits.
  EXPECT_EQ(Get("kernel/pty/max"), "1048576");
  EXPECT_EQ(b->pty_per_sandbox, (1048576u - 1024) / 4096);
  EXPECT_EQ(b->sandbox_tcp_bytes, static_cast<int64_t>(383855ull * getpagesize() / 4 * 3));
  // Already high enough: nothing written again.
  auto again = PrepareNodeBudget(Opts(true));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->changes.empty());
}

TEST_F(NodeBudgetTest, WithoutSysctlsTheSharesFitWhatIsThere) {
  NodeBudgetOptions o = Opts(false);
  o.max_sandboxes = 100;
  auto b = PrepareNodeBudget(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->changes.empty());
  EXPECT_EQ(Get("kernel/pty/max"), "4096\n");
  EXPECT_EQ(b->aio_max_nr, 65536u);
  EXPECT_EQ(b->pty_per_sandbox, (4096u - 1024) / 100);  // not 256: 100 x 256 would not fit
  EXPECT_EQ(b->sandbox_pids, 32768 - 4096);
  o.reserve_pids = 40000;
  EXPECT_EQ(PrepareNodeBudget(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(NodeBudgetTest, AKernelWithoutAioHasNoAioCount) {
  ASSERT_EQ(unlink((dir_->path() + "/fs/aio-max-nr").c_str()), 0);
  auto b = PrepareNodeBudget(Opts(true));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->aio_max_nr, 0u);
  EXPECT_EQ(b->changes.size(), 3u);
}

}  // namespace
}  // namespace dsec::edge
