#include "isolation/host_image.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "base/file_util.h"
#include "base/ids.h"
#include "base/scope_guard.h"

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

TEST(HostImagePrivilegedTest, PrepareMasksEverythingButTheAllowlist) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (whiteouts are device nodes)";
  HostImageOptions o;
  o.hidden_paths = {"/etc/dsec-test-token", "/opt/dsec-state", "/var/lib/not-allowlisted"};
  auto img = HostImage::Prepare(o);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  ASSERT_GE(img->overlays.size(), 1u);
  ASSERT_EQ(img->overlays[0].target, "/");
  ASSERT_EQ(img->overlays[0].lower_fds.size(), 2u);  // the mask above the host root
  const HostLayer& mask = img->layers[img->overlays[0].lower_fds[0]];
  ASSERT_TRUE(mask.mount);
  EXPECT_EQ(img->layers[img->overlays[0].lower_fds[1]].host_path, "/");
  int m = mask.mount->get();
  auto is_whiteout = [&](const std::string& rel) {
    struct stat st;
    return fstatat(m, rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode) &&
           st.st_rdev == makedev(0, 0);
  };
  // Everything at the top that is not allowlisted is hidden; allowlisted dirs are not.
  for (const char* hidden : {"root", "home", "var", "tmp", "run", "proc", "sys", "dev"}) {
    std::string p = std::string("/") + hidden;
    if (access(p.c_str(), F_OK) == 0) {
      EXPECT_TRUE(is_whiteout(hidden)) << hidden;
    }
  }
  for (const char* shown : {"usr", "etc", "bin", "lib"}) {
    EXPECT_FALSE(is_whiteout(shown)) << shown;
  }
  if (access("/etc/shadow", F_OK) == 0) {
    EXPECT_TRUE(is_whiteout("etc/shadow"));
  }
  EXPECT_TRUE(is_whiteout("etc/dsec-test-token"));
  EXPECT_TRUE(is_whiteout("opt/dsec-state"));
  auto passwd = ReadFileAt(m, "etc/passwd");
  ASSERT_TRUE(passwd.ok());
  EXPECT_NE(passwd->find("sandbox:x:1000:1000"), std::string::npos);
  // The mask is read-only.
  EXPECT_LT(mkdirat(m, "new", 0755), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_FALSE(img->Stale());
}

TEST(HostImagePrivilegedTest, HidesWhatTheHostKeepsPrivate) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (writes a file under /opt)";
  std::string dir = "/opt/dsec-test-" + RandomHex(4);
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto cleanup = MakeScopeGuard([&] { (void)RemoveTree(dir); });
  ASSERT_TRUE(WriteStringToFile(dir + "/secret", "x", O_WRONLY | O_CREAT).ok());
  ASSERT_EQ(chmod((dir + "/secret").c_str(), 0600), 0);
  ASSERT_TRUE(WriteStringToFile(dir + "/public", "x", O_WRONLY | O_CREAT).ok());
  ASSERT_EQ(chmod((dir + "/public").c_str(), 0644), 0);
  auto img = HostImage::Prepare({});
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  const auto& w = img->whiteouts;
  EXPECT_NE(std::find(w.begin(), w.end(), dir.substr(1) + "/secret"), w.end());
  EXPECT_EQ(std::find(w.begin(), w.end(), dir.substr(1) + "/public"), w.end());
  EXPECT_TRUE(img->Stale() == false);
}

TEST(HostImageTest, RefusesToHideAWholeAllowlistedDir) {
  HostImageOptions o;
  o.hidden_paths = {"/etc"};
  EXPECT_EQ(HostImage::Prepare(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::isolation
