#include "base/in_root.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/file_util.h"
#include "sys/syscalls.h"

namespace dsec {
namespace {

// A root directory inside a private temp dir, with a sibling "outside" the root must never
// reach.
class InRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-in-root-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    ASSERT_EQ(mkdir((top_ + "/root").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((top_ + "/outside").c_str(), 0755), 0);
    root_.Reset(open((top_ + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid());
  }
  void TearDown() override { (void)RemoveTree(top_); }

  std::string R(const std::string& rel) const { return top_ + "/root/" + rel; }
  void Dir(const std::string& rel) { ASSERT_EQ(mkdir(R(rel).c_str(), 0755), 0) << rel; }
  void Link(const std::string& target, const std::string& rel) {
    ASSERT_EQ(symlink(target.c_str(), R(rel).c_str()), 0) << rel;
  }
  void File(const std::string& rel) {
    UniqueFd f(open(R(rel).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(f.valid()) << rel;
  }
  // True if fd is the object at host path p.
  static bool Same(int fd, const std::string& p) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(p.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
  }
  int Errno(std::string_view path, InRoot policy, int flags = O_PATH) {
    auto fd = OpenInRoot(root_.get(), path, flags, policy);
    return fd.ok() ? 0 : fd.status().error_number();
  }

  std::string top_;
  UniqueFd root_;
};

TEST_F(InRootTest, FollowInsideClampsSymlinksAndDotDotToTheRoot) {
  Dir("a");
  Link("/a", "abs");
  Link("../../../..", "up");
  Link("/etc", "hostetc");  // the host's /etc is not what it means here
  Link(top_ + "/outside", "out");
  auto abs = OpenInRoot(root_.get(), "abs", O_PATH, InRoot::kFollowInside);
  ASSERT_TRUE(abs.ok()) << abs.status().ToString();
  EXPECT_TRUE(Same(abs->get(), R("a")));
  auto up = OpenInRoot(root_.get(), "up", O_PATH, InRoot::kFollowInside);
  ASSERT_TRUE(up.ok());
  EXPECT_TRUE(Same(up->get(), top_ + "/root"));
  auto dotdot = OpenInRoot(root_.get(), "../../a", O_PATH, InRoot::kFollowInside);
  ASSERT_TRUE(dotdot.ok());
  EXPECT_TRUE(Same(dotdot->get(), R("a")));
  EXPECT_EQ(Errno("hostetc/passwd", InRoot::kFollowInside), ENOENT);
  EXPECT_EQ(Errno("out", InRoot::kFollowInside), ENOENT);  // "<top>/outside" inside the root
  EXPECT_EQ(Errno("", InRoot::kFollowInside), 0);          // the root itself
  // Magic links (/proc/<pid>/cwd, fd/N) are refused, even where the tree is /proc itself.
  UniqueFd proc(open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(proc.valid());
  for (InRoot p : {InRoot::kFollowInside, InRoot::kNoSymlinks, InRoot::kBeneath}) {
    auto m = OpenInRoot(proc.get(), "cwd", O_PATH, p);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().error_number(), ELOOP);
  }
}

TEST_F(InRootTest, NoSymlinksRefusesEveryLinkButStillClamps) {
  Dir("a");
  Link("a", "rel");
  EXPECT_EQ(Errno("rel", InRoot::kNoSymlinks), ELOOP);
  EXPECT_EQ(Errno("rel/x", InRoot::kNoSymlinks), ELOOP);
  auto dotdot = OpenInRoot(root_.get(), "../a", O_PATH, InRoot::kNoSymlinks);
  ASSERT_TRUE(dotdot.ok());
  EXPECT_TRUE(Same(dotdot->get(), R("a")));
  // O_PATH | O_NOFOLLOW on the last component opens the link itself (never its target).
  auto self = OpenInRoot(root_.get(), "rel", O_PATH | O_NOFOLLOW, InRoot::kNoSymlinks);
  ASSERT_TRUE(self.ok());
  struct stat st;
  ASSERT_EQ(fstat(self->get(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

TEST_F(InRootTest, BeneathRefusesClimbingAndAbsolutePathsInsteadOfClamping) {
  Dir("a");
  EXPECT_EQ(Errno("a/../a", InRoot::kBeneath), 0);
  EXPECT_EQ(Errno("../a", InRoot::kBeneath), EXDEV);
  EXPECT_EQ(Errno("/a", InRoot::kBeneath), EXDEV);
  Link("a", "l");
  EXPECT_EQ(Errno("l", InRoot::kBeneath), ELOOP);
  auto fd = OpenInRoot(root_.get(), "../a", O_PATH, InRoot::kBeneath);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("open \"../a\""), std::string::npos)
      << fd.status().ToString();
}

TEST_F(InRootTest, MakeDirsCreatesWhatIsMissingAndReusesWhatExists) {
  Dir("a");
  std::vector<std::string> made;
  MakeDirsOptions o;
  o.created = &made;
  auto fd = MakeDirsInRoot(root_.get(), {"a", "b", "c", "d"}, InRoot::kFollowInside, o);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_TRUE(Same(fd->get(), R("a/b/c/d")));
  EXPECT_EQ(made, (std::vector<std::string>{"a/b", "a/b/c", "a/b/c/d"}));
  made.clear();
  auto again = MakeDirsInRoot(root_.get(), {"a", "b", "c", "d"}, InRoot::kFollowInside, o);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(made.empty());
  // A long path: the deepest existing prefix is found by bisection, not a walk.
  std::vector<std::string> deep(300, "n");
  auto d = MakeDirsInRoot(root_.get(), deep, InRoot::kNoSymlinks);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  deep.push_back("leaf");
  ASSERT_TRUE(MakeDirsInRoot(root_.get(), deep, InRoot::kNoSymlinks).ok());
}

TEST_F(InRootTest, MakeDirsWithAnOwnerSetsTheModeExactly) {
  MakeDirsOptions o;
  o.mode = 0750;
  o.owner = std::make_pair(getuid(), getgid());
  o.open_flags = O_RDONLY;
  mode_t old = umask(077);
  auto fd = MakeDirsInRoot(root_.get(), {"x", "y"}, InRoot::kNoSymlinks, o);
  umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  struct stat st;
  ASSERT_EQ(stat(R("x").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(stat(R("x/y").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
}

TEST_F(InRootTest, MakeDirsNeverLeavesTheRoot) {
  File("file");
  auto f = MakeDirsInRoot(root_.get(), {"file", "sub"}, InRoot::kFollowInside);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().error_number(), ENOTDIR);
  // A link that climbs out (relative and absolute): followed inside the root or refused,
  // never made outside.
  Link("../outside", "rel");
  Link(top_ + "/outside", "abs");
  for (const char* l : {"rel", "abs"}) {
    auto r = MakeDirsInRoot(root_.get(), {l, "new"}, InRoot::kFollowInside);
    EXPECT_FALSE(r.ok()) << l;  // the link's target does not exist inside the root
    auto n = MakeDirsInRoot(root_.get(), {l, "new"}, InRoot::kNoSymlinks);
    ASSERT_FALSE(n.ok()) << l;
    EXPECT_EQ(n.status().error_number(), ELOOP) << l;
  }
  struct stat st;
  EXPECT_NE(stat((top_ + "/outside/new").c_str(), &st), 0);
  // With the target made inside the root, the link is followed there.
  Dir("outside");
  ASSERT_TRUE(MakeDirsInRoot(root_.get(), {"rel", "new"}, InRoot::kFollowInside).ok());
  EXPECT_EQ(stat(R("outside/new").c_str(), &st), 0);
  EXPECT_NE(stat((top_ + "/outside/new").c_str(), &st), 0);
}

TEST_F(InRootTest, LookupsThroughDotDotSurviveARenameLoop) {
  // openat2 answers EAGAIN when a rename anywhere raced a lookup that used "..". A thread
  // renames in a loop; every OpenInRoot must still succeed (it retries), while the raw call
  // shows how often the race was hit.
  Dir("a");
  Dir("a/b");
  Dir("x");
  std::atomic<bool> stop{false};
  std::thread renamer([&] {
    const std::string p = R("x/one"), q = R("x/two");
    (void)mkdir(p.c_str(), 0755);
    while (!stop.load()) {
      (void)rename(p.c_str(), q.c_str());
      (void)rename(q.c_str(), p.c_str());
    }
  });
  int raw_eagain = 0, failed = 0;
  const uint64_t flags = ResolveFlags(InRoot::kFollowInside);
  for (int i = 0; i < 20000; ++i) {
    int raw = sys::Openat2(root_.get(), "a/b/../b/../../a", O_PATH | O_CLOEXEC, 0, flags);
    if (raw >= 0) {
      close(raw);
    } else if (errno == EAGAIN) {
      ++raw_eagain;
    }
    if (!OpenInRoot(root_.get(), "a/b/../b/../../a", O_PATH, InRoot::kFollowInside).ok()) ++failed;
  }
  stop = true;
  renamer.join();
  std::printf("raw openat2 EAGAIN under the rename loop: %d of 20000\n", raw_eagain);
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace dsec
