// Base64 (RFC 4648, standard alphabet, padded).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dsec {

std::string Base64Encode(std::string_view in);
// nullopt on characters outside the alphabet or bad padding.
std::optional<std::string> Base64Decode(std::string_view in);

}  // namespace dsec
