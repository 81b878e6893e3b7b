#include "backends/rootfs_plan.h"

#include <algorithm>

#include "backends/sandbox_types.h"
#include "isolation/host_image.h"

namespace dsec::backends {

namespace {

// The lowers and overlays: the host image's first (as it made them), then the image layers
// above them, topmost first; an overlay on a sub-path gets the layers' subtrees there.
void PlanLowers(const RootfsInputs& in, RootfsPlan* plan) {
  if (in.host_base) {
    for (size_t i = 0; i < in.host_lowers.size(); ++i)
      plan->lowers.push_back({PlannedLower::From::kHostLayer, i, "", in.host_lowers[i]});
    for (const auto& o : in.host_overlays) {
      PlannedOverlay po{o.target, {}};
      for (int fd : o.lower_fds) po.lowers.push_back(static_cast<size_t>(fd));
      plan->overlays.push_back(std::move(po));
    }
  } else {
    plan->overlays.push_back({"/", {}});
  }
  std::vector<size_t> inserted(plan->overlays.size(), 0);
  auto insert = [&](size_t o, size_t lower) {
    auto& l = plan->overlays[o].lowers;
    l.insert(l.begin() + static_cast<std::ptrdiff_t>(inserted[o]++), lower);
  };
  for (size_t k = in.layers.size(); k-- > 0;) {
    plan->lowers.push_back({PlannedLower::From::kImageLayer, k, "", true});
    insert(0, plan->lowers.size() - 1);
    for (size_t o = 1; o < plan->overlays.size(); ++o) {
      const auto& has = in.layers[k].has_overlay_dir;
      if (o - 1 >= has.size() || !has[o - 1]) continue;
      plan->lowers.push_back(
          {PlannedLower::From::kImageLayer, k, plan->overlays[o].target.substr(1), true});
      insert(o, plan->lowers.size() - 1);
    }
  }
}

// The topmost layer that has the file decides (a whiteout or a directory hides the rest).
std::string TopmostText(const std::vector<LayerFacts>& layers, bool LayerFacts::*present,
                        std::string LayerFacts::*text) {
  for (size_t k = layers.size(); k-- > 0;)
    if (layers[k].*present) return layers[k].*text;
  return "";
}

}  // namespace

RootfsPlan PlanRootfs(const RootfsInputs& in) {
  RootfsPlan plan;
  PlanLowers(in, &plan);
  plan.disk_image = WritableLayerOnDisk(in.disk_mb, in.tmpfs_disk_max_mb);
  plan.size_bytes = static_cast<uint64_t>(in.disk_mb) << 20;
  plan.inodes = std::max<uint64_t>(4096, static_cast<uint64_t>(in.disk_mb) * in.inodes_per_mb);
  // The host image hides every top-level entry it does not allow; these are the sandbox's own.
  plan.dirs = {{"/tmp", 01777, 0, 0},
               {"/var", 0755, 0, 0},
               {"/var/tmp", 01777, 0, 0},
               {"/run", 0755, 0, 0},
               {"/home", 0755, 0, 0},
               {"/root", 0700, 0, 0},
               {"/mnt", 0755, 0, 0},
               {"/sys", 0555, 0, 0},
               {"/proc", 0555, 0, 0},
               {"/dev", 0755, 0, 0},
               {"/workspace", 0755, kSandboxUid, kSandboxGid}};
  // The workdir belongs to the sandbox's user (an image's or the caller's), so it can write
  // there.
  bool listed = false;
  for (auto& d : plan.dirs)
    if (d.path == in.workdir) {
      listed = true;
      d.uid = in.workdir_uid;
      d.gid = in.workdir_gid;
    }
  if (!listed) plan.dirs.push_back({in.workdir, 0755, in.workdir_uid, in.workdir_gid});
  plan.files = {{"/etc/hostname", in.hostname + "\n", 0644, 0, 0},
                {"/etc/hosts",
                 "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" +
                     in.hostname + "\n",
                 0644, 0, 0}};
  // /sys is the sandbox's own empty directory: these are all glibc's get_nprocs() reads first.
  if (!in.cpu_list.empty())
    for (const char* f : {"online", "possible", "present"})
      plan.files.push_back(
          {std::string("/sys/devices/system/cpu/") + f, in.cpu_list + "\n", 0444, 0, 0});
  if (!in.nameserver.empty())
    plan.files.push_back({"/etc/resolv.conf", "nameserver " + in.nameserver + "\n", 0644, 0, 0});
  // Without the host image, the sandbox user is added to the image's own passwd and group.
  if (!in.host_base) {
    std::string passwd = TopmostText(in.layers, &LayerFacts::passwd_present, &LayerFacts::passwd);
    std::string group = TopmostText(in.layers, &LayerFacts::group_present, &LayerFacts::group);
    plan.files.push_back(
        {"/etc/passwd",
         isolation::PasswdWithSandboxUser(passwd, kSandboxUid, kSandboxGid, "/bin/sh"), 0644, 0,
         0});
    plan.files.push_back(
        {"/etc/group", isolation::GroupWithSandboxUser(group, kSandboxGid), 0644, 0, 0});
  }
  return plan;
}

}  // namespace dsec::backends
