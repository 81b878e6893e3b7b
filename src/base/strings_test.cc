#include "base/strings.h"

#include <gtest/gtest.h>

namespace dsec {
namespace {

TEST(StringsTest, Split) {
  auto p = SplitString("a,,b", ',');
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1], "");
  EXPECT_EQ(SplitString("a,,b", ',', true).size(), 2u);
}

TEST(StringsTest, StrCat) {
  std::string name = "x";
  EXPECT_EQ(StrCat({}), "");
  EXPECT_EQ(StrCat({"\"", name, "\" is ", std::to_string(42)}), "\"x\" is 42");
}

TEST(StringsTest, ParseIntRejectsJunk) {
  EXPECT_EQ(ParseInt64("-12"), -12);
  EXPECT_FALSE(ParseInt64("12x"));
  EXPECT_FALSE(ParseInt64(""));
  EXPECT_FALSE(ParseInt64("99999999999999999999"));
  EXPECT_FALSE(ParseUint64("-1"));
  EXPECT_EQ(ParseUint64("18446744073709551615"), 18446744073709551615ULL);
}

TEST(StringsTest, TrimAndHex) {
  EXPECT_EQ(TrimWhitespace("  x y \n"), "x y");
  EXPECT_EQ(TrimWhitespace("   "), "");
  EXPECT_EQ(HexEncode(std::string("\x01\xab", 2)), "01ab");
}

TEST(StringsTest, FormatNumber) {
  EXPECT_EQ(FormatNumber(1), "1");
  EXPECT_EQ(FormatNumber(0.25), "0.25");
  EXPECT_EQ(FormatNumber(1048576), "1048576");
  EXPECT_EQ(FormatNumber(1.5e20), "1.5e+20");
}

}  // namespace
}  // namespace dsec
