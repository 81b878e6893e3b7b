#include "backends/microvm/template_files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <utility>
#include <vector>

#include "backends/microvm/microvm_backend.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/strings.h"

namespace dsec::backends::microvm {
namespace {

constexpr size_t kChunk = 1 << 20;

class Sha256 {
 public:
  Sha256() : md_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(md_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(md_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::string_view d) { EVP_DigestUpdate(md_, d.data(), d.size()); }
  std::string Hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(md_, out, &len);
    return HexEncode(std::string_view(reinterpret_cast<const char*>(out), len));
  }

 private:
  EVP_MD_CTX* md_;
};

// Copies the data regions (SEEK_DATA/SEEK_HOLE; holes stay holes) of `from` into `to` at the
// same offsets, digesting each region's offset and bytes. `size` is the logical size.
StatusOr<std::string> CopyData(int from, int to, uint64_t size, const std::string& what) {
  Sha256 sha;
  std::string buf(kChunk, '\0');
  off_t pos = 0;
  while (static_cast<uint64_t>(pos) < size) {
    off_t data = lseek(from, pos, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // only a hole is left
      return ErrnoError("seek the data of " + what);
    }
    off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0) return ErrnoError("seek a hole of " + what);
    hole = std::min<off_t>(hole, static_cast<off_t>(size));
    sha.Update(std::to_string(data) + ":");
    for (off_t at = data; at < hole;) {
      size_t want = static_cast<size_t>(std::min<off_t>(hole - at, static_cast<off_t>(kChunk)));
      ssize_t n = pread(from, buf.data(), want, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? ErrnoError("read " + what) : InternalError(what + " is short");
      std::string_view got(buf.data(), static_cast<size_t>(n));
      sha.Update(got);
      for (size_t done = 0; done < got.size();) {
        ssize_t w = pwrite(to, got.data() + done, got.size() - done, at + static_cast<off_t>(done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ErrnoError("write " + what);
        done += static_cast<size_t>(w);
      }
      at += n;
    }
    pos = hole;
  }
  return sha.Hex();
}

uint64_t SizeOf(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// A file's identity for the environment: its content's digest (the kernel, the initramfs), or
// for a binary found on PATH its resolved path, size and change time.
StatusOr<std::string> DigestFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open " + path);
  Sha256 sha;
  std::string buf(kChunk, '\0');
  for (;;) {
    ssize_t n = read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read " + path);
    if (n == 0) break;
    sha.Update(std::string_view(buf.data(), static_cast<size_t>(n)));
  }
  return sha.Hex();
}

std::string BinaryIdentity(const std::string& name) {
  std::vector<std::string> candidates;
  if (name.find('/') != std::string::npos) {
    candidates.push_back(name);
  } else {
    const char* path = getenv("PATH");
    for (auto d : SplitString(path ? path : "/usr/bin:/bin", ':', true))
      candidates.push_back(JoinPath(d, name));
  }
  for (const auto& c : candidates) {
    char real[PATH_MAX];
    struct stat st;
    if (realpath(c.c_str(), real) && stat(real, &st) == 0 && S_ISREG(st.st_mode))
      return StrCat({real, " ", std::to_string(st.st_size), " ", std::to_string(st.st_ctim.tv_sec),
                     ".", std::to_string(st.st_ctim.tv_nsec)});
  }
  return name;
}

Status SyncPath(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd || fsync(fd.get()) < 0) return ErrnoError("sync " + path);
  return OkStatus();
}

}  // namespace

Status TemplateFiles::Init(const std::string& kernel, const std::string& initramfs,
                           const std::string& qemu, const std::string& accel) {
  DSEC_RETURN_IF_ERROR(MakeDirs(dir_, 0700));
  DSEC_ASSIGN_OR_RETURN(std::string k, DigestFile(kernel));
  DSEC_ASSIGN_OR_RETURN(std::string i, DigestFile(initramfs));
  Sha256 env;
  env.Update(StrCat({"kernel ", k, "\ninitramfs ", i, "\nqemu ", BinaryIdentity(qemu), "\naccel ",
                     accel, "\nformat 1\n"}));
  env_ = env.Hex();
  if (auto names = ListDir(dir_); names.ok())
    for (const auto& n : *names)
      if (n.find(".tmp-") != std::string::npos) (void)RemoveTree(JoinPath(dir_, n));
  return OkStatus();
}

std::string TemplateFiles::NameOf(const std::string& key) const {
  Sha256 sha;
  sha.Update(env_ + "\n" + key);
  return sha.Hex().substr(0, 32);
}

StatusOr<std::unique_ptr<Template>> TemplateFiles::Load(const std::string& key) {
  if (env_.empty()) return FailedPrecondition("template files not initialised");
  const std::string dir = JoinPath(dir_, NameOf(key));
  auto meta_text = ReadFileToString(JoinPath(dir, "meta.json"), 64 << 10);
  if (!meta_text.ok()) {
    if (meta_text.status().code() == StatusCode::kNotFound) return meta_text.status();
    return meta_text.status().WithContext("template " + dir);
  }
  auto fail = [&](const std::string& why) -> Status {
    (void)RemoveTree(dir);
    return InternalError("template " + dir + " cannot be used (" + why + "): removed");
  };
  Json meta = Json::parse(*meta_text, nullptr, false);
  if (!meta.is_object() || meta.value("key", "") != key || meta.value("env", "") != env_)
    return fail("its meta.json is not this template's");
  auto out = std::make_unique<Template>();
  out->key = key;
  out->id = "tmpl-" + NameOf(key).substr(0, 12);
  out->ram_mb = meta.value("ram_mb", int64_t{0});
  out->state_bytes = meta.value("state_bytes", uint64_t{0});
  out->prepared = meta.value("prepared", std::string());
  if (out->ram_mb <= 0 || out->state_bytes == 0) return fail("bad sizes");
  out->ram.Reset(memfd_create("dsec-vm-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  out->state.Reset(memfd_create("dsec-vm-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!out->ram || !out->state) return ErrnoError("memfd_create");
  const uint64_t ram_bytes = static_cast<uint64_t>(out->ram_mb) << 20;
  if (ftruncate(out->ram.get(), static_cast<off_t>(ram_bytes)) < 0 ||
      ftruncate(out->state.get(), static_cast<off_t>(out->state_bytes)) < 0)
    return ErrnoError("size a template's memfds");
  for (auto [name, fd, size] : {std::tuple{"ram", out->ram.get(), ram_bytes},
                                std::tuple{"state", out->state.get(), out->state_bytes}}) {
    UniqueFd f(open(JoinPath(dir, name).c_str(), O_RDONLY | O_CLOEXEC));
    if (!f) return fail(std::string("no ") + name);
    if (SizeOf(f.get()) != size) return fail(std::string(name) + " has another size");
    auto sha = CopyData(f.get(), fd, size, std::string("the template's ") + name);
    if (!sha.ok()) return fail(sha.status().message());
    if (*sha != meta.value(std::string(name) + "_sha256", ""))
      return fail(std::string(name) + " digest");
  }
  for (int fd : {out->ram.get(), out->state.get()})
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
      return ErrnoError("seal a loaded template");
  // Used now: the last to go when pruning.
  (void)utimensat(AT_FDCWD, dir.c_str(), nullptr, 0);
  return out;
}

Status TemplateFiles::Save(const Template& t) {
  if (env_.empty()) return FailedPrecondition("template files not initialised");
  const std::string name = NameOf(t.key);
  const std::string tmp = JoinPath(dir_, name + ".tmp-" + RandomHex(6));
  auto cleanup = [&] { (void)RemoveTree(tmp); };
  Status s = [&]() -> Status {
    DSEC_RETURN_IF_ERROR(MakeDirs(tmp, 0700));
    Json meta = {{"key", t.key},           {"env", env_},
                 {"ram_mb", t.ram_mb},     {"state_bytes", t.state_bytes},
                 {"build_ms", t.build_ms}, {"prepared", t.prepared}};
    for (auto [file, fd, size] :
         {std::tuple{"ram", t.ram.get(), static_cast<uint64_t>(t.ram_mb) << 20},
          std::tuple{"state", t.state.get(), t.state_bytes}}) {
      const std::string path = JoinPath(tmp, file);
      UniqueFd out(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!out) return ErrnoError("create " + path);
      if (ftruncate(out.get(), static_cast<off_t>(size)) < 0) return ErrnoError("size " + path);
      DSEC_ASSIGN_OR_RETURN(std::string sha,
                            CopyData(fd, out.get(), size, std::string("template ") + file));
      if (fsync(out.get()) < 0) return ErrnoError("sync " + path);
      meta[std::string(file) + "_sha256"] = sha;
    }
    DSEC_RETURN_IF_ERROR(WriteStringToFile(JoinPath(tmp, "meta.json"), meta.dump(2) + "\n",
                                           O_WRONLY | O_CREAT | O_TRUNC));
    DSEC_RETURN_IF_ERROR(SyncPath(JoinPath(tmp, "meta.json")));
    DSEC_RETURN_IF_ERROR(SyncPath(tmp));
    const std::string dst = JoinPath(dir_, name);
    (void)RemoveTree(dst);  // an older save of the same template
    if (rename(tmp.c_str(), dst.c_str()) < 0) return ErrnoError("rename into " + dst);
    return SyncPath(dir_);
  }();
  if (!s.ok()) cleanup();
  Prune();
  return s;
}

void TemplateFiles::Prune() {
  auto names = ListDir(dir_, /*dirs_only=*/true);
  if (!names.ok()) return;
  std::vector<std::pair<int64_t, std::string>> kept;
  for (const auto& n : *names) {
    if (n.find(".tmp-") != std::string::npos) continue;  // a save under way
    struct stat st;
    if (stat(JoinPath(dir_, n).c_str(), &st) == 0)
      kept.emplace_back(st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec, n);
  }
  if (kept.size() <= max_) return;
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + max_ < kept.size(); ++i) {
    DSEC_LOG_INFO("microvm template files {}: removed (more than {} kept)", kept[i].second, max_);
    (void)RemoveTree(JoinPath(dir_, kept[i].second));
  }
}

}  // namespace dsec::backends::microvm
