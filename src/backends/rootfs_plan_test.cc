#include "backends/rootfs_plan.h"

#include <gtest/gtest.h>

#include "backends/sandbox_types.h"

namespace dsec::backends {
namespace {

const isolation::FileSpec* FindFile(const RootfsPlan& p, const std::string& path) {
  for (const auto& f : p.files)
    if (f.path == path) return &f;
  return nullptr;
}

const isolation::DirSpec* FindDir(const RootfsPlan& p, const std::string& path) {
  for (const auto& d : p.dirs)
    if (d.path == path) return &d;
  return nullptr;
}

// The host image as Prepare makes it here: the mask (idmapped) and two host directories, the
// root overlay over all three, and /usr (another filesystem) over the second.
RootfsInputs HostInputs() {
  RootfsInputs in;
  in.host_base = true;
  in.host_lowers = {true, false, false};
  in.host_overlays = {{"/", {0, 2}}, {"/usr", {1}}};
  in.hostname = "sb1";
  in.workdir = "/workspace";
  in.workdir_uid = kSandboxUid;
  in.workdir_gid = kSandboxGid;
  return in;
}

TEST(RootfsPlanTest, HostImageAloneKeepsItsLowersAndOverlays) {
  RootfsPlan p = PlanRootfs(HostInputs());
  ASSERT_EQ(p.lowers.size(), 3u);
  EXPECT_TRUE(p.lowers[0].idmap);
  EXPECT_FALSE(p.lowers[1].idmap);
  EXPECT_EQ(p.lowers[2].from, PlannedLower::From::kHostLayer);
  ASSERT_EQ(p.overlays.size(), 2u);
  EXPECT_EQ(p.overlays[0].target, "/");
  EXPECT_EQ(p.overlays[0].lowers, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(p.overlays[1].lowers, (std::vector<size_t>{1}));
  ASSERT_TRUE(FindFile(p, "/etc/hostname"));
  EXPECT_EQ(FindFile(p, "/etc/hostname")->content, "sb1\n");
  EXPECT_NE(FindFile(p, "/etc/hosts")->content.find("127.0.1.1\tsb1\n"), std::string::npos);
  // The host's own passwd shows through: the plan writes none.
  EXPECT_FALSE(FindFile(p, "/etc/passwd"));
  EXPECT_EQ(FindDir(p, "/workspace")->uid, kSandboxUid);
  EXPECT_EQ(FindDir(p, "/tmp")->mode, 01777u);
}

TEST(RootfsPlanTest, ImageLayersStackAboveTheHostTopmostFirstWithSubtrees) {
  RootfsInputs in = HostInputs();
  LayerFacts bottom, top;
  bottom.has_overlay_dir = {true};  // has /usr
  top.has_overlay_dir = {false};
  in.layers = {bottom, top};
  RootfsPlan p = PlanRootfs(in);
  // Host lowers 0-2, then the top layer (3), then the bottom layer (4) and its /usr subtree (5).
  ASSERT_EQ(p.lowers.size(), 6u);
  EXPECT_EQ(p.lowers[3].from, PlannedLower::From::kImageLayer);
  EXPECT_EQ(p.lowers[3].index, 1u);
  EXPECT_EQ(p.lowers[4].index, 0u);
  EXPECT_EQ(p.lowers[5].index, 0u);
  EXPECT_EQ(p.lowers[5].subdir, "usr");
  EXPECT_TRUE(p.lowers[5].idmap);
  EXPECT_EQ(p.overlays[0].lowers, (std::vector<size_t>{3, 4, 0, 2}));
  EXPECT_EQ(p.overlays[1].lowers, (std::vector<size_t>{5, 1}));
}

TEST(RootfsPlanTest, ImageWithoutHostGetsTheSandboxUserInItsOwnPasswd) {
  RootfsInputs in = HostInputs();
  in.host_base = false;
  in.host_lowers.clear();
  in.host_overlays.clear();
  LayerFacts base, mid, top;
  base.passwd_present = base.group_present = true;
  base.passwd = "root:x:0:0:root:/root:/bin/sh\nold:x:1:1::/:/bin/sh\n";
  base.group = "root:x:0:\n";
  mid.passwd_present = true;  // a whiteout: hides the base's passwd, not its group
  top.has_overlay_dir = {};
  in.layers = {base, mid, top};
  RootfsPlan p = PlanRootfs(in);
  ASSERT_EQ(p.overlays.size(), 1u);
  EXPECT_EQ(p.overlays[0].target, "/");
  EXPECT_EQ(p.overlays[0].lowers, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(p.lowers[0].index, 2u);  // topmost first
  const auto* passwd = FindFile(p, "/etc/passwd");
  ASSERT_TRUE(passwd);
  EXPECT_EQ(passwd->content.find("old:x:1:1"), std::string::npos);
  EXPECT_NE(passwd->content.find("sandbox:x:1000:1000:"), std::string::npos);
  const auto* group = FindFile(p, "/etc/group");
  ASSERT_TRUE(group);
  EXPECT_NE(group->content.find("root:x:0:"), std::string::npos);
  EXPECT_NE(group->content.find("sandbox:x:1000:"), std::string::npos);
}

TEST(RootfsPlanTest, TheWorkdirBelongsToTheSandboxUser) {
  RootfsInputs in = HostInputs();
  in.workdir = "/srv/task";
  in.workdir_uid = 0;
  in.workdir_gid = 0;
  RootfsPlan p = PlanRootfs(in);
  ASSERT_TRUE(FindDir(p, "/srv/task"));
  EXPECT_EQ(FindDir(p, "/srv/task")->uid, 0u);
  EXPECT_EQ(FindDir(p, "/workspace")->uid, kSandboxUid);  // still there, still the user's
  in.workdir = "/tmp";
  in.workdir_uid = 4242;
  p = PlanRootfs(in);
  EXPECT_EQ(FindDir(p, "/tmp")->uid, 4242u);
  EXPECT_EQ(FindDir(p, "/tmp")->mode, 01777u);
}

TEST(RootfsPlanTest, WritableLayerSizeInodesAndKind) {
  RootfsInputs in = HostInputs();
  in.disk_mb = 4;
  in.inodes_per_mb = 256;
  in.tmpfs_disk_max_mb = 1024;
  RootfsPlan p = PlanRootfs(in);
  EXPECT_EQ(p.size_bytes, 4ull << 20);
  EXPECT_EQ(p.inodes, 4096u);  // the floor
  EXPECT_FALSE(p.disk_image);
  in.disk_mb = 2048;
  p = PlanRootfs(in);
  EXPECT_EQ(p.inodes, 2048u * 256);
  EXPECT_TRUE(p.disk_image);
  EXPECT_FALSE(WritableLayerOnDisk(1024, 1024));
  EXPECT_TRUE(WritableLayerOnDisk(1025, 1024));
  // At 0 every layer is an image, but for tiny ones.
  EXPECT_TRUE(WritableLayerOnDisk(16, 0));
  EXPECT_FALSE(WritableLayerOnDisk(15, 0));
}

TEST(RootfsPlanTest, TheSandboxCpusAreItsSysCpuFiles) {
  RootfsInputs in = HostInputs();
  RootfsPlan p = PlanRootfs(in);
  for (const auto& f : p.files) EXPECT_EQ(f.path.rfind("/sys/", 0), std::string::npos) << f.path;
  in.cpu_list = "1,3";
  p = PlanRootfs(in);
  int n = 0;
  for (const auto& f : p.files) {
    if (f.path.rfind("/sys/devices/system/cpu/", 0) != 0) continue;
    ++n;
    EXPECT_EQ(f.content, "1,3\n");
    EXPECT_EQ(f.mode, 0444u);
  }
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace dsec::backends
