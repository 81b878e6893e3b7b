// Identifiers: random tokens, sandbox ids (sb-<node>-<random>), the edge instance id derived
// from its state dir, and validation of ids that arrive from callers.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dsec {

// Cryptographically random bytes from getrandom(2).
std::string RandomBytes(size_t n);
// Hex of n random bytes (2n characters).
std::string RandomHex(size_t n);
// Lowercase base32 (a-z2-7) random string of `chars` characters.
std::string RandomBase32(size_t chars);

// "sb-<node>-<12 random base32>".
std::string NewSandboxId(std::string_view node);

// Stable short id for an edge instance: 12 hex chars of a 64-bit FNV-1a hash of the
// canonical state dir path. Every kernel object an edge creates carries it.
std::string InstanceIdForPath(std::string_view canonical_path);

// Ids and names from callers: 1..128 chars of [A-Za-z0-9._-], not "." or "..".
// Rejects '/', NUL, "..", whitespace: anything that could turn into a path.
bool IsSafeName(std::string_view s);
Status ValidateSafeName(std::string_view what, std::string_view s);

}  // namespace dsec
