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

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
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

// A formatted image of spec's size and inodes, owned by root, as an unnamed sparse file: what
// MakeDiskImageMountFrom copies (only what mkfs wrote, a few MiB) instead of running mkfs.
StatusOr<UniqueFd> MakeDiskImageTemplate(const DiskImageSpec& spec);
// MakeDiskImageMount, with the filesystem copied from a template of spec's size and inodes.
StatusOr<UniqueFd> MakeDiskImageMountFrom(int template_fd, const DiskImageSpec& spec);

// Ready-made disk images, so that a create takes a mount instead of making one (a file, a loop
// device and a mount: ~16 ms with mkfs, ~5 ms copied from a template), and a released one is
// shut down and unmounted off the caller's path. Sizes (bytes and inodes) asked for recently are
// kept `depth` deep by one background thread (niced), each copied from that size's template; a
// size not asked for in `idle` is dropped, and at most `max_sizes` are kept (the least recently
// asked for goes). A ready image is owned by root until it is taken; Take chowns its root
// directory to the spec's owner. Nothing a sandbox wrote can reach another: every image is a
// fresh copy of a freshly formatted filesystem, and a released one is never reused.
class DiskImagePool {
 public:
  struct Options {
    std::string dir;  // where images are made (DiskImageSpec::dir)
    bool preallocate = true;
    size_t depth = 4;  // 0: no pool (Take makes every image; Release still unmounts off-path)
    size_t max_sizes = 4;
    std::chrono::milliseconds idle{std::chrono::minutes(10)};
  };
  explicit DiskImagePool(Options opts);
  ~DiskImagePool();  // stops the thread; ready and released images are unmounted
  DiskImagePool(const DiskImagePool&) = delete;
  DiskImagePool& operator=(const DiskImagePool&) = delete;

  // A mount of spec's size and inodes, owned by spec.owner:group: a ready one, else made now
  // (spec.name names its file while it is made).
  StatusOr<UniqueFd> Take(const DiskImageSpec& spec);
  // The sandbox that used `mount` is gone: the filesystem is shut down (nothing it still holds
  // is written back) and unmounted by the pool's thread.
  void Release(UniqueFd mount);

  // How many images are ready, and how many released ones are not unmounted yet.
  size_t Ready();
  size_t Releasing();

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // bytes, inodes
  struct Size {
    std::vector<UniqueFd> ready;
    std::shared_ptr<const UniqueFd> tmpl;  // MakeDiskImageTemplate's, made on first need
    std::chrono::steady_clock::time_point last_asked;
    std::chrono::steady_clock::time_point retry_at;  // after a failed fill: not before
    std::string last_error;                          // logged once while it repeats
  };
  void Run();
  StatusOr<std::shared_ptr<const UniqueFd>> TemplateFor(const Key& key) DSEC_EXCLUDES(mu_);
  StatusOr<UniqueFd> MakeOne(const DiskImageSpec& spec) DSEC_EXCLUDES(mu_);
  // One step of work under the lock: returns false when there is nothing to do.
  bool NextFill(Key* key) DSEC_REQUIRES(mu_);

  const Options opts_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ DSEC_GUARDED_BY(mu_) = false;
  uint64_t made_ DSEC_GUARDED_BY(mu_) = 0;  // names of pool images
  std::map<Key, Size> sizes_ DSEC_GUARDED_BY(mu_);
  std::vector<UniqueFd> released_ DSEC_GUARDED_BY(mu_);
  size_t unmounting_ DSEC_GUARDED_BY(mu_) = 0;  // taken from released_, being unmounted
  std::thread thread_;
};

// Removes image files left in `dir` by interrupted creates (all files there: a live image has
// no name). Returns how many.
StatusOr<int> RemoveStaleDiskImages(const std::string& dir);

}  // namespace dsec::isolation
