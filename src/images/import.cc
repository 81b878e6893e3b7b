#include "images/import.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "archive/tar.h"
#include "base/file_util.h"
#include "base/in_root.h"
#include "base/strings.h"

namespace dsec::images {

using Json = nlohmann::json;

namespace {

constexpr size_t kChunk = 256 * 1024;
constexpr size_t kMaxJsonBytes = 4 << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Importer

namespace {

// Top-level names of a tar file (ustar name and prefix; pax or GNU long names of top-level
// entries are not needed for classification), reading headers only.
StatusOr<std::set<std::string>> TopLevelNames(int fd) {
  std::set<std::string> names;
  char h[512];
  off_t off = 0;
  for (int i = 0; i < 1'000'000; ++i) {
    ssize_t n = pread(fd, h, sizeof h, off);
    if (n < 0) return ErrnoError("read archive");
    if (n < 512) break;
    if (std::all_of(h, h + 512, [](char c) { return c == 0; })) break;
    std::string name(h, strnlen(h, 100));
    std::string prefix(h + 345, strnlen(h + 345, 155));
    if (memcmp(h + 257, "ustar", 5) == 0 && !prefix.empty()) name = prefix + "/" + name;
    while (StartsWith(name, "./")) name = name.substr(2);
    std::string top = name.substr(0, name.find('/'));
    if (!top.empty()) names.insert(top);
    // Size: octal or base-256.
    uint64_t size = 0;
    if (static_cast<unsigned char>(h[124]) & 0x80) {
      for (int k = 125; k < 136; ++k) size = (size << 8) | static_cast<unsigned char>(h[k]);
    } else {
      for (int k = 124; k < 136 && h[k]; ++k)
        if (h[k] >= '0' && h[k] <= '7') size = size * 8 + static_cast<uint64_t>(h[k] - '0');
    }
    off += 512 + static_cast<off_t>((size + 511) / 512 * 512);
  }
  return names;
}

bool ValidBlobDigest(const std::string& d) {
  if (d.size() != 71 || !StartsWith(d, "sha256:")) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string Sha256Digest(std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_Digest(data.data(), data.size(), out, &len, EVP_sha256(), nullptr) != 1) return "";
  return "sha256:" + HexEncode(std::string_view(reinterpret_cast<char*>(out), len));
}

// The archive's JSON is untrusted: a field of another type than expected reads as missing
// (nlohmann's value() and get() would throw).
const Json* Field(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}
std::string Str(const Json& j, const char* key) {
  const Json* f = Field(j, key);
  return f && f->is_string() ? f->get<std::string>() : std::string();
}

// A relative path without ".." (a docker manifest.json names its files by path).
bool InsideArchive(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\0') != std::string::npos) return false;
  for (std::string_view c : SplitString(p, '/'))
    if (c == "..") return false;
  return true;
}

// Opens `rel` inside the unpacked archive: ".." stays inside it and a symlink is refused.
StatusOr<UniqueFd> OpenIn(int root, const std::string& rel) {
  StatusOr<UniqueFd> fd = OpenInRoot(root, rel, O_RDONLY, InRoot::kNoSymlinks);
  if (!fd.ok()) return fd.status().WithContext("the archive");
  struct stat st;
  if (fstat(fd->get(), &st) < 0 || !S_ISREG(st.st_mode))
    return InvalidArgument("\"" + rel + "\" in the archive is not a regular file");
  return fd;
}

// Reads and parses `rel`; with a digest, its bytes must hash to it.
StatusOr<Json> ReadJson(int root, const std::string& rel, const std::string& digest = "") {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenIn(root, rel));
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFdToString(fd.get(), rel, kMaxJsonBytes));
  if (!digest.empty() && Sha256Digest(text) != digest)
    return InvalidArgument("blob \"" + rel + "\" does not match its digest " + digest);
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("\"" + rel + "\" in the archive is not valid JSON");
  return j;
}

std::string BlobPath(const std::string& digest) { return "blobs/sha256/" + digest.substr(7); }

// The digest a docker archive names a file by ("<hex>.json", "blobs/sha256/<hex>"), or "".
std::string DigestFromName(const std::string& path) {
  std::string base = path.substr(path.rfind('/') + 1);
  if (base.size() == 69 && base.ends_with(".json"))
    base.resize(64);
  else if (!StartsWith(path, "blobs/sha256/"))
    return "";
  return ValidBlobDigest("sha256:" + base) ? "sha256:" + base : "";
}

// rootfs.diff_ids: one sha256 per layer, which the layer's tar must hash to.
StatusOr<std::vector<std::string>> DiffIds(const Json& cfg, size_t layers, const char* what) {
  const Json* rootfs = Field(cfg, "rootfs");
  const Json* ids = rootfs ? Field(*rootfs, "diff_ids") : nullptr;
  if (!ids || !ids->is_array())
    return InvalidArgument(std::string(what) + " config has no rootfs.diff_ids list");
  std::vector<std::string> out;
  for (const auto& d : *ids) {
    if (!d.is_string() || !ValidBlobDigest(d.get<std::string>()))
      return InvalidArgument(std::string(what) + " config: a diff_id is not a sha256 digest");
    out.push_back(d.get<std::string>());
  }
  if (out.size() != layers)
    return InvalidArgument(std::string(what) + " config lists " + std::to_string(out.size()) +
                           " diff_ids for " + std::to_string(layers) + " layers");
  return out;
}

ImageConfig ConfigFromOci(const Json& cfg) {
  ImageConfig c;
  const Json* cj = Field(cfg, "config");
  if (!cj) return c;
  auto strs = [&](const char* k) {
    std::vector<std::string> v;
    if (const Json* a = Field(*cj, k); a && a->is_array())
      for (const auto& e : *a)
        if (e.is_string()) v.push_back(e.get<std::string>());
    return v;
  };
  c.env = strs("Env");
  c.entrypoint = strs("Entrypoint");
  c.cmd = strs("Cmd");
  c.workdir = Str(*cj, "WorkingDir");
  c.user = Str(*cj, "User");
  return c;
}

const char* HostArch() {
#if defined(__x86_64__)
  return "amd64";
#elif defined(__aarch64__)
  return "arm64";
#elif defined(__arm__)
  return "arm";
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return "ppc64le";
#elif defined(__s390x__)
  return "s390x";
#elif defined(__riscv) && __riscv_xlen == 64
  return "riscv64";
#else
  return "";
#endif
}

// Does a reference annotation ("t", "x:t", "docker.io/library/x:t") name the image `name`?
bool RefMatches(const std::string& ref, const std::string& name) {
  return !ref.empty() &&
         (ref == name || ref == name.substr(name.rfind(':') + 1) || ref.ends_with("/" + name));
}

// The entry of an OCI index to follow: the only one; or among those for this machine (when
// entries name a platform), the first, or at the top, when a layout holds several images, the
// one tagged like the import (as `umoci tag` and `docker save` since Docker 25 record it).
StatusOr<Json> PickManifest(const Json& index, const std::string& name, bool top) {
  const Json* ms = Field(index, "manifests");
  if (!ms || !ms->is_array() || ms->empty()) return InvalidArgument("OCI index has no manifests");
  if (ms->size() == 1) {
    if (!(*ms)[0].is_object()) return InvalidArgument("OCI index: a manifest entry is no object");
    return (*ms)[0];
  }
  std::vector<const Json*> ours;
  for (const auto& m : *ms) {
    if (!m.is_object()) return InvalidArgument("OCI index: a manifest entry is no object");
    const Json* p = Field(m, "platform");
    if (!p || (Str(*p, "os") == "linux" && Str(*p, "architecture") == HostArch()))
      ours.push_back(&m);
  }
  if (ours.empty())
    return InvalidArgument(std::string("OCI index has no image for linux/") + HostArch());
  if (top && ours.size() > 1) {
    std::vector<const Json*> tagged;
    std::string tags;
    for (const Json* m : ours) {
      const Json* a = Field(*m, "annotations");
      std::string ref = a ? Str(*a, "org.opencontainers.image.ref.name") : "";
      if (RefMatches(ref, name) || (a && RefMatches(Str(*a, "io.containerd.image.name"), name)))
        tagged.push_back(m);
      if (!ref.empty() && tags.size() < 200) tags += (tags.empty() ? "" : ", ") + ref;
    }
    if (tagged.empty())
      return InvalidArgument("the OCI index holds " + std::to_string(ours.size()) +
                             " images (tags: " + tags + "); import it under one of these tags");
    ours = tagged;
  }
  return *ours[0];
}

// The image of a docker manifest.json to import: the only one, or the one tagged like the import.
StatusOr<size_t> PickDockerImage(const Json& list, const std::string& name) {
  std::string tags;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_object()) return InvalidArgument("docker manifest.json: an entry is no object");
    if (list.size() == 1) return i;
    if (const Json* rt = Field(list[i], "RepoTags"); rt && rt->is_array())
      for (const auto& t : *rt) {
        if (!t.is_string()) continue;
        const std::string& tag = t.get_ref<const std::string&>();
        if (tag == name || tag.ends_with("/" + name)) return i;
        if (tags.size() < 200) tags += (tags.empty() ? "" : ", ") + tag;
      }
  }
  return InvalidArgument("docker manifest.json holds " + std::to_string(list.size()) + " images (" +
                         tags + "); import it under one of these names");
}

// --- Directories a layer does not list.
//
// A layer tar may hold "a/b/f" without "a/b/" (umoci writes no entry for a directory whose file
// changed in place). Extracted on its own, such a layer gets "a/b" with the default owner and
// mode (root, 0755), and overlayfs shows a directory with the attributes of its topmost copy: the
// layer would reset a directory of the layers below (a 0750 one made world-readable, /tmp's
// sticky bit gone). The store records those directories per layer (<layer>.dirs, store.cc);
// an import then adds one layer on top that gives each directory whose topmost copy is such an
// unlisted one the owner and mode of the listed copy it covers, as `umoci unpack` or containerd
// (applying each layer onto the ones below) would show it.

struct DirAttrs {
  mode_t mode = 0755;
  uid_t uid = 0;
  gid_t gid = 0;
  int64_t mtime = 0;
  bool SameOwnerAndMode(const DirAttrs& o) const {
    return mode == o.mode && uid == o.uid && gid == o.gid;
  }
};

struct StackLayer {
  UniqueFd root;
  std::set<std::string> unlisted;  // "." for the root
};

bool IsOpaque(int dirfd) {
  char v = 0;
  return (fgetxattr(dirfd, "trusted.overlay.opaque", &v, 1) == 1 && v == 'y') ||
         (fgetxattr(dirfd, "user.overlay.opaque", &v, 1) == 1 && v == 'y');
}

// What overlayfs finds at `path` in one layer.
struct Probe {
  enum Kind { kAbsent, kDir, kOther } kind = kAbsent;  // kOther: a file, symlink or whiteout
  bool opaque = false;       // the directory hides what the layers below have in it
  bool hides_below = false;  // a parent directory of path is opaque here
  DirAttrs attrs;
};

StatusOr<Probe> ProbeLayer(int root, const std::string& path) {
  Probe p;
  UniqueFd cur(fcntl(root, F_DUPFD_CLOEXEC, 0));
  if (!cur) return ErrnoError("dup");
  std::vector<std::string_view> comps;
  if (path != ".") comps = SplitString(path, '/');
  for (size_t i = 0; i < comps.size(); ++i) {
    if (i > 0 && IsOpaque(cur.get())) p.hides_below = true;
    std::string c(comps[i]);
    // One component at a time, never following a symlink (nor opening a device: O_DIRECTORY).
    int fd = openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return p;
    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP)) {
      p.kind = Probe::kOther;
      return p;
    }
    if (fd < 0) return ErrnoError("open \"" + path + "\" in a layer");
    cur.Reset(fd);
  }
  struct stat st;
  if (fstat(cur.get(), &st) < 0) return ErrnoError("stat \"" + path + "\" in a layer");
  p.kind = Probe::kDir;
  p.opaque = IsOpaque(cur.get());
  p.attrs = {st.st_mode & 07777, st.st_uid, st.st_gid, st.st_mtim.tv_sec};
  return p;
}

struct Resolved {
  bool visible = false;  // a directory in the stacked tree
  bool restore = false;  // its topmost copy is unlisted and differs from the listed one below
  DirAttrs attrs;        // what the stacked tree should show
};

// Walks `path` down the stack (top first) as overlayfs looks it up.
StatusOr<Resolved> Resolve(const std::vector<StackLayer>& layers, const std::string& path) {
  Resolved r;
  for (size_t k = layers.size(); k-- > 0;) {
    DSEC_ASSIGN_OR_RETURN(Probe p, ProbeLayer(layers[k].root.get(), path));
    if (p.kind == Probe::kOther) break;  // a non-directory hides the layers below
    if (p.kind == Probe::kDir) {
      bool listed = !layers[k].unlisted.count(path);
      if (!r.visible) {
        r.visible = true;
        r.attrs = p.attrs;
        if (listed) return r;
      } else if (listed) {
        r.restore = !p.attrs.SameOwnerAndMode(r.attrs);
        r.attrs = p.attrs;
        return r;
      }
      if (p.opaque) break;
    }
    if (p.hides_below) break;
  }
  return r;
}

// One ustar header block.
std::string TarHeader(const std::string& name, char type, uint64_t size, const DirAttrs& a) {
  char h[512] = {};
  memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  snprintf(h + 100, 8, "%07o", static_cast<unsigned>(a.mode & 07777));
  snprintf(h + 108, 8, "%07o", static_cast<unsigned>(std::min<uid_t>(a.uid, 07777777)));
  snprintf(h + 116, 8, "%07o", static_cast<unsigned>(std::min<gid_t>(a.gid, 07777777)));
  snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size & 077777777777ull));
  snprintf(h + 136, 12, "%011llo",
           static_cast<unsigned long long>(std::max<int64_t>(a.mtime, 0) & 077777777777ll));
  memset(h + 148, ' ', 8);
  h[156] = type;
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  snprintf(h + 148, 8, "%06o", sum & 0777777);
  return std::string(h, sizeof h);
}

// A directory entry, after a pax header when the name or an id does not fit ustar.
void AppendDirEntry(std::string* out, const std::string& name, const DirAttrs& a) {
  std::string pax;
  auto record = [&](const std::string& key, const std::string& value) {
    std::string body = " " + key + "=" + value + "\n";
    size_t len = body.size() + 1;
    while (std::to_string(len).size() + body.size() != len)
      len = std::to_string(len).size() + body.size();
    pax += std::to_string(len) + body;
  };
  if (name.size() > 100) record("path", name);
  if (a.uid > 07777777) record("uid", std::to_string(a.uid));
  if (a.gid > 07777777) record("gid", std::to_string(a.gid));
  if (!pax.empty()) {
    out->append(TarHeader("PaxHeader", 'x', pax.size(), DirAttrs{0644, 0, 0, a.mtime}));
    out->append(pax);
    out->append((512 - pax.size() % 512) % 512, '\0');
  }
  out->append(TarHeader(name, '5', 0, a));
}

}  // namespace

struct Importer::Impl {
  ImageStore* store;
  ImportOptions opts;
  std::optional<ImageStore::Lease> lease;
  std::string spool;
  UniqueFd spool_fd;
  uint64_t spooled = 0;
  std::unique_ptr<Decoder> dec;
  std::string unpacked;
  int committed = 0;  // layers this import stored (or found stored)

  Impl(ImageStore* s, ImportOptions o) : store(s), opts(std::move(o)) { lease.emplace(s); }
  ~Impl() {
    spool_fd.Reset();
    if (!spool.empty()) unlink(spool.c_str());
    if (!unpacked.empty()) (void)RemoveTree(unpacked);
  }

  // Feeds one layer blob (compressed or not) through a LayerBuilder.
  StatusOr<LayerInfo> ImportLayer(int root, const std::string& rel, const std::string& blob_digest,
                                  const std::string& diff_id) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenIn(root, rel));
    DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer(opts.skip_dev_nodes));
    Decoder d([&](std::string_view s) { return builder->Feed(s); });
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) {
      EVP_MD_CTX_free(md);
      return InternalError("sha256 init failed");
    }
    std::vector<char> buf(kChunk);
    Status st;
    for (;;) {
      ssize_t n = read(fd.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        st = ErrnoError("read \"" + rel + "\"");
        break;
      }
      if (n == 0) break;
      EVP_DigestUpdate(md, buf.data(), static_cast<size_t>(n));
      st = d.Feed(std::string_view(buf.data(), static_cast<size_t>(n)));
      if (!st.ok()) break;
    }
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(md, out, &len);
    EVP_MD_CTX_free(md);
    DSEC_RETURN_IF_ERROR(st.WithContext("layer \"" + rel + "\""));
    DSEC_RETURN_IF_ERROR(d.Finish().WithContext("layer \"" + rel + "\""));
    if (!blob_digest.empty() &&
        "sha256:" + HexEncode(std::string_view(reinterpret_cast<char*>(out), len)) != blob_digest)
      return InvalidArgument("blob \"" + rel + "\" does not match its digest " + blob_digest);
    DSEC_ASSIGN_OR_RETURN(LayerInfo info, builder->Commit(diff_id, opts.layer_format));
    ++committed;
    return info;
  }

  // Adds the layer that restores directories the image's layers did not list (above), if any
  // needs it.
  Status RestoreUnlistedDirs(Image* img) {
    std::vector<StackLayer> layers;
    std::set<std::string> candidates;
    for (const auto& digest : img->layers) {
      DSEC_ASSIGN_OR_RETURN(LayerInfo info, store->GetLayer(digest));
      DSEC_ASSIGN_OR_RETURN(LayerSource src, store->Source(info));
      StackLayer l;
      l.root.Reset(src.mount_fd >= 0 ? openat(src.mount_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                                     : open(src.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!l.root) return ErrnoError("open layer " + digest);
      auto dirs = ReadFileToString(store->LayerDir(digest) + ".dirs", 256 << 20);
      if (!dirs.ok() && dirs.status().error_number() != ENOENT) return dirs.status();
      if (dirs.ok())
        for (std::string_view p : SplitString(*dirs, '\0', /*skip_empty=*/true))
          l.unlisted.emplace(p);
      candidates.insert(l.unlisted.begin(), l.unlisted.end());
      layers.push_back(std::move(l));
    }
    std::map<std::string, DirAttrs> entries;
    for (const auto& path : candidates) {
      DSEC_ASSIGN_OR_RETURN(Resolved r, Resolve(layers, path));
      if (!r.restore) continue;
      entries[path] = r.attrs;
      // Its parents go into the new layer too, as the stack shows them (a directory the new
      // layer did not list would take the default owner and mode, on top of everything).
      for (std::string p = path; p != ".";) {
        size_t slash = p.rfind('/');
        p = slash == std::string::npos ? "." : p.substr(0, slash);
        if (entries.count(p)) break;
        DSEC_ASSIGN_OR_RETURN(Resolved up, Resolve(layers, p));
        entries[p] = up.attrs;
      }
    }
    if (entries.empty()) return OkStatus();
    std::string tar;
    for (const auto& [path, attrs] : entries)
      AppendDirEntry(&tar, path == "." ? "./" : path + "/", attrs);
    tar.append(1024, '\0');
    DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer(opts.skip_dev_nodes));
    DSEC_RETURN_IF_ERROR(builder->Feed(tar));
    DSEC_ASSIGN_OR_RETURN(LayerInfo l, builder->Commit("", opts.layer_format));
    ++committed;
    img->layers.push_back(l.digest);
    return OkStatus();
  }

  // The spooled archive, from its start, kChunk at a time.
  Status ReadSpool(const std::function<Status(std::string_view)>& fn) {
    return ReadFileChunks(spool_fd.get(), spooled, kChunk, fn, "the spooled archive");
  }

  StatusOr<Image> Rootfs() {
    DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer(opts.skip_dev_nodes));
    DSEC_RETURN_IF_ERROR(ReadSpool([&](std::string_view d) { return builder->Feed(d); }));
    DSEC_ASSIGN_OR_RETURN(LayerInfo layer, builder->Commit("", opts.layer_format));
    ++committed;
    Image img;
    img.name = opts.name;
    img.base = opts.base;
    img.layers = {layer.digest};
    if (opts.base.empty())
      img.config.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    img.source = "import";
    return img;
  }

  Status Unpack() {
    unpacked = store->TempPath("unpack");
    if (mkdir(unpacked.c_str(), 0700) < 0) return ErrnoError("mkdir \"" + unpacked + "\"");
    DSEC_ASSIGN_OR_RETURN(UniqueFd dir, OpenDir(unpacked, O_RDONLY));
    archive::TarExtractOptions o;
    o.uid = 0;
    o.gid = 0;
    o.max_total_bytes = opts.max_archive_bytes;
    o.max_entries = 100'000;
    archive::TarExtractor x(dir.get(), o);
    DSEC_RETURN_IF_ERROR(ReadSpool([&](std::string_view d) { return x.Feed(d); }));
    DSEC_RETURN_IF_ERROR(x.Finish());
    // The spool is no longer needed: give its space back before the layers are made.
    spool_fd.Reset();
    if (!spool.empty()) unlink(spool.c_str());
    spool.clear();
    return OkStatus();
  }

  StatusOr<Image> Oci() {
    DSEC_RETURN_IF_ERROR(Unpack());
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, OpenDir(unpacked, O_RDONLY));
    DSEC_ASSIGN_OR_RETURN(Json index, ReadJson(root.get(), "index.json"));
    // index.json -> (a nested index ->) a manifest, each blob checked against its digest.
    Json manifest;
    for (int depth = 0; !manifest.is_object(); ++depth) {
      if (depth == 3) return InvalidArgument("OCI index: no image manifest found");
      DSEC_ASSIGN_OR_RETURN(Json m, PickManifest(index, opts.name, depth == 0));
      std::string digest = Str(m, "digest");
      if (!ValidBlobDigest(digest)) return InvalidArgument("OCI index: bad manifest digest");
      DSEC_ASSIGN_OR_RETURN(Json next, ReadJson(root.get(), BlobPath(digest), digest));
      if (!next.is_object()) return InvalidArgument("OCI manifest is not a JSON object");
      std::string mt = Str(m, "mediaType").empty() ? Str(next, "mediaType") : Str(m, "mediaType");
      if (mt.find("index") != std::string::npos || Field(next, "manifests"))
        index = std::move(next);
      else
        manifest = std::move(next);
    }
    const Json* cfg_desc = Field(manifest, "config");
    std::string cfg_digest = cfg_desc ? Str(*cfg_desc, "digest") : "";
    if (!ValidBlobDigest(cfg_digest)) return InvalidArgument("OCI manifest: bad config digest");
    DSEC_ASSIGN_OR_RETURN(Json cfg, ReadJson(root.get(), BlobPath(cfg_digest), cfg_digest));
    const Json* layers = Field(manifest, "layers");
    if (!layers || !layers->is_array()) return InvalidArgument("OCI manifest has no layers list");
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> diff_ids, DiffIds(cfg, layers->size(), "OCI"));
    Image img;
    img.name = opts.name;
    img.config = ConfigFromOci(cfg);
    img.source = "import";
    for (size_t i = 0; i < layers->size(); ++i) {
      std::string digest = Str((*layers)[i], "digest");
      if (!ValidBlobDigest(digest)) return InvalidArgument("OCI manifest: bad layer digest");
      DSEC_ASSIGN_OR_RETURN(LayerInfo l,
                            ImportLayer(root.get(), BlobPath(digest), digest, diff_ids[i]));
      img.layers.push_back(l.digest);
    }
    DSEC_RETURN_IF_ERROR(RestoreUnlistedDirs(&img));
    return img;
  }

  StatusOr<Image> Docker() {
    DSEC_RETURN_IF_ERROR(Unpack());
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, OpenDir(unpacked, O_RDONLY));
    DSEC_ASSIGN_OR_RETURN(Json manifest, ReadJson(root.get(), "manifest.json"));
    if (!manifest.is_array() || manifest.empty())
      return InvalidArgument("docker manifest.json lists no image");
    DSEC_ASSIGN_OR_RETURN(size_t pick, PickDockerImage(manifest, opts.name));
    const Json& m = manifest[pick];
    std::string cfg_path = Str(m, "Config");
    if (cfg_path.empty()) return InvalidArgument("docker manifest.json has no Config");
    if (!InsideArchive(cfg_path))
      return InvalidArgument("docker manifest.json: Config \"" + cfg_path.substr(0, 200) +
                             "\" is outside the archive");
    DSEC_ASSIGN_OR_RETURN(Json cfg, ReadJson(root.get(), cfg_path, DigestFromName(cfg_path)));
    const Json* layers = Field(m, "Layers");
    if (!layers || !layers->is_array())
      return InvalidArgument("docker manifest.json has no Layers");
    DSEC_ASSIGN_OR_RETURN(std::vector<std::string> diff_ids,
                          DiffIds(cfg, layers->size(), "docker"));
    Image img;
    img.name = opts.name;
    img.config = ConfigFromOci(cfg);
    img.source = "import";
    for (size_t i = 0; i < layers->size(); ++i) {
      if (!(*layers)[i].is_string()) return InvalidArgument("docker manifest: bad layer path");
      std::string path = (*layers)[i].get<std::string>();
      if (!InsideArchive(path))
        return InvalidArgument("docker manifest.json: layer \"" + path.substr(0, 200) +
                               "\" is outside the archive");
      std::string blob = StartsWith(path, "blobs/sha256/") ? DigestFromName(path) : "";
      DSEC_ASSIGN_OR_RETURN(LayerInfo l, ImportLayer(root.get(), path, blob, diff_ids[i]));
      img.layers.push_back(l.digest);
    }
    DSEC_RETURN_IF_ERROR(RestoreUnlistedDirs(&img));
    return img;
  }

  StatusOr<Image> Run() {
    DSEC_RETURN_IF_ERROR(dec->Finish());
    if (spooled == 0) return InvalidArgument("the archive is empty");
    std::string format = opts.format;
    if (format == "auto") {
      DSEC_ASSIGN_OR_RETURN(std::set<std::string> top, TopLevelNames(spool_fd.get()));
      if (top.count("oci-layout") || top.count("index.json"))
        format = "oci";
      else if (top.count("manifest.json"))
        format = "docker";
      else
        format = "rootfs";
    }
    StatusOr<Image> img = format == "oci" ? Oci() : format == "docker" ? Docker() : Rootfs();
    if (!img.ok()) return img.status().WithContext("import " + format + " archive");
    if (format != "rootfs" && !opts.base.empty()) img->base = opts.base;
    img->project = opts.project;
    if (!opts.add_image) return img;
    DSEC_RETURN_IF_ERROR(store->PutImage(*img));
    return store->GetImage(img->name);
  }
};

Importer::Importer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Importer::~Importer() = default;

StatusOr<std::unique_ptr<Importer>> Importer::Start(ImageStore* store, ImportOptions opts) {
  DSEC_ASSIGN_OR_RETURN(opts.name, NormalizeName(opts.name));
  if (opts.format != "auto" && opts.format != "rootfs" && opts.format != "oci" &&
      opts.format != "docker")
    return InvalidArgument("import format \"" + opts.format +
                           "\": expected auto, rootfs, oci or docker");
  if (!opts.base.empty() && opts.base != "host")
    return InvalidArgument("base \"" + opts.base + "\": expected \"host\" or none");
  if (opts.add_image && store->GetImage(opts.name).ok())  // checked again when it is added
    return Status(StatusCode::kAlreadyExists, "image \"" + opts.name + "\" already exists");
  auto impl = std::make_unique<Impl>(store, std::move(opts));
  Impl* im = impl.get();
  im->spool = store->TempPath("upload");
  im->spool_fd.Reset(open(im->spool.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!im->spool_fd) return ErrnoError("create \"" + im->spool + "\"");
  im->dec = std::make_unique<Decoder>([im](std::string_view s) -> Status {
    if (s.size() > im->opts.max_archive_bytes - std::min(im->spooled, im->opts.max_archive_bytes))
      return TooLarge("the archive is larger than " + std::to_string(im->opts.max_archive_bytes) +
                      " bytes once decompressed");
    im->spooled += s.size();
    return WriteAllFd(im->spool_fd.get(), s, "spool");
  });
  return std::unique_ptr<Importer>(new Importer(std::move(impl)));
}

Status Importer::Feed(std::string_view data) { return impl_->dec->Feed(data); }

Status Importer::FeedFile(int fd, uint64_t size) {
  Impl& im = *impl_;
  char h[4];
  ssize_t n = pread(fd, h, sizeof h, 0);
  if (n < 0) return ErrnoError("read the archive");
  if (!Decoder::Compressed(std::string_view(h, static_cast<size_t>(n))) && im.spooled == 0) {
    // Used in place: the empty spool file goes, and nothing more may be fed.
    if (size > im.opts.max_archive_bytes)
      return TooLarge("the archive is larger than " + std::to_string(im.opts.max_archive_bytes) +
                      " bytes");
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return ErrnoError("dup the archive");
    im.spool_fd.Reset(own);
    unlink(im.spool.c_str());
    im.spool.clear();
    im.spooled = size;
    im.dec = std::make_unique<Decoder>([](std::string_view s) -> Status {
      return s.empty() ? OkStatus() : FailedPrecondition("the archive was already given");
    });
    return OkStatus();
  }
  return ReadFileChunks(
      fd, size, kChunk, [this](std::string_view d) { return Feed(d); }, "the archive");
}

StatusOr<Image> Importer::Finish() {
  Impl& im = *impl_;
  StatusOr<Image> img = im.Run();
  if (!img.ok() && im.committed > 0) {
    // The layers stored before the failure are referenced by nothing: collect them now that
    // this import's lease is gone (with another import or snapshot under way, the next
    // collection does).
    im.lease.reset();
    (void)im.store->Collect();
  }
  return img;
}

StatusOr<Image> ImportFile(ImageStore* store, const std::string& path, ImportOptions opts) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open \"" + path + "\"");
  DSEC_ASSIGN_OR_RETURN(auto imp, Importer::Start(store, std::move(opts)));
  std::vector<char> buf(kChunk);
  for (;;) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read \"" + path + "\"");
    if (n == 0) break;
    DSEC_RETURN_IF_ERROR(imp->Feed(std::string_view(buf.data(), static_cast<size_t>(n))));
  }
  return imp->Finish();
}

}  // namespace dsec::images
