#include "archive/tar.h"

#include "archive/tar_format.h"
#include "archive/tar_sparse.h"

#include <dirent.h>
#include <fcntl.h>
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

namespace dsec::archive {

using namespace internal;  // NOLINT(google-build-using-namespace): this module's own internals

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
  uint64_t owed() const {
    return (pending_.size() - pending_off_) +
           (in_file_ ? file_remaining_ + PaddingFor(file_size_) : 0);
  }

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
    DSEC_ASSIGN_OR_RETURN(UniqueFd dir,
                          OpenInRoot(root_dirfd, p, O_RDONLY | O_DIRECTORY, InRoot::kFollowInside));
    DSEC_RETURN_IF_ERROR(impl->Init(std::move(dir), ""));
  } else {
    const std::string parent =
        slash == std::string::npos ? "" : (slash == 0 ? "/" : p.substr(0, slash));
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent_fd, OpenInRoot(root_dirfd, parent, O_RDONLY | O_DIRECTORY,
                                                         InRoot::kFollowInside));
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
uint64_t TarCreator::owed() const { return impl_->owed(); }

}  // namespace dsec::archive
