#include "images/import.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "agent/tar.h"
#include "base/file_util.h"
#include "base/strings.h"
#include "sys/syscalls.h"

namespace dsec::images {

using Json = nlohmann::json;

namespace {

constexpr size_t kChunk = 256 * 1024;
constexpr size_t kMaxJsonBytes = 4 << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Decoder

struct Decoder::Impl {
  enum class Kind { kUnknown, kRaw, kGzip, kZstd };
  Sink sink;
  Kind kind = Kind::kUnknown;
  std::string head;  // first bytes, until the kind is known
  z_stream zs{};
  bool z_init = false, z_ended = false;
  ZSTD_DCtx* zd = nullptr;
  size_t zstd_last = 0;
  std::vector<char> out = std::vector<char>(kChunk);

  ~Impl() {
    if (z_init) inflateEnd(&zs);
    if (zd) ZSTD_freeDCtx(zd);
  }

  Status Pick() {
    auto u = [&](size_t i) { return static_cast<unsigned char>(head[i]); };
    if (head.size() >= 2 && u(0) == 0x1f && u(1) == 0x8b) {
      kind = Kind::kGzip;
      if (inflateInit2(&zs, 15 + 16) != Z_OK) return InternalError("zlib init failed");
      z_init = true;
    } else if (head.size() >= 4 && u(0) == 0x28 && u(1) == 0xb5 && u(2) == 0x2f && u(3) == 0xfd) {
      kind = Kind::kZstd;
      zd = ZSTD_createDCtx();
      if (!zd) return InternalError("zstd init failed");
    } else {
      kind = Kind::kRaw;
    }
    std::string h = std::move(head);
    head.clear();
    return Push(h);
  }

  Status Push(std::string_view in) {
    switch (kind) {
      case Kind::kUnknown:
        return OkStatus();
      case Kind::kRaw:
        return in.empty() ? OkStatus() : sink(in);
      case Kind::kGzip:
        while (!in.empty()) {
          if (z_ended) {  // another gzip member follows
            if (inflateReset(&zs) != Z_OK) return InternalError("zlib reset failed");
            z_ended = false;
          }
          zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
          zs.avail_in = static_cast<uInt>(std::min<size_t>(in.size(), 1u << 30));
          size_t given = zs.avail_in;
          do {
            zs.next_out = reinterpret_cast<Bytef*>(out.data());
            zs.avail_out = static_cast<uInt>(out.size());
            int r = inflate(&zs, Z_NO_FLUSH);
            if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
              return InvalidArgument(std::string("gzip: ") + (zs.msg ? zs.msg : "corrupt data"));
            size_t produced = out.size() - zs.avail_out;
            if (produced) DSEC_RETURN_IF_ERROR(sink(std::string_view(out.data(), produced)));
            if (r == Z_STREAM_END) {
              z_ended = true;
              break;
            }
            if (r == Z_BUF_ERROR && produced == 0) break;
          } while (zs.avail_in > 0 || zs.avail_out == 0);
          in.remove_prefix(given - zs.avail_in);
        }
        return OkStatus();
      case Kind::kZstd: {
        if (in.empty()) return OkStatus();
        ZSTD_inBuffer ib{in.data(), in.size(), 0};
        bool full = false;
        do {  // until the input is used up and the decoder holds nothing back
          ZSTD_outBuffer ob{out.data(), out.size(), 0};
          size_t r = ZSTD_decompressStream(zd, &ob, &ib);
          if (ZSTD_isError(r)) return InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(r));
          zstd_last = r;
          if (ob.pos) DSEC_RETURN_IF_ERROR(sink(std::string_view(out.data(), ob.pos)));
          full = ob.pos == ob.size;
        } while (ib.pos < ib.size || full);
        return OkStatus();
      }
    }
    return OkStatus();
  }
};

Decoder::Decoder(Sink sink) : impl_(std::make_unique<Impl>()) { impl_->sink = std::move(sink); }
Decoder::~Decoder() = default;

Status Decoder::Feed(std::string_view in) {
  if (impl_->kind == Impl::Kind::kUnknown) {
    size_t take = std::min(in.size(), 4 - impl_->head.size());
    impl_->head.append(in.substr(0, take));
    in.remove_prefix(take);
    if (impl_->head.size() < 4) return OkStatus();
    DSEC_RETURN_IF_ERROR(impl_->Pick());
  }
  return impl_->Push(in);
}

Status Decoder::Finish() {
  if (impl_->kind == Impl::Kind::kUnknown) DSEC_RETURN_IF_ERROR(impl_->Pick());
  if (impl_->kind == Impl::Kind::kGzip && !impl_->z_ended)
    return InvalidArgument("gzip: the stream ends early");
  if (impl_->kind == Impl::Kind::kZstd && impl_->zstd_last != 0)
    return InvalidArgument("zstd: the stream ends early");
  return OkStatus();
}

const char* Decoder::kind() const {
  switch (impl_->kind) {
    case Impl::Kind::kGzip:
      return "gzip";
    case Impl::Kind::kZstd:
      return "zstd";
    case Impl::Kind::kRaw:
      return "raw";
    default:
      return "unknown";
  }
}

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

// Opens `rel` inside the unpacked archive; symlinks and ".." stay inside it.
StatusOr<UniqueFd> OpenIn(int root, const std::string& rel) {
  int fd = sys::Openat2(root, rel.c_str(), O_RDONLY | O_CLOEXEC, 0,
                        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS);
  if (fd < 0) return ErrnoError("open \"" + rel + "\" in the archive");
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgument("\"" + rel + "\" in the archive is not a regular file");
  }
  return UniqueFd(fd);
}

StatusOr<Json> ReadJson(int root, const std::string& rel) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenIn(root, rel));
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFdToString(fd.get(), rel, kMaxJsonBytes));
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("\"" + rel + "\" in the archive is not valid JSON");
  return j;
}

std::string BlobPath(const std::string& digest) { return "blobs/sha256/" + digest.substr(7); }

ImageConfig ConfigFromOci(const Json& cfg) {
  ImageConfig c;
  const Json* cj = nullptr;
  if (auto it = cfg.find("config"); it != cfg.end() && it->is_object()) cj = &*it;
  if (!cj) return c;
  auto strs = [&](const char* k) {
    std::vector<std::string> v;
    if (auto it = cj->find(k); it != cj->end() && it->is_array())
      for (const auto& e : *it)
        if (e.is_string()) v.push_back(e.get<std::string>());
    return v;
  };
  c.env = strs("Env");
  c.entrypoint = strs("Entrypoint");
  c.cmd = strs("Cmd");
  if (auto it = cj->find("WorkingDir"); it != cj->end() && it->is_string()) c.workdir = *it;
  if (auto it = cj->find("User"); it != cj->end() && it->is_string()) c.user = *it;
  return c;
}

}  // namespace

struct Importer::Impl {
  ImageStore* store;
  ImportOptions opts;
  ImageStore::Lease lease;
  std::string spool;
  UniqueFd spool_fd;
  uint64_t spooled = 0;
  std::unique_ptr<Decoder> dec;
  std::string unpacked;

  Impl(ImageStore* s, ImportOptions o) : store(s), opts(std::move(o)), lease(s) {}
  ~Impl() {
    spool_fd.Reset();
    if (!spool.empty()) unlink(spool.c_str());
    if (!unpacked.empty()) (void)RemoveTree(unpacked);
  }

  // Feeds one layer blob (compressed or not) through a LayerBuilder.
  StatusOr<LayerInfo> ImportLayer(int root, const std::string& rel, const std::string& blob_digest,
                                  const std::string& diff_id) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd fd, OpenIn(root, rel));
    DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer());
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
    if (!blob_digest.empty()) {
      static const char* hx = "0123456789abcdef";
      std::string got = "sha256:";
      for (unsigned i = 0; i < len; ++i) {
        got += hx[out[i] >> 4];
        got += hx[out[i] & 15];
      }
      if (got != blob_digest)
        return InvalidArgument("blob \"" + rel + "\" does not match its digest " + blob_digest);
    }
    return builder->Commit(diff_id, opts.layer_format);
  }

  StatusOr<Image> Rootfs() {
    DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer());
    std::vector<char> buf(kChunk);
    off_t off = 0;
    for (;;) {
      ssize_t n = pread(spool_fd.get(), buf.data(), buf.size(), off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read the spooled archive");
      if (n == 0) break;
      off += n;
      DSEC_RETURN_IF_ERROR(builder->Feed(std::string_view(buf.data(), static_cast<size_t>(n))));
    }
    DSEC_ASSIGN_OR_RETURN(LayerInfo layer, builder->Commit("", opts.layer_format));
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
    agent::TarExtractOptions o;
    o.uid = 0;
    o.gid = 0;
    o.max_total_bytes = opts.max_archive_bytes;
    o.max_entries = 100'000;
    agent::TarExtractor x(dir.get(), o);
    std::vector<char> buf(kChunk);
    off_t off = 0;
    for (;;) {
      ssize_t n = pread(spool_fd.get(), buf.data(), buf.size(), off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read the spooled archive");
      if (n == 0) break;
      off += n;
      DSEC_RETURN_IF_ERROR(x.Feed(std::string_view(buf.data(), static_cast<size_t>(n))));
    }
    DSEC_RETURN_IF_ERROR(x.Finish());
    // The spool is no longer needed: give its space back before the layers are made.
    spool_fd.Reset();
    unlink(spool.c_str());
    spool.clear();
    return OkStatus();
  }

  StatusOr<Image> Oci() {
    DSEC_RETURN_IF_ERROR(Unpack());
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, OpenDir(unpacked, O_RDONLY));
    DSEC_ASSIGN_OR_RETURN(Json index, ReadJson(root.get(), "index.json"));
    // index.json -> (a nested index ->) a manifest.
    Json manifest;
    for (int depth = 0; depth < 3; ++depth) {
      auto ms = index.find("manifests");
      if (ms == index.end() || !ms->is_array() || ms->empty())
        return InvalidArgument("OCI index has no manifests");
      const Json& m = (*ms)[0];
      std::string digest = m.value("digest", "");
      if (!ValidBlobDigest(digest)) return InvalidArgument("OCI index: bad manifest digest");
      DSEC_ASSIGN_OR_RETURN(Json next, ReadJson(root.get(), BlobPath(digest)));
      std::string mt = m.value("mediaType", next.value("mediaType", ""));
      if (mt.find("index") != std::string::npos || next.contains("manifests")) {
        index = std::move(next);
        continue;
      }
      manifest = std::move(next);
      break;
    }
    if (!manifest.is_object()) return InvalidArgument("OCI index: no image manifest found");
    std::string cfg_digest =
        manifest.contains("config") ? manifest["config"].value("digest", "") : "";
    if (!ValidBlobDigest(cfg_digest)) return InvalidArgument("OCI manifest: bad config digest");
    DSEC_ASSIGN_OR_RETURN(Json cfg, ReadJson(root.get(), BlobPath(cfg_digest)));
    std::vector<std::string> diff_ids;
    if (cfg.contains("rootfs") && cfg["rootfs"].contains("diff_ids"))
      for (const auto& d : cfg["rootfs"]["diff_ids"])
        if (d.is_string()) diff_ids.push_back(d.get<std::string>());
    auto layers = manifest.find("layers");
    if (layers == manifest.end() || !layers->is_array())
      return InvalidArgument("OCI manifest has no layers list");
    if (!diff_ids.empty() && diff_ids.size() != layers->size())
      return InvalidArgument("OCI config lists " + std::to_string(diff_ids.size()) +
                             " diff_ids for " + std::to_string(layers->size()) + " layers");
    Image img;
    img.name = opts.name;
    img.config = ConfigFromOci(cfg);
    img.source = "import";
    for (size_t i = 0; i < layers->size(); ++i) {
      std::string digest = (*layers)[i].value("digest", "");
      if (!ValidBlobDigest(digest)) return InvalidArgument("OCI manifest: bad layer digest");
      std::string diff = i < diff_ids.size() ? diff_ids[i] : "";
      DSEC_ASSIGN_OR_RETURN(LayerInfo l, ImportLayer(root.get(), BlobPath(digest), digest, diff));
      img.layers.push_back(l.digest);
    }
    return img;
  }

  StatusOr<Image> Docker() {
    DSEC_RETURN_IF_ERROR(Unpack());
    DSEC_ASSIGN_OR_RETURN(UniqueFd root, OpenDir(unpacked, O_RDONLY));
    DSEC_ASSIGN_OR_RETURN(Json manifest, ReadJson(root.get(), "manifest.json"));
    if (!manifest.is_array() || manifest.empty() || !manifest[0].is_object())
      return InvalidArgument("docker manifest.json lists no image");
    const Json& m = manifest[0];
    std::string cfg_path = m.value("Config", "");
    if (cfg_path.empty()) return InvalidArgument("docker manifest.json has no Config");
    DSEC_ASSIGN_OR_RETURN(Json cfg, ReadJson(root.get(), cfg_path));
    std::vector<std::string> diff_ids;
    if (cfg.contains("rootfs") && cfg["rootfs"].contains("diff_ids"))
      for (const auto& d : cfg["rootfs"]["diff_ids"])
        if (d.is_string()) diff_ids.push_back(d.get<std::string>());
    auto layers = m.find("Layers");
    if (layers == m.end() || !layers->is_array())
      return InvalidArgument("docker manifest.json has no Layers");
    if (!diff_ids.empty() && diff_ids.size() != layers->size())
      return InvalidArgument("docker config lists " + std::to_string(diff_ids.size()) +
                             " diff_ids for " + std::to_string(layers->size()) + " layers");
    Image img;
    img.name = opts.name;
    img.config = ConfigFromOci(cfg);
    img.source = "import";
    for (size_t i = 0; i < layers->size(); ++i) {
      if (!(*layers)[i].is_string()) return InvalidArgument("docker manifest: bad layer path");
      std::string path = (*layers)[i].get<std::string>();
      std::string diff = i < diff_ids.size() ? diff_ids[i] : "";
      DSEC_ASSIGN_OR_RETURN(LayerInfo l, ImportLayer(root.get(), path, "", diff));
      img.layers.push_back(l.digest);
    }
    return img;
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
  if (!opts.layer_format.empty() && opts.layer_format != "dir" && opts.layer_format != "erofs")
    return InvalidArgument("layer format \"" + opts.layer_format + "\": expected dir or erofs");
  if (!opts.base.empty() && opts.base != "host")
    return InvalidArgument("base \"" + opts.base + "\": expected \"host\" or none");
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

StatusOr<Image> Importer::Finish() {
  Impl& im = *impl_;
  DSEC_RETURN_IF_ERROR(im.dec->Finish());
  if (im.spooled == 0) return InvalidArgument("the archive is empty");
  std::string format = im.opts.format;
  if (format == "auto") {
    DSEC_ASSIGN_OR_RETURN(std::set<std::string> top, TopLevelNames(im.spool_fd.get()));
    if (top.count("oci-layout") || top.count("index.json"))
      format = "oci";
    else if (top.count("manifest.json"))
      format = "docker";
    else
      format = "rootfs";
  }
  StatusOr<Image> img = format == "oci" ? im.Oci() : format == "docker" ? im.Docker() : im.Rootfs();
  if (!img.ok()) return img.status().WithContext("import " + format + " archive");
  if (format != "rootfs" && !im.opts.base.empty()) img->base = im.opts.base;
  DSEC_RETURN_IF_ERROR(im.store->PutImage(*img));
  return im.store->GetImage(img->name);
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
