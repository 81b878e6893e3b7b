#include "backends/microvm/microvm_instance.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "backends/microvm/adoption_handle.h"
#include "backends/microvm/microvm_backend.h"
#include "backends/microvm/qemu_cmd.h"
#include "backends/root_sources.h"
#include "backends/rootfs_plan.h"
#include "backends/session/agent_session.h"
#include "backends/session/bootstrap.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "isolation/jail.h"
#include "protocol/agent_ops.h"
#include "protocol/messages.h"

namespace dsec::backends::microvm {

namespace {

constexpr int kMaxLayers = 24;  // /dev/vda .. /dev/vdx
constexpr size_t kLogTail = 600;

// Where the descriptors QEMU inherits land (QemuConfig names them).
enum : int { kKernelFd = 3, kInitrdFd, kAgentFd, kQmpFd, kLeaseFd, kRamFd, kTapFd, kFirstLayerFd };
// How long a clone waits for the hello of a guest that may not have noticed the template's
// host end go (it then still waits in read(): a reconnect makes it greet).
constexpr int kCloneHelloMs = 3000;

// The last `n` bytes of a file (what QEMU printed before it died).
std::string FileTail(const std::string& path, size_t n) {
  auto s = ReadFileToString(path, 1 << 20);
  if (!s.ok() || s->empty()) return "";
  std::string t = s->size() > n ? s->substr(s->size() - n) : *s;
  return std::string(TrimWhitespace(t));
}

}  // namespace

MicrovmInstance::MicrovmInstance(MicrovmBackend* backend, SandboxSpec spec)
    : backend_(backend),
      spec_(std::move(spec)),
      // No namespace: a VM's network is the tap made at its start (AttachTap).
      net_(backend_->opts_.network, nullptr, spec_.id) {
  if (spec_.hostname.empty()) spec_.hostname = spec_.id;
  dir_ = JoinPath(backend_->vms_dir_, spec_.id);
}

Status MicrovmInstance::ClaimDirectory() {
  if (mkdir(dir_.c_str(), 0700) < 0) {
    Status s = errno == EEXIST
                   ? Status(StatusCode::kAlreadyExists, "sandbox " + spec_.id + " already exists")
                   : ErrnoError("mkdir \"" + dir_ + "\"");
    dir_.clear();  // not ours: Destroy must not touch it
    return s;
  }
  dir_owned_ = true;
  lock_fd_.Reset(open(JoinPath(dir_, "owner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd_ || flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0)
    return ErrnoError("lock the directory of " + spec_.id);
  return OkStatus();
}

Status MicrovmInstance::AcquireImage(std::vector<UniqueFd>* layers) {
  images::ImageStore* store = backend_->opts_.image_store;
  if (!store) return FailedPrecondition("this node has no image store");
  std::vector<std::string> names;
  for (auto n : SplitString(spec_.image, ',', /*skip_empty=*/true)) names.emplace_back(n);
  DSEC_ASSIGN_OR_RETURN(stack_, store->Acquire(names, spec_.id));
  holds_image_ = true;
  if (stack_.base == "host")
    return Unimplemented("image \"" + spec_.image +
                         "\" is stacked on the host image, which cannot boot a microVM");
  if (stack_.layers.empty()) return Unimplemented("image \"" + spec_.image + "\" has no layers");
  if (stack_.layers.size() > kMaxLayers)
    return Unimplemented("a microVM boots images of at most " + std::to_string(kMaxLayers) +
                         " layers; \"" + spec_.image + "\" has " +
                         std::to_string(stack_.layers.size()));
  MergeImageEnv(stack_.config.env, &spec_.env);
  for (const auto& layer : stack_.layers) {
    DSEC_ASSIGN_OR_RETURN(std::string file, store->ErofsFile(layer));
    UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoError("open layer " + layer.digest);
    layers->push_back(std::move(fd));
  }
  return OkStatus();
}

StatusOr<UniqueFd> MicrovmInstance::Listen(const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = JoinPath(dir_, name);
  if (path.size() >= sizeof addr.sun_path) return InvalidArgument("socket path too long: " + path);
  memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("socket");
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("bind " + path);
  if (chmod(path.c_str(), 0600) < 0) return ErrnoError("chmod " + path);
  if (listen(fd.get(), 4) < 0) return ErrnoError("listen " + path);
  return fd;
}

Status MicrovmInstance::SpawnQemu(std::vector<UniqueFd> layers, UniqueFd tap) {
  MicrovmBackend& b = *backend_;
  DSEC_ASSIGN_OR_RETURN(UniqueFd agent_listen, Listen("agent.sock"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd qmp_listen, Listen("qmp.sock"));
  QemuConfig qc;
  qc.qemu = b.opts_.qemu;
  qc.accel = accel_ == Accel::kAuto ? b.accel() : accel_;
  qc.cpus = Cpus();
  qc.memory_mb = GuestRamMb();
  qc.disk_mb = spec_.resources.disk_mb;
  qc.tsc_khz = b.tsc_khz_;
  qc.kernel_fd = kKernelFd, qc.initrd_fd = kInitrdFd;
  qc.agent_listen_fd = kAgentFd, qc.qmp_listen_fd = kQmpFd;
  int ram = mode_ == Mode::kTemplate ? ram_fd_.get() : template_ ? template_->ram.get() : -1;
  if (ram >= 0) {
    qc.ram_fd = kRamFd;
    qc.ram_shared = mode_ == Mode::kTemplate;  // a clone's writes stay its own
    qc.incoming = mode_ == Mode::kClone;
  }
  if (mode_ == Mode::kFork) {
    qc.ram_object = fork_->ram_object;
    qc.incoming = true;
  }
  ram_object_ = qc.ram_fd >= 0 || qc.ram_object;
  // QEMU keeps its uid range leased, but through a read-only description of the host-wide
  // lease file: a QEMU taken over by its guest cannot write or truncate it.
  DSEC_ASSIGN_OR_RETURN(UniqueFd lease,
                        b.uids_->ShareReadOnly(static_cast<uint32_t>(uid_slot_), uid_lease_));
  qc.nic = nic_;
  if (nic_ == Nic::kTap) {
    if (!tap) return InternalError("microvm " + spec_.id + ": a NIC without its tap");
    qc.tap_fd = kTapFd;
  }
  // (The kernel's descriptor again in the slots a VM does not use.)
  std::vector<int> from = {b.kernel_fd_.get(),
                           b.initramfs_fd_.get(),
                           agent_listen.get(),
                           qmp_listen.get(),
                           lease.get(),
                           ram >= 0 ? ram : b.kernel_fd_.get(),
                           tap ? tap.get() : b.kernel_fd_.get()};
  for (size_t i = 0; i < layers.size(); ++i) {
    qc.layer_fds.push_back(kFirstLayerFd + static_cast<int>(i));
    from.push_back(layers[i].get());
  }
  UniqueFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd log(open(JoinPath(dir_, "qemu.log").c_str(),
                    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600));
  if (!null_fd || !log) return ErrnoError("open QEMU's stdio");
  // Everything QEMU is confined by (isolation/jail.h).
  isolation::JailSpec j;
  auto exe = isolation::FindExecutable(qc.qemu);
  if (!exe.ok())
    return FailedPrecondition(exe.status().message() +
                              ": microVMs need QEMU (apt-get install qemu-system-x86)");
  j.exe = *exe;
  j.argv = QemuArgv(qc);
  j.env = {"PATH=/usr/bin:/bin"};
  j.fds = {{0, null_fd.get()}, {1, log.get()}, {2, log.get()}};
  for (size_t i = 0; i < from.size(); ++i)
    j.fds.push_back({kKernelFd + static_cast<int>(i), from[i]});
  // Namespaces of its own. Network: empty, every socket QEMU uses is an inherited descriptor,
  // so a QEMU taken over by its guest reaches no network, not even the node's loopback (the
  // edge's API, other services). Mount: a root of only what it runs from (the guest's kernel,
  // initramfs, layers and RAM are descriptors), built over its own directory. Pid: it sees
  // (and can signal) itself only. IPC, UTS: nothing of the node's.
  j.namespaces = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
  j.root_at = dir_;
  j.ro_paths = {"/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache"};
  j.devices = {"/dev/null", "/dev/urandom"};
  j.proc = true;  // its descriptors' /proc/self/fd paths (-kernel, -initrd, mem-path)
  j.rlimits = {{RLIMIT_CORE, 0}};  // a core of guest RAM would be the guest's data on disk
  j.uid = qemu_uid_;
  j.gid = qemu_uid_;
  // Under KVM the one supplementary group QEMU keeps is /dev/kvm's.
  struct stat kvm_st;
  if (qc.accel == Accel::kKvm && stat(b.opts_.kvm_device.c_str(), &kvm_st) == 0) {
    j.devices.push_back(b.opts_.kvm_device);
    j.groups = {kvm_st.st_gid};
  }
  // In its cgroup before it runs anything.
  j.before_exec = [this](pid_t pid) { return cgroup_->AddProcess(pid, /*cloned_into_v2=*/false); };
  DSEC_ASSIGN_OR_RETURN(qemu_, isolation::SpawnJailed(j));

  // QEMU holds the uid lease from here on (an inherited fd): the uid stays taken for as long
  // as QEMU lives, also if this edge dies.
  uid_lease_.Reset();
  return OkStatus();
}

AgentCarrier MicrovmInstance::Carrier() {
  AgentCarrier c;
  c.name = "the guest agent";
  c.exit_fd = qemu_.fd();
  c.explain = [this](Status raw) -> Status {
    if (raw.code() == StatusCode::kDeadlineExceeded) {
      std::string console = ConsoleTail(kLogTail);
      return DeadlineExceeded("the microVM's agent did not answer within " +
                              std::to_string(backend_->opts_.boot_timeout_ms) + " ms" +
                              (console.empty() ? "" : "; its console ends: " + console));
    }
    // The connection ended or QEMU exited: say why.
    if (qemu_.WaitReadable(2000)) {
      std::string log = FileTail(JoinPath(dir_, "qemu.log"), kLogTail);
      return Unavailable("QEMU exited during the microVM's boot" +
                         (log.empty() ? std::string() : ": " + log));
    }
    return raw;
  };
  return c;
}

protocol::GuestSetup MicrovmInstance::BuildGuestSetup() {
  MicrovmBackend& b = *backend_;
  protocol::GuestSetup s;
  s.sandbox_id = spec_.id;
  s.hostname = spec_.hostname;
  s.secret = secret_ = RandomHex(32);
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  s.realtime_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  s.entropy = RandomHex(64);
  s.disk_mb = spec_.resources.disk_mb;
  s.rlimits = b.opts_.rlimits;  // fsize 0: unlimited (a full disk is ENOSPC)
  s.max_execs = b.opts_.max_execs_per_sandbox;
  s.orphan_timeout_ms = b.opts_.orphan_timeout_ms;
  s.pids = spec_.resources.pids;  // as a container's pids.max holds its processes
  uid_t uid = kSandboxUid;
  gid_t gid = kSandboxGid;
  if (auto u = ResolveUser(spec_.user); u.ok()) uid = u->uid, gid = u->gid;
  if (net_.attached()) {
    s.net_address = net_.Address();
    s.net_gateway = net_.Gateway();
  }
  const RootfsInputs in = PlanInputs(b, stack_, net_.attached(), spec_.id);
  PlanFiles(in, spec_.hostname, spec_.workdir, uid, gid, &s);
  s.files.push_back(MachineId(RandomHex(16)));  // a machine of its own
  // A clone's writable layer already holds its template's plan: what of its own plan is
  // there as it wants it is left out (only when the template's plan is exactly the one this
  // image and NIC give, so nothing is assumed of an older template).
  if (template_ && !template_->prepared.empty()) {
    protocol::GuestSetup had = TemplatePlan(in);
    if (PreparedText(had) == template_->prepared) {
      std::erase_if(s.dirs, [&](const auto& d) { return std::ranges::count(had.dirs, d) > 0; });
      std::erase_if(s.files, [&](const auto& f) { return std::ranges::count(had.files, f) > 0; });
    }
  }
  return s;
}

RootfsInputs MicrovmInstance::PlanInputs(const MicrovmBackend& b, const images::Stack& stack,
                                         bool nic, const std::string& what) {
  // The same plan a container of this image starts from: hostname, hosts, the sandbox user,
  // the workdir.
  RootfsInputs in;
  in.host_base = false;
  if (auto src = GatherRootSources(stack, {}, b.opts_.image_store); src.ok())
    in = src->inputs;
  else
    DSEC_LOG_WARN("microvm {}: reading its image's users: {}", what, src.status().ToString());
  if (nic) in.nameserver = b.opts_.nameserver;
  return in;
}

void MicrovmInstance::PlanFiles(RootfsInputs in, const std::string& hostname,
                                const std::string& workdir, uid_t uid, gid_t gid,
                                protocol::GuestSetup* s) {
  in.hostname = hostname;
  in.workdir = workdir;
  in.workdir_uid = uid, in.workdir_gid = gid;
  RootfsPlan plan = PlanRootfs(in);
  s->dirs = std::move(plan.dirs);
  s->files = std::move(plan.files);
}

protocol::GuestSetup MicrovmInstance::TemplatePlan(const RootfsInputs& in) {
  protocol::GuestSetup s;
  s.hostname = "localhost";
  s.prepare = true;
  PlanFiles(in, s.hostname, SandboxSpec().workdir, kSandboxUid, kSandboxGid, &s);
  // (In the template's layer already, so a clone rewrites it in place: no copy-up.)
  s.files.push_back(MachineId(std::string(32, '0')));
  return s;
}

isolation::FileSpec MicrovmInstance::MachineId(const std::string& hex) {
  return {"/etc/machine-id", hex + "\n", 0444, 0, 0};
}

std::string MicrovmInstance::PreparedText(const protocol::GuestSetup& s) {
  const Json j = protocol::ToJson(s);
  return Json{{"dirs", j["dirs"]}, {"files", j["files"]}}.dump();
}

StatusOr<UniqueFd> MicrovmInstance::ConnectAgent() {
  UniqueFd conn(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!conn) return ErrnoError("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = JoinPath(dir_, "agent.sock");
  memcpy(addr.sun_path, path.data(), path.size());
  if (connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return ErrnoError("connect to the agent port of " + spec_.id);
  return conn;
}

int MicrovmInstance::Cpus() const {
  return std::clamp(static_cast<int>(spec_.resources.cpu + 0.999), 1, 64);
}

Status MicrovmInstance::Handshake(UniqueFd* conn) {
  int64_t deadline = MonotonicMs() + backend_->opts_.boot_timeout_ms;
  AgentBootstrap boot(conn->get(), Carrier());
  StatusOr<protocol::Hello> hello =
      boot.ExpectHello(mode_ == Mode::kClone ? MonotonicMs() + kCloneHelloMs : deadline);
  if (!hello.ok() && mode_ == Mode::kClone &&
      hello.status().code() == StatusCode::kDeadlineExceeded) {
    DSEC_LOG_WARN("microvm {}: no hello from the restored guest; reconnecting", spec_.id);
    conn->Reset();
    DSEC_ASSIGN_OR_RETURN(*conn, ConnectAgent());
    boot = AgentBootstrap(conn->get(), Carrier());
    hello = boot.ExpectHello(deadline);
  }
  DSEC_RETURN_IF_ERROR(hello.status());
  marks_.hello = MonotonicUs();
  DSEC_RETURN_IF_ERROR(boot.SendSetup(protocol::ToJson(BuildGuestSetup())));
  return boot.ExpectReady(deadline).status();
}

StatusOr<AgentLink> MicrovmInstance::Start() {
  MicrovmBackend& b = *backend_;
  const int64_t t0 = MonotonicUs();
  DSEC_RETURN_IF_ERROR(ClaimDirectory());
  std::vector<UniqueFd> layers;
  DSEC_RETURN_IF_ERROR(AcquireImage(&layers));
  DSEC_RETURN_IF_ERROR(LeaseAndCgroup());
  // A NIC when the create asks for a network (a microVM cannot get one later).
  UniqueFd tap;
  if (spec_.network.mode != net::NetMode::kNone) {
    DSEC_ASSIGN_OR_RETURN(tap, net_.AttachTap());
    nic_ = Nic::kTap;
  }
  if (spec_.machine) {
    // A fork that carries memory: its source's machine, on the same layers and shape.
    fork_ = std::dynamic_pointer_cast<const VmState>(spec_.machine);
    if (!fork_) return InvalidArgument("microVM " + spec_.id + ": not a microVM's saved state");
    std::vector<std::string> digests;
    for (const auto& l : stack_.layers) digests.push_back(l.digest);
    if (nic_ != Nic::kNone || digests != fork_->layer_digests || Cpus() != fork_->cpus ||
        GuestRamMb() != fork_->ram_mb)
      return FailedPrecondition("microVM " + spec_.id +
                                ": a fork with memory needs its source's image, CPUs, memory and "
                                "disk, and no network");
    mode_ = Mode::kFork;
  } else if (b.opts_.templates) {
    std::string key = "cpus=" + std::to_string(Cpus()) + " ram=" + std::to_string(GuestRamMb()) +
                      (nic_ != Nic::kNone ? " nic" : "");
    std::vector<int> fds;
    for (size_t i = 0; i < layers.size(); ++i) {
      key += " " + stack_.layers[i].digest;
      fds.push_back(layers[i].get());
    }
    auto t = b.TemplateFor(key, stack_, fds, Cpus(), GuestRamMb(), spec_.resources.disk_mb,
                           nic_ != Nic::kNone);
    if (t.ok()) {
      template_ = std::move(*t);
      mode_ = Mode::kClone;
    }
  }
  const int64_t t_prepared = MonotonicUs();
  DSEC_RETURN_IF_ERROR(SpawnQemu(std::move(layers), std::move(tap)));
  const int64_t t_spawned = MonotonicUs();
  if (mode_ == Mode::kClone) DSEC_RETURN_IF_ERROR(Restore(template_->state.get()));
  if (mode_ == Mode::kFork) DSEC_RETURN_IF_ERROR(Restore(fork_->stream.get()));
  const int64_t t_restored = MonotonicUs();

  // The chardev's listening socket queues this connection until QEMU accepts it.
  DSEC_ASSIGN_OR_RETURN(UniqueFd conn, ConnectAgent());
  std::vector<std::string> shells;
  if (mode_ == Mode::kFork) {
    DSEC_ASSIGN_OR_RETURN(protocol::Hello hello, TakeIdentity(&conn));
    shells = std::move(hello.shells);
    marks_.hello = MonotonicUs();
    // Its source's state is not needed any more: its memory goes once every fork has it.
    fork_.reset();
    spec_.machine.reset();
  } else {
    DSEC_RETURN_IF_ERROR(Handshake(&conn));
  }
  const int64_t t_ready = MonotonicUs();
  // Everything was refused until now: the guest configured eth0 in its setup.
  if (net_.attached()) DSEC_RETURN_IF_ERROR(net_.Apply(spec_.network));
  // Where a create's time went (debug): what to look at when creates are slow.
  auto ms = [](int64_t a, int64_t b) { return static_cast<double>(b - a) / 1000.0; };
  DSEC_LOG_DEBUG(
      "microvm {}: started in {:.1f} ms ({}: prepare {:.1f}, QEMU spawn {:.1f}, restore {:.1f}, "
      "agent hello {:.1f}, setup {:.1f}, network {:.1f})",
      spec_.id, ms(t0, MonotonicUs()),
      mode_ == Mode::kClone  ? "clone"
      : mode_ == Mode::kFork ? "fork"
                             : "boot",
      ms(t0, t_prepared), ms(t_prepared, t_spawned), ms(t_spawned, t_restored),
      ms(t_restored, marks_.hello), ms(marks_.hello, t_ready), ms(t_ready, MonotonicUs()));
  if (!qmp_) {
    auto qmp = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 5000);
    if (!qmp.ok()) return qmp.status().WithContext("QMP of " + spec_.id);
    qmp_.emplace(std::move(*qmp));
  }
  AgentLink link;
  link.stream = std::move(conn);
  link.shells = std::move(shells);
  return link;
}

Status MicrovmInstance::LeaseAndCgroup() {
  MicrovmBackend& b = *backend_;
  DSEC_ASSIGN_OR_RETURN(isolation::UidLease lease, b.uids_->Acquire());
  uid_slot_ = lease.slot;
  qemu_uid_ = lease.first_id;
  uid_lease_ = std::move(lease.fd);
  isolation::CgroupLimits limits;
  limits.memory_bytes = (GuestRamMb() + b.opts_.qemu_overhead_mb) << 20;
  limits.pids = b.opts_.qemu_pids;
  limits.cpu = spec_.resources.cpu;
  DSEC_ASSIGN_OR_RETURN(auto cg, b.cgroups_->CreateSandbox(spec_.id, limits));
  cgroup_ = std::move(cg);
  return OkStatus();
}

Status MicrovmInstance::BootProbe(MicrovmBackend* backend, Accel accel, int timeout_ms) {
  SandboxSpec spec;
  spec.id = "probe-" + RandomHex(6);
  spec.kind = Kind::kMicrovm;
  spec.resources.memory_mb = 128;
  spec.resources.disk_mb = 16;
  MicrovmInstance t(backend, spec);
  t.accel_ = accel;
  Status s = [&]() -> Status {
    DSEC_RETURN_IF_ERROR(t.ClaimDirectory());
    DSEC_RETURN_IF_ERROR(t.LeaseAndCgroup());
    DSEC_RETURN_IF_ERROR(t.SpawnQemu({}));
    DSEC_ASSIGN_OR_RETURN(UniqueFd conn, t.ConnectAgent());
    return AgentBootstrap(conn.get(), t.Carrier()).Next(MonotonicMs() + timeout_ms).status();
  }();
  (void)t.Destroy();
  return s;
}

std::string MicrovmInstance::AdoptionHandle() const {
  VmAdoptionHandle h;
  h.secret = secret_;
  h.uid_slot = uid_slot_;
  h.qemu_pid = qemu_.pid();
  for (const auto& l : stack_.layers) h.layer_digests.push_back(l.digest);
  h.net_addr = net_.attachment().addr;
  h.net_if = net_.attachment().host_if;
  return h.Encode();
}

Status MicrovmInstance::FindQemu(pid_t pid) {
  auto cgroups = ReadFileToString("/proc/" + std::to_string(pid) + "/cgroup");
  if (pid <= 0 || !cgroups.ok() || cgroups->find("-vm/" + spec_.id + "\n") == std::string::npos)
    return Unavailable("the QEMU of microVM " + spec_.id + " is gone");
  DSEC_ASSIGN_OR_RETURN(qemu_, PidFd::Open(pid));
  return OkStatus();
}

StatusOr<protocol::Hello> MicrovmInstance::Reconnect(UniqueFd* conn) {
  DSEC_ASSIGN_OR_RETURN(*conn, ConnectAgent());
  return Reauthenticate(conn->get(), secret_, MonotonicMs() + 10000);
}

StatusOr<AgentLink> MicrovmInstance::Adopt(const std::string& handle) {
  MicrovmBackend& b = *backend_;
  lock_fd_.Reset(open(JoinPath(dir_, "owner.lock").c_str(), O_RDWR | O_CLOEXEC));
  if (lock_fd_ && flock(lock_fd_.get(), LOCK_EX | LOCK_NB) < 0) {
    lock_fd_.Reset();
    dir_.clear();  // another live process owns it: hands off
    return Status(StatusCode::kAlreadyExists,
                  "sandbox " + spec_.id + " is owned by another process");
  }
  dir_owned_ = true;  // ours from here: a failed adopt destroys what is left
  if (auto cg = b.cgroups_->OpenSandbox(spec_.id); cg.ok()) cgroup_ = std::move(*cg);
  // A handle that does not parse leaves nothing to adopt: what is left is destroyed.
  DSEC_ASSIGN_OR_RETURN(VmAdoptionHandle h, VmAdoptionHandle::Parse(handle));
  if (!cgroup_) return Unavailable("microVM " + spec_.id + " is incomplete");
  secret_ = h.secret;
  DSEC_RETURN_IF_ERROR(FindQemu(h.qemu_pid));
  if (h.uid_slot >= 0) {
    // QEMU holds the lease; this only records the range as ours again.
    DSEC_ASSIGN_OR_RETURN(uid_lease_, b.uids_->Claim(static_cast<uint32_t>(h.uid_slot)));
    uid_slot_ = h.uid_slot;
    qemu_uid_ = b.uids_->FirstId(static_cast<uint32_t>(h.uid_slot));
  }
  if (!h.layer_digests.empty() && b.opts_.image_store) {
    for (const auto& d : h.layer_digests)
      if (auto l = b.opts_.image_store->GetLayer(d); l.ok()) stack_.layers.push_back(*l);
    holds_image_ = b.opts_.image_store->Hold(spec_.id, h.layer_digests).ok();
  }
  auto qmp = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 5000);
  if (!qmp.ok()) return qmp.status().WithContext("QMP of " + spec_.id);
  qmp_.emplace(std::move(*qmp));
  DSEC_ASSIGN_OR_RETURN(std::string run, qmp_->WaitStatus("query-status", {}, 5000));
  // Whether its RAM is a memory backend (a clone's or a fork's): a fork of it must match.
  if (auto memdevs = qmp_->Execute("query-memdev"); memdevs.ok() && memdevs->is_array())
    for (const auto& m : *memdevs)
      if (m.is_object() && m.value("id", "") == "mem") ram_object_ = true;
  // A stopped guest cannot answer: continued for the handshake, stopped again after.
  bool paused = run == "paused";
  if (paused) DSEC_RETURN_IF_ERROR(qmp_->Execute("cont").status());
  UniqueFd conn;
  auto hello = Reconnect(&conn);
  if (!hello.ok() && hello.status().code() != StatusCode::kUnauthenticated) {
    usleep(100 * 1000);  // (a port the guest had not yet seen hang up) once more
    hello = Reconnect(&conn);
  }
  DSEC_RETURN_IF_ERROR(hello.status().WithContext("reconnect to microVM " + spec_.id));
  if (paused) DSEC_RETURN_IF_ERROR(qmp_->Execute("stop").status());
  if (h.net_addr) {
    nic_ = Nic::kTap;
    DSEC_RETURN_IF_ERROR(net_.Readopt({h.net_addr, h.net_if}, spec_.network));
  }
  AgentLink link;
  link.stream = std::move(conn);
  link.shells = std::move(hello->shells);
  link.paused = paused;
  return link;
}

OomCounter MicrovmInstance::OomKills() {
  return [cg = cgroup_]() -> uint64_t { return cg ? cg->OomKills().value_or(0) : 0; };
}

Status MicrovmInstance::Pause() {
  if (!qmp_) return FailedPrecondition("sandbox " + spec_.id + " has no QMP connection");
  return qmp_->Execute("stop").status();
}

Status MicrovmInstance::Resume() {
  if (!qmp_) return FailedPrecondition("sandbox " + spec_.id + " has no QMP connection");
  return qmp_->Execute("cont").status();
}

std::string MicrovmInstance::ConsoleTail(size_t bytes) {
  if (!qmp_) {
    auto q = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 1000);
    if (!q.ok()) return "";
    qmp_.emplace(std::move(*q));
  }
  // The ring keeps the newest 64 KiB; read it all and keep the end.
  auto r =
      qmp_->Execute("ringbuf-read", {{"device", "con"}, {"size", 65536}, {"format", "utf8"}}, 2000);
  if (!r.ok() || !r->is_string()) return "";
  std::string s = r->get<std::string>();
  if (s.size() > bytes) s = s.substr(s.size() - bytes);
  return std::string(TrimWhitespace(s));
}

StatusOr<SandboxStats> MicrovmInstance::Stats() {
  if (!cgroup_) return FailedPrecondition("sandbox " + spec_.id + " has no cgroup");
  DSEC_ASSIGN_OR_RETURN(isolation::CgroupStats c, cgroup_->Stats());
  SandboxStats s;
  // The QEMU process's: guest RAM as far as the guest touched it, plus QEMU's own.
  s.memory_current = c.memory_current;
  s.memory_peak = c.memory_peak;
  s.memory_limit = static_cast<uint64_t>(GuestRamMb()) << 20;
  s.cpu_usage_us = c.cpu_usage_us;
  s.pids = c.pids_current;
  s.oom_kills = c.oom_kills;
  s.disk_limit = static_cast<uint64_t>(spec_.resources.disk_mb) << 20;
  s.disk_kind = "tmpfs";
  s.disk_used_known = false;  // a tmpfs in the guest: its agent says
  s.ask_guest = true;
  return s;
}

Status MicrovmInstance::SetMemoryLimit(int64_t bytes) {
  if (!cgroup_) return FailedPrecondition("sandbox " + spec_.id + " has no cgroup");
  // The guest's RAM is fixed at boot; the host limit can only tighten what QEMU may touch.
  isolation::CgroupLimits limits;
  limits.memory_bytes = bytes + (backend_->opts_.qemu_overhead_mb << 20);
  limits.pids = backend_->opts_.qemu_pids;
  limits.cpu = spec_.resources.cpu;
  return cgroup_->SetLimits(limits);
}

Status MicrovmInstance::Destroy() {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  Status result;
  qmp_.reset();
  if (cgroup_) (void)cgroup_->KillAll();
  if (qemu_.valid()) {
    (void)qemu_.SendSignal(SIGKILL);
    if (!qemu_.WaitReadable(5000)) DSEC_LOG_WARN("microvm {}: QEMU outlived SIGKILL", spec_.id);
    (void)qemu_.TryWait();  // reaps it
    qemu_ = PidFd();
  }
  // QEMU's exit closed the tap (and its route went with it): the rules and the address go.
  net_.Detach();
  if (cgroup_) result = cgroup_->Destroy();
  if (dir_owned_ && !dir_.empty()) {
    for (const char* f : {"agent.sock", "qmp.sock", "qemu.log", "owner.lock"})
      (void)unlink(JoinPath(dir_, f).c_str());
    if (rmdir(dir_.c_str()) < 0 && errno != ENOENT) {
      Status s = RemoveTree(dir_);
      if (result.ok()) result = s;
    }
  }
  lock_fd_.Reset();
  uid_lease_.Reset();
  if (uid_slot_ >= 0) {
    backend_->uids_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  if (holds_image_ && backend_->opts_.image_store) {
    holds_image_ = false;
    backend_->opts_.image_store->Release(spec_.id);
    if (auto n = backend_->opts_.image_store->Collect(); !n.ok())
      DSEC_LOG_WARN("image store: collect: {}", n.status().ToString());
  }
  return result;
}

void MicrovmInstance::Detach() {
  // Lets go: QEMU keeps running (it holds its uid lease) for the next edge's Adopt.
  destroyed_ = true;
  qmp_.reset();
  qemu_ = PidFd();
  net_.Forget();  // its tap lives on with QEMU; the next edge readopts it
  lock_fd_.Reset();
  cgroup_.reset();
  if (uid_slot_ >= 0) {
    backend_->uids_->Release(static_cast<uint32_t>(uid_slot_));
    uid_slot_ = -1;
  }
  uid_lease_.Reset();
}

StatusOr<std::vector<std::string>> MicrovmInstance::CaptureStack(bool keep_setuid, bool running,
                                                                 const CaptureProgress& progress,
                                                                 AgentSession* session) {
  images::ImageStore* store = backend_->opts_.image_store;
  if (!store) return FailedPrecondition("this node has no image store");
  if (!running || !session)
    return FailedPrecondition("microVM " + spec_.id +
                              " is paused: resume it to snapshot it (its agent reads its disk)");
  protocol::CaptureLayerRequest req;
  // Per-sandbox files the guest writes at every boot, and the kernel's filesystems.
  req.skip = {"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"};
  req.empty = {"/proc", "/sys", "/dev", "/run"};
  req.keep_setuid = keep_setuid;
  req.max_apparent_bytes = store->options().max_layer_bytes;
  images::ImageStore::Lease lease(store);
  DSEC_ASSIGN_OR_RETURN(auto builder, store->NewLayer());
  uint64_t read = 0;
  auto sent = session->CaptureLayer(req, [&](std::string_view d) {
    read += d.size();
    if (progress) progress(read, false);
    return builder->Feed(d);
  });
  DSEC_RETURN_IF_ERROR(sent.status().WithContext("capture the writable layer of " + spec_.id));
  if (progress) progress(read, true);
  DSEC_ASSIGN_OR_RETURN(images::LayerInfo layer, builder->Commit());
  std::vector<std::string> out;
  for (const auto& x : stack_.layers) out.push_back(x.digest);
  if (std::find(out.begin(), out.end(), layer.digest) == out.end()) out.push_back(layer.digest);
  return out;
}

}  // namespace dsec::backends::microvm
