// Pure cgroup v2 driver: limits, tracking, kill and freeze in one hierarchy.
// Layout: <root>/dsec-<instance>/<sandbox>/{user/...}; the parent enables memory, pids and cpu
// for its children, and a sandbox's own subtree_control stays empty so the agent can live in
// it beside user/.
#include <sys/stat.h>

#include <cmath>

#include "base/file_util.h"
#include "base/strings.h"
#include "isolation/cgroup.h"
#include "isolation/cgroup_internal.h"

namespace dsec::isolation {

using internal::FindKeyedValue;
using internal::ReadControl;
using internal::V2Dir;
using internal::WriteControl;
using internal::WriteControlIfChanged;

namespace {

std::string CpuMax(double cpus) {
  if (cpus <= 0) return "max 100000";
  auto quota = static_cast<int64_t>(std::llround(cpus * 100000));
  if (quota < 1000) quota = 1000;  // the kernel's minimum quota is 1 ms
  return std::to_string(quota) + " 100000";
}

class CgroupV2 : public Cgroup {
 public:
  CgroupV2(std::string name, std::string path, bool use_kill, bool plain, bool cpuset)
      : name_(std::move(name)),
        dir_(std::move(path), use_kill, plain),
        plain_(plain),
        cpuset_(cpuset) {}

  Status Init(bool create) { return create ? dir_.Create() : dir_.Open(); }

  const std::string& name() const override { return name_; }

  Status SetLimits(const CgroupLimits& l) override {
    DSEC_RETURN_IF_ERROR(
        Write("memory.max", l.memory_bytes > 0 ? std::to_string(l.memory_bytes) : "max"));
    // memory.swap.max is absent when swap accounting is off; then there is nothing to limit.
    std::string swap = JoinPath(dir_.path(), "memory.swap.max");
    if (plain_ || access(swap.c_str(), F_OK) == 0)
      DSEC_RETURN_IF_ERROR(Write("memory.swap.max", "0"));
    DSEC_RETURN_IF_ERROR(Write("pids.max", l.pids > 0 ? std::to_string(l.pids) : "max"));
    return WriteControlIfChanged(JoinPath(dir_.path(), "cpu.max"), CpuMax(l.cpu), plain_);
  }

  // "" is the parent's CPUs in v2 (an empty cpuset.cpus takes the parent's effective ones).
  Status SetCpus(const std::string& list) override {
    if (!cpuset_) return OkStatus();
    return WriteControlIfChanged(JoinPath(dir_.path(), "cpuset.cpus"), list, plain_);
  }
  bool has_cpuset() const override { return cpuset_; }

  int CloneIntoFd() const override { return dir_.fd(); }
  void ReleaseCloneFd() override { dir_.CloseFd(); }

  Status AddProcess(pid_t pid, bool cloned_into_v2) override {
    if (cloned_into_v2) return OkStatus();
    return Write("cgroup.procs", std::to_string(pid));
  }

  StatusOr<UniqueFd> OpenUserDir() const override {
    return OpenDir(JoinPath(dir_.path(), "user"), O_PATH);
  }

  Status Delegate(uid_t uid, gid_t gid) override { return dir_.Delegate(uid, gid); }
  Status KillAll() override { return dir_.Kill(); }
  Status Freeze() override { return dir_.SetFrozen(true); }
  Status Thaw() override { return dir_.SetFrozen(false); }
  StatusOr<bool> IsFrozen() override { return dir_.IsFrozen(); }
  StatusOr<bool> IsPopulated() override { return dir_.IsPopulated(); }

  StatusOr<CgroupStats> Stats() override {
    const std::string& p = dir_.path();
    CgroupStats s;
    DSEC_ASSIGN_OR_RETURN(std::string cur, ReadControl(JoinPath(p, "memory.current")));
    s.memory_current = ParseUint64(TrimWhitespace(cur)).value_or(0);
    if (auto peak = ReadControl(JoinPath(p, "memory.peak")); peak.ok())
      s.memory_peak = ParseUint64(TrimWhitespace(*peak)).value_or(0);
    DSEC_ASSIGN_OR_RETURN(s.cpu_usage_us, dir_.CpuUsageUs());
    DSEC_ASSIGN_OR_RETURN(std::string pids, ReadControl(JoinPath(p, "pids.current")));
    s.pids_current = ParseUint64(TrimWhitespace(pids)).value_or(0);
    DSEC_ASSIGN_OR_RETURN(std::string ev, ReadControl(JoinPath(p, "memory.events")));
    s.oom_kills = FindKeyedValue(ev, "oom_kill").value_or(0);
    if (auto ms = ReadControl(JoinPath(p, "memory.stat")); ms.ok())
      s.shmem = FindKeyedValue(*ms, "shmem").value_or(0);
    return s;
  }

  StatusOr<uint64_t> OomKills() override {
    DSEC_ASSIGN_OR_RETURN(std::string ev, ReadControl(JoinPath(dir_.path(), "memory.events")));
    return FindKeyedValue(ev, "oom_kill").value_or(0);
  }

  Status Destroy() override {
    if (access(dir_.path().c_str(), F_OK) != 0) return OkStatus();
    (void)dir_.Kill();
    internal::WaitUntilEmpty([&] { return dir_.IsPopulated().value_or(false); });
    return dir_.RemoveAll();
  }

 private:
  Status Write(const std::string& file, const std::string& value) {
    return WriteControl(JoinPath(dir_.path(), file), value, plain_);
  }

  std::string name_;
  V2Dir dir_;
  bool plain_;
  bool cpuset_;
};

class CgroupV2Driver : public CgroupDriver {
 public:
  CgroupV2Driver(std::string root, const CgroupDriverOptions& o)
      : root_(std::move(root)), parent_(JoinPath(root_, "dsec-" + o.instance_id)), opts_(o) {}

  Status Init() {
    // Controllers must be enabled top-down: root -> parent -> (sandboxes get them).
    DSEC_ASSIGN_OR_RETURN(std::string avail, ReadControl(JoinPath(root_, "cgroup.controllers")));
    std::string enable;
    for (const char* c : {"memory", "pids", "cpu"}) {
      bool found = false;
      for (auto tok : SplitString(TrimWhitespace(avail), ' ', true)) found |= tok == c;
      if (!found)
        return Unimplemented(std::string("cgroup v2 controller \"") + c +
                             "\" is not available at " + root_);
      enable += std::string(enable.empty() ? "+" : " +") + c;
    }
    // cpuset where the host offers it (SetCpus); without it, sandboxes' CPUs are affinities.
    if (opts_.use_cpuset)
      for (auto tok : SplitString(TrimWhitespace(avail), ' ', true))
        if (tok == "cpuset") {
          enable += " +cpuset";
          cpuset_ = true;
        }
    bool plain = opts_.plain_directory_tree;
    DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(root_, "cgroup.subtree_control"), enable, plain));
    if (mkdir(parent_.c_str(), 0755) < 0 && errno != EEXIST)
      return ErrnoError("mkdir \"" + parent_ + "\"");
    DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(parent_, "cgroup.subtree_control"), enable, plain));
    if (opts_.parent_memory_bytes > 0)
      DSEC_RETURN_IF_ERROR(SetParentMemoryLimit(opts_.parent_memory_bytes));
    if (opts_.parent_pids > 0)
      DSEC_RETURN_IF_ERROR(
          WriteControl(JoinPath(parent_, "pids.max"), std::to_string(opts_.parent_pids), plain));
    return OkStatus();
  }

  std::string Describe() const override { return "v2 (" + root_ + ")"; }
  bool is_v2() const override { return true; }
  bool has_cgroup2() const override { return true; }

  StatusOr<std::unique_ptr<Cgroup>> CreateSandbox(const std::string& name,
                                                  const CgroupLimits& limits) override {
    auto cg = std::make_unique<CgroupV2>(name, JoinPath(parent_, name), opts_.use_cgroup_kill,
                                         opts_.plain_directory_tree, cpuset_);
    Status init = cg->Init(true);
    if (init.error_number() == ENOENT) {
      // Another process on this state dir removed the (then empty) parent; make it again.
      DSEC_RETURN_IF_ERROR(Init());
      init = cg->Init(true);
    }
    DSEC_RETURN_IF_ERROR(init);
    if (Status s = cg->SetLimits(limits); !s.ok()) {
      (void)cg->Destroy();
      return s;
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::unique_ptr<Cgroup>> OpenSandbox(const std::string& name) override {
    auto cg = std::make_unique<CgroupV2>(name, JoinPath(parent_, name), opts_.use_cgroup_kill,
                                         opts_.plain_directory_tree, cpuset_);
    DSEC_RETURN_IF_ERROR(cg->Init(false));
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::vector<std::string>> ListSandboxes() override {
    return internal::ListSandboxDirs(parent_);
  }

  Status RemoveSandboxRemains(const std::string& name) override {
    return internal::RemoveCgroupDir(JoinPath(parent_, name));
  }

  Status SetParentMemoryLimit(int64_t bytes) override {
    return WriteControl(JoinPath(parent_, "memory.max"), bytes > 0 ? std::to_string(bytes) : "max",
                        opts_.plain_directory_tree);
  }

  Status RemoveParent() override { return internal::RemoveParentDir(parent_); }

 private:
  std::string root_;
  std::string parent_;
  CgroupDriverOptions opts_;
  bool cpuset_ = false;  // enabled for the sandboxes (Init)
};

}  // namespace

StatusOr<std::unique_ptr<CgroupDriver>> NewCgroupV2Driver(const std::string& root,
                                                          const CgroupDriverOptions& opts) {
  auto d = std::make_unique<CgroupV2Driver>(root, opts);
  DSEC_RETURN_IF_ERROR(d->Init());
  return std::unique_ptr<CgroupDriver>(std::move(d));
}

}  // namespace dsec::isolation
