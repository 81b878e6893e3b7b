#include "isolation/proc_views.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/mount.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "isolation/jail.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

namespace {

constexpr long kFuseSuperMagic = 0x65735546;
constexpr off_t kMaxLogBytes = 1 << 20;

bool IsFuseMount(const std::string& path) {
  struct statfs s;
  return statfs(path.c_str(), &s) == 0 && s.f_type == kFuseSuperMagic;
}

std::string Tail(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return "";
  std::string t = std::string(TrimWhitespace(*text));
  if (t.size() > 300) t = "..." + t.substr(t.size() - 300);
  return t;
}

}  // namespace

const std::vector<std::string>& ProcViews::Names() {
  static const std::vector<std::string> kNames = {"meminfo", "uptime", "cpuinfo", "stat"};
  return kNames;
}

ProcViews::ProcViews(Options opts) : opts_(std::move(opts)), mnt_(JoinPath(opts_.dir, "mnt")) {}

StatusOr<std::unique_ptr<ProcViews>> ProcViews::Start(Options opts) {
  if (opts.dir.empty()) return InvalidArgument("proc views need a directory");
  DSEC_RETURN_IF_ERROR(MakeDirs(opts.dir, 0700));
  std::unique_ptr<ProcViews> v(new ProcViews(std::move(opts)));
  {
    MutexLock l(v->mu_);
    if (!v->Adopt()) DSEC_RETURN_IF_ERROR(v->Launch());
  }
  v->stop_.Reset(eventfd(0, EFD_CLOEXEC));
  if (!v->stop_) return ErrnoError("eventfd");
  v->watcher_ = std::thread([p = v.get()] { p->Watch(); });
  return v;
}

ProcViews::~ProcViews() {
  if (watcher_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof one);
    watcher_.join();
  }
}

bool ProcViews::Adopt() {
  auto text = ReadFileToString(JoinPath(opts_.dir, "lxcfs.pid"), 64);
  if (!text.ok()) return false;
  auto pid = ParseInt64(TrimWhitespace(*text));
  if (!pid || *pid <= 1) return false;
  std::string proc = "/proc/" + std::to_string(*pid);
  char exe[PATH_MAX];
  ssize_t n = readlink((proc + "/exe").c_str(), exe, sizeof exe - 1);
  if (n <= 0) return false;
  std::string_view e(exe, static_cast<size_t>(n));
  std::string base = opts_.binary.substr(opts_.binary.rfind('/') + 1);
  if (e.substr(e.rfind('/') + 1) != base) return false;
  auto cmdline = ReadFileToString(proc + "/cmdline", 1 << 16);
  if (!cmdline.ok() || cmdline->find(mnt_ + '\0') == std::string::npos) return false;
  if (!IsFuseMount(mnt_)) return false;
  auto p = PidFd::Open(static_cast<pid_t>(*pid));
  if (!p.ok()) return false;
  lxcfs_ = std::move(*p);
  ours_ = false;
  down_.clear();
  DSEC_LOG_INFO("proc views: adopted lxcfs pid {} at {}", *pid, mnt_);
  return true;
}

Status ProcViews::Launch() {
  // A mount of a dead lxcfs (it died while no edge watched) goes first.
  while (umount2(mnt_.c_str(), MNT_DETACH) == 0) {
  }
  DSEC_RETURN_IF_ERROR(MakeDirs(mnt_, 0755));
  const std::string log = JoinPath(opts_.dir, "lxcfs.log");
  struct stat st;
  if (stat(log.c_str(), &st) == 0 && st.st_size > kMaxLogBytes) (void)truncate(log.c_str(), 0);
  const std::string pidfile = JoinPath(opts_.dir, "lxcfs.pid");
  auto exe = FindExecutable(opts_.binary);
  if (!exe.ok()) return NotFound(opts_.binary + " is not installed (Debian: apt install lxcfs)");
  UniqueFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd log_fd(open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!null_fd || !log_fd) return ErrnoError("open lxcfs's stdio");
  // Through the helper jail (jail.h) for its descriptors, session and signals; no namespaces
  // or root of its own: it serves the node's /proc and cgroups to every sandbox, as root.
  JailSpec j;
  j.exe = *exe;
  j.argv = {opts_.binary, "-f", "--enable-pidfd", "-p", pidfile, mnt_};
  j.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  j.fds = {{0, null_fd.get()}, {1, log_fd.get()}, {2, log_fd.get()}};
  auto spawned = SpawnJailed(j);
  if (!spawned.ok()) return spawned.status().WithContext("start " + opts_.binary);
  auto p = std::move(spawned);
  // Serving once its mount shows the files.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const std::string probe = mnt_ + "/proc/meminfo";
  while (!(IsFuseMount(mnt_) && access(probe.c_str(), R_OK) == 0)) {
    if (p->WaitReadable(20)) {
      auto exit = p->Wait();
      return FailedPrecondition(opts_.binary + " ended at start (" +
                                (exit.ok() && exit->signal
                                     ? "signal " + std::to_string(exit->signal)
                                 : exit.ok() ? "exit " + std::to_string(exit->exit_code)
                                             : std::string("?")) +
                                "): " + Tail(log));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      (void)p->SendSignal(SIGKILL);
      (void)p->Wait();
      (void)umount2(mnt_.c_str(), MNT_DETACH);
      return DeadlineExceeded(opts_.binary + " did not serve " + mnt_ +
                              " within 10 s: " + Tail(log));
    }
  }
  lxcfs_ = std::move(*p);
  ours_ = true;
  down_.clear();
  return OkStatus();
}

void ProcViews::Watch() {
  int backoff_ms = 1000;
  while (true) {
    int pfd;
    {
      MutexLock l(mu_);
      pfd = lxcfs_.valid() ? lxcfs_.fd() : -1;
    }
    pollfd p[2] = {{stop_.get(), POLLIN, 0}, {pfd, POLLIN, 0}};
    int r = poll(p, pfd >= 0 ? 2 : 1, pfd >= 0 ? -1 : backoff_ms);
    if (r < 0 && errno == EINTR) continue;
    if (p[0].revents) return;
    if (pfd >= 0 && p[1].revents) {
      std::string how = "ended";
      {
        MutexLock l(mu_);
        if (ours_)
          if (auto e = lxcfs_.Wait(); e.ok())
            how = e->signal ? "was killed by signal " + std::to_string(e->signal)
                            : "exited with " + std::to_string(e->exit_code);
        lxcfs_ = PidFd();
        down_ = "lxcfs " + how;
      }
      DSEC_LOG_ERROR("proc views: lxcfs {}; dropping the views of running sandboxes, restarting",
                     how);
      if (opts_.on_death) opts_.on_death();
      backoff_ms = 1000;
      continue;  // restarted after the pause below
    }
    // Down: start a new one (the pause keeps a crashing lxcfs from spinning).
    MutexLock l(mu_);
    if (Status s = Launch(); !s.ok()) {
      if (down_ != s.ToString()) DSEC_LOG_ERROR("proc views: restart: {}", s.ToString());
      down_ = s.ToString();
      backoff_ms = std::min(backoff_ms * 2, 60000);
    } else {
      DSEC_LOG_INFO("proc views: lxcfs restarted, pid {}", lxcfs_.pid());
      backoff_ms = 1000;
    }
  }
}

void ProcViews::Stop() {
  if (watcher_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof one);
    watcher_.join();
  }
  MutexLock l(mu_);
  if (lxcfs_.valid()) {
    (void)lxcfs_.SendSignal(SIGTERM);
    if (!lxcfs_.WaitReadable(3000)) {
      (void)lxcfs_.SendSignal(SIGKILL);
      (void)lxcfs_.WaitReadable(3000);
    }
    if (ours_) (void)lxcfs_.Wait();
    lxcfs_ = PidFd();
  }
  down_ = "stopped";
  while (umount2(mnt_.c_str(), MNT_DETACH) == 0) {
  }
  (void)rmdir(mnt_.c_str());
  (void)unlink(JoinPath(opts_.dir, "lxcfs.pid").c_str());
}

StatusOr<std::vector<UniqueFd>> ProcViews::Clone() {
  MutexLock l(mu_);
  if (!lxcfs_.valid()) return Unavailable("no proc views: " + down_);
  std::vector<UniqueFd> out;
  for (const auto& name : Names()) {
    std::string path = mnt_ + "/proc/" + name;
    UniqueFd fd(sys::OpenTree(AT_FDCWD, path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
    if (!fd) return ErrnoError("clone " + path);
    mount_attr a{};
    a.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    if (sys::MountSetattr(fd.get(), "", AT_EMPTY_PATH, &a) < 0)
      return ErrnoError("read-only " + path);
    out.push_back(std::move(fd));
  }
  return out;
}

pid_t ProcViews::pid() {
  MutexLock l(mu_);
  return lxcfs_.valid() ? lxcfs_.pid() : -1;
}

std::string ProcViews::Describe() {
  MutexLock l(mu_);
  if (!lxcfs_.valid()) return "no lxcfs: " + down_;
  return "lxcfs pid " + std::to_string(lxcfs_.pid()) + " at " + mnt_;
}

}  // namespace dsec::isolation
