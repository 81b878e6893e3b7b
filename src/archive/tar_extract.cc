#include "archive/tar.h"

#include "archive/tar_format.h"
#include "archive/tar_pax.h"
#include "archive/tar_sparse.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
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

namespace dsec::archive {

using namespace internal;  // NOLINT(google-build-using-namespace): this module's own internals

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
        if (header_len_ != 0 && offset_ == header_len_) {
          return InvalidArgument("tar: not a tar archive: " + std::to_string(offset_) +
                                 " bytes, less than one 512-byte header");
        }
        if (header_len_ != 0) return InvalidArgument("tar: archive truncated inside a header" + at);
        if (meta_pending_) {
          return InvalidArgument("tar: archive ended after an extended header without its entry" +
                                 at);
        }
        if (zero_blocks_ == 1) return OkStatus();  // a lone trailing zero block (GNU tar accepts)
        if (opts_.require_end_marker) {
          if (offset_ == 0) return InvalidArgument("tar: not a tar archive: it is empty");
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
    if (!ChecksumMatches(h)) {
      if (offset_ == kBlockSize)  // the first header
        return InvalidArgument(
            "tar: not a tar archive (its first 512 bytes are no tar header: "
            "bad header checksum)");
      return HeaderError("bad header checksum (corrupt or not a tar archive)");
    }

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
    }
    if (opts_.hook && !comps.empty() && opts_.hook->Claims(comps.back())) {
      DSEC_RETURN_IF_ERROR(ApplyHook(name, comps, kind == '5'));
      // Its data is skipped whatever its type claims to be (only '1'..'6' carry none), so what
      // follows is parsed as every other tar reader would.
      const bool header_only = kind >= '1' && kind <= '6';
      if (!header_only && data_size > 0) StartData(DataKind::kSkip, data_size);
      return OkStatus();
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

  // --- File system side. Every directory fd below comes from OpenInRoot(dest_), so it is a
  // directory inside the extraction root; final components are single names (never "." or
  // "..") created with O_EXCL/O_NOFOLLOW semantics.

  // Opens (creating missing ones, mode 0755, owned by uid/gid) the directory comps[0..n).
  StatusOr<UniqueFd> OpenParent(const std::string& entry, const std::vector<std::string>& comps,
                                size_t n) {
    MakeDirsOptions md;
    md.mode = 0755;
    md.owner = std::make_pair(opts_.uid, opts_.gid);
    md.open_flags = O_RDONLY;
    std::vector<std::string> prefix(comps.begin(), comps.begin() + static_cast<ptrdiff_t>(n));
    StatusOr<UniqueFd> dir = MakeDirsInRoot(dest_, prefix, policy_, md);
    if (!dir.ok()) return dir.status().WithContext("tar entry " + Quote(entry));
    return dir;
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
    StatusOr<UniqueFd> tparent = OpenInRoot(dest_, JoinPathComponents(tcomps, tcomps.size() - 1),
                                            O_PATH | O_DIRECTORY, policy_);
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

  // An entry the caller's hook claimed: its parent is made as for any entry, the rest is the
  // hook's.
  Status ApplyHook(const std::string& entry, std::vector<std::string> comps, bool is_dir) {
    std::string last = comps.back();
    comps.pop_back();
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(entry, comps, comps.size()));
    Status s = opts_.hook->Apply(parent.get(), last, is_dir);
    if (!s.ok()) return s.WithContext("tar entry " + Quote(entry));
    ++stats_.entries;
    return OkStatus();
  }

  const int dest_;
  const TarExtractOptions opts_;
  // Image layers: a symlink in a parent path is an error, not followed (even inside the root).
  const InRoot policy_ = opts_.image_layer ? InRoot::kNoSymlinks : InRoot::kFollowInside;
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

}  // namespace dsec::archive
