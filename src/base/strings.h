// Small string helpers shared by all modules (no dependencies).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsec {

std::vector<std::string_view> SplitString(std::string_view s, char sep, bool skip_empty = false);
// One string from its pieces, sized once: StrCat({"\"", path, "\": ", why}). Also the way
// around GCC 12's false -Wrestrict at -O3 on `"literal" + std::string&&` (it inlines an insert
// at offset 0 and cannot prove the copy does not overlap).
std::string StrCat(std::initializer_list<std::string_view> pieces);
std::string JoinStrings(const std::vector<std::string>& parts, std::string_view sep);
std::string_view TrimWhitespace(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);
// Parses a decimal integer; rejects trailing junk, overflow and empty input.
std::optional<int64_t> ParseInt64(std::string_view s);
std::optional<uint64_t> ParseUint64(std::string_view s);
std::string HexEncode(std::string_view bytes);
// Shortest readable form of a number: "1", "0.25", "1048576", "1.5e+20" (%.10g).
std::string FormatNumber(double v);
// Quotes a name for error messages: printable ASCII as is (with \" and \\), everything else as
// \xNN, and at most ~300 bytes of it.
std::string Quote(std::string_view s);

}  // namespace dsec
