// Shared cgroup helpers: mount detection, keyed-file parsing and the cgroup2 directory
// operations both drivers use.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include "base/file_util.h"
#include "base/strings.h"
#include "isolation/cgroup_internal.h"

namespace dsec::isolation::internal {

CgroupMounts ParseCgroupMounts(const std::string& mountinfo) {
  CgroupMounts m;
  std::istringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    auto fields = SplitString(line, ' ');
    size_t dash = 0;
    for (size_t i = 0; i < fields.size(); ++i) {
      if (fields[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 3 > fields.size() || fields.size() < 5) continue;
    std::string_view fstype = fields[dash + 1];
    std::string mountpoint(fields[4]);
    if (fstype == "cgroup2") {
      if (m.v2.empty()) m.v2 = mountpoint;
    } else if (fstype == "cgroup") {
      for (auto opt : SplitString(fields[dash + 3], ',')) {
        if (opt == "rw" || opt == "ro" || StartsWith(opt, "name=") ||
            StartsWith(opt, "release_agent"))
          continue;
        m.v1.emplace(std::string(opt), mountpoint);
      }
    }
  }
  return m;
}

StatusOr<CgroupMounts> DetectCgroupMounts() {
  DSEC_ASSIGN_OR_RETURN(std::string info, ReadFileToString("/proc/self/mountinfo", 4 << 20));
  return ParseCgroupMounts(info);
}

std::optional<uint64_t> FindKeyedValue(const std::string& content, const std::string& key) {
  std::istringstream in(content);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.find(' ');
    if (sp == std::string::npos || line.compare(0, sp, key) != 0 || sp != key.size()) continue;
    return ParseUint64(TrimWhitespace(std::string_view(line).substr(sp + 1)));
  }
  return std::nullopt;
}

Status WriteControl(const std::string& path, const std::string& value, bool create) {
  return WriteStringToFile(path, value, create ? O_WRONLY | O_CREAT | O_TRUNC : O_WRONLY);
}

Status WriteControlIfChanged(const std::string& path, const std::string& value, bool create) {
  if (auto cur = ReadFileToString(path, 4096); cur.ok() && TrimWhitespace(*cur) == value)
    return OkStatus();
  return WriteControl(path, value, create);
}

StatusOr<std::string> ReadControl(const std::string& path) {
  return ReadFileToString(path, 1 << 20);
}

std::vector<pid_t> ListProcsRecursive(const std::string& dir) {
  std::vector<pid_t> out;
  if (auto procs = ReadFileToString(JoinPath(dir, "cgroup.procs")); procs.ok()) {
    for (auto tok : SplitString(*procs, '\n', true))
      if (auto v = ParseInt64(tok)) out.push_back(static_cast<pid_t>(*v));
  }
  auto subdirs = ListDir(dir, /*dirs_only=*/true);
  if (!subdirs.ok()) return out;
  for (const auto& s : *subdirs) {
    auto more = ListProcsRecursive(JoinPath(dir, s));
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

StatusOr<std::vector<std::string>> ListSandboxDirs(const std::string& parent) {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(parent, /*dirs_only=*/true));
  std::erase_if(names, [](const std::string& n) { return n[0] == '.'; });
  return names;
}

Status RemoveCgroupDir(const std::string& path) {
  // Depth first: nested cgroups (per-exec ones the agent made) go before their parent.
  if (auto subdirs = ListDir(path, /*dirs_only=*/true); subdirs.ok()) {
    for (const auto& s : *subdirs) DSEC_RETURN_IF_ERROR(RemoveCgroupDir(JoinPath(path, s)));
  }
  for (int i = 0; i < 200; ++i) {
    if (rmdir(path.c_str()) == 0 || errno == ENOENT) return OkStatus();
    if (errno != EBUSY) return ErrnoError("rmdir \"" + path + "\"");
    usleep(i < 20 ? 500 : 10000);
  }
  return ErrnoError("rmdir \"" + path + "\"");
}

Status RemoveParentDir(const std::string& path) {
  if (rmdir(path.c_str()) == 0 || errno == ENOENT || errno == EBUSY || errno == ENOTEMPTY)
    return OkStatus();
  return ErrnoError("rmdir \"" + path + "\"");
}

Status V2Dir::Create() {
  if (mkdir(path_.c_str(), 0755) < 0) return ErrnoError("mkdir \"" + path_ + "\"");
  std::string user = JoinPath(path_, "user");
  if (mkdir(user.c_str(), 0755) < 0) return ErrnoError("mkdir \"" + user + "\"");
  DSEC_ASSIGN_OR_RETURN(fd_, OpenDir(path_));
  return OkStatus();
}

Status V2Dir::Open() {
  struct stat st;
  if (stat(path_.c_str(), &st) < 0) return ErrnoError("stat \"" + path_ + "\"");
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition("\"" + path_ + "\" is not a directory");
  return OkStatus();
}

Status V2Dir::Kill() {
  if (use_kill_) {
    Status s = WriteControl(JoinPath(path_, "cgroup.kill"), "1", plain_);
    if (s.error_number() != ENOENT) return s;  // ENOENT: kernel without cgroup.kill
  }
  // Fallback for kernels without cgroup.kill (< 5.14) or when forced: freeze so nothing can
  // fork, SIGKILL every member, thaw so the kills are delivered; repeat until empty.
  for (int round = 0; round < 50; ++round) {
    (void)SetFrozen(true);
    auto pids = ListProcsRecursive(path_);
    for (pid_t p : pids) kill(p, SIGKILL);
    (void)SetFrozen(false);
    if (pids.empty()) return OkStatus();
    usleep(1000);
  }
  return Unavailable("processes in \"" + path_ + "\" survived SIGKILL");
}

Status V2Dir::SetFrozen(bool frozen) {
  DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(path_, "cgroup.freeze"), frozen ? "1" : "0", plain_));
  if (!frozen || plain_) return OkStatus();
  // Freezing completes asynchronously; wait (bounded) so callers see a frozen sandbox.
  for (int i = 0; i < 200; ++i) {
    auto f = IsFrozen();
    if (!f.ok() || *f) return OkStatus();
    usleep(i < 20 ? 200 : 10000);
  }
  return OkStatus();
}

StatusOr<bool> V2Dir::IsFrozen() const {
  DSEC_ASSIGN_OR_RETURN(std::string ev, ReadControl(JoinPath(path_, "cgroup.events")));
  return FindKeyedValue(ev, "frozen").value_or(0) == 1;
}

StatusOr<bool> V2Dir::IsPopulated() const {
  DSEC_ASSIGN_OR_RETURN(std::string ev, ReadControl(JoinPath(path_, "cgroup.events")));
  return FindKeyedValue(ev, "populated").value_or(0) == 1;
}

StatusOr<uint64_t> V2Dir::CpuUsageUs() const {
  DSEC_ASSIGN_OR_RETURN(std::string st, ReadControl(JoinPath(path_, "cpu.stat")));
  return FindKeyedValue(st, "usage_usec").value_or(0);
}

Status V2Dir::Delegate(uid_t uid, gid_t gid) {
  // What the agent needs: migrate its children from <sb> into user/e-N (write access to the
  // common ancestor's cgroup.procs), create e-N under user/, and kill all of user/.
  for (const char* rel : {"cgroup.procs", "cgroup.threads", "user", "user/cgroup.procs",
                          "user/cgroup.threads", "user/cgroup.kill", "user/cgroup.freeze"}) {
    std::string p = JoinPath(path_, rel);
    if (chown(p.c_str(), uid, gid) < 0 && errno != ENOENT) return ErrnoError("chown \"" + p + "\"");
  }
  return OkStatus();
}

Status V2Dir::RemoveAll() {
  fd_.Reset();
  return RemoveCgroupDir(path_);
}

}  // namespace dsec::isolation::internal
