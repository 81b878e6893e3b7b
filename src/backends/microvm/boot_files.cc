#include "backends/microvm/boot_files.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::backends::microvm {

namespace {

constexpr char kMagic[] = "070701";
constexpr size_t kHeaderSize = 110;  // magic + 13 fields of 8 hex digits
constexpr uint64_t kMaxAgentBytes = 64ull << 20;
constexpr uint64_t kMaxModuleBytes = 16ull << 20;

void Pad4(std::string* out) {
  while (out->size() % 4 != 0) out->push_back('\0');
}

std::string Hex8(uint64_t v) {
  char buf[9];
  snprintf(buf, sizeof buf, "%08llx", static_cast<unsigned long long>(v & 0xffffffffu));
  return buf;
}

StatusOr<uint32_t> ParseHex8(std::string_view s) {
  uint32_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return InvalidArgument("cpio: bad header field");
    v = v * 16 + static_cast<uint32_t>(d);
  }
  return v;
}

void AppendEntry(uint32_t ino, const CpioEntry& e, std::string* out) {
  // Fields: ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor
  // namesize check.
  uint64_t fields[13] = {ino,
                         e.mode,
                         0,
                         0,
                         S_ISDIR(e.mode) ? 2u : 1u,
                         0,
                         e.data.size(),
                         0,
                         0,
                         e.rdev_major,
                         e.rdev_minor,
                         e.path.size() + 1,
                         0};
  out->append(kMagic);
  for (uint64_t f : fields) out->append(Hex8(f));
  out->append(e.path);
  out->push_back('\0');
  Pad4(out);
  out->append(e.data);
  Pad4(out);
}

}  // namespace

StatusOr<GuestKernel> FindGuestKernel(const std::string& dir) {
  const std::string how =
      " (scripts/guest-kernel unpacks Debian's linux-image-cloud-amd64 there; "
      "scripts/install-deps runs it)";
  char real[PATH_MAX];
  if (!realpath(dir.c_str(), real))
    return FailedPrecondition("no guest kernel at \"" + dir + "\"" + how);
  GuestKernel k;
  k.dir = real;
  k.version = k.dir.substr(k.dir.rfind('/') + 1);
  k.vmlinux = JoinPath(k.dir, "vmlinux");
  if (access(k.vmlinux.c_str(), R_OK) != 0)
    return FailedPrecondition("no vmlinux in \"" + k.dir + "\"" + how);
  auto order = ReadFileToString(JoinPath(k.dir, "modules/order"), 1 << 16);
  if (!order.ok()) return FailedPrecondition("no modules/order in \"" + k.dir + "\"" + how);
  for (std::string_view line : SplitString(*order, '\n', true)) {
    std::string name(TrimWhitespace(line));
    if (name.empty()) continue;
    if (name.find('/') != std::string::npos || name[0] == '.')
      return FailedPrecondition("bad module name \"" + name + "\" in " + k.dir + "/modules/order");
    k.modules.push_back(name);
  }
  if (k.modules.empty()) return FailedPrecondition("modules/order in \"" + k.dir + "\" is empty");
  return k;
}

std::string CpioArchive(const std::vector<CpioEntry>& entries) {
  std::string out;
  size_t total = 0;
  for (const auto& e : entries) total += kHeaderSize + e.path.size() + e.data.size() + 8;
  out.reserve(total + 256);
  uint32_t ino = 1;
  for (const auto& e : entries) AppendEntry(ino++, e, &out);
  AppendEntry(0, CpioEntry{"TRAILER!!!", 0, "", 0, 0}, &out);
  return out;
}

StatusOr<std::vector<CpioEntry>> ParseCpio(std::string_view a) {
  std::vector<CpioEntry> out;
  size_t pos = 0;
  while (true) {
    if (a.size() - pos < kHeaderSize || a.substr(pos, 6) != kMagic)
      return InvalidArgument("cpio: bad or missing header at " + std::to_string(pos));
    uint32_t f[13];
    for (int i = 0; i < 13; ++i) {
      DSEC_ASSIGN_OR_RETURN(f[i], ParseHex8(a.substr(pos + 6 + 8 * i, 8)));
    }
    size_t name_at = pos + kHeaderSize, namesize = f[11], filesize = f[6];
    if (namesize == 0 || a.size() - name_at < namesize) return InvalidArgument("cpio: bad name");
    std::string name(a.substr(name_at, namesize - 1));
    size_t data_at = (name_at + namesize + 3) & ~size_t{3};
    if (data_at > a.size() || a.size() - data_at < filesize)
      return InvalidArgument("cpio: truncated member " + name);
    if (name == "TRAILER!!!") return out;
    out.push_back(CpioEntry{name, f[1], std::string(a.substr(data_at, filesize)), f[9], f[10]});
    pos = (data_at + filesize + 3) & ~size_t{3};
  }
}

Status WriteGuestInitramfs(const GuestKernel& kernel, const std::string& agent,
                           const std::string& path) {
  std::vector<CpioEntry> e;
  for (const char* d : {"dev", "proc", "sys", "newroot", "layers", "rw", "lib", "lib/modules"})
    e.push_back({d, S_IFDIR | 0755, "", 0, 0});
  e.push_back({"dev/console", S_IFCHR | 0600, "", 5, 1});
  auto bin = ReadFileToString(agent, kMaxAgentBytes);
  if (!bin.ok()) return bin.status().WithContext("the guest's dsec-agent");
  e.push_back({"init", S_IFREG | 0755, std::move(bin).value(), 0, 0});
  std::string order;
  for (const auto& m : kernel.modules) {
    auto ko = ReadFileToString(JoinPath(kernel.dir, "modules/" + m), kMaxModuleBytes);
    if (!ko.ok()) return ko.status().WithContext("guest kernel module");
    e.push_back({"lib/modules/" + m, S_IFREG | 0644, std::move(ko).value(), 0, 0});
    order += m + "\n";
  }
  e.push_back({"lib/modules/order", S_IFREG | 0644, order, 0, 0});
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  Status s = WriteStringToFile(tmp, CpioArchive(e), O_WRONLY | O_CREAT | O_TRUNC | O_EXCL);
  if (s.ok() && chmod(tmp.c_str(), 0644) < 0) s = ErrnoError("chmod " + tmp);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) < 0) s = ErrnoError("rename " + tmp);
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

}  // namespace dsec::backends::microvm
