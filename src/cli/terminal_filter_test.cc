#include "cli/terminal_filter.h"

#include <gtest/gtest.h>

namespace dsec::cli {
namespace {

TEST(TerminalFilterTest, ControlSequencesAreShownNotObeyed) {
  TerminalFilter f;
  // Clear screen, cursor up, OSC title, bell, backspace, DEL; tab/newline/CR and UTF-8 pass.
  EXPECT_EQ(f.Filter("\x1b[2J\x1b[1Aok\x1b]0;pwned\x07 a\bb\x7f\tx\r\n\xc3\xa9"),
            "^[[2J^[[1Aok^[]0;pwned^G a^Hb^?\tx\r\n\xc3\xa9");
  // C1 controls (U+009B is CSI on some terminals), also split between chunks.
  EXPECT_EQ(f.Filter("\xc2\x9b"
                     "2J \xc2\xa0"),
            "M-^[2J \xc2\xa0");
  EXPECT_EQ(f.Filter("x\xc2"), "x");
  EXPECT_EQ(f.Filter("\x9b"
                     "1A"),
            "M-^[1A");
  EXPECT_EQ(f.Filter("\xc2"), "");
  EXPECT_EQ(f.Filter("\xa9"), "\xc2\xa9");
  EXPECT_EQ(f.Filter("\xc2"), "");
  EXPECT_EQ(f.Flush(), "\xc2");
  EXPECT_EQ(f.Flush(), "");
  EXPECT_EQ(f.Filter(std::string("a\0b", 3)), "a^@b");
}

}  // namespace
}  // namespace dsec::cli
