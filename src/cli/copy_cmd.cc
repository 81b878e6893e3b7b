// `dsec cp`: files and directories between this machine and a sandbox (either side may be
// the sandbox: ID:PATH), as tar archives for directories.
#include "cli/copy_cmd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "archive/tar.h"
#include "base/file_util.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

constexpr size_t kIoChunk = 256 << 10;

// ---- cp ------------------------------------------------------------------------------------

struct Loc {
  bool remote = false;
  std::string id, path;
};

Loc ParseLoc(const std::string& s) {
  size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 0 && s.find('/') > colon && s[0] != '.')
    return {true, s.substr(0, colon), s.substr(colon + 1)};
  return {false, "", s};
}

std::string JoinRemote(std::string dir, const std::string& name) {
  if (dir.empty() || dir.back() != '/') dir += '/';
  return dir + name;
}

std::string Octal(uint32_t mode) {
  char b[8];
  snprintf(b, sizeof b, "%04o", mode & 07777);
  return b;
}

// Remote stat: nullopt when it does not exist.
StatusOr<std::optional<Json>> RemoteStat(EdgeClient& c, const std::string& id,
                                         const std::string& path) {
  auto r = c.CallJson(Verb::get, SbPath(id) + "/files/stat?path=" + UrlEncode(path));
  if (r.ok()) return std::optional<Json>(*r);
  if (r.status().code() == StatusCode::kNotFound &&
      r.status().message().find("sandbox") == std::string::npos)
    return std::optional<Json>();
  return r.status();
}

Status Upload(EdgeClient& c, const std::string& src, const Loc& dst) {
  struct stat st;
  if (stat(src.c_str(), &st) != 0) return ErrnoError("cp: " + src);
  DSEC_ASSIGN_OR_RETURN(auto target, RemoteStat(c, dst.id, dst.path));
  bool into_dir = (target && target->value("type", "") == "dir") || dst.path.ends_with("/");
  std::string path = into_dir ? JoinRemote(dst.path, BaseName(src)) : dst.path;
  if (S_ISREG(st.st_mode)) {
    UniqueFd fd(open(src.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoError("cp: " + src);
    std::string buf;
    return c.Upload(
        Verb::put, SbPath(dst.id) + "/files?path=" + UrlEncode(path) + "&mode=" + Octal(st.st_mode),
        "application/octet-stream", [&]() -> StatusOr<std::string> {
          buf.resize(kIoChunk);
          ssize_t n;
          do n = read(fd.get(), buf.data(), buf.size());
          while (n < 0 && errno == EINTR);
          if (n < 0) return ErrnoError("cp: reading " + src);
          buf.resize(static_cast<size_t>(n));
          return buf;
        });
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("cp: " + src + " is not a file or directory");
  UniqueFd dir(open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return ErrnoError("cp: " + src);
  DSEC_ASSIGN_OR_RETURN(auto tar, archive::TarCreator::Open(dir.get(), "."));
  bool done = false;
  return c.Upload(Verb::put, SbPath(dst.id) + "/archive?path=" + UrlEncode(path),
                  "application/x-tar", [&]() -> StatusOr<std::string> {
                    std::string out;
                    while (!done && out.size() < kIoChunk) {
                      DSEC_ASSIGN_OR_RETURN(bool more, tar->Next(&out, kIoChunk - out.size()));
                      done = !more;
                    }
                    return out;
                  });
}

Status Download(EdgeClient& c, const Loc& src, std::string dst) {
  DSEC_ASSIGN_OR_RETURN(auto st, RemoteStat(c, src.id, src.path));
  if (!st) return NotFound("cp: " + src.id + ":" + src.path + ": no such file or directory");
  struct stat lst;
  bool dst_is_dir = stat(dst.c_str(), &lst) == 0 && S_ISDIR(lst.st_mode);
  if (dst_is_dir) dst = dst + "/" + BaseName(src.path);
  if (st->value("type", "") == "dir") {
    if (mkdir(dst.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError("cp: mkdir " + dst);
    UniqueFd dir(open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return ErrnoError("cp: " + dst);
    archive::TarExtractOptions opts;
    opts.uid = geteuid();
    opts.gid = getegid();
    opts.max_total_bytes = 1ull << 40;
    archive::TarExtractor x(dir.get(), opts);
    DSEC_RETURN_IF_ERROR(c.Download(Verb::get,
                                    SbPath(src.id) + "/archive?path=" + UrlEncode(src.path), "",
                                    [&](std::string_view d) { return x.Feed(d); }));
    return x.Finish();
  }
  if (st->value("type", "") != "file")
    return InvalidArgument("cp: " + src.path + " is not a regular file or directory");
  // A fresh name beside the destination (O_EXCL | O_NOFOLLOW: nothing planted there is
  // followed or reused), renamed over it once complete.
  std::string tmp = dst + ".dsec-cp-" + RandomHex(8);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return ErrnoError("cp: " + tmp);
  auto rm = MakeScopeGuard([&] { unlink(tmp.c_str()); });
  DSEC_RETURN_IF_ERROR(c.Download(
      Verb::get, SbPath(src.id) + "/files?path=" + UrlEncode(src.path) + "&max_bytes=268435456", "",
      [&](std::string_view d) { return WriteAllFd(fd.get(), d, tmp); }));
  if (fchmod(fd.get(), st->value("mode", 0644) & 0777) != 0) return ErrnoError("cp: chmod " + dst);
  if (rename(tmp.c_str(), dst.c_str()) != 0) return ErrnoError("cp: " + dst);
  rm.Dismiss();
  return OkStatus();
}

}  // namespace

int Copy(const GlobalOptions& g, const std::string& a, const std::string& b) {
  Loc src = ParseLoc(a), dst = ParseLoc(b);
  if (src.remote == dst.remote)
    return Fail(InvalidArgument("cp: exactly one side must be SANDBOX:PATH"));
  const Loc& remote = src.remote ? src : dst;
  if (remote.path.empty() || remote.path[0] != '/')
    return Fail(
        InvalidArgument("cp: sandbox paths must be absolute, like " + remote.id + ":/workspace"));
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Status s = src.remote ? Download(**c, src, dst.path) : Upload(**c, src.path, dst);
  return s.ok() ? 0 : Fail(s);
}

}  // namespace dsec::cli
