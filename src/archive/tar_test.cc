#include "archive/tar.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace dsec::archive {
namespace {

constexpr uid_t kUid = 1234;
constexpr gid_t kGid = 5678;

// ---------------------------------------------------------------------------------------------
// Archive construction, byte by byte (independent of the implementation's writer).

enum class Magic { kPosix, kGnu, kV7 };

void PutOctal(std::string* b, size_t off, size_t len, uint64_t v) {
  char buf[32];
  (void)snprintf(buf, sizeof buf, "%0*llo", static_cast<int>(len - 1),
                 static_cast<unsigned long long>(v));
  memcpy(b->data() + off, buf, len - 1);
  (*b)[off + len - 1] = '\0';
}

void FixChecksum(std::string* b) {
  memset(b->data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : *b) sum += c;
  char buf[16];
  (void)snprintf(buf, sizeof buf, "%06o", sum);
  memcpy(b->data() + 148, buf, 7);  // six digits and NUL, then the space stays
}

struct Hdr {
  std::string name;
  char type = '0';
  uint64_t size = 0;
  unsigned mode = 0644;
  std::string link;
  Magic magic = Magic::kPosix;
  std::string prefix;
  bool base256_size = false;
  int64_t mtime = 1700000000;
  unsigned uid = 0, gid = 0;
};

std::string Header(const Hdr& h) {
  std::string b(512, '\0');
  memcpy(b.data(), h.name.data(), std::min<size_t>(h.name.size(), 100));
  PutOctal(&b, 100, 8, h.mode);
  PutOctal(&b, 108, 8, h.uid);
  PutOctal(&b, 116, 8, h.gid);
  if (h.base256_size) {
    b[124] = static_cast<char>(0x80);
    uint64_t v = h.size;
    for (int i = 135; i > 124; --i) {
      b[i] = static_cast<char>(v & 0xff);
      v >>= 8;
    }
  } else {
    PutOctal(&b, 124, 12, h.size);
  }
  PutOctal(&b, 136, 12, static_cast<uint64_t>(h.mtime));
  b[156] = h.type;
  memcpy(b.data() + 157, h.link.data(), std::min<size_t>(h.link.size(), 100));
  // "\000" is one NUL: the POSIX magic is "ustar" NUL "00".
  if (h.magic == Magic::kPosix) b.replace(257, 8, std::string("ustar\00000", 8));
  if (h.magic == Magic::kGnu) b.replace(257, 8, std::string("ustar  \0", 8));
  memcpy(b.data() + 345, h.prefix.data(), std::min<size_t>(h.prefix.size(), 155));
  FixChecksum(&b);
  return b;
}

std::string Pad(std::string data) {
  data.append((512 - data.size() % 512) % 512, '\0');
  return data;
}

std::string File(const std::string& name, const std::string& data, unsigned mode = 0644) {
  return Header({.name = name, .type = '0', .size = data.size(), .mode = mode}) + Pad(data);
}
std::string Dir(const std::string& name, unsigned mode = 0755) {
  return Header({.name = name, .type = '5', .mode = mode});
}
std::string Symlink(const std::string& name, const std::string& target) {
  return Header({.name = name, .type = '2', .mode = 0777, .link = target});
}
std::string HardLink(const std::string& name, const std::string& target) {
  return Header({.name = name, .type = '1', .link = target});
}
std::string End() { return std::string(1024, '\0'); }

std::string PaxRecord(const std::string& key, const std::string& value) {
  const size_t body = 1 + key.size() + 1 + value.size() + 1;
  size_t len = body + std::to_string(body).size();
  len = body + std::to_string(len).size();
  return std::to_string(len) + " " + key + "=" + value + "\n";
}
std::string Pax(const std::string& records, char type = 'x') {
  return Header({.name = "PaxHeaders/x", .type = type, .size = records.size()}) + Pad(records);
}
std::string GnuLong(char type, const std::string& value) {
  std::string data = value + std::string(1, '\0');
  return Header(
             {.name = "././@LongLink", .type = type, .size = data.size(), .magic = Magic::kGnu}) +
         Pad(data);
}

// ---------------------------------------------------------------------------------------------
// File system helpers.

std::string ReadFile(const std::string& path) {
  auto s = ReadFileToString(path, 64 << 20);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : "";
}

void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644) {
  ASSERT_TRUE(WriteFileAt(AT_FDCWD, path, data, O_WRONLY | O_CREAT | O_TRUNC, mode).ok()) << path;
  ASSERT_EQ(chmod(path.c_str(), mode), 0);
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::set<std::string> ListNames(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.insert(n);
  }
  closedir(d);
  return out;
}

struct Node {
  char type = '?';
  mode_t mode = 0;
  std::string data;  // file contents or symlink target
  uid_t uid = 0;
  gid_t gid = 0;
  ino_t ino = 0;
  time_t mtime = 0;
};

void SnapshotInto(const std::string& root, const std::string& rel,
                  std::map<std::string, Node>* out) {
  const std::string dir = rel.empty() ? root : root + "/" + rel;
  for (const std::string& n : ListNames(dir)) {
    const std::string r = rel.empty() ? n : JoinPath(rel, n);
    const std::string p = JoinPath(root, r);
    struct stat st;
    ASSERT_EQ(lstat(p.c_str(), &st), 0) << p;
    Node node;
    node.mode = st.st_mode & 07777;
    node.uid = st.st_uid;
    node.gid = st.st_gid;
    node.ino = st.st_ino;
    node.mtime = st.st_mtime;
    if (S_ISDIR(st.st_mode)) {
      node.type = 'd';
      SnapshotInto(root, r, out);
    } else if (S_ISLNK(st.st_mode)) {
      node.type = 'l';
      char buf[4096];
      ssize_t len = readlink(p.c_str(), buf, sizeof buf);
      ASSERT_GE(len, 0);
      node.data.assign(buf, static_cast<size_t>(len));
    } else if (S_ISREG(st.st_mode)) {
      node.type = 'f';
      node.data = ReadFile(p);
    }
    (*out)[r] = node;
  }
}

std::map<std::string, Node> Snapshot(const std::string& root) {
  std::map<std::string, Node> out;
  SnapshotInto(root, "", &out);
  return out;
}

// Same names, types, permission bits, contents and targets; regular-file mtimes when asked.
void ExpectSameTree(const std::map<std::string, Node>& want, const std::map<std::string, Node>& got,
                    bool check_mtime = true) {
  std::vector<std::string> want_names, got_names;
  for (const auto& [k, v] : want) want_names.push_back(k);
  for (const auto& [k, v] : got) got_names.push_back(k);
  ASSERT_EQ(want_names, got_names);
  for (const auto& [name, w] : want) {
    const Node& g = got.at(name);
    EXPECT_EQ(w.type, g.type) << name;
    EXPECT_EQ(w.mode & 0777, g.mode) << name;
    EXPECT_TRUE(w.data == g.data) << name << ": contents differ (" << w.data.size() << " vs "
                                  << g.data.size() << " bytes)";
    if (check_mtime && w.type == 'f') {
      EXPECT_EQ(w.mtime, g.mtime) << name;
    }
  }
}

std::string RandomBytes(std::mt19937_64* rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>((*rng)() & 0xff);
  return s;
}

// Archives `path` beneath root with random Next() sizes.
std::string CreateArchive(int root_fd, const std::string& path, std::mt19937_64* rng,
                          uint64_t* skipped = nullptr) {
  auto creator = TarCreator::Open(root_fd, path);
  EXPECT_TRUE(creator.ok()) << creator.status().ToString();
  if (!creator.ok()) return "";
  std::string out;
  for (int calls = 0; calls < 10'000'000; ++calls) {
    const size_t max = 1 + (*rng)() % 100'000;
    const size_t before = out.size();
    auto more = (*creator)->Next(&out, max);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok()) return "";
    EXPECT_LE(out.size() - before, max);
    if (!*more) break;
  }
  EXPECT_EQ(out.size() % 512, 0u);
  if (skipped) *skipped = (*creator)->skipped();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Fixture: base/{dest,outside,src} in a fresh temp dir; `outside` must never be written.

class TarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TempDir::Create("/tmp/dsec-tar-test-");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    base_.emplace(std::move(t).value());
    dest_ = base_->path() + "/dest";
    outside_ = base_->path() + "/outside";
    src_ = base_->path() + "/src";
    for (const std::string& d : {dest_, outside_, src_}) ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
    WriteFile(outside_ + "/secret", "secret");
    dest_fd_.Reset(open(dest_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    src_fd_.Reset(open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(dest_fd_ && src_fd_);
  }

  void TearDown() override {
    // Nothing may ever land outside dest: base holds only what SetUp made, outside is intact.
    EXPECT_EQ(ListNames(base_->path()), (std::set<std::string>{"dest", "outside", "src"}));
    EXPECT_EQ(ListNames(outside_), (std::set<std::string>{"secret"}));
    EXPECT_EQ(ReadFile(outside_ + "/secret"), "secret");
    struct stat st;
    ASSERT_EQ(stat((outside_ + "/secret").c_str(), &st), 0);
    EXPECT_EQ(st.st_nlink, 1u);
  }

  static TarExtractOptions Opts() {
    TarExtractOptions o;
    o.uid = kUid;
    o.gid = kGid;
    return o;
  }

  struct Result {
    Status status;
    TarExtractStats stats;
  };

  // Feeds `archive` in chunks of `chunk` bytes (0: random sizes) and finishes.
  Result Extract(std::string_view archive, TarExtractOptions opts = Opts(), size_t chunk = SIZE_MAX,
                 std::mt19937_64* rng = nullptr) {
    TarExtractor x(dest_fd_.get(), opts);
    while (!archive.empty()) {
      size_t n = chunk == 0 ? 1 + (*rng)() % 70'000 : chunk;
      n = std::min(n, archive.size());
      Status s = x.Feed(archive.substr(0, n));
      if (!s.ok()) return {s, x.stats()};
      archive.remove_prefix(n);
    }
    Status s = x.Finish();
    return {s, x.stats()};
  }

  std::string D(const std::string& rel) const { return dest_ + "/" + rel; }

  std::optional<TempDir> base_;
  std::string dest_, outside_, src_;
  UniqueFd dest_fd_, src_fd_;
};

// ---------------------------------------------------------------------------------------------
// Round trips.

TEST_F(TarTest, RoundTripCreateExtract) {
  std::mt19937_64 rng(42);
  ASSERT_EQ(mkdir((src_ + "/a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((src_ + "/a/b").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((src_ + "/a/b/c").c_str(), 0750), 0);
  WriteFile(src_ + "/a/b/c/deep.txt", "deep\n", 0600);
  WriteFile(src_ + "/empty", "");
  WriteFile(src_ + "/run.sh", "#!/bin/sh\n", 0755);
  const std::string big = RandomBytes(&rng, 3 << 20);
  WriteFile(src_ + "/big.bin", big);
  // > 100 chars, splittable into ustar prefix + name.
  const std::string split_dir = std::string(70, 'p');
  ASSERT_EQ(mkdir((src_ + "/" + split_dir).c_str(), 0755), 0);
  WriteFile(src_ + "/" + split_dir + "/" + std::string(60, 'q'), "split");
  // A 200-char component: needs a pax path record.
  const std::string long_name = std::string(200, 'n');
  WriteFile(src_ + "/a/" + long_name, "long");
  ASSERT_EQ(symlink("a/b/c/deep.txt", (src_ + "/link").c_str()), 0);
  ASSERT_EQ(symlink("/etc/passwd", (src_ + "/abs").c_str()), 0);  // stored, never followed
  const std::string long_target = "a/" + long_name;               // > 100: pax linkpath
  ASSERT_EQ(symlink(long_target.c_str(), (src_ + "/longlink").c_str()), 0);
  const auto want = Snapshot(src_);

  uint64_t skipped = 99;
  const std::string archive = CreateArchive(src_fd_.get(), ".", &rng, &skipped);
  EXPECT_EQ(skipped, 0u);
  EXPECT_GT(archive.size(), big.size());

  Result r = Extract(archive, Opts(), 0, &rng);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const auto got = Snapshot(dest_);
  ExpectSameTree(want, got);
  EXPECT_EQ(r.stats.entries, want.size());
  EXPECT_EQ(r.stats.bytes, big.size() + 5 + 10 + 5 + 4);
  EXPECT_EQ(r.stats.skipped, 0u);
  for (const auto& [name, node] : got) {
    EXPECT_EQ(node.uid, kUid) << name;
    EXPECT_EQ(node.gid, kGid) << name;
  }

  // The same archive, one byte per Feed.
  ASSERT_TRUE(RemoveTree(dest_).ok());
  ASSERT_EQ(mkdir(dest_.c_str(), 0755), 0);
  dest_fd_.Reset(open(dest_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  r = Extract(archive, Opts(), 1);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ExpectSameTree(want, Snapshot(dest_));

  // GNU tar reads our archives to the same tree.
  const std::string file = base_->path() + "/dest/archive.tar";
  const std::string gnu_out = base_->path() + "/dest/gnu";
  ASSERT_EQ(mkdir(gnu_out.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAt(AT_FDCWD, file, archive, O_WRONLY | O_CREAT | O_TRUNC).ok());
  const std::string cmd = "tar -xf '" + file + "' -C '" + gnu_out + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string messages;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) messages.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << messages;
  EXPECT_EQ(messages, "");
  ExpectSameTree(want, Snapshot(gnu_out));
}

TEST_F(TarTest, CreatorSubdirSingleFileAndSymlink) {
  std::mt19937_64 rng(1);
  ASSERT_TRUE(MakeDirs(src_ + "/x/y/z").ok());
  WriteFile(src_ + "/x/y/z/f", "f");
  WriteFile(src_ + "/x/y/g", "gg");
  ASSERT_EQ(symlink("/", (src_ + "/x/root").c_str()), 0);

  // A subdirectory: names relative to it.
  Result r = Extract(CreateArchive(src_fd_.get(), "x/y", &rng));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ListNames(dest_), (std::set<std::string>{"g", "z"}));
  EXPECT_EQ(ReadFile(D("z/f")), "f");

  // A single file: named by its last component. Absolute paths resolve beneath the root.
  r = Extract(CreateArchive(src_fd_.get(), "/x/y/z/f", &rng));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D("f")), "f");

  // A symlink is archived as a link, not followed (it points at the host root).
  const std::string archive = CreateArchive(src_fd_.get(), "x/root", &rng);
  EXPECT_EQ(archive.size(), 512u + 1024u);
  r = Extract(archive);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  char target[16] = {};
  ASSERT_EQ(readlink(D("root").c_str(), target, sizeof target), 1);
  EXPECT_STREQ(target, "/");

  // ".." cannot climb above the root; a missing path is NotFound.
  auto c = TarCreator::Open(src_fd_.get(), "../../..");
  ASSERT_TRUE(c.ok());
  auto missing = TarCreator::Open(src_fd_.get(), "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(TarCreator::Open(src_fd_.get(), "").status().code(), StatusCode::kInvalidArgument);
}

// owed() is what the archive still has to append for what was handed out: with it, a caller
// that bounds the archive sees a huge (sparse) file's size at its header, and the total it
// predicts is the archive's length.
TEST_F(TarTest, CreatorOwesWhatItsHeadersPromise) {
  WriteFile(src_ + "/small", "abc");
  const int fd = open((src_ + "/huge").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t{1} << 40), 0);  // 1 TB, sparse
  close(fd);
  auto c = TarCreator::Open(src_fd_.get(), "huge");
  ASSERT_TRUE(c.ok());
  std::string out;
  ASSERT_TRUE((*c)->Next(&out, 512).ok());  // the header
  EXPECT_EQ(out.size(), 512u);
  // Its data (a multiple of 512: no padding) and the rest of its headers (a pax size record).
  EXPECT_GE((*c)->owed(), uint64_t{1} << 40);
  EXPECT_LT((*c)->owed(), (uint64_t{1} << 40) + 4096);
  auto small = TarCreator::Open(src_fd_.get(), "small");
  ASSERT_TRUE(small.ok());
  out.clear();
  ASSERT_TRUE((*small)->Next(&out, 100).ok());      // part of the header
  EXPECT_EQ(out.size() + (*small)->owed(), 1024u);  // header + 3 bytes padded to 512
  for (auto more = (*small)->Next(&out, 1); more.ok() && *more;) more = (*small)->Next(&out, 7);
  EXPECT_EQ(out.size(), 1024u + 1024u);  // and the end marker
  EXPECT_EQ((*small)->owed(), 0u);
}

TEST_F(TarTest, CreatorSkipsSpecialFiles) {
  std::mt19937_64 rng(2);
  WriteFile(src_ + "/regular", "r");
  ASSERT_EQ(mkfifo((src_ + "/fifo").c_str(), 0644), 0);
  int expected_skips = 1;
  UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(sock);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock_path = src_ + "/sock";
  ASSERT_LT(sock_path.size(), sizeof addr.sun_path);
  memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ++expected_skips;
  if (mknod((src_ + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) ++expected_skips;
  ASSERT_EQ(symlink(outside_.c_str(), (src_ + "/out").c_str()), 0);

  uint64_t skipped = 0;
  Result r = Extract(CreateArchive(src_fd_.get(), ".", &rng, &skipped));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(skipped, static_cast<uint64_t>(expected_skips));
  EXPECT_EQ(ListNames(dest_), (std::set<std::string>{"out", "regular"}));
  struct stat st;
  ASSERT_EQ(lstat(D("out").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

// A tree planted thousands of levels deep is archived down to 1024 levels (or PATH_MAX bytes
// of path); the rest is skipped and counted, without holding an fd and a path per level.
TEST_F(TarTest, CreatorBoundsDepthAndPathLength) {
  std::mt19937_64 rng(3);
  UniqueFd cur(fcntl(src_fd_.get(), F_DUPFD_CLOEXEC, 0));
  for (int i = 0; i < 1100; ++i) {  // "d/d/d/...": 1100 levels, 2200 bytes of path
    ASSERT_EQ(mkdirat(cur.get(), "d", 0755), 0);
    cur.Reset(openat(cur.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(cur);
  }
  const std::string long_name(200, 'n');
  UniqueFd lng(fcntl(src_fd_.get(), F_DUPFD_CLOEXEC, 0));
  for (int i = 0; i < 25; ++i) {  // 25 x 201 bytes: past PATH_MAX at level 21
    ASSERT_EQ(mkdirat(lng.get(), long_name.c_str(), 0755), 0);
    lng.Reset(openat(lng.get(), long_name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(lng);
  }
  uint64_t skipped = 0;
  const std::string archive = CreateArchive(src_fd_.get(), ".", &rng, &skipped);
  EXPECT_EQ(skipped, 2u);  // the 1025th "d" and the 21st long name
  Result r = Extract(archive);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.stats.entries, 1024u + 20u);
  std::string deepest;
  for (int i = 0; i < 1024; ++i) deepest += "d/";
  struct stat st;
  EXPECT_EQ(stat(D(deepest).c_str(), &st), 0);
  EXPECT_NE(stat(D(deepest + "d").c_str(), &st), 0);
}

TEST_F(TarTest, CreatorDoesNotCrossMountPoints) {
  std::mt19937_64 rng(3);
  const std::string mnt = src_ + "/mnt";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  WriteFile(src_ + "/kept", "k");
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount tmpfs: " << strerror(errno);
  }
  auto unmount = MakeScopeGuard([&] { umount2(mnt.c_str(), MNT_DETACH); });
  WriteFile(mnt + "/on-other-fs", "x");
  uint64_t skipped = 0;
  Result r = Extract(CreateArchive(src_fd_.get(), ".", &rng, &skipped));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(skipped, 1u);
  EXPECT_EQ(ListNames(dest_), (std::set<std::string>{"kept"}));
}

TEST_F(TarTest, CreatorFileShrinksOrGrowsWhileRead) {
  WriteFile(src_ + "/f", std::string(100'000, 'A'));
  {
    auto c = TarCreator::Open(src_fd_.get(), ".");
    ASSERT_TRUE(c.ok());
    std::string out;
    auto more = (*c)->Next(&out, 512);  // the header: the file is open, its size recorded
    ASSERT_TRUE(more.ok() && *more);
    ASSERT_EQ(out.size(), 512u);
    ASSERT_EQ(truncate((src_ + "/f").c_str(), 1000), 0);
    while (true) {
      more = (*c)->Next(&out, 4096);
      ASSERT_TRUE(more.ok()) << more.status().ToString();
      if (!*more) break;
    }
    Result r = Extract(out);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(ReadFile(D("f")), std::string(1000, 'A') + std::string(99'000, '\0'));
  }
  WriteFile(src_ + "/f", std::string(1000, 'B'));
  {
    auto c = TarCreator::Open(src_fd_.get(), ".");
    ASSERT_TRUE(c.ok());
    std::string out;
    ASSERT_TRUE((*c)->Next(&out, 512).ok());
    WriteFile(src_ + "/f", std::string(5000, 'C'));  // rewritten and grown
    while (true) {
      auto more = (*c)->Next(&out, 100);
      ASSERT_TRUE(more.ok());
      if (!*more) break;
    }
    Result r = Extract(out);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(ReadFile(D("f")), std::string(1000, 'C'));
  }
}

// ---------------------------------------------------------------------------------------------
// Archives written by GNU tar.

class GnuTarTest : public TarTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(GnuTarTest, ExtractsToTheSameTree) {
  const std::string format = GetParam();
  const bool long_names = format == "pax" || format == "gnu";
  std::mt19937_64 rng(7);
  ASSERT_TRUE(MakeDirs(src_ + "/d1/d2/d3").ok());
  ASSERT_EQ(chmod((src_ + "/d1/d2").c_str(), 0700), 0);
  WriteFile(src_ + "/d1/d2/d3/file", RandomBytes(&rng, 200'000));
  WriteFile(src_ + "/empty", "");
  WriteFile(src_ + "/exe", "#!/bin/sh\n", 0755);
  WriteFile(src_ + "/hard1", "linked");
  ASSERT_EQ(link((src_ + "/hard1").c_str(), (src_ + "/d1/hard2").c_str()), 0);
  ASSERT_EQ(symlink("d1/d2/d3/file", (src_ + "/sym").c_str()), 0);
  if (long_names) {
    const std::string long_dir = src_ + "/" + std::string(120, 'D');
    ASSERT_EQ(mkdir(long_dir.c_str(), 0755), 0);
    WriteFile(long_dir + "/" + std::string(150, 'F'), "long");
    ASSERT_EQ(symlink((std::string(120, 'D') + "/" + std::string(150, 'F')).c_str(),
                      (src_ + "/longsym").c_str()),
              0);
    ASSERT_EQ(link((long_dir + "/" + std::string(150, 'F')).c_str(),
                   (long_dir + "/" + std::string(140, 'H')).c_str()),
              0);
  }
  const auto want = Snapshot(src_);

  const std::string cmd = "tar --format=" + format + " -C '" + src_ + "' -cf - .";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  TarExtractor x(dest_fd_.get(), Opts());
  Status s;
  std::vector<char> buf(1 << 16);
  while (true) {
    const size_t n = fread(buf.data(), 1, 1 + rng() % buf.size(), p);
    if (n == 0) break;
    s = x.Feed(std::string_view(buf.data(), n));
    if (!s.ok()) break;
  }
  while (fread(buf.data(), 1, buf.size(), p) > 0) {
  }
  ASSERT_EQ(pclose(p), 0);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = x.Finish();
  ASSERT_TRUE(s.ok()) << s.ToString();

  const auto got = Snapshot(dest_);
  ExpectSameTree(want, got);
  EXPECT_EQ(got.at("hard1").ino, got.at("d1/hard2").ino);
  EXPECT_EQ(x.stats().skipped, 0u);
  for (const auto& [name, node] : got) EXPECT_EQ(node.uid, kUid) << name;
}

INSTANTIATE_TEST_SUITE_P(Formats, GnuTarTest, ::testing::Values("pax", "gnu", "ustar", "v7"));

// PAX sparse format 1.0 (what GNU tar --sparse writes, and snapshots write for files with
// holes): the regions land at their offsets, the rest stays a hole, the real name and size
// apply; a GNU tar archive of a sparse file extracts to the same bytes with few blocks.
TEST_F(TarTest, SparseEntriesKeepHoles) {
  auto sparse = [](const std::string& real, uint64_t realsize, const std::string& map,
                   const std::string& data) {
    return Pax(PaxRecord("GNU.sparse.major", "1") + PaxRecord("GNU.sparse.minor", "0") +
               PaxRecord("GNU.sparse.name", real) +
               PaxRecord("GNU.sparse.realsize", std::to_string(realsize))) +
           File("d/GNUSparseFile.0/" + real, Pad(map) + data);
  };
  Result r = Extract(sparse("d/real", 1 << 30, "2\n4096\n5\n1048576\n3\n", "helloabc") +
                     sparse("d/tail", 1 << 20, "1\n0\n2\n", "hi") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  struct stat st;
  ASSERT_EQ(stat(D("d/real").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 30);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);
  EXPECT_FALSE(Exists(D("d/GNUSparseFile.0")));
  UniqueFd f(open(D("d/real").c_str(), O_RDONLY | O_CLOEXEC));
  char buf[8];
  ASSERT_EQ(pread(f.get(), buf, 5, 4096), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
  ASSERT_EQ(pread(f.get(), buf, 3, 1048576), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
  ASSERT_EQ(pread(f.get(), buf, 4, 0), 4);
  EXPECT_EQ(std::string(buf, 4), std::string(4, '\0'));
  ASSERT_EQ(stat(D("d/tail").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);  // ends in a hole: the real size, not the data's end

  // Malformed maps: each one refused.
  for (const auto& [map, data] : std::vector<std::pair<std::string, std::string>>{
           {"2\n100\n10\n50\n10\n", std::string(20, 'x')},  // out of order / overlapping
           {"1\n0\n10\n", std::string(5, 'x')},             // fewer bytes than the regions
           {"1\n0\n5\n", std::string(9, 'x')},              // more bytes than the regions
           {"1\n4000\n200\n", std::string(200, 'x')},       // past the real size
           {"9999999\n", ""},                               // more regions than allowed
           {"1\n0\nx\n", "x"}}) {                           // not a number
    r = Extract(sparse("bad", 4096, map, data) + End());
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << map;
  }
  // A sparse file counts at its real size against the extraction limit (its data is tiny).
  TarExtractOptions small = Opts();
  small.max_total_bytes = 1 << 20;
  r = Extract(sparse("huge", 1ull << 40, "1\n0\n2\n", "hi") + End(), small);
  EXPECT_EQ(r.status.code(), StatusCode::kTooLarge) << r.status.ToString();
  EXPECT_FALSE(Exists(D("huge")));
  r = Extract(
      sparse("a", 600 << 10, "1\n0\n2\n", "hi") + sparse("b", 600 << 10, "1\n0\n2\n", "hi") + End(),
      small);
  EXPECT_EQ(r.status.code(), StatusCode::kTooLarge) << "two together pass the limit";
  // Non-NUL padding after the map text.
  std::string map = "1\n0\n1\n";
  std::string padded = map + std::string(512 - map.size(), 'P');
  r = Extract(Pax(PaxRecord("GNU.sparse.major", "1") + PaxRecord("GNU.sparse.minor", "0") +
                  PaxRecord("GNU.sparse.name", "pad") + PaxRecord("GNU.sparse.realsize", "10")) +
              File("x", padded + "z") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);

  // GNU tar's own sparse archive.
  ASSERT_EQ(system(("truncate -s 64M '" + src_ + "/big' && printf deep | dd of='" + src_ +
                    "/big' bs=1 seek=40000000 conv=notrunc status=none && tar --format=posix "
                    "--sparse -C '" +
                    src_ + "' -cf '" + src_ + "/gnu.tar' big")
                       .c_str()),
            0);
  auto gnu = ReadFileToString(src_ + "/gnu.tar", 1 << 20);
  ASSERT_TRUE(gnu.ok()) << gnu.status().ToString();
  r = Extract(*gnu);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(stat(D("big").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 64 << 20);
  EXPECT_LT(st.st_blocks * 512, 1 << 20);
  UniqueFd g(open(D("big").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(pread(g.get(), buf, 4, 40000000), 4);
  EXPECT_EQ(std::string(buf, 4), "deep");
}

// ---------------------------------------------------------------------------------------------
// Hostile archives.

TEST_F(TarTest, DotDotComponentsRejected) {
  for (const std::string name : {"../evil", "a/../../x", "a/b/../c", "./../evil", "/../evil"}) {
    Result r = Extract(File(name, "evil") + End());
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(r.status.message().find('"' + name + '"'), std::string::npos) << r.status.message();
  }
  // Also in a GNU long name, a pax path, a directory and a symlink name.
  EXPECT_EQ(Extract(GnuLong('L', "../evil") + File("x", "e") + End()).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(Pax(PaxRecord("path", "d/../../evil")) + File("x", "e") + End()).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(Dir("../evil/")).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(Symlink("../evil", "x")).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListNames(dest_), std::set<std::string>{});
  EXPECT_FALSE(Exists(base_->path() + "/evil"));
  EXPECT_FALSE(Exists(base_->path() + "/x"));
}

TEST_F(TarTest, NulInNameRejected) {
  std::string name = "a";
  name += '\0';
  name += "b";
  Result r = Extract(Pax(PaxRecord("path", name)) + File("x", "e") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("NUL"), std::string::npos) << r.status.message();
  r = Extract(GnuLong('L', name) + File("x", "e") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ListNames(dest_), std::set<std::string>{});
}

TEST_F(TarTest, AbsoluteAndDotPathsLandUnderDest) {
  const std::string host_dir = "/dsec-tar-test-abs-" + std::to_string(getpid());
  ASSERT_FALSE(Exists(host_dir));
  Result r = Extract(File(host_dir + "/path", "abs") + File("./dot/./x", "dot") +
                     File("//twice", "2") + Dir("./") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D(host_dir.substr(1) + "/path")), "abs");
  EXPECT_EQ(ReadFile(D("dot/x")), "dot");
  EXPECT_EQ(ReadFile(D("twice")), "2");
  EXPECT_FALSE(Exists(host_dir));
  // Missing parents were created 0755 and owned by uid/gid; the root was left alone.
  struct stat st;
  ASSERT_EQ(stat(D("dot").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(st.st_uid, kUid);
  ASSERT_EQ(stat(dest_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
}

// Missing parents below an existing prefix that goes through a symlink (resolved clamped to
// dest) are created where the link leads; deep distinct paths are created level by level.
TEST_F(TarTest, MissingParentsBelowLinksAndDeepPaths) {
  std::string deep;
  for (int i = 0; i < 600; ++i) deep += "q/";
  Result r =
      Extract(Dir("a/b") + Symlink("a/l", "/a/b") + File("a/l/c/d/e/f", "via link") +
              File("a/l/c/g", "beside") + Pax(PaxRecord("path", deep + "f")) + File("x", "deep") +
              Pax(PaxRecord("path", "z/" + deep + "f")) + File("x", "deep2") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D("a/b/c/d/e/f")), "via link");
  EXPECT_EQ(ReadFile(D("a/b/c/g")), "beside");
  EXPECT_EQ(ReadFile(D(deep + "f")), "deep");
  EXPECT_EQ(ReadFile(D("z/" + deep + "f")), "deep2");
  struct stat st;
  ASSERT_EQ(stat(D("a/b/c/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_EQ(st.st_uid, kUid);
  EXPECT_EQ(ListNames(D("a")), (std::set<std::string>{"b", "l"}));
}

TEST_F(TarTest, SymlinkToRootCannotEscape) {
  const std::string host_name = "dsec-tar-test-" + std::to_string(getpid());
  ASSERT_FALSE(Exists("/etc/" + host_name));
  // l -> / then l/etc/x lands at dest/etc/x; l/<outside>/file2 at dest/<outside>/file2; with
  // that directory now present in dest, m -> <absolute outside> then m/file lands beside it.
  Result r = Extract(Symlink("l", "/") + File("l/etc/" + host_name, "pwned") +
                     File("l" + outside_ + "/file2", "pwned") + Symlink("m", outside_) +
                     File("m/file", "pwned") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_FALSE(Exists("/etc/" + host_name));
  EXPECT_EQ(ReadFile(D("etc/" + host_name)), "pwned");
  EXPECT_EQ(ReadFile(D(outside_.substr(1) + "/file")), "pwned");
  EXPECT_EQ(ReadFile(D(outside_.substr(1) + "/file2")), "pwned");
  // Through a symlink whose target does not exist inside dest: rejected, nothing created.
  r = Extract(Symlink("n", base_->path() + "/elsewhere") + File("n/file", "pwned") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kNotFound) << r.status.ToString();
  EXPECT_NE(r.status.message().find("n/file"), std::string::npos) << r.status.message();
}

TEST_F(TarTest, RelativeSymlinkCannotEscape) {
  // dest/outside does not exist yet: the entry is rejected (never written to the real one).
  Result r = Extract(Symlink("l", "../outside") + File("l/file", "pwned") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kNotFound) << r.status.ToString();
  // Once it exists, ".." clamps at dest and the writes land in dest/outside.
  r = Extract(Dir("outside/") + File("l/file", "pwned") + Dir("sub/") +
              Symlink("sub/deep", "../../../../outside") + File("sub/deep/file2", "pwned") +
              Symlink("sub/back", "..") + File("sub/back/file3", "x") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D("outside/file")), "pwned");
  EXPECT_EQ(ReadFile(D("outside/file2")), "pwned");
  EXPECT_EQ(ReadFile(D("file3")), "x");
}

TEST_F(TarTest, PlantedLinksAreReplacedNotFollowed) {
  // Hostile sandbox code planted these before extraction.
  ASSERT_EQ(symlink(outside_.c_str(), D("p").c_str()), 0);
  ASSERT_EQ(symlink((outside_ + "/secret").c_str(), D("q").c_str()), 0);
  ASSERT_EQ(symlink("../outside/secret", D("q2").c_str()), 0);
  ASSERT_EQ(link((outside_ + "/secret").c_str(), D("h").c_str()), 0);
  ASSERT_EQ(symlink(outside_.c_str(), D("d").c_str()), 0);
  ASSERT_EQ(symlink(outside_.c_str(), D("s").c_str()), 0);
  // p/file fails while dest/<outside> does not exist, then lands there.
  Result r = Extract(File("p/file", "via p") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kNotFound) << r.status.ToString();
  r = Extract(Dir(outside_ + "/") + File("p/file", "via p") + File("q", "new q") +
              File("q2", "new q2") + File("h", "new h") + Dir("d/") + File("d/x", "in d") +
              Symlink("s", "t") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D(outside_.substr(1) + "/file")), "via p");
  for (const std::string n : {"q", "q2", "h"}) {
    struct stat st;
    ASSERT_EQ(lstat(D(n).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << n;
    EXPECT_EQ(st.st_nlink, 1u) << n;
    EXPECT_EQ(ReadFile(D(n)), "new " + n);
  }
  struct stat st;
  ASSERT_EQ(lstat(D("d").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(ReadFile(D("d/x")), "in d");
  char target[8] = {};
  EXPECT_EQ(readlink(D("s").c_str(), target, sizeof target), 1);
  // TearDown checks outside/secret still says "secret" with one link.
}

TEST_F(TarTest, HardLinks) {
  Result r = Extract(File("f", "data") + HardLink("h", "f") + HardLink("/h2", "/f") +
                     HardLink("f", "f") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  struct stat a, b;
  ASSERT_EQ(stat(D("f").c_str(), &a), 0);
  ASSERT_EQ(stat(D("h").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_nlink, 3u);

  struct Case {
    std::string archive;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {HardLink("x", "../outside/secret"), StatusCode::kInvalidArgument},
      {HardLink("x", "/etc/passwd"), StatusCode::kNotFound},  // resolves to dest/etc/passwd
      {HardLink("x", outside_ + "/secret"), StatusCode::kNotFound},
      {Symlink("s", outside_) + HardLink("x", "s/secret"), StatusCode::kNotFound},
      {Symlink("s2", "../outside") + HardLink("x", "s2/secret"), StatusCode::kNotFound},
      {Symlink("sl", outside_ + "/secret") + HardLink("x", "sl"), StatusCode::kInvalidArgument},
      {Dir("dir/") + HardLink("x", "dir"), StatusCode::kInvalidArgument},
      {HardLink("x", "missing"), StatusCode::kNotFound},
      {HardLink("x", ""), StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    r = Extract(c.archive + End());
    EXPECT_EQ(r.status.code(), c.code) << r.status.ToString();
    EXPECT_NE(r.status.message().find("\"x\""), std::string::npos) << r.status.message();
    EXPECT_FALSE(Exists(D("x")));
  }
}

TEST_F(TarTest, DevicesFifosAndUnknownTypesSkipped) {
  Result r =
      Extract(Header({.name = "chr", .type = '3'}) + Header({.name = "blk", .type = '4'}) +
              Header({.name = "fifo", .type = '6'}) + File("unknown", "skipped data") + End());
  ASSERT_TRUE(r.status.ok());
  // Rewrite the typeflag of "unknown" to a vendor type; its data must be skipped cleanly.
  std::string unknown = Header({.name = "vendor", .type = 'Z', .size = 700}) +
                        Pad(std::string(700, 'z')) + File("after", "ok") + End();
  r = Extract(Header({.name = "chr", .type = '3'}) + Header({.name = "blk", .type = '4'}) +
              Header({.name = "fifo", .type = '6'}) + unknown);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.stats.skipped, 4u);
  EXPECT_EQ(r.stats.entries, 1u);
  EXPECT_FALSE(Exists(D("chr")));
  EXPECT_FALSE(Exists(D("blk")));
  EXPECT_FALSE(Exists(D("fifo")));
  EXPECT_FALSE(Exists(D("vendor")));
  EXPECT_EQ(ReadFile(D("after")), "ok");
}

TEST_F(TarTest, ModesStrippedAndOwnership) {
  ASSERT_EQ(mkdir(D("existing").c_str(), 0711), 0);
  Result r =
      Extract(File("suid", "x", 04755) + File("sgid", "x", 02775) + Dir("sticky/", 01777) +
              File("ro", "x", 0400) + Dir("existing/", 0777) + Symlink("sym", "suid") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  auto mode = [&](const std::string& n) {
    struct stat st;
    EXPECT_EQ(lstat(D(n).c_str(), &st), 0);
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode("suid"), 0755u);
  EXPECT_EQ(mode("sgid"), 0775u);
  EXPECT_EQ(mode("sticky"), 0777u);
  EXPECT_EQ(mode("ro"), 0400u);
  EXPECT_EQ(mode("existing"), 0711u);  // existing directories are left as they are
  for (const std::string n : {"suid", "sgid", "sticky", "ro", "sym"}) {
    struct stat st;
    ASSERT_EQ(lstat(D(n).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kUid) << n;
    EXPECT_EQ(st.st_gid, kGid) << n;
  }
  struct stat st;
  ASSERT_EQ(lstat(D("existing").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(lstat(D("suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mtime, 1700000000);
}

TEST_F(TarTest, SizeLimits) {
  // A base-256 size of 2^40 fails on the header alone, before anything is created.
  {
    TarExtractor x(dest_fd_.get(), Opts());
    Status s = x.Feed(Header({.name = "bomb", .size = 1ull << 40, .base256_size = true}));
    EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.ToString();
    EXPECT_NE(s.message().find("bomb"), std::string::npos);
    EXPECT_EQ(x.Feed(std::string(512, 'x')).code(), StatusCode::kTooLarge);  // sticky
    EXPECT_EQ(x.Finish().code(), StatusCode::kTooLarge);
    EXPECT_FALSE(Exists(D("bomb")));
  }
  // Octal 077777777777 (8 GiB) > the 4 GiB default.
  Result r = Extract(Header({.name = "dir/big", .size = 077777777777ull}));
  EXPECT_EQ(r.status.code(), StatusCode::kTooLarge);
  EXPECT_FALSE(Exists(D("dir")));
  // The limit is on the sum of file sizes.
  TarExtractOptions o = Opts();
  o.max_total_bytes = 1000;
  r = Extract(File("one", std::string(600, '1')) + File("two", std::string(600, '2')) + End(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kTooLarge);
  EXPECT_EQ(ReadFile(D("one")), std::string(600, '1'));
  EXPECT_FALSE(Exists(D("two")));
  // Entry count.
  o = Opts();
  o.max_entries = 2;
  r = Extract(File("e1", "") + File("e2", "") + File("e3", "") + End(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kTooLarge);
  EXPECT_FALSE(Exists(D("e3")));
  // A negative base-256 size is garbage.
  std::string neg = Header({.name = "neg"});
  memset(neg.data() + 124, 0xff, 12);
  FixChecksum(&neg);
  EXPECT_EQ(Extract(neg + End()).status.code(), StatusCode::kInvalidArgument);
}

TEST_F(TarTest, BadChecksumAndGarbage) {
  std::string h = File("f", "data");
  h[0] = 'g';  // name changed, checksum not
  Result r = Extract(h + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("checksum"), std::string::npos);
  EXPECT_FALSE(Exists(D("g")));
  EXPECT_EQ(Extract(Pad("this is not a tar archive")).status.code(), StatusCode::kInvalidArgument);
  // What is no tar at all says so (not "truncated inside a header at offset 3").
  for (const std::string& junk : {std::string("abc"), Pad("this is not a tar archive"),
                                  std::string(2000, 'x'), std::string()}) {
    Result j = Extract(junk);
    EXPECT_EQ(j.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(j.status.message().find("not a tar archive"), std::string::npos)
        << junk.size() << ": " << j.status.message();
  }
  EXPECT_NE(Extract("abc").status.message().find("3 bytes"), std::string::npos);
  // A real archive cut short is still "truncated".
  std::string cut = File("f", "data") + End();
  Result t = Extract(cut.substr(0, 512 + 100));
  EXPECT_NE(t.status.message().find("truncated"), std::string::npos) << t.status.message();
  // Valid checksum, bad magic / bad numeric field.
  std::string m = Header({.name = "m"});
  memcpy(m.data() + 257, "junk!!", 6);
  FixChecksum(&m);
  EXPECT_EQ(Extract(m + End()).status.code(), StatusCode::kInvalidArgument);
  std::string n = Header({.name = "n"});
  memcpy(n.data() + 124, "12345678x01", 11);
  FixChecksum(&n);
  EXPECT_EQ(Extract(n + End()).status.code(), StatusCode::kInvalidArgument);
}

TEST_F(TarTest, TruncatedArchives) {
  const std::string full = File("f", std::string(1000, 'x')) + End();
  struct Case {
    std::string data;
    const char* what;
  };
  const std::vector<Case> cases = {
      {full.substr(0, 512 + 500), "mid data"},
      {full.substr(0, 512 + 1000), "mid padding"},
      {full.substr(0, 100), "mid header"},
      {full.substr(0, 512 + 1024), "no end marker"},
      {Pax(PaxRecord("path", "long")), "after pax header"},
      {GnuLong('L', "long"), "after GNU long name"},
      {"", "empty"},
  };
  for (const Case& c : cases) {
    TarExtractor x(dest_fd_.get(), Opts());
    EXPECT_TRUE(x.Feed(c.data).ok()) << c.what;
    Status s = x.Finish();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what << ": " << s.ToString();
  }
  // Without require_end_marker, a stream cut at an entry boundary is accepted.
  TarExtractOptions o = Opts();
  o.require_end_marker = false;
  EXPECT_TRUE(Extract(full.substr(0, 512 + 1024), o).status.ok());
  // A single trailing zero block is accepted (GNU tar does too).
  EXPECT_TRUE(Extract(full.substr(0, 512 + 1024 + 512)).status.ok());
  // A pax record cut short inside its own data.
  std::string rec = PaxRecord("path", "abcdef");
  std::string bad = Header({.name = "p", .type = 'x', .size = rec.size() - 3}) +
                    Pad(rec.substr(0, rec.size() - 3)) + File("x", "") + End();
  EXPECT_EQ(Extract(bad).status.code(), StatusCode::kInvalidArgument);
}

TEST_F(TarTest, EndMarker) {
  // Anything after two zero blocks is ignored.
  Result r = Extract(File("a", "a") + End() + File("b", "b") + "trailing garbage");
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(Exists(D("a")));
  EXPECT_FALSE(Exists(D("b")));
  // A lone zero block followed by another header is not an archive we accept.
  r = Extract(File("c", "c") + std::string(512, '\0') + File("d", "d") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(D("d")));
}

TEST_F(TarTest, PaxAndGnuExtensions) {
  const std::string long_name = std::string(150, 'a') + "/" + std::string(150, 'b');
  const std::string big_xattr(100'000, 'v');  // unknown key, larger than the kept-value bound
  Result r =
      Extract(Pax(PaxRecord("path", long_name) + PaxRecord("mtime", "1234567890.123456") +
                  PaxRecord("SCHILY.xattr.user.big", big_xattr)) +
              File("ignored-header-name", "pax path") + Pax(PaxRecord("path", "g-ignored"), 'g') +
              Pax(PaxRecord("linkpath", std::string(200, 't'))) + Symlink("sym", "short") +
              Pax(PaxRecord("size", "5")) + Header({.name = "sized", .size = 0}) + Pad("12345") +
              Pax(PaxRecord("path", "")) + File("empty-pax-path", "e") +
              GnuLong('L', std::string(150, 'L') + "/" + std::string(140, 'M')) +
              File("gnu-ignored", "gnu long") + GnuLong('K', std::string(120, 'K')) +
              GnuLong('L', "gnu-sym") + Symlink("x", "y") +
              Header({.name = "v7file", .size = 2, .magic = Magic::kV7}) + Pad("v7") +
              Header({.name = "v7dir/", .type = '\0', .magic = Magic::kV7}) +
              Header({.name = std::string(100, 'n'), .size = 6, .prefix = "ustar-prefix"}) +
              Pad("prefix") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(ReadFile(D(long_name)), "pax path");
  struct stat st;
  ASSERT_EQ(stat(D(long_name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mtime, 1234567890);
  EXPECT_FALSE(Exists(D("ignored-header-name")));
  EXPECT_FALSE(Exists(D("g-ignored")));
  char target[512] = {};
  ASSERT_EQ(readlink(D("sym").c_str(), target, sizeof target), 200);
  EXPECT_EQ(std::string(target), std::string(200, 't'));
  EXPECT_EQ(ReadFile(D("sized")), "12345");
  EXPECT_EQ(ReadFile(D("empty-pax-path")), "e");
  EXPECT_EQ(ReadFile(D(std::string(150, 'L') + "/" + std::string(140, 'M'))), "gnu long");
  memset(target, 0, sizeof target);
  ASSERT_EQ(readlink(D("gnu-sym").c_str(), target, sizeof target), 120);
  EXPECT_EQ(ReadFile(D("v7file")), "v7");
  ASSERT_EQ(lstat(D("v7dir").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(ReadFile(D("ustar-prefix/" + std::string(100, 'n'))), "prefix");

  // Bounds and malformed records.
  EXPECT_EQ(Extract(Pax(PaxRecord("path", std::string(70'000, 'p'))) + File("x", "") + End())
                .status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(GnuLong('L', std::string(70'000, 'p')) + File("x", "") + End()).status.code(),
            StatusCode::kInvalidArgument);
  for (const std::string bad : {"5 path=x\n", "x path=abc\n", "99 path=abc\n", "11 path=abc?",
                                "7 =abc\n", "12 size=abc\n", "13 mtime=1x2\n"}) {
    r = Extract(Pax(bad) + File("x", "") + End());
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(Exists(D("x")));
  // pax GNU sparse entries are not supported: skipped, data consumed.
  r = Extract(Pax(PaxRecord("GNU.sparse.major", "1")) + File("sparse", "map+data") +
              File("after", "a") + End());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.stats.skipped, 1u);
  EXPECT_FALSE(Exists(D("sparse")));
}

TEST_F(TarTest, ReplacesExistingEntries) {
  ASSERT_TRUE(MakeDirs(D("dir/sub")).ok());
  WriteFile(D("file"), "old");
  Result r = Extract(File("file", "new") + Symlink("file2", "file") + Symlink("file2", "dir") +
                     File("dir", "not a dir") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition) << r.status.ToString();
  EXPECT_EQ(ReadFile(D("file")), "new");
  char target[8] = {};
  EXPECT_EQ(readlink(D("file2").c_str(), target, sizeof target), 3);
  EXPECT_STREQ(target, "dir");
  // A regular file where a parent directory is expected.
  r = Extract(File("file/child", "x") + End());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();  // ENOTDIR
  // Symlink loops fail cleanly.
  r = Extract(Symlink("loop", "loop") + File("loop/x", "x") + End());
  EXPECT_FALSE(r.status.ok());
}

// ---------------------------------------------------------------------------------------------
// Random input: never a crash, never a write outside dest (TearDown checks `outside`).

TEST_F(TarTest, RandomBlobsDoNotCrash) {
  std::mt19937_64 rng(12345);
  // Names are unique so that even a broken extractor could not clobber host files; the host
  // root and /etc are checked for them at the end.
  const std::string u = "dsec-fuzz-" + std::to_string(getpid()) + "-";
  const std::string valid = File(u + "a/" + u + "b", "hello") + Symlink(u + "l", "/") +
                            Dir(u + "d/") + Pax(PaxRecord("path", u + "p/" + u + "q")) +
                            File(u + "x", "pax") + GnuLong('L', u + "long") + File(u + "y", "gnu") +
                            HardLink(u + "h", u + "a/" + u + "b") + End();
  const std::vector<std::string> components = {
      u + "a", u + "b", u + "l", u + "m", ".", "..", "", u + "d", "etc", outside_.substr(1),
      u + "x"};
  const std::vector<std::string> targets = {
      "/",     "..",       "../outside",         outside_,           u + "a", u + "l/" + u + "a",
      u + "l", "../../..", outside_ + "/secret", u + "a/" + u + "b", ""};
  const std::string types("0125346xgLK7SZ\0", 15);
  TarExtractOptions opts = Opts();
  opts.max_total_bytes = 1 << 20;
  int ok_archives = 0;
  uint64_t entries = 0;
  for (int iter = 0; iter < 10'000; ++iter) {
    std::string blob;
    const int mode = iter % 4;
    if (mode == 0) {  // pure noise
      blob = RandomBytes(&rng, rng() % 3000);
    } else if (mode == 1 || mode == 2) {  // a valid archive with a few bytes flipped
      blob = valid;
      for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; ++i) {
        blob[rng() % blob.size()] = static_cast<char>(rng());
      }
      if (mode == 2) {  // ... and some header checksums repaired, to get past them
        for (size_t off = 0; off + 512 <= blob.size(); off += 512) {
          std::string block = blob.substr(off, 512);
          if (block == std::string(512, '\0') || rng() % 2) continue;
          FixChecksum(&block);
          blob.replace(off, 512, block);
        }
      }
    } else {  // headers with valid checksums and random fields, names and link targets
      for (int e = 0, n = 1 + static_cast<int>(rng() % 6); e < n; ++e) {
        std::string name;
        for (int c = 0, k = 1 + static_cast<int>(rng() % 4); c < k; ++c) {
          if (c) name += '/';
          name += components[rng() % components.size()];
        }
        Hdr h{.name = name,
              .type = types[rng() % types.size()],
              .size = rng() % 3 ? rng() % 1200 : rng(),
              .mode = static_cast<unsigned>(rng() % 010000),
              .link = targets[rng() % targets.size()],
              .magic = static_cast<Magic>(rng() % 3),
              .base256_size = rng() % 8 == 0};
        std::string data;
        if (h.type == 'x' || h.type == 'g') {
          data = PaxRecord(rng() % 2 ? "path" : "linkpath", name);
          if (rng() % 4 == 0) data = RandomBytes(&rng, rng() % 64);
          h.size = data.size();
        } else {
          data = RandomBytes(&rng, std::min<uint64_t>(h.size, rng() % 1300));
        }
        blob += Header(h) + Pad(data);
      }
      if (rng() % 2) blob += End();
    }
    TarExtractor x(dest_fd_.get(), opts);
    std::string_view rest = blob;
    Status s;
    while (!rest.empty() && s.ok()) {
      const size_t n = std::min<size_t>(rest.size(), 1 + rng() % 1024);
      s = x.Feed(rest.substr(0, n));
      rest.remove_prefix(n);
    }
    if (s.ok()) s = x.Finish();
    EXPECT_LE(x.stats().bytes, opts.max_total_bytes);
    if (s.ok()) ++ok_archives;
    entries += x.stats().entries;
    if (iter % 500 == 0) {  // start over now and then so the tree stays small
      ASSERT_TRUE(RemoveTree(dest_).ok());
      ASSERT_EQ(mkdir(dest_.c_str(), 0755), 0);
      dest_fd_.Reset(open(dest_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      ASSERT_TRUE(dest_fd_);
    }
  }
  // The fuzzer gets deep: many inputs are accepted and create entries.
  EXPECT_GT(ok_archives, 300);
  EXPECT_GT(entries, 2000u);
  for (const std::string dir : {"/", "/etc/"}) {
    for (const std::string& n : ListNames(dir)) EXPECT_FALSE(StartsWith(n, u)) << dir << n;
  }
}

// ---------------------------------------------------------------------------------------------
// Image layers (TarExtractOptions::image_layer).

TarExtractOptions LayerOpts() {
  TarExtractOptions o;
  o.uid = 0;
  o.gid = 0;
  o.image_layer = true;
  return o;
}

TEST_F(TarTest, ImageLayerKeepsOwnersAndModes) {
  std::string a =
      Header({.name = "./", .type = '5', .mode = 0755}) +
      Header({.name = "etc/", .type = '5', .mode = 0750, .uid = 0, .gid = 42}) +
      Header({.name = "bin/su", .type = '0', .size = 3, .mode = 04755}) + Pad("abc") +
      Header({.name = "home/u/f", .type = '0', .size = 1, .mode = 0600, .uid = 1000, .gid = 1000}) +
      Pad("x") + Header({.name = "tmp/", .type = '5', .mode = 01777}) +
      HardLink("bin/su2", "bin/su") + Symlink("lib", "/usr/lib") +
      Header({.name = "etc/.wh.shadow", .type = '0'}) + End();
  auto r = Extract(a, LayerOpts());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  struct stat st;
  ASSERT_EQ(stat(D("bin/su").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04755u);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(stat(D("etc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_gid, 42u);
  ASSERT_EQ(stat(D("home/u/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  ASSERT_EQ(stat(D("tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  // Whiteouts are not the archive module's: without a hook, ".wh.NAME" is a file like any.
  EXPECT_EQ(ListNames(D("etc")), (std::set<std::string>{".wh.shadow"}));
}

// Records what a caller's hook is asked and given (images/oci_whiteouts.h is the real one).
struct RecordingHook : EntryHook {
  bool Claims(std::string_view name) const override { return name.rfind("@", 0) == 0; }
  Status Apply(int parent, const std::string& name, bool is_dir) override {
    if (name == "@fail") return InvalidArgument("refused by the hook");
    struct stat st;
    if (fstat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) return InternalError("bad parent fd");
    calls.push_back(name + (is_dir ? "/" : ""));
    // What the hook makes lands in the entry's parent.
    int fd =
        openat(parent, ("made-" + name.substr(1)).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("create");
    close(fd);
    return OkStatus();
  }
  std::vector<std::string> calls;
};

TEST_F(TarTest, HookClaimedEntriesAreTheHooksAndTheirDataIsSkipped) {
  RecordingHook hook;
  TarExtractOptions o = Opts();
  o.hook = &hook;
  const std::string odd = "not a header, whatever the hook's entry type says";
  auto r = Extract(File("a/b/@x", "data that must not land anywhere") + File("a/keep", "k") +
                       Header({.name = "c/@d/", .type = '5'}) +
                       Header({.name = "c/@v", .type = 'V', .size = odd.size()}) + Pad(odd) +
                       File("after", "y") + End(),
                   o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(hook.calls, (std::vector<std::string>{"@x", "@d/", "@v"}));
  EXPECT_EQ(ListNames(D("a/b")), (std::set<std::string>{"made-x"}));
  EXPECT_EQ(ListNames(D("c")), (std::set<std::string>{"made-d", "made-v"}));
  EXPECT_EQ(ReadFileToString(D("after")).value(), "y");  // the skipped data did not shift it
  EXPECT_EQ(r.stats.entries, 5u);  // the five entries (parents made on the way do not count)

  auto bad = Extract(File("z/@fail", "q") + End(), o);
  ASSERT_FALSE(bad.status.ok());
  EXPECT_NE(bad.status.message().find("tar entry \"z/@fail\": refused by the hook"),
            std::string::npos)
      << bad.status.ToString();
}

TEST_F(TarTest, ImageLayerRejectsDevicesAndWritesThroughSymlinks) {
  EXPECT_EQ(Extract(Header({.name = "dev/sda", .type = '4'}) + End(), LayerOpts()).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(Header({.name = "fifo", .type = '6'}) + End(), LayerOpts()).status.code(),
            StatusCode::kInvalidArgument);
  // A symlink in the parent path is not followed, not even inside the layer.
  auto r = Extract(Symlink("evil", "/") + File("evil/etc/passwd", "x") + End(), LayerOpts());
  EXPECT_FALSE(r.status.ok());
  EXPECT_FALSE(std::filesystem::exists(D("etc/passwd")));
  EXPECT_FALSE(Extract(File("../up", "x") + End(), LayerOpts()).status.ok());
}

TEST_F(TarTest, ImageLayerSkipsDevNodesOnlyUnderDevWhenAsked) {
  TarExtractOptions o = LayerOpts();
  o.skip_dev_nodes = true;
  auto r = Extract(Header({.name = "./dev/", .type = '5', .mode = 0755}) +
                       Header({.name = "./dev/null", .type = '3'}) +
                       Header({.name = "dev/fifo", .type = '6'}) + File("etc/x", "x") + End(),
                   o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.stats.skipped, 2u);
  EXPECT_TRUE(ListNames(D("dev")).empty());
  EXPECT_TRUE(std::filesystem::exists(D("etc/x")));
  // Anywhere else (or /dev itself as a device) it is still refused.
  EXPECT_EQ(Extract(Header({.name = "etc/sda", .type = '4'}) + End(), o).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Extract(Header({.name = "dev", .type = '3'}) + End(), o).status.code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsec::archive
