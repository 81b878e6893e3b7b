#include "base/subprocess.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/unique_fd.h"

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

}  // namespace dsec
