#include "api/request_json.h"

#include <gtest/gtest.h>

#include "api/errors.h"
#include "base/json.h"

namespace dsec::api {
namespace {

TEST(RequestJsonTest, RequestIds) {
  EXPECT_EQ(BodyRequestId(R"({"request_id":"r1","x":1})").value(), "r1");
  EXPECT_FALSE(BodyRequestId("").value());
  EXPECT_FALSE(BodyRequestId("{}").value());
  EXPECT_FALSE(BodyRequestId(R"({"request_id":null})").value());
  EXPECT_FALSE(BodyRequestId("[1]").value());
  EXPECT_FALSE(BodyRequestId("not json").value());  // its handler reports it
  EXPECT_EQ(BodyRequestId(R"({"request_id":1})").status().message(),
            "\"request_id\" must be a string");
  EXPECT_EQ(BodyRequestId(R"({"request_id":""})").status().message(),
            "\"request_id\" must not be empty");
  // Not strict JSON: refused whichever route it is for.
  auto dup = BodyRequestId(R"({"a":1,"a":2})");
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BodyRequestId(std::string_view("{\"a\":\"\0\"}", 9)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(RequestJsonTest, TombstoneErrors) {
  EXPECT_EQ(TombstoneErrorBody("gone", "sandbox sb-1 is gone", "ttl", 5),
            R"({"error":{"at":5,"code":"gone","message":"sandbox sb-1 is gone","reason":"ttl"}})");
}

}  // namespace
}  // namespace dsec::api
