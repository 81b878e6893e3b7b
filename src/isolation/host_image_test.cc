#include "isolation/host_image.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/file_util.h"

namespace dsec::isolation {
namespace {

TEST(HostImageTest, SandboxUserReplacesConflictingEntries) {
  std::string passwd =
      "root:x:0:0:root:/root:/bin/bash\n"
      "debian:x:1000:1000::/home/debian:/bin/bash\n"
      "sandbox:x:1234:1234::/x:/bin/sh\n"
      "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n";
  std::string out = PasswdWithSandboxUser(passwd, 1000, 1000, "/bin/bash");
  EXPECT_EQ(out.find("debian"), std::string::npos);
  EXPECT_EQ(out.find("1234"), std::string::npos);
  EXPECT_NE(out.find("root:x:0:0"), std::string::npos);
  EXPECT_NE(out.find("nobody"), std::string::npos);
  EXPECT_NE(out.find("sandbox:x:1000:1000:DSec sandbox:/workspace:/bin/bash\n"), std::string::npos);
  std::string group = GroupWithSandboxUser("root:x:0:\nusers:x:100:\ndebian:x:1000:\n", 1000);
  EXPECT_EQ(group, "root:x:0:\nusers:x:100:\nsandbox:x:1000:\n");
}

TEST(HostImagePrivilegedTest, PrepareMasksSecretsAndOwnPaths) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (whiteouts are device nodes)";
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  HostImageOptions o;
  o.store_dir = dir->path() + "/store";
  o.hidden_paths = {"/etc/dsec-test-token", "/opt/dsec-state", "/var/lib/not-allowlisted"};
  auto img = HostImage::Prepare(o);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  std::string etc_mask;
  for (const auto& ov : img->overlays) {
    if (ov.target != "/etc") continue;
    ASSERT_EQ(ov.lower_fds.size(), 2u);  // mask layer above /etc
    etc_mask = img->layer_paths[ov.lower_fds[0]];
    EXPECT_EQ(img->layer_paths[ov.lower_fds[1]], "/etc");
  }
  ASSERT_FALSE(etc_mask.empty());
  struct stat st;
  if (access("/etc/shadow", F_OK) == 0) {
    ASSERT_EQ(lstat((etc_mask + "/shadow").c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  }
  ASSERT_EQ(lstat((etc_mask + "/dsec-test-token").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  auto passwd = ReadFileToString(etc_mask + "/passwd");
  ASSERT_TRUE(passwd.ok());
  EXPECT_NE(passwd->find("sandbox:x:1000:1000"), std::string::npos);
  // Never /root, /home, /var: not even as overlays.
  for (const auto& ov : img->overlays)
    for (const char* bad : {"/root", "/home", "/var", "/run", "/srv", "/mnt"})
      EXPECT_NE(ov.target, bad);
  // Content-addressed and reused: a second Prepare gives the same layer set.
  auto again = HostImage::Prepare(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->mask_dir, img->mask_dir);
  // Merged-/usr hosts get /bin etc. as symlinks.
  if (lstat("/bin", &st) == 0 && S_ISLNK(st.st_mode)) {
    bool found = false;
    for (const auto& l : img->symlinks) found |= l.path == "/bin";
    EXPECT_TRUE(found);
  }
}

TEST(HostImageTest, RefusesToHideAWholeAllowlistedDir) {
  auto dir = TempDir::Create();
  ASSERT_TRUE(dir.ok());
  HostImageOptions o;
  o.store_dir = dir->path();
  o.hidden_paths = {"/etc"};
  EXPECT_EQ(HostImage::Prepare(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::isolation
