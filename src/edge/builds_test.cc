// Image builds without running one: the log's bounded tail and its UTF-8 cuts, and the build
// queue's answers (conflict before capacity, cancel of a queued build). No root needed: no
// build worker runs (max_builds 0), so jobs stay queued and no sandbox is made.
#include "edge/builds.h"

#include <gtest/gtest.h>

#include <optional>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::edge {
namespace {

using internal::TrimLogHead;
using internal::Utf8Prefix;

bool IsWholeUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

TEST(BuildLogTest, TrimKeepsWholeLines) {
  std::string log;
  for (int i = 0; i < 100; ++i) log += "line " + std::to_string(i) + " of the log\n";
  std::string before = log;
  size_t max = 400;
  size_t dropped = TrimLogHead(&log, max);
  EXPECT_GT(dropped, before.size() - max);  // a quarter more than needed, so trims are rare
  EXPECT_LE(log.size(), max * 3 / 4);
  EXPECT_EQ(before.substr(dropped), log);
  EXPECT_EQ(before[dropped - 1], '\n');
  EXPECT_EQ(log.substr(0, 5), "line ");
  EXPECT_EQ(TrimLogHead(&log, max), 0u);  // within bounds: untouched
}

TEST(BuildLogTest, TrimOfOneLongLineCutsAtACharacter) {
  // No newline within reach: the cut still never splits a UTF-8 character.
  std::string log;
  for (int i = 0; i < 300; ++i) log += "\xE2\x82\xAC";  // €
  std::string before = log;
  size_t dropped = TrimLogHead(&log, 100);
  EXPECT_EQ(dropped % 3, 0u);
  EXPECT_EQ(before.substr(dropped), log);
  EXPECT_TRUE(IsWholeUtf8(log));
  EXPECT_LE(log.size(), 100u);
}

TEST(BuildLogTest, Utf8PrefixCases) {
  EXPECT_EQ(Utf8Prefix("abc", 10, false), 3u);
  EXPECT_EQ(Utf8Prefix("abc", 2, false), 2u);
  EXPECT_EQ(Utf8Prefix("a\xC3\xA9z", 2, false), 1u);       // é would be split
  EXPECT_EQ(Utf8Prefix("a\xC3\xA9z", 3, false), 3u);       // é whole
  EXPECT_EQ(Utf8Prefix("\xC3\xA9z", 1, false), 2u);        // a character longer than max_bytes
  EXPECT_EQ(Utf8Prefix("\xE2\x82\xAC", 2, false), 3u);     // €
  EXPECT_EQ(Utf8Prefix("\xF0\x9F\x98\x80", 1, true), 4u);  // 😀
  // The log ends inside a character: it waits for the rest, unless the build is done.
  EXPECT_EQ(Utf8Prefix("a\xC3", 10, false), 1u);
  EXPECT_EQ(Utf8Prefix("\xC3", 10, false), 0u);
  EXPECT_EQ(Utf8Prefix("\xC3", 10, true), 1u);
  // Not UTF-8: returned as it is (the JSON answer replaces it), still making progress.
  EXPECT_EQ(Utf8Prefix("\x80\x80\x80\x80x", 2, false), 2u);
  EXPECT_EQ(Utf8Prefix("a\x80\x80", 2, false), 2u);
  EXPECT_EQ(Utf8Prefix("\xC3"
                       "ab",
                       1, false),
            2u);
}

TEST(BuildLogTest, ReadingInSmallPiecesAlwaysProgresses) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z\n\xE2\x82\xAC";
  for (size_t max = 1; max <= 6; ++max) {
    std::string got;
    size_t off = 0;
    for (int n = 0; off < text.size(); ++n) {
      ASSERT_LT(n, 100) << "no progress with max_bytes " << max;
      std::string_view rest = std::string_view(text).substr(off);
      size_t k = Utf8Prefix(rest, max, /*final=*/false);
      ASSERT_GT(k, 0u) << "max_bytes " << max << " offset " << off;
      ASSERT_TRUE(IsWholeUtf8(rest.substr(0, k)));
      got += rest.substr(0, k);
      off += k;
    }
    EXPECT_EQ(got, text);
  }
}

class BuildsQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Create("/tmp/dsec-builds-test-");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tmp_.emplace(std::move(t).value());
    images::StoreOptions o;
    o.root = tmp_->path() + "/images";
    auto s = images::ImageStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    EdgeConfig cfg;
    cfg.max_builds = 0;  // no worker: every build stays queued
    builds_.emplace(cfg, /*manager=*/nullptr, store_.get());
  }
  void TearDown() override {
    builds_.reset();
    store_.reset();
  }

  static BuildRequest Req(const std::string& name) {
    BuildRequest r;
    r.name = name;
    r.from = {"host"};
    r.run = {"true"};
    return r;
  }

  std::optional<TempDir> tmp_;
  std::unique_ptr<images::ImageStore> store_;
  std::optional<Builds> builds_;
};

TEST_F(BuildsQueueTest, ConflictComesBeforeAFullQueue) {
  std::vector<std::string> ids;
  for (int i = 0;; ++i) {
    auto r = builds_->Start(Req(StrCat({"q", std::to_string(i), ":1"})));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kOverCapacity) << r.status().ToString();
      break;
    }
    EXPECT_EQ(r->state, "queued");
    EXPECT_TRUE(r->sandbox.empty());
    EXPECT_EQ(api::ToJson(*r)["sandbox"], nullptr);
    ids.push_back(r->id);
    ASSERT_LT(i, 1000);
  }
  ASSERT_FALSE(ids.empty());
  // The queue is full; a name a queued build is making is still a conflict (409, not 429).
  auto dup = builds_->Start(Req("q0:1"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists) << dup.status().ToString();

  // Canceling a queued build: "canceled" at once, as Get shows it, and its place is free.
  auto c = builds_->Cancel(ids[0]);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->state, "canceled");
  EXPECT_NE(c->finished_at, 0);
  for (const auto& s : c->steps) EXPECT_EQ(s.state, "canceled");
  auto g = builds_->Get(ids[0]);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g, *c);
  auto again = builds_->Cancel(ids[0]);  // finished: returned as it is
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *c);
  EXPECT_TRUE(builds_->Start(Req("q0:1")).ok());  // the name and the place are free again

  auto log = builds_->Log(ids[0], 0, 1);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->text, "");
  EXPECT_TRUE(log->done);
  EXPECT_EQ(builds_->Get("bld-0000000000000000").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dsec::edge
