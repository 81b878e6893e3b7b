// The image store and importers against real archives made by GNU tar, gzip and zstd, and
// EROFS layers mounted through real loop devices (root only; skipped otherwise).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "base/file_util.h"
#include "images/capture.h"
#include "images/import.h"
#include "images/store.h"

namespace dsec::images {
namespace {

int Sh(const std::string& cmd) { return system(cmd.c_str()); }

// Runs a Python script in `dir` (made if missing) that writes tars with tarfile; the script
// may call add(t, name, data=b'x', **TarInfo fields) to put one entry in tar t.
int WriteTars(const std::string& dir, const std::string& script) {
  return Sh("mkdir -p " + dir + " && cd " + dir + " && /usr/bin/python3 - <<'EOF'\n" +
            "import tarfile, io\n"
            "def add(t, name, data=b'x', **kw):\n"
            "    i = tarfile.TarInfo(name); i.size = len(data)\n"
            "    for k, v in kw.items(): setattr(i, k, v)\n"
            "    t.addfile(i, io.BytesIO(data) if i.type == tarfile.REGTYPE else None)\n" +
            script + "EOF");
}

class ImageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "[  SKIPPED ] needs root (whiteouts, owners)";
    auto t = TempDir::Create("/tmp/dsec-images-test-");
    ASSERT_TRUE(t.ok());
    tmp_.emplace(std::move(t).value());
    root_ = tmp_->path() + "/store";
    src_ = tmp_->path() + "/src";
    ASSERT_EQ(Sh("mkdir -p " + src_ + "/etc " + src_ + "/bin && echo hello > " + src_ +
                 "/etc/motd && echo x > " + src_ + "/bin/tool && chmod 4755 " + src_ +
                 "/bin/tool && ln -s ../etc/motd " + src_ + "/bin/motd && ln " + src_ +
                 "/bin/tool " + src_ + "/bin/tool2 && mkdir -p " + src_ + "/gone && touch " + src_ +
                 "/gone/.wh.old && touch " + src_ + "/etc/.wh.shadow"),
              0);
    ASSERT_EQ(Sh("tar -C " + src_ + " --numeric-owner -cf " + tmp_->path() + "/l.tar ."), 0);
    Reopen();
  }
  void TearDown() override { store_.reset(); }

  void Reopen(const std::string& fmt = "dir") {
    store_.reset();
    StoreOptions o;
    o.root = root_;
    auto format = ParseLayerFormat(fmt);
    ASSERT_TRUE(format.ok()) << format.status().ToString();
    o.default_format = *format;
    auto s = ImageStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }

  StatusOr<Image> Import(const std::string& file, const std::string& name,
                         const std::string& layer_format = "") {
    ImportOptions o;
    o.name = name;
    if (!layer_format.empty()) {
      DSEC_ASSIGN_OR_RETURN(o.layer_format, ParseLayerFormat(layer_format));
    }
    return ImportFile(store_.get(), file, o);
  }

  std::optional<TempDir> tmp_;
  std::string root_, src_;
  std::unique_ptr<ImageStore> store_;
};

TEST(LayerFormatTest, NamesRoundTripAndOthersAreRefused) {
  for (LayerFormat f : {LayerFormat::kDir, LayerFormat::kErofs})
    EXPECT_EQ(ParseLayerFormat(LayerFormatName(f)).value(), f);
  EXPECT_EQ(LayerFormatName(LayerFormat::kErofs), "erofs");
  auto bad = ParseLayerFormat("zip");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("dir or erofs"), std::string::npos);
  EXPECT_FALSE(ParseLayerFormat("").ok());
}

TEST_F(ImageStoreTest, RootfsTarBecomesAnOverlayReadyLayer) {
  auto img = Import(tmp_->path() + "/l.tar", "base");
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->name, "base:latest");
  ASSERT_EQ(img->layers.size(), 1u);
  std::string dir = store_->LayerDir(img->layers[0]);
  struct stat st;
  ASSERT_EQ(lstat((dir + "/bin/tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(lstat((dir + "/bin/motd").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(lstat((dir + "/etc/shadow").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  ASSERT_EQ(lstat((dir + "/gone/old").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // The digest is the sha256 of the tar, as sha256sum computes it.
  ASSERT_EQ(Sh("sha256sum " + tmp_->path() + "/l.tar | cut -c1-64 > " + tmp_->path() + "/sum"), 0);
  auto sum = ReadFileToString(tmp_->path() + "/sum");
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(img->layers[0], "sha256:" + sum->substr(0, 64));
}

TEST_F(ImageStoreTest, CompressedArchivesDeduplicateAndSurviveReopen) {
  ASSERT_EQ(Sh("gzip -k -c " + tmp_->path() + "/l.tar > " + tmp_->path() + "/l.tar.gz"), 0);
  ASSERT_EQ(Sh("zstd -q -c " + tmp_->path() + "/l.tar > " + tmp_->path() + "/l.tar.zst"), 0);
  auto a = Import(tmp_->path() + "/l.tar", "a:1");
  auto b = Import(tmp_->path() + "/l.tar.gz", "b:1");
  auto c = Import(tmp_->path() + "/l.tar.zst", "c:1");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << b.status().ToString() << c.status().ToString();
  EXPECT_EQ(a->layers, b->layers);
  EXPECT_EQ(a->layers, c->layers);
  auto names = ListDir(root_ + "/layers");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 1u);
  Reopen();
  EXPECT_EQ(store_->ListImages().size(), 3u);
  EXPECT_TRUE(store_->GetLayer(a->layers[0]).ok());
  EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty());
}

TEST_F(ImageStoreTest, CollectRemovesOnlyUnreferencedLayers) {
  auto a = Import(tmp_->path() + "/l.tar", "a");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(Sh("echo more > " + src_ + "/etc/more && tar -C " + src_ + " -cf " + tmp_->path() +
               "/l2.tar ."),
            0);
  auto b = Import(tmp_->path() + "/l2.tar", "b");
  ASSERT_TRUE(b.ok());
  auto stack = store_->Acquire({"b"}, "sb-1");
  ASSERT_TRUE(stack.ok());
  ASSERT_TRUE(store_->DeleteImage("a").ok());
  ASSERT_TRUE(store_->DeleteImage("b").ok());
  EXPECT_EQ(store_->Collect().value(), 1);  // a's layer; b's is held by sb-1
  EXPECT_TRUE(store_->GetLayer(b->layers[0]).ok());
  EXPECT_FALSE(store_->GetLayer(a->layers[0]).ok());
  Reopen();  // the holder survives a restart
  EXPECT_EQ(store_->Collect().value(), 0);
  store_->RetainHolders({});
  EXPECT_EQ(store_->Collect().value(), 1);
  EXPECT_TRUE(ListDir(root_ + "/layers").value().empty());
}

TEST_F(ImageStoreTest, StacksComposeInOrderAndSkipRepeatedLayers) {
  auto a = Import(tmp_->path() + "/l.tar", "a");
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(Sh("mkdir -p " + tmp_->path() + "/s2/p && echo p > " + tmp_->path() +
               "/s2/p/f && tar -C " + tmp_->path() + "/s2 -cf " + tmp_->path() + "/p.tar ."),
            0);
  auto p = Import(tmp_->path() + "/p.tar", "proj:abc");
  ASSERT_TRUE(p.ok());
  Image snap;
  snap.name = "snap:1";
  snap.layers = {a->layers[0], p->layers[0]};
  ASSERT_TRUE(store_->PutImage(snap).ok());
  auto st = store_->Acquire({"a", "proj:abc", "snap:1"}, "");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->layers.size(), 2u);
  EXPECT_EQ(st->layers[0].digest, a->layers[0]);
  EXPECT_EQ(st->layers[1].digest, p->layers[0]);
  EXPECT_FALSE(store_->Acquire({"a", "host"}, "").ok());
  EXPECT_EQ(store_->Acquire({"missing"}, "").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(NormalizeName("Bad").ok());
  EXPECT_FALSE(NormalizeName("a/b").ok());
  EXPECT_FALSE(NormalizeName("host").ok());
  EXPECT_EQ(NormalizeName("x").value(), "x:latest");
}

TEST_F(ImageStoreTest, MaliciousArchivesLeaveNothingBehind) {
  std::string ev = tmp_->path() + "/evil";
  ASSERT_EQ(Sh("mkdir -p " + ev + " && cd " + ev + " && ln -s / link && mkdir -p link2"), 0);
  ASSERT_EQ(
      WriteTars(ev,
                "for n, f in [('dotdot', lambda t: add(t, '../escape')),\n"
                "             ('abs', lambda t: add(t, '/abs')),\n"
                "             ('dev', lambda t: add(t, 'dev/sda', b'', type=tarfile.BLKTYPE)),\n"
                "             ('symw', lambda t: (add(t, 'l', b'', type=tarfile.SYMTYPE, "
                "linkname='/tmp'), add(t, 'l/owned'))),\n"
                "             ]:\n"
                "    with tarfile.open(n + '.tar', 'w', format=tarfile.GNU_FORMAT) as t:\n"
                "        f(t)\n"
                "i = tarfile.TarInfo('big'); i.size = 1 << 50\n"
                "open('huge.tar', 'wb').write(i.tobuf(tarfile.GNU_FORMAT) + b'x' * 4096)\n"),
      0);
  for (const char* n : {"dotdot", "abs", "dev", "symw", "huge"}) {
    auto r = Import(ev + "/" + n + ".tar", std::string("evil-") + n);
    EXPECT_FALSE(r.ok()) << n;
    EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty()) << n;
    EXPECT_TRUE(ListDir(root_ + "/layers").value().empty()) << n;
  }
  EXPECT_TRUE(store_->ListImages().empty());
  EXPECT_NE(access("/tmp/owned", F_OK), 0);
  EXPECT_NE(access((tmp_->path() + "/escape").c_str(), F_OK), 0);
}

// OCI whiteouts (images/oci_whiteouts.h): opaque directories, a whiteout that replaces a file
// of the same layer, and the malformed ones, refused.
TEST_F(ImageStoreTest, OciWhiteoutsBecomeOverlayWhiteoutsAndBadOnesAreRefused) {
  std::string w = tmp_->path() + "/wh";
  ASSERT_EQ(WriteTars(w,
                      "with tarfile.open('good.tar', 'w', format=tarfile.PAX_FORMAT) as t:\n"
                      "    add(t, 'var/.wh..wh..opq', b'')\n"
                      "    add(t, 'etc/passwd', b'same layer')\n"
                      "    add(t, 'etc/.wh.passwd', b'data is skipped')\n"
                      "    add(t, 'new/deep/.wh.gone', b'')\n"
                      "for n, name, kw in [('dotdot', 'a/.wh...', {}), ('empty', 'a/.wh.', {}),\n"
                      "                    ('nested', 'a/.wh..wh.x', {}),\n"
                      "                    ('dir', 'a/.wh.d', {'type': tarfile.DIRTYPE})]:\n"
                      "    with tarfile.open(n + '.tar', 'w', format=tarfile.PAX_FORMAT) as t:\n"
                      "        add(t, name, b'', **kw)\n"
                      "with tarfile.open('ondir.tar', 'w', format=tarfile.PAX_FORMAT) as t:\n"
                      "    add(t, 'a/d', b'', type=tarfile.DIRTYPE)\n"
                      "    add(t, 'a/.wh.d', b'')\n"),
            0);
  auto img = Import(w + "/good.tar", "wh");
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  std::string dir = store_->LayerDir(img->layers[0]);
  char v[8] = {};
  EXPECT_EQ(getxattr((dir + "/var").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  struct stat st;
  for (const char* p : {"/etc/passwd", "/new/deep/gone"}) {
    ASSERT_EQ(lstat((dir + p).c_str(), &st), 0) << p;
    EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) << p;
  }
  EXPECT_EQ(ListDir(dir + "/etc").value(), std::vector<std::string>{"passwd"});
  EXPECT_TRUE(ListDir(dir + "/var").value().empty());
  for (const char* n : {"dotdot", "empty", "nested", "dir", "ondir"}) {
    auto r = Import(w + "/" + n + ".tar", std::string("wh-") + n);
    EXPECT_FALSE(r.ok()) << n;
    EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty()) << n;
  }
}

TEST_F(ImageStoreTest, ErofsLayersMountThroughLoopDevices) {
  if (access("/usr/bin/mkfs.erofs", X_OK) != 0)
    GTEST_SKIP() << "[  SKIPPED ] mkfs.erofs (erofs-utils) is not installed";
  auto img = Import(tmp_->path() + "/l.tar", "ero", "erofs");
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  auto layer = store_->GetLayer(img->layers[0]);
  ASSERT_TRUE(layer.ok());
  EXPECT_EQ(layer->format, LayerFormat::kErofs);
  auto src = store_->Source(*layer);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  std::string motd = "/proc/self/fd/" + std::to_string(src->mount_fd) + "/etc/motd";
  auto text = ReadFileToString(motd);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "hello\n");
  struct stat st;
  ASSERT_EQ(lstat(("/proc/self/fd/" + std::to_string(src->mount_fd) + "/etc/shadow").c_str(), &st),
            0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_TRUE(store_->DeleteImage("ero").ok());
  EXPECT_EQ(store_->Collect().value(), 1);
  store_.reset();
}

// A sandbox's sparse files (3 GiB of holes around a few bytes) and a setuid file it made,
// captured as a snapshot would: the tar carries only the data (a PAX 1.0 sparse entry that GNU
// tar reads back), the layer keeps the holes in both formats, and the setuid bit is gone
// unless asked for.
TEST_F(ImageStoreTest, CapturedSparseFilesStayHolesAndSetuidBitsAreDropped) {
  std::string up = tmp_->path() + "/upper";
  ASSERT_EQ(Sh("mkdir -p " + up + "/data && truncate -s 3G " + up + "/data/big && " +
               "printf middle | dd of=" + up + "/data/big bs=1 seek=1500000000 conv=notrunc " +
               "status=none && truncate -s 1G " + up + "/data/empty && echo x > " + up +
               "/data/tool && chmod 4755 " + up + "/data/tool && ln " + up + "/data/big " + up +
               "/data/big2"),
            0);
  UniqueFd dir(open(up.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(dir);
  for (bool keep : {false, true}) {
    std::string tar;
    CaptureOptions co;
    co.keep_setuid = keep;
    CaptureStats stats;
    ASSERT_TRUE(WriteLayerTar(
                    {{dir.get(), "/"}}, co,
                    [&](std::string_view d) {
                      tar.append(d);
                      return OkStatus();
                    },
                    &stats)
                    .ok());
    EXPECT_LT(tar.size(), 1u << 20) << "holes were written into the tar";
    EXPECT_EQ(stats.sparse_files, 2u);
    EXPECT_EQ(stats.setuid_dropped, keep ? 0u : 1u);
    std::string file = tmp_->path() + "/cap.tar";
    ASSERT_TRUE(WriteStringToFile(file, tar, O_WRONLY | O_CREAT | O_TRUNC).ok());
    // GNU tar reads the sparse entries back under their real names and sizes.
    ASSERT_EQ(Sh("rm -rf " + tmp_->path() + "/gnu && mkdir " + tmp_->path() + "/gnu && tar -C " +
                 tmp_->path() + "/gnu -xf " + file + " && test $(stat -c %s " + tmp_->path() +
                 "/gnu/data/big) = 3221225472 && dd if=" + tmp_->path() +
                 "/gnu/data/big bs=1 skip=1500000000 count=6 status=none | grep -q middle"),
              0);
    for (const char* fmt : {"dir", "erofs"}) {
      if (std::string(fmt) == "erofs" && access("/usr/bin/mkfs.erofs", X_OK) != 0) continue;
      auto b = store_->NewLayer();
      ASSERT_TRUE(b.ok());
      ASSERT_TRUE((*b)->Feed(tar).ok());
      auto layer = (*b)->Commit("", *ParseLayerFormat(fmt));
      ASSERT_TRUE(layer.ok()) << layer.status().ToString();
      auto src = store_->Source(*layer);
      ASSERT_TRUE(src.ok()) << src.status().ToString();
      std::string root =
          src->mount_fd >= 0 ? "/proc/self/fd/" + std::to_string(src->mount_fd) : src->path;
      struct stat st;
      ASSERT_EQ(stat((root + "/data/big").c_str(), &st), 0) << fmt;
      EXPECT_EQ(st.st_size, 3ll << 30) << fmt;
      EXPECT_LT(st.st_blocks * 512, 8ll << 20) << fmt << ": holes became blocks";
      EXPECT_EQ(st.st_nlink, 2u) << fmt;
      ASSERT_EQ(stat((root + "/data/empty").c_str(), &st), 0) << fmt;
      EXPECT_EQ(st.st_size, 1ll << 30) << fmt;
      UniqueFd f(open((root + "/data/big").c_str(), O_RDONLY | O_CLOEXEC));
      char buf[6];
      ASSERT_EQ(pread(f.get(), buf, 6, 1500000000), 6);
      EXPECT_EQ(std::string(buf, 6), "middle") << fmt;
      ASSERT_EQ(pread(f.get(), buf, 6, 1000), 6);
      EXPECT_EQ(std::string(buf, 6), std::string(6, '\0')) << fmt;
      ASSERT_EQ(stat((root + "/data/tool").c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, keep ? 04755u : 0755u) << fmt;
    }
  }
}

}  // namespace
}  // namespace dsec::images
