#include "isolation/disk_image.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "base/file_util.h"
#include "base/loop_device.h"
#include "base/subprocess.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

StatusOr<UniqueFd> MakeDiskImageMount(const DiskImageSpec& spec) {
  if (spec.bytes < (16ull << 20)) return InvalidArgument("a disk image needs at least 16 MiB");
  if (spec.inodes == 0) return InvalidArgument("a disk image needs inodes");
  if (spec.name.empty() || spec.name.find('/') != std::string::npos || spec.name[0] == '.')
    return InvalidArgument("bad disk image name \"" + spec.name + "\"");
  std::string path = JoinPath(spec.dir, spec.name + ".img");
  UniqueFd f(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!f) return ErrnoError("create \"" + path + "\"");
  bool named = true;
  auto fail = [&](Status s) {
    if (named) (void)unlink(path.c_str());
    return s.WithContext("disk image \"" + path + "\"");
  };
  // fallocate sets the size too; a filesystem without it (or preallocate off) gets a sparse file.
  bool allocated =
      spec.preallocate && fallocate(f.get(), 0, 0, static_cast<off_t>(spec.bytes)) == 0;
  if (spec.preallocate && !allocated) {
    if (errno == ENOSPC || errno == EDQUOT)
      return fail(OverCapacity("the node has no room for a disk of " +
                               std::to_string(spec.bytes >> 20) + " MiB (" + strerror(errno) +
                               ")"));
    if (errno != EOPNOTSUPP) return fail(ErrnoError("fallocate"));
  }
  if (!allocated && ftruncate(f.get(), static_cast<off_t>(spec.bytes)) < 0)
    return fail(ErrnoError("truncate"));
  // 4 KiB blocks (mke2fs picks 1 KiB for small sizes; the loop device reads with direct I/O in
  // 4 KiB blocks), no root reserve, no journal, nothing initialized ahead: ~20-50 ms for any
  // size, a few MiB written.
  std::string owner = std::to_string(spec.owner) + ":" + std::to_string(spec.group);
  if (Status s =
          RunTool({"mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal", "-N",
                   std::to_string(spec.inodes), "-E",
                   "lazy_itable_init=1,nodiscard,root_owner=" + owner, "-L", "dsec-disk", path},
                  "e2fsprogs");
      !s.ok())
    return fail(s);
  auto loop = AttachLoopDevice(f.get(), false, true);
  if (!loop.ok()) return fail(loop.status());
  // The loop device holds the file now; without a name it goes with the device.
  if (unlink(path.c_str()) < 0) return fail(ErrnoError("unlink"));
  named = false;
  UniqueFd fs(sys::FsOpen("ext4", FSOPEN_CLOEXEC));
  if (!fs) return fail(ErrnoError("fsopen ext4"));
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "source", loop->dev.c_str(), 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return fail(ErrnoError("mount ext4 from " + loop->dev));
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return fail(ErrnoError("fsmount ext4 from " + loop->dev));
  // mke2fs leaves lost+found: not the sandbox's business.
  (void)unlinkat(mnt.get(), "lost+found", AT_REMOVEDIR);
  return mnt;  // the loop device's fd closes here: the mount keeps the device until it goes
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
