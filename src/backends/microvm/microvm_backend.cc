#include "backends/microvm/microvm_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "backends/microvm/microvm_instance.h"
#include "backends/microvm/qemu_cmd.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"

namespace dsec::backends::microvm {

StatusOr<std::unique_ptr<MicrovmBackend>> MicrovmBackend::Create(MicrovmBackendOptions opts) {
  std::unique_ptr<MicrovmBackend> b(new MicrovmBackend(std::move(opts)));
  DSEC_RETURN_IF_ERROR(b->Init());
  return b;
}

MicrovmBackend::~MicrovmBackend() {
  if (probe_.joinable()) probe_.join();
  if (cgroups_) (void)cgroups_->RemoveParent();
}

Status MicrovmBackend::Init() {
  if (geteuid() != 0) return PermissionDenied("the microVM backend needs root");
  if (opts_.state_dir.empty()) return InvalidArgument("state dir is required");
  DSEC_RETURN_IF_ERROR(MakeDirs(opts_.state_dir, 0700));
  char real[PATH_MAX];
  if (!realpath(opts_.state_dir.c_str(), real))
    return ErrnoError("realpath \"" + opts_.state_dir + "\"");
  opts_.state_dir = real;
  instance_id_ = InstanceIdForPath(opts_.state_dir);
  vms_dir_ = JoinPath(opts_.state_dir, "microvms");
  DSEC_RETURN_IF_ERROR(MakeDirs(vms_dir_, 0700));

  DSEC_ASSIGN_OR_RETURN(kernel_, FindGuestKernel(opts_.kernel_dir));
  if (opts_.agent_path.empty())
    opts_.agent_path = HelperBinaryPath("DSEC_AGENT_PATH", "dsec-agent", "agent");
  // Made at every start: the agent binary may be newer than the last one. The files QEMU
  // reads are world-readable (a public kernel and the agent); QEMU gets them by descriptor.
  std::string boot = JoinPath(opts_.state_dir, "microvm-boot");
  DSEC_RETURN_IF_ERROR(MakeDirs(boot, 0700));
  initramfs_ = JoinPath(boot, "initramfs.cpio");
  DSEC_RETURN_IF_ERROR(WriteGuestInitramfs(kernel_, opts_.agent_path, initramfs_));
  kernel_fd_.Reset(open(kernel_.vmlinux.c_str(), O_RDONLY | O_CLOEXEC));
  initramfs_fd_.Reset(open(initramfs_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!kernel_fd_ || !initramfs_fd_) return ErrnoError("open the guest kernel or initramfs");

  tsc_khz_ = HostTscKhz();

  isolation::CgroupDriverOptions co;
  co.instance_id = instance_id_ + "-vm";
  co.mode = opts_.cgroup_mode;
  co.parent_memory_bytes = opts_.parent_memory_bytes;
  DSEC_ASSIGN_OR_RETURN(cgroups_, isolation::CgroupDriver::Create(co));
  isolation::UidRangeOptions uo;
  uo.lock_file = opts_.uid_lock_file;
  uo.base = opts_.uid_base;
  uo.count = opts_.uid_slots;
  DSEC_ASSIGN_OR_RETURN(uids_, isolation::UidRangeAllocator::Open(uo));
  io_ = std::make_unique<IoRunner>(std::max(1, opts_.io_threads));
  return ChooseAccel();
}

Status MicrovmBackend::ChooseAccel() {
  // /dev/kvm opens (and even creates VMs) on nested hosts that cannot boot a guest, so auto
  // asks a guest: a probe boot in the background; the first create waits for its answer.
  UniqueFd kvm(open(opts_.kvm_device.c_str(), O_RDWR | O_CLOEXEC));
  std::string why_not = kvm ? "" : opts_.kvm_device + " cannot be opened (" + strerror(errno) + ")";
  struct stat st;
  // QEMU runs as a uid of its own with the device's group: a device only its owner may use is
  // out of its reach (Debian's udev makes it 0660 root:kvm; a host without udev may not).
  if (kvm && fstat(kvm.get(), &st) == 0 && S_ISCHR(st.st_mode) &&
      (st.st_mode & (S_IRGRP | S_IWGRP)) != (S_IRGRP | S_IWGRP)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    why_not = opts_.kvm_device + " is mode " + mode +
              ": QEMU, which runs as a uid of its own, needs its group to read and write it "
              "(as Debian's udev sets it up: 0660 root:kvm)";
  }
  kvm.Reset();
  if (opts_.accel == Accel::kKvm && !why_not.empty())
    return FailedPrecondition("microvm_accel is kvm but " + why_not);
  MutexLock l(accel_mu_);
  if (opts_.accel == Accel::kTcg) {
    accel_ = Accel::kTcg;
    accel_reason_ = "configured (microvm_accel: tcg)";
  } else if (opts_.accel == Accel::kKvm) {
    accel_ = Accel::kKvm;
  } else if (!why_not.empty()) {
    accel_ = Accel::kTcg;
    accel_reason_ = why_not;
  } else {
    probe_ = std::thread([this] {
      Status s = MicrovmInstance::BootProbe(this, Accel::kKvm, opts_.kvm_probe_timeout_ms);
      MutexLock l2(accel_mu_);
      accel_ = s.ok() ? Accel::kKvm : Accel::kTcg;
      accel_reason_ = s.ok() ? "" : "a guest does not boot under KVM here: " + s.message();
      DSEC_LOG_INFO("microVM accelerator: {}{}", AccelName(accel_),
                    accel_reason_.empty() ? "" : " (" + accel_reason_ + ")");
      accel_cv_.NotifyAll();
    });
  }
  return OkStatus();
}

Accel MicrovmBackend::accel() const {
  MutexLock l(accel_mu_);
  while (accel_ == Accel::kAuto) accel_cv_.Wait(l);
  return accel_;
}

std::string MicrovmBackend::AccelNow() const {
  MutexLock l(accel_mu_);
  return accel_ == Accel::kAuto ? "probing" : std::string(AccelName(accel_));
}

std::string MicrovmBackend::accel_reason() const {
  MutexLock l(accel_mu_);
  return accel_reason_;
}

Resources MicrovmBackend::Largest() const {
  Resources r{.cpu = 0, .memory_mb = 0, .pids = 0, .disk_mb = 0};
  r.cpu = UsableCpus();
  // A VM's cgroup holds its RAM (memory and the writable layer) and QEMU's overhead.
  if (opts_.parent_memory_bytes > 0)
    r.memory_mb = (opts_.parent_memory_bytes >> 20) - opts_.qemu_overhead_mb;
  return r;
}

std::string MicrovmBackend::Describe() const {
  return "microvm backend instance=" + instance_id_ + " accel=" + AccelNow() +
         " kernel=" + kernel_.version + " cgroups=" + cgroups_->Describe();
}

StatusOr<std::shared_ptr<Sandbox>> MicrovmBackend::Create(const SandboxSpec& spec) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  DSEC_RETURN_IF_ERROR(
      CheckCapabilities(kind(), Capabilities(), spec.image, spec.network, spec.worker.has_value()));
  auto sb = Sandbox::Start(std::make_unique<MicrovmInstance>(this, spec), *io_);
  if (!sb.ok()) return sb.status().WithContext("create microVM " + spec.id);
  return sb;
}

StatusOr<std::shared_ptr<Sandbox>> MicrovmBackend::Adopt(const SandboxSpec& spec,
                                                         const std::string& handle) {
  DSEC_RETURN_IF_ERROR(ValidateSandboxSpec(spec));
  auto sb = Sandbox::Adopt(std::make_unique<MicrovmInstance>(this, spec), *io_, handle);
  if (!sb.ok()) return sb.status().WithContext("adopt microVM " + spec.id);
  return sb;
}

void MicrovmBackend::RemoveRemains(const std::string& name) {
  if (auto cg = cgroups_->OpenSandbox(name); cg.ok())
    (void)(*cg)->Destroy();  // kills its QEMU first
  else
    (void)cgroups_->RemoveSandboxRemains(name);
  (void)RemoveTree(JoinPath(vms_dir_, name));
}

StatusOr<int> MicrovmBackend::CleanupOrphans() {
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(vms_dir_));
  if (auto cgs = cgroups_->ListSandboxes(); cgs.ok())
    for (const auto& n : *cgs)
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  int cleaned = 0;
  for (const auto& name : names) {
    if (!IsSafeName(name)) continue;
    UniqueFd lock(open(JoinPath(vms_dir_, name + "/owner.lock").c_str(), O_RDWR | O_CLOEXEC));
    if (lock && flock(lock.get(), LOCK_EX | LOCK_NB) < 0) continue;  // alive and owned
    RemoveRemains(name);
    ++cleaned;
  }
  return cleaned;
}

size_t MicrovmBackend::template_count() const {
  MutexLock l(templates_mu_);
  size_t n = 0;
  for (const auto& [key, slot] : templates_)
    if (slot->made) ++n;
  return n;
}

StatusOr<std::shared_ptr<const Template>> MicrovmBackend::TemplateFor(
    const std::string& key, const images::Stack& stack, const std::vector<int>& layers, int cpus,
    int64_t ram_mb, int64_t disk_mb, bool nic) {
  std::shared_ptr<TemplateSlot> slot;
  {
    MutexLock l(templates_mu_);
    auto& s = templates_[key];
    if (!s) s = std::make_shared<TemplateSlot>();
    slot = s;
    slot->used_ms = MonotonicMs();
    // Beyond the cap the least recently used made template goes (clones of it keep running:
    // each holds its own mapping of the RAM).
    while (templates_.size() > opts_.max_templates) {
      auto lru = templates_.end();
      for (auto it = templates_.begin(); it != templates_.end(); ++it)
        if (it->second != slot &&
            (lru == templates_.end() || it->second->used_ms < lru->second->used_ms))
          lru = it;
      if (lru == templates_.end()) break;
      templates_.erase(lru);
    }
  }
  MutexLock b(slot->build);
  if (slot->made) return slot->made;
  if (!slot->error.empty()) return FailedPrecondition(slot->error);
  TemplateFiles* files = Files();
  if (files) {
    int64_t t0 = MonotonicMs();
    auto loaded = files->Load(key);
    if (loaded.ok()) {
      DSEC_LOG_INFO("microvm template [{}] loaded from {} in {} ms", key, files->dir(),
                    MonotonicMs() - t0);
      templates_loaded_.fetch_add(1);
      slot->made = std::shared_ptr<const Template>(std::move(*loaded));
      return slot->made;
    }
    if (loaded.status().code() != StatusCode::kNotFound)
      DSEC_LOG_WARN("microvm template [{}]: {} (made again)", key, loaded.status().ToString());
  }
  auto t = MicrovmInstance::MakeTemplate(this, key, stack, layers, cpus, ram_mb, disk_mb, nic);
  if (!t.ok()) {
    slot->error = "no template: " + t.status().ToString();
    DSEC_LOG_WARN("microvm template [{}]: {} (creates of it boot cold)", key, slot->error);
    return FailedPrecondition(slot->error);
  }
  DSEC_LOG_INFO("microvm template [{}] made in {} ms ({} bytes of device state)", key,
                (*t)->build_ms, (*t)->state_bytes);
  if (files)
    if (Status s = files->Save(**t); !s.ok())
      DSEC_LOG_WARN("microvm template [{}] not kept on disk: {}", key, s.ToString());
  slot->made = std::shared_ptr<const Template>(std::move(*t));
  return slot->made;
}

TemplateFiles* MicrovmBackend::Files() {
  MutexLock l(files_mu_);
  if (files_) return files_.get();
  if (!files_error_.empty()) return nullptr;
  auto f = std::make_unique<TemplateFiles>(JoinPath(opts_.state_dir, "microvm-templates"),
                                           opts_.max_templates);
  Status s = f->Init(kernel_.vmlinux, initramfs_, opts_.qemu, std::string(AccelName(accel())));
  if (!s.ok()) {
    files_error_ = s.ToString();
    DSEC_LOG_WARN("microvm templates are not kept on disk: {}", files_error_);
    return nullptr;
  }
  files_ = std::move(f);
  return files_.get();
}

Status MicrovmBackend::Shutdown() { return cgroups_->RemoveParent(); }

}  // namespace dsec::backends::microvm
