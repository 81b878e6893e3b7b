#include "isolation/rootfs.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>

#include "base/file_util.h"
#include "base/in_root.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

namespace {

std::vector<std::string_view> Components(std::string_view path) {
  return SplitString(path, '/', /*skip_empty=*/true);
}

Status CheckComponents(const std::string& path) {
  if (path.empty() || path[0] != '/')
    return InvalidArgument("path \"" + path + "\" is not absolute");
  for (auto c : Components(path))
    if (c == "." || c == "..") return InvalidArgument("path \"" + path + "\" has . or ..");
  return OkStatus();
}

// Attaches a detached mount (fsmount/open_tree fd) on top of the object `target` refers to.
Status Attach(int mount_fd, int target_fd, const std::string& what) {
  if (sys::MoveMount(mount_fd, "", target_fd, "",
                     MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
    return ErrnoError("move_mount onto \"" + what + "\"");
  return OkStatus();
}

struct FsParam {
  const char* key;
  std::string value;  // empty: a flag
};

// fsopen + fsconfig + fsmount: a new detached filesystem mount.
StatusOr<UniqueFd> NewMount(const char* fstype, const std::vector<FsParam>& params,
                            unsigned attrs) {
  UniqueFd fs(sys::FsOpen(fstype, FSOPEN_CLOEXEC));
  if (!fs) return ErrnoError(std::string("fsopen ") + fstype);
  for (const auto& p : params) {
    int rc = p.value.empty()
                 ? sys::FsConfig(fs.get(), FSCONFIG_SET_FLAG, p.key, nullptr, 0)
                 : sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, p.key, p.value.c_str(), 0);
    if (rc < 0) return ErrnoError(std::string("fsconfig ") + fstype + " " + p.key + "=" + p.value);
  }
  if (sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return ErrnoError(std::string("fsconfig ") + fstype + " create");
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, attrs));
  if (!mnt) return ErrnoError(std::string("fsmount ") + fstype);
  return mnt;
}

StatusOr<UniqueFd> CloneTree(int dirfd, const char* path, unsigned extra_flags = 0) {
  UniqueFd fd(sys::OpenTree(dirfd, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | extra_flags));
  if (!fd) return ErrnoError(std::string("open_tree \"") + path + "\"");
  return fd;
}

// Creates (or truncates) a regular file inside root; a symlink in the final position is
// replaced, never followed.
StatusOr<UniqueFd> CreateFileInRoot(int root, const std::string& path, mode_t mode) {
  int flags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW;
  auto fd = OpenSandboxPath(root, path, flags, mode);
  if (!fd.ok() && (fd.status().error_number() == ELOOP || fd.status().error_number() == EISDIR)) {
    auto slash = path.rfind('/');
    DSEC_ASSIGN_OR_RETURN(UniqueFd parent,
                          OpenSandboxPath(root, path.substr(0, slash + 1), O_PATH | O_DIRECTORY));
    std::string name = path.substr(slash + 1);
    if (unlinkat(parent.get(), name.c_str(), 0) < 0 && errno != ENOENT)
      return ErrnoError("unlink \"" + path + "\"");
    fd = OpenSandboxPath(root, path, flags, mode);
  }
  return fd;
}

Status SetupDev(int root, int dev_null_src, uint32_t pty_max) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd dev, MakeDirInRoot(root, "/dev", 0755, 0, 0, /*replace=*/true));
  {
    // /dev becomes a mount point (a bind of itself, so its files stay in the writable layer):
    // a plain directory could be renamed away by root inside, device mounts and all, and
    // replaced with a symlink or a directory of its own, under the agent's open("/dev/null").
    DSEC_ASSIGN_OR_RETURN(UniqueFd self, CloneTree(dev.get(), "", AT_EMPTY_PATH));
    DSEC_RETURN_IF_ERROR(Attach(self.get(), dev.get(), "/dev"));
    DSEC_ASSIGN_OR_RETURN(dev, OpenSandboxPath(root, "/dev", O_PATH | O_DIRECTORY));
  }
  for (const char* name : {"null", "zero", "full", "random", "urandom", "tty"}) {
    std::string path = std::string("/dev/") + name;
    DSEC_ASSIGN_OR_RETURN(UniqueFd target, CreateFileInRoot(root, path, 0666));
    UniqueFd src;
    if (std::string_view(name) == "null") {
      DSEC_ASSIGN_OR_RETURN(src, CloneTree(dev_null_src, "", AT_EMPTY_PATH));
    } else {
      DSEC_ASSIGN_OR_RETURN(src, CloneTree(AT_FDCWD, path.c_str()));
    }
    // Read-only: device I/O still works, but nobody (root without a user namespace included)
    // can chmod or chown the host's device node through it.
    mount_attr ro{};
    ro.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    if (sys::MountSetattr(src.get(), "", AT_EMPTY_PATH, &ro) < 0)
      return ErrnoError("mount_setattr readonly " + path);
    DSEC_ASSIGN_OR_RETURN(UniqueFd tpath, OpenSandboxPath(root, path, O_PATH | O_NOFOLLOW));
    DSEC_RETURN_IF_ERROR(Attach(src.get(), tpath.get(), path));
  }
  DSEC_ASSIGN_OR_RETURN(UniqueFd pts, MakeDirInRoot(root, "/dev/pts", 0755, 0, 0, true));
  std::vector<FsParam> pts_opts = {
      {"newinstance", ""}, {"ptmxmode", "0666"}, {"mode", "0620"}, {"gid", "5"}};
  if (pty_max > 0) pts_opts.push_back({"max", std::to_string(pty_max)});
  DSEC_ASSIGN_OR_RETURN(UniqueFd devpts,
                        NewMount("devpts", pts_opts, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC));
  DSEC_RETURN_IF_ERROR(Attach(devpts.get(), pts.get(), "/dev/pts"));
  // /dev/shm is a directory in the writable layer: shared memory counts against the disk.
  DSEC_ASSIGN_OR_RETURN(UniqueFd shm, MakeDirInRoot(root, "/dev/shm", 01777, 0, 0, true));
  for (const auto& [name, target] : {std::pair{"ptmx", "pts/ptmx"},
                                     {"fd", "/proc/self/fd"},
                                     {"stdin", "/proc/self/fd/0"},
                                     {"stdout", "/proc/self/fd/1"},
                                     {"stderr", "/proc/self/fd/2"},
                                     {"core", "/proc/kcore"}}) {
    if (std::string_view(name) == "core") continue;
    if (symlinkat(target, dev.get(), name) < 0 && errno != EEXIST)
      return ErrnoError(std::string("symlink /dev/") + name);
  }
  return OkStatus();
}

bool SafeSysctlPath(const std::string& rel) {
  if (rel.empty() || rel.front() == '/' || rel.back() == '/') return false;
  for (const auto& c : SplitString(rel, '/')) {
    if (c.empty() || c == "." || c == "..") return false;
    for (char ch : c)
      if (!(islower(static_cast<unsigned char>(ch)) || isdigit(static_cast<unsigned char>(ch)) ||
            ch == '_' || ch == '-'))
        return false;
  }
  return true;
}

// Limits of the sandbox's own namespaces, in its fresh /proc (writable to the agent as root of
// the namespaces' owning user namespace) before /proc/sys becomes read-only.
Status WriteSysctls(int proc, const std::vector<std::pair<std::string, std::string>>& sysctls) {
  for (const auto& [rel, value] : sysctls) {
    if (!SafeSysctlPath(rel)) return InvalidArgument("bad sysctl path \"" + rel + "\"");
    std::string path = "sys/" + rel;
    UniqueFd fd(openat(proc, path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return ErrnoError("open /proc/" + path);
    if (write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size()))
      return ErrnoError("write \"" + value + "\" to /proc/" + path);
  }
  return OkStatus();
}

Status SetupProc(int root, int dev_null_src,
                 const std::vector<std::pair<std::string, std::string>>& sysctls,
                 const std::vector<std::string>& view_names, const std::vector<int>& views) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd procdir, MakeDirInRoot(root, "/proc", 0555, 0, 0, true));
  DSEC_ASSIGN_OR_RETURN(
      UniqueFd proc,
      NewMount("proc", {}, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  DSEC_RETURN_IF_ERROR(Attach(proc.get(), procdir.get(), "/proc"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd p, OpenSandboxPath(root, "/proc", O_PATH | O_DIRECTORY));
  {
    UniqueFd dir(openat(p.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return ErrnoError("open /proc");
    DSEC_RETURN_IF_ERROR(WriteSysctls(dir.get(), sysctls));
  }
  // Every mask is a clone of one read-only template: an empty tmpfs for directories, /dev/null
  // for files (it reads as empty; nodev would make it EACCES instead). The last mask of each
  // kind is the template itself, so no detached mount is left behind to be dissolved on close
  // (one superblock, and no RCU grace period waited for per sandbox).
  std::vector<std::string> masked = ProcMaskedPaths();
  masked.insert(masked.end(), ProcAgentMaskedPaths().begin(), ProcAgentMaskedPaths().end());
  std::vector<std::pair<std::string, bool>> present;  // relative path, is a directory
  int left[2] = {0, 0};                               // masks still to attach: files, dirs
  for (const auto& rel : masked) {
    struct stat st;
    if (fstatat(p.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;  // not here
    present.emplace_back(rel, S_ISDIR(st.st_mode));
    ++left[S_ISDIR(st.st_mode) ? 1 : 0];
  }
  UniqueFd templates[2];
  if (left[1] > 0) {
    DSEC_ASSIGN_OR_RETURN(
        templates[1],
        NewMount("tmpfs", {{"size", "4k"}, {"nr_inodes", "1"}, {"mode", "0555"}},
                 MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC));
  }
  if (left[0] > 0) {
    DSEC_ASSIGN_OR_RETURN(templates[0], CloneTree(dev_null_src, "", AT_EMPTY_PATH));
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    if (sys::MountSetattr(templates[0].get(), "", AT_EMPTY_PATH, &attr) < 0)
      return ErrnoError("mount_setattr readonly /dev/null clone");
  }
  for (const auto& [rel, is_dir] : present) {
    UniqueFd target(openat(p.get(), rel.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!target) return ErrnoError("open /proc/" + rel);
    UniqueFd& tmpl = templates[is_dir ? 1 : 0];
    UniqueFd mask;
    if (--left[is_dir ? 1 : 0] == 0) {
      mask = std::move(tmpl);
    } else {
      DSEC_ASSIGN_OR_RETURN(mask, CloneTree(tmpl.get(), "", AT_EMPTY_PATH));
    }
    DSEC_RETURN_IF_ERROR(Attach(mask.get(), target.get(), "/proc/" + rel));
  }
  for (const auto& rel : ProcReadonlyPaths()) {
    struct stat st;
    if (fstatat(p.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    DSEC_ASSIGN_OR_RETURN(UniqueFd ro, CloneTree(p.get(), rel.c_str(), AT_RECURSIVE));
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    if (sys::MountSetattr(ro.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) < 0)
      return ErrnoError("mount_setattr readonly /proc/" + rel);
    UniqueFd target(openat(p.get(), rel.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!target) return ErrnoError("open /proc/" + rel);
    DSEC_RETURN_IF_ERROR(Attach(ro.get(), target.get(), "/proc/" + rel));
  }
  // The sandbox's own figures over the node's (its memory limit as MemTotal, ...).
  if (view_names.size() != views.size()) return InvalidArgument("proc views and fds differ");
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string& name = view_names[i];
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
      return InvalidArgument("bad proc view name \"" + name + "\"");
    UniqueFd target(openat(p.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!target) return ErrnoError("open /proc/" + name);
    DSEC_RETURN_IF_ERROR(Attach(views[i], target.get(), "/proc/" + name));
  }
  return OkStatus();
}

// Creates a directory or file (and missing parents, 0755 root) under `upper`, its parents
// resolved by `policy` (WriteRootPlan).
Status MakeUpperPath(int upper, const std::string& path, bool is_dir, uint32_t mode, uint32_t uid,
                     uint32_t gid, std::string_view content, InRoot policy) {
  DSEC_RETURN_IF_ERROR(CheckComponents(path));
  auto comps = Components(path);
  if (comps.empty()) return OkStatus();
  std::vector<std::string> parents(comps.begin(), comps.end() - 1);
  StatusOr<UniqueFd> parent = MakeDirsInRoot(upper, parents, policy);
  if (!parent.ok()) return parent.status().WithContext("parent of \"" + path + "\"");
  UniqueFd cur = std::move(parent).value();
  std::string name(comps.back());
  if (is_dir) {
    if (mkdirat(cur.get(), name.c_str(), 0700) < 0 && errno != EEXIST)
      return ErrnoError("mkdir \"" + path + "\"");
    // mkdir honours the umask: set the exact mode and owner.
    if (fchmodat(cur.get(), name.c_str(), mode, 0) < 0 ||
        fchownat(cur.get(), name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
      return ErrnoError("chmod/chown \"" + path + "\"");
    return OkStatus();
  }
  UniqueFd fd(
      openat(cur.get(), name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) return ErrnoError("create \"" + path + "\"");
  DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), content, path));
  if (fchown(fd.get(), uid, gid) < 0 || fchmod(fd.get(), mode) < 0)
    return ErrnoError("chown/chmod \"" + path + "\"");
  return OkStatus();
}

Status MakeUpperSymlink(int upper, const SymlinkSpec& l, InRoot policy) {
  auto slash = l.path.rfind('/');
  if (slash != 0)
    DSEC_RETURN_IF_ERROR(
        MakeUpperPath(upper, l.path.substr(0, slash), true, 0755, 0, 0, {}, policy));
  StatusOr<UniqueFd> opened = OpenInRoot(upper, slash == 0 ? "" : l.path.substr(1, slash - 1),
                                         O_PATH | O_DIRECTORY, policy);
  if (!opened.ok()) return opened.status().WithContext("parent of \"" + l.path + "\"");
  UniqueFd parent = std::move(opened).value();
  if (symlinkat(l.target.c_str(), parent.get(), l.path.c_str() + slash + 1) < 0 && errno != EEXIST)
    return ErrnoError("symlink \"" + l.path + "\"");
  return OkStatus();
}

}  // namespace

Status WriteRootPlan(int root, const std::vector<DirSpec>& dirs, const std::vector<FileSpec>& files,
                     const std::vector<SymlinkSpec>& symlinks, InRoot parents) {
  for (const auto& d : dirs)
    DSEC_RETURN_IF_ERROR(MakeUpperPath(root, d.path, true, d.mode, d.uid, d.gid, {}, parents));
  for (const auto& f : files)
    DSEC_RETURN_IF_ERROR(
        MakeUpperPath(root, f.path, false, f.mode, f.uid, f.gid, f.content, parents));
  for (const auto& l : symlinks) DSEC_RETURN_IF_ERROR(MakeUpperSymlink(root, l, parents));
  return OkStatus();
}

const std::vector<std::string>& ProcMaskedPaths() {
  // Docker's list plus the kernel address and page maps (kallsyms, kpage*). Each mask is a
  // mount, so the list stays at what leaks or controls host state.
  static const std::vector<std::string> kPaths = {
      "kcore",       "keys",          "key-users",  "kallsyms",   "sysrq-trigger",
      "timer_list",  "timer_stats",   "kpagecount", "kpageflags", "kpagecgroup",
      "sched_debug", "latency_stats", "acpi",       "scsi",       "asound"};
  return kPaths;
}

const std::vector<std::string>& ProcAgentMaskedPaths() {
  // PID 1 is the agent for the sandbox's whole life. Root inside shares its uid, so these
  // would let it make the agent the OOM killer's first choice.
  static const std::vector<std::string> kPaths = {"1/oom_score_adj", "1/oom_adj",
                                                  "1/task/1/oom_score_adj", "1/task/1/oom_adj"};
  return kPaths;
}

const std::vector<std::string>& ProcReadonlyPaths() {
  static const std::vector<std::string> kPaths = {"sys", "bus", "fs", "irq"};
  return kPaths;
}

StatusOr<UniqueFd> OpenSandboxPath(int root, const std::string& path, int flags, mode_t mode) {
  DSEC_RETURN_IF_ERROR(CheckComponents(path));
  StatusOr<UniqueFd> fd = OpenInRoot(root, path, flags, InRoot::kNoSymlinks, mode);
  if (!fd.ok()) return fd.status().WithContext("sandbox root");
  return fd;
}

StatusOr<UniqueFd> MakeDirInRoot(int root, const std::string& path, mode_t mode, uid_t uid,
                                 gid_t gid, bool replace) {
  DSEC_RETURN_IF_ERROR(CheckComponents(path));
  std::vector<std::string> comps;
  for (auto c : Components(path)) comps.emplace_back(c);
  if (comps.empty()) return OpenInRoot(root, "", O_PATH | O_DIRECTORY, InRoot::kNoSymlinks);
  const std::string name = comps.back();
  comps.pop_back();
  StatusOr<UniqueFd> parent = MakeDirsInRoot(root, comps, InRoot::kNoSymlinks);
  if (!parent.ok()) return parent.status().WithContext("sandbox root");
  const int dir = parent->get();
  auto open_last = [&] { return OpenInRoot(dir, name, O_PATH | O_DIRECTORY, InRoot::kBeneath); };
  StatusOr<UniqueFd> last = open_last();
  int err = last.ok() ? 0 : last.status().error_number();
  if ((err == ELOOP || err == ENOTDIR) && replace) {
    // A mount point (/proc, /dev): whatever the image put there goes.
    if (unlinkat(dir, name.c_str(), 0) < 0) return ErrnoError("unlink \"" + path + "\"");
    err = ENOENT;
  }
  if (err == ENOENT) {
    if (mkdirat(dir, name.c_str(), mode) < 0 && errno != EEXIST)
      return ErrnoError("mkdir \"" + path + "\"");
    // mkdir honours the umask; set the exact mode and owner.
    if (fchmodat(dir, name.c_str(), mode, 0) < 0) return ErrnoError("chmod \"" + path + "\"");
    if (fchownat(dir, name.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
      return ErrnoError("chown \"" + path + "\"");
    last = open_last();
  }
  if (!last.ok()) return last.status().WithContext("sandbox root");
  return last;
}

Status BuildRootfsAndPivot(const RootfsSpec& spec, const std::vector<int>& layer_fds, int mount_dir,
                           UniqueFd* writable, int disk, const std::vector<int>& proc_views) {
  // 1. Nothing we mount propagates back to the host, and host mounts stop propagating in.
  if (mount("", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
    return ErrnoError("mount --make-rprivate /");

  // 2. The writable layer: a tmpfs, or the disk the edge made.
  UniqueFd tmpfs;
  if (disk >= 0) {
    tmpfs.Reset(fcntl(disk, F_DUPFD_CLOEXEC, 3));
    if (!tmpfs) return ErrnoError("dup disk mount");
  } else {
    DSEC_ASSIGN_OR_RETURN(tmpfs, NewMount("tmpfs",
                                          {{"size", std::to_string(spec.size_bytes)},
                                           {"nr_inodes", std::to_string(spec.inodes)},
                                           {"mode", "0755"}},
                                          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  }
  DSEC_RETURN_IF_ERROR(Attach(tmpfs.get(), mount_dir, "sandbox writable layer"));
  // Relative paths below (overlay layer options) resolve against the tmpfs root.
  if (fchdir(tmpfs.get()) < 0) return ErrnoError("fchdir tmpfs");
  for (const char* d : {"root", "up", "wk", "layers"})
    if (mkdir(d, 0755) < 0) return ErrnoError(std::string("mkdir ") + d);

  // 3. Attach every layer once, under layers/<index>.
  for (size_t i = 0; i < layer_fds.size(); ++i) {
    std::string name = "layers/" + std::to_string(i);
    if (mkdir(name.c_str(), 0755) < 0) return ErrnoError("mkdir " + name);
    UniqueFd target(open(name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!target) return ErrnoError("open " + name);
    DSEC_RETURN_IF_ERROR(Attach(layer_fds[i], target.get(), name));
  }

  if (spec.overlays.empty() || spec.overlays[0].target != "/")
    return InvalidArgument("the first overlay must be the root (\"/\")");
  auto overlay = [&](size_t index, const OverlaySpec& o) -> StatusOr<UniqueFd> {
    if (o.lower_fds.empty()) return InvalidArgument("overlay " + o.target + " has no layers");
    std::string lower;
    for (int li : o.lower_fds) {
      if (li < 0 || static_cast<size_t>(li) >= layer_fds.size())
        return InvalidArgument("overlay " + o.target + " names a missing layer");
      if (!lower.empty()) lower += ':';
      lower += "layers/" + std::to_string(li);
    }
    std::string up = "up/" + std::to_string(index), wk = "wk/" + std::to_string(index);
    // The upper may already hold what was prepared for it (the root's, below).
    if ((mkdir(up.c_str(), 0755) < 0 && errno != EEXIST) || mkdir(wk.c_str(), 0755) < 0)
      return ErrnoError("mkdir overlay dirs for " + o.target);
    std::vector<FsParam> params = {{"lowerdir", lower}, {"upperdir", up}, {"workdir", wk}};
    if (spec.userns) params.push_back({"userxattr", ""});
    // xino: readdir's d_ino of a merged directory then matches stat's st_ino, as on one
    // filesystem (without it, layers on other filesystems than the upper give the lower's
    // inode in readdir and another in stat; programs that compare them, CPython's os.scandir
    // tests among them, see a broken filesystem). A kernel that refuses it mounts without.
    params.push_back({"xino", "on"});
    auto m = NewMount("overlay", params, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (m.ok()) return m;
    params.pop_back();
    return NewMount("overlay", params, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  };

  // 4. The root overlay. The spec's directories and files go straight into its upper layer
  // before the mount: it is our own fresh tmpfs directory, so plain *at() calls are safe, and
  // nothing needs a copy-up later. (A directory made there over a whiteout in the image hides
  // whatever is below, as a directory created through the overlay would.)
  {
    std::string up0 = "up/0";
    if (mkdir(up0.c_str(), 0755) < 0) return ErrnoError("mkdir up/0");
    UniqueFd up(open(up0.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!up) return ErrnoError("open up/0");
    DSEC_RETURN_IF_ERROR(
        WriteRootPlan(up.get(), spec.dirs, spec.files, spec.symlinks, InRoot::kBeneath));
  }
  UniqueFd rootdir(open("root", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!rootdir) return ErrnoError("open root");
  DSEC_ASSIGN_OR_RETURN(UniqueFd root_ov, overlay(0, spec.overlays[0]));
  DSEC_RETURN_IF_ERROR(Attach(root_ov.get(), rootdir.get(), "/"));
  UniqueFd root(open("root", O_PATH | O_DIRECTORY | O_CLOEXEC));  // the mount on top
  if (!root) return ErrnoError("open root mount");
  for (size_t i = 1; i < spec.overlays.size(); ++i) {
    const auto& o = spec.overlays[i];
    DSEC_RETURN_IF_ERROR(CheckComponents(o.target));
    if (o.target == "/") return InvalidArgument("only the first overlay may target /");
    DSEC_ASSIGN_OR_RETURN(UniqueFd target, MakeDirInRoot(root.get(), o.target, 0755, 0, 0, true));
    DSEC_ASSIGN_OR_RETURN(UniqueFd ov, overlay(i, o));
    DSEC_RETURN_IF_ERROR(Attach(ov.get(), target.get(), o.target));
  }

  // 5. /dev and /proc.
  UniqueFd dev_null(open("/dev/null", O_PATH | O_CLOEXEC));
  if (!dev_null) return ErrnoError("open host /dev/null");
  DSEC_RETURN_IF_ERROR(SetupDev(root.get(), dev_null.get(), spec.pty_max));
  DSEC_RETURN_IF_ERROR(
      SetupProc(root.get(), dev_null.get(), spec.sysctls, spec.proc_views, proc_views));

  // 6. pivot_root by fds: the new root becomes "/", the old one is stacked on it and detached.
  if (fchdir(root.get()) < 0) return ErrnoError("fchdir new root");
  if (sys::PivotRoot(".", ".") < 0) return ErrnoError("pivot_root");
  if (umount2(".", MNT_DETACH) < 0) return ErrnoError("umount old root");
  if (chdir("/") < 0) return ErrnoError("chdir /");
  if (writable) *writable = std::move(tmpfs);
  return OkStatus();
}

}  // namespace dsec::isolation
