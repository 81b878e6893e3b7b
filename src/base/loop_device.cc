#include "base/loop_device.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

namespace dsec {

StatusOr<LoopDevice> AttachLoopDevice(int file_fd, bool read_only, bool direct_io) {
  UniqueFd ctl(open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl) return ErrnoError("open /dev/loop-control");
  // LOOP_CTL_GET_FREE names the lowest free device, the same one to every caller until one of
  // them configures it: concurrent attaches of this process (32 creates with disk images at
  // once, and the disk pool filling beside them) take turns here, so only other processes can
  // race for a device; those races are retried after a short, growing pause.
  static std::mutex attach_mu;
  std::lock_guard<std::mutex> l(attach_mu);
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (attempt > 0) usleep(static_cast<useconds_t>(200 * std::min(attempt, 20)));
    int n = ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoError("LOOP_CTL_GET_FREE");
    LoopDevice d;
    d.dev = "/dev/loop" + std::to_string(n);
    d.fd.Reset(open(d.dev.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    if (!d.fd) return ErrnoError("open " + d.dev);
    loop_config cfg{};
    cfg.fd = static_cast<uint32_t>(file_fd);
    // Direct I/O needs the device's blocks to line up with the backing filesystem's.
    cfg.block_size = direct_io ? 4096 : 0;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (read_only ? LO_FLAGS_READ_ONLY : 0) |
                        (direct_io ? LO_FLAGS_DIRECT_IO : 0);
    if (ioctl(d.fd.get(), LOOP_CONFIGURE, &cfg) < 0) {
      if (errno == EBUSY) continue;  // taken by another process meanwhile
      // Direct I/O needs the backing filesystem's support (tmpfs has none): go without it.
      if (errno == EINVAL && direct_io) {
        direct_io = false;
        --attempt;  // (not a race)
        continue;
      }
      return ErrnoError("LOOP_CONFIGURE " + d.dev);
    }
    return d;
  }
  return ResourceExhausted("no free loop device");
}

}  // namespace dsec
