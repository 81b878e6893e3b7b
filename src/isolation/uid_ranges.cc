#include "isolation/uid_ranges.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "base/file_util.h"

namespace dsec::isolation {

StatusOr<std::unique_ptr<UidRangeAllocator>> UidRangeAllocator::Open(const UidRangeOptions& opts) {
  if (opts.lock_file.empty() || opts.lock_file[0] != '/')
    return InvalidArgument("uid range lock file must be an absolute path");
  if (opts.count == 0 || opts.size == 0) return InvalidArgument("uid ranges need a count and size");
  if (static_cast<uint64_t>(opts.base) + static_cast<uint64_t>(opts.count) * opts.size >
      0xFFFFFFFEull)
    return InvalidArgument("uid ranges overflow the 32-bit id space");
  std::string dir = opts.lock_file.substr(0, opts.lock_file.rfind('/'));
  if (!dir.empty()) DSEC_RETURN_IF_ERROR(MakeDirs(dir, 0755));
  UniqueFd probe(open(opts.lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!probe) return ErrnoError("open \"" + opts.lock_file + "\"");
  struct stat st;
  if (fstat(probe.get(), &st) < 0) return ErrnoError("stat \"" + opts.lock_file + "\"");
  if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022))
    return FailedPrecondition("uid range lock file \"" + opts.lock_file +
                              "\" must be a regular file owned by root, not group/other writable");
  std::unique_ptr<UidRangeAllocator> a(new UidRangeAllocator(opts));
  return a;
}

StatusOr<UniqueFd> UidRangeAllocator::OpenLockFile() const {
  UniqueFd fd(open(opts_.lock_file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return ErrnoError("open \"" + opts_.lock_file + "\"");
  return fd;
}

namespace {
// A write lock on byte `slot`: the lease of range `slot`.
struct flock SlotLock(uint32_t slot) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = slot;
  fl.l_len = 1;
  return fl;
}
}  // namespace

StatusOr<UniqueFd> UidRangeAllocator::TryLock(uint32_t slot) const {
  // A fresh open file description per lease: OFD locks belong to it, so handing the
  // descriptor to another process hands over exactly this lease.
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenLockFile());
  struct flock fl = SlotLock(slot);
  if (fcntl(fd.get(), F_OFD_SETLK, &fl) < 0) {
    if (errno == EAGAIN || errno == EACCES) return UniqueFd();
    return ErrnoError("F_OFD_SETLK \"" + opts_.lock_file + "\" byte " + std::to_string(slot));
  }
  return fd;
}

StatusOr<UniqueFd> UidRangeAllocator::ShareReadOnly(uint32_t slot, const UniqueFd& held) const {
  UniqueFd ro(open(opts_.lock_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!ro) return ErrnoError("open \"" + opts_.lock_file + "\" read-only");
  // Write lock -> read lock on the same description is atomic: no other Acquire can slip in.
  struct flock fl = SlotLock(slot);
  fl.l_type = F_RDLCK;
  if (fcntl(held.get(), F_OFD_SETLK, &fl) < 0)
    return ErrnoError("F_OFD_SETLK F_RDLCK (downgrade) \"" + opts_.lock_file + "\" byte " +
                      std::to_string(slot));
  if (fcntl(ro.get(), F_OFD_SETLK, &fl) < 0)
    return ErrnoError("F_OFD_SETLK F_RDLCK \"" + opts_.lock_file + "\" byte " +
                      std::to_string(slot));
  return ro;
}

StatusOr<UidLease> UidRangeAllocator::Acquire() {
  MutexLock l(mu_);
  for (uint32_t i = 0; i < opts_.count; ++i) {
    uint32_t slot = (next_ + i) % opts_.count;
    if (used_[slot]) continue;
    DSEC_ASSIGN_OR_RETURN(UniqueFd fd, TryLock(slot));
    if (!fd) continue;  // another edge's (or a sandbox still alive from an earlier one)
    used_[slot] = true;
    next_ = slot + 1;
    return UidLease{slot, FirstId(slot), std::move(fd)};
  }
  return ResourceExhausted("no free host uid range (" + std::to_string(opts_.count) +
                           " ranges, all leased by sandboxes on this host)");
}

StatusOr<UniqueFd> UidRangeAllocator::Claim(uint32_t slot) {
  MutexLock l(mu_);
  if (slot >= opts_.count)
    return FailedPrecondition("user namespace slot " + std::to_string(slot) +
                              " is outside this edge's range");
  if (used_[slot])
    return Status(StatusCode::kAlreadyExists,
                  "user namespace slot " + std::to_string(slot) + " is already in use");
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, TryLock(slot));
  used_[slot] = true;
  return fd;
}

void UidRangeAllocator::Release(uint32_t slot) {
  MutexLock l(mu_);
  if (slot < used_.size()) used_[slot] = false;
}

StatusOr<bool> UidRangeAllocator::Held(uint32_t slot) const {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenLockFile());
  struct flock fl = SlotLock(slot);
  if (fcntl(fd.get(), F_OFD_GETLK, &fl) < 0) return ErrnoError("F_OFD_GETLK");
  return fl.l_type != F_UNLCK;
}

}  // namespace dsec::isolation
