// A streaming parser for pax extended header records (internal to src/archive).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "archive/tar_format.h"

namespace dsec::archive::internal {

// Streaming parser for pax extended header records ("<len> <key>=<value>\n"). Only the values
// the extractor uses are kept (bounded); other records (xattrs, ...) are skipped unbuffered.
class PaxParser {
 public:
  struct Result {
    std::optional<std::string> path, linkpath;
    std::optional<uint64_t> size;
    std::optional<int64_t> mtime;
    std::optional<uint64_t> uid, gid;
    bool sparse = false;
    // PAX sparse format 1.0 (tar_sparse.h); other GNU.sparse versions are skipped.
    std::optional<std::string> sparse_name;
    std::optional<uint64_t> sparse_realsize;
    std::string sparse_major, sparse_minor;
  };

  void Reset(Result* result) {
    result_ = result;
    state_ = State::kLength;
    length_ = 0;
    length_digits_ = 0;
  }

  Status Consume(std::string_view data) {
    while (!data.empty()) {
      switch (state_) {
        case State::kLength: {
          const char c = data.front();
          data.remove_prefix(1);
          if (c >= '0' && c <= '9') {
            if (++length_digits_ > 18) return Malformed("record length too long");
            length_ = length_ * 10 + static_cast<uint64_t>(c - '0');
          } else if (c == ' ' && length_digits_ > 0) {
            const uint64_t used = length_digits_ + 1;
            if (length_ < used + 3) return Malformed("record length too small");
            remaining_ = length_ - used;
            key_.clear();
            key_truncated_ = false;
            state_ = State::kKey;
          } else if (c == '\0' && length_digits_ == 0) {
            state_ = State::kTrailer;  // some writers pad the header data with NULs
          } else {
            return Malformed("bad record length");
          }
          break;
        }
        case State::kKey: {
          const char c = data.front();
          data.remove_prefix(1);
          if (--remaining_ == 0) return Malformed("record has no value");
          if (c == '=') {
            if (key_.empty()) return Malformed("empty key");
            if (StartsWith(key_, "GNU.sparse.")) result_->sparse = true;
            keep_ =
                !key_truncated_ && (key_ == "path" || key_ == "linkpath" || key_ == "size" ||
                                    key_ == "mtime" || key_ == "uid" || key_ == "gid" ||
                                    key_ == "GNU.sparse.name" || key_ == "GNU.sparse.realsize" ||
                                    key_ == "GNU.sparse.major" || key_ == "GNU.sparse.minor");
            value_.clear();
            state_ = State::kValue;
          } else if (c == '\n' || c == '\0') {
            return Malformed("bad key");
          } else if (key_.size() < kMaxPaxKeyBytes) {
            key_ += c;
          } else {
            key_truncated_ = true;
          }
          break;
        }
        case State::kValue: {
          // remaining_ counts the value plus the terminating '\n'.
          const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size()));
          std::string_view chunk = data.substr(0, n);
          data.remove_prefix(n);
          remaining_ -= n;
          const bool last = remaining_ == 0;
          if (last) {
            if (chunk.back() != '\n') return Malformed("record not terminated by newline");
            chunk.remove_suffix(1);
          }
          if (keep_) {
            if (value_.size() + chunk.size() > kMaxMetaBytes) {
              return InvalidArgument("tar: pax \"" + key_ + "\" value longer than " +
                                     std::to_string(kMaxMetaBytes) + " bytes");
            }
            value_.append(chunk);
          }
          if (last) {
            if (keep_) DSEC_RETURN_IF_ERROR(Apply());
            state_ = State::kLength;
            length_ = 0;
            length_digits_ = 0;
          }
          break;
        }
        case State::kTrailer:
          if (data.find_first_not_of('\0') != std::string_view::npos) {
            return Malformed("data after NUL padding");
          }
          data = {};
          break;
      }
    }
    return OkStatus();
  }

  Status Finish() const {
    if (state_ == State::kTrailer || (state_ == State::kLength && length_digits_ == 0)) {
      return OkStatus();
    }
    return Malformed("truncated record");
  }

 private:
  enum class State { kLength, kKey, kValue, kTrailer };

  static Status Malformed(const std::string& why) {
    return InvalidArgument("tar: malformed pax extended header: " + why);
  }

  // An empty value deletes the keyword (the ustar header field applies again).
  Status Apply() {
    if (key_ == "GNU.sparse.name") {
      result_->sparse_name = value_;
    } else if (key_ == "GNU.sparse.realsize") {
      std::optional<uint64_t> v = ParseUint64(value_);
      if (!v || *v > static_cast<uint64_t>(INT64_MAX)) return Malformed("bad sparse realsize");
      result_->sparse_realsize = v;
    } else if (key_ == "GNU.sparse.major") {
      result_->sparse_major = value_;
    } else if (key_ == "GNU.sparse.minor") {
      result_->sparse_minor = value_;
    } else if (key_ == "path") {
      result_->path = value_.empty() ? std::nullopt : std::optional<std::string>(value_);
    } else if (key_ == "linkpath") {
      result_->linkpath = value_.empty() ? std::nullopt : std::optional<std::string>(value_);
    } else if (key_ == "size") {
      if (value_.empty()) {
        result_->size.reset();
        return OkStatus();
      }
      std::optional<uint64_t> v = ParseUint64(value_);
      if (!v || *v > static_cast<uint64_t>(INT64_MAX)) {
        return Malformed("bad size " + Quote(value_));
      }
      result_->size = v;
    } else if (key_ == "uid" || key_ == "gid") {
      auto& field = key_ == "uid" ? result_->uid : result_->gid;
      if (value_.empty()) {
        field.reset();
        return OkStatus();
      }
      std::optional<uint64_t> v = ParseUint64(value_);
      if (!v || *v >= 0xFFFFFFFFull) return Malformed("bad " + key_ + " " + Quote(value_));
      field = v;
    } else if (key_ == "mtime") {
      if (value_.empty()) {
        result_->mtime.reset();
        return OkStatus();
      }
      // [-]seconds[.fraction]; the fraction is ignored.
      std::string_view v = value_;
      const bool negative = !v.empty() && v.front() == '-';
      if (negative) v.remove_prefix(1);
      const size_t dot = v.find('.');
      if (dot != std::string_view::npos) {
        std::string_view frac = v.substr(dot + 1);
        if (frac.find_first_not_of("0123456789") != std::string_view::npos) {
          return Malformed("bad mtime " + Quote(value_));
        }
        v = v.substr(0, dot);
      }
      std::optional<uint64_t> secs = ParseUint64(v);
      if (!secs || *secs > static_cast<uint64_t>(INT64_MAX)) {
        return Malformed("bad mtime " + Quote(value_));
      }
      result_->mtime = negative ? -static_cast<int64_t>(*secs) : static_cast<int64_t>(*secs);
    }
    return OkStatus();
  }

  Result* result_ = nullptr;
  State state_ = State::kLength;
  uint64_t length_ = 0;
  uint64_t length_digits_ = 0;
  uint64_t remaining_ = 0;  // bytes left in the current record
  std::string key_;
  bool key_truncated_ = false;
  bool keep_ = false;
  std::string value_;
};

}  // namespace dsec::archive::internal
