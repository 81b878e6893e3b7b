#include "isolation/host_image.h"

#include <glob.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"

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

Status Materialize(const std::string& root, const MaskPlan& plan) {
  DSEC_RETURN_IF_ERROR(MakeDirs(root, 0755));
  auto parent_of = [&](const std::string& rel) {
    auto slash = rel.rfind('/');
    return slash == std::string::npos ? root : JoinPath(root, rel.substr(0, slash));
  };
  for (const auto& w : plan.whiteouts) {
    DSEC_RETURN_IF_ERROR(MakeDirs(parent_of(w), 0755));
    std::string p = JoinPath(root, w);
    // An overlay whiteout: a 0/0 character device hides the entry in lower layers.
    if (mknod(p.c_str(), S_IFCHR | 0000, makedev(0, 0)) < 0 && errno != EEXIST)
      return ErrnoError("mknod whiteout \"" + p + "\"");
  }
  for (const auto& [rel, content] : plan.files) {
    DSEC_RETURN_IF_ERROR(MakeDirs(parent_of(rel), 0755));
    std::string p = JoinPath(root, rel);
    DSEC_RETURN_IF_ERROR(WriteStringToFile(p, content, O_WRONLY | O_CREAT | O_TRUNC));
    if (chmod(p.c_str(), 0644) < 0) return ErrnoError("chmod \"" + p + "\"");
  }
  return OkStatus();
}

bool IsUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
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
  if (opts.store_dir.empty()) return InvalidArgument("host image needs a store dir");
  HostImage img;
  std::string description;  // what the mask layers contain; names their directory
  std::vector<std::pair<std::string, MaskPlan>> plans;  // dir -> plan

  for (const auto& dir : opts.dirs) {
    struct stat st;
    if (lstat(dir.c_str(), &st) < 0) continue;  // e.g. /libx32 on most hosts
    if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t n = readlink(dir.c_str(), buf, sizeof buf - 1);
      if (n < 0) return ErrnoError("readlink \"" + dir + "\"");
      std::string target(buf, static_cast<size_t>(n));
      // Only links that stay inside the allowlist are reproduced.
      std::string resolved = target[0] == '/' ? target : "/" + target;
      bool allowed = std::any_of(opts.dirs.begin(), opts.dirs.end(), [&](const std::string& d) {
        return resolved == d || IsUnder(resolved, d);
      });
      if (allowed) img.symlinks.push_back({dir, target});
      continue;
    }
    if (!S_ISDIR(st.st_mode)) continue;
    MaskPlan plan;
    if (dir == "/etc") {
      for (const auto& pattern : opts.etc_secrets) {
        glob_t g{};
        std::string full = "/etc/" + pattern;
        if (glob(full.c_str(), GLOB_NOSORT, nullptr, &g) == 0) {
          for (size_t i = 0; i < g.gl_pathc; ++i) plan.whiteouts.push_back(g.gl_pathv[i] + 5);
        }
        globfree(&g);
      }
      std::string shell = access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
      DSEC_ASSIGN_OR_RETURN(std::string passwd, ReadFileToString("/etc/passwd", 16 << 20));
      DSEC_ASSIGN_OR_RETURN(std::string group, ReadFileToString("/etc/group", 16 << 20));
      plan.files.push_back(
          {"passwd", PasswdWithSandboxUser(passwd, opts.sandbox_uid, opts.sandbox_gid, shell)});
      plan.files.push_back({"group", GroupWithSandboxUser(group, opts.sandbox_gid)});
    }
    for (const auto& hidden : opts.hidden_paths) {
      if (IsUnder(hidden, dir)) plan.whiteouts.push_back(hidden.substr(dir.size() + 1));
      if (hidden == dir)
        return InvalidArgument("edge path \"" + hidden + "\" is an allowlisted host image dir");
    }
    std::sort(plan.whiteouts.begin(), plan.whiteouts.end());
    description += dir + "\n";
    for (const auto& w : plan.whiteouts) description += "w " + w + "\n";
    for (const auto& [rel, content] : plan.files) description += "f " + rel + "\n" + content;
    plans.emplace_back(dir, std::move(plan));
  }

  // Content-addressed: a layer set is never modified once written, because sandboxes of a
  // previous edge run may still have it mounted.
  img.mask_dir = JoinPath(opts.store_dir, "host-" + InstanceIdForPath(description));
  std::string ready = JoinPath(img.mask_dir, ".ready");
  bool exists = access(ready.c_str(), F_OK) == 0;
  if (!exists) {
    DSEC_RETURN_IF_ERROR(RemoveTree(img.mask_dir));  // a half-written earlier attempt
    for (const auto& [dir, plan] : plans) {
      if (plan.empty()) continue;
      DSEC_RETURN_IF_ERROR(Materialize(JoinPath(JoinPath(img.mask_dir, "layers"), dir), plan));
    }
    DSEC_RETURN_IF_ERROR(WriteStringToFile(ready, description, O_WRONLY | O_CREAT | O_TRUNC));
  }
  for (const auto& [dir, plan] : plans) {
    OverlaySpec o;
    o.target = dir;
    if (!plan.empty()) {
      o.lower_fds.push_back(static_cast<int>(img.layer_paths.size()));
      img.layer_paths.push_back(JoinPath(JoinPath(img.mask_dir, "layers"), dir));
    }
    o.lower_fds.push_back(static_cast<int>(img.layer_paths.size()));
    img.layer_paths.push_back(dir);
    img.overlays.push_back(std::move(o));
  }
  return img;
}

}  // namespace dsec::isolation
