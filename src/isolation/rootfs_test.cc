#include "isolation/rootfs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_util.h"

namespace dsec::isolation {
namespace {

class InRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Create();
    ASSERT_TRUE(d.ok());
    dir_ = std::make_unique<TempDir>(std::move(*d));
    root_ = dir_->path() + "/root";
    outside_ = dir_->path() + "/outside";
    ASSERT_TRUE(MakeDirs(root_ + "/etc").ok());
    ASSERT_TRUE(MakeDirs(outside_).ok());
    ASSERT_EQ(symlink("/", (root_ + "/escape_abs").c_str()), 0);
    ASSERT_EQ(symlink("../outside", (root_ + "/escape_rel").c_str()), 0);
    ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/proc").c_str()), 0);  // a planted mount point
    fd_.Reset(open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd_.valid());
  }
  std::unique_ptr<TempDir> dir_;
  std::string root_, outside_;
  UniqueFd fd_;
};

TEST_F(InRootTest, SymlinksNeverLeaveTheRoot) {
  // Symlinks are refused outright while building a root, absolute or relative.
  EXPECT_FALSE(OpenSandboxPath(fd_.get(), "/escape_abs/etc", O_PATH).ok());
  EXPECT_FALSE(OpenSandboxPath(fd_.get(), "/escape_rel", O_PATH).ok());
  EXPECT_FALSE(OpenSandboxPath(fd_.get(), "/../outside", O_PATH).ok());  // ".." is rejected
  EXPECT_FALSE(OpenSandboxPath(fd_.get(), "relative", O_PATH).ok());
  EXPECT_TRUE(OpenSandboxPath(fd_.get(), "/etc", O_PATH | O_DIRECTORY).ok());
}

TEST_F(InRootTest, MakeDirReplacesPlantedMountPointSymlinks) {
  auto p = MakeDirInRoot(fd_.get(), "/proc", 0555, 0, 0, /*replace=*/true);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  struct stat st;
  ASSERT_EQ(lstat((root_ + "/proc").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  // Nothing was created outside.
  EXPECT_EQ(rmdir(outside_.c_str()), 0);
}

TEST_F(InRootTest, MakeDirDoesNotFollowIntermediateSymlinks) {
  EXPECT_FALSE(MakeDirInRoot(fd_.get(), "/escape_rel/sub", 0755, 0, 0, true).ok());
  struct stat st;
  EXPECT_NE(stat((outside_ + "/sub").c_str(), &st), 0);
  auto w = MakeDirInRoot(fd_.get(), "/workspace/a/b", 0750, getuid(), getgid(), false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(stat((root_ + "/workspace/a/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
}

TEST(ProcMasksTest, CoverTheIssueList) {
  const auto& m = ProcMaskedPaths();
  for (const char* p : {"kcore", "keys", "kallsyms", "sysrq-trigger", "timer_list", "kpagecount",
                        "kpageflags", "kpagecgroup", "sched_debug"})
    EXPECT_NE(std::find(m.begin(), m.end(), p), m.end()) << p;
  const auto& ro = ProcReadonlyPaths();
  EXPECT_NE(std::find(ro.begin(), ro.end(), "sys"), ro.end());
}

}  // namespace
}  // namespace dsec::isolation
