// dsec-agent as the init of a microVM guest (the kernel runs it as /init from the initramfs
// the microVM backend packs: this binary, the kernel modules the guest needs and their load
// order). It builds the machine the sandbox runs in, then serves the same protocol as in a
// container, over a virtio-serial port:
//
//   mount /proc, /sys, /dev -> load the modules (virtio, virtio-mmio, virtio-console,
//   virtio-blk, erofs, overlay, ...) -> find the port named "dsec.agent" -> mount the image's
//   layers (one read-only EROFS block device each, /dev/vda first = bottom), a tmpfs upper of
//   dsec.disk_mb and overlayfs on top -> move into it (switch_root) -> cgroup2, devpts, shm ->
//   hello -> (a template is saved here; each clone resumes here) -> GuestSetup (identity,
//   clock, entropy, disk size, limits) -> ready -> serve.
//
// Kernel command line: dsec.layers=N, dsec.disk_mb=M. A failure before the port is found is
// written to the console; after, it is sent as a kError frame. Either way the guest powers
// off, which ends its QEMU.
#pragma once

namespace dsec::agent {

// True when this process is a guest's init (PID 1, started as /init).
bool IsGuestInit(int argc, char** argv);
[[noreturn]] void GuestMain();

}  // namespace dsec::agent
