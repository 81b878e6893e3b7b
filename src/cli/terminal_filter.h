// Makes a command's output safe to print on the user's terminal. Output from a sandbox is the
// sandbox's to choose: raw, its escape sequences could move the cursor, clear the screen,
// rewrite what was printed before it (a fake "tests passed"), retitle the window or, on some
// terminals, send replies as if typed. Shown instead, in caret form like `cat -v`: ESC (^[),
// the other C0 controls except tab, newline and carriage return (^A ... ^_), DEL (^?) and the
// C1 controls U+0080..U+009F (M-^@ ... M-^_, which some terminals read as ESC sequences too).
// Everything else, UTF-8 included, passes unchanged. Streams in chunks: a C1 sequence split
// between two chunks is held back one byte. Not thread-safe (one per output stream).
#pragma once

#include <string>
#include <string_view>

namespace dsec::cli {

class TerminalFilter {
 public:
  std::string Filter(std::string_view in);
  // What is still held back at the end of the stream.
  std::string Flush();

 private:
  bool pending_c2_ = false;  // the previous chunk ended with 0xC2 (a C1 control may follow)
};

}  // namespace dsec::cli
