// Audit logs as JSON lines: the edge's exec log (one line per exec, shell command and attach
// session: who, when, which sandbox, the command, exit, sizes: reward-hacking forensics) and the
// apiserver's access log (who, by token name and project, changed what). Each lives on the host
// where no sandbox can see it (the edge's state dir is hidden from every image), and rotates by
// size: exec.log -> exec.log.1 -> ... keeping `keep` old files.
// Thread safety: Record is thread-safe; each line is one write(2) with O_APPEND.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

class AuditLog {
 public:
  static StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path, uint64_t max_bytes,
                                                  int keep);
  // Adds "time_ms" and writes the entry as one line. Never fails the caller: an I/O error is
  // counted and logged once.
  void Record(Json entry);
  uint64_t write_errors() const { return write_errors_; }

  // A command as the log keeps it: at most this many bytes of each argument and in total.
  static Json Command(const std::vector<std::string>& argv);
  static std::string Clip(const std::string& s);

 private:
  AuditLog() = default;
  void RotateLocked() DSEC_REQUIRES(mu_);

  std::string path_;
  uint64_t max_bytes_ = 0;
  int keep_ = 0;
  Mutex mu_;
  UniqueFd fd_ DSEC_GUARDED_BY(mu_);
  uint64_t size_ DSEC_GUARDED_BY(mu_) = 0;
  uint64_t write_errors_ = 0;
};

}  // namespace dsec
