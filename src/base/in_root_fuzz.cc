// libFuzzer target for base/in_root.h, the one place paths in trees that others control are
// looked up. Each input is a small script, one operation per line, run against a fresh
// directory `root` beside a canary directory `outside`:
//   d<path>            mkdir (its parent looked up without following anything)
//   f<path>            create a regular file (likewise)
//   l<path>\t<target>  symlink; "@OUT" in the target becomes the absolute host path of
//                      `outside`, "@ROOT" that of the root
//   o<P><path>         OpenInRoot(root, path, O_PATH, policy P)
//   m<P><path>         MakeDirsInRoot(root, components of path, policy P)
// where P is '0'..'3' (kFollowInside, kNoSymlinks, kBeneath, kBeneathOneMount). Paths may
// hold "..", "." and empty components, and links may point anywhere. Checked after every
// operation, trapping on a violation:
//  - every fd the module returned refers to something inside the root (its /proc/self/fd
//    path is the root or below it);
//  - every directory MakeDirsInRoot says it made is a directory inside the root;
//  - nothing appears or changes outside the root (the parent holds only root and outside,
//    outside only the canary, whose content and link count are unchanged).
// Real files are written under $TMPDIR (scripts/fuzz points it at a directory it removes).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_util.h"
#include "base/in_root.h"
#include "base/strings.h"
#include "base/testing/fuzz_dirs.h"
#include "base/unique_fd.h"

namespace {

constexpr size_t kMaxOps = 48;
constexpr size_t kMaxPathBytes = 512;

using dsec::testing::CheckOutsideUntouched;
using Dirs = dsec::testing::FuzzDirs;

const Dirs& TheDirs() { return dsec::testing::TheFuzzDirs("inrootfuzz"); }

void CheckInside(const Dirs& d, int fd) {
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  char buf[8192];
  ssize_t n = readlink(link.c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) abort();
  std::string_view p(buf, static_cast<size_t>(n));
  if (p == d.root) return;
  if (p.size() > d.root.size() && p.substr(0, d.root.size()) == d.root && p[d.root.size()] == '/')
    return;
  __builtin_trap();  // the module handed out something outside the root
}

dsec::InRoot PolicyOf(char c) {
  switch (c) {
    case '0':
      return dsec::InRoot::kFollowInside;
    case '1':
      return dsec::InRoot::kNoSymlinks;
    case '2':
      return dsec::InRoot::kBeneath;
    default:
      return dsec::InRoot::kBeneathOneMount;
  }
}

std::vector<std::string> Components(std::string_view path) {
  std::vector<std::string> out;
  for (std::string_view c : dsec::SplitString(path, '/', /*skip_empty=*/true)) out.emplace_back(c);
  return out;
}

std::string Substitute(std::string s, const Dirs& d) {
  for (auto [token, value] :
       {std::pair<std::string_view, const std::string&>{"@OUT", d.outside}, {"@ROOT", d.root}}) {
    for (size_t at = s.find(token); at != std::string::npos; at = s.find(token, at + 1))
      s.replace(at, token.size(), value);
  }
  return s;
}

// The parent of `path` inside root, looked up without following or climbing (the script's
// tree building must not be a way out by itself), and the last component.
bool ParentOf(int root, std::string_view path, dsec::UniqueFd* parent, std::string* name) {
  std::vector<std::string> comps = Components(path);
  if (comps.empty()) return false;
  *name = comps.back();
  if (*name == "." || *name == "..") return false;
  comps.pop_back();
  auto fd = dsec::OpenInRoot(root, dsec::JoinPathComponents(comps, comps.size()),
                             O_PATH | O_DIRECTORY, dsec::InRoot::kBeneath);
  if (!fd.ok()) return false;
  *parent = std::move(fd).value();
  return true;
}

void RunOp(const Dirs& d, int root, std::string_view line) {
  if (line.empty() || line.size() > kMaxPathBytes) return;
  const char op = line[0];
  std::string_view rest = line.substr(1);
  dsec::UniqueFd parent;
  std::string name;
  switch (op) {
    case 'd':
      if (ParentOf(root, rest, &parent, &name)) (void)mkdirat(parent.get(), name.c_str(), 0755);
      break;
    case 'f':
      if (ParentOf(root, rest, &parent, &name)) {
        int fd = openat(parent.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
      }
      break;
    case 'l': {
      size_t tab = rest.find('\t');
      if (tab == std::string_view::npos) break;
      std::string target = Substitute(std::string(rest.substr(tab + 1)), d);
      if (ParentOf(root, rest.substr(0, tab), &parent, &name))
        (void)symlinkat(target.c_str(), parent.get(), name.c_str());
      break;
    }
    case 'o':
      if (!rest.empty()) {
        auto fd = dsec::OpenInRoot(root, rest.substr(1), O_PATH, PolicyOf(rest[0]));
        if (fd.ok()) CheckInside(d, fd->get());
      }
      break;
    case 'm':
      if (!rest.empty()) {
        const dsec::InRoot policy = PolicyOf(rest[0]);
        std::vector<std::string> made;
        dsec::MakeDirsOptions o;
        o.created = &made;
        auto fd = dsec::MakeDirsInRoot(root, Components(rest.substr(1)), policy, o);
        if (fd.ok()) CheckInside(d, fd->get());
        for (const auto& m : made) {
          auto again = dsec::OpenInRoot(root, m, O_PATH | O_DIRECTORY, policy);
          // Made by this call a moment ago, by the same lookups: it is there, inside.
          if (!again.ok()) __builtin_trap();
          CheckInside(d, again->get());
        }
      }
      break;
    default:
      break;
  }
  CheckOutsideUntouched(d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Dirs& d = TheDirs();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.find('\0') != std::string_view::npos) return 0;  // not a path the kernel takes
  if (mkdir(d.root.c_str(), 0755) != 0) abort();
  {
    dsec::UniqueFd root(open(d.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) abort();
    size_t ops = 0;
    for (std::string_view line : dsec::SplitString(in, '\n', /*skip_empty=*/true)) {
      if (++ops > kMaxOps) break;
      RunOp(d, root.get(), line);
    }
  }
  if (!dsec::RemoveTree(d.root).ok()) abort();
  return 0;
}
