#include "base/enum_names.h"

#include <gtest/gtest.h>

namespace dsec {
namespace {

enum class Color { kRed, kGreen, kBlue, kUnlisted };
constexpr EnumName<Color> kColors[] = {
    {Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}};
constexpr EnumName<Color> kOne[] = {{Color::kRed, "red"}};

TEST(EnumNamesTest, NamesAndValuesRoundTrip) {
  for (const auto& e : kColors) {
    EXPECT_EQ(NameIn(kColors, e.value), e.name);
    EXPECT_EQ(ValueIn(kColors, e.name), e.value);
  }
  static_assert(NameIn(kColors, Color::kBlue) == "blue");
  static_assert(*ValueIn(kColors, "green") == Color::kGreen);
}

TEST(EnumNamesTest, UnknownNamesAndValues) {
  EXPECT_EQ(ValueIn(kColors, "Red"), std::nullopt);  // exact
  EXPECT_EQ(ValueIn(kColors, ""), std::nullopt);
  EXPECT_EQ(ValueIn(kColors, "red "), std::nullopt);
  EXPECT_EQ(NameIn(kColors, Color::kUnlisted), "red");  // the first entry
}

TEST(EnumNamesTest, ListForMessages) {
  EXPECT_EQ(NamesIn(kColors), "red, green or blue");
  EXPECT_EQ(NamesIn(kOne), "red");
}

}  // namespace
}  // namespace dsec
