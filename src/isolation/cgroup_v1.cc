// cgroup v1 hybrid driver: memory, pids and cpu limits on v1 hierarchies; process tracking,
// cgroup.kill, cgroup.freeze and cpu.stat on the cgroup2 mount (which carries no controllers
// on such hosts). Without any cgroup2 mount, the v1 freezer and cpuacct hierarchies stand in.
#include <sys/stat.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>

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

// cgroup v1 charges socket buffers (TCP, and UDP through the same sk_memcg accounting) to a
// memory cgroup only once its memory.kmem.tcp.limit_in_bytes has been written; until then they
// come out of host memory, uncapped by the sandbox's limit (a sandbox could queue gigabytes in
// never-read loopback connections and push the host's TCP into memory pressure). The write
// turns the accounting on; the cap is the memory limit ("-1": accounted, unlimited). It must
// happen before the sandbox's first socket, so it is part of the limits set at creation.
Status SetSocketMemoryLimit(const std::string& memory_dir, const std::string& limit) {
  std::string tcp = JoinPath(memory_dir, "memory.kmem.tcp.limit_in_bytes");
  if (access(tcp.c_str(), F_OK) != 0) return OkStatus();  // kernel without v1 tcp accounting
  return WriteControl(tcp, limit);
}

struct Hierarchies {
  std::string memory, pids, cpu;
  std::string cpuset;            // optional: the CPUs a sandbox may use, as a bound
  std::string freezer, cpuacct;  // used only without cgroup2
  std::string v2;                // cgroup2 mount, may be empty
};

class CgroupV1Hybrid : public Cgroup {
 public:
  CgroupV1Hybrid(std::string name, const Hierarchies& h, const std::string& parent_name,
                 bool use_kill)
      : name_(std::move(name)) {
    auto dir = [&](const std::string& root) {
      return root.empty() ? std::string() : JoinPath(JoinPath(root, parent_name), name_);
    };
    memory_ = dir(h.memory);
    pids_ = dir(h.pids);
    cpu_ = dir(h.cpu);
    cpuset_ = dir(h.cpuset);
    cpuset_parent_ = h.cpuset.empty() ? std::string() : JoinPath(h.cpuset, parent_name);
    if (!h.v2.empty()) {
      v2_.emplace(dir(h.v2), use_kill);
    } else {
      freezer_ = dir(h.freezer);
      cpuacct_ = dir(h.cpuacct);
    }
  }

  std::vector<std::string> V1Dirs() const {
    std::vector<std::string> out;
    for (const auto* d : {&memory_, &pids_, &cpu_, &cpuset_, &freezer_, &cpuacct_})
      if (!d->empty()) out.push_back(*d);
    return out;
  }

  Status Init(bool create) {
    // A sandbox made before cpusets were used has none: it is adopted without one.
    if (!create && !cpuset_.empty() && access(cpuset_.c_str(), F_OK) < 0) cpuset_.clear();
    for (const auto& d : V1Dirs()) {
      if (create ? mkdir(d.c_str(), 0755) < 0 : access(d.c_str(), F_OK) < 0)
        return ErrnoError(std::string(create ? "mkdir" : "access") + " \"" + d + "\"");
    }
    if (v2_) return create ? v2_->Create() : v2_->Open();
    return OkStatus();
  }

  const std::string& name() const override { return name_; }

  Status SetLimits(const CgroupLimits& l) override {
    std::string limit = l.memory_bytes > 0 ? std::to_string(l.memory_bytes) : "-1";
    // memsw (memory+swap) must stay >= the memory limit, so order the writes accordingly;
    // setting both equal turns swap off for the sandbox.
    std::string memsw = JoinPath(memory_, "memory.memsw.limit_in_bytes");
    bool has_memsw = access(memsw.c_str(), F_OK) == 0;
    // A raise (a limit changed later) needs memsw first; a first limit or a cut, memory first.
    std::string mem = JoinPath(memory_, "memory.limit_in_bytes");
    if (has_memsw && l.memory_bytes <= 0) DSEC_RETURN_IF_ERROR(WriteControl(memsw, "-1"));
    if (Status s = WriteControl(mem, limit); !s.ok()) {
      // Only a raise above memsw can be fixed by ordering; otherwise (e.g. EBUSY: a cut
      // below what is in use) the first error is the one that explains.
      if (!has_memsw || l.memory_bytes <= 0 || !WriteControl(memsw, limit).ok()) return s;
      DSEC_RETURN_IF_ERROR(WriteControl(mem, limit));
    }
    if (has_memsw && l.memory_bytes > 0) DSEC_RETURN_IF_ERROR(WriteControl(memsw, limit));
    if (!has_memsw) (void)WriteControl(JoinPath(memory_, "memory.swappiness"), "0");
    DSEC_RETURN_IF_ERROR(SetSocketMemoryLimit(memory_, limit));
    DSEC_RETURN_IF_ERROR(
        WriteControl(JoinPath(pids_, "pids.max"), l.pids > 0 ? std::to_string(l.pids) : "max"));
    DSEC_RETURN_IF_ERROR(WriteControlIfChanged(JoinPath(cpu_, "cpu.cfs_period_us"), "100000"));
    int64_t quota = -1;
    if (l.cpu > 0) quota = std::max<int64_t>(1000, std::llround(l.cpu * 100000));
    return WriteControlIfChanged(JoinPath(cpu_, "cpu.cfs_quota_us"), std::to_string(quota));
  }

  Status SetCpus(const std::string& list) override {
    if (cpuset_.empty()) return OkStatus();
    std::string cpus = list;
    if (cpus.empty()) {
      DSEC_ASSIGN_OR_RETURN(cpus, ReadControl(JoinPath(cpuset_parent_, "cpuset.cpus")));
      cpus = std::string(TrimWhitespace(cpus));
    }
    return WriteControlIfChanged(JoinPath(cpuset_, "cpuset.cpus"), cpus);
  }
  bool has_cpuset() const override { return !cpuset_.empty(); }

  int CloneIntoFd() const override { return v2_ ? v2_->fd() : -1; }
  void ReleaseCloneFd() override {
    if (v2_) v2_->CloseFd();
  }

  Status AddProcess(pid_t pid, bool cloned_into_v2) override {
    std::string p = std::to_string(pid);
    for (const auto& d : V1Dirs())
      DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(d, "cgroup.procs"), p));
    if (v2_ && !cloned_into_v2)
      DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(v2_->path(), "cgroup.procs"), p));
    return OkStatus();
  }

  StatusOr<UniqueFd> OpenUserDir() const override {
    if (!v2_) return UniqueFd();
    return OpenDir(JoinPath(v2_->path(), "user"), O_PATH);
  }

  Status Delegate(uid_t uid, gid_t gid) override {
    return v2_ ? v2_->Delegate(uid, gid) : OkStatus();
  }

  Status KillAll() override {
    if (v2_) return v2_->Kill();
    for (int round = 0; round < 50; ++round) {
      (void)SetV1Frozen(true);
      auto pids = internal::ListProcsRecursive(memory_);
      for (pid_t p : pids) kill(p, SIGKILL);
      (void)SetV1Frozen(false);
      if (pids.empty()) return OkStatus();
      usleep(1000);
    }
    return Unavailable("processes in cgroup " + name_ + " survived SIGKILL");
  }

  Status Freeze() override { return v2_ ? v2_->SetFrozen(true) : SetV1Frozen(true); }
  Status Thaw() override { return v2_ ? v2_->SetFrozen(false) : SetV1Frozen(false); }

  StatusOr<bool> IsFrozen() override {
    if (v2_) return v2_->IsFrozen();
    DSEC_ASSIGN_OR_RETURN(std::string st, ReadControl(JoinPath(freezer_, "freezer.state")));
    return TrimWhitespace(st) == "FROZEN";
  }

  StatusOr<bool> IsPopulated() override {
    if (v2_) return v2_->IsPopulated();
    DSEC_ASSIGN_OR_RETURN(std::string procs, ReadControl(JoinPath(memory_, "cgroup.procs")));
    return !TrimWhitespace(procs).empty();
  }

  StatusOr<CgroupStats> Stats() override {
    CgroupStats s;
    DSEC_ASSIGN_OR_RETURN(std::string cur, ReadControl(JoinPath(memory_, "memory.usage_in_bytes")));
    s.memory_current = ParseUint64(TrimWhitespace(cur)).value_or(0);
    DSEC_ASSIGN_OR_RETURN(std::string peak,
                          ReadControl(JoinPath(memory_, "memory.max_usage_in_bytes")));
    s.memory_peak = ParseUint64(TrimWhitespace(peak)).value_or(0);
    DSEC_ASSIGN_OR_RETURN(std::string oom, ReadControl(JoinPath(memory_, "memory.oom_control")));
    s.oom_kills = FindKeyedValue(oom, "oom_kill").value_or(0);
    if (auto ms = ReadControl(JoinPath(memory_, "memory.stat")); ms.ok())
      s.shmem = FindKeyedValue(*ms, "total_shmem").value_or(0);
    DSEC_ASSIGN_OR_RETURN(std::string pids, ReadControl(JoinPath(pids_, "pids.current")));
    s.pids_current = ParseUint64(TrimWhitespace(pids)).value_or(0);
    if (v2_) {
      DSEC_ASSIGN_OR_RETURN(s.cpu_usage_us, v2_->CpuUsageUs());
    } else if (!cpuacct_.empty()) {
      DSEC_ASSIGN_OR_RETURN(std::string ns, ReadControl(JoinPath(cpuacct_, "cpuacct.usage")));
      s.cpu_usage_us = ParseUint64(TrimWhitespace(ns)).value_or(0) / 1000;
    }
    return s;
  }

  StatusOr<uint64_t> OomKills() override {
    DSEC_ASSIGN_OR_RETURN(std::string oom, ReadControl(JoinPath(memory_, "memory.oom_control")));
    return FindKeyedValue(oom, "oom_kill").value_or(0);
  }

  Status Destroy() override {
    (void)KillAll();
    internal::WaitUntilEmpty([&] { return IsPopulated().value_or(false); });
    Status result;
    if (v2_) result = v2_->RemoveAll();
    for (const auto& d : V1Dirs()) {
      Status s = internal::RemoveCgroupDir(d);
      if (result.ok()) result = s;
    }
    return result;
  }

 private:
  Status SetV1Frozen(bool frozen) {
    if (freezer_.empty()) return Unimplemented("no freezer hierarchy");
    DSEC_RETURN_IF_ERROR(
        WriteControl(JoinPath(freezer_, "freezer.state"), frozen ? "FROZEN" : "THAWED"));
    for (int i = 0; frozen && i < 200; ++i) {
      auto st = ReadControl(JoinPath(freezer_, "freezer.state"));
      if (!st.ok() || TrimWhitespace(*st) == "FROZEN") break;
      usleep(i < 20 ? 200 : 10000);
    }
    return OkStatus();
  }

  std::string name_;
  std::string memory_, pids_, cpu_, cpuset_, freezer_, cpuacct_;
  std::string cpuset_parent_;
  std::optional<V2Dir> v2_;
};

class CgroupV1HybridDriver : public CgroupDriver {
 public:
  CgroupV1HybridDriver(Hierarchies h, const CgroupDriverOptions& o)
      : h_(std::move(h)), parent_name_("dsec-" + o.instance_id), opts_(o) {}

  std::vector<std::string> Roots() const {
    std::vector<std::string> out = {h_.memory, h_.pids, h_.cpu};
    if (!h_.cpuset.empty()) out.push_back(h_.cpuset);
    if (!h_.v2.empty()) {
      out.push_back(h_.v2);
    } else {
      out.push_back(h_.freezer);
      if (!h_.cpuacct.empty() && h_.cpuacct != h_.cpu) out.push_back(h_.cpuacct);
    }
    return out;
  }

  Status Init() {
    for (const auto& r : Roots()) {
      std::string p = JoinPath(r, parent_name_);
      if (mkdir(p.c_str(), 0755) < 0 && errno != EEXIST) return ErrnoError("mkdir \"" + p + "\"");
    }
    // A v1 cpuset starts with no CPUs and no memory nodes, and takes no process until it has
    // both: the parent gets the root's, and its children copy the parent's when made
    // (clone_children), so a sandbox's cpuset is usable from its mkdir on.
    if (!h_.cpuset.empty()) DSEC_RETURN_IF_ERROR(InitCpusetParent());
    // Children of a v1 memory cgroup inherit hierarchy; nothing else to enable.
    if (opts_.parent_memory_bytes > 0)
      DSEC_RETURN_IF_ERROR(SetParentMemoryLimit(opts_.parent_memory_bytes));
    if (opts_.parent_pids > 0)
      DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(JoinPath(h_.pids, parent_name_), "pids.max"),
                                        std::to_string(opts_.parent_pids)));
    return OkStatus();
  }

  Status InitCpusetParent() {
    std::string parent = JoinPath(h_.cpuset, parent_name_);
    for (const char* f : {"cpuset.mems", "cpuset.cpus"}) {
      DSEC_ASSIGN_OR_RETURN(std::string mine, ReadControl(JoinPath(parent, f)));
      if (!TrimWhitespace(mine).empty()) continue;
      DSEC_ASSIGN_OR_RETURN(std::string root, ReadControl(JoinPath(h_.cpuset, f)));
      DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(parent, f), std::string(TrimWhitespace(root))));
    }
    return WriteControlIfChanged(JoinPath(parent, "cgroup.clone_children"), "1");
  }

  std::string Describe() const override {
    std::string s = "v1-hybrid (memory=" + h_.memory + " pids=" + h_.pids + " cpu=" + h_.cpu;
    if (!h_.cpuset.empty()) s += " cpuset=" + h_.cpuset;
    s += h_.v2.empty() ? " freezer=" + h_.freezer : " cgroup2=" + h_.v2;
    return s + ")";
  }
  bool is_v2() const override { return false; }
  bool has_cgroup2() const override { return !h_.v2.empty(); }

  StatusOr<std::unique_ptr<Cgroup>> CreateSandbox(const std::string& name,
                                                  const CgroupLimits& limits) override {
    auto cg = std::make_unique<CgroupV1Hybrid>(name, h_, parent_name_, opts_.use_cgroup_kill);
    Status s = cg->Init(true);
    if (s.error_number() == ENOENT) {
      // Another process on this state dir removed the (then empty) parent; make it again.
      (void)cg->Destroy();
      DSEC_RETURN_IF_ERROR(Init());
      cg = std::make_unique<CgroupV1Hybrid>(name, h_, parent_name_, opts_.use_cgroup_kill);
      s = cg->Init(true);
    }
    if (!s.ok()) {
      (void)cg->Destroy();
      return s;
    }
    if (Status s = cg->SetLimits(limits); !s.ok()) {
      (void)cg->Destroy();
      return s;
    }
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::unique_ptr<Cgroup>> OpenSandbox(const std::string& name) override {
    auto cg = std::make_unique<CgroupV1Hybrid>(name, h_, parent_name_, opts_.use_cgroup_kill);
    DSEC_RETURN_IF_ERROR(cg->Init(false));
    return std::unique_ptr<Cgroup>(std::move(cg));
  }

  StatusOr<std::vector<std::string>> ListSandboxes() override {
    std::vector<std::string> out;
    for (const auto& r : Roots()) {
      auto names = internal::ListSandboxDirs(JoinPath(r, parent_name_));
      if (!names.ok()) {
        if (names.status().error_number() == ENOENT) continue;  // parent not made there yet
        return names.status();
      }
      for (auto& n : *names)
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
    }
    return out;
  }

  Status RemoveSandboxRemains(const std::string& name) override {
    Status result;
    for (const auto& r : Roots()) {
      Status s = internal::RemoveCgroupDir(JoinPath(JoinPath(r, parent_name_), name));
      if (result.ok()) result = s;
    }
    return result;
  }

  Status SetParentMemoryLimit(int64_t bytes) override {
    std::string dir = JoinPath(h_.memory, parent_name_);
    std::string v = bytes > 0 ? std::to_string(bytes) : "-1";
    std::string memsw = JoinPath(dir, "memory.memsw.limit_in_bytes");
    bool has_memsw = access(memsw.c_str(), F_OK) == 0;
    if (has_memsw && bytes <= 0) DSEC_RETURN_IF_ERROR(WriteControl(memsw, "-1"));
    DSEC_RETURN_IF_ERROR(WriteControl(JoinPath(dir, "memory.limit_in_bytes"), v));
    if (has_memsw && bytes > 0) (void)WriteControl(memsw, v);
    int64_t tcp = opts_.parent_socket_bytes > 0 && (bytes <= 0 || opts_.parent_socket_bytes < bytes)
                      ? opts_.parent_socket_bytes
                      : bytes;
    return SetSocketMemoryLimit(dir, tcp > 0 ? std::to_string(tcp) : "-1");
  }

  Status RemoveParent() override {
    Status result;
    for (const auto& r : Roots()) {
      Status s = internal::RemoveParentDir(JoinPath(r, parent_name_));
      if (result.ok()) result = s;
    }
    return result;
  }

 private:
  Hierarchies h_;
  std::string parent_name_;
  CgroupDriverOptions opts_;
};

}  // namespace

StatusOr<std::unique_ptr<CgroupDriver>> NewCgroupV1HybridDriver(
    const internal::CgroupMounts& mounts, const CgroupDriverOptions& opts) {
  Hierarchies h;
  auto find = [&](const char* c) -> std::string {
    auto it = mounts.v1.find(c);
    return it == mounts.v1.end() ? std::string() : it->second;
  };
  h.memory = find("memory");
  h.pids = find("pids");
  h.cpu = find("cpu");
  if (opts.use_cpuset) h.cpuset = find("cpuset");
  h.v2 = mounts.v2;
  if (h.v2.empty()) {
    h.freezer = find("freezer");
    h.cpuacct = find("cpuacct");
  }
  for (auto [name, path] : {std::pair{"memory", h.memory}, {"pids", h.pids}, {"cpu", h.cpu}}) {
    if (path.empty())
      return Unimplemented(std::string("cgroup v1 hierarchy for \"") + name + "\" is not mounted");
  }
  if (h.v2.empty() && h.freezer.empty())
    return Unimplemented("neither a cgroup2 mount nor a v1 freezer hierarchy is available");
  auto d = std::make_unique<CgroupV1HybridDriver>(std::move(h), opts);
  DSEC_RETURN_IF_ERROR(d->Init());
  return std::unique_ptr<CgroupDriver>(std::move(d));
}

}  // namespace dsec::isolation
