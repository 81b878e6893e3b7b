// For fuzz targets that write real files: a private directory (under $TMPDIR, removed at
// exit) holding `root`, where the target may write, and `outside` with a canary file, which
// nothing the target does may touch. Header-only; traps (__builtin_trap) on a violation.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "base/file_util.h"

namespace dsec::testing {

struct FuzzDirs {
  std::string base, root, outside, canary;
};

// Made once per process; `name` goes into the directory's name. The path is canonical (no
// symlinks), so fd paths from /proc/self/fd can be compared with it as text.
inline const FuzzDirs& TheFuzzDirs(const char* name) {
  static FuzzDirs d = [name] {
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/dsec-" + name + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) abort();
    char* real = realpath(tmpl.c_str(), nullptr);
    if (!real) abort();
    std::string b = real;
    free(real);
    FuzzDirs r{b, b + "/root", b + "/outside", b + "/outside/canary"};
    if (mkdir(r.outside.c_str(), 0755) != 0) abort();
    if (!WriteStringToFile(r.canary, "canary", O_WRONLY | O_CREAT | O_EXCL).ok()) abort();
    static std::string base = r.base;
    atexit([] { (void)RemoveTree(base); });
    return r;
  }();
  return d;
}

// The parent holds only root and outside; outside only the canary, unchanged, with one link
// (no hard link to it was made from inside the root).
inline void CheckOutsideUntouched(const FuzzDirs& d) {
  auto base = ListDir(d.base);
  if (!base.ok() || base->size() != 2) __builtin_trap();
  auto out = ListDir(d.outside);
  if (!out.ok() || out->size() != 1) __builtin_trap();
  auto c = ReadFileToString(d.canary);
  if (!c.ok() || *c != "canary") __builtin_trap();
  struct stat st;
  if (lstat(d.canary.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)
    __builtin_trap();
}

}  // namespace dsec::testing
