#include "isolation/disk_image.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/loop_device.h"
#include "base/subprocess.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

namespace {

Status CheckSpec(const DiskImageSpec& spec) {
  if (spec.bytes < (16ull << 20)) return InvalidArgument("a disk image needs at least 16 MiB");
  if (spec.inodes == 0) return InvalidArgument("a disk image needs inodes");
  if (spec.name.empty() || spec.name.find('/') != std::string::npos || spec.name[0] == '.')
    return InvalidArgument("bad disk image name \"" + spec.name + "\"");
  return OkStatus();
}

// An image file while it has a name: unlinked when this goes unless Forget() was called.
class NamedImage {
 public:
  explicit NamedImage(std::string path) : path_(std::move(path)) {}
  ~NamedImage() {
    if (!path_.empty()) (void)unlink(path_.c_str());
  }
  NamedImage(const NamedImage&) = delete;
  NamedImage& operator=(const NamedImage&) = delete;
  const std::string& path() const { return path_; }
  Status Unlink() {
    std::string p = std::move(path_);
    path_.clear();
    return unlink(p.c_str()) < 0 ? ErrnoError("unlink \"" + p + "\"") : OkStatus();
  }
  Status Fail(Status s) const { return s.WithContext("disk image \"" + path_ + "\""); }

 private:
  std::string path_;
};

// Creates spec's image file, of spec.bytes: allocated up front (spec.preallocate), else sparse.
StatusOr<UniqueFd> CreateImageFile(const DiskImageSpec& spec, const NamedImage& named,
                                   bool preallocate) {
  UniqueFd f(open(named.path().c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!f) return ErrnoError("create \"" + named.path() + "\"");
  // fallocate sets the size too; a filesystem without it gets a sparse file.
  bool allocated = preallocate && fallocate(f.get(), 0, 0, static_cast<off_t>(spec.bytes)) == 0;
  if (preallocate && !allocated) {
    if (errno == ENOSPC || errno == EDQUOT)
      return named.Fail(OverCapacity("the node has no room for a disk of " +
                                     std::to_string(spec.bytes >> 20) + " MiB (" + strerror(errno) +
                                     ")"));
    if (errno != EOPNOTSUPP) return named.Fail(ErrnoError("fallocate"));
  }
  if (!allocated && ftruncate(f.get(), static_cast<off_t>(spec.bytes)) < 0)
    return named.Fail(ErrnoError("truncate"));
  return f;
}

// 4 KiB blocks (mke2fs picks 1 KiB for small sizes; the loop device reads with direct I/O in
// 4 KiB blocks), no root reserve, no journal, nothing initialized ahead: a few MiB written.
Status Format(const std::string& path, uint64_t inodes, uid_t owner, gid_t group) {
  std::string own = std::to_string(owner) + ":" + std::to_string(group);
  return RunTool({"mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal", "-N",
                  std::to_string(inodes), "-E", "lazy_itable_init=1,nodiscard,root_owner=" + own,
                  "-L", "dsec-disk", path},
                 "e2fsprogs");
}

// Copies the written parts of a formatted template (sparse: what mkfs wrote) into `to`.
Status CopyWrittenParts(int from, int to, uint64_t bytes) {
  off_t pos = 0;
  while (static_cast<uint64_t>(pos) < bytes) {
    off_t data = lseek(from, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // no data after pos
      return ErrnoError("seek data in the disk template");
    }
    off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0) return ErrnoError("seek hole in the disk template");
    off_t in = data, out = data;
    while (in < hole) {
      ssize_t n = copy_file_range(from, &in, to, &out, static_cast<size_t>(hole - in), 0);
      if (n < 0) return ErrnoError("copy the disk template");
      if (n == 0) return InternalError("the disk template ended early");
    }
    pos = hole;
  }
  return OkStatus();
}

// Attaches the (named) image file to a loop device, drops its name and mounts it (nosuid,
// nodev), owned by spec.owner:group.
StatusOr<UniqueFd> MountImage(const DiskImageSpec& spec, UniqueFd f, NamedImage& named) {
  auto loop = AttachLoopDevice(f.get(), false, true);
  if (!loop.ok()) return named.Fail(loop.status());
  // The loop device holds the file now; without a name it goes with the device.
  std::string path = named.path();
  if (Status s = named.Unlink(); !s.ok()) return s.WithContext("disk image \"" + path + "\"");
  UniqueFd fs(sys::FsOpen("ext4", FSOPEN_CLOEXEC));
  if (!fs) return ErrnoError("fsopen ext4");
  // noinit_itable: no kernel thread zeroes the unused inode tables afterwards (block group
  // descriptors say which are unused, and a fresh image reads as zeros anyway).
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "source", loop->dev.c_str(), 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_SET_FLAG, "noinit_itable", nullptr, 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return ErrnoError("mount ext4 from " + loop->dev);
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return ErrnoError("fsmount ext4 from " + loop->dev);
  // mke2fs leaves lost+found: not the sandbox's business.
  (void)unlinkat(mnt.get(), "lost+found", AT_REMOVEDIR);
  if (fchownat(mnt.get(), "", spec.owner, spec.group, AT_EMPTY_PATH) < 0)
    return ErrnoError("chown the disk image's root");
  return mnt;  // the loop device's fd closes here: the mount keeps the device until it goes
}

}  // namespace

StatusOr<UniqueFd> MakeDiskImageMount(const DiskImageSpec& spec) {
  DSEC_RETURN_IF_ERROR(CheckSpec(spec));
  NamedImage named(JoinPath(spec.dir, spec.name + ".img"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd f, CreateImageFile(spec, named, spec.preallocate));
  if (Status s = Format(named.path(), spec.inodes, spec.owner, spec.group); !s.ok())
    return named.Fail(s);
  return MountImage(spec, std::move(f), named);
}

StatusOr<UniqueFd> MakeDiskImageTemplate(const DiskImageSpec& spec) {
  DSEC_RETURN_IF_ERROR(CheckSpec(spec));
  NamedImage named(JoinPath(spec.dir, spec.name + ".img"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd f, CreateImageFile(spec, named, /*preallocate=*/false));
  if (Status s = Format(named.path(), spec.inodes, 0, 0); !s.ok()) return named.Fail(s);
  DSEC_RETURN_IF_ERROR(named.Unlink());
  return f;
}

StatusOr<UniqueFd> MakeDiskImageMountFrom(int template_fd, const DiskImageSpec& spec) {
  DSEC_RETURN_IF_ERROR(CheckSpec(spec));
  struct stat st;
  if (fstat(template_fd, &st) < 0) return ErrnoError("stat the disk template");
  if (static_cast<uint64_t>(st.st_size) != spec.bytes)
    return InvalidArgument("the disk template is not of the image's size");
  NamedImage named(JoinPath(spec.dir, spec.name + ".img"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd f, CreateImageFile(spec, named, spec.preallocate));
  if (Status s = CopyWrittenParts(template_fd, f.get(), spec.bytes); !s.ok()) return named.Fail(s);
  return MountImage(spec, std::move(f), named);
}

namespace {

// ext4's (and XFS's) "going down" ioctl: the filesystem refuses all I/O from now on, and with
// NOLOGFLUSH nothing dirty is written back, so the unmount that follows is quick.
constexpr unsigned long kFsIocShutdown = _IOR('X', 125, uint32_t);
constexpr uint32_t kShutdownNoLogFlush = 2;

void ShutDownAndUnmount(UniqueFd mount) {
  UniqueFd root(openat(mount.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  uint32_t flags = kShutdownNoLogFlush;
  if (root) (void)ioctl(root.get(), kFsIocShutdown, &flags);
  // The last references: the mount goes, and the loop device and the image's blocks with it.
}

}  // namespace

DiskImagePool::DiskImagePool(Options opts) : opts_(std::move(opts)) {
  thread_ = std::thread([this] { Run(); });
}

DiskImagePool::~DiskImagePool() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
  MutexLock l(mu_);
  for (auto& m : released_) ShutDownAndUnmount(std::move(m));
  for (auto& [key, size] : sizes_)
    for (auto& m : size.ready) ShutDownAndUnmount(std::move(m));
}

size_t DiskImagePool::Ready() {
  MutexLock l(mu_);
  size_t n = 0;
  for (const auto& [key, size] : sizes_) n += size.ready.size();
  return n;
}

size_t DiskImagePool::Releasing() {
  MutexLock l(mu_);
  return released_.size() + unmounting_;
}

StatusOr<std::shared_ptr<const UniqueFd>> DiskImagePool::TemplateFor(const Key& key) {
  {
    MutexLock l(mu_);
    auto it = sizes_.find(key);
    if (it != sizes_.end() && it->second.tmpl) return it->second.tmpl;
  }
  DiskImageSpec spec;
  spec.dir = opts_.dir;
  spec.bytes = key.first;
  spec.inodes = key.second;
  {
    MutexLock l(mu_);
    spec.name = "template-" + std::to_string(++made_);
  }
  DSEC_ASSIGN_OR_RETURN(UniqueFd f, MakeDiskImageTemplate(spec));
  auto tmpl = std::make_shared<const UniqueFd>(std::move(f));
  MutexLock l(mu_);
  auto it = sizes_.find(key);
  if (it != sizes_.end() && !it->second.tmpl) it->second.tmpl = tmpl;
  return tmpl;
}

StatusOr<UniqueFd> DiskImagePool::MakeOne(const DiskImageSpec& spec) {
  DSEC_ASSIGN_OR_RETURN(auto tmpl, TemplateFor({spec.bytes, spec.inodes}));
  return MakeDiskImageMountFrom(tmpl->get(), spec);
}

StatusOr<UniqueFd> DiskImagePool::Take(const DiskImageSpec& spec) {
  if (opts_.depth == 0) return MakeDiskImageMount(spec);
  UniqueFd ready;
  {
    MutexLock l(mu_);
    auto now = std::chrono::steady_clock::now();
    Key key{spec.bytes, spec.inodes};
    Size& size = sizes_[key];
    size.last_asked = now;
    if (!size.ready.empty()) {
      ready = std::move(size.ready.back());
      size.ready.pop_back();
    }
    // Too many sizes: the one asked for least recently goes.
    while (sizes_.size() > opts_.max_sizes) {
      auto oldest = sizes_.end();
      for (auto it = sizes_.begin(); it != sizes_.end(); ++it)
        if (it->first != key &&
            (oldest == sizes_.end() || it->second.last_asked < oldest->second.last_asked))
          oldest = it;
      for (auto& m : oldest->second.ready) released_.push_back(std::move(m));
      sizes_.erase(oldest);
    }
  }
  cv_.NotifyAll();
  if (!ready) return MakeOne(spec);
  if (fchownat(ready.get(), "", spec.owner, spec.group, AT_EMPTY_PATH) < 0) {
    Status s = ErrnoError("chown a ready disk image's root");
    Release(std::move(ready));
    return s;
  }
  return ready;
}

void DiskImagePool::Release(UniqueFd mount) {
  if (!mount) return;
  {
    MutexLock l(mu_);
    released_.push_back(std::move(mount));
  }
  cv_.NotifyAll();
}

bool DiskImagePool::NextFill(Key* key) {
  auto now = std::chrono::steady_clock::now();
  for (auto& [k, size] : sizes_) {
    if (size.ready.size() >= opts_.depth) continue;
    if (now < size.retry_at) continue;
    *key = k;
    return true;
  }
  return false;
}

void DiskImagePool::Run() {
  // Filling is background work: it yields to the creates it serves (mkfs inherits this).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  MutexLock l(mu_);
  while (!stop_) {
    if (!released_.empty()) {
      std::vector<UniqueFd> batch = std::move(released_);
      released_.clear();
      unmounting_ = batch.size();
      l.Unlock();
      for (auto& m : batch) ShutDownAndUnmount(std::move(m));
      l.Lock();
      unmounting_ = 0;
      continue;
    }
    // Sizes nobody asked for lately give their images back.
    auto now = std::chrono::steady_clock::now();
    for (auto it = sizes_.begin(); it != sizes_.end();) {
      if (now - it->second.last_asked < opts_.idle) {
        ++it;
        continue;
      }
      for (auto& m : it->second.ready) released_.push_back(std::move(m));
      it = sizes_.erase(it);
    }
    if (!released_.empty()) continue;
    Key key;
    if (!NextFill(&key)) {
      // Woken by a Take or Release; the timeout expires idle sizes and retries failed fills.
      cv_.WaitFor(l, std::chrono::seconds(5));
      continue;
    }
    DiskImageSpec spec;
    spec.dir = opts_.dir;
    spec.name = "pool-" + std::to_string(++made_);
    spec.bytes = key.first;
    spec.inodes = key.second;
    spec.preallocate = opts_.preallocate;
    l.Unlock();
    StatusOr<UniqueFd> m = MakeOne(spec);
    l.Lock();
    auto it = sizes_.find(key);
    if (it == sizes_.end()) {
      if (m.ok()) released_.push_back(std::move(*m));  // dropped meanwhile
      continue;
    }
    if (m.ok()) {
      it->second.ready.push_back(std::move(*m));
      it->second.last_error.clear();
    } else {
      // Retried after a pause (a full host disk must not spin here); Take still makes its own.
      it->second.retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      if (m.status().ToString() != it->second.last_error) {
        it->second.last_error = m.status().ToString();
        DSEC_LOG_WARN("disk image pool: {}", it->second.last_error);
      }
    }
  }
}

StatusOr<int> RemoveStaleDiskImages(const std::string& dir) {
  auto names = ListDir(dir);
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) return 0;
    return names.status();
  }
  int n = 0;
  for (const auto& name : *names) {
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".img") != 0) continue;
    if (unlink(JoinPath(dir, name).c_str()) == 0) ++n;
  }
  return n;
}

}  // namespace dsec::isolation
