#include "base/ids.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "base/strings.h"

namespace dsec {

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      abort();  // getrandom cannot fail on a supported kernel once the pool is initialized.
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

std::string RandomHex(size_t n) { return HexEncode(RandomBytes(n)); }

std::string RandomBase32(size_t chars) {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  std::string raw = RandomBytes(chars);
  std::string out(chars, 'a');
  for (size_t i = 0; i < chars; ++i) out[i] = kAlphabet[static_cast<unsigned char>(raw[i]) & 31];
  return out;
}

std::string NewSandboxId(std::string_view node) {
  std::string id = "sb-";
  id += node;
  id += '-';
  id += RandomBase32(12);
  return id;
}

std::string InstanceIdForPath(std::string_view canonical_path) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : canonical_path) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h >> (56 - 8 * i)) & 0xff);
  return HexEncode(bytes).substr(0, 12);
}

bool IsSafeName(std::string_view s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return s.find("..") == std::string_view::npos;
}

Status ValidateSafeName(std::string_view what, std::string_view s) {
  if (IsSafeName(s)) return OkStatus();
  return InvalidArgument(std::string(what) +
                         " must be 1-128 characters of [A-Za-z0-9._-] without '..'");
}

}  // namespace dsec
