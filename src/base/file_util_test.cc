#include "base/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace dsec {
namespace {

TEST(FileUtilTest, WriteReadAndLimit) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  std::string p = JoinPath(dir->path(), "f");
  ASSERT_TRUE(WriteStringToFile(p, "hello", O_WRONLY | O_CREAT | O_TRUNC).ok());
  EXPECT_EQ(*ReadFileToString(p), "hello");
  EXPECT_EQ(ReadFileToString(p, 3).status().code(), StatusCode::kTooLarge);
  EXPECT_EQ(ReadFileToString(p + "x").status().code(), StatusCode::kNotFound);
}

TEST(FileUtilTest, ReadFileChunksReadsSizeBytesFromTheStart) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  std::string p = JoinPath(dir->path(), "f");
  ASSERT_TRUE(WriteStringToFile(p, "0123456789", O_WRONLY | O_CREAT | O_TRUNC).ok());
  UniqueFd fd(open(p.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(lseek(fd.get(), 5, SEEK_SET), 5);  // the position does not matter
  std::vector<std::string> pieces;
  auto collect = [&](std::string_view d) {
    pieces.emplace_back(d);
    return OkStatus();
  };
  ASSERT_TRUE(ReadFileChunks(fd.get(), 8, 3, collect, "f").ok());
  EXPECT_EQ(pieces, (std::vector<std::string>{"012", "345", "67"}));
  pieces.clear();
  EXPECT_TRUE(ReadFileChunks(fd.get(), 0, 3, collect, "f").ok());
  EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(ReadFileChunks(fd.get(), 11, 4, collect, "f").code(), StatusCode::kInternal);
  pieces.clear();
  ASSERT_TRUE(ReadFileChunks(fd.get(), 5, 2, collect, "f", /*offset=*/4).ok());  // a range
  EXPECT_EQ(pieces, (std::vector<std::string>{"45", "67", "8"}));
  EXPECT_EQ(ReadFileChunks(fd.get(), 5, 4, collect, "f", 6).code(), StatusCode::kInternal);
  int calls = 0;
  Status stop = ReadFileChunks(
      fd.get(), 10, 2,
      [&](std::string_view) {
        ++calls;
        return InvalidArgument("enough");
      },
      "f");
  EXPECT_EQ(stop.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

TEST(FileUtilTest, RemoveTreeDoesNotFollowSymlinks) {
  auto dir = TempDir::Create();
  auto outside = TempDir::Create();
  ASSERT_TRUE(dir.ok() && outside.ok());
  std::string keep = JoinPath(outside->path(), "keep");
  ASSERT_TRUE(WriteStringToFile(keep, "x", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(MakeDirs(JoinPath(dir->path(), "a/b/c")).ok());
  ASSERT_EQ(symlink(outside->path().c_str(), JoinPath(dir->path(), "a/link").c_str()), 0);
  std::string tree = JoinPath(dir->path(), "a");
  ASSERT_TRUE(RemoveTree(tree).ok());
  struct stat st;
  EXPECT_NE(lstat(tree.c_str(), &st), 0);
  EXPECT_EQ(stat(keep.c_str(), &st), 0);
  EXPECT_TRUE(RemoveTree(tree).ok());  // missing is fine
}

TEST(FileUtilTest, JoinPath) {
  EXPECT_EQ(JoinPath("/a/", "/b"), "/a/b");
  EXPECT_EQ(JoinPath("/a", "b"), "/a/b");
}

}  // namespace
}  // namespace dsec
