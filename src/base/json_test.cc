#include "base/json.h"

#include <gtest/gtest.h>

namespace dsec {
namespace {

TEST(JsonTest, ASyntaxErrorSaysWhere) {
  auto r = ParseJson("{\n  \"a\": 1,\n  \"b\": tru }");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_TRUE(m.starts_with("malformed JSON: ")) << m;
  EXPECT_NE(m.find("line 3"), std::string::npos) << m;
  EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
}

TEST(JsonTest, LongInputGivesABoundedMessage) {
  auto r = ParseJson("[\"" + std::string(100000, 'x'));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 300u);
}

TEST(JsonTest, ValidDocumentsParse) {
  auto r = ParseJson(R"({"a": [1, "two", null]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["a"][1], "two");
  EXPECT_FALSE(ParseJson("").ok());
}

}  // namespace
}  // namespace dsec
