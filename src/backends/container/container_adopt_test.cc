// Re-adoption (privileged): one backend lets go of a running sandbox (as an edge does when it
// stops with --persist, or dies), a new backend on the same state dir adopts it with the
// handle the first one gave out. Each test has its own state dir, so uid slots and orphan
// cleanup see only what the test made.
#include <gtest/gtest.h>
#include <unistd.h>

#include "backends/container/container_backend.h"
#include "backends/container/container_instance.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"

namespace dsec::backends::container {
namespace {

class AdoptPrivilegedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    auto d = TempDir::Create("/tmp/dsec-adopt-");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dir_ = std::make_unique<TempDir>(std::move(*d));
  }
  void TearDown() override {
    for (auto& sb : made_) EXPECT_TRUE(sb->Destroy().ok());
    made_.clear();
    backend_.reset();
  }

  std::unique_ptr<ContainerBackend> NewBackend() {
    ContainerBackendOptions o;
    o.state_dir = dir_->path() + "/state";
    o.agent_path = DSEC_TEST_AGENT_PATH;
    o.netns_pool = 4;
    auto b = ContainerBackend::Create(o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(*b) : nullptr;
  }

  static std::string Run(Sandbox* sb, const std::string& cmd) {
    ExecRequest r;
    r.shell = cmd;
    auto out = sb->Exec(r);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? std::string(TrimWhitespace(out->stdout_data)) : "";
  }

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<ContainerBackend> backend_;
  std::vector<std::shared_ptr<Sandbox>> made_;
};

TEST_F(AdoptPrivilegedTest, ANewBackendTakesOverFilesShellsAndPauseState) {
  auto first = NewBackend();
  ASSERT_TRUE(first);
  SandboxSpec spec;
  spec.id = NewSandboxId("t");
  auto sb = first->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  ASSERT_TRUE((*sb)->WriteFile("/workspace/keep.txt", "kept\n", 0644).ok());
  auto shell = (*sb)->OpenShell("");
  ASSERT_TRUE(shell.ok());
  ASSERT_TRUE((*sb)->RunShell(*shell, "mkdir -p /workspace/d && cd /workspace/d").ok());
  ExecRequest bg;
  bg.shell = "sleep 600 >/dev/null 2>&1 &";
  ASSERT_TRUE((*sb)->Exec(bg).ok());
  ASSERT_TRUE((*sb)->Pause().ok());
  std::string handle = (*sb)->AdoptionHandle();
  (*sb)->Detach();
  EXPECT_EQ((*sb)->state(), SandboxState::kDestroyed);
  sb->reset();
  first.reset();

  backend_ = NewBackend();
  ASSERT_TRUE(backend_);
  auto adopted = backend_->Adopt(spec, handle);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  made_.push_back(*adopted);
  Sandbox* a = adopted->get();
  EXPECT_EQ(a->state(), SandboxState::kPaused);          // frozen before, frozen after
  EXPECT_EQ(Run(a, "cat /workspace/keep.txt"), "kept");  // resumes transparently
  EXPECT_EQ(a->state(), SandboxState::kRunning);
  EXPECT_EQ(a->ListShells(), std::vector<std::string>{*shell});
  auto pwd = a->RunShell(*shell, "pwd");
  ASSERT_TRUE(pwd.ok()) << pwd.status().ToString();
  EXPECT_EQ(TrimWhitespace(pwd->stdout_data), "/workspace/d");
  EXPECT_EQ(Run(a, "pgrep -c sleep"), "1");  // background processes lived on
  // Nothing is left for orphan cleanup: the adopted sandbox holds its lock.
  EXPECT_EQ(backend_->CleanupOrphans().value_or(-1), 0);
  EXPECT_EQ(Run(a, "echo alive"), "alive");
}

TEST_F(AdoptPrivilegedTest, AWrongSecretFailsAndCleansUp) {
  auto first = NewBackend();
  ASSERT_TRUE(first);
  SandboxSpec spec;
  spec.id = NewSandboxId("t");
  auto sb = first->Create(spec);
  ASSERT_TRUE(sb.ok());
  auto dir = static_cast<ContainerInstance&>((*sb)->instance()).dir();
  std::string handle = (*sb)->AdoptionHandle();
  (*sb)->Detach();
  sb->reset();
  first.reset();

  backend_ = NewBackend();
  ASSERT_TRUE(backend_);
  std::string bad = handle;
  bad.replace(bad.find("\"secret\":\"") + 10, 4, "0000");
  auto a = backend_->Adopt(spec, bad);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kUnauthenticated) << a.status().ToString();
  // A failed adoption destroys what was left: the directory and the cgroups are gone.
  EXPECT_NE(access(dir.c_str(), F_OK), 0);
  EXPECT_EQ(backend_->Adopt(spec, handle).status().code(), StatusCode::kNotFound);
}

TEST_F(AdoptPrivilegedTest, ASandboxOwnedByALiveBackendIsLeftAlone) {
  backend_ = NewBackend();
  ASSERT_TRUE(backend_);
  SandboxSpec spec;
  spec.id = NewSandboxId("t");
  auto sb = backend_->Create(spec);
  ASSERT_TRUE(sb.ok());
  made_.push_back(*sb);
  auto other = NewBackend();
  ASSERT_TRUE(other);
  auto a = other->Adopt(spec, (*sb)->AdoptionHandle());
  EXPECT_EQ(a.status().code(), StatusCode::kAlreadyExists) << a.status().ToString();
  EXPECT_EQ(other->CleanupOrphans().value_or(-1), 0);
  EXPECT_EQ(Run(sb->get(), "echo untouched"), "untouched");
}

TEST_F(AdoptPrivilegedTest, OrphansNobodyAdoptsAreCleanedUp) {
  auto first = NewBackend();
  ASSERT_TRUE(first);
  SandboxSpec spec;
  spec.id = NewSandboxId("t");
  auto sb = first->Create(spec);
  ASSERT_TRUE(sb.ok());
  auto dir = static_cast<ContainerInstance&>((*sb)->instance()).dir();
  (*sb)->Detach();
  sb->reset();
  first.reset();
  backend_ = NewBackend();
  ASSERT_TRUE(backend_);
  EXPECT_EQ(backend_->CleanupOrphans().value_or(-1), 1);
  EXPECT_NE(access(dir.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace dsec::backends::container
