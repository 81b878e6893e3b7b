#include "backends/container/adoption_handle.h"

#include <gtest/gtest.h>

namespace dsec::backends::container {
namespace {

TEST(AdoptionHandleTest, RoundTripsEveryField) {
  AdoptionHandle h;
  h.secret = "0123456789abcdef";
  h.uid_slot = 7;
  h.layer_fd = 12;
  h.id_base = 100000;
  h.disk_image = true;
  h.overlays = {"/", "/usr"};
  h.base = "debian";
  h.layer_digests = {"sha256:aa", "sha256:bb"};
  auto p = AdoptionHandle::Parse(h.Encode());
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->secret, h.secret);
  EXPECT_EQ(p->uid_slot, 7);
  EXPECT_EQ(p->layer_fd, 12);
  EXPECT_EQ(p->id_base, 100000u);
  EXPECT_TRUE(p->disk_image);
  EXPECT_EQ(p->overlays, h.overlays);
  EXPECT_EQ(p->base, "debian");
  EXPECT_EQ(p->layer_digests, h.layer_digests);
}

TEST(AdoptionHandleTest, AnOlderEdgesHandleHasOnlyTheSecretAndSlot) {
  auto p = AdoptionHandle::Parse(R"({"secret":"s3cret","uid_slot":-1})");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->uid_slot, -1);
  EXPECT_EQ(p->layer_fd, -1);  // cannot snapshot
  EXPECT_EQ(p->base, "host");
  EXPECT_TRUE(p->layer_digests.empty());
  EXPECT_FALSE(p->disk_image);
}

TEST(AdoptionHandleTest, UnknownKeysAreIgnored) {
  EXPECT_TRUE(AdoptionHandle::Parse(R"({"secret":"s","future":{"x":1}})").ok());
}

TEST(AdoptionHandleTest, BadHandlesAreErrors) {
  for (const char* bad :
       {"", "[]", "not json", R"({})", R"({"secret":""})", R"({"secret":5})",
        R"({"secret":"s","uid_slot":"1"})", R"({"secret":"s","uid_slot":-2})",
        R"({"secret":"s","layer_fd":4294967296})", R"({"secret":"s","id_base":-1})",
        R"({"secret":"s","disk_image":"yes"})", R"({"secret":"s","overlays":"/"})",
        R"({"secret":"s","overlays":[1]})", R"({"secret":"s","stack":[]})",
        R"({"secret":"s","stack":{"layers":[null]}})"}) {
    auto p = AdoptionHandle::Parse(bad);
    EXPECT_FALSE(p.ok()) << bad;
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace dsec::backends::container
