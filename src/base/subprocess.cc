#include "base/subprocess.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dsec {

Status RunTool(const std::vector<std::string>& argv, std::string_view package) {
  if (argv.empty()) return InvalidArgument("RunTool: no program");
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return ErrnoError("pipe");
  UniqueFd rd(pipefd[0]), wr(pipefd[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) {
    dup2(wr.get(), 1);
    dup2(wr.get(), 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    execvp(args[0], args.data());
    _exit(127);
  }
  wr.Reset();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(rd.get(), buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (out.size() < 8192) out.append(buf, static_cast<size_t>(n));
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return OkStatus();
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
    return FailedPrecondition(argv[0] + " is not installed (Debian: " + std::string(package) + ")");
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (out.size() > 400) out = "..." + out.substr(out.size() - 400);
  return InternalError(argv[0] + " failed: " + out);
}

StatusOr<LoopDevice> AttachLoopDevice(int file_fd, bool read_only, bool direct_io) {
  UniqueFd ctl(open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!ctl) return ErrnoError("open /dev/loop-control");
  for (int attempt = 0; attempt < 16; ++attempt) {
    int n = ioctl(ctl.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return ErrnoError("LOOP_CTL_GET_FREE");
    LoopDevice d;
    d.dev = "/dev/loop" + std::to_string(n);
    d.fd.Reset(open(d.dev.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    if (!d.fd) return ErrnoError("open " + d.dev);
    loop_config cfg{};
    cfg.fd = static_cast<uint32_t>(file_fd);
    // Direct I/O needs the device's blocks to line up with the backing filesystem's.
    cfg.block_size = direct_io ? 4096 : 0;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (read_only ? LO_FLAGS_READ_ONLY : 0) |
                        (direct_io ? LO_FLAGS_DIRECT_IO : 0);
    if (ioctl(d.fd.get(), LOOP_CONFIGURE, &cfg) < 0) {
      if (errno == EBUSY) continue;  // taken by someone else meanwhile
      // Direct I/O needs the backing filesystem's support (tmpfs has none): go without it.
      if (errno == EINVAL && direct_io) return AttachLoopDevice(file_fd, read_only, false);
      return ErrnoError("LOOP_CONFIGURE " + d.dev);
    }
    return d;
  }
  return ResourceExhausted("no free loop device");
}

}  // namespace dsec
