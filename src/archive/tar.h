// Streaming tar reader/writer for dsec-agent file upload and download.
//
// TarExtractor unpacks a ustar / pax ('x' path, linkpath, size, mtime) / GNU ('L', 'K') stream
// beneath a directory fd. The sandbox is hostile (it may plant symlinks, even while we run), so
// every lookup goes through base/in_root.h from that fd (InRoot::kFollowInside; kNoSymlinks for
// image layers) and the final component is always created with O_EXCL / O_NOFOLLOW semantics: no
// entry can ever write outside the extraction root. Everything created is owned by options.uid/gid,
// permission bits are masked with 0777 (no setuid/setgid/sticky), devices and FIFOs are skipped;
// image layers are extracted with their owners and modes kept (TarExtractOptions::image_layer).
//
// TarCreator archives a tree (pax format, POSIX ustar headers) without following symlinks and
// without crossing mount points. Neither side holds a whole file or archive in memory.
// Single-threaded, no allocation proportional to file sizes; usable from the static agent.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace dsec::archive {

// Entries a caller's format gives a meaning of their own (OCI whiteouts in image layers,
// src/images/oci_whiteouts.h): the extractor asks about every entry's last path component and
// leaves the claimed ones to the hook instead of creating them. Not owned; must outlive the
// extractor.
class EntryHook {
 public:
  virtual ~EntryHook() = default;
  virtual bool Claims(std::string_view name) const = 0;
  // Makes what the claimed entry `name` stands for in `parent`, an open (O_RDONLY) directory
  // inside the extraction root, created like any entry's parent. `is_dir`: the entry is a
  // directory entry. The entry's data, if any, is skipped; an error fails the extraction.
  virtual Status Apply(int parent, const std::string& name, bool is_dir) = 0;
};

struct TarExtractOptions {
  uid_t uid = 1000, gid = 1000;  // owner of everything created (fchownat)
  // Sum of file sizes, a sparse file's counted at its real size (its holes included: what a
  // reader that does not know holes would go through); exceeded -> error kTooLarge.
  uint64_t max_total_bytes = 1ull << 32;
  uint64_t max_entries = 1'000'000;  // exceeded -> error kTooLarge
  // When true, Finish() fails unless the end-of-archive marker (zero block) was seen, so a
  // stream cut exactly at an entry boundary is reported instead of silently accepted.
  bool require_end_marker = true;
  // Image layers (src/images): the archive's own uid/gid and full mode (setuid, setgid and
  // sticky bits included) are kept instead of uid/gid and 0777; a symlink anywhere in an
  // entry's parent path is an error instead of being followed inside the root; and devices
  // and FIFOs are an error instead of being skipped. Absolute names and hard link targets are
  // refused.
  bool image_layer = false;
  // Entries with a meaning of their own, such as OCI whiteouts (see EntryHook); none if null.
  EntryHook* hook = nullptr;
  // With image_layer: device nodes and FIFOs under the archive's top-level dev/ are skipped
  // instead of refused (a Debian root filesystem from mmdebstrap has /dev/null and friends;
  // every sandbox mounts its own /dev over it anyway).
  bool skip_dev_nodes = false;
};

struct TarExtractStats {
  uint64_t entries = 0;  // entries created (files, dirs, symlinks, hard links)
  uint64_t bytes = 0;    // regular-file bytes written
  uint64_t skipped = 0;  // devices, FIFOs, unknown types, sparse files of older pax formats
};

class TarExtractor {
 public:
  // dest_dirfd: an open directory fd (the extraction root), not owned; it must stay open until
  // Finish(). All entry paths resolve beneath it.
  TarExtractor(int dest_dirfd, TarExtractOptions opts);
  ~TarExtractor();
  TarExtractor(const TarExtractor&) = delete;
  TarExtractor& operator=(const TarExtractor&) = delete;

  // Consumes the next part of the archive (any chunking, including 1-byte chunks). Errors are
  // sticky: once Feed fails, every later call returns the same error. Data after the
  // end-of-archive marker is ignored.
  Status Feed(std::string_view data);
  // Error if the archive ended mid-header, mid-entry, after an extended header, or (with
  // require_end_marker) without an end-of-archive marker.
  Status Finish();
  const TarExtractStats& stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

class TarCreator {
 public:
  // Archives the tree at `path` (resolved beneath root_dirfd with RESOLVE_IN_ROOT; "." for the
  // whole dir). If it is a directory, its contents are archived with names relative to it (the
  // directory itself gets no entry); otherwise the single entry is named by its last component.
  // Regular files, directories and symlinks (stored as links, never followed); FIFOs, sockets,
  // devices, mount points, files that vanish during the walk, paths longer than 4096 bytes and
  // directories more than 1024 levels deep are skipped and counted.
  static StatusOr<std::unique_ptr<TarCreator>> Open(int root_dirfd, const std::string& path);
  ~TarCreator();
  TarCreator(const TarCreator&) = delete;
  TarCreator& operator=(const TarCreator&) = delete;

  // Appends up to max_bytes of archive to *out; returns false in the bool once the whole
  // archive (including the end marker) has been appended. Errors are sticky.
  StatusOr<bool> Next(std::string* out, size_t max_bytes);
  uint64_t skipped() const;
  // Archive bytes already promised by what Next handed out (a header's file data and padding,
  // the rest of a header) and not yet appended: the archive is at least this much longer. A
  // caller with a size limit refuses a 1 TB file at its header instead of after its zeros.
  uint64_t owed() const;

 private:
  class Impl;
  explicit TarCreator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsec::archive
