#include "apiserver/record_cache.h"

#include <gtest/gtest.h>

namespace dsec::apiserver {
namespace {

Json Rec(const std::string& id, const std::string& node, int64_t created, int64_t expires = 0,
         Json labels = Json::object()) {
  return {{"id", id},
          {"node", node},
          {"created_at", created},
          {"state", "running"},
          {"kind", "container"},
          {"labels", labels},
          {"expires_at", expires ? Json(expires) : Json(nullptr)}};
}

TEST(RecordCache, KeepsTheLastSeenAndForgetsTheOldestPastItsBound) {
  RecordCache c(2);
  c.Put(Rec("sb-a-1", "a", 10));
  c.Put(Rec("sb-a-2", "a", 20));
  c.Put(Rec("sb-a-1", "a", 10, 0, {{"v", "2"}}));  // seen again
  c.Put(Rec("sb-b-3", "b", 30));                   // the least recently seen (sb-a-2) goes
  EXPECT_EQ(c.size(), 2u);
  EXPECT_FALSE(c.Get("sb-a-2", 0).has_value());
  ASSERT_TRUE(c.Get("sb-a-1", 0).has_value());
  c.PutAll(Json{{"sandboxes", {Rec("sb-a-1", "a", 10, 0, {{"v", "3"}})}}});
  EXPECT_EQ((*c.Get("sb-a-1", 0))["labels"]["v"], "3");
  c.Erase("sb-a-1");
  EXPECT_FALSE(c.Get("sb-a-1", 0).has_value());
  c.Put(Json{{"id", "no-node"}});  // not a record: ignored
  c.Put(Json::array());
  EXPECT_EQ(c.size(), 1u);
}

TEST(RecordCache, ExpiredRecordsAreNotShown) {
  RecordCache c(10);
  c.Put(Rec("sb-a-1", "a", 10, 1000));
  bool more = true;
  EXPECT_EQ(c.OfNode("a", "", {}, 10, 999, &more).size(), 1u);
  EXPECT_EQ(c.OfNode("a", "", {}, 10, 1000, &more).size(), 0u);
  EXPECT_FALSE(c.Get("sb-a-1", 1000).has_value());
}

TEST(RecordCache, ANodesRecordsPageInListOrderWithFilters) {
  RecordCache c(100);
  for (int i = 0; i < 5; ++i)
    c.Put(Rec("sb-a-" + std::to_string(i), "a", 100 + i, 0, {{"job", i % 2 ? "odd" : "even"}}));
  c.Put(Rec("sb-b-9", "b", 50));
  bool more = false;
  auto first = c.OfNode("a", "", {}, 2, 0, &more);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(more);
  EXPECT_EQ(first[0]["id"], "sb-a-0");
  // The list's cursor position: "<created_at>.<id>" of the last one taken.
  auto rest = c.OfNode("a", "101.sb-a-1", {}, 10, 0, &more);
  ASSERT_EQ(rest.size(), 3u);
  EXPECT_FALSE(more);
  EXPECT_EQ(rest[0]["id"], "sb-a-2");
  RecordFilter even;
  even.labels = {{"job", "even"}};
  EXPECT_EQ(c.OfNode("a", "", even, 10, 0, &more).size(), 3u);
  RecordFilter vm;
  vm.kind = "microvm";
  EXPECT_EQ(c.OfNode("a", "", vm, 10, 0, &more).size(), 0u);
  EXPECT_EQ(c.OfNode("nope", "", {}, 10, 0, &more).size(), 0u);
  Json shown = RecordCache::Unavailable(first[0], "node a is unavailable");
  EXPECT_EQ(shown["state"], "unavailable");
  EXPECT_EQ(shown["reason"], "node a is unavailable");
}

}  // namespace
}  // namespace dsec::apiserver
