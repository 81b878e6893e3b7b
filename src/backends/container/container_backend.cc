#include "backends/container/container_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backends/container/container_instance.h"
#include "backends/container/launcher.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "isolation/disk_image.h"
#include "isolation/seccomp.h"

namespace dsec::backends::container {

namespace {

// Every live sandbox holds several of our fds (cgroup, owner lock, pidfd, netns, agent
// socket), so the usual soft limit of 1024 would cap a node at ~100 sandboxes: raise it to
// the hard limit, which is raised first (sandboxes set their own limits; see credentials).
void RaiseFileLimit() {
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_max < (1u << 20)) {
      rlimit raised = nofile;
      raised.rlim_max = 1u << 20;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile = raised;
    }
    if (nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      (void)setrlimit(RLIMIT_NOFILE, &nofile);
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<ContainerBackend>> ContainerBackend::Create(ContainerBackendOptions opts) {
  std::unique_ptr<ContainerBackend> b(new ContainerBackend(std::move(opts)));
  DSEC_RETURN_IF_ERROR(b->Init());
  return b;
}

ContainerBackend::~ContainerBackend() {
  // lxcfs serves sandboxes left running for the next backend to adopt; with none, it ends.
  if (proc_views_ && cgroups_)
    if (auto left = cgroups_->ListSandboxes(); left.ok() && left->empty()) proc_views_->Stop();
  // Only removes the parent cgroups if no sandbox uses them (rmdir refuses otherwise), so a
  // backend that goes away with sandboxes alive leaves those for the next one to adopt.
  if (cgroups_) (void)cgroups_->RemoveParent();
}

void ContainerBackend::AddViewAgent(pid_t pid) {
  MutexLock l(view_agents_mu_);
  view_agents_.insert(pid);
}

void ContainerBackend::RemoveViewAgent(pid_t pid) {
  MutexLock l(view_agents_mu_);
  view_agents_.erase(pid);
}

std::string ContainerBackend::ProcViewsState() const {
  if (!proc_views_) return proc_views_error_;
  std::string d = proc_views_->Describe();
  return d.rfind("no lxcfs", 0) == 0 ? d : "";
}

// lxcfs died: its views in running sandboxes would answer ENOTCONN. A helper process enters
// each sandbox's mount namespace and detaches them, so the kernel's files show again.
void ContainerBackend::DropProcViews() {
  std::vector<UniqueFd> namespaces;
  {
    MutexLock l(view_agents_mu_);
    for (pid_t pid : view_agents_) {
      UniqueFd ns(open(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
      if (ns) namespaces.push_back(std::move(ns));
    }
  }
  if (namespaces.empty()) return;
  std::vector<std::string> paths;
  for (const auto& name : isolation::ProcViews::Names()) paths.push_back("/proc/" + name);
  // Forked: setns into a mount namespace needs a single-threaded process. The child only makes
  // system calls on what was prepared above.
  pid_t child = fork();
  if (child < 0) {
    DSEC_LOG_ERROR("proc views: fork to drop them: {}", strerror(errno));
    return;
  }
  if (child == 0) {
    for (const auto& ns : namespaces) {
      if (setns(ns.get(), CLONE_NEWNS) < 0) continue;
      for (const auto& p : paths) (void)umount2(p.c_str(), MNT_DETACH);
    }
    _exit(0);
  }
  int st;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  DSEC_LOG_INFO("proc views: dropped in {} sandboxes", namespaces.size());
}

Status ContainerBackend::PrepareStateDirs() {
  DSEC_RETURN_IF_ERROR(MakeDirs(opts_.state_dir, 0700));
  char real[PATH_MAX];
  if (!realpath(opts_.state_dir.c_str(), real))
    return ErrnoError("realpath \"" + opts_.state_dir + "\"");
  opts_.state_dir = real;
  instance_id_ = InstanceIdForPath(opts_.state_dir);
  sandboxes_dir_ = JoinPath(opts_.state_dir, "sandboxes");
  DSEC_RETURN_IF_ERROR(MakeDirs(sandboxes_dir_, 0700));
  // Where every agent attaches its root tmpfs, each in its own mount namespace's view of
  // this one directory. A directory per sandbox would have to be removed at destroy, and
  // removing a directory that was a mount point waits for an RCU grace period (~0.5 ms).
  root_mount_dir_ = JoinPath(opts_.state_dir, "rootmnt");
  DSEC_RETURN_IF_ERROR(MakeDirs(root_mount_dir_, 0700));
  // Disk images have a name only while they are made; any named one is from a create that
  // was interrupted.
  disk_dir_ = opts_.disk_dir.empty() ? JoinPath(opts_.state_dir, "disks") : opts_.disk_dir;
  DSEC_RETURN_IF_ERROR(MakeDirs(disk_dir_, 0700));
  DSEC_ASSIGN_OR_RETURN(int stale, isolation::RemoveStaleDiskImages(disk_dir_));
  if (stale > 0) DSEC_LOG_INFO("removed {} disk images of interrupted creates", stale);
  isolation::DiskImagePool::Options po;
  po.dir = disk_dir_;
  po.preallocate = opts_.disk_preallocate;
  po.depth = opts_.disk_pool;
  disk_pool_ = std::make_unique<isolation::DiskImagePool>(po);
  return OkStatus();
}

Status ContainerBackend::Init() {
  if (geteuid() != 0) return PermissionDenied("the container backend needs root");
  if (opts_.state_dir.empty()) return InvalidArgument("state dir is required");
  DSEC_RETURN_IF_ERROR(PrepareStateDirs());
  RaiseFileLimit();

  features_ = isolation::KernelFeatures::Detect(opts_.features);
  cpu_spread_ = std::make_unique<CpuSpread>(CpuSpread::UsableNow());
  if (!opts_.proc_views) {
    proc_views_error_ = "off (config proc_views)";
  } else {
    isolation::ProcViews::Options vo;
    vo.dir = JoinPath(opts_.state_dir, "lxcfs");
    vo.on_death = [this] { DropProcViews(); };
    if (auto v = isolation::ProcViews::Start(vo); v.ok()) {
      proc_views_ = std::move(*v);
    } else {
      proc_views_error_ = v.status().message();
      if (v.status().code() == StatusCode::kNotFound)
        DSEC_LOG_INFO("sandboxes see the node's /proc/meminfo: {}", proc_views_error_);
      else
        DSEC_LOG_WARN("sandboxes see the node's /proc/meminfo: {}", proc_views_error_);
    }
  }

  isolation::CgroupDriverOptions co;
  co.instance_id = instance_id_;
  co.mode = opts_.cgroup_mode;
  co.use_cgroup_kill = features_.cgroup_kill;
  co.parent_memory_bytes = opts_.parent_memory_bytes;
  co.parent_pids = opts_.parent_pids;
  co.parent_socket_bytes = opts_.parent_socket_bytes;
  DSEC_ASSIGN_OR_RETURN(cgroups_, isolation::CgroupDriver::Create(co));

  host_image_opts_.hidden_paths = opts_.hidden_paths;
  host_image_opts_.hidden_paths.push_back(opts_.state_dir);
  host_image_opts_.hidden_paths.push_back(disk_dir_);
  DSEC_ASSIGN_OR_RETURN(auto host_image, isolation::HostImage::Prepare(host_image_opts_));
  {
    MutexLock l(host_image_mu_);
    host_image_ = std::move(host_image);
  }

  isolation::SeccompOptions so;
  so.allow_ptrace = opts_.allow_ptrace;
  DSEC_ASSIGN_OR_RETURN(seccomp_, isolation::BuildUserSeccompFilter(so));
  so.zygote = true;
  DSEC_ASSIGN_OR_RETURN(zygote_seccomp_, isolation::BuildUserSeccompFilter(so));

  if (opts_.agent_path.empty())
    opts_.agent_path = HelperBinaryPath("DSEC_AGENT_PATH", "dsec-agent", "agent");
  DSEC_ASSIGN_OR_RETURN(agent_memfd_, SealAgentBinary(opts_.agent_path));
  if (opts_.zygote_path.empty())
    opts_.zygote_path = HelperBinaryPath("DSEC_ZYGOTE_PATH", "dsec-zygote", "backends");
  // Optional: without it the node simply has no fncall workers (creating one says why).
  if (auto z = SealAgentBinary(opts_.zygote_path); z.ok()) zygote_memfd_ = std::move(*z);

  PrepareSocketBudget();
  DSEC_ASSIGN_OR_RETURN(launcher_, Launcher::Start({opts_.state_dir}));
  if (features_.userns) {
    isolation::UidRangeOptions uo;
    uo.lock_file = opts_.uid_lock_file;
    uo.base = opts_.userns_base;
    uo.count = opts_.userns_slots;
    DSEC_ASSIGN_OR_RETURN(uid_ranges_, isolation::UidRangeAllocator::Open(uo));
  }
  if (opts_.netns_pool > 0) netns_ = std::make_unique<isolation::NetnsPool>(opts_.netns_pool);
  io_ = std::make_unique<IoRunner>(std::max(1, opts_.io_threads));
  return OkStatus();
}

void ContainerBackend::PrepareSocketBudget() {
  if (opts_.sockets_per_mb == 0) {
    socket_budget_error_ = "off (sockets_per_mb 0)";
  } else if (!cgroups_->has_cgroup2()) {
    socket_budget_error_ = "no cgroup2 hierarchy to attach cgroup BPF programs to";
  } else if (auto sb = isolation::SocketBudget::Create(opts_.socket_table_entries); sb.ok()) {
    socket_budget_ = std::move(*sb);
  } else {
    socket_budget_error_ = sb.status().message();
    DSEC_LOG_WARN("sandboxes get no socket budget: {}", socket_budget_error_);
  }
}

Resources ContainerBackend::Largest() const {
  Resources r{.cpu = 0, .memory_mb = 0, .pids = 0, .disk_mb = 0};
  r.cpu = UsableCpus();
  r.memory_mb = opts_.parent_memory_bytes >> 20;
  r.pids = opts_.parent_pids;
  // A writable layer above tmpfs_disk_max_mb is a disk image in disk_dir_, which takes its
  // whole size there when preallocated: that filesystem's size is the bound. (Sparse images
  // overcommit the disk by choice: no bound.) One below lives in memory.
  struct statvfs fs;
  if (opts_.disk_preallocate && statvfs(disk_dir_.c_str(), &fs) == 0)
    r.disk_mb = std::max<int64_t>(
        opts_.tmpfs_disk_max_mb,
        static_cast<int64_t>((static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize) >> 20));
  return r;
}

std::string ContainerBackend::Describe() const {
  return "container backend instance=" + instance_id_ + " cgroups=" + cgroups_->Describe() + " " +
         features_.Describe();
}

StatusOr<isolation::HostImage> ContainerBackend::CurrentHostImage() {
  MutexLock l(host_image_mu_);
  // A new top-level entry on the host must not show through; one stat per create tells.
  if (host_image_.Stale()) {
    DSEC_ASSIGN_OR_RETURN(host_image_, isolation::HostImage::Prepare(host_image_opts_));
  }
  return host_image_;
}

StatusOr<std::shared_ptr<Sandbox>> ContainerBackend::Create(const SandboxSpec& spec) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  if (spec.image != "host" && !opts_.image_store)
    return NotFound("image \"" + spec.image +
                    "\" not found (this node has the built-in \"host\" image only)");
  auto sb = Sandbox::Start(std::make_unique<ContainerInstance>(this, spec), *io_);
  if (!sb.ok()) return sb.status().WithContext("create sandbox " + spec.id);
  return sb;
}

StatusOr<std::shared_ptr<Sandbox>> ContainerBackend::Adopt(const SandboxSpec& spec,
                                                           const std::string& handle) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  auto sb = Sandbox::Adopt(std::make_unique<ContainerInstance>(this, spec), *io_, handle);
  if (!sb.ok()) return sb.status().WithContext("adopt sandbox " + spec.id);
  return sb;
}

StatusOr<int> ContainerBackend::CleanupOrphans() {
  std::vector<std::string> names;
  if (DIR* d = opendir(sandboxes_dir_.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.' || StartsWith(e->d_name, ".tmp-")) names.emplace_back(e->d_name);
    closedir(d);
  }
  // Cgroups without a directory (a crash between the two) are orphans too.
  if (auto cgs = cgroups_->ListSandboxes(); cgs.ok())
    for (const auto& n : *cgs)
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  int cleaned = 0;
  for (const auto& name : names) {
    std::string dir = JoinPath(sandboxes_dir_, name);
    if (StartsWith(name, ".tmp-")) {  // a create that died before its directory was ready
      UniqueFd lock(open(JoinPath(dir, "owner.lock").c_str(), O_RDWR | O_CLOEXEC));
      if (!lock || flock(lock.get(), LOCK_EX | LOCK_NB) == 0) (void)RemoveTree(dir);
      continue;
    }
    if (!IsSafeName(name)) continue;
    UniqueFd lock(open(JoinPath(dir, "owner.lock").c_str(), O_RDWR | O_CLOEXEC));
    if (lock && flock(lock.get(), LOCK_EX | LOCK_NB) < 0) continue;  // alive and owned
    if (auto cg = cgroups_->OpenSandbox(name); cg.ok())
      (void)(*cg)->Destroy();
    else  // a set a crash left half made or half removed
      (void)cgroups_->RemoveSandboxRemains(name);
    (void)RemoveTree(dir);
    ++cleaned;
  }
  return cleaned;
}

Status ContainerBackend::Shutdown() { return cgroups_->RemoveParent(); }

}  // namespace dsec::backends::container
