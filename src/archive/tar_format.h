// What the tar reader and writer share (internal to src/archive): the ustar header layout,
// numeric field codecs, bounds and archive path handling. Lookups in the tree go through
// base/in_root.h.
#pragma once

#include <fcntl.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/in_root.h"
#include "base/status.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "sys/syscalls.h"

namespace dsec::archive::internal {

constexpr size_t kBlockSize = 512;
// Bound on GNU long names/links and on each kept pax value (path, linkpath, size, mtime).
constexpr size_t kMaxMetaBytes = 64 * 1024;
constexpr size_t kMaxPaxKeyBytes = 64;
constexpr size_t kWriteBufferBytes = 64 * 1024;
constexpr size_t kReadChunkBytes = 256 * 1024;
// Retries for create-after-unlink races (lookups retry in base/in_root.h).
constexpr int kMaxRetries = 32;
constexpr uint64_t kMaxOctal11 = 077777777777ull;  // largest value of an 11-digit octal field
// TarCreator skips (and counts) entries whose archive path is longer than PATH_MAX, and
// directories nested deeper than this many levels below the archived one.
constexpr size_t kMaxArchivePathBytes = 4096;
constexpr size_t kMaxArchiveDepth = 1024;

struct Field {
  size_t offset;
  size_t size;
};
constexpr Field kName{0, 100};
constexpr Field kMode{100, 8};
constexpr Field kUid{108, 8};
constexpr Field kGid{116, 8};
constexpr Field kSize{124, 12};
constexpr Field kMtime{136, 12};
constexpr Field kChksum{148, 8};
constexpr size_t kTypeflagOffset = 156;
constexpr Field kLinkname{157, 100};
constexpr Field kMagic{257, 8};                                             // magic[6] + version[2]
constexpr char kPosixMagic[8] = {'u', 's', 't', 'a', 'r', '\0', '0', '0'};  // "ustar\0" "00"
constexpr char kGnuMagic[8] = {'u', 's', 't', 'a', 'r', ' ', ' ', '\0'};    // "ustar  \0"
constexpr Field kDevmajor{329, 8};
constexpr Field kDevminor{337, 8};
constexpr Field kPrefix{345, 155};

inline std::string_view FieldView(const char* block, Field f) { return {block + f.offset, f.size}; }

// A NUL-terminated (or full-width) string field.
inline std::string_view FieldString(const char* block, Field f) {
  std::string_view v = FieldView(block, f);
  return v.substr(0, v.find('\0'));
}

// Octal numeric field: optional leading spaces, octal digits, then only spaces/NULs.
// An empty field is 0.
inline std::optional<uint64_t> ParseOctal(std::string_view f) {
  size_t i = 0;
  while (i < f.size() && f[i] == ' ') ++i;
  uint64_t v = 0;
  for (; i < f.size() && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (v > (UINT64_MAX >> 3)) return std::nullopt;
    v = (v << 3) | static_cast<uint64_t>(f[i] - '0');
  }
  for (; i < f.size(); ++i) {
    if (f[i] != ' ' && f[i] != '\0') return std::nullopt;
  }
  return v;
}

// Octal, or GNU base-256 (leading byte 0x80 positive, 0xff negative two's complement).
inline std::optional<int64_t> ParseNumeric(std::string_view f) {
  if (f.empty()) return 0;
  const auto first = static_cast<unsigned char>(f[0]);
  if (first == 0x80 || first == 0xff) {
    const bool negative = first == 0xff;
    uint64_t v = 0;
    for (size_t i = 1; i < f.size(); ++i) {
      if (v >> 55) return std::nullopt;  // would not fit in 63 bits
      auto b = static_cast<unsigned char>(f[i]);
      if (negative) b = static_cast<unsigned char>(~b);
      v = (v << 8) | b;
    }
    return negative ? -static_cast<int64_t>(v) - 1 : static_cast<int64_t>(v);
  }
  if (first & 0x80) return std::nullopt;
  std::optional<uint64_t> v = ParseOctal(f);
  if (!v || *v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<int64_t>(*v);
}

inline bool IsZeroBlock(const char* b) {
  for (size_t i = 0; i < kBlockSize; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// The checksum field holds the sum of all header bytes with the field itself read as spaces.
// Historic writers summed signed chars; accept either.
inline bool ChecksumMatches(const char* b) {
  std::optional<uint64_t> stored = ParseOctal(FieldView(b, kChksum));
  if (!stored) return false;
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kBlockSize; ++i) {
    const bool in_field = i >= kChksum.offset && i < kChksum.offset + kChksum.size;
    unsigned_sum += in_field ? ' ' : static_cast<unsigned char>(b[i]);
    signed_sum += in_field ? ' ' : static_cast<signed char>(b[i]);
  }
  return *stored == unsigned_sum || static_cast<int64_t>(*stored) == signed_sum;
}

inline uint64_t PaddingFor(uint64_t size) { return (kBlockSize - size % kBlockSize) % kBlockSize; }

// Splits an archive path into components: empty and "." components are dropped (which strips
// leading "/" and "./"); NUL bytes and ".." components are rejected. Returns an error reason.
inline std::optional<std::string> SplitArchivePath(std::string_view path,
                                                   std::vector<std::string>* out) {
  out->clear();
  if (path.find('\0') != std::string_view::npos) return "contains a NUL byte";
  for (std::string_view part : SplitString(path, '/', /*skip_empty=*/true)) {
    if (part == ".") continue;
    if (part == "..") return "contains a \"..\" component";
    out->emplace_back(part);
  }
  return std::nullopt;
}

}  // namespace dsec::archive::internal
