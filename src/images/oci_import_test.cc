// The importers against images made by independent tools: umoci builds a multi-layer OCI
// layout (its own whiteouts), python's tarfile adds hand-made layers (opaque directories,
// hostile entries) and `docker save` archives, and the imported layers, stacked as a read-only
// overlay in a private mount namespace, must present exactly the tree `umoci unpack` makes.
// Root only (whiteouts, owners, overlay mounts); skipped without root or umoci.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/file_util.h"
#include "images/import.h"
#include "images/store.h"
#include "sys/syscalls.h"

namespace dsec::images {
namespace {

// Rewrites OCI layouts (rehashing blobs, configs, manifests and index.json as it goes) and
// writes hand-made layer tars and `docker save` archives.
constexpr char kOciTool[] = R"PY(
import gzip, hashlib, io, json, os, subprocess, sys, tarfile

def sha(b): return hashlib.sha256(b).hexdigest()
def blob_path(L, d): return os.path.join(L, 'blobs', 'sha256', d.split(':', 1)[1])
def put(L, b):
    open(blob_path(L, 'sha256:' + sha(b)), 'wb').write(b)
    return 'sha256:' + sha(b)

def load(L, tag):
    idx = json.load(open(os.path.join(L, 'index.json')))
    d = [d for d in idx['manifests']
         if d.get('annotations', {}).get('org.opencontainers.image.ref.name') == tag][0]
    m = json.loads(open(blob_path(L, d['digest']), 'rb').read())
    c = json.loads(open(blob_path(L, m['config']['digest']), 'rb').read())
    return idx, d, m, c

def save(L, idx, d, m, c):
    if isinstance(m.get('config'), dict) and c is not None:
        cb = json.dumps(c).encode()
        m['config'].update(digest=put(L, cb), size=len(cb))
    mb = json.dumps(m).encode()
    d.update(digest=put(L, mb), size=len(mb))
    open(os.path.join(L, 'index.json'), 'w').write(json.dumps(idx))

def compress(raw, comp):
    if comp == 'gzip': return gzip.compress(raw, mtime=0), '.tar+gzip'
    if comp == 'zstd':
        return subprocess.run(['zstd', '-q', '-c'], input=raw, stdout=subprocess.PIPE,
                              check=True).stdout, '.tar+zstd'
    return raw, '.tar'

def decompress(b):
    if b[:2] == b'\x1f\x8b': return gzip.decompress(b)
    if b[:4] == b'\x28\xb5\x2f\xfd':
        return subprocess.run(['zstd', '-q', '-d', '-c'], input=b, stdout=subprocess.PIPE,
                              check=True).stdout
    return b

MT = 'application/vnd.oci.image.layer.v1'

def addlayer(L, tag, tar, comp):  # appends a layer (an uncompressed tar file)
    idx, d, m, c = load(L, tag)
    raw = open(tar, 'rb').read()
    b, suffix = compress(raw, comp)
    m['layers'].append({'mediaType': MT + suffix, 'digest': put(L, b), 'size': len(b)})
    c['rootfs']['diff_ids'].append('sha256:' + sha(raw))
    c.setdefault('history', []).append({'created_by': 'oci_import_test'})
    save(L, idx, d, m, c)

def recompress(L, tag, comp):  # every layer blob in another compression
    idx, d, m, c = load(L, tag)
    for l in m['layers']:
        b, suffix = compress(decompress(open(blob_path(L, l['digest']), 'rb').read()), comp)
        l.update(mediaType=MT + suffix, digest=put(L, b), size=len(b))
    save(L, idx, d, m, c)

def edit(L, tag, code):  # runs code on the manifest m and config c (None: kept); rehashes
    idx, d, m, c = load(L, tag)
    ns = dict(m=m, c=c)
    exec(code, globals(), ns)
    save(L, idx, d, ns['m'], ns['c'])

def editindex(L, code):  # runs code on index.json's idx, after every rehash
    idx = json.load(open(os.path.join(L, 'index.json')))
    exec(code)
    open(os.path.join(L, 'index.json'), 'w').write(json.dumps(idx))

def corrupt(L, tag, what):  # other bytes, still well-formed, under the blob's old name
    idx, d, m, c = load(L, tag)
    digest = {'layer': m['layers'][0]['digest'], 'config': m['config']['digest'],
              'manifest': d['digest']}[what]
    b = open(blob_path(L, digest), 'rb').read()
    if what == 'layer':  # the same tar (diff_id) compressed otherwise
        b = gzip.compress(gzip.decompress(b), compresslevel=1, mtime=12345)
    else:
        b = b.replace(b'/w', b'/z', 1).replace(b'{', b'{ ', 1)
    open(blob_path(L, digest), 'wb').write(b)

def show(L, tag, out):
    idx, d, m, c = load(L, tag)
    json.dump(c, open(out, 'w'))

def dockersave(L, tag, out, code=''):  # a `docker save` archive (Docker before 25)
    idx, d, m, c = load(L, tag)
    cb = open(blob_path(L, m['config']['digest']), 'rb').read()
    files = {sha(cb) + '.json': cb}
    layers = []
    for i, l in enumerate(m['layers']):
        name = '%064x/layer.tar' % (i + 1)
        files[name] = decompress(open(blob_path(L, l['digest']), 'rb').read())
        layers.append(name)
    dm = [{'Config': sha(cb) + '.json', 'RepoTags': ['x:1'], 'Layers': layers}]
    exec(code)
    files['manifest.json'] = json.dumps(dm).encode()
    with tarfile.open(out, 'w') as t:
        for n, b in files.items():
            if '/' in n:
                entry(t, n.split('/')[0], type=tarfile.DIRTYPE, mode=0o755)
            entry(t, n, b)

def entry(t, name, data=b'', **kw):
    i = tarfile.TarInfo(name)
    i.mode = 0o644
    for k, v in kw.items(): setattr(i, k, v)
    i.size = len(data) if i.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    t.addfile(i, io.BytesIO(data) if i.size else None)

def layertar(out, kind, arg=''):  # hand-made layer tars
    with tarfile.open(out, 'w', format=tarfile.PAX_FORMAT) as t:
        if kind == 'opaque':  # keep/ replaced wholesale; data/new made opaque in place
            entry(t, 'keep', type=tarfile.DIRTYPE, mode=0o750, uid=1000, gid=1001)
            entry(t, 'keep/.wh..wh..opq')
            entry(t, 'keep/fresh', b'fresh\n', mode=0o600, uid=1000, gid=1001)
            entry(t, 'keep/sub', type=tarfile.DIRTYPE, mode=0o755)
            entry(t, 'keep/sub/deep', b'deep\n')
            entry(t, 'data/new/.wh..wh..opq')
            entry(t, 'data/new/only', b'only\n')
            entry(t, 'etc/.wh.motd')
            entry(t, 'etc/motd', b'hello again\n', mode=0o640)
        elif kind == 'dotdot':
            entry(t, 'ok', b'ok')
            entry(t, '../../../canary/owned', b'x')
        elif kind == 'abs':
            entry(t, '/tmp/' + arg, b'x')
        elif kind == 'symw':
            entry(t, 'l', type=tarfile.SYMTYPE, linkname='/tmp')
            entry(t, 'l/' + arg, b'x')
        elif kind == 'symrel':
            entry(t, 'l', type=tarfile.SYMTYPE, linkname='../../../canary')
            entry(t, 'l/owned', b'x')
        elif kind == 'dev':
            entry(t, 'null', type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        elif kind == 'hlabs':
            entry(t, 'passwd', type=tarfile.LNKTYPE, linkname='/etc/passwd')
        elif kind == 'hldotdot':
            entry(t, 'x', type=tarfile.LNKTYPE, linkname='../../../canary/c')
        elif kind == 'bombfile':  # one file of int(arg) zero bytes
            i = tarfile.TarInfo('zeros'); i.size = int(arg)
            t.addfile(i, io.BytesIO(bytes(int(arg))))
        elif kind == 'bombtail':
            entry(t, 'small', b'x')
    if kind == 'bombtail':  # int(arg) zero bytes after the end-of-archive marker
        with open(out, 'ab') as f:
            f.write(bytes(int(arg)))

globals()[sys.argv[1]](*sys.argv[2:])
)PY";

// The multi-layer image, made once for the suite. Layer 1 (umoci): dirs, files, an absolute
// symlink, a hard link, a setuid file, a setgid directory, owners. Layer 2 (umoci): a file
// deleted, a directory replaced (umoci writes one whiteout per name, never an opaque one).
// Layer 3 (python, uncompressed): opaque directories, a whiteout and a re-add. Layer 4 (umoci):
// files changed in place in directories with their own owner and mode, which umoci does not
// repeat in the layer. Then a config. "L" has the tags v1 (layer 1) and t; "Lt" only t.
constexpr char kBuild[] = R"SH(
T="/usr/bin/python3 $W/ocitool.py"
umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t b1 >/dev/null
R=b1/rootfs
mkdir -p $R/etc $R/bin $R/data/sub $R/keep $R/srv $R/opt/empty
echo hello > $R/etc/motd
printf 'bin\0ary' > $R/bin/tool && chmod 4755 $R/bin/tool && ln $R/bin/tool $R/bin/tool2
head -c 300000 /dev/urandom > $R/bin/big
ln -s /etc/motd $R/bin/motd && ln -s ../data/f3 $R/etc/rel
for i in 1 2 3; do echo $i > $R/data/f$i; done
echo s > $R/data/sub/s && echo del > $R/etc/gone && echo k > $R/keep/k && echo k2 > $R/keep/k2
chown 1000:1001 $R/data/f2 && chmod 0700 $R/opt/empty
echo x > $R/srv/x && chown 0:50 $R/srv $R/srv/x && chmod 2775 $R/srv && chmod 0640 $R/srv/x
umoci repack --image L:t b1
umoci tag --image L:t v1
umoci unpack --image L:t b2 >/dev/null
R=b2/rootfs
rm $R/etc/gone && rm -rf $R/data && mkdir -p $R/data/new && echo n > $R/data/new/n
echo g > $R/data/g
umoci repack --image L:t b2
$T layertar l3.tar opaque && $T addlayer L t l3.tar none
umoci unpack --image L:t b4 >/dev/null
echo more >> b4/rootfs/keep/fresh && echo more >> b4/rootfs/srv/x
umoci repack --image L:t b4
umoci config --image L:t --config.env FOO=bar --config.env 'SP=a b' --config.workingdir /w \
  --config.user 1000:1001 --config.entrypoint /bin/tool --config.cmd a --config.cmd 'b c'
umoci unpack --image L:t expected >/dev/null
umoci unpack --image L:v1 expected-v1 >/dev/null
cp -a L Lt && umoci rm --image Lt:v1
tar -C Lt -cf lt.tar . && tar -C L -cf multi.tar .
)SH";

// Runs a bash script (set -e) in `dir` with $W set to it; "" or the failure and its output.
std::string RunScript(const std::string& dir, const std::string& script) {
  std::string file = dir + "/.script.sh", log = dir + "/.script.log";
  if (!WriteFileAt(AT_FDCWD, file, "set -e\ncd \"$W\"\n" + script, O_WRONLY | O_CREAT | O_TRUNC)
           .ok())
    return "cannot write " + file;
  int rc = system(("W='" + dir + "' bash " + file + " >" + log + " 2>&1").c_str());
  if (rc == 0) return "";
  return "script failed (" + std::to_string(rc) + "):\n" + script + "\n" +
         ReadFileToString(log, 1 << 16).value_or("");
}

std::string Sha256File(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return "unreadable";
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
  char buf[65536];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0)
    EVP_DigestUpdate(md, buf, static_cast<size_t>(n));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(md, out, &len);
  EVP_MD_CTX_free(md);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    static const char* d = "0123456789abcdef";
    hex += d[out[i] >> 4];
    hex += d[out[i] & 15];
  }
  return hex;
}

// One line per node, in path order: type, mode (setuid/setgid/sticky included), owner, and per
// type the size, content hash, link count and hard-link group, symlink target or device number.
class TreeManifest {
 public:
  static std::vector<std::string> Of(const std::string& root) {
    TreeManifest t;
    t.Walk(root, "");
    return t.lines_;
  }

 private:
  void Walk(const std::string& root, const std::string& rel) {
    std::string path = rel.empty() ? root : root + "/" + rel;
    std::string name = rel.empty() ? "." : rel;
    struct stat st;
    if (lstat(path.c_str(), &st) < 0) {
      lines_.push_back(name + " lstat failed");
      return;
    }
    char head[128];
    snprintf(head, sizeof head, " mode=%04o owner=%u:%u", st.st_mode & 07777, st.st_uid, st.st_gid);
    std::string line = name + head;
    if (S_ISDIR(st.st_mode)) {
      lines_.push_back(line + " dir");
      auto names = ListDir(path);
      if (!names.ok()) {
        lines_.push_back(name + " unreadable");
        return;
      }
      std::sort(names->begin(), names->end());
      for (const auto& n : *names) Walk(root, rel.empty() ? n : rel + "/" + n);
    } else if (S_ISREG(st.st_mode)) {
      line += " file size=" + std::to_string(st.st_size) + " sha256=" + Sha256File(path) +
              " nlink=" + std::to_string(st.st_nlink);
      if (st.st_nlink > 1)  // the same inode: every name of it points at the first one seen
        line += " inode-of=" + inodes_.emplace(std::pair(st.st_dev, st.st_ino), name).first->second;
      lines_.push_back(line);
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = readlink(path.c_str(), target, sizeof target);
      lines_.push_back(name + " owner=" + std::to_string(st.st_uid) + ":" +
                       std::to_string(st.st_gid) + " symlink -> " +
                       std::string(target, static_cast<size_t>(std::max<ssize_t>(n, 0))));
    } else {
      lines_.push_back(line + " special type=" + std::to_string(st.st_mode & S_IFMT) + " rdev=" +
                       std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev)));
    }
  }
  std::vector<std::string> lines_;
  std::map<std::pair<dev_t, ino_t>, std::string> inodes_;
};

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += l + "\n";
  return s;
}

class OciImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_ = "needs root (whiteouts, owners, overlay mounts)";
      return;
    }
    if (system("command -v umoci >/dev/null 2>&1") != 0 || access("/usr/bin/python3", X_OK) != 0 ||
        system("command -v zstd >/dev/null 2>&1") != 0) {
      skip_ = "umoci, /usr/bin/python3 or zstd is not installed";
      return;
    }
    auto t = TempDir::Create("/tmp/dsec-oci-import-suite-");
    if (!t.ok()) {
      broken_ = t.status().ToString();
      return;
    }
    suite_.emplace(std::move(t).value());
    w_ = suite_->path();
    if (Status s = WriteFileAt(AT_FDCWD, w_ + "/ocitool.py", kOciTool, O_WRONLY | O_CREAT); !s.ok())
      broken_ = s.ToString();
    else
      broken_ = RunScript(w_, kBuild);
  }
  static void TearDownTestSuite() { suite_.reset(); }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << "[  SKIPPED ] " << skip_;
    ASSERT_EQ(broken_, "");
    auto t = TempDir::Create("/tmp/dsec-oci-import-test-");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tmp_.emplace(std::move(t).value());
    t_ = tmp_->path();
    root_ = t_ + "/store";
    owned_ = "dsec-oci-owned-" + t_.substr(t_.rfind('-') + 1);
    ASSERT_EQ(RunScript(t_, "mkdir canary && echo c > canary/c"), "");
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    if (!owned_.empty()) unlink(("/tmp/" + owned_).c_str());  // only if a test failed
  }

  void Reopen(uint64_t max_layer_bytes = 16ull << 30, uint64_t max_layer_entries = 2'000'000,
              const std::string& format = "dir") {
    store_.reset();
    StoreOptions o;
    o.root = root_;
    o.max_layer_bytes = max_layer_bytes;
    o.max_layer_entries = max_layer_entries;
    auto f = ParseLayerFormat(format);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    o.default_format = *f;
    auto s = ImageStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }

  // Runs the python tool: "edit L t 'code'" and so on, from the test's directory.
  std::string Tool(const std::string& args) {
    return RunScript(t_, "/usr/bin/python3 " + w_ + "/ocitool.py " + args);
  }
  // A copy of the single-tag layout under the test's dir.
  std::string Copy(const std::string& name) {
    EXPECT_EQ(RunScript(t_, "cp -a " + w_ + "/Lt " + name), "");
    return t_ + "/" + name;
  }
  std::string TarOf(const std::string& layout) {
    EXPECT_EQ(RunScript(t_, "tar -C " + layout + " -cf " + layout + ".tar ."), "");
    return layout + ".tar";
  }

  StatusOr<Image> Import(const std::string& file, const std::string& name,
                         ImportOptions o = ImportOptions()) {
    o.name = name;
    return ImportFile(store_.get(), file, o);
  }

  std::vector<std::string> Layers() {
    auto names = ListDir(root_ + "/layers");
    return names.ok() ? *names : std::vector<std::string>{"unlistable"};
  }

  // The image's layers as a read-only overlay (top first, no upper) in a child's private mount
  // namespace; its tree manifest, or an error line.
  std::vector<std::string> OverlayTree(const Image& img) {
    std::vector<LayerSource> sources;
    for (const auto& d : img.layers) {
      auto info = store_->GetLayer(d);
      if (!info.ok()) return {"missing layer " + d};
      auto src = store_->Source(*info);
      if (!src.ok()) return {"no source: " + src.status().ToString()};
      sources.push_back(*src);
    }
    std::string mnt = t_ + "/mnt", out = t_ + "/overlay-tree.txt", empty = t_ + "/empty-lower";
    mkdir(mnt.c_str(), 0755);
    mkdir(empty.c_str(), 0755);
    unlink(out.c_str());
    pid_t pid = fork();
    if (pid == 0) {
      if (unshare(CLONE_NEWNS) < 0 ||
          mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0)
        _exit(10);
      std::string lower;
      for (size_t i = sources.size(); i-- > 0;) {
        std::string dir = sources[i].path;
        if (sources[i].mount_fd >= 0) {  // an EROFS layer: a clone of its detached mount
          dir = t_ + "/erofs-" + std::to_string(i);
          mkdir(dir.c_str(), 0755);
          int clone = sys::OpenTree(sources[i].mount_fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH);
          if (clone < 0 ||
              sys::MoveMount(clone, "", AT_FDCWD, dir.c_str(), MOVE_MOUNT_F_EMPTY_PATH) < 0)
            _exit(11);
        }
        lower += (lower.empty() ? "" : ":") + dir;
      }
      if (sources.size() == 1) lower += ":" + empty;  // overlay wants two lowers without upper
      if (mount("overlay", mnt.c_str(), "overlay", MS_RDONLY, ("lowerdir=" + lower).c_str()) < 0)
        _exit(12);
      bool ok = WriteFileAt(AT_FDCWD, out, Join(TreeManifest::Of(mnt)), O_WRONLY | O_CREAT).ok();
      _exit(ok ? 0 : 13);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      return {"overlay child failed: " + std::to_string(WEXITSTATUS(st))};
    auto text = ReadFileToString(out, 64 << 20);
    if (!text.ok()) return {text.status().ToString()};
    std::vector<std::string> lines;
    for (size_t p = 0, q; p < text->size(); p = q + 1) {
      q = text->find('\n', p);
      lines.push_back(text->substr(p, q - p));
    }
    return lines;
  }

  // Rejected with `why` in its message, leaving nothing behind: no image, no new layer, an
  // empty tmp dir, the canary dir as it was and nothing in /tmp.
  void ExpectRejected(const std::string& file, const std::string& why,
                      ImportOptions o = ImportOptions()) {
    SCOPED_TRACE(file);
    auto before = Layers();
    size_t images = store_->ListImages().size();
    StatusOr<Image> r = Import(file, "evil:1", o);
    ASSERT_FALSE(r.ok()) << "imported " << file;
    EXPECT_NE(r.status().ToString().find(why), std::string::npos)
        << "expected \"" << why << "\" in: " << r.status().ToString();
    for (const auto& l : Layers())
      EXPECT_NE(std::find(before.begin(), before.end(), l), before.end()) << "new layer " << l;
    EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty());
    EXPECT_EQ(store_->GetImage("evil:1").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store_->ListImages().size(), images);
    EXPECT_EQ(ListDir(t_ + "/canary").value(), std::vector<std::string>{"c"});
    EXPECT_NE(access(("/tmp/" + owned_).c_str(), F_OK), 0);
  }

  static inline std::optional<TempDir> suite_;
  static inline std::string skip_, broken_, w_;
  std::optional<TempDir> tmp_;
  std::string t_, root_, owned_;
  std::unique_ptr<ImageStore> store_;
};

TEST_F(OciImportTest, UmociImagePresentsExactlyTheTreeUmociUnpacks) {
  auto img = Import(w_ + "/lt.tar", "umoci:t");
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  // The layers are the config's diff_ids, in order (a layer to restore directory attributes
  // may follow them).
  ASSERT_EQ(Tool("show " + w_ + "/Lt t " + t_ + "/cfg.json"), "");
  auto cfg = nlohmann::json::parse(ReadFileToString(t_ + "/cfg.json").value());
  auto diff_ids = cfg["rootfs"]["diff_ids"].get<std::vector<std::string>>();
  ASSERT_EQ(diff_ids.size(), 4u);
  ASSERT_GE(img->layers.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(img->layers.begin(), img->layers.begin() + 4), diff_ids);

  std::vector<std::string> want = TreeManifest::Of(w_ + "/expected/rootfs");
  std::vector<std::string> got = OverlayTree(*img);
  EXPECT_EQ(Join(got), Join(want));
  auto has = [&](const std::string& line) {
    return std::find(want.begin(), want.end(), line) != want.end();
  };
  auto any = [&](const std::string& prefix) {
    return std::any_of(got.begin(), got.end(), [&](const std::string& l) {
      return l.compare(0, prefix.size(), prefix) == 0;
    });
  };
  // What the comparison covers, checked against umoci's tree itself.
  for (const char* gone : {"etc/gone ", "data/f1 ", "data/sub ", "data/new/n ", "keep/k "})
    EXPECT_FALSE(any(gone)) << gone;
  EXPECT_TRUE(has("bin/motd owner=0:0 symlink -> /etc/motd"));
  EXPECT_TRUE(has("etc/rel owner=0:0 symlink -> ../data/f3"));
  EXPECT_TRUE(any("bin/tool mode=4755 owner=0:0 file size=7 "));
  EXPECT_TRUE(any("bin/tool2 mode=4755 owner=0:0 file size=7 "));
  EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](const std::string& l) {
    return l.find("bin/tool2 ") == 0 && l.find("nlink=2 inode-of=bin/tool") != std::string::npos;
  }));
  EXPECT_TRUE(has("keep mode=0750 owner=1000:1001 dir"));
  EXPECT_TRUE(has("srv mode=2775 owner=0:50 dir"));
  EXPECT_TRUE(any("keep/fresh mode=0600 owner=1000:1001 file size=11 "));
  EXPECT_TRUE(any("data/new/only "));
  EXPECT_TRUE(any("keep/sub/deep "));
  EXPECT_TRUE(has("opt/empty mode=0700 owner=0:0 dir"));

  // The layers themselves: overlayfs whiteouts and opaque directories.
  struct stat st;
  std::string l2 = store_->LayerDir(img->layers[1]), l3 = store_->LayerDir(img->layers[2]);
  ASSERT_EQ(lstat((l2 + "/etc/gone").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  ASSERT_EQ(lstat((l2 + "/data/sub").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  // umoci replaced data/ with one whiteout per old name, not an opaque directory...
  char opq[8];
  EXPECT_LT(lgetxattr((l2 + "/data").c_str(), "trusted.overlay.opaque", opq, sizeof opq), 0);
  ASSERT_EQ(lstat((l2 + "/data/f1").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  // ... the hand-made layer 3 uses opaque ones.
  for (const char* dir : {"/keep", "/data/new"})
    for (const char* key : {"trusted.overlay.opaque", "user.overlay.opaque"}) {
      char v[8] = {};
      EXPECT_EQ(lgetxattr((l3 + dir).c_str(), key, v, sizeof v), 1) << dir << " " << key;
      EXPECT_EQ(v[0], 'y');
    }
  EXPECT_NE(access((l3 + "/keep/.wh..wh..opq").c_str(), F_OK), 0);
  // Layer 4 (umoci) holds keep/fresh and srv/x but not their directories: a fifth layer gives
  // them back the owner and mode layers 3 and 1 list, and holds nothing else.
  ASSERT_EQ(img->layers.size(), 5u);
  std::string l5 = store_->LayerDir(img->layers[4]);
  EXPECT_EQ(TreeManifest::Of(l5), (std::vector<std::string>{". mode=0755 owner=0:0 dir",
                                                            "keep mode=0750 owner=1000:1001 dir",
                                                            "srv mode=2775 owner=0:50 dir"}));

  // The config.
  EXPECT_EQ(img->config.env, (std::vector<std::string>{"FOO=bar", "SP=a b"}));
  EXPECT_EQ(img->config.workdir, "/w");
  EXPECT_EQ(img->config.user, "1000:1001");
  EXPECT_EQ(img->config.entrypoint, std::vector<std::string>{"/bin/tool"});
  EXPECT_EQ(img->config.cmd, (std::vector<std::string>{"a", "b c"}));
  auto stack = store_->Acquire({"umoci:t"}, "");
  ASSERT_TRUE(stack.ok()) << stack.status().ToString();
  EXPECT_EQ(stack->config.env, img->config.env);
  EXPECT_EQ(stack->layers.size(), img->layers.size());
  EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty());
}

TEST_F(OciImportTest, ErofsLayersPresentTheSameTree) {
  if (access("/usr/bin/mkfs.erofs", X_OK) != 0)
    GTEST_SKIP() << "[  SKIPPED ] mkfs.erofs (erofs-utils) is not installed";
  Reopen(16ull << 30, 2'000'000, "erofs");
  auto img = Import(w_ + "/lt.tar", "umoci:erofs");
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(Join(OverlayTree(*img)), Join(TreeManifest::Of(w_ + "/expected/rootfs")));
}

TEST_F(OciImportTest, LayoutWithSeveralTagsImportsTheNamedOne) {
  auto v1 = Import(w_ + "/multi.tar", "multi:v1");
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(Join(OverlayTree(*v1)), Join(TreeManifest::Of(w_ + "/expected-v1/rootfs")));
  auto t = Import(w_ + "/multi.tar", "multi:t");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(Join(OverlayTree(*t)), Join(TreeManifest::Of(w_ + "/expected/rootfs")));
  EXPECT_EQ(t->config.workdir, "/w");
  ExpectRejected(w_ + "/multi.tar", "import it under one of these tags");  // evil:1: neither
  // A `docker save` of two images picks by RepoTags too.
  ASSERT_EQ(Tool("dockersave " + w_ + "/Lt t " + t_ +
                 "/two.tar \"dm.append(dict(dm[0], RepoTags=['reg.io/y:2']))\""),
            "");
  auto y = Import(t_ + "/two.tar", "y:2");
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->layers, t->layers);
  ExpectRejected(t_ + "/two.tar", "import it under one of these names");
}

TEST_F(OciImportTest, CompressionsAndDockerSaveGiveTheSameLayers) {
  auto base = Import(w_ + "/lt.tar", "gz:1");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  std::string zst = Copy("zst"), raw = Copy("raw");
  ASSERT_EQ(Tool("recompress " + zst + " t zstd"), "");
  ASSERT_EQ(Tool("recompress " + raw + " t none"), "");
  ASSERT_EQ(Tool("dockersave " + w_ + "/Lt t " + t_ + "/docker.tar"), "");
  ASSERT_EQ(RunScript(t_, "gzip -c " + w_ + "/lt.tar > lt.tar.gz && zstd -q -c " + w_ +
                              "/lt.tar > lt.tar.zst && gzip -c docker.tar > docker.tar.gz"),
            "");
  ASSERT_EQ(RunScript(t_,
                      "for b in zst/blobs/sha256/*; do head -c4 $b | od -An -tx1; done | "
                      "grep -q '28 b5 2f fd'"),
            "");  // the zstd layout really has zstd blobs
  std::vector<std::string> want = OverlayTree(*base);
  for (const auto& [file, name] :
       std::vector<std::pair<std::string, std::string>>{{TarOf(zst), "zst:1"},
                                                        {TarOf(raw), "raw:1"},
                                                        {t_ + "/lt.tar.gz", "outer-gz:1"},
                                                        {t_ + "/lt.tar.zst", "outer-zst:1"},
                                                        {t_ + "/docker.tar", "docker:1"},
                                                        {t_ + "/docker.tar.gz", "docker-gz:1"}}) {
    SCOPED_TRACE(name);
    auto img = Import(file, name);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    EXPECT_EQ(img->layers, base->layers);
    EXPECT_EQ(img->config.env, base->config.env);
    EXPECT_EQ(img->config.entrypoint, base->config.entrypoint);
    EXPECT_EQ(img->config.cmd, base->config.cmd);
    EXPECT_EQ(img->config.user, base->config.user);
    EXPECT_EQ(img->config.workdir, base->config.workdir);
  }
  ImportOptions docker;
  docker.format = "docker";
  EXPECT_TRUE(Import(t_ + "/docker.tar", "docker:2", docker).ok());
  EXPECT_EQ(ListDir(root_ + "/layers", /*dirs_only=*/true)->size(),
            base->layers.size());  // each layer stored once
  EXPECT_EQ(Join(OverlayTree(store_->GetImage("docker:1").value())), Join(want));
  EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty());
}

// The edge hands over the file it spooled a request body to: an uncompressed archive is read
// where it is (nothing is copied to the store's tmp dir), a compressed one is decompressed.
TEST_F(OciImportTest, FeedFileReadsAnUncompressedArchiveInPlace) {
  auto base = Import(w_ + "/lt.tar", "ref:1");
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ASSERT_EQ(RunScript(t_, "gzip -c " + w_ + "/lt.tar > ff.tar.gz"), "");
  auto feed = [&](const std::string& file, ImportOptions o) -> StatusOr<Image> {
    UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd || fstat(fd.get(), &st) < 0) return ErrnoError("open " + file);
    DSEC_ASSIGN_OR_RETURN(auto imp, Importer::Start(store_.get(), o));
    DSEC_RETURN_IF_ERROR(imp->FeedFile(fd.get(), static_cast<uint64_t>(st.st_size)));
    bool raw = file.ends_with(".tar");
    if (raw && !ListDir(root_ + "/tmp").value().empty()) return InternalError("copied to tmp");
    return imp->Finish();
  };
  for (const auto& [file, name] : std::vector<std::pair<std::string, std::string>>{
           {w_ + "/lt.tar", "ff-raw:1"}, {t_ + "/ff.tar.gz", "ff-gz:1"}}) {
    SCOPED_TRACE(name);
    ImportOptions o;
    o.name = name;
    auto img = feed(file, o);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    EXPECT_EQ(img->layers, base->layers);
    EXPECT_EQ(img->config.env, base->config.env);
  }
  ImportOptions small;
  small.name = "ff-big:1";
  small.max_archive_bytes = 1024;
  EXPECT_EQ(feed(w_ + "/lt.tar", small).status().code(), StatusCode::kTooLarge);
  EXPECT_EQ(feed(t_ + "/ff.tar.gz", small).status().code(), StatusCode::kTooLarge);
  EXPECT_TRUE(ListDir(root_ + "/tmp").value().empty());
  EXPECT_TRUE(store_->GetImage("ff-big:1").status().code() == StatusCode::kNotFound);
}

TEST_F(OciImportTest, TamperedLayoutsAreRejected) {
  auto variant = [&](const std::string& name, const std::string& tool_args) {
    std::string dir = Copy(name);
    std::string args = tool_args;
    for (size_t p; (p = args.find("$L")) != std::string::npos;) args.replace(p, 2, dir);
    EXPECT_EQ(Tool(args), "");
    return TarOf(dir);
  };
  ExpectRejected(variant("c-layer", "corrupt $L t layer"), "does not match its digest");
  ExpectRejected(variant("c-config", "corrupt $L t config"), "does not match its digest");
  ExpectRejected(variant("c-manifest", "corrupt $L t manifest"), "does not match its digest");
  ExpectRejected(
      variant("diffid", "edit $L t \"c['rootfs']['diff_ids'][3] = 'sha256:' + '0' * 64\""),
      "layer digest mismatch");
  ExpectRejected(variant("diffids", "edit $L t \"c['rootfs']['diff_ids'].pop()\""), "diff_ids");
  ExpectRejected(variant("nodiffids", "edit $L t \"del c['rootfs']\""), "diff_ids");
  ExpectRejected(
      variant("dotdot", "edit $L t \"m['layers'][1]['digest'] = 'sha256:../../../etc/passwd'\""),
      "bad layer digest");
  ExpectRejected(variant("abs", "edit $L t \"m['layers'][2]['digest'] = '/etc/passwd'\""),
                 "bad layer digest");
  ExpectRejected(
      variant("cfgpath", "edit $L t \"m['config']['digest'] = '../../etc/passwd'; c = None\""),
      "bad config digest");
  // Wrong JSON types are errors, not exceptions.
  ExpectRejected(variant("cfgtype", "edit $L t \"m['config'] = 'x'\""), "config");
  ExpectRejected(variant("layertype", "edit $L t \"m['layers'][0] = 5\""), "layer");
  ExpectRejected(variant("layerstype", "edit $L t \"m['layers'] = {}\""), "layers");
  ExpectRejected(variant("difftype", "edit $L t \"c['rootfs']['diff_ids'] = 'x'\""), "diff_ids");
  ExpectRejected(variant("idxtype", "editindex $L \"idx['manifests'][0]['digest'] = 7\""),
                 "digest");
  ExpectRejected(variant("idxtype2", "editindex $L \"idx['manifests'] = ['x']\""), "manifest");
  // The outer archive itself escaping.
  ASSERT_EQ(
      RunScript(t_,
                "cp " + w_ +
                    "/lt.tar esc.tar && /usr/bin/python3 -c \"import tarfile, io\n"
                    "t = tarfile.open('esc.tar', 'a'); i = tarfile.TarInfo('../../../canary/o')\n"
                    "i.size = 1; t.addfile(i, io.BytesIO(b'x')); t.close()\""),
      "");
  ExpectRejected(t_ + "/esc.tar", "canary/o");
  // `docker save` archives pointing out of themselves.
  int n = 0;
  for (const auto& [code, why] : std::vector<std::pair<std::string, std::string>>{
           {"dm[0]['Layers'][1] = '../../../etc/passwd'", "etc/passwd"},
           {"dm[0]['Layers'][1] = '/etc/passwd'", "etc/passwd"},
           {"dm[0]['Config'] = '../../../etc/passwd'", "etc/passwd"},
           {"dm[0]['Config'] = 5", "Config"},
           {"dm[0]['Layers'] = [layers[0], layers[2], layers[1], layers[3]]", "mismatch"}}) {
    std::string out = t_ + "/docker-" + std::to_string(++n) + ".tar";
    ASSERT_EQ(Tool("dockersave " + w_ + "/Lt t " + out + " \"" + code + "\""), "");
    ExpectRejected(out, why);
  }
  // All of it left no layer behind (the valid layers below a bad one included).
  EXPECT_TRUE(Layers().empty());
  EXPECT_TRUE(Import(w_ + "/lt.tar", "good:1").ok());
}

TEST_F(OciImportTest, HostileLayersAreRejected) {
  struct stat passwd_before;
  ASSERT_EQ(stat("/etc/passwd", &passwd_before), 0);
  for (const auto& [kind, why] :
       std::vector<std::pair<std::string, std::string>>{{"dotdot", "path"},
                                                        {"abs", "absolute"},
                                                        {"symw", "l/" + owned_},
                                                        {"symrel", "l/owned"},
                                                        {"dev", "device"},
                                                        {"hlabs", "absolute hard link"},
                                                        {"hldotdot", "hard link target"}}) {
    SCOPED_TRACE(kind);
    std::string dir = Copy("hostile-" + kind);
    ASSERT_EQ(Tool("layertar " + t_ + "/" + kind + ".tar " + kind + " " + owned_), "");
    ASSERT_EQ(Tool("addlayer " + dir + " t " + t_ + "/" + kind + ".tar gzip"), "");
    ExpectRejected(TarOf(dir), why);
  }
  struct stat passwd_after;
  ASSERT_EQ(stat("/etc/passwd", &passwd_after), 0);
  EXPECT_EQ(passwd_after.st_nlink, passwd_before.st_nlink);
  EXPECT_TRUE(Layers().empty());  // the good layers below the hostile one went too
}

TEST_F(OciImportTest, DecompressionBombsStopAtTheLimits) {
  Reopen(/*max_layer_bytes=*/1 << 20, /*max_layer_entries=*/1000);
  const std::string big = std::to_string(64 << 20);  // gzip makes 64 KiB of it
  for (const auto& [kind, why] : std::vector<std::pair<std::string, std::string>>{
           {"bombfile", "exceeds the remaining extraction limit"}, {"bombtail", "larger than"}}) {
    SCOPED_TRACE(kind);
    std::string dir = Copy(kind);
    ASSERT_EQ(Tool("layertar " + t_ + "/" + kind + ".tar " + kind + " " + big), "");
    ASSERT_EQ(Tool("addlayer " + dir + " t " + t_ + "/" + kind + ".tar gzip"), "");
    ASSERT_EQ(RunScript(t_, "rm " + kind + ".tar"), "");
    ExpectRejected(TarOf(dir), why);
  }
  // The archive itself: a small gzip that inflates far beyond max_archive_bytes.
  ASSERT_EQ(RunScript(t_, "(gzip -c " + w_ + "/lt.tar; head -c " + big +
                              " /dev/zero | gzip -c) > bomb.gz"),
            "");
  ImportOptions o;
  o.max_archive_bytes = 8 << 20;
  ExpectRejected(t_ + "/bomb.gz", "larger than", o);
  EXPECT_TRUE(Layers().empty());
}

}  // namespace
}  // namespace dsec::images
