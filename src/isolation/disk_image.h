// Disk-backed writable layers for sandboxes whose disk is too big for a tmpfs (whose pages are
// charged to the sandbox's memory): a fresh ext4 filesystem of exactly the sandbox's disk size
// in a sparse file, through a loop device, handed to the agent as a detached mount that it
// attaches where it would have made its tmpfs.
//
// The file is unlinked as soon as the loop device holds it, so the filesystem lives exactly as
// long as the mount: when the sandbox's mount namespace goes (destroy, a crash, a killed edge
// and a sandbox that ended meanwhile), the mount, the loop device (autoclear) and the file's
// blocks go with it. Nothing is left to sweep but files of a create that was interrupted
// between creating the file and attaching it (RemoveStaleDiskImages).
//
// The size is the hard cap for everyone, root inside included: no blocks are reserved for
// root (mkfs -m 0) and a file system cannot grow past its device. Inodes are capped by the
// inode count given to mkfs. Without a journal: the layer dies with the sandbox anyway.
// The host's filesystem under `dir` must have room for what sandboxes write (the files are
// sparse: a sandbox costs what it wrote, plus ~1 MiB of metadata per GiB).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::isolation {

struct DiskImageSpec {
  std::string dir;     // where the (briefly named) image file is made
  std::string name;    // its name there while it has one (e.g. the sandbox id)
  uint64_t bytes = 0;  // filesystem size, >= 16 MiB
  uint64_t inodes = 0;
  uid_t owner = 0;  // of the filesystem's root directory (the sandbox's root, as the host sees it)
  gid_t group = 0;
  // Allocate all of `bytes` on the host filesystem up front (fallocate): the image can never
  // fill the host's disk by being written, and a host without room refuses it now
  // (OverCapacity). Else a sparse file (overcommitted: the host must have room for what is
  // written).
  bool preallocate = true;
};

// Formats (mkfs.ext4, Debian: e2fsprogs), attaches and mounts (nosuid, nodev) a new image;
// returns the detached mount.
StatusOr<UniqueFd> MakeDiskImageMount(const DiskImageSpec& spec);

// Removes image files left in `dir` by interrupted creates (all files there: a live image has
// no name). Returns how many.
StatusOr<int> RemoveStaleDiskImages(const std::string& dir);

}  // namespace dsec::isolation
