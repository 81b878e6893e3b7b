#include "backends/container/container_instance.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <tuple>

#include "backends/container/adoption_handle.h"
#include "backends/container/container_backend.h"
#include "backends/container/root_mounts.h"
#include "backends/rootfs_plan.h"
#include "backends/session/bootstrap.h"
#include "base/clock.h"
#include "base/fd_passing.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/in_root.h"
#include "base/logging.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "images/capture.h"
#include "isolation/disk_image.h"
#include "isolation/host_image.h"
#include "isolation/userns.h"
#include "protocol/agent_ops.h"

namespace dsec::backends::container {

namespace {

// agent.sock in the sandbox directory `dirfd`, through /proc/self/fd (no sun_path limit).
sockaddr_un AgentSocketAddress(int dirfd) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/agent.sock", dirfd);
  return addr;
}

}  // namespace

ContainerInstance::ContainerInstance(ContainerBackend* backend, SandboxSpec spec)
    : backend_(backend),
      spec_(std::move(spec)),
      net_(
          backend_->opts_.network, [this] { return OpenNetns(); }, spec_.id) {
  if (spec_.hostname.empty()) spec_.hostname = spec_.id;
  dir_ = JoinPath(backend_->sandboxes_dir_, spec_.id);
}

Status ContainerInstance::ClaimDirectory() {
  ContainerBackend& b = *backend_;
  // The directory appears under its final name only once its owner lock is held, so orphan
  // cleanup in another process can never take a sandbox that is being created.
  std::string tmp = JoinPath(b.sandboxes_dir_, ".tmp-" + spec_.id);
  if (mkdir(tmp.c_str(), 0700) < 0) {
    if (errno == EEXIST)
      return Status(StatusCode::kAlreadyExists, "sandbox " + spec_.id + " is being created");
    return ErrnoError("mkdir \"" + tmp + "\"");
  }
  tmp_created_ = true;
  lock_fd_.Reset(open(JoinPath(tmp, "owner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd_ || flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0)
    return ErrnoError("lock sandbox dir");
  if (rename(tmp.c_str(), dir_.c_str()) < 0) {
    Status s = errno == EEXIST || errno == ENOTEMPTY
                   ? Status(StatusCode::kAlreadyExists, "sandbox " + spec_.id + " already exists")
                   : ErrnoError("rename \"" + tmp + "\"");
    (void)RemoveTree(tmp);
    tmp_created_ = false;
    dir_.clear();  // not ours: Destroy must not touch it
    return s;
  }
  tmp_created_ = false;
  return OkStatus();
}

Status ContainerInstance::AcquireImage() {
  if (spec_.image == "host") {
    stack_.base = "host";
  } else {
    std::vector<std::string> names;
    for (auto n : SplitString(spec_.image, ',', /*skip_empty=*/true)) names.emplace_back(n);
    DSEC_ASSIGN_OR_RETURN(stack_, backend_->opts_.image_store->Acquire(names, spec_.id));
    holds_image_ = true;
    // The image's environment, under what the caller asked for.
    MergeImageEnv(stack_.config.env, &spec_.env);
  }
  return OkStatus();
}

StatusOr<AgentLink> ContainerInstance::Start() {
  ContainerBackend& b = *backend_;
  DSEC_RETURN_IF_ERROR(ClaimDirectory());
  DSEC_RETURN_IF_ERROR(AcquireImage());

  bool userns = b.features_.userns;
  uint32_t root_uid = 0;
  if (userns) {
    // A host-wide lease: no other edge on this host gives its sandboxes these ids.
    DSEC_ASSIGN_OR_RETURN(isolation::UidLease lease, b.uid_ranges_->Acquire());
    uid_slot_ = lease.slot;
    uid_lease_ = std::move(lease.fd);
    root_uid = lease.first_id;
    id_base_ = root_uid;
  }

  // Big writable layers are disk images; smaller ones a tmpfs, whose pages count as memory.
  // An fncall worker keeps a tmpfs: its calls run in fresh tmpfs directories of their own (in
  // its memory limit) and barely touch the layer, and pools make workers in bulk.
  disk_image_ =
      WritableLayerOnDisk(spec_.resources.disk_mb, b.opts_.tmpfs_disk_max_mb) && !spec_.worker;
  isolation::CgroupLimits limits;
  limits.memory_bytes = (spec_.resources.memory_mb + (disk_image_ ? 0 : spec_.resources.disk_mb))
                        << 20;
  limits.pids = spec_.resources.pids;
  limits.cpu = spec_.resources.cpu;
  DSEC_ASSIGN_OR_RETURN(auto cg, b.cgroups_->CreateSandbox(spec_.id, limits));
  cgroup_ = std::move(cg);
  if (userns) DSEC_RETURN_IF_ERROR(cgroup_->Delegate(root_uid, root_uid));
  // Before any process is in the cgroup: every socket of the sandbox is counted.
  if (b.socket_budget_ && cgroup_->CloneIntoFd() >= 0) {
    uint64_t limit = std::max<uint64_t>(
        256, static_cast<uint64_t>(limits.memory_bytes >> 20) * b.opts_.sockets_per_mb);
    DSEC_RETURN_IF_ERROR(b.socket_budget_->Attach(cgroup_->CloneIntoFd(), limit));
  }

  if (cgroup_->CloneIntoFd() >= 0) DSEC_RETURN_IF_ERROR(net_.SetCgroup(cgroup_->CloneIntoFd()));
  if (b.netns_) {
    DSEC_ASSIGN_OR_RETURN(netns_, b.netns_->Acquire());
  } else if (spec_.network.mode != net::NetMode::kNone) {
    DSEC_ASSIGN_OR_RETURN(netns_, isolation::NetnsPool::CreateLoopbackOnly());
  }
  // Its network exists, policy applied, before anything of the sandbox runs.
  if (spec_.network.mode != net::NetMode::kNone) DSEC_RETURN_IF_ERROR(net_.Apply(spec_.network));
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) return ErrnoError("socketpair");
  UniqueFd conn(sp[0]), child_end(sp[1]);
  LaunchRequest lr;
  lr.agent_memfd = b.agent_memfd_.get();
  lr.channel_fd = child_end.get();
  lr.userns = userns;
  // The user namespace's owner: the last id of the sandbox's own range, not root, so the
  // budgets the kernel charges to a namespace's owner (pending signals, message queues,
  // inotify instances, namespaces) are this sandbox's alone, never the edge's or a neighbour's.
  if (userns) lr.userns_owner = root_uid + (b.uid_ranges_->options().size - 1);
  bool clone_into = b.features_.clone_into_cgroup && cgroup_->CloneIntoFd() >= 0;
  lr.cgroup_fd = clone_into ? cgroup_->CloneIntoFd() : -1;
  lr.netns_fd = netns_.ns.get();
  DSEC_ASSIGN_OR_RETURN(PendingAgent pending, b.launcher_->Launch(lr));
  agent_ = std::make_unique<PendingAgent>(std::move(pending));
  agent_pid_ = agent_->pid();
  child_end.Reset();
  // The CPUs it is shown (and runs on), set before the agent runs: every process inherits them.
  cpus_ = b.cpu_spread_->Take(spec_.resources.cpu);
  // A bound too where the host has cpusets (root inside cannot widen it), and what lxcfs's
  // /proc/cpuinfo and /proc/stat show the sandbox.
  if (!cpus_.empty()) DSEC_RETURN_IF_ERROR(cgroup_->SetCpus(CpuListText(cpus_)));
  if (!cpus_.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus_) CPU_SET(c, &set);
    if (sched_setaffinity(agent_pid_, sizeof set, &set) < 0)
      return ErrnoError("set the CPUs of sandbox " + spec_.id);
  }

  UniqueFd userns_fd;
  if (userns) {
    DSEC_RETURN_IF_ERROR(isolation::WriteIdMaps(agent_pid_, {root_uid, 65536}));
    DSEC_ASSIGN_OR_RETURN(userns_fd, isolation::OpenUserns(agent_pid_));
  }
  DSEC_RETURN_IF_ERROR(cgroup_->AddProcess(agent_pid_, clone_into));
  // Keep the agent from being the OOM victim. Best effort: some hosts refuse negative
  // values even to root; user processes start at +500 (spawn.cc) so they go first anyway.
  (void)WriteStringToFile("/proc/" + std::to_string(agent_pid_) + "/oom_score_adj", "-1000");
  DSEC_RETURN_IF_ERROR(agent_->Release());
  DSEC_RETURN_IF_ERROR(Handshake(conn.get(), userns_fd.get()));

  // Running now: what only the start needed goes (each is a descriptor per live sandbox).
  agent_->DropPidfd();
  cgroup_->ReleaseCloneFd();
  AgentLink link;
  link.stream = std::move(conn);
  return link;
}

// Connects to the running agent's socket, and checks that whoever listens there is this
// sandbox's agent: PID 1 of a pid namespace, in its cgroup.
StatusOr<UniqueFd> ContainerInstance::ConnectToAgent(pid_t* agent_pid) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd dirfd, OpenDir(dir_, O_PATH));
  UniqueFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!conn) return ErrnoError("socket");
  sockaddr_un addr = AgentSocketAddress(dirfd.get());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("connect to the agent of " + spec_.id);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0)
    return ErrnoError("SO_PEERCRED agent.sock");
  if (!InOwnCgroup(cred.pid))
    return FailedPrecondition("the process behind agent.sock is not in sandbox " + spec_.id);
  // (No pidfd is kept for it: one descriptor less per sandbox. Destroy opens one and checks
  // the process again.)
  *agent_pid = cred.pid;
  return conn;
}

StatusOr<AgentLink> ContainerInstance::Adopt(const std::string& handle) {
  ContainerBackend& b = *backend_;
  DSEC_ASSIGN_OR_RETURN(container::AdoptionHandle h, container::AdoptionHandle::Parse(handle));
  secret_ = h.secret;
  lock_fd_.Reset(open(JoinPath(dir_, "owner.lock").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock_fd_) {
    Status s = ErrnoError("open \"" + JoinPath(dir_, "owner.lock") + "\"");
    dir_.clear();  // nothing of ours to clean up here
    return s;
  }
  if (flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0) {
    lock_fd_.Reset();
    dir_.clear();  // another live process owns it: hands off
    return Status(StatusCode::kAlreadyExists,
                  "sandbox " + spec_.id + " is owned by another process");
  }
  if (h.uid_slot >= 0) {
    if (!b.uid_ranges_) return FailedPrecondition("user namespaces are off on this edge");
    // The agent holds the lease (a sandbox from an edge before leases: we hold it now).
    DSEC_ASSIGN_OR_RETURN(uid_lease_, b.uid_ranges_->Claim(static_cast<uint32_t>(h.uid_slot)));
    uid_slot_ = h.uid_slot;
  }
  layer_fd_ = h.layer_fd;
  id_base_ = h.id_base;
  disk_image_ = h.disk_image;
  overlay_targets_ = std::move(h.overlays);
  stack_.base = h.base;
  if (b.opts_.image_store)
    for (const auto& d : h.layer_digests)
      if (auto l = b.opts_.image_store->GetLayer(d); l.ok()) stack_.layers.push_back(*l);
  holds_image_ = !stack_.layers.empty();
  DSEC_ASSIGN_OR_RETURN(auto cg, b.cgroups_->OpenSandbox(spec_.id));
  cgroup_ = std::move(cg);
  // Its cgroup2 directory (an adopted cgroup keeps no descriptor): the egress guard of this
  // edge takes over from the last one's.
  if (auto user = cgroup_->OpenUserDir(); user.ok() && *user) {
    UniqueFd dir(openat(user->get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return ErrnoError("open the cgroup2 directory of sandbox " + spec_.id);
    DSEC_RETURN_IF_ERROR(net_.SetCgroup(dir.get()));
  }
  DSEC_RETURN_IF_ERROR(net_.Readopt({h.net_addr, h.net_if}, spec_.network));
  // A frozen agent cannot answer: thaw for the handshake, freeze again after.
  bool frozen = cgroup_->IsFrozen().value_or(false);
  if (frozen) DSEC_RETURN_IF_ERROR(cgroup_->Thaw());

  pid_t agent_pid = -1;
  DSEC_ASSIGN_OR_RETURN(UniqueFd conn, ConnectToAgent(&agent_pid));
  adopted_ = true;
  agent_pid_ = agent_pid;
  // It may have views (made by an earlier edge): dropped too should lxcfs die.
  if (b.proc_views_) {
    b.AddViewAgent(agent_pid_);
    view_agent_ = true;
  }
  // The CPUs it was given count again.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(agent_pid_, sizeof set, &set) == 0) {
    std::vector<int> cpus = CpusOf(set);
    if (cpus.size() < b.cpu_spread_->usable()) {
      cpus_ = std::move(cpus);
      b.cpu_spread_->Claim(cpus_);
    }
  }

  DSEC_ASSIGN_OR_RETURN(
      protocol::Hello hello,
      Reauthenticate(conn.get(), secret_, MonotonicMs() + b.opts_.setup_timeout_ms));
  if (frozen) DSEC_RETURN_IF_ERROR(cgroup_->Freeze());
  // The agent sends nothing after its hello before our first request: the session starts on
  // the bare connection.
  AgentLink link;
  link.stream = std::move(conn);
  link.shells = std::move(hello.shells);
  link.paused = frozen;
  return link;
}

std::string ContainerInstance::AdoptionHandle() const {
  container::AdoptionHandle h;
  h.secret = secret_;
  h.uid_slot = uid_slot_;
  h.layer_fd = layer_fd_;
  h.id_base = id_base_;
  h.disk_image = disk_image_;
  h.overlays = overlay_targets_;
  h.base = stack_.base;
  for (const auto& l : stack_.layers) h.layer_digests.push_back(l.digest);
  h.net_addr = net_.attachment().addr;
  h.net_if = net_.attachment().host_if;
  return h.Encode();
}

void ContainerInstance::Detach() {
  destroyed_ = true;  // nothing for a later Destroy to do
  // Still in use by the agent: never back into the pool; its network stays for the next edge.
  netns_ = {};
  net_.Forget();
  agent_.reset();  // already exec'd: nothing is killed
  adopted_ = false;
  lock_fd_.Reset();
  dir_.clear();
  cgroup_.reset();
  if (uid_slot_ >= 0) {
    backend_->uid_ranges_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  uid_lease_.Reset();
}

StatusOr<UniqueFd> ContainerInstance::BindAgentSocket() {
  DSEC_ASSIGN_OR_RETURN(UniqueFd dirfd, OpenDir(dir_, O_PATH));
  // A restarted edge reconnects here.
  UniqueFd listen_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd) return ErrnoError("socket");
  sockaddr_un addr = AgentSocketAddress(dirfd.get());
  if (bind(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("bind agent.sock");
  if (fchmodat(dirfd.get(), "agent.sock", 0600, 0) < 0) return ErrnoError("chmod agent.sock");
  // The agent calls listen(), so that SO_PEERCRED on a reconnect names it (see Adopt).
  return listen_fd;
}

Status ContainerInstance::PrepareRoot(int userns_fd, isolation::RootfsSpec* r,
                                      std::vector<UniqueFd>* layers) {
  ContainerBackend& b = *backend_;
  isolation::HostImage host;
  if (stack_.base == "host") {
    DSEC_ASSIGN_OR_RETURN(host, b.CurrentHostImage());
  }
  DSEC_ASSIGN_OR_RETURN(RootSources sources,
                        GatherRootSources(stack_, std::move(host), b.opts_.image_store));
  RootfsInputs in = sources.inputs;
  in.hostname = spec_.hostname;
  in.nameserver = b.opts_.nameserver;
  in.workdir = spec_.workdir;
  // A user the node cannot resolve was refused before.
  in.workdir_uid = kSandboxUid, in.workdir_gid = kSandboxGid;
  if (auto u = ResolveUser(spec_.user); u.ok()) in.workdir_uid = u->uid, in.workdir_gid = u->gid;
  in.disk_mb = spec_.resources.disk_mb;
  in.inodes_per_mb = b.opts_.inodes_per_mb;
  in.tmpfs_disk_max_mb = b.opts_.tmpfs_disk_max_mb;
  in.cpu_list = CpuListText(cpus_);
  RootfsPlan plan = PlanRootfs(in);
  DSEC_ASSIGN_OR_RETURN(r->overlays, MountLowers(plan, sources, userns_fd, layers));
  r->size_bytes = plan.size_bytes;
  r->inodes = plan.inodes;
  r->userns = userns_fd >= 0;
  r->pty_max = b.opts_.pty_max;
  // SysV shared memory nobody has attached goes with its last user instead of living (charged
  // to the sandbox, invisible to its processes' accounting) until the sandbox is deleted.
  r->sysctls = {{"kernel/shm_rmid_forced", "1"}};
  r->dirs = std::move(plan.dirs);
  r->files = std::move(plan.files);
  overlay_targets_.clear();
  for (const auto& o : r->overlays) overlay_targets_.push_back(o.target);
  return OkStatus();
}

Status ContainerInstance::AddZygote(int userns_fd, protocol::SetupSpec* setup) {
  ContainerBackend& b = *backend_;
  protocol::SetupSpec& s = *setup;
  // The zygote mounts each call's tmpfs and makes its namespaces: CAP_SYS_ADMIN, which only
  // means something inside the sandbox's own user namespace.
  if (userns_fd < 0)
    return FailedPrecondition("fncall workers need user namespaces (userns is off or missing)");
  if (!b.zygote_memfd_)
    return FailedPrecondition("dsec-zygote not found at \"" + b.opts_.zygote_path + "\"");
  const WorkerSpec& w = *spec_.worker;
  protocol::ZygoteSpec z;
  const bool exec = w.runtime != FnRuntime::kPython;
  z.args = {std::string("--runtime=") + (exec ? "exec" : "python"), "--workdir=" + spec_.workdir,
            "--tmpfs-mb=" + std::to_string(w.call_disk_mb),
            "--inodes=" + std::to_string(std::max<int64_t>(4096, w.call_disk_mb * 256))};
  if (!w.preload.empty()) z.args.push_back("--preload=" + JoinStrings(w.preload, ","));
  DSEC_ASSIGN_OR_RETURN(UserIds u, ResolveUser(spec_.user));
  z.args.push_back("--uid=" + std::to_string(u.uid));
  z.args.push_back("--gid=" + std::to_string(u.gid));
  if (exec) {
    z.args.push_back("--");
    for (const auto& a : w.command) z.args.push_back(a);
  }
  z.env = BaseEnv(u, spec_.hostname, false);
  for (const auto& [k, v] : spec_.env) SetEnv(&z.env, k, v);
  z.call_seccomp = b.seccomp_;
  z.caps = isolation::RootCapabilities() | isolation::CapMask({CAP_SYS_ADMIN});
  s.agent_caps |= z.caps;
  s.seccomp = b.zygote_seccomp_;
  s.zygote = std::move(z);
  return OkStatus();
}

Status ContainerInstance::Handshake(int conn, int userns_fd) {
  ContainerBackend& b = *backend_;
  AgentBootstrap boot(conn);
  DSEC_RETURN_IF_ERROR(boot.ExpectHello(MonotonicMs() + b.opts_.setup_timeout_ms).status());
  agent_->Execd();

  DSEC_ASSIGN_OR_RETURN(UniqueFd listen_fd, BindAgentSocket());
  // Opened through the agent's root so the fd names the agent's (private) copy of the
  // directory: move_mount only attaches onto mounts in the caller's namespace.
  DSEC_ASSIGN_OR_RETURN(
      UniqueFd mount_dir,
      OpenDir("/proc/" + std::to_string(agent_pid_) + "/root" + b.root_mount_dir_, O_PATH));
  DSEC_ASSIGN_OR_RETURN(UniqueFd cg_user, cgroup_->OpenUserDir());
  std::vector<UniqueFd> layers;
  protocol::SetupSpec s;
  DSEC_RETURN_IF_ERROR(PrepareRoot(userns_fd, &s.rootfs, &layers));
  s.sandbox_id = spec_.id;
  s.hostname = spec_.hostname;
  secret_ = RandomHex(32);
  s.secret = secret_;
  const auto& r = s.rootfs;
  // No file size limit unless the node sets one (rlimits.fsize 0 = unlimited): every writable
  // place in the sandbox is inside its size-capped writable layer, so a full disk is ENOSPC as
  // on a normal machine, not SIGXFSZ at some size (programs and test suites expect the former).
  s.rlimits = b.opts_.rlimits;
  s.seccomp = b.seccomp_;
  s.agent_caps = isolation::RootCapabilities() | isolation::CapMask({CAP_DAC_READ_SEARCH});
  if (spec_.worker) DSEC_RETURN_IF_ERROR(AddZygote(userns_fd, &s));
  s.cgroup_kill = b.features_.cgroup_kill;
  s.max_execs = b.opts_.max_execs_per_sandbox;
  s.orphan_timeout_ms = b.opts_.orphan_timeout_ms;
  std::vector<int> fds = {mount_dir.get(), listen_fd.get()};
  s.fds.mount_dir = 0;
  s.fds.listen = 1;
  if (cg_user) {
    s.fds.cgroup_user = static_cast<int>(fds.size());
    fds.push_back(cg_user.get());
  }
  if (disk_image_) {
    isolation::DiskImageSpec d;
    d.dir = b.disk_dir_;
    d.name = spec_.id;
    d.bytes = r.size_bytes;
    d.inodes = r.inodes;
    d.owner = d.group = id_base_;  // the sandbox's root (0 without a user namespace)
    d.preallocate = b.opts_.disk_preallocate;
    DSEC_ASSIGN_OR_RETURN(disk_mount_, b.disk_pool_->Take(d));
    s.fds.disk = static_cast<int>(fds.size());
    fds.push_back(disk_mount_.get());
  }
  if (uid_lease_) {
    s.fds.uid_lease = static_cast<int>(fds.size());
    fds.push_back(uid_lease_.get());
  }
  s.fds.first_layer = static_cast<int>(fds.size());
  s.fds.layer_count = static_cast<int>(layers.size());
  for (const auto& l : layers) fds.push_back(l.get());
  if (spec_.worker) {
    s.fds.zygote_binary = static_cast<int>(fds.size());
    fds.push_back(b.zygote_memfd_.get());
  }
  // Its own memory in /proc/meminfo while lxcfs serves; the node's otherwise (never an error).
  std::vector<UniqueFd> views;
  if (b.proc_views_) {
    if (auto v = b.proc_views_->Clone(); v.ok()) {
      views = std::move(*v);
      s.rootfs.proc_views = isolation::ProcViews::Names();
      s.fds.first_proc_view = static_cast<int>(fds.size());
      for (const auto& fd : views) fds.push_back(fd.get());
      b.AddViewAgent(agent_pid_);
      view_agent_ = true;
    }
  }

  DSEC_RETURN_IF_ERROR(boot.SendSetup(protocol::ToJson(s), fds));
  DSEC_ASSIGN_OR_RETURN(protocol::Ready ready,
                        boot.ExpectReady(MonotonicMs() + b.opts_.setup_timeout_ms));
  // The agent holds the uid range's lease from here on; one fd less for the edge per sandbox.
  uid_lease_.Reset();
  layer_fd_ = ready.layer_fd;
  return OkStatus();
}

bool ContainerInstance::InOwnCgroup(pid_t pid) const {
  auto cgroups = ReadFileToString("/proc/" + std::to_string(pid) + "/cgroup");
  return cgroups.ok() && cgroups->find("/" + spec_.id + "\n") != std::string::npos;
}

OomCounter ContainerInstance::OomKills() {
  // The cgroup object outlives the instance in the closure (it only reads a counter file).
  return [cg = cgroup_]() -> uint64_t { return cg ? cg->OomKills().value_or(0) : 0; };
}

Status ContainerInstance::Pause() { return cgroup_->Freeze(); }

Status ContainerInstance::Resume() { return cgroup_->Thaw(); }

Status ContainerInstance::SetMemoryLimit(int64_t bytes) {
  if (!cgroup_) return FailedPrecondition("sandbox " + spec_.id + " has no cgroup");
  isolation::CgroupLimits limits;
  limits.memory_bytes = bytes;
  limits.pids = spec_.resources.pids;
  limits.cpu = spec_.resources.cpu;
  return cgroup_->SetLimits(limits);
}

StatusOr<SandboxStats> ContainerInstance::Stats() {
  if (!cgroup_) return FailedPrecondition("sandbox " + spec_.id + " has no cgroup");
  DSEC_ASSIGN_OR_RETURN(isolation::CgroupStats c, cgroup_->Stats());
  SandboxStats s;
  s.memory_current = c.memory_current;
  s.memory_peak = c.memory_peak;
  s.memory_limit =
      static_cast<uint64_t>(spec_.resources.memory_mb + (disk_image_ ? 0 : spec_.resources.disk_mb))
      << 20;
  s.cpu_usage_us = c.cpu_usage_us;
  s.pids = c.pids_current;
  s.oom_kills = c.oom_kills;
  s.disk_used = c.shmem;
  if (disk_image_) {
    DSEC_ASSIGN_OR_RETURN(s.disk_used, DiskImageUsed());
    s.disk_kind = "image";
  }
  s.disk_limit = static_cast<uint64_t>(spec_.resources.disk_mb) << 20;
  return s;
}

StatusOr<uint64_t> ContainerInstance::DiskImageUsed() {
  if (layer_fd_ < 0) return FailedPrecondition("sandbox " + spec_.id + " has no writable layer fd");
  std::string fd = "/proc/" + std::to_string(agent_pid_) + "/fd/" + std::to_string(layer_fd_);
  struct statfs sfs;
  if (statfs(fd.c_str(), &sfs) < 0) return ErrnoError("statfs the writable layer of " + spec_.id);
  if (sfs.f_type != EXT4_SUPER_MAGIC)
    return FailedPrecondition("the writable layer of " + spec_.id + " is not its disk image");
  return static_cast<uint64_t>(sfs.f_blocks - sfs.f_bfree) * static_cast<uint64_t>(sfs.f_bsize);
}

Status ContainerInstance::Destroy() {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  Status result;
  if (cgroup_) (void)cgroup_->KillAll();
  // Killing PID 1 of the pid namespace takes every process in it along; reap it.
  if (agent_) agent_->Abort();
  if (adopted_ && agent_pid_ > 0) {
    // Not our child: init reaps it. The cgroup kill above already took it; this is for hosts
    // where that failed, and only if the pid is still a process of this sandbox.
    if (auto p = PidFd::Open(agent_pid_); p.ok() && InOwnCgroup(agent_pid_)) {
      (void)p->SendSignal(SIGKILL);
      (void)p->WaitReadable(2000);
    }
    adopted_ = false;
  }
  // Its rules and conntrack entries go now; the veth goes with the namespace.
  bool networked = net_.attached();
  net_.Detach();
  // Nothing runs in the network namespace any more (the agent, PID 1 of the only pid
  // namespace in it, is reaped), so it can serve another sandbox, unless it has a network.
  if (netns_.ns && backend_->netns_ && !networked) backend_->netns_->Release(std::move(netns_));
  netns_ = {};
  if (cgroup_) result = cgroup_->Destroy();
  // Nothing of the sandbox runs any more (the cgroup is empty): its disk can be shut down.
  if (disk_mount_) backend_->disk_pool_->Release(std::move(disk_mount_));
  if (!dir_.empty()) {
    // The directory holds exactly these (and "mnt" if an older edge made it); anything else
    // falls back to the tree walk.
    for (const char* f : {"agent.sock", "owner.lock"}) (void)unlink(JoinPath(dir_, f).c_str());
    if (rmdir(dir_.c_str()) < 0 && errno != ENOENT) {
      Status s = RemoveTree(dir_);
      if (result.ok()) result = s;
    }
  }
  if (tmp_created_) (void)RemoveTree(JoinPath(backend_->sandboxes_dir_, ".tmp-" + spec_.id));
  lock_fd_.Reset();
  if (uid_slot_ >= 0) {
    backend_->uid_ranges_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  uid_lease_.Reset();
  backend_->cpu_spread_->Give(cpus_);
  cpus_.clear();
  if (view_agent_) backend_->RemoveViewAgent(agent_pid_);
  view_agent_ = false;
  if (holds_image_ && backend_->opts_.image_store) {
    holds_image_ = false;
    backend_->opts_.image_store->Release(spec_.id);
    if (auto n = backend_->opts_.image_store->Collect(); !n.ok())
      DSEC_LOG_WARN("image store: collect: {}", n.status().ToString());
  }
  return result;
}

StatusOr<UniqueFd> ContainerInstance::OpenNetns() const {
  if (netns_.ns) {
    UniqueFd fd(fcntl(netns_.ns.get(), F_DUPFD_CLOEXEC, 3));
    if (!fd) return ErrnoError("dup the network namespace of sandbox " + spec_.id);
    return fd;
  }
  // Pooling off, or adopted: the agent's namespace.
  UniqueFd fd(
      open(("/proc/" + std::to_string(agent_pid_) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd || !InOwnCgroup(agent_pid_))
    return ErrnoError("open the network namespace of sandbox " + spec_.id);
  return fd;
}

StatusOr<std::vector<std::string>> ContainerInstance::CaptureStack(bool keep_setuid, bool running,
                                                                   const CaptureProgress& progress,
                                                                   AgentSession*) {
  images::ImageStore* store = backend_->opts_.image_store;
  if (!store) return FailedPrecondition("this node has no image store");
  if (layer_fd_ < 0 || overlay_targets_.empty())
    return FailedPrecondition("sandbox " + spec_.id +
                              " was started by an older agent and cannot be snapshotted");
  // The agent holds the writable layer's tmpfs (or disk image); through its fd table we reach
  // the very mount (nothing inside the sandbox can). It must be that filesystem, with the upper
  // dirs the setup made.
  UniqueFd tmpfs(
      open(("/proc/" + std::to_string(agent_pid_) + "/fd/" + std::to_string(layer_fd_)).c_str(),
           O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!tmpfs) return ErrnoError("open the writable layer of " + spec_.id);
  struct statfs sfs;
  if (fstatfs(tmpfs.get(), &sfs) < 0 ||
      sfs.f_type != (disk_image_ ? EXT4_SUPER_MAGIC : TMPFS_MAGIC))
    return FailedPrecondition("the writable layer of " + spec_.id + " is not its " +
                              (disk_image_ ? "disk image" : "tmpfs"));
  std::vector<UniqueFd> uppers;
  std::vector<images::CaptureSource> sources;
  for (size_t i = 0; i < overlay_targets_.size(); ++i) {
    std::string rel = "up/" + std::to_string(i);
    StatusOr<UniqueFd> up =
        OpenInRoot(tmpfs.get(), rel, O_RDONLY | O_DIRECTORY, InRoot::kBeneathOneMount);
    if (!up.ok()) return up.status().WithContext("upper dir of " + spec_.id);
    sources.push_back({up->get(), overlay_targets_[i]});
    uppers.push_back(std::move(up).value());
  }
  images::CaptureOptions co;
  co.id_base = id_base_;
  // Per-sandbox files the edge writes at every create, and mount points.
  co.skip = {"/etc/hostname", "/etc/hosts"};
  co.empty = {"/proc", "/sys", "/dev"};
  co.keep_setuid = keep_setuid;
  co.max_apparent_bytes = store->options().max_layer_bytes;

  images::ImageStore::Lease lease(store);
  DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer());
  // Frozen while read, so the layer is one consistent state (a paused sandbox stays paused).
  bool thaw = running;
  if (thaw) DSEC_RETURN_IF_ERROR(cgroup_->Freeze());
  uint64_t read = 0;
  Status captured = images::WriteLayerTar(
      sources, co,
      [&](std::string_view d) {
        read += d.size();
        if (progress) progress(read, false);
        return builder->Feed(d);
      },
      nullptr);
  if (thaw) {
    if (Status s = cgroup_->Thaw(); !s.ok()) {
      DSEC_LOG_ERROR("thaw {} after snapshot: {}", spec_.id, s.ToString());
      if (captured.ok()) captured = s;
    }
  }
  DSEC_RETURN_IF_ERROR(captured.WithContext("capture the writable layer of " + spec_.id));
  if (progress) progress(read, true);
  DSEC_ASSIGN_OR_RETURN(images::LayerInfo layer, builder->Commit());
  std::vector<std::string> out;
  if (stack_.base == "host") out.push_back("host");
  for (const auto& x : stack_.layers) out.push_back(x.digest);
  if (std::find(out.begin(), out.end(), layer.digest) == out.end()) out.push_back(layer.digest);
  return out;
}

}  // namespace dsec::backends::container
