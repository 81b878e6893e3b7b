// What a microVM boots: the guest kernel that scripts/guest-kernel unpacked from Debian's
// cloud kernel package (<dir>/vmlinux, <dir>/modules/*.ko and <dir>/modules/order, the load
// order), and the initramfs made from it: dsec-agent as /init plus those modules. The
// initramfs is a cpio "newc" archive written here (no cpio tool needed), uncompressed, which
// is the quickest to unpack under TCG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::backends::microvm {

struct GuestKernel {
  std::string dir;                   // the kernel's directory (symlinks resolved)
  std::string version;               // its name, e.g. 6.1.0-57-cloud-amd64
  std::string vmlinux;               // the uncompressed ELF kernel, booted through PVH
  std::vector<std::string> modules;  // file names under dir/modules, in load order
};

// The kernel at `dir` (e.g. /var/cache/dsec/guest-kernel/current). FailedPrecondition saying
// how to get one when it is missing or incomplete.
StatusOr<GuestKernel> FindGuestKernel(const std::string& dir);

// One member of a cpio archive.
struct CpioEntry {
  std::string path;   // relative, no leading "/" ("dev", "init", "lib/modules/virtio.ko")
  uint32_t mode = 0;  // file type and permission bits (S_IFDIR | 0755, S_IFREG | 0644, ...)
  std::string data;   // regular files
  uint32_t rdev_major = 0, rdev_minor = 0;  // device nodes
};

// A cpio newc archive of `entries` (owned by root), with its trailer.
std::string CpioArchive(const std::vector<CpioEntry>& entries);
// The entries of a newc archive (the trailer excluded); for tests and checks.
StatusOr<std::vector<CpioEntry>> ParseCpio(std::string_view archive);

// Writes the guest's initramfs to `path` (mode 0644, through a temporary file): the mount
// points /init expects, /dev/console, `agent` (the static dsec-agent binary) as /init and the
// kernel's modules with their order.
Status WriteGuestInitramfs(const GuestKernel& kernel, const std::string& agent,
                           const std::string& path);

}  // namespace dsec::backends::microvm
