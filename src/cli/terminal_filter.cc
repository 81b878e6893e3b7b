#include "cli/terminal_filter.h"

namespace dsec::cli {

namespace {
void Caret(std::string* out, unsigned char c) {
  out->push_back('^');
  out->push_back(c == 0x7f ? '?' : static_cast<char>(c + 0x40));
}
}  // namespace

std::string TerminalFilter::Filter(std::string_view in) {
  std::string out;
  out.reserve(in.size() + 8);
  size_t i = 0;
  if (pending_c2_ && !in.empty()) {
    pending_c2_ = false;
    unsigned char c = static_cast<unsigned char>(in[0]);
    if (c >= 0x80 && c <= 0x9f) {
      out += "M-";
      Caret(&out, static_cast<unsigned char>(c - 0x80));
      i = 1;
    } else {
      out.push_back('\xc2');
    }
  }
  for (; i < in.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(in[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) {
      Caret(&out, c);
    } else if (c == 0xc2) {
      if (i + 1 == in.size()) {
        pending_c2_ = true;
        break;
      }
      unsigned char n = static_cast<unsigned char>(in[i + 1]);
      if (n >= 0x80 && n <= 0x9f) {
        out += "M-";
        Caret(&out, static_cast<unsigned char>(n - 0x80));
        ++i;
      } else {
        out.push_back(static_cast<char>(c));
      }
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string TerminalFilter::Flush() {
  if (!pending_c2_) return "";
  pending_c2_ = false;
  return "\xc2";
}

}  // namespace dsec::cli
