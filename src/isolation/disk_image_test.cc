#include "isolation/disk_image.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>

#include "base/file_util.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "base/testing/poll.h"

namespace dsec::isolation {
namespace {

size_t LoopDevicesInUse() {
  size_t n = 0;
  auto names = ListDir("/sys/block");
  if (!names.ok()) return 0;
  for (const auto& b : *names)
    if (b.rfind("loop", 0) == 0 && ReadFileToString("/sys/block/" + b + "/loop/backing_file").ok())
      ++n;
  return n;
}

// Writes up to `bytes` to a new file in dirfd; returns how much went in and the errno that
// stopped it (0: all of it).
std::pair<uint64_t, int> Fill(int dirfd, const char* name, uint64_t bytes) {
  int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return {0, errno};
  std::string chunk(64 << 10, 'x');
  uint64_t done = 0;
  int err = 0;
  while (done < bytes) {
    ssize_t n = write(fd, chunk.data(), chunk.size());
    if (n < 0) {
      err = errno;
      break;
    }
    done += static_cast<uint64_t>(n);
  }
  if (err == 0 && fsync(fd) < 0) err = errno;
  close(fd);
  return {done, err};
}

// The mount is an ext4 filesystem of at most max_bytes whose root is owned by uid:gid.
void ExpectExt4Root(int mnt, uid_t uid, gid_t gid, uint64_t max_bytes) {
  struct stat st {};
  ASSERT_EQ(fstat(mnt, &st), 0);
  EXPECT_EQ(st.st_uid, uid);
  EXPECT_EQ(st.st_gid, gid);
  struct statfs sfs {};
  ASSERT_EQ(fstatfs(mnt, &sfs), 0);
  EXPECT_EQ(sfs.f_type, 0xEF53);  // ext4
  EXPECT_LE(static_cast<uint64_t>(sfs.f_blocks) * sfs.f_bsize, max_bytes);
}

// Root, loop devices, a temp dir for the images; the loop devices in use before the test.
class DiskImagePrivilegedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to attach loop devices and mount ext4";
    if (access("/dev/loop-control", R_OK | W_OK) != 0)
      GTEST_SKIP() << "no /dev/loop-control: loop devices are unavailable";
    auto t = TempDir::Create("/tmp/dsec-disk-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(*t));
    loops_ = LoopDevicesInUse();
  }
  DiskImageSpec Spec(const std::string& name, uint64_t bytes, uint64_t inodes) const {
    DiskImageSpec spec;
    spec.dir = tmp_->path();
    spec.name = name;
    spec.bytes = bytes;
    spec.inodes = inodes;
    return spec;
  }
  std::optional<TempDir> tmp_;
  size_t loops_ = 0;
};

TEST_F(DiskImagePrivilegedTest, SizeAndInodesAreHardCapsAndNothingOutlivesTheMount) {
  const auto& tmp = tmp_;
  size_t loops = loops_;
  DiskImageSpec spec = Spec("sb-1", 64ull << 20, 2000);
  spec.owner = 4242;
  spec.group = 4243;
  {
    auto m = MakeDiskImageMount(spec);
    if (!m.ok() && m.status().code() == StatusCode::kFailedPrecondition)
      GTEST_SKIP() << m.status().ToString();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    int mnt = m->get();
    // Nothing named is left in the directory: the loop device holds the only reference.
    auto names = ListDir(tmp->path());
    ASSERT_TRUE(names.ok());
    EXPECT_TRUE(names->empty());
    EXPECT_EQ(LoopDevicesInUse(), loops + 1);

    ExpectExt4Root(mnt, 4242, 4243, 64ull << 20);
    struct statfs sfs {};
    ASSERT_EQ(fstatfs(mnt, &sfs), 0);
    uint64_t size = static_cast<uint64_t>(sfs.f_blocks) * sfs.f_bsize;
    EXPECT_GE(size, 56ull << 20);
    // No root reserve: only ext4's own small metadata reserve (2%, at most 4096 blocks),
    // which no write(2) can use.
    EXPECT_LE(sfs.f_bfree - sfs.f_bavail, sfs.f_blocks / 40);
    EXPECT_GE(sfs.f_files, 2000u);
    EXPECT_LT(sfs.f_files, 2000u + 1024);
    EXPECT_EQ(faccessat(mnt, "lost+found", F_OK, AT_SYMLINK_NOFOLLOW), -1);

    // Bytes: a write past the size stops with ENOSPC, as root (this test) too.
    auto [done, err] = Fill(mnt, "big", 256ull << 20);
    EXPECT_EQ(err, ENOSPC);
    EXPECT_GE(done, 48ull << 20);
    EXPECT_LE(done, 64ull << 20);
    ASSERT_EQ(unlinkat(mnt, "big", 0), 0);
    // Inodes.
    int made = 0, ferr = 0;
    for (int i = 0; i < 5000; ++i) {
      int fd = openat(mnt, StrCat({"f", std::to_string(i)}).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC,
                      0644);
      if (fd < 0) {
        ferr = errno;
        break;
      }
      close(fd);
      ++made;
    }
    EXPECT_EQ(ferr, ENOSPC);
    EXPECT_GE(made, 1900);
    EXPECT_LT(made, 3100);
    // A second image of the same name can be made while this one lives (the name is free).
    auto m2 = MakeDiskImageMount(spec);
    ASSERT_TRUE(m2.ok()) << m2.status().ToString();
    EXPECT_EQ(LoopDevicesInUse(), loops + 2);
  }
  // Both mounts are gone with their fds; the loop devices follow (autoclear).
  dsec::testing::PollUntil([&] { return LoopDevicesInUse() <= loops; });
  EXPECT_EQ(LoopDevicesInUse(), loops);
}

uint64_t FreeBytes(const std::string& dir) {
  struct statfs sfs {};
  if (statfs(dir.c_str(), &sfs) < 0) return 0;
  return static_cast<uint64_t>(sfs.f_bavail) * sfs.f_bsize;
}

// A preallocated image takes its whole size from the host's filesystem at once (so writing it
// full can never fill the host), gives it back with its mount, and a host without room refuses
// it (OverCapacity) leaving nothing; a sparse one (preallocate false) takes only what mkfs wrote.
TEST_F(DiskImagePrivilegedTest, PreallocatedImagesTakeTheirSpaceUpFront) {
  const auto& tmp = tmp_;
  size_t loops = loops_;
  DiskImageSpec spec = Spec("sb-pre", 512ull << 20, 4096);
  uint64_t before = FreeBytes(tmp->path());
  if (before < (2ull << 30)) GTEST_SKIP() << "less than 2 GiB free under /tmp";
  {
    auto m = MakeDiskImageMount(spec);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_GE(before - FreeBytes(tmp->path()), 500ull << 20);  // taken now, not when written
  }
  dsec::testing::PollUntil([&] { return LoopDevicesInUse() <= loops; });
  EXPECT_LT(before - std::min(before, FreeBytes(tmp->path())), 64ull << 20);  // given back
  spec.preallocate = false;
  {
    auto m = MakeDiskImageMount(spec);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_LT(before - std::min(before, FreeBytes(tmp->path())), 128ull << 20);  // sparse
  }
  dsec::testing::PollUntil([&] { return LoopDevicesInUse() <= loops; });
  // A host filesystem without room: a 32 MiB tmpfs asked for a 64 MiB image.
  std::string small = tmp->path() + "/small";
  ASSERT_EQ(mkdir(small.c_str(), 0700), 0);
  ASSERT_EQ(mount("tmpfs", small.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=32m"), 0);
  auto unmount = MakeScopeGuard([&] { umount2(small.c_str(), MNT_DETACH); });
  spec.dir = small;
  spec.bytes = 64ull << 20;
  spec.preallocate = true;
  auto full = MakeDiskImageMount(spec);
  EXPECT_EQ(full.status().code(), StatusCode::kOverCapacity) << full.status().ToString();
  auto names = ListDir(small);
  EXPECT_TRUE(names.ok() && names->empty());
  EXPECT_EQ(LoopDevicesInUse(), loops);
}

// Loop devices whose image file was made in dir (named or unlinked).
size_t LoopDevicesOf(const std::string& dir) {
  size_t n = 0;
  auto names = ListDir("/sys/block");
  if (!names.ok()) return 0;
  for (const auto& b : *names) {
    if (b.rfind("loop", 0) != 0) continue;
    auto back = ReadFileToString("/sys/block/" + b + "/loop/backing_file");
    if (back.ok() && back->rfind(dir + "/", 0) == 0) ++n;
  }
  return n;
}

// The pool keeps `depth` images of a size once it was asked for; a taken one is a fresh,
// empty filesystem of that size owned by the taker; a released one is unmounted by the pool's
// thread (its loop device goes); the sizes asked for least recently are dropped beyond
// max_sizes; the pool's end leaves nothing.
TEST_F(DiskImagePrivilegedTest, PoolKeepsImagesReadyAndUnmountsReleasedOnes) {
  const std::string dir = tmp_->path();
  DiskImagePool::Options o;
  o.dir = dir;
  o.preallocate = false;
  o.depth = 2;
  o.max_sizes = 1;
  {
    DiskImagePool pool(o);
    DiskImageSpec spec = Spec("sb-a", 32ull << 20, 1000);
    spec.owner = 4242;
    spec.group = 4243;
    auto first = pool.Take(spec);  // nothing ready yet: made now
    if (!first.ok() && first.status().code() == StatusCode::kFailedPrecondition)
      GTEST_SKIP() << first.status().ToString();
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE(dsec::testing::PollUntil([&] { return pool.Ready() == 2; }, 20000));
    EXPECT_EQ(LoopDevicesOf(dir), 3u);
    auto second = pool.Take(spec);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_EQ(pool.Ready(), 1u);  // it came from the pool
    for (int mnt : {first->get(), second->get()}) {
      ExpectExt4Root(mnt, 4242, 4243, 32ull << 20);
      struct statfs sfs {};
      ASSERT_EQ(fstatfs(mnt, &sfs), 0);
      EXPECT_GE(sfs.f_files, 1000u);
      EXPECT_LT(sfs.f_files, 1000u + 1024);
      auto names = ListDir(StrCat({"/proc/self/fd/", std::to_string(mnt)}));
      ASSERT_TRUE(names.ok());
      EXPECT_TRUE(names->empty());
    }
    ASSERT_TRUE(dsec::testing::PollUntil([&] { return pool.Ready() == 2; }, 20000));
    // Written to and released: unmounted (its loop device gone), nothing left named.
    EXPECT_EQ(Fill(first->get(), "f", 4 << 20).second, 0);
    pool.Release(std::move(*first));
    EXPECT_TRUE(dsec::testing::PollUntil([&] { return LoopDevicesOf(dir) == 3; }, 10000));
    // Another size, with max_sizes 1: the first size's ready images are dropped.
    auto other = pool.Take(Spec("sb-b", 24ull << 20, 800));
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    ASSERT_TRUE(dsec::testing::PollUntil(
        [&] { return pool.Ready() == 2 && LoopDevicesOf(dir) == 4; }, 20000));
    struct statfs sfs {};
    ASSERT_EQ(fstatfs(other->get(), &sfs), 0);
    EXPECT_LE(static_cast<uint64_t>(sfs.f_blocks) * sfs.f_bsize, 24ull << 20);
  }
  // The pool's end and the taken mounts' closing leave no loop device and no file.
  EXPECT_TRUE(dsec::testing::PollUntil([&] { return LoopDevicesOf(dir) == 0; }, 10000));
  auto names = ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
}

TEST(DiskImageSpecPrivilegedTest, BadSpecsAndStaleFiles) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  auto tmp = TempDir::Create("/tmp/dsec-disk-test-");
  ASSERT_TRUE(tmp.ok());
  DiskImageSpec spec;
  spec.dir = tmp->path();
  spec.name = "x";
  spec.bytes = 1 << 20;
  spec.inodes = 100;
  EXPECT_EQ(MakeDiskImageMount(spec).status().code(), StatusCode::kInvalidArgument);
  spec.bytes = 64 << 20;
  spec.name = "../x";
  EXPECT_EQ(MakeDiskImageMount(spec).status().code(), StatusCode::kInvalidArgument);
  spec.name = "x";
  spec.dir = tmp->path() + "/missing";
  EXPECT_FALSE(MakeDiskImageMount(spec).ok());
  // An interrupted create leaves a named file; the sweep takes image files only.
  ASSERT_TRUE(WriteFileAt(AT_FDCWD, tmp->path() + "/sb-2.img", "x", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(WriteFileAt(AT_FDCWD, tmp->path() + "/keep", "x", O_WRONLY | O_CREAT).ok());
  auto n = RemoveStaleDiskImages(tmp->path());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(access((tmp->path() + "/keep").c_str(), F_OK), 0);
  EXPECT_EQ(*RemoveStaleDiskImages(tmp->path() + "/missing"), 0);
}

}  // namespace
}  // namespace dsec::isolation
