// Small-file and directory helpers for host-side code (config, cgroupfs, proc, state dir).
// Paths given here are trusted host paths; caller- or sandbox-supplied paths never reach
// these functions (the agent resolves those inside the sandbox root with openat2).
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 1 << 20);
StatusOr<std::string> ReadFileAt(int dirfd, const std::string& name, size_t max_bytes = 1 << 20);
// Reads fd to its end (a pipe, stdin); `what` names it in errors. More than max_bytes: TooLarge.
StatusOr<std::string> ReadFdToString(int fd, const std::string& what, size_t max_bytes);
// Writes with a single write(2): what cgroupfs and procfs control files need.
Status WriteStringToFile(const std::string& path, std::string_view data, int flags = O_WRONLY);
Status WriteFileAt(int dirfd, const std::string& name, std::string_view data, int flags = O_WRONLY,
                   mode_t mode = 0644);
// Writes all of data to fd, retrying short writes and EINTR.
Status WriteAllFd(int fd, std::string_view data, const std::string& what);
// Reads the first `size` bytes of fd (pread: its file position is left alone), handing them to
// fn `chunk` bytes at a time (the last piece may be shorter); a file shorter than `size` is an
// error, and so is fn's first error, which stops the reading. `what` names fd in errors. The
// bytes read start at `offset`.
Status ReadFileChunks(int fd, uint64_t size, size_t chunk,
                      const std::function<Status(std::string_view)>& fn, const std::string& what,
                      uint64_t offset = 0);
// Creates path and missing parents (like mkdir -p); existing directories are fine.
Status MakeDirs(const std::string& path, mode_t mode = 0755);
// Removes a tree without following symlinks and without crossing into other mounts
// (a mount found inside is an error, never descended into). Missing path is OK.
Status RemoveTree(const std::string& path);
StatusOr<UniqueFd> OpenDir(const std::string& path, int extra_flags = 0);
std::string JoinPath(std::string_view a, std::string_view b);
// Names in a directory, without "." and ".."; with dirs_only, only entries whose
// d_type is DT_DIR (cgroupfs, procfs, tmpfs and ext4 all report it).
StatusOr<std::vector<std::string>> ListDir(const std::string& path, bool dirs_only = false);

// A temporary directory removed (RemoveTree) on destruction.
class TempDir {
 public:
  static StatusOr<TempDir> Create(const std::string& prefix = "/tmp/dsec-test-");
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string p) : path_(std::move(p)) {}
  std::string path_;
};

}  // namespace dsec
