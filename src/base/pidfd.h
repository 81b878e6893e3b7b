// PidFd: a process we started, held by pidfd so signals and waits cannot hit a recycled pid.
#pragma once

#include <sys/types.h>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

struct ExitInfo {
  int exit_code = -1;  // valid when signal == 0
  int signal = 0;      // terminating signal, 0 if it exited
};

class PidFd {
 public:
  PidFd() = default;
  PidFd(pid_t pid, UniqueFd fd) : pid_(pid), fd_(std::move(fd)) {}
  static StatusOr<PidFd> Open(pid_t pid);

  pid_t pid() const { return pid_; }
  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }

  Status SendSignal(int sig) const;
  // Blocks until the process exits and reaps it (caller must be its parent).
  StatusOr<ExitInfo> Wait();
  // Non-blocking: nullopt-like NotFound status if it is still running.
  StatusOr<ExitInfo> TryWait();
  // Waits up to timeout_ms for the pidfd to become readable (process exited).
  bool WaitReadable(int timeout_ms) const;

 private:
  pid_t pid_ = -1;
  UniqueFd fd_;
};

}  // namespace dsec
