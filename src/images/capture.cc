#include "images/capture.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "base/unique_fd.h"

namespace dsec::images {

namespace {

constexpr size_t kMaxPath = 4096;
constexpr int kMaxDepth = 1024;
constexpr size_t kCaptureChunk = 256 * 1024;
// NULs that fill `size` bytes up to the next 512-byte block.
size_t Padding(uint64_t size) { return static_cast<size_t>((512 - size % 512) % 512); }

// Files whose holes add up to less than this are written whole.
constexpr uint64_t kSparseMinHole = 64 * 1024;

void PutOctal(char* field, size_t width, uint64_t v) {
  // width-1 octal digits and a NUL.
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (v & 7));
    v >>= 3;
  }
  field[width - 1] = '\0';
}

void PaxRecord(std::string* out, const std::string& key, const std::string& value) {
  size_t body = 1 + key.size() + 1 + value.size() + 1;
  size_t len = body + std::to_string(body).size();
  len = body + std::to_string(len).size();
  *out += std::to_string(len) + " " + key + "=" + value + "\n";
}

struct Entry {
  std::string name;  // archive path, relative, no leading "/"
  char type = '0';
  uint64_t mode = 0, uid = 0, gid = 0, size = 0;
  int64_t mtime = 0;
  std::string link;
  std::string sparse_name;   // set: a PAX 1.0 sparse entry of this real name...
  uint64_t sparse_size = 0;  // ...and real size
};

// A file's data regions (offset, length), from SEEK_DATA/SEEK_HOLE; empty regions are dropped.
std::vector<std::pair<uint64_t, uint64_t>> DataRegions(int fd, uint64_t size) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  off_t pos = 0;
  while (static_cast<uint64_t>(pos) < size) {
    off_t data = lseek(fd, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // only a hole is left
      return {{0, size}};         // no hole support: all data
    }
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = static_cast<off_t>(size);
    hole = std::min<off_t>(hole, static_cast<off_t>(size));
    if (hole > data)
      out.emplace_back(static_cast<uint64_t>(data), static_cast<uint64_t>(hole - data));
    pos = hole;
  }
  return out;
}

std::string Header(const Entry& e) {
  std::string pax;
  if (!e.sparse_name.empty()) {
    PaxRecord(&pax, "GNU.sparse.major", "1");
    PaxRecord(&pax, "GNU.sparse.minor", "0");
    PaxRecord(&pax, "GNU.sparse.name", e.sparse_name);
    PaxRecord(&pax, "GNU.sparse.realsize", std::to_string(e.sparse_size));
  }
  if (e.name.size() > 99) PaxRecord(&pax, "path", e.name);
  if (e.link.size() > 99) PaxRecord(&pax, "linkpath", e.link);
  if (e.size > 077777777777ull) PaxRecord(&pax, "size", std::to_string(e.size));
  if (e.uid > 07777777) PaxRecord(&pax, "uid", std::to_string(e.uid));
  if (e.gid > 07777777) PaxRecord(&pax, "gid", std::to_string(e.gid));
  std::string out;
  auto block = [](const std::string& name, char type, uint64_t mode, uint64_t uid, uint64_t gid,
                  uint64_t size, int64_t mtime, const std::string& link) {
    std::string b(512, '\0');
    memcpy(b.data(), name.data(), std::min<size_t>(name.size(), 100));
    PutOctal(b.data() + 100, 8, mode & 07777);
    PutOctal(b.data() + 108, 8, std::min<uint64_t>(uid, 07777777));
    PutOctal(b.data() + 116, 8, std::min<uint64_t>(gid, 07777777));
    PutOctal(b.data() + 124, 12, std::min<uint64_t>(size, 077777777777ull));
    PutOctal(b.data() + 136, 12, static_cast<uint64_t>(std::max<int64_t>(0, mtime)));
    b[156] = type;
    memcpy(b.data() + 157, link.data(), std::min<size_t>(link.size(), 100));
    memcpy(b.data() + 257,
           "ustar\0"
           "00",
           8);
    memset(b.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : b) sum += c;
    PutOctal(b.data() + 148, 7, sum);
    b[155] = ' ';
    return b;
  };
  if (!pax.empty()) {
    out += block("PaxHeaders/" + e.name.substr(0, 80), 'x', 0644, 0, 0, pax.size(), e.mtime, "");
    out += pax;
    out.append(Padding(pax.size()), '\0');
  }
  out += block(e.name, e.type, e.mode, e.uid, e.gid, e.size, e.mtime, e.link);
  return out;
}

class Walker {
 public:
  Walker(const CaptureOptions& o, const std::function<Status(std::string_view)>& sink,
         CaptureStats* st)
      : opts_(o), sink_(sink), stats_(st) {}

  Status Source(const CaptureSource& src) {
    std::string prefix = src.prefix;
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    struct stat st;
    if (fstat(src.dirfd, &st) < 0) return ErrnoError("stat upper dir");
    // The directory itself ("./" for the root).
    Entry e;
    e.name = prefix.empty() ? "./" : prefix.substr(1) + "/";
    e.type = '5';
    Fill(&e, st);
    DSEC_RETURN_IF_ERROR(Emit(e));
    // A new open file description: the directory is read from its start whatever the
    // caller's fd did before (a dup would share its offset).
    UniqueFd dir(openat(src.dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return ErrnoError("reopen upper dir");
    if (Opaque(dir.get())) DSEC_RETURN_IF_ERROR(Whiteout(prefix, ".wh..opq"));
    if (Listed(opts_.empty, prefix.empty() ? "/" : prefix)) return OkStatus();
    return Dir(std::move(dir), prefix, 0);
  }

 private:
  static bool Listed(const std::vector<std::string>& v, const std::string& p) {
    return std::find(v.begin(), v.end(), p) != v.end();
  }

  uint64_t MapId(uint64_t id) const {
    if (opts_.id_base == 0) return id;
    if (id >= opts_.id_base && id < uint64_t{opts_.id_base} + 65536) return id - opts_.id_base;
    return 65534;
  }

  void Fill(Entry* e, const struct stat& st) {
    e->mode = st.st_mode & 07777;
    if (S_ISREG(st.st_mode) && !opts_.keep_setuid && (e->mode & 06000)) {
      e->mode &= ~uint64_t{06000};
      ++stats_->setuid_dropped;
    }
    e->uid = MapId(st.st_uid);
    e->gid = MapId(st.st_gid);
    e->mtime = st.st_mtim.tv_sec;
  }

  static bool Opaque(int dirfd) {
    char v[4] = {};
    for (const char* key : {"user.overlay.opaque", "trusted.overlay.opaque"}) {
      ssize_t n = fgetxattr(dirfd, key, v, sizeof v);
      if (n == 1 && v[0] == 'y') return true;
    }
    return false;
  }

  Status Emit(const Entry& e, int data_fd = -1) {
    DSEC_RETURN_IF_ERROR(sink_(Header(e)));
    ++stats_->entries;
    if (e.type != '0' || e.size == 0) return OkStatus();
    DSEC_RETURN_IF_ERROR(Copy(e, data_fd, 0, e.size));
    stats_->bytes += e.size;
    return Pad(e.size);
  }

  Status Pad(uint64_t size) {
    size_t pad = Padding(size);
    return pad ? sink_(std::string(pad, '\0')) : OkStatus();
  }

  // Streams [off, off + len) of the file.
  Status Copy(const Entry& e, int fd, uint64_t off, uint64_t len) {
    std::string buf(kCaptureChunk, '\0');
    while (len > 0) {
      ssize_t n =
          pread(fd, buf.data(), std::min<uint64_t>(len, buf.size()), static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read \"/" + e.name + "\"");
      if (n == 0) {  // shrank while read (it cannot while frozen): pad with zeros
        std::fill(buf.begin(), buf.end(), '\0');
        n = static_cast<ssize_t>(std::min<uint64_t>(len, buf.size()));
      }
      DSEC_RETURN_IF_ERROR(sink_(std::string_view(buf.data(), static_cast<size_t>(n))));
      len -= static_cast<uint64_t>(n);
      off += static_cast<uint64_t>(n);
    }
    return OkStatus();
  }

  // A regular file: a plain entry, or a sparse one when holes make up a part worth skipping.
  Status EmitFile(Entry e, int fd, uint64_t allocated) {
    stats_->apparent_bytes += e.size;
    if (opts_.max_apparent_bytes > 0 && stats_->apparent_bytes > opts_.max_apparent_bytes)
      return Status(StatusCode::kTooLarge,
                    "the files of the writable layer add up to more than " +
                        std::to_string(opts_.max_apparent_bytes) +
                        " bytes counting their holes (at \"/" + e.name +
                        "\"); a snapshot may hold at most that (image_max_layer_bytes)");
    if (e.size < 2 * kSparseMinHole || allocated + kSparseMinHole > e.size) return Emit(e, fd);
    auto regions = DataRegions(fd, e.size);
    uint64_t data = 0;
    for (const auto& r : regions) data += r.second;
    if (data + kSparseMinHole > e.size) return Emit(e, fd);
    // The map: count, then offset/length pairs, one per line; a last empty region at the real
    // size tells readers where the file ends when it ends in a hole.
    if (regions.empty() || regions.back().first + regions.back().second < e.size)
      regions.emplace_back(e.size, 0);
    std::string map = std::to_string(regions.size()) + "\n";
    for (const auto& [o, n] : regions) map += std::to_string(o) + "\n" + std::to_string(n) + "\n";
    map.append(Padding(map.size()), '\0');
    size_t slash = e.name.rfind('/');
    std::string dir = slash == std::string::npos ? "" : e.name.substr(0, slash + 1);
    e.sparse_name = e.name;
    e.sparse_size = e.size;
    e.name = dir + "GNUSparseFile.0/" + e.name.substr(dir.size());
    e.size = map.size() + data;
    DSEC_RETURN_IF_ERROR(sink_(Header(e)));
    ++stats_->entries;
    ++stats_->sparse_files;
    stats_->hole_bytes += e.sparse_size - data;
    DSEC_RETURN_IF_ERROR(sink_(map));
    for (const auto& [o, n] : regions) DSEC_RETURN_IF_ERROR(Copy(e, fd, o, n));
    stats_->bytes += data;
    return Pad(e.size);
  }

  Status Whiteout(const std::string& dir, const std::string& name) {
    Entry e;
    e.name = (dir.empty() ? "" : dir.substr(1) + "/") + ".wh." + name;
    e.type = '0';
    e.mode = 0644;
    ++stats_->whiteouts;
    return Emit(e);
  }

  Status Dir(UniqueFd dir, const std::string& path, int depth) {
    if (depth >= kMaxDepth) {
      ++stats_->skipped;
      return OkStatus();
    }
    std::vector<std::string> names;
    {
      int fd = fcntl(dir.get(), F_DUPFD_CLOEXEC, 3);
      if (fd < 0) return ErrnoError("dup \"" + path + "\"");
      DIR* d = fdopendir(fd);
      if (!d) {
        close(fd);
        return ErrnoError("opendir \"" + path + "\"");
      }
      while (dirent* de = readdir(d))
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
          names.emplace_back(de->d_name);
      closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      std::string child = path + "/" + name;
      if (child.size() > kMaxPath || Listed(opts_.skip, child)) {
        ++stats_->skipped;
        continue;
      }
      struct stat st;
      if (fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno == ENOENT) continue;
        return ErrnoError("stat \"" + child + "\"");
      }
      Entry e;
      e.name = child.substr(1);
      Fill(&e, st);
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
        DSEC_RETURN_IF_ERROR(Whiteout(path, name));
      } else if (S_ISDIR(st.st_mode)) {
        UniqueFd sub(
            openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub) return ErrnoError("open \"" + child + "\"");
        e.type = '5';
        e.name += "/";
        DSEC_RETURN_IF_ERROR(Emit(e));
        if (Opaque(sub.get())) DSEC_RETURN_IF_ERROR(Whiteout(child, ".wh..opq"));
        if (!Listed(opts_.empty, child))
          DSEC_RETURN_IF_ERROR(Dir(std::move(sub), child, depth + 1));
      } else if (S_ISLNK(st.st_mode)) {
        std::string target(kMaxPath + 1, '\0');
        ssize_t n = readlinkat(dir.get(), name.c_str(), target.data(), target.size());
        if (n < 0 || static_cast<size_t>(n) > kMaxPath) {
          ++stats_->skipped;
          continue;
        }
        target.resize(static_cast<size_t>(n));
        e.type = '2';
        e.link = target;
        DSEC_RETURN_IF_ERROR(Emit(e));
      } else if (S_ISREG(st.st_mode)) {
        if (st.st_nlink > 1) {
          auto key = std::make_pair(st.st_dev, st.st_ino);
          if (auto it = links_.find(key); it != links_.end()) {
            e.type = '1';
            e.link = it->second;
            DSEC_RETURN_IF_ERROR(Emit(e));
            continue;
          }
          links_[key] = e.name;
        }
        UniqueFd f(openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
        if (!f) return ErrnoError("open \"" + child + "\"");
        e.type = '0';
        e.size = static_cast<uint64_t>(st.st_size);
        DSEC_RETURN_IF_ERROR(EmitFile(e, f.get(), static_cast<uint64_t>(st.st_blocks) * 512));
      } else {
        ++stats_->skipped;  // FIFOs, sockets, devices
      }
    }
    return OkStatus();
  }

  const CaptureOptions& opts_;
  const std::function<Status(std::string_view)>& sink_;
  CaptureStats* stats_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;
};

}  // namespace

Status WriteLayerTar(const std::vector<CaptureSource>& sources, const CaptureOptions& opts,
                     const std::function<Status(std::string_view)>& sink, CaptureStats* stats) {
  CaptureStats local;
  if (!stats) stats = &local;
  Walker w(opts, sink, stats);
  for (const auto& s : sources) DSEC_RETURN_IF_ERROR(w.Source(s));
  return sink(std::string(1024, '\0'));
}

}  // namespace dsec::images
