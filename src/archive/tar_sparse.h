// The map of a PAX sparse entry, format 1.0 (what GNU tar writes with --sparse and
// images/capture.cc writes for files with holes): at the start of the entry's data, decimal
// lines "count", then count pairs "offset" and "length", NUL-padded to a 512-byte boundary;
// the data regions follow, concatenated. The real name and size come from the pax records
// GNU.sparse.name and GNU.sparse.realsize.
// Bounded: at most kMaxRegions regions, numbers of at most 19 digits. Not thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dsec::archive {

class SparseMap {
 public:
  static constexpr uint64_t kMaxRegions = 1 << 20;

  // Consumes map bytes (text and padding) from the front of `data`; returns how many.
  StatusOr<size_t> Consume(std::string_view data);
  bool done() const { return done_; }
  // After done(): the regions must be ascending, disjoint and inside realsize, and their
  // lengths must add up to the entry's data that follows the map.
  Status Validate(uint64_t realsize, uint64_t data_after_map) const;
  const std::vector<std::pair<uint64_t, uint64_t>>& regions() const { return regions_; }

 private:
  Status Number(uint64_t v);
  std::vector<std::pair<uint64_t, uint64_t>> regions_;
  uint64_t count_ = 0;
  uint64_t numbers_ = 0;  // numbers parsed so far (the count included)
  uint64_t value_ = 0;
  int digits_ = 0;
  uint64_t consumed_ = 0;
  bool text_done_ = false;
  bool done_ = false;
};

}  // namespace dsec::archive
