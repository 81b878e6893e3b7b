// Kernel features newer than the 6.1 baseline, detected once at start. Each has a switch in
// FeatureSwitches that forces its fallback, so tests can exercise both paths on new kernels.
#pragma once

#include <string>

namespace dsec::isolation {

struct FeatureSwitches {
  bool userns = true;             // user namespace with idmapped image layers
  bool clone_into_cgroup = true;  // clone3(CLONE_INTO_CGROUP)
  bool cgroup_kill = true;        // cgroup.kill (else freeze + kill each + thaw)
};

struct KernelFeatures {
  std::string kernel_release;
  // Root inside a user namespace can write image files through an overlay whose lower layers
  // are idmapped mounts (needs idmapped mounts, overlay in userns, user xattrs on tmpfs).
  bool userns = false;
  std::string userns_reason;  // why it is off
  bool clone_into_cgroup = false;
  bool cgroup_kill = false;

  // Probes the kernel (forks a short-lived child for the userns probe) and applies switches.
  static KernelFeatures Detect(const FeatureSwitches& switches);
  std::string Describe() const;
};

// Kernel version as major*1000+minor, from uname(2).
int KernelVersionCode();

}  // namespace dsec::isolation
