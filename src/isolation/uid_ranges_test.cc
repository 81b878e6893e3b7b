#include "isolation/uid_ranges.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <set>

#include "base/file_util.h"

namespace dsec::isolation {
namespace {

class UidRangesPrivilegedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-uidranges-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    opts_.lock_file = dir_ + "/leases.lock";
    opts_.count = 8;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::unique_ptr<UidRangeAllocator> Open() {
    auto a = UidRangeAllocator::Open(opts_);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? std::move(*a) : nullptr;
  }
  std::string dir_;
  UidRangeOptions opts_;
};

// A read-only lease (QEMU's) holds its range like the edge's own, cannot write the lease file,
// and ends with its descriptor.
TEST_F(UidRangesPrivilegedTest, AReadOnlyShareHoldsTheRangeWithoutWriteAccess) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the lock file must be owned by root)";
  opts_.count = 1;
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  auto l = a->Acquire();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto ro = a->ShareReadOnly(l->slot, l->fd);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  l->fd.Reset();  // only the read-only share is left
  EXPECT_EQ((fcntl(ro->get(), F_GETFL) & O_ACCMODE), O_RDONLY);
  EXPECT_LT(write(ro->get(), "x", 1), 0);
  EXPECT_LT(ftruncate(ro->get(), 0), 0);
  EXPECT_EQ(b->Acquire().status().code(), StatusCode::kResourceExhausted);
  auto held = b->Held(0);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(*held);
  ro->Reset();
  a->Release(0);
  EXPECT_TRUE(b->Acquire().ok());
}

// Two allocators on one file stand for two edges on one host: they never hand out the same
// range, and together they hand out every range exactly once.
TEST_F(UidRangesPrivilegedTest, TwoEdgesNeverShareARange) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the lock file must be owned by root)";
  auto a = Open(), b = Open();
  ASSERT_TRUE(a && b);
  std::set<uint32_t> slots;
  std::vector<UidLease> held;
  for (int i = 0; i < 8; ++i) {
    auto l = (i % 2 ? a : b)->Acquire();
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_TRUE(slots.insert(l->slot).second) << "slot " << l->slot << " given twice";
    EXPECT_EQ(l->first_id, opts_.base + l->slot * opts_.size);
    held.push_back(std::move(*l));
  }
  EXPECT_EQ(a->Acquire().status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b->Acquire().status().code(), StatusCode::kResourceExhausted);
  // A lease ends with its descriptor (the sandbox's agent exiting), whoever's it was: the
  // other edge can take that range without anyone reclaiming it.
  uint32_t freed = held[0].slot;  // b's
  held[0].fd.Reset();
  b->Release(freed);
  auto again = a->Acquire();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->slot, freed);
}

// The lease travels with its descriptor: a child that inherited it (the agent) keeps the range
// leased after the edge closed its copy and even after the edge forgot it (a crash).
TEST_F(UidRangesPrivilegedTest, LeaseHeldByAnotherProcessOutlivesTheEdgesCopy) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the lock file must be owned by root)";
  auto a = Open();
  ASSERT_TRUE(a);
  auto l = a->Acquire();
  ASSERT_TRUE(l.ok());
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Holds the inherited lease until the parent closes the pipe.
    close(go[1]);
    char c;
    (void)!read(go[0], &c, 1);
    _exit(0);
  }
  close(go[0]);
  uint32_t slot = l->slot;
  l->fd.Reset();
  auto b = Open();  // the next edge, after a crash of the first
  ASSERT_TRUE(b);
  EXPECT_TRUE(*b->Held(slot));
  for (int i = 0; i < 7; ++i) {
    auto other = b->Acquire();
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->slot, slot);
  }
  // Re-adoption records the range; its lease stays the child's.
  auto claimed = b->Claim(slot);
  ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
  EXPECT_FALSE(claimed->valid());
  EXPECT_EQ(b->Claim(slot).status().code(), StatusCode::kAlreadyExists);
  close(go[1]);
  int st;
  ASSERT_EQ(waitpid(child, &st, 0), child);
  EXPECT_FALSE(*b->Held(slot));
  // An adopted range whose lease nobody holds (an edge from before leases) is locked on claim.
  b->Release(slot);
  auto legacy = b->Claim(slot);
  ASSERT_TRUE(legacy.ok());
  EXPECT_TRUE(legacy->valid());
  EXPECT_TRUE(*b->Held(slot));
}

TEST_F(UidRangesPrivilegedTest, RefusesAnUnsafeLockFile) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  ASSERT_TRUE(WriteStringToFile(opts_.lock_file, "", O_WRONLY | O_CREAT).ok());
  ASSERT_EQ(chmod(opts_.lock_file.c_str(), 0666), 0);
  EXPECT_EQ(UidRangeAllocator::Open(opts_).status().code(), StatusCode::kFailedPrecondition);
  opts_.lock_file = "relative";
  EXPECT_EQ(UidRangeAllocator::Open(opts_).status().code(), StatusCode::kInvalidArgument);
  opts_.lock_file = dir_ + "/x";
  opts_.count = 1u << 20;
  EXPECT_EQ(UidRangeAllocator::Open(opts_).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::isolation
