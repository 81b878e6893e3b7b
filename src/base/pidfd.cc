#include "base/pidfd.h"

#include <poll.h>
#include <sys/wait.h>

#include <string>

#include "sys/syscalls.h"

namespace dsec {

namespace {
#ifndef P_PIDFD
constexpr idtype_t P_PIDFD = static_cast<idtype_t>(3);
#endif

StatusOr<ExitInfo> DoWait(int fd, pid_t pid, int options) {
  siginfo_t info{};
  while (waitid(P_PIDFD, static_cast<id_t>(fd), &info, WEXITED | options) < 0) {
    if (errno != EINTR) return ErrnoError("waitid pid " + std::to_string(pid));
  }
  if (info.si_pid == 0) return NotFound("process " + std::to_string(pid) + " still running");
  ExitInfo e;
  if (info.si_code == CLD_EXITED) {
    e.exit_code = info.si_status;
  } else {
    e.signal = info.si_status;
  }
  return e;
}
}  // namespace

StatusOr<PidFd> PidFd::Open(pid_t pid) {
  int fd = sys::PidfdOpen(pid, 0);
  if (fd < 0) return ErrnoError("pidfd_open " + std::to_string(pid));
  return PidFd(pid, UniqueFd(fd));
}

Status PidFd::SendSignal(int sig) const {
  if (sys::PidfdSendSignal(fd_.get(), sig) < 0)
    return ErrnoError("pidfd_send_signal " + std::to_string(pid_));
  return OkStatus();
}

StatusOr<ExitInfo> PidFd::Wait() { return DoWait(fd_.get(), pid_, 0); }
StatusOr<ExitInfo> PidFd::TryWait() { return DoWait(fd_.get(), pid_, WNOHANG); }

bool PidFd::WaitReadable(int timeout_ms) const {
  pollfd p{fd_.get(), POLLIN, 0};
  while (true) {
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0;
  }
}

}  // namespace dsec
