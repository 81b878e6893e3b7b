#include "base/base64.h"

#include <gtest/gtest.h>

namespace dsec {
namespace {

TEST(Base64Test, RoundTripsAllLengths) {
  std::string s;
  for (int i = 0; i < 300; ++i) {
    auto enc = Base64Encode(s);
    auto dec = Base64Decode(enc);
    ASSERT_TRUE(dec.has_value()) << i;
    EXPECT_EQ(*dec, s);
    s.push_back(static_cast<char>(i * 37));
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
}

TEST(Base64Test, RejectsGarbage) {
  EXPECT_FALSE(Base64Decode("abc"));
  EXPECT_FALSE(Base64Decode("ab!d"));
  EXPECT_FALSE(Base64Decode("a=bc"));
  EXPECT_FALSE(Base64Decode("ab=c"));
}

}  // namespace
}  // namespace dsec
