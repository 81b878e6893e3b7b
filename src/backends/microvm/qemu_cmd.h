// The QEMU command line of one microVM, as a pure function of what it runs (so it is
// unit-tested, and the edge and the tests start guests the same way). Everything QEMU touches
// arrives as an inherited descriptor: the agent's and QMP's listening sockets (fd=), the
// image layers (read-only fds in fdsets, so the guest's disks can never be written even by a
// compromised QEMU) and the kernel and initramfs (opened through /proc/self/fd, as files
// anyone may read). Nothing names a host path QEMU's uid would need to reach.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec::backends::microvm {

// QEMU's accelerator; kAuto (settings only) is chosen by a probe boot (MicrovmBackend).
enum class Accel { kAuto, kKvm, kTcg };
std::string_view AccelName(Accel a);  // "auto", "kvm", "tcg"
StatusOr<Accel> ParseAccel(std::string_view s);

// The guest's NIC (virtio-net), when it has one: behind a tap on the node (the sandbox's
// network, net/node_network.h), or behind a hub port that goes nowhere (a template's: the same
// device, so clones of it restore with their own tap).
enum class Nic { kNone, kTap, kUnplugged };

struct QemuConfig {
  std::string qemu = "qemu-system-x86_64";
  Accel accel = Accel::kTcg;  // kvm or tcg
  int cpus = 1;
  int64_t memory_mb = 256;  // guest RAM (the writable layer's tmpfs lives in it)
  int64_t disk_mb = 256;    // the writable layer's size, passed to the guest's init
  int64_t tsc_khz = 0;      // the host's TSC (mandatory for TCG guests booting side by side)
  int kernel_fd = -1;       // the vmlinux, readable
  int initrd_fd = -1;
  int agent_listen_fd = -1;    // a bound unix socket: the agent's virtio-serial port's host end
  int qmp_listen_fd = -1;      // a bound unix socket: QMP
  std::vector<int> layer_fds;  // O_RDONLY fds of the EROFS layers, bottom first (vda, vdb, ..)
  Nic nic = Nic::kNone;
  int tap_fd = -1;  // kTap: the tap's descriptor (made without a vnet header)
  // Guest RAM from a file (a memfd): a template boots with it shared (its pages are the
  // template), a clone maps it private (copy-on-write) and waits for its device state.
  int ram_fd = -1;
  bool ram_shared = false;
  // No RAM file: the RAM is still a memory backend named as a RAM file's is (a fork restores a
  // stream saved from a VM whose RAM was one, and the names must match).
  bool ram_object = false;
  bool incoming = false;  // -incoming defer: the state comes over QMP (migrate-incoming)
  int tcg_tb_mb = 32;     // TCG's translation buffer (its default is 1 GiB of address space)
  bool seccomp = true;    // QEMU's own sandbox
};

std::vector<std::string> QemuArgv(const QemuConfig& c);
// The guest kernel's command line (part of QemuArgv; exposed for tests and probes).
std::string GuestCmdline(const QemuConfig& c);

// The host's TSC frequency in kHz, from /proc/cpuinfo's "cpu MHz" (0 if unknown).
int64_t HostTscKhz();

}  // namespace dsec::backends::microvm
