#include "base/audit_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/logging.h"

namespace dsec {

namespace {
constexpr size_t kMaxArgBytes = 4096;
constexpr size_t kMaxCommandBytes = 16384;
}  // namespace

StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path, uint64_t max_bytes,
                                                   int keep) {
  std::unique_ptr<AuditLog> a(new AuditLog());
  a->path_ = path;
  a->max_bytes_ = max_bytes;
  a->keep_ = keep;
  // Its directory is made private when made here; one that exists keeps its mode (an
  // apiserver's log may go to /var/log). The file itself is 0600.
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "" : path.substr(0, slash);
  if (!dir.empty() && access(dir.c_str(), F_OK) != 0) DSEC_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  MutexLock l(a->mu_);  // not shared yet; taken so the fields are only ever touched under it
  a->fd_.Reset(open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!a->fd_) return ErrnoError("open audit log \"" + path + "\"");
  struct stat st;
  if (fstat(a->fd_.get(), &st) == 0) a->size_ = static_cast<uint64_t>(st.st_size);
  return a;
}

std::string AuditLog::Clip(const std::string& s) {
  if (s.size() <= kMaxArgBytes) return s;
  return s.substr(0, kMaxArgBytes) + "...[" + std::to_string(s.size()) + " bytes]";
}

Json AuditLog::Command(const std::vector<std::string>& argv) {
  Json out = Json::array();
  size_t total = 0;
  for (const auto& a : argv) {
    if (total > kMaxCommandBytes) {
      out.push_back("...[" + std::to_string(argv.size()) + " args]");
      break;
    }
    std::string c = Clip(a);
    total += c.size();
    out.push_back(std::move(c));
  }
  return out;
}

void AuditLog::RotateLocked() {
  for (int i = keep_ - 1; i >= 1; --i)
    (void)rename((path_ + "." + std::to_string(i)).c_str(),
                 (path_ + "." + std::to_string(i + 1)).c_str());
  if (keep_ > 0) {
    (void)rename(path_.c_str(), (path_ + ".1").c_str());
  } else {
    (void)unlink(path_.c_str());
  }
  fd_.Reset(open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  size_ = 0;
}

void AuditLog::Record(Json entry) {
  entry["time_ms"] = WallMs();
  std::string line = entry.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  MutexLock l(mu_);
  if (max_bytes_ > 0 && size_ + line.size() > max_bytes_) RotateLocked();
  if (!fd_ || write(fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    if (write_errors_++ == 0) DSEC_LOG_ERROR("audit log write failed: path={}", path_);
    return;
  }
  size_ += line.size();
}

}  // namespace dsec
