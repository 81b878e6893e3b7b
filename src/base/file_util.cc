#include "base/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

namespace dsec {

StatusOr<std::string> ReadFdToString(int fd, const std::string& what, size_t max_bytes) {
  std::string out;
  char buf[8192];
  while (true) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read \"" + what + "\"");
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes)
      return TooLarge("file \"" + what + "\" is larger than " + std::to_string(max_bytes));
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

namespace {

Status RemoveTreeAt(int parent, const char* name, dev_t dev, const std::string& what) {
  struct stat st;
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError("fstatat \"" + what + "\"");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(parent, name, 0) < 0 && errno != ENOENT)
      return ErrnoError("unlink \"" + what + "\"");
    return OkStatus();
  }
  if (st.st_dev != dev)
    return FailedPrecondition("refusing to remove mount point \"" + what + "\"");
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open \"" + what + "\"");
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return ErrnoError("fdopendir \"" + what + "\"");
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    names.emplace_back(n);
  }
  Status result;
  for (const auto& n : names) {
    Status s = RemoveTreeAt(dirfd(d), n.c_str(), dev, what + "/" + n);
    if (!s.ok() && result.ok()) result = s;
  }
  closedir(d);
  if (!result.ok()) return result;
  if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return ErrnoError("rmdir \"" + what + "\"");
  return OkStatus();
}

}  // namespace

Status WriteAllFd(int fd, std::string_view data, const std::string& what) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write \"" + what + "\"");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return OkStatus();
}

Status ReadFileChunks(int fd, uint64_t size, size_t chunk,
                      const std::function<Status(std::string_view)>& fn, const std::string& what,
                      uint64_t offset) {
  std::vector<char> buf(std::min<uint64_t>(chunk, size));
  for (uint64_t off = 0; off < size;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off)), got = 0;
    while (got < want) {
      ssize_t n = pread(fd, buf.data() + got, want - got, static_cast<off_t>(offset + off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read \"" + what + "\"");
      if (n == 0)
        return InternalError("\"" + what + "\" is shorter than " + std::to_string(size) + " bytes");
      got += static_cast<size_t>(n);
    }
    DSEC_RETURN_IF_ERROR(fn(std::string_view(buf.data(), got)));
    off += got;
  }
  return OkStatus();
}

StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open \"" + path + "\"");
  return ReadFdToString(fd.get(), path, max_bytes);
}

StatusOr<std::string> ReadFileAt(int dirfd, const std::string& name, size_t max_bytes) {
  UniqueFd fd(openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open \"" + name + "\"");
  return ReadFdToString(fd.get(), name, max_bytes);
}

Status WriteStringToFile(const std::string& path, std::string_view data, int flags) {
  UniqueFd fd(open(path.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd) return ErrnoError("open \"" + path + "\"");
  return WriteAllFd(fd.get(), data, path);
}

Status WriteFileAt(int dirfd, const std::string& name, std::string_view data, int flags,
                   mode_t mode) {
  UniqueFd fd(openat(dirfd, name.c_str(), flags | O_CLOEXEC, mode));
  if (!fd) return ErrnoError("open \"" + name + "\"");
  return WriteAllFd(fd.get(), data, name);
}

Status MakeDirs(const std::string& path, mode_t mode) {
  if (path.empty()) return InvalidArgument("empty path");
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), mode) < 0 && errno != EEXIST) return ErrnoError("mkdir \"" + cur + "\"");
  }
  struct stat st;
  if (stat(path.c_str(), &st) < 0) return ErrnoError("stat \"" + path + "\"");
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("\"" + path + "\" is not a directory");
  return OkStatus();
}

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) < 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError("lstat \"" + path + "\"");
  }
  return RemoveTreeAt(AT_FDCWD, path.c_str(), st.st_dev, path);
}

StatusOr<UniqueFd> OpenDir(const std::string& path, int extra_flags) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | extra_flags));
  if (!fd) return ErrnoError("open \"" + path + "\"");
  return fd;
}

StatusOr<std::vector<std::string>> ListDir(const std::string& path, bool dirs_only) {
  DIR* d = opendir(path.c_str());
  if (!d) return ErrnoError("opendir \"" + path + "\"");
  std::vector<std::string> out;
  while (dirent* e = readdir(d)) {
    std::string_view n = e->d_name;
    if (n == "." || n == "..") continue;
    if (dirs_only && e->d_type != DT_DIR) continue;
    out.emplace_back(n);
  }
  closedir(d);
  return out;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  std::string out(a);
  if (out.empty() || out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

StatusOr<TempDir> TempDir::Create(const std::string& prefix) {
  std::string tmpl = prefix + "XXXXXX";
  if (!mkdtemp(tmpl.data())) return ErrnoError("mkdtemp \"" + tmpl + "\"");
  return TempDir(std::move(tmpl));
}

TempDir::~TempDir() {
  if (!path_.empty()) (void)RemoveTree(path_);
}

}  // namespace dsec
