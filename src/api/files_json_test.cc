#include "api/files_json.h"

#include <gtest/gtest.h>

namespace dsec::api {
namespace {

TEST(FilesJsonTest, Paths) {
  EXPECT_EQ(*CheckFilePath("/a/b"), "/a/b");
  EXPECT_EQ(CheckFilePath("a").status().message(), "\"path\" must be absolute");
  EXPECT_EQ(CheckFilePath("/" + std::string(4096, 'x')).status().message(), "\"path\" is too long");
}

TEST(FilesJsonTest, Modes) {
  EXPECT_EQ(*ParseFileMode(nullptr, 0644), 0644u);
  std::string m;
  EXPECT_EQ(*ParseFileMode(&m, 0755), 0755u);
  m = "0600";
  EXPECT_EQ(*ParseFileMode(&m, 0), 0600u);
  m = "7777";
  EXPECT_EQ(*ParseFileMode(&m, 0), 07777u);
  for (const char* bad : {"0x1", "8", "000000", "-1"}) {
    m = bad;
    EXPECT_EQ(ParseFileMode(&m, 0).status().message(), "\"mode\" must be octal, like 0644") << bad;
  }
  m = "17777";
  EXPECT_EQ(ParseFileMode(&m, 0).status().message(), "\"mode\" must be at most 07777");
}

TEST(FilesJsonTest, Entries) {
  backends::FileEntry e;
  e.name = "x";
  e.type = "file";
  e.size = 3;
  e.mode = 0100644;
  e.mtime_ms = 7;
  EXPECT_EQ(FileEntryJson(e).dump(), R"({"mode":420,"mtime":7,"name":"x","size":3,"type":"file"})");
  EXPECT_EQ(EntriesJson({}).dump(), R"({"entries":[]})");
  EXPECT_EQ(EntriesJson({e, e})["entries"].size(), 2u);
}

}  // namespace
}  // namespace dsec::api
