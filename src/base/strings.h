// Small string helpers shared by all modules (no dependencies).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsec {

std::vector<std::string_view> SplitString(std::string_view s, char sep, bool skip_empty = false);
std::string JoinStrings(const std::vector<std::string>& parts, std::string_view sep);
std::string_view TrimWhitespace(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);
// Parses a decimal integer; rejects trailing junk, overflow and empty input.
std::optional<int64_t> ParseInt64(std::string_view s);
std::optional<uint64_t> ParseUint64(std::string_view s);
std::string HexEncode(std::string_view bytes);
// Shortest readable form of a number: "1", "0.25", "1048576", "1.5e+20" (%.10g).
std::string FormatNumber(double v);

}  // namespace dsec
