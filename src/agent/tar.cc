#include "agent/tar.h"

#include "agent/tar_sparse.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "base/strings.h"
#include "base/unique_fd.h"
#include "sys/syscalls.h"

namespace dsec::agent {

namespace {

constexpr size_t kBlockSize = 512;
// Bound on GNU long names/links and on each kept pax value (path, linkpath, size, mtime).
constexpr size_t kMaxMetaBytes = 64 * 1024;
constexpr size_t kMaxPaxKeyBytes = 64;
constexpr size_t kWriteBufferBytes = 64 * 1024;
constexpr size_t kReadChunkBytes = 256 * 1024;
constexpr uint64_t kResolveFlags = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
// Retries for openat2 EAGAIN (concurrent rename) and for create-after-unlink races.
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

// Quotes a name for error messages: printable ASCII as is, everything else as \xNN, bounded.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (out.size() > 300) {
      out += "...";
      break;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      (void)snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string_view FieldView(const char* block, Field f) { return {block + f.offset, f.size}; }

// A NUL-terminated (or full-width) string field.
std::string_view FieldString(const char* block, Field f) {
  std::string_view v = FieldView(block, f);
  return v.substr(0, v.find('\0'));
}

// Octal numeric field: optional leading spaces, octal digits, then only spaces/NULs.
// An empty field is 0.
std::optional<uint64_t> ParseOctal(std::string_view f) {
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
std::optional<int64_t> ParseNumeric(std::string_view f) {
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

bool IsZeroBlock(const char* b) {
  for (size_t i = 0; i < kBlockSize; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// The checksum field holds the sum of all header bytes with the field itself read as spaces.
// Historic writers summed signed chars; accept either.
bool ChecksumMatches(const char* b) {
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

uint64_t PaddingFor(uint64_t size) { return (kBlockSize - size % kBlockSize) % kBlockSize; }

// Splits an archive path into components: empty and "." components are dropped (which strips
// leading "/" and "./"); NUL bytes and ".." components are rejected. Returns an error reason.
std::optional<std::string> SplitArchivePath(std::string_view path, std::vector<std::string>* out) {
  out->clear();
  if (path.find('\0') != std::string_view::npos) return "contains a NUL byte";
  for (std::string_view part : SplitString(path, '/', /*skip_empty=*/true)) {
    if (part == ".") continue;
    if (part == "..") return "contains a \"..\" component";
    out->emplace_back(part);
  }
  return std::nullopt;
}

std::string JoinComponents(const std::vector<std::string>& comps, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out += '/';
    out += comps[i];
  }
  return out;
}

// openat2 beneath `root` with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS: absolute symlinks and
// ".." are clamped to root, so the result is always inside it. "" means root itself.
StatusOr<UniqueFd> OpenBeneath(int root, const std::string& rel, int flags,
                               uint64_t resolve = kResolveFlags) {
  const char* p = rel.empty() ? "." : rel.c_str();
  for (int attempt = 0;; ++attempt) {
    int fd = sys::Openat2(root, p, flags | O_CLOEXEC, 0, resolve);
    if (fd >= 0) return UniqueFd(fd);
    if ((errno == EAGAIN || errno == EINTR) && attempt < kMaxRetries) continue;
    return ErrnoError("openat2 " + Quote(p));
  }
}

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// TarExtractor

class TarExtractor::Impl {
 public:
  Impl(int dest_dirfd, TarExtractOptions opts) : dest_(dest_dirfd), opts_(opts) {
    write_buf_.reserve(kWriteBufferBytes);
  }

  Status Feed(std::string_view data) {
    if (!error_.ok()) return error_;
    if (finished_) return FailedPrecondition("tar: Feed after Finish");
    Status s = FeedImpl(data);
    if (!s.ok()) Fail(s);
    return s;
  }

  Status Finish() {
    if (!error_.ok()) return error_;
    if (finished_) return OkStatus();
    Status s = FinishImpl();
    if (!s.ok()) {
      Fail(s);
      return s;
    }
    finished_ = true;
    return OkStatus();
  }

  const TarExtractStats& stats() const { return stats_; }

 private:
  enum class State { kHeader, kData, kPadding, kEnd };
  enum class DataKind { kFile, kSparseFile, kLongName, kLongLink, kPax, kSkip };

  void Fail(const Status& s) {
    error_ = s;
    file_fd_.Reset();
    write_buf_.clear();
  }

  Status FeedImpl(std::string_view data) {
    while (!data.empty()) {
      switch (state_) {
        case State::kEnd:
          offset_ += data.size();  // anything after the end-of-archive marker is ignored
          return OkStatus();
        case State::kHeader: {
          const size_t n = std::min(kBlockSize - header_len_, data.size());
          memcpy(header_ + header_len_, data.data(), n);
          header_len_ += n;
          offset_ += n;
          data.remove_prefix(n);
          if (header_len_ == kBlockSize) {
            header_len_ = 0;
            DSEC_RETURN_IF_ERROR(ProcessHeader());
          }
          break;
        }
        case State::kData: {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(data_remaining_, data.size()));
          DSEC_RETURN_IF_ERROR(ConsumeData(data.substr(0, n)));
          data_remaining_ -= n;
          offset_ += n;
          data.remove_prefix(n);
          if (data_remaining_ == 0) DSEC_RETURN_IF_ERROR(EndData());
          break;
        }
        case State::kPadding: {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(pad_remaining_, data.size()));
          pad_remaining_ -= n;
          offset_ += n;
          data.remove_prefix(n);
          if (pad_remaining_ == 0) state_ = State::kHeader;
          break;
        }
      }
    }
    return OkStatus();
  }

  Status FinishImpl() {
    const std::string at = " at offset " + std::to_string(offset_);
    switch (state_) {
      case State::kEnd:
        return OkStatus();
      case State::kData:
      case State::kPadding:
        return InvalidArgument("tar: archive truncated in the data of " + Quote(entry_name_) + at);
      case State::kHeader:
        if (header_len_ != 0) return InvalidArgument("tar: archive truncated inside a header" + at);
        if (meta_pending_) {
          return InvalidArgument("tar: archive ended after an extended header without its entry" +
                                 at);
        }
        if (zero_blocks_ == 1) return OkStatus();  // a lone trailing zero block (GNU tar accepts)
        if (opts_.require_end_marker) {
          return InvalidArgument("tar: archive truncated: no end-of-archive marker" + at);
        }
        return OkStatus();
    }
    return OkStatus();
  }

  Status HeaderError(const std::string& why) const {
    return InvalidArgument("tar: header at offset " + std::to_string(offset_ - kBlockSize) + ": " +
                           why);
  }

  Status EntryError(StatusCode code, const std::string& name, const std::string& why) const {
    return Status(code, "tar entry " + Quote(name) + ": " + why);
  }

  void ClearMeta() {
    meta_pending_ = false;
    long_name_.reset();
    long_link_.reset();
    pax_ = PaxParser::Result();
  }

  void StartData(DataKind kind, uint64_t size) {
    data_kind_ = kind;
    data_remaining_ = size;
    pad_remaining_ = PaddingFor(size);
    state_ = State::kData;
  }

  Status ProcessHeader() {
    const char* h = header_;
    if (IsZeroBlock(h)) {
      if (meta_pending_) return HeaderError("end-of-archive marker after an extended header");
      if (++zero_blocks_ == 2) state_ = State::kEnd;
      return OkStatus();
    }
    if (zero_blocks_ != 0) return HeaderError("data after a lone zero block");
    if (!ChecksumMatches(h))
      return HeaderError("bad header checksum (corrupt or not a tar archive)");

    std::string_view magic = FieldView(h, kMagic);
    // POSIX readers only check "ustar\0" (some writers put other version bytes).
    const bool posix = magic.substr(0, 6) == std::string_view(kPosixMagic, 6);
    const bool gnu = magic == std::string_view(kGnuMagic, sizeof kGnuMagic);
    const bool v7 = magic.find_first_not_of('\0') == std::string_view::npos;
    if (!posix && !gnu && !v7) return HeaderError("unknown header format");

    const char type = h[kTypeflagOffset];
    std::optional<int64_t> header_size = ParseNumeric(FieldView(h, kSize));
    if (!header_size || *header_size < 0) return HeaderError("bad size field");
    const auto size = static_cast<uint64_t>(*header_size);

    switch (type) {
      case 'L':
      case 'K':
        if (size > kMaxMetaBytes) {
          return HeaderError("GNU long name/link longer than " + std::to_string(kMaxMetaBytes) +
                             " bytes");
        }
        meta_pending_ = true;
        meta_buf_.clear();
        entry_name_ = "(GNU long name)";
        StartData(type == 'L' ? DataKind::kLongName : DataKind::kLongLink, size);
        return size == 0 ? EndData() : OkStatus();
      case 'x':
        meta_pending_ = true;
        pax_parser_.Reset(&pax_);
        entry_name_ = "(pax header)";
        StartData(DataKind::kPax, size);
        return size == 0 ? EndData() : OkStatus();
      case 'g':  // global pax header: ignored
        entry_name_ = "(pax global header)";
        StartData(DataKind::kSkip, size);
        return size == 0 ? EndData() : OkStatus();
      default:
        break;
    }

    // A real entry; the pending extended headers apply to it.
    std::string name;
    if (pax_.path) {
      name = *pax_.path;
    } else if (long_name_) {
      name = *long_name_;
    } else {
      name = std::string(FieldString(h, kName));
      std::string_view prefix = FieldString(h, kPrefix);
      if (posix && !prefix.empty()) name = std::string(prefix) + "/" + name;
    }
    std::string link;
    if (pax_.linkpath) {
      link = *pax_.linkpath;
    } else if (long_link_) {
      link = *long_link_;
    } else {
      link = std::string(FieldString(h, kLinkname));
    }
    const uint64_t data_size = pax_.size.value_or(size);
    std::optional<int64_t> mtime = pax_.mtime;
    if (!mtime) mtime = ParseNumeric(FieldView(h, kMtime));
    if (!mtime) return HeaderError("bad mtime field");
    std::optional<uint64_t> mode = ParseOctal(FieldView(h, kMode));
    if (!mode) return HeaderError("bad mode field");
    entry_uid_ = opts_.uid;
    entry_gid_ = opts_.gid;
    if (opts_.image_layer) {
      std::optional<int64_t> uid =
          pax_.uid ? std::optional<int64_t>(*pax_.uid) : ParseNumeric(FieldView(h, kUid));
      std::optional<int64_t> gid =
          pax_.gid ? std::optional<int64_t>(*pax_.gid) : ParseNumeric(FieldView(h, kGid));
      if (!uid || !gid || *uid < 0 || *gid < 0 || *uid >= 0xFFFFFFFFll || *gid >= 0xFFFFFFFFll)
        return HeaderError("bad uid or gid field");
      entry_uid_ = static_cast<uid_t>(*uid);
      entry_gid_ = static_cast<gid_t>(*gid);
    }
    const bool sparse = pax_.sparse;
    // A sparse 1.0 file: the real name and size are in the pax records, its data starts with
    // the region map.
    const bool sparse10 = sparse && pax_.sparse_major == "1" && pax_.sparse_minor == "0" &&
                          pax_.sparse_name && !pax_.sparse_name->empty() && pax_.sparse_realsize;
    if (sparse10) name = *pax_.sparse_name;
    const uint64_t sparse_realsize = pax_.sparse_realsize.value_or(0);
    ClearMeta();
    entry_name_ = name;

    if (stats_.entries + stats_.skipped >= opts_.max_entries) {
      return TooLarge("tar: archive has more than " + std::to_string(opts_.max_entries) +
                      " entries");
    }
    std::vector<std::string> comps;
    if (std::optional<std::string> why = SplitArchivePath(name, &comps)) {
      return EntryError(StatusCode::kInvalidArgument, name, "path " + *why);
    }

    char kind = type;
    if (kind == '\0') kind = (!name.empty() && name.back() == '/') ? '5' : '0';
    if (kind == '7') kind = '0';                         // contiguous file
    if (sparse && !sparse10 && kind == '0') kind = 'S';  // older pax sparse formats: skipped
    if (opts_.image_layer) {
      if (!name.empty() && name[0] == '/')
        return EntryError(StatusCode::kInvalidArgument, name,
                          "absolute paths are not allowed in an image layer");
      if (kind == '1' && !link.empty() && link[0] == '/')
        return EntryError(StatusCode::kInvalidArgument, name,
                          "absolute hard link targets are not allowed in an image layer");
      if (kind == '3' || kind == '4' || kind == '6') {
        if (opts_.skip_dev_nodes && comps.size() >= 2 && comps[0] == "dev") {
          ++stats_.skipped;
          if (data_size > 0) StartData(DataKind::kSkip, data_size);
          return OkStatus();
        }
        return EntryError(StatusCode::kInvalidArgument, name,
                          "device nodes and FIFOs are not allowed in an image layer");
      }
      if (!comps.empty() && StartsWith(comps.back(), ".wh.")) {
        if (kind == '5')
          return EntryError(StatusCode::kInvalidArgument, name, "whiteout is a directory");
        DSEC_RETURN_IF_ERROR(CreateWhiteout(name, comps));
        if (kind == '0' && data_size > 0) {
          StartData(DataKind::kSkip, data_size);
          return OkStatus();
        }
        return OkStatus();
      }
    }
    switch (kind) {
      case '0': {
        // A sparse file counts at its real size: reserved here, taken back as its data is
        // written (data_size itself is checked by CreateFile as usual).
        if (sparse10) {
          const uint64_t used = stats_.bytes + sparse_reserved_;
          if (sparse_realsize > opts_.max_total_bytes - std::min(used, opts_.max_total_bytes))
            return Status(StatusCode::kTooLarge,
                          "tar entry " + Quote(name) + ": sparse file of real size " +
                              std::to_string(sparse_realsize) +
                              " exceeds the remaining extraction limit (" +
                              std::to_string(opts_.max_total_bytes) + " bytes total)");
        }
        DSEC_RETURN_IF_ERROR(CreateFile(name, comps, *mode, data_size, *mtime));
        if (sparse10) {
          if (data_size == 0) return HeaderError("sparse entry without a map");
          sparse_reserved_ += sparse_realsize;
          sparse_ = SparseMap();
          sparse_realsize_ = sparse_realsize;
          sparse_region_ = 0;
          sparse_left_ = 0;
          data_kind_ = DataKind::kSparseFile;
        }
        if (data_size == 0) return EndData();
        return OkStatus();
      }
      case '1':  // header-only types: any size field is ignored (no data follows)
        return CreateHardLink(name, comps, link);
      case '2':
        return CreateSymlink(name, comps, link, *mtime);
      case '5':
        return CreateDirectory(name, comps, *mode);
      case '3':  // char device
      case '4':  // block device
      case '6':  // FIFO
        ++stats_.skipped;
        return OkStatus();
      default:  // unknown / unsupported ('S' sparse, 'V' label, 'D' dumpdir, ...): skip data
        ++stats_.skipped;
        StartData(DataKind::kSkip, data_size);
        return data_size == 0 ? EndData() : OkStatus();
    }
  }

  Status ConsumeData(std::string_view d) {
    switch (data_kind_) {
      case DataKind::kFile:
        stats_.bytes += d.size();
        return BufferFileData(d);
      case DataKind::kSparseFile:
        return ConsumeSparse(d);
      case DataKind::kLongName:
      case DataKind::kLongLink:
        meta_buf_.append(d);  // bounded by the size check in ProcessHeader
        return OkStatus();
      case DataKind::kPax:
        return pax_parser_.Consume(d);
      case DataKind::kSkip:
        return OkStatus();
    }
    return OkStatus();
  }

  // A sparse file's data: the map, then each region's bytes at its offset.
  Status ConsumeSparse(std::string_view d) {
    const size_t start = d.size();  // data_remaining_ still counts all of d
    while (!d.empty()) {
      if (!sparse_.done()) {
        DSEC_ASSIGN_OR_RETURN(size_t n, sparse_.Consume(d));
        d.remove_prefix(n);
        if (sparse_.done()) {
          const uint64_t after_map = data_remaining_ - (start - d.size());
          DSEC_RETURN_IF_ERROR(sparse_.Validate(sparse_realsize_, after_map)
                                   .WithContext("tar entry " + Quote(entry_name_)));
        }
        continue;
      }
      while (sparse_left_ == 0) {
        const auto& regions = sparse_.regions();
        if (sparse_region_ >= regions.size()) return HeaderError("sparse data past its map");
        const auto& [off, len] = regions[sparse_region_++];
        if (len == 0) continue;
        DSEC_RETURN_IF_ERROR(FlushFile());
        if (lseek(file_fd_.get(), static_cast<off_t>(off), SEEK_SET) < 0)
          return ErrnoError("lseek " + Quote(entry_name_));
        sparse_left_ = len;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(sparse_left_, d.size()));
      stats_.bytes += n;
      sparse_reserved_ -= std::min<uint64_t>(sparse_reserved_, n);  // regions lie within it
      DSEC_RETURN_IF_ERROR(BufferFileData(d.substr(0, n)));
      sparse_left_ -= n;
      d.remove_prefix(n);
    }
    return OkStatus();
  }

  // Called when an entry's data is complete (immediately for empty data).
  Status EndData() {
    switch (data_kind_) {
      case DataKind::kSparseFile:
        if (!sparse_.done()) return HeaderError("sparse entry ends inside its map");
        DSEC_RETURN_IF_ERROR(FlushFile());
        if (ftruncate(file_fd_.get(), static_cast<off_t>(sparse_realsize_)) < 0)
          return ErrnoError("ftruncate " + Quote(entry_name_));
        [[fallthrough]];
      case DataKind::kFile: {
        DSEC_RETURN_IF_ERROR(FlushFile());
        timespec times[2] = {{file_mtime_, 0}, {file_mtime_, 0}};
        if (futimens(file_fd_.get(), times) < 0) {
          return ErrnoError("futimens " + Quote(entry_name_));
        }
        if (close(file_fd_.Release()) < 0) return ErrnoError("close " + Quote(entry_name_));
        ++stats_.entries;
        break;
      }
      case DataKind::kLongName:
      case DataKind::kLongLink: {
        // GNU tar NUL-terminates the name; an embedded NUL is rejected with the entry.
        std::string v = meta_buf_;
        while (!v.empty() && v.back() == '\0') v.pop_back();
        (data_kind_ == DataKind::kLongName ? long_name_ : long_link_) = std::move(v);
        meta_buf_.clear();
        break;
      }
      case DataKind::kPax:
        DSEC_RETURN_IF_ERROR(pax_parser_.Finish());
        break;
      case DataKind::kSkip:
        break;
    }
    data_kind_ = DataKind::kSkip;
    state_ = pad_remaining_ ? State::kPadding : State::kHeader;
    return OkStatus();
  }

  // --- File system side. Every directory fd below comes from OpenBeneath(dest_), so it is a
  // directory inside the extraction root; final components are single names (never "." or
  // "..") created with O_EXCL/O_NOFOLLOW semantics.

  // Opens (creating missing ones, mode 0755, owned by uid/gid) the directory comps[0..n).
  StatusOr<UniqueFd> OpenParent(const std::string& entry, const std::vector<std::string>& comps,
                                size_t n) {
    StatusOr<UniqueFd> dir =
        OpenBeneath(dest_, JoinComponents(comps, n), O_RDONLY | O_DIRECTORY, resolve_);
    if (dir.ok()) return dir;
    if (dir.status().error_number() != ENOENT) {
      return dir.status().WithContext("tar entry " + Quote(entry));
    }
    // Find the deepest existing prefix by binary search (resolving a prefix resolves every
    // shorter one; comps has no "." or ".."), looking each up from the root so symlinks in it
    // resolve exactly as the kernel would, clamped to the root. A per-prefix walk would cost
    // quadratic time in the depth for every entry of an archive of deep, distinct paths.
    DSEC_ASSIGN_OR_RETURN(UniqueFd cur, OpenBeneath(dest_, "", O_RDONLY | O_DIRECTORY, resolve_));
    size_t lo = 0, hi = n;  // prefix lo exists, prefix hi does not
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      StatusOr<UniqueFd> m =
          OpenBeneath(dest_, JoinComponents(comps, mid), O_RDONLY | O_DIRECTORY, resolve_);
      if (m.ok()) {
        lo = mid;
        cur = std::move(m).value();
      } else if (m.status().error_number() == ENOENT) {
        hi = mid;
      } else {
        return m.status().WithContext("tar entry " + Quote(entry));
      }
    }
    // Then create what is missing: below a directory made here nothing exists yet, so the next
    // component is made directly; anything found there after all is looked up from the root.
    for (size_t i = lo; i < n; ++i) {
      const std::string prefix = JoinComponents(comps, i + 1);
      const char* name = comps[i].c_str();
      StatusOr<UniqueFd> next = NotFound("");
      if (mkdirat(cur.get(), name, 0700) == 0) {
        UniqueFd created(openat(cur.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!created)
          return ErrnoError("open " + Quote(prefix)).WithContext("tar entry " + Quote(entry));
        if (fchown(created.get(), opts_.uid, opts_.gid) < 0 || fchmod(created.get(), 0755) < 0) {
          return ErrnoError("chown/chmod " + Quote(prefix))
              .WithContext("tar entry " + Quote(entry));
        }
        next = std::move(created);
      } else if (errno == EEXIST) {
        // Something appeared (or a dangling symlink is there): resolve it again.
        next = OpenBeneath(dest_, prefix, O_RDONLY | O_DIRECTORY, resolve_);
      } else {
        return ErrnoError("mkdirat " + Quote(prefix)).WithContext("tar entry " + Quote(entry));
      }
      if (!next.ok()) return next.status().WithContext("tar entry " + Quote(entry));
      cur = std::move(next).value();
    }
    return cur;
  }

  // Removes a non-directory at parent/name so it can be replaced; never follows it.
  Status RemoveExisting(int parent, const std::string& entry, const std::string& name) {
    if (unlinkat(parent, name.c_str(), 0) == 0 || errno == ENOENT) return OkStatus();
    if (errno == EISDIR || errno == EPERM) {
      struct stat st;
      if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
        return EntryError(StatusCode::kFailedPrecondition, entry,
                          "a directory already exists at this path");
      }
    }
    return ErrnoError("unlinkat " + Quote(name)).WithContext("tar entry " + Quote(entry));
  }

  Status CreateFile(const std::string& entry, const std::vector<std::string>& comps, uint64_t mode,
                    uint64_t size, int64_t mtime) {
    // Size limit first: a header claiming a huge size fails before anything is created.
    const uint64_t used = stats_.bytes + sparse_reserved_;
    if (size > opts_.max_total_bytes - std::min(used, opts_.max_total_bytes)) {
      return Status(StatusCode::kTooLarge,
                    "tar entry " + Quote(entry) + ": size " + std::to_string(size) +
                        " exceeds the remaining extraction limit (" +
                        std::to_string(opts_.max_total_bytes) + " bytes total)");
    }
    if (comps.empty()) {
      return EntryError(StatusCode::kInvalidArgument, entry, "file name is empty");
    }
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size() - 1));
    const std::string& name = comps.back();
    UniqueFd fd;
    for (int attempt = 0;; ++attempt) {
      // O_EXCL never follows or truncates what is there: an existing symlink, or a hard link
      // planted to some other file, is unlinked and replaced instead of written through.
      fd.Reset(openat(parent.get(), name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600));
      if (fd) break;
      if (errno != EEXIST || attempt >= kMaxRetries) {
        return ErrnoError("create " + Quote(name)).WithContext("tar entry " + Quote(entry));
      }
      DSEC_RETURN_IF_ERROR(RemoveExisting(parent.get(), entry, name));
    }
    if (fchown(fd.get(), entry_uid_, entry_gid_) < 0) {
      return ErrnoError("fchown " + Quote(name)).WithContext("tar entry " + Quote(entry));
    }
    if (fchmod(fd.get(), static_cast<mode_t>(mode & ModeMask())) < 0) {
      return ErrnoError("fchmod " + Quote(name)).WithContext("tar entry " + Quote(entry));
    }
    file_fd_ = std::move(fd);
    file_mtime_ = mtime;
    write_buf_.clear();
    StartData(DataKind::kFile, size);
    return OkStatus();
  }

  Status BufferFileData(std::string_view d) {
    while (!d.empty()) {
      if (write_buf_.empty() && d.size() >= kWriteBufferBytes) return WriteAll(d);
      const size_t n = std::min(kWriteBufferBytes - write_buf_.size(), d.size());
      write_buf_.append(d.substr(0, n));
      d.remove_prefix(n);
      if (write_buf_.size() == kWriteBufferBytes) DSEC_RETURN_IF_ERROR(FlushFile());
    }
    return OkStatus();
  }

  Status FlushFile() {
    Status s = WriteAll(write_buf_);
    write_buf_.clear();
    return s;
  }

  Status WriteAll(std::string_view d) {
    while (!d.empty()) {
      ssize_t n = write(file_fd_.get(), d.data(), d.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write " + Quote(entry_name_));
      }
      d.remove_prefix(static_cast<size_t>(n));
    }
    return OkStatus();
  }

  Status CreateDirectory(const std::string& entry, const std::vector<std::string>& comps,
                         uint64_t mode) {
    if (comps.empty()) {  // "./": the extraction root itself
      if (opts_.image_layer && (fchown(dest_, entry_uid_, entry_gid_) < 0 ||
                                fchmod(dest_, static_cast<mode_t>(mode & ModeMask())) < 0))
        return ErrnoError("chown/chmod the layer root").WithContext("tar entry " + Quote(entry));
      ++stats_.entries;
      return OkStatus();
    }
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size() - 1));
    const std::string& name = comps.back();
    for (int attempt = 0;; ++attempt) {
      if (mkdirat(parent.get(), name.c_str(), 0700) == 0) break;
      if (errno != EEXIST || attempt >= kMaxRetries) {
        return ErrnoError("mkdirat " + Quote(name)).WithContext("tar entry " + Quote(entry));
      }
      struct stat st;
      if (fstatat(parent.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(st.st_mode)) {
        if (opts_.image_layer) break;  // a layer's own entry: its owner and mode apply
        ++stats_.entries;              // existing directory: keep its owner and mode
        return OkStatus();
      }
      DSEC_RETURN_IF_ERROR(RemoveExisting(parent.get(), entry, name));
    }
    UniqueFd dir(
        openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) return ErrnoError("open " + Quote(name)).WithContext("tar entry " + Quote(entry));
    if (fchown(dir.get(), entry_uid_, entry_gid_) < 0 ||
        fchmod(dir.get(), static_cast<mode_t>(mode & ModeMask())) < 0) {
      return ErrnoError("chown/chmod " + Quote(name)).WithContext("tar entry " + Quote(entry));
    }
    ++stats_.entries;
    return OkStatus();
  }

  Status CreateSymlink(const std::string& entry, const std::vector<std::string>& comps,
                       const std::string& target, int64_t mtime) {
    if (comps.empty()) {
      return EntryError(StatusCode::kInvalidArgument, entry, "symlink name is empty");
    }
    if (target.empty()) {
      return EntryError(StatusCode::kInvalidArgument, entry, "symlink target is empty");
    }
    if (target.find('\0') != std::string::npos) {
      return EntryError(StatusCode::kInvalidArgument, entry, "symlink target contains a NUL byte");
    }
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size() - 1));
    const std::string& name = comps.back();
    for (int attempt = 0;; ++attempt) {
      // The target text is stored as is: later lookups all use RESOLVE_IN_ROOT.
      if (symlinkat(target.c_str(), parent.get(), name.c_str()) == 0) break;
      if (errno != EEXIST || attempt >= kMaxRetries) {
        return ErrnoError("symlinkat " + Quote(name)).WithContext("tar entry " + Quote(entry));
      }
      DSEC_RETURN_IF_ERROR(RemoveExisting(parent.get(), entry, name));
    }
    // Chown through an O_PATH fd checked to be a symlink, so a racing swap of the name cannot
    // make us chown some other file.
    UniqueFd link(openat(parent.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!link || fstat(link.get(), &st) < 0) {
      return ErrnoError("open " + Quote(name)).WithContext("tar entry " + Quote(entry));
    }
    if (!S_ISLNK(st.st_mode)) {
      return EntryError(StatusCode::kAborted, entry, "symlink was replaced concurrently");
    }
    if (fchownat(link.get(), "", entry_uid_, entry_gid_, AT_EMPTY_PATH) < 0) {
      return ErrnoError("fchownat " + Quote(name)).WithContext("tar entry " + Quote(entry));
    }
    timespec times[2] = {{mtime, 0}, {mtime, 0}};
    (void)utimensat(parent.get(), name.c_str(), times, AT_SYMLINK_NOFOLLOW);  // best effort
    ++stats_.entries;
    return OkStatus();
  }

  Status CreateHardLink(const std::string& entry, const std::vector<std::string>& comps,
                        const std::string& target) {
    if (comps.empty()) {
      return EntryError(StatusCode::kInvalidArgument, entry, "hard link name is empty");
    }
    std::vector<std::string> tcomps;
    if (std::optional<std::string> why = SplitArchivePath(target, &tcomps)) {
      return EntryError(StatusCode::kInvalidArgument, entry,
                        "hard link target " + Quote(target) + " " + *why);
    }
    if (tcomps.empty()) {
      return EntryError(StatusCode::kInvalidArgument, entry, "hard link target is empty");
    }
    // The target's directory resolves inside the root; its final component is not followed.
    StatusOr<UniqueFd> tparent = OpenBeneath(dest_, JoinComponents(tcomps, tcomps.size() - 1),
                                             O_PATH | O_DIRECTORY, resolve_);
    if (!tparent.ok()) {
      return tparent.status().WithContext("tar entry " + Quote(entry) + ": hard link target " +
                                          Quote(target));
    }
    const std::string& tname = tcomps.back();
    struct stat tst;
    if (fstatat(tparent->get(), tname.c_str(), &tst, AT_SYMLINK_NOFOLLOW) < 0) {
      return ErrnoError("hard link target " + Quote(target))
          .WithContext("tar entry " + Quote(entry));
    }
    if (!S_ISREG(tst.st_mode)) {
      return EntryError(StatusCode::kInvalidArgument, entry,
                        "hard link target " + Quote(target) + " is not a regular file");
    }
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size() - 1));
    const std::string& name = comps.back();
    struct stat est;
    if (fstatat(parent.get(), name.c_str(), &est, AT_SYMLINK_NOFOLLOW) == 0 &&
        est.st_dev == tst.st_dev && est.st_ino == tst.st_ino) {
      ++stats_.entries;  // already the same file (e.g. a link to itself)
      return OkStatus();
    }
    for (int attempt = 0;; ++attempt) {
      // flags = 0: linkat does not follow a symlink swapped in at the target name.
      if (linkat(tparent->get(), tname.c_str(), parent.get(), name.c_str(), 0) == 0) break;
      if (errno != EEXIST || attempt >= kMaxRetries) {
        return ErrnoError("linkat " + Quote(target) + " -> " + Quote(name))
            .WithContext("tar entry " + Quote(entry));
      }
      DSEC_RETURN_IF_ERROR(RemoveExisting(parent.get(), entry, name));
    }
    ++stats_.entries;
    return OkStatus();
  }

  mode_t ModeMask() const { return opts_.image_layer ? 07777 : 0777; }

  // ".wh.NAME": NAME is deleted from the layers below (an overlayfs whiteout, a 0/0 character
  // device); ".wh..wh..opq": the directory hides everything below it (opaque).
  Status CreateWhiteout(const std::string& entry, std::vector<std::string> comps) {
    std::string hidden = comps.back().substr(4);
    comps.pop_back();
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size()));
    if (hidden == ".wh..opq") {
      UniqueFd dir(openat(parent.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!dir) return ErrnoError("open").WithContext("tar entry " + Quote(entry));
      for (const char* key : {"trusted.overlay.opaque", "user.overlay.opaque"})
        if (fsetxattr(dir.get(), key, "y", 1, 0) < 0)
          return ErrnoError(std::string("set ") + key).WithContext("tar entry " + Quote(entry));
      ++stats_.entries;
      return OkStatus();
    }
    if (hidden.empty() || hidden == "." || hidden == ".." || StartsWith(hidden, ".wh."))
      return EntryError(StatusCode::kInvalidArgument, entry, "bad whiteout name");
    for (int attempt = 0;; ++attempt) {
      if (mknodat(parent.get(), hidden.c_str(), S_IFCHR | 0, makedev(0, 0)) == 0) break;
      if (errno != EEXIST || attempt >= kMaxRetries)
        return ErrnoError("mknod whiteout " + Quote(hidden))
            .WithContext("tar entry " + Quote(entry));
      // A whiteout for a file of this same layer replaces it (a directory is an error).
      DSEC_RETURN_IF_ERROR(RemoveExisting(parent.get(), entry, hidden));
    }
    ++stats_.entries;
    return OkStatus();
  }

  const int dest_;
  const TarExtractOptions opts_;
  // Image layers: a symlink in a parent path is an error, not followed (even inside the root).
  const uint64_t resolve_ =
      opts_.image_layer ? (kResolveFlags | RESOLVE_NO_SYMLINKS) : kResolveFlags;
  uid_t entry_uid_ = 0;
  gid_t entry_gid_ = 0;
  TarExtractStats stats_;
  Status error_;
  bool finished_ = false;

  State state_ = State::kHeader;
  char header_[kBlockSize] = {};
  size_t header_len_ = 0;
  uint64_t offset_ = 0;  // archive bytes consumed
  int zero_blocks_ = 0;
  DataKind data_kind_ = DataKind::kSkip;
  uint64_t data_remaining_ = 0;
  uint64_t pad_remaining_ = 0;
  std::string entry_name_;  // for messages

  // Extended headers waiting for their entry.
  bool meta_pending_ = false;
  std::string meta_buf_;
  std::optional<std::string> long_name_, long_link_;
  PaxParser::Result pax_;
  PaxParser pax_parser_;

  // The regular file being written.
  UniqueFd file_fd_;
  int64_t file_mtime_ = 0;
  std::string write_buf_;
  // The sparse file being written: its map, real size, next region and bytes left in it.
  SparseMap sparse_;
  uint64_t sparse_realsize_ = 0;
  size_t sparse_region_ = 0;
  uint64_t sparse_left_ = 0;
  // Real sizes of sparse files not yet covered by their written data (max_total_bytes).
  uint64_t sparse_reserved_ = 0;
};

TarExtractor::TarExtractor(int dest_dirfd, TarExtractOptions opts)
    : impl_(std::make_unique<Impl>(dest_dirfd, opts)) {}
TarExtractor::~TarExtractor() = default;
Status TarExtractor::Feed(std::string_view data) { return impl_->Feed(data); }
Status TarExtractor::Finish() { return impl_->Finish(); }
const TarExtractStats& TarExtractor::stats() const { return impl_->stats(); }

// ---------------------------------------------------------------------------------------------
// TarCreator

namespace {

void PutString(char* b, Field f, std::string_view s) {
  if (!s.empty()) memcpy(b + f.offset, s.data(), std::min(s.size(), f.size));
}

// Octal with a trailing NUL when it fits, else GNU base-256 (understood by GNU tar, bsdtar,
// Go, Python and this reader).
void PutNumber(char* b, Field f, int64_t v) {
  const unsigned digits = static_cast<unsigned>(f.size - 1);
  if (v >= 0 && static_cast<uint64_t>(v) < (uint64_t{1} << (3 * digits))) {
    char buf[32];
    (void)snprintf(buf, sizeof buf, "%0*" PRIo64, static_cast<int>(digits),
                   static_cast<uint64_t>(v));
    memcpy(b + f.offset, buf, digits);
    b[f.offset + digits] = '\0';
    return;
  }
  char* p = b + f.offset;
  int64_t x = v;
  for (size_t i = f.size - 1; i >= 1; --i) {
    p[i] = static_cast<char>(x & 0xff);
    x >>= 8;  // arithmetic shift (C++20): sign-extends negative values
  }
  p[0] = static_cast<char>(v < 0 ? 0xff : 0x80);
}

void AppendHeaderBlock(std::string* out, std::string_view name, std::string_view prefix, char type,
                       uint64_t mode, uint64_t uid, uint64_t gid, uint64_t size, int64_t mtime,
                       std::string_view link) {
  char b[kBlockSize] = {};
  PutString(b, kName, name);
  PutNumber(b, kMode, static_cast<int64_t>(mode));
  PutNumber(b, kUid, static_cast<int64_t>(uid));
  PutNumber(b, kGid, static_cast<int64_t>(gid));
  PutNumber(b, kSize, static_cast<int64_t>(size));
  PutNumber(b, kMtime, mtime);
  b[kTypeflagOffset] = type;
  PutString(b, kLinkname, link);
  memcpy(b + kMagic.offset, kPosixMagic, sizeof kPosixMagic);
  PutNumber(b, kDevmajor, 0);
  PutNumber(b, kDevminor, 0);
  PutString(b, kPrefix, prefix);
  memset(b + kChksum.offset, ' ', kChksum.size);
  unsigned sum = 0;
  for (char c : b) sum += static_cast<unsigned char>(c);
  char buf[16];
  (void)snprintf(buf, sizeof buf, "%06o", sum);
  memcpy(b + kChksum.offset, buf, 6);
  b[kChksum.offset + 6] = '\0';
  out->append(b, kBlockSize);
}

void AppendPaxRecord(std::string* out, std::string_view key, std::string_view value) {
  const size_t body = 1 + key.size() + 1 + value.size() + 1;  // " key=value\n"
  size_t len = body + std::to_string(body).size();
  len = body + std::to_string(len).size();  // one more digit at most
  out->append(std::to_string(len));
  out->append(" ");
  out->append(key);
  out->append("=");
  out->append(value);
  out->append("\n");
}

// One archive member: an optional pax 'x' header (long path/link, huge size) and the ustar
// header. uname/gname are left empty, uid/gid numeric.
void AppendEntry(std::string* out, std::string_view path, char type, const struct statx& st,
                 uint64_t size, std::string_view link) {
  std::string pax;
  std::string_view name = path;
  std::string_view prefix;
  if (path.size() > kName.size) {
    bool split = false;
    // npos also ends the loop: it is larger than kPrefix.size.
    for (size_t p = path.find('/'); p <= kPrefix.size; p = path.find('/', p + 1)) {
      const size_t rest = path.size() - p - 1;
      if (p > 0 && rest > 0 && rest <= kName.size) {
        prefix = path.substr(0, p);
        name = path.substr(p + 1);
        split = true;
        break;
      }
    }
    if (!split) {
      AppendPaxRecord(&pax, "path", path);
      name = path.substr(0, kName.size);
    }
  }
  if (link.size() > kLinkname.size) {
    AppendPaxRecord(&pax, "linkpath", link);
    link = link.substr(0, kLinkname.size);
  }
  if (size > kMaxOctal11) AppendPaxRecord(&pax, "size", std::to_string(size));
  const int64_t mtime = st.stx_mtime.tv_sec;
  if (!pax.empty()) {
    AppendHeaderBlock(out, "././@PaxHeader", "", 'x', 0644, 0, 0, pax.size(), mtime, "");
    out->append(pax);
    out->append(PaddingFor(pax.size()), '\0');
  }
  AppendHeaderBlock(out, name, prefix, type, st.stx_mode & 07777, st.stx_uid, st.stx_gid, size,
                    mtime, link);
}

int StatxAt(int dirfd, const char* name, int flags, struct statx* stx) {
  return statx(dirfd, name, flags | AT_NO_AUTOMOUNT, STATX_BASIC_STATS | STATX_MNT_ID, stx);
}

StatusOr<std::vector<std::string>> ListDir(int fd, const std::string& what) {
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return ErrnoError("dup " + Quote(what));
  DIR* dir = fdopendir(dup_fd);
  if (!dir) {
    close(dup_fd);
    return ErrnoError("fdopendir " + Quote(what));
  }
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = readdir(dir)) {
    std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  const int err = errno;
  closedir(dir);
  if (err != 0) return ErrnoStatus(err, "readdir " + Quote(what));
  std::sort(names.begin(), names.end());  // deterministic archives
  return names;
}

}  // namespace

class TarCreator::Impl {
 public:
  // Starts the walk. For a directory `top` is an fd on it and `single` is empty; otherwise `top`
  // is the parent directory and `single` the name of the one entry to archive.
  Status Init(UniqueFd top, const std::string& single) {
    struct statx stx;
    const int rc = single.empty() ? StatxAt(top.get(), "", AT_EMPTY_PATH, &stx)
                                  : StatxAt(top.get(), single.c_str(), AT_SYMLINK_NOFOLLOW, &stx);
    if (rc < 0) return ErrnoError("statx " + Quote(single.empty() ? "." : single));
    root_dev_ = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    have_mnt_id_ = (stx.stx_mask & STATX_MNT_ID) != 0;
    root_mnt_id_ = stx.stx_mnt_id;
    Frame frame;
    if (single.empty()) {
      DSEC_ASSIGN_OR_RETURN(frame.names, ListDir(top.get(), "."));
    } else {
      frame.names.push_back(single);
    }
    frame.fd = std::move(top);
    stack_.push_back(std::move(frame));
    return OkStatus();
  }

  StatusOr<bool> Next(std::string* out, size_t max_bytes) {
    if (!error_.ok()) return error_;
    Status s = Fill(out, max_bytes);
    if (!s.ok()) {
      error_ = s;
      file_.Reset();
      stack_.clear();
      return s;
    }
    return phase_ != Phase::kDone;
  }

  uint64_t skipped() const { return skipped_; }

 private:
  enum class Phase { kWalk, kTrailer, kDone };
  struct Frame {
    UniqueFd fd;
    std::string prefix;  // archive path of this directory, "" or ending in '/'
    std::vector<std::string> names;
    size_t next = 0;
  };

  Status Fill(std::string* out, size_t budget) {
    while (true) {
      if (pending_off_ < pending_.size()) {
        if (budget == 0) return OkStatus();
        const size_t n = std::min(budget, pending_.size() - pending_off_);
        out->append(pending_, pending_off_, n);
        pending_off_ += n;
        budget -= n;
        continue;
      }
      if (!pending_.empty()) {
        pending_.clear();
        pending_off_ = 0;
        if (phase_ == Phase::kTrailer) phase_ = Phase::kDone;
      }
      if (phase_ == Phase::kDone || budget == 0) return OkStatus();
      if (in_file_) {
        DSEC_RETURN_IF_ERROR(FileData(out, &budget));
        continue;
      }
      DSEC_RETURN_IF_ERROR(Advance());
    }
  }

  // Streams the current file's data: exactly the size in its header. A file that shrank is
  // padded with zeros; growth past the recorded size is not read.
  Status FileData(std::string* out, size_t* budget) {
    if (file_remaining_ == 0) {
      file_.Reset();
      in_file_ = false;
      pending_.assign(PaddingFor(file_size_), '\0');
      return OkStatus();
    }
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>({*budget, file_remaining_, static_cast<uint64_t>(kReadChunkBytes)}));
    const size_t old = out->size();
    out->resize(old + n);  // zero-filled
    size_t got = n;
    if (file_) {
      ssize_t r = read(file_.get(), out->data() + old, n);
      if (r < 0) {
        out->resize(old);
        if (errno == EINTR) return OkStatus();
        return ErrnoError("read " + Quote(file_name_));
      }
      if (r == 0) {
        file_.Reset();  // shrank: the rest of the recorded size is zeros
      } else {
        got = static_cast<size_t>(r);
        out->resize(old + got);
      }
    }
    file_remaining_ -= got;
    *budget -= got;
    return OkStatus();
  }

  // Produces the next entry's header(s) in pending_, or the end-of-archive marker.
  Status Advance() {
    while (true) {
      if (stack_.empty()) {
        pending_.assign(2 * kBlockSize, '\0');
        pending_off_ = 0;
        phase_ = Phase::kTrailer;
        return OkStatus();
      }
      Frame& f = stack_.back();
      if (f.next >= f.names.size()) {
        stack_.pop_back();
        continue;
      }
      const std::string name = std::move(f.names[f.next++]);
      const std::string rel = f.prefix + name;
      const int dirfd = f.fd.get();  // Visit may push to stack_, invalidating f
      DSEC_ASSIGN_OR_RETURN(bool emitted, Visit(dirfd, name, rel));
      if (emitted) return OkStatus();
    }
  }

  // The mount id decides when the kernel reports it: on overlayfs a regular file's st_dev is
  // that of its real layer while directories report the overlay's, so st_dev alone would take
  // every file of an overlay root for a mount point. st_dev is only the fallback.
  bool SameMount(const struct statx& stx) const {
    if (have_mnt_id_ && (stx.stx_mask & STATX_MNT_ID)) return stx.stx_mnt_id == root_mnt_id_;
    return makedev(stx.stx_dev_major, stx.stx_dev_minor) == root_dev_;
  }

  // Returns true if an entry was produced; false if the name was skipped.
  StatusOr<bool> Visit(int dirfd, const std::string& name, const std::string& rel) {
    // The sandbox may plant a tree tens of thousands of levels deep: every level holds an fd
    // and its path, so walking it all would take memory quadratic in the depth (and kill the
    // agent). Names longer than PATH_MAX could not be extracted anywhere anyway.
    if (rel.size() > kMaxArchivePathBytes) return Skip();
    struct statx stx;
    if (StatxAt(dirfd, name.c_str(), AT_SYMLINK_NOFOLLOW, &stx) < 0) {
      if (errno == ENOENT) return Skip();  // vanished during the walk
      return ErrnoError("statx " + Quote(rel));
    }
    if (!SameMount(stx)) return Skip();  // a mount point: never crossed
    switch (stx.stx_mode & S_IFMT) {
      case S_IFDIR: {
        UniqueFd fd(openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!fd) {
          if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return Skip();  // raced
          return ErrnoError("open " + Quote(rel));
        }
        if (StatxAt(fd.get(), "", AT_EMPTY_PATH, &stx) < 0)
          return ErrnoError("statx " + Quote(rel));
        if (!S_ISDIR(stx.stx_mode) || !SameMount(stx)) return Skip();
        if (stack_.size() > kMaxArchiveDepth) return Skip();  // the root frame is stack_[0]
        Frame frame;
        DSEC_ASSIGN_OR_RETURN(frame.names, ListDir(fd.get(), rel));
        frame.fd = std::move(fd);
        frame.prefix = rel + "/";
        AppendEntry(&pending_, frame.prefix, '5', stx, 0, "");
        stack_.push_back(std::move(frame));
        return true;
      }
      case S_IFLNK: {
        std::string target(4096, '\0');
        ssize_t n = readlinkat(dirfd, name.c_str(), target.data(), target.size());
        if (n < 0) {
          if (errno == ENOENT || errno == EINVAL) return Skip();  // raced
          return ErrnoError("readlinkat " + Quote(rel));
        }
        if (static_cast<size_t>(n) >= target.size()) {
          return Status(StatusCode::kInvalidArgument, "symlink " + Quote(rel) + " is too long");
        }
        target.resize(static_cast<size_t>(n));
        AppendEntry(&pending_, rel, '2', stx, 0, target);
        return true;
      }
      case S_IFREG: {
        UniqueFd fd(
            openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
        if (!fd) {
          if (errno == ENOENT || errno == ELOOP) return Skip();  // raced
          return ErrnoError("open " + Quote(rel));
        }
        // The header describes what we actually opened.
        if (StatxAt(fd.get(), "", AT_EMPTY_PATH, &stx) < 0)
          return ErrnoError("statx " + Quote(rel));
        if (!S_ISREG(stx.stx_mode) || !SameMount(stx)) return Skip();
        AppendEntry(&pending_, rel, '0', stx, stx.stx_size, "");
        file_ = std::move(fd);
        file_name_ = rel;
        file_size_ = stx.stx_size;
        file_remaining_ = stx.stx_size;
        in_file_ = true;
        return true;
      }
      default:  // FIFO, socket, char/block device
        return Skip();
    }
  }

  bool Skip() {
    ++skipped_;
    return false;
  }

  std::vector<Frame> stack_;
  dev_t root_dev_ = 0;
  bool have_mnt_id_ = false;
  uint64_t root_mnt_id_ = 0;
  Phase phase_ = Phase::kWalk;
  std::string pending_;  // header bytes, padding or the trailer not yet handed out
  size_t pending_off_ = 0;
  bool in_file_ = false;
  UniqueFd file_;  // invalid while in_file_ once the file shrank
  std::string file_name_;
  uint64_t file_size_ = 0;
  uint64_t file_remaining_ = 0;
  uint64_t skipped_ = 0;
  Status error_;
};

TarCreator::TarCreator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TarCreator::~TarCreator() = default;

StatusOr<std::unique_ptr<TarCreator>> TarCreator::Open(int root_dirfd, const std::string& path) {
  if (path.empty()) return InvalidArgument("tar: empty path");
  if (path.find('\0') != std::string::npos) {
    return InvalidArgument("tar: path " + Quote(path) + " contains a NUL byte");
  }
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  auto impl = std::make_unique<Impl>();
  if (base.empty() || base == "." || base == "..") {  // "/", "x/.", "..": a directory
    DSEC_ASSIGN_OR_RETURN(UniqueFd dir, OpenBeneath(root_dirfd, p, O_RDONLY | O_DIRECTORY));
    DSEC_RETURN_IF_ERROR(impl->Init(std::move(dir), ""));
  } else {
    const std::string parent =
        slash == std::string::npos ? "" : (slash == 0 ? "/" : p.substr(0, slash));
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent_fd,
                          OpenBeneath(root_dirfd, parent, O_RDONLY | O_DIRECTORY));
    struct stat st;
    if (fstatat(parent_fd.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      return ErrnoError("stat " + Quote(path));
    }
    if (S_ISDIR(st.st_mode)) {
      UniqueFd dir(
          openat(parent_fd.get(), base.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!dir) return ErrnoError("open " + Quote(path));
      DSEC_RETURN_IF_ERROR(impl->Init(std::move(dir), ""));
    } else {
      DSEC_RETURN_IF_ERROR(impl->Init(std::move(parent_fd), base));
    }
  }
  return std::unique_ptr<TarCreator>(new TarCreator(std::move(impl)));
}

StatusOr<bool> TarCreator::Next(std::string* out, size_t max_bytes) {
  return impl_->Next(out, max_bytes);
}
uint64_t TarCreator::skipped() const { return impl_->skipped(); }

}  // namespace dsec::agent
