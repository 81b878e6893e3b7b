// A sandbox's root filesystem as a plan, computed without touching the system: the image stack
// (the host image's layers and overlays, image layers bottom first, what each layer holds that
// matters), the writable layer's size and the spec in; the ordered read-only lowers, the
// overlays stacking them, and the directories and files the writable layer starts with, out.
// The container backend turns a plan into detached (idmapped) mounts handed to its agent; the
// microVM backend turns the same plan into block devices for its guest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isolation/rootfs.h"

namespace dsec::backends {

// One read-only lower directory of the root.
struct PlannedLower {
  enum class From { kHostLayer, kImageLayer };
  From from = From::kHostLayer;
  size_t index = 0;    // into RootfsInputs::host_lowers or RootfsInputs::layers
  std::string subdir;  // kImageLayer: a subtree of the layer ("" for all of it)
  // Its owners are the sandbox's own (image layers, the host image's mask): mapped into the
  // sandbox's id range. The host's own directories are not: their files keep host owners.
  bool idmap = true;
};

struct PlannedOverlay {
  std::string target;          // "/" for the root (always the first)
  std::vector<size_t> lowers;  // indices into RootfsPlan::lowers, topmost first
};

struct RootfsPlan {
  std::vector<PlannedLower> lowers;
  std::vector<PlannedOverlay> overlays;
  std::vector<isolation::DirSpec> dirs;    // made in the writable layer before the mount
  std::vector<isolation::FileSpec> files;  // written there likewise
  uint64_t size_bytes = 0;                 // the writable layer's
  uint64_t inodes = 0;
  // The writable layer is a disk image (not charged to memory) rather than a tmpfs.
  bool disk_image = false;
};

// What one image layer holds that the plan depends on (read by the caller).
struct LayerFacts {
  // Per host-image overlay after the first (a host directory on another filesystem, such as
  // /usr): whether this layer has a directory at that target.
  std::vector<bool> has_overlay_dir;
  // etc/passwd and etc/group: present at all (any file type hides the layers below), and the
  // text when it is a regular file the caller could read.
  bool passwd_present = false, group_present = false;
  std::string passwd, group;
};

struct RootfsInputs {
  bool host_base = true;  // the stack starts from the host image
  // The host image (when host_base): per lower, whether it is idmapped (the mask) or a host
  // directory; its overlays, lower_fds indexing host_lowers.
  std::vector<bool> host_lowers;
  std::vector<isolation::OverlaySpec> host_overlays;
  std::vector<LayerFacts> layers;  // image layers, bottom first
  std::string hostname;
  // /etc/resolv.conf's nameserver (the node's sandbox DNS forwarder); empty: the image's file.
  std::string nameserver;
  std::string workdir;
  uint32_t workdir_uid = 0, workdir_gid = 0;  // the sandbox user's
  int64_t disk_mb = 256;
  uint64_t inodes_per_mb = 256;
  int64_t tmpfs_disk_max_mb = 0;  // bigger writable layers are disk images
  // The CPUs the sandbox runs on ("0-1,3"), shown as /sys/devices/system/cpu/{online,possible,
  // present} (glibc's and so Python's CPU count); empty: the node's, no such files.
  std::string cpu_list;
};

RootfsPlan PlanRootfs(const RootfsInputs& in);

// The smallest disk image: below it ext4's own metadata (inode tables) would take a good part
// of the size, so such tiny layers stay a tmpfs (charged to memory: at most 15 MiB more).
constexpr int64_t kMinDiskImageMb = 16;

// Whether a writable layer of disk_mb is a disk image rather than a tmpfs (whose pages count as
// the sandbox's memory).
inline bool WritableLayerOnDisk(int64_t disk_mb, int64_t tmpfs_disk_max_mb) {
  return disk_mb > tmpfs_disk_max_mb && disk_mb >= kMinDiskImageMb;
}

}  // namespace dsec::backends
