#include "isolation/host_image.h"

#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

namespace {

std::string FilterDbLines(const std::string& content, const std::string& name,
                          const std::string& id, size_t id_field) {
  std::istringstream in(content);
  std::string line, out;
  while (std::getline(in, line)) {
    auto f = SplitString(line, ':');
    if (!f.empty() && (f[0] == name || (f.size() > id_field && f[id_field] == id))) continue;
    out += line;
    out += '\n';
  }
  return out;
}

// One mask layer's planned content, so it can be hashed before anything is written.
struct MaskPlan {
  std::vector<std::string> whiteouts;                      // relative paths
  std::vector<std::pair<std::string, std::string>> files;  // relative path, content
  bool empty() const { return whiteouts.empty() && files.empty(); }
};

// Writes the plan into the directory `root` (an fd of our fresh tmpfs) with *at() calls.
Status Materialize(int root, const MaskPlan& plan) {
  auto parent_of = [&](const std::string& rel, std::string* name) -> StatusOr<UniqueFd> {
    UniqueFd cur(fcntl(root, F_DUPFD_CLOEXEC, 3));
    auto comps = SplitString(rel, '/', true);
    for (size_t i = 0; i + 1 < comps.size(); ++i) {
      std::string c(comps[i]);
      if (mkdirat(cur.get(), c.c_str(), 0755) < 0 && errno != EEXIST)
        return ErrnoError("mkdir mask \"" + rel + "\"");
      cur.Reset(openat(cur.get(), c.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!cur) return ErrnoError("open mask \"" + rel + "\"");
    }
    *name = std::string(comps.back());
    return cur;
  };
  for (const auto& w : plan.whiteouts) {
    std::string name;
    DSEC_ASSIGN_OR_RETURN(UniqueFd dir, parent_of(w, &name));
    // An overlay whiteout: a 0/0 character device hides the entry in lower layers.
    if (mknodat(dir.get(), name.c_str(), S_IFCHR | 0000, makedev(0, 0)) < 0 && errno != EEXIST)
      return ErrnoError("mknod whiteout \"" + w + "\"");
  }
  for (const auto& [rel, content] : plan.files) {
    std::string name;
    DSEC_ASSIGN_OR_RETURN(UniqueFd dir, parent_of(rel, &name));
    DSEC_RETURN_IF_ERROR(WriteFileAt(dir.get(), name, content, O_WRONLY | O_CREAT | O_TRUNC, 0644));
  }
  return OkStatus();
}

// Adds (relative to /) every entry below dir that others may not read, without descending
// into those or into other filesystems. Symlinks are judged by their targets' own entries.
void CollectUnreadable(const std::string& dir, dev_t dev, std::vector<std::string>* out,
                       int depth) {
  if (depth > 32) return;
  auto names = ListDir(dir);
  if (!names.ok()) return;
  for (const auto& n : *names) {
    std::string path = dir + "/" + n;
    struct stat st;
    if (lstat(path.c_str(), &st) < 0 || S_ISLNK(st.st_mode) || st.st_dev != dev) continue;
    bool dir_entry = S_ISDIR(st.st_mode);
    bool readable = (st.st_mode & S_IROTH) && (!dir_entry || (st.st_mode & S_IXOTH));
    if (!readable) {
      out->push_back(path.substr(1));
    } else if (dir_entry) {
      CollectUnreadable(path, dev, out, depth + 1);
    }
  }
}

// Directories whose entries decide the mask: a change in any of them (an entry added,
// removed or renamed directly inside) means the mask must be rebuilt.
std::vector<int64_t> WatchedMtimes() {
  std::vector<int64_t> out;
  for (const char* d : {"/", "/etc", "/opt"}) {
    struct stat st;
    out.push_back(stat(d, &st) == 0
                      ? static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec
                      : -1);
  }
  return out;
}

bool IsUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

// What the mask over / holds: whiteouts for everything not for sandboxes, and the sandbox
// user's passwd and group. `separate` gets the allowlisted dirs on another filesystem than /.
StatusOr<MaskPlan> PlanMask(const HostImageOptions& opts, dev_t root_dev,
                            std::vector<std::string>* separate) {
  auto allowed_top = [&](const std::string& name) {
    return std::find(opts.dirs.begin(), opts.dirs.end(), "/" + name) != opts.dirs.end();
  };
  MaskPlan plan;
  // Hide every top-level entry of / that is not allowlisted.
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> top, ListDir("/"));
  for (const auto& n : top) {
    if (!allowed_top(n)) {
      plan.whiteouts.push_back(n);
      continue;
    }
    struct stat st;
    if (lstat(("/" + n).c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_dev != root_dev)
      separate->push_back("/" + n);
  }
  // Anything under /etc or /opt that the host did not make world-readable is not for
  // sandboxes (root inside could read it otherwise): pg_hba.conf, ssl/private, vpn keys, ...
  // (/usr is left to the named list: walking it takes ~0.7 s and it holds package files.)
  for (const char* top : {"/etc", "/opt"}) {
    if (std::find(opts.dirs.begin(), opts.dirs.end(), top) == opts.dirs.end()) continue;
    CollectUnreadable(top, root_dev, &plan.whiteouts, 0);
  }
  // Secrets under /etc, readable or not.
  for (const auto& pattern : opts.etc_secrets) {
    glob_t g{};
    std::string full = "/etc/" + pattern;
    if (glob(full.c_str(), GLOB_NOSORT, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) plan.whiteouts.push_back(g.gl_pathv[i] + 1);
    }
    globfree(&g);
  }
  // The edge's own files, wherever they fall under an allowlisted dir.
  for (const auto& hidden : opts.hidden_paths) {
    for (const auto& dir : opts.dirs) {
      if (hidden == dir)
        return InvalidArgument("edge path \"" + hidden + "\" is an allowlisted host image dir");
      if (IsUnder(hidden, dir)) plan.whiteouts.push_back(hidden.substr(1));
    }
  }
  std::string shell = access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
  DSEC_ASSIGN_OR_RETURN(std::string passwd, ReadFileToString("/etc/passwd", 16 << 20));
  DSEC_ASSIGN_OR_RETURN(std::string group, ReadFileToString("/etc/group", 16 << 20));
  plan.files.push_back(
      {"etc/passwd", PasswdWithSandboxUser(passwd, opts.sandbox_uid, opts.sandbox_gid, shell)});
  plan.files.push_back({"etc/group", GroupWithSandboxUser(group, opts.sandbox_gid)});
  std::sort(plan.whiteouts.begin(), plan.whiteouts.end());
  plan.whiteouts.erase(std::unique(plan.whiteouts.begin(), plan.whiteouts.end()),
                       plan.whiteouts.end());
  return plan;
}

// The mask: a detached, read-only tmpfs mount held by fd.
StatusOr<std::shared_ptr<const UniqueFd>> BuildMask(const MaskPlan& p) {
  UniqueFd fs(sys::FsOpen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs) return ErrnoError("fsopen tmpfs for the host image mask");
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "size", "16m", 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return ErrnoError("fsconfig mask tmpfs");
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return ErrnoError("fsmount mask tmpfs");
  DSEC_RETURN_IF_ERROR(Materialize(mnt.get(), p));
  mount_attr ro{};
  ro.attr_set = MOUNT_ATTR_RDONLY;
  if (sys::MountSetattr(mnt.get(), "", AT_EMPTY_PATH, &ro) < 0) return ErrnoError("mask read-only");
  return std::make_shared<const UniqueFd>(std::move(mnt));
}

}  // namespace

std::string PasswdWithSandboxUser(const std::string& host_passwd, uint32_t uid, uint32_t gid,
                                  const std::string& shell) {
  std::string out = FilterDbLines(host_passwd, "sandbox", std::to_string(uid), 2);
  out += "sandbox:x:" + std::to_string(uid) + ":" + std::to_string(gid) +
         ":DSec sandbox:/workspace:" + shell + "\n";
  return out;
}

std::string GroupWithSandboxUser(const std::string& host_group, uint32_t gid) {
  std::string out = FilterDbLines(host_group, "sandbox", std::to_string(gid), 2);
  out += "sandbox:x:" + std::to_string(gid) + ":\n";
  return out;
}

StatusOr<HostImage> HostImage::Prepare(const HostImageOptions& opts) {
  HostImage img;
  struct stat root_st;
  if (stat("/", &root_st) < 0) return ErrnoError("stat /");
  img.watch_mtimes = WatchedMtimes();
  std::vector<std::string> separate;
  DSEC_ASSIGN_OR_RETURN(MaskPlan plan, PlanMask(opts, root_st.st_dev, &separate));
  DSEC_ASSIGN_OR_RETURN(auto mask, BuildMask(plan));
  img.whiteouts = plan.whiteouts;
  img.layers = {HostLayer{"", mask}, HostLayer{"/", nullptr}};
  img.overlays.push_back({"/", {0, 1}});
  for (const auto& sdir : separate) {
    // A separate filesystem is a separate overlay; its part of the mask goes with it.
    MaskPlan sub;
    for (const auto& w : plan.whiteouts)
      if (IsUnder("/" + w, sdir)) sub.whiteouts.push_back(w.substr(sdir.size()));
    int idx = static_cast<int>(img.layers.size());
    if (sub.empty()) {
      img.layers.push_back({sdir, nullptr});
      img.overlays.push_back({sdir, {idx}});
    } else {
      DSEC_ASSIGN_OR_RETURN(auto sub_mask, BuildMask(sub));
      img.layers.push_back({"", sub_mask});
      img.layers.push_back({sdir, nullptr});
      img.overlays.push_back({sdir, {idx, idx + 1}});
    }
  }
  return img;
}

bool HostImage::Stale() const { return WatchedMtimes() != watch_mtimes; }

}  // namespace dsec::isolation
