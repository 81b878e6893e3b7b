#include "images/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>

#include "archive/tar.h"
#include "base/clock.h"
#include "base/enum_names.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/in_root.h"
#include "base/logging.h"
#include "base/loop_device.h"
#include "base/strings.h"
#include "base/subprocess.h"
#include "images/oci_whiteouts.h"
#include "sys/syscalls.h"

namespace dsec::images {

using Json = nlohmann::json;

namespace {

constexpr EnumName<LayerFormat> kLayerFormats[] = {{LayerFormat::kDir, "dir"},
                                                   {LayerFormat::kErofs, "erofs"}};

// What a layer's file name adds to its digest's: EROFS layers are image files beside the
// directories.
const char* LayerSuffix(LayerFormat f) { return f == LayerFormat::kErofs ? ".erofs" : ""; }

// An EROFS image of a layer directory. -x1: extended attributes kept (overlayfs opaque
// markers; whiteouts are 0/0 devices). Chunk-based files (4 KiB chunks) keep a sparse file's
// holes as holes: without them a snapshot's 3 GB of holes would be 3 GB of zeros on disk.
Status MakeErofs(const std::string& mkfs, const std::string& image, const std::string& dir) {
  return RunTool({mkfs, "--quiet", "-x1", "--chunksize=4096", image, dir}, "erofs-utils");
}

constexpr size_t kMaxStackLayers = 64;

// The owner the extractor gives the directories it makes because an entry needs them but the
// layer does not list them (a uid no archive entry has in practice): Commit() finds them by it.
constexpr uid_t kUnlistedOwner = 0xFFFFFFFE;

// What a layer tar may hold besides file content: a header and padding per entry, extended
// headers, the end marker and the zeros tools pad with. Beyond it the stream is a bomb.
constexpr uint64_t kTarOverheadPerEntry = 4096;
constexpr uint64_t kTarOverheadFixed = 1 << 20;

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : b + a; }

bool NameChar(char c, bool tag) {
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
    return true;
  return tag && c >= 'A' && c <= 'Z';
}

std::string Hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += d[p[i] >> 4];
    out += d[p[i] & 15];
  }
  return out;
}

}  // namespace

bool ValidDigest(const std::string& d) {
  if (d.size() != 7 + 64 || d.compare(0, 7, "sha256:") != 0) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Json ConfigToJson(const ImageConfig& c) {
  return Json{{"env", c.env},
              {"workdir", c.workdir},
              {"user", c.user},
              {"entrypoint", c.entrypoint},
              {"cmd", c.cmd}};
}

ImageConfig ConfigFromJson(const Json& j) {
  ImageConfig c;
  if (!j.is_object()) return c;
  auto strs = [&](const char* k) {
    std::vector<std::string> v;
    if (auto it = j.find(k); it != j.end() && it->is_array())
      for (const auto& e : *it)
        if (e.is_string()) v.push_back(e.get<std::string>());
    return v;
  };
  auto str = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  c.env = strs("env");
  c.entrypoint = strs("entrypoint");
  c.cmd = strs("cmd");
  c.workdir = str("workdir");
  c.user = str("user");
  return c;
}

namespace {

// The directories of a freshly extracted layer that the tar did not list (kUnlistedOwner):
// each gets the default owner and mode (root, 0755) and its path ("." for the root) is
// appended, NUL-terminated, to *out. Breadth first, one open directory at a time.
Status FixUnlistedDirs(int root, std::string* out) {
  std::deque<std::string> todo{"."};
  while (!todo.empty()) {
    std::string rel = std::move(todo.front());
    todo.pop_front();
    StatusOr<UniqueFd> opened =
        OpenInRoot(root, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, InRoot::kBeneath);
    if (!opened.ok()) return opened.status().WithContext("layer directory");
    UniqueFd dir = std::move(opened).value();
    struct stat st;
    if (fstat(dir.get(), &st) < 0) return ErrnoError("stat layer directory \"" + rel + "\"");
    if (st.st_uid == kUnlistedOwner && st.st_gid == kUnlistedOwner) {
      if (fchown(dir.get(), 0, 0) < 0 || fchmod(dir.get(), 0755) < 0)
        return ErrnoError("chown layer directory \"" + rel + "\"");
      out->append(rel);
      out->push_back('\0');
    }
    int dup_fd = fcntl(dir.get(), F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return ErrnoError("dup");
    DIR* d = fdopendir(dup_fd);
    if (!d) {
      close(dup_fd);
      return ErrnoError("opendir layer directory \"" + rel + "\"");
    }
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN)
        is_dir =
            fstatat(dir.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
      if (is_dir) todo.push_back(rel == "." ? name : rel + "/" + name);
    }
    closedir(d);
  }
  return OkStatus();
}

// Attaches `file` to a free loop device (read-only, autoclear) and mounts it as EROFS: a
// detached read-only mount. The loop device goes away with the last user of the mount.
StatusOr<UniqueFd> MountErofs(const std::string& file) {
  UniqueFd img(open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!img) return ErrnoError("open \"" + file + "\"");
  // Direct I/O: the layer's pages are cached once, by EROFS, not also as the loop's file.
  DSEC_ASSIGN_OR_RETURN(LoopDevice loop, AttachLoopDevice(img.get(), true, true));
  UniqueFd fs(sys::FsOpen("erofs", FSOPEN_CLOEXEC));
  if (!fs) return ErrnoError("fsopen erofs");
  if (sys::FsConfig(fs.get(), FSCONFIG_SET_STRING, "source", loop.dev.c_str(), 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_SET_FLAG, "ro", nullptr, 0) < 0 ||
      sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    return ErrnoError("mount erofs from " + loop.dev + " (\"" + file + "\")");
  UniqueFd mnt(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC,
                            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  if (!mnt) return ErrnoError("fsmount erofs");
  return mnt;  // the loop device's fd closes here: the mount keeps it until it goes
}

}  // namespace

std::string_view LayerFormatName(LayerFormat f) { return NameIn(kLayerFormats, f); }

StatusOr<LayerFormat> ParseLayerFormat(std::string_view s) {
  if (auto f = ValueIn(kLayerFormats, s)) return *f;
  return InvalidArgument("layer format \"" + std::string(s) + "\": expected " +
                         NamesIn(kLayerFormats));
}

StatusOr<std::string> NormalizeName(std::string_view name) {
  std::string_view repo = name, tag = "latest";
  if (size_t colon = name.rfind(':'); colon != std::string_view::npos) {
    repo = name.substr(0, colon);
    tag = name.substr(colon + 1);
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgument("image name \"" + std::string(name.substr(0, 200)) + "\": " + why);
  };
  if (repo.empty() || repo.size() > 128) return bad("the name must have 1 to 128 characters");
  if (tag.empty() || tag.size() > 128) return bad("the tag must have 1 to 128 characters");
  if (!((repo[0] >= 'a' && repo[0] <= 'z') || (repo[0] >= '0' && repo[0] <= '9')))
    return bad("the name must start with a lowercase letter or a digit");
  for (char c : repo)
    if (!NameChar(c, false)) return bad("the name may only hold a-z 0-9 . _ -");
  for (char c : tag)
    if (!NameChar(c, true)) return bad("the tag may only hold A-Z a-z 0-9 . _ -");
  if (repo == "host") return bad("\"host\" is the built-in image");
  return std::string(repo) + ":" + std::string(tag);
}

// ---------------------------------------------------------------------------------------------
// LayerBuilder

struct LayerBuilder::Impl {
  std::string tmp;
  UniqueFd dir;
  OciWhiteouts whiteouts;  // the extractor's hook: declared first, destroyed after it
  std::unique_ptr<archive::TarExtractor> tar;
  EVP_MD_CTX* md = nullptr;
  ~Impl() {
    if (md) EVP_MD_CTX_free(md);
  }
};

LayerBuilder::LayerBuilder(ImageStore* store) : store_(store) {}

LayerBuilder::~LayerBuilder() {
  if (impl_ && !done_) {
    impl_->tar.reset();
    impl_->dir.Reset();
    (void)RemoveTree(impl_->tmp);
    unlink((impl_->tmp + ".dirs").c_str());
  }
}

Status LayerBuilder::Feed(std::string_view data) {
  if (done_) return FailedPrecondition("layer already committed");
  // The extractor bounds file content, not what it skips (zeros after the end marker, the data
  // of entries it ignores), so the stream as a whole is bounded too.
  const StoreOptions& o = store_->opts_;
  uint64_t cap = SaturatingAdd(SaturatingAdd(o.max_layer_bytes, kTarOverheadFixed),
                               o.max_layer_entries > UINT64_MAX / kTarOverheadPerEntry
                                   ? UINT64_MAX
                                   : o.max_layer_entries * kTarOverheadPerEntry);
  if (data.size() > cap - std::min(bytes_in_, cap))
    return TooLarge("the layer is larger than " + std::to_string(cap) + " bytes once decompressed");
  bytes_in_ += data.size();
  if (EVP_DigestUpdate(impl_->md, data.data(), data.size()) != 1)
    return InternalError("sha256 update failed");
  return impl_->tar->Feed(data);
}

StatusOr<LayerInfo> LayerBuilder::Commit(const std::string& expect_digest,
                                         std::optional<LayerFormat> format) {
  if (done_) return FailedPrecondition("layer already committed");
  DSEC_RETURN_IF_ERROR(impl_->tar->Finish());
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(impl_->md, out, &len) != 1) return InternalError("sha256 final failed");
  std::string digest = "sha256:" + Hex(out, len);
  if (!expect_digest.empty() && expect_digest != digest)
    return InvalidArgument("layer digest mismatch: the archive says " + expect_digest +
                           ", its content is " + digest);
  uint64_t size = impl_->tar->stats().bytes;
  impl_->tar.reset();
  LayerFormat fmt = format.value_or(store_->opts_.default_format);
  // The directories the tar did not list are recorded beside the layer (<layer>.dirs): the
  // importer restores their owner and mode from the layers below (see import.cc).
  if (!store_->GetLayer(digest).ok()) {
    std::string unlisted;
    DSEC_RETURN_IF_ERROR(FixUnlistedDirs(impl_->dir.get(), &unlisted));
    if (!unlisted.empty()) {
      std::string side = impl_->tmp + ".dirs";
      UniqueFd fd(open(side.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd) return ErrnoError("create \"" + side + "\"");
      DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), unlisted, side));
    }
  }
  impl_->dir.Reset();
  done_ = true;
  StatusOr<LayerInfo> info = store_->AddLayer(impl_->tmp, digest, size, fmt);
  (void)RemoveTree(impl_->tmp);  // what AddLayer did not move into place
  unlink((impl_->tmp + ".dirs").c_str());
  return info;
}

// ---------------------------------------------------------------------------------------------
// ImageStore

ImageStore::Lease::Lease(ImageStore* s) : s_(s) {
  MutexLock l(s_->mu_);
  ++s_->leases_;
}

ImageStore::Lease::~Lease() {
  MutexLock l(s_->mu_);
  --s_->leases_;
}

StatusOr<std::unique_ptr<ImageStore>> ImageStore::Open(StoreOptions opts) {
  if (opts.root.empty() || opts.root[0] != '/')
    return InvalidArgument("image store root must be an absolute path");
  std::unique_ptr<ImageStore> s(new ImageStore(std::move(opts)));
  DSEC_RETURN_IF_ERROR(MakeDirs(s->opts_.root + "/layers", 0700));
  // Whatever a crash left half made.
  DSEC_RETURN_IF_ERROR(RemoveTree(s->opts_.root + "/tmp"));
  DSEC_RETURN_IF_ERROR(MakeDirs(s->opts_.root + "/tmp", 0700));
  DSEC_RETURN_IF_ERROR(s->Load());
  return s;
}

ImageStore::~ImageStore() = default;

std::string ImageStore::LayerDir(const std::string& digest) const {
  return opts_.root + "/layers/" + digest.substr(7);
}

std::string ImageStore::TempPath(const std::string& what) {
  MutexLock l(mu_);
  return opts_.root + "/tmp/" + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(++tmp_seq_) + "-" + RandomHex(4);
}

Status ImageStore::Load() {
  MutexLock l(mu_);  // in Open, before the store is anyone else's: taken for the analysis
  std::string path = opts_.root + "/index.json";
  if (access(path.c_str(), F_OK) < 0) return SaveLocked();
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 64 << 20));
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return InternalError("image index \"" + path + "\" is not valid JSON");
  if (auto it = j.find("layers"); it != j.end() && it->is_array()) {
    for (const auto& l : *it) {
      LayerInfo info;
      info.digest = l.value("digest", "");
      info.size = l.value("size", uint64_t{0});
      auto format = ParseLayerFormat(l.value("format", "dir"));
      if (!ValidDigest(info.digest) || !format.ok()) continue;
      info.format = *format;
      info.blob = l.value("blob", "");
      info.blob_size = l.value("blob_size", uint64_t{0});
      if (!info.blob.empty() && !ValidDigest(info.blob)) info.blob.clear();
      std::string p = LayerDir(info.digest) + LayerSuffix(info.format);
      if (access(p.c_str(), F_OK) < 0) {
        DSEC_LOG_WARN("image store: layer {} is missing from disk; dropped", info.digest);
        continue;
      }
      layers_[info.digest] = info;
    }
  }
  if (auto it = j.find("images"); it != j.end() && it->is_array()) {
    for (const auto& i : *it) {
      Image img;
      img.name = i.value("name", "");
      img.base = i.value("base", "");
      img.source = i.value("source", "import");
      img.created_at = i.value("created_at", int64_t{0});
      img.project = i.value("project", "");
      img.cached = i.value("cached", false);
      img.published = i.value("published", false);
      img.config = ConfigFromJson(i.value("config", Json::object()));
      bool whole = true;
      for (const auto& d : i.value("layers", Json::array())) {
        if (!d.is_string() || !layers_.count(d.get<std::string>())) whole = false;
        if (d.is_string()) img.layers.push_back(d.get<std::string>());
      }
      if (!whole) {
        DSEC_LOG_WARN("image store: image {} lost a layer; dropped", img.name);
        continue;
      }
      images_[img.name] = std::move(img);
    }
  }
  if (auto it = j.find("holders"); it != j.end() && it->is_object()) {
    for (const auto& [holder, ds] : it->items()) {
      std::vector<std::string> v;
      for (const auto& d : ds)
        if (d.is_string() && layers_.count(d.get<std::string>())) v.push_back(d.get<std::string>());
      holders_[holder] = std::move(v);
    }
  }
  // Layers on disk that the index does not know (a crash between the rename and the index
  // write) are removed by the next Collect() as unreferenced... once they are known.
  if (auto names = ListDir(opts_.root + "/layers"); names.ok()) {
    for (const auto& n : *names) {
      std::string hex = n.substr(0, n.find('.'));
      std::string digest = "sha256:" + hex;
      if (!ValidDigest(digest) || layers_.count(digest)) continue;
      std::string p = opts_.root + "/layers/" + n;
      (void)(n.find('.') == std::string::npos
                 ? RemoveTree(p)
                 : Status(unlink(p.c_str()) == 0 ? OkStatus() : ErrnoError("unlink")));
    }
  }
  return SaveLocked();
}

Status ImageStore::SaveLocked() {
  Json j;
  j["version"] = 1;
  j["layers"] = Json::array();
  for (const auto& [d, l] : layers_) {
    j["layers"].push_back({{"digest", d}, {"size", l.size}, {"format", LayerFormatName(l.format)}});
    if (!l.blob.empty()) {
      j["layers"].back()["blob"] = l.blob;
      j["layers"].back()["blob_size"] = l.blob_size;
    }
  }
  j["images"] = Json::array();
  for (const auto& [n, i] : images_) {
    j["images"].push_back({{"name", i.name},
                           {"base", i.base},
                           {"layers", i.layers},
                           {"config", ConfigToJson(i.config)},
                           {"source", i.source},
                           {"created_at", i.created_at}});
    if (!i.project.empty()) j["images"].back()["project"] = i.project;
    if (i.cached) j["images"].back()["cached"] = true;
    if (i.published) j["images"].back()["published"] = true;
  }
  j["holders"] = Json::object();
  for (const auto& [h, ds] : holders_) j["holders"][h] = ds;
  std::string path = opts_.root + "/index.json";
  std::string tmp = path + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return ErrnoError("open \"" + tmp + "\"");
  DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), j.dump(), tmp));
  if (fsync(fd.get()) < 0) return ErrnoError("fsync \"" + tmp + "\"");
  fd.Reset();
  if (rename(tmp.c_str(), path.c_str()) < 0) return ErrnoError("rename \"" + tmp + "\"");
  return OkStatus();
}

StatusOr<std::unique_ptr<LayerBuilder>> ImageStore::NewLayer(bool skip_dev_nodes) {
  std::unique_ptr<LayerBuilder> b(new LayerBuilder(this));
  b->impl_ = std::make_unique<LayerBuilder::Impl>();
  auto& im = *b->impl_;
  im.tmp = TempPath("layer");
  if (mkdir(im.tmp.c_str(), 0700) < 0) return ErrnoError("mkdir \"" + im.tmp + "\"");
  im.dir.Reset(open(im.tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!im.dir) return ErrnoError("open \"" + im.tmp + "\"");
  // The root too is unlisted until a "./" entry says otherwise; its mode is not the umask's.
  if (fchown(im.dir.get(), kUnlistedOwner, kUnlistedOwner) < 0 || fchmod(im.dir.get(), 0755) < 0)
    return ErrnoError("chown \"" + im.tmp + "\"");
  archive::TarExtractOptions o;
  o.uid = kUnlistedOwner;  // only directories the extractor makes unasked get these
  o.gid = kUnlistedOwner;
  o.image_layer = true;
  o.hook = &im.whiteouts;
  o.skip_dev_nodes = skip_dev_nodes;
  o.max_total_bytes = opts_.max_layer_bytes;
  o.max_entries = opts_.max_layer_entries;
  im.tar = std::make_unique<archive::TarExtractor>(im.dir.get(), o);
  im.md = EVP_MD_CTX_new();
  if (!im.md || EVP_DigestInit_ex(im.md, EVP_sha256(), nullptr) != 1)
    return InternalError("sha256 init failed");
  return b;
}

StatusOr<LayerInfo> ImageStore::AddLayer(const std::string& tmp_dir, const std::string& digest,
                                         uint64_t size, LayerFormat format) {
  {
    MutexLock l(mu_);
    if (auto it = layers_.find(digest); it != layers_.end()) return it->second;  // deduplicated
  }
  std::string final_path = LayerDir(digest);
  std::string staged = tmp_dir;
  if (format == LayerFormat::kErofs) {
    staged = tmp_dir + ".erofs";
    DSEC_RETURN_IF_ERROR(MakeErofs(opts_.mkfs_erofs, staged, tmp_dir));
    final_path += ".erofs";
  }
  MutexLock l(mu_);
  if (auto it = layers_.find(digest); it != layers_.end()) {  // another import won the race
    if (format == LayerFormat::kErofs) unlink(staged.c_str());
    return it->second;
  }
  // The unlisted directories first: a layer is never in place without them.
  std::string side = tmp_dir + ".dirs", final_side = LayerDir(digest) + ".dirs";
  if (rename(side.c_str(), final_side.c_str()) < 0 && errno != ENOENT) {
    Status s = ErrnoError("rename \"" + side + "\" -> \"" + final_side + "\"");
    if (format == LayerFormat::kErofs) unlink(staged.c_str());
    return s;
  }
  if (rename(staged.c_str(), final_path.c_str()) < 0) {
    Status s = ErrnoError("rename \"" + staged + "\" -> \"" + final_path + "\"");
    if (format == LayerFormat::kErofs) unlink(staged.c_str());
    unlink(final_side.c_str());
    return s;
  }
  LayerInfo info{digest, size, format};
  layers_[digest] = info;
  DSEC_RETURN_IF_ERROR(SaveLocked());
  return info;
}

StatusOr<LayerInfo> ImageStore::GetLayer(const std::string& digest) {
  MutexLock l(mu_);
  auto it = layers_.find(digest);
  if (it == layers_.end()) return NotFound("layer " + digest + " not found");
  return it->second;
}

Status ImageStore::PutImage(Image img, bool replace) {
  DSEC_ASSIGN_OR_RETURN(img.name, NormalizeName(img.name));
  if (img.base != "" && img.base != "host")
    return InvalidArgument("image base \"" + img.base + "\": expected \"host\" or none");
  if (img.layers.size() > kMaxStackLayers)
    return InvalidArgument("an image may have at most " + std::to_string(kMaxStackLayers) +
                           " layers");
  if (img.layers.empty() && img.base.empty())
    return InvalidArgument("an image needs a base or at least one layer");
  if (img.created_at == 0) img.created_at = WallMs();
  MutexLock l(mu_);
  for (const auto& d : img.layers)
    if (!layers_.count(d)) return NotFound("layer " + d + " not found");
  if (!replace && images_.count(img.name))
    return Status(StatusCode::kAlreadyExists, "image \"" + img.name + "\" already exists");
  images_[img.name] = std::move(img);
  return SaveLocked();
}

StatusOr<Image> ImageStore::GetImage(const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(std::string n, NormalizeName(name));
  MutexLock l(mu_);
  auto it = images_.find(n);
  if (it == images_.end()) return NotFound("image \"" + n + "\" not found");
  return it->second;
}

std::vector<Image> ImageStore::ListImages() {
  MutexLock l(mu_);
  std::vector<Image> out;
  for (const auto& [n, i] : images_) out.push_back(i);
  return out;
}

Status ImageStore::DeleteImage(const std::string& name) {
  DSEC_ASSIGN_OR_RETURN(std::string n, NormalizeName(name));
  MutexLock l(mu_);
  if (!images_.erase(n)) return NotFound("image \"" + n + "\" not found");
  return SaveLocked();
}

int ImageStore::InUse(const Image& img) {
  MutexLock l(mu_);
  int n = 0;
  for (const auto& [h, ds] : holders_)
    for (const auto& d : img.layers)
      if (std::find(ds.begin(), ds.end(), d) != ds.end()) {
        ++n;
        break;
      }
  return n;
}

uint64_t ImageStore::ImageSize(const Image& img) {
  MutexLock l(mu_);
  uint64_t n = 0;
  for (const auto& d : img.layers)
    if (auto it = layers_.find(d); it != layers_.end()) n += it->second.size;
  return n;
}

StatusOr<Stack> ImageStore::Acquire(const std::vector<std::string>& names,
                                    const std::string& holder) {
  if (names.empty()) return InvalidArgument("no image given");
  MutexLock l(mu_);
  Stack st;
  std::vector<std::string> digests;
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == "host") {
      if (k != 0) return InvalidArgument("\"host\" can only be the first image of a stack");
      st.base = "host";
      continue;
    }
    if (StartsWith(names[k], "sha256:")) {  // a layer by digest (forks, snapshots' stacks)
      if (!layers_.count(names[k])) return NotFound("layer " + names[k] + " not found");
      digests.push_back(names[k]);
      continue;
    }
    DSEC_ASSIGN_OR_RETURN(std::string n, NormalizeName(names[k]));
    auto it = images_.find(n);
    if (it == images_.end()) return NotFound("image \"" + n + "\" not found");
    const Image& img = it->second;
    if (k == 0) {
      st.base = img.base;
    } else if (!img.base.empty() && img.base != st.base) {
      return InvalidArgument("image \"" + n + "\" is based on \"" + img.base +
                             "\" and cannot be stacked on \"" + names[0] + "\"");
    }
    // An image made from the stack below (a snapshot) repeats its layers: only its own count.
    size_t skip = 0;
    if (img.layers.size() >= digests.size() &&
        std::equal(digests.begin(), digests.end(), img.layers.begin()))
      skip = digests.size();
    for (size_t i = skip; i < img.layers.size(); ++i) digests.push_back(img.layers[i]);
    const ImageConfig& c = img.config;
    for (const auto& e : c.env) {
      std::string key = e.substr(0, e.find('='));
      std::erase_if(st.config.env,
                    [&](const std::string& x) { return x.substr(0, x.find('=')) == key; });
      st.config.env.push_back(e);
    }
    if (!c.workdir.empty()) st.config.workdir = c.workdir;
    if (!c.user.empty()) st.config.user = c.user;
    if (!c.entrypoint.empty()) st.config.entrypoint = c.entrypoint;
    if (!c.cmd.empty()) st.config.cmd = c.cmd;
  }
  // A layer listed twice counts once, where it is topmost.
  std::vector<std::string> uniq;
  for (size_t i = digests.size(); i-- > 0;)
    if (std::find(uniq.begin(), uniq.end(), digests[i]) == uniq.end()) uniq.push_back(digests[i]);
  std::reverse(uniq.begin(), uniq.end());
  if (uniq.size() > kMaxStackLayers)
    return InvalidArgument("the stack has " + std::to_string(uniq.size()) + " layers; at most " +
                           std::to_string(kMaxStackLayers));
  if (st.base.empty() && uniq.empty()) return InvalidArgument("the image stack is empty");
  for (const auto& d : uniq) st.layers.push_back(layers_.at(d));
  if (!holder.empty() && !uniq.empty()) {
    holders_[holder] = uniq;
    DSEC_RETURN_IF_ERROR(SaveLocked());
  }
  return st;
}

Status ImageStore::Hold(const std::string& holder, const std::vector<std::string>& digests) {
  MutexLock l(mu_);
  for (const auto& d : digests)
    if (!layers_.count(d)) return NotFound("layer " + d + " not found");
  if (digests.empty()) {
    if (!holders_.erase(holder)) return OkStatus();
  } else {
    holders_[holder] = digests;
  }
  return SaveLocked();
}

void ImageStore::Release(const std::string& holder) {
  MutexLock l(mu_);
  if (holders_.erase(holder)) {
    if (Status s = SaveLocked(); !s.ok())
      DSEC_LOG_WARN("image store: saving the index failed: {}", s.ToString());
  }
}

void ImageStore::RetainHolders(const std::set<std::string>& alive) {
  MutexLock l(mu_);
  size_t before = holders_.size();
  std::erase_if(holders_, [&](const auto& kv) { return !alive.count(kv.first); });
  if (holders_.size() != before) (void)SaveLocked();
}

std::vector<std::string> ImageStore::HeldBy(const std::string& holder) {
  MutexLock l(mu_);
  auto it = holders_.find(holder);
  return it == holders_.end() ? std::vector<std::string>{} : it->second;
}

std::vector<std::string> ImageStore::HolderNames() {
  MutexLock l(mu_);
  std::vector<std::string> out;
  out.reserve(holders_.size());
  for (const auto& [h, ds] : holders_) out.push_back(h);
  return out;
}

bool ImageStore::ReferencedLocked(const std::string& digest) const {
  for (const auto& [n, i] : images_)
    if (std::find(i.layers.begin(), i.layers.end(), digest) != i.layers.end()) return true;
  for (const auto& [h, ds] : holders_)
    if (std::find(ds.begin(), ds.end(), digest) != ds.end()) return true;
  return false;
}

StatusOr<int> ImageStore::Collect() {
  std::vector<std::pair<std::string, std::string>> doomed;  // path, digest
  {
    MutexLock l(mu_);
    if (leases_ > 0) return 0;  // an import may be about to reference a fresh layer
    for (auto it = layers_.begin(); it != layers_.end();) {
      if (ReferencedLocked(it->first)) {
        ++it;
        continue;
      }
      doomed.emplace_back(LayerDir(it->first) + LayerSuffix(it->second.format), it->first);
      erofs_mounts_.erase(it->first);  // sandboxes' clones keep the device while they live
      erofs_builds_.erase(it->first);
      it = layers_.erase(it);
    }
    if (doomed.empty()) return 0;
    DSEC_RETURN_IF_ERROR(SaveLocked());
  }
  for (const auto& [path, digest] : doomed) {
    unlink((LayerDir(digest) + ".dirs").c_str());
    bool file = path.size() > 6 && path.compare(path.size() - 6, 6, ".erofs") == 0;
    Status s = file ? (unlink(path.c_str()) == 0 ? OkStatus() : ErrnoError("unlink " + path))
                    : RemoveTree(path);
    if (!file) unlink((path + ".erofs").c_str());  // its copy for stacking on the host image
    if (!s.ok()) DSEC_LOG_WARN("image store: removing layer {}: {}", digest, s.ToString());
  }
  return static_cast<int>(doomed.size());
}

Status ImageStore::SetPublished(const std::string& name) {
  MutexLock l(mu_);
  auto it = images_.find(name);
  if (it == images_.end()) return NotFound("image \"" + name + "\" not found");
  it->second.published = true;
  return SaveLocked();
}

std::string ImageStore::BlobPath(const LayerInfo& layer) const {
  return LayerDir(layer.digest) + ".erofs";
}

StatusOr<LayerInfo> ImageStore::Blob(const std::string& digest) {
  DSEC_ASSIGN_OR_RETURN(LayerInfo layer, GetLayer(digest));
  if (!layer.blob.empty()) return layer;
  DSEC_ASSIGN_OR_RETURN(std::string path, ErofsFile(layer));
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open \"" + path + "\"");
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(md);
    return InternalError("sha256 init failed");
  }
  std::string buf(1 << 20, '\0');
  uint64_t size = 0;
  for (;;) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      EVP_MD_CTX_free(md);
      return ErrnoError("read \"" + path + "\"");
    }
    if (n == 0) break;
    EVP_DigestUpdate(md, buf.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md, out, &len);
  EVP_MD_CTX_free(md);
  MutexLock l(mu_);
  auto it = layers_.find(digest);
  if (it == layers_.end()) return NotFound("layer " + digest + " not found");
  it->second.blob = "sha256:" + Hex(out, len);
  it->second.blob_size = size;
  DSEC_RETURN_IF_ERROR(SaveLocked());
  return it->second;
}

StatusOr<LayerInfo> ImageStore::AddBlobLayer(const std::string& file, LayerInfo info) {
  if (!ValidDigest(info.digest) || !ValidDigest(info.blob))
    return InvalidArgument("a layer blob needs a digest and a blob digest");
  info.format = LayerFormat::kErofs;
  MutexLock l(mu_);
  if (auto it = layers_.find(info.digest); it != layers_.end()) {  // it came meanwhile
    unlink(file.c_str());
    return it->second;
  }
  std::string final_path = BlobPath(info);
  if (rename(file.c_str(), final_path.c_str()) < 0) {
    Status s = ErrnoError("rename \"" + file + "\" -> \"" + final_path + "\"");
    unlink(file.c_str());
    return s;
  }
  layers_[info.digest] = info;
  DSEC_RETURN_IF_ERROR(SaveLocked());
  return info;
}

std::vector<LayerInfo> ImageStore::BlobLayers() {
  MutexLock l(mu_);
  std::vector<LayerInfo> out;
  for (const auto& [d, info] : layers_)
    if (!info.blob.empty()) out.push_back(info);
  return out;
}

bool ImageStore::Held(const std::string& digest) {
  MutexLock l(mu_);
  for (const auto& [h, ds] : holders_)
    if (std::find(ds.begin(), ds.end(), digest) != ds.end()) return true;
  return false;
}

StatusOr<std::string> ImageStore::ErofsFile(const LayerInfo& layer) {
  std::string img = LayerDir(layer.digest) + ".erofs";
  if (layer.format == LayerFormat::kErofs) return img;
  // A directory layer gets an EROFS copy, once: for stacking on the host image (overlayfs
  // refuses a layer inside the filesystem of another) and as a microVM's block device.
  std::shared_ptr<Mutex> building;
  {
    MutexLock l(mu_);
    auto& slot = erofs_builds_[layer.digest];
    if (!slot) slot = std::make_shared<Mutex>();
    building = slot;
  }
  MutexLock b(*building);
  if (access(img.c_str(), F_OK) != 0) {
    std::string tmp = TempPath("erofs") + ".erofs";
    DSEC_RETURN_IF_ERROR(MakeErofs(opts_.mkfs_erofs, tmp, LayerDir(layer.digest)));
    if (rename(tmp.c_str(), img.c_str()) < 0) {
      Status s = ErrnoError("rename \"" + tmp + "\"");
      unlink(tmp.c_str());
      return s;
    }
  }
  return img;
}

StatusOr<LayerSource> ImageStore::Source(const LayerInfo& layer, bool own_fs) {
  if (layer.format != LayerFormat::kErofs && !own_fs)
    return LayerSource{LayerDir(layer.digest), -1};
  DSEC_ASSIGN_OR_RETURN(std::string img, ErofsFile(layer));
  MutexLock l(mu_);
  if (!layers_.count(layer.digest)) return NotFound("layer " + layer.digest + " not found");
  auto it = erofs_mounts_.find(layer.digest);
  if (it == erofs_mounts_.end()) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd m, MountErofs(img));
    it = erofs_mounts_.emplace(layer.digest, std::make_shared<UniqueFd>(std::move(m))).first;
  }
  return LayerSource{".", it->second->get()};
}

}  // namespace dsec::images
