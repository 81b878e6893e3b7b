#include "archive/tar_sparse.h"

#include <string>

namespace dsec::archive {

namespace {
Status Malformed(const std::string& why) {
  return InvalidArgument("tar: malformed sparse map: " + why);
}
}  // namespace

Status SparseMap::Number(uint64_t v) {
  if (numbers_ == 0) {
    if (v > kMaxRegions) return Malformed("more than " + std::to_string(kMaxRegions) + " regions");
    count_ = v;
    regions_.reserve(static_cast<size_t>(v));
  } else if (numbers_ % 2 == 1) {
    regions_.emplace_back(v, 0);
  } else {
    regions_.back().second = v;
  }
  ++numbers_;
  if (numbers_ == 1 + 2 * count_) text_done_ = true;
  return OkStatus();
}

StatusOr<size_t> SparseMap::Consume(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && !done_) {
    const char c = data[used++];
    ++consumed_;
    if (text_done_) {
      if (c != '\0') return Malformed("padding is not NUL");
    } else if (c >= '0' && c <= '9') {
      if (++digits_ > 19) return Malformed("number too long");
      value_ = value_ * 10 + static_cast<uint64_t>(c - '0');
    } else if (c == '\n' && digits_ > 0) {
      DSEC_RETURN_IF_ERROR(Number(value_));
      value_ = 0;
      digits_ = 0;
    } else {
      return Malformed("unexpected byte in the map");
    }
    if (text_done_ && consumed_ % 512 == 0) done_ = true;
  }
  return used;
}

Status SparseMap::Validate(uint64_t realsize, uint64_t data_after_map) const {
  uint64_t end = 0, total = 0;
  for (const auto& [off, len] : regions_) {
    if (off < end) return Malformed("regions overlap or are out of order");
    if (off > realsize || len > realsize - off)
      return Malformed("a region lies past the real size");
    end = off + len;
    total += len;
  }
  if (total != data_after_map)
    return Malformed("regions hold " + std::to_string(total) + " bytes, the entry " +
                     std::to_string(data_after_map));
  return OkStatus();
}

}  // namespace dsec::archive
