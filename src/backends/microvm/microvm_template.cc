// MicroVM templates (microvm_backend.h): saving a booted VM as a template, and a clone's restore
// from one. The template's RAM and device state are memfds, sealed once saved.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "backends/microvm/microvm_backend.h"
#include "backends/microvm/microvm_instance.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::backends::microvm {

namespace {

const Json kIgnoreShared = {
    {"capabilities", Json::array({{{"capability", "x-ignore-shared"}, {"state", true}}})}};

// Seals a memfd for good: nothing can write, grow or shrink it (private mappings still can be
// written: each clone's copy-on-write pages are its own).
Status Seal(int fd, const char* what) {
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
    return ErrnoError(std::string("seal the template's ") + what);
  return OkStatus();
}

}  // namespace

Status MicrovmInstance::Restore() {
  MicrovmBackend& b = *backend_;
  auto qmp = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 5000);
  // (A QEMU that refused its command line is gone already: its log says why.)
  if (!qmp.ok()) return Carrier().explain(qmp.status()).WithContext("QMP of " + spec_.id);
  qmp_.emplace(std::move(*qmp));
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-set-capabilities", kIgnoreShared).status());
  // A description of its own (offset 0): clones restore side by side.
  UniqueFd state(open(("/proc/self/fd/" + std::to_string(template_->state.get())).c_str(),
                      O_RDONLY | O_CLOEXEC));
  if (!state) return ErrnoError("open the template's state");
  DSEC_RETURN_IF_ERROR(qmp_->Execute("getfd", {{"fdname", "state"}}, 5000, state.get()).status());
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-incoming", {{"uri", "fd:state"}}).status());
  DSEC_ASSIGN_OR_RETURN(std::string st,
                        qmp_->WaitStatus("query-status", {"inmigrate"}, b.opts_.boot_timeout_ms));
  if (st != "paused" && st != "running")
    return Unavailable("restoring the template of " + spec_.id + " ended " + st);
  return qmp_->Execute("cont").status();
}

Status MicrovmInstance::SaveAsTemplate(Template* out, const protocol::GuestSetup& prepare) {
  // Booted once the agent said hello; it makes the plan's dirs and files (so that no clone
  // copies them up from the image again) and waits in its greeting for a host end, which is
  // where every clone starts: hung up now, the guest greets again, blocked in write() until a
  // clone's edge connects.
  {
    DSEC_ASSIGN_OR_RETURN(UniqueFd conn, ConnectAgent());
    const int64_t deadline = MonotonicMs() + backend_->opts_.boot_timeout_ms;
    AgentBootstrap boot(conn.get(), Carrier());
    DSEC_RETURN_IF_ERROR(boot.ExpectHello(deadline).status().WithContext("the template's agent"));
    DSEC_RETURN_IF_ERROR(boot.SendSetup(protocol::ToJson(prepare)));
    DSEC_RETURN_IF_ERROR(
        boot.ExpectReady(deadline).status().WithContext("the template's writable layer"));
  }
  usleep(200 * 1000);  // to its next greeting (TCG is slow)
  auto qmp = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 5000);
  if (!qmp.ok()) return qmp.status().WithContext("QMP of template " + spec_.id);
  qmp_.emplace(std::move(*qmp));
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-set-capabilities", kIgnoreShared).status());
  DSEC_RETURN_IF_ERROR(qmp_->Execute("stop").status());
  DSEC_RETURN_IF_ERROR(
      qmp_->Execute("getfd", {{"fdname", "state"}}, 5000, out->state.get()).status());
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate", {{"uri", "fd:state"}}).status());
  DSEC_ASSIGN_OR_RETURN(
      std::string st,
      qmp_->WaitStatus("query-migrate", {"", "none", "setup", "active", "pre-switchover", "device"},
                       60000));
  if (st != "completed") return Unavailable("saving the template ended " + st);
  // QEMU must be gone (no shared writable mapping of the RAM left) before the seals.
  ram_fd_.Reset();
  DSEC_RETURN_IF_ERROR(Destroy());
  DSEC_RETURN_IF_ERROR(Seal(out->ram.get(), "RAM"));
  DSEC_RETURN_IF_ERROR(Seal(out->state.get(), "state"));
  struct stat st_info;
  if (fstat(out->state.get(), &st_info) == 0)
    out->state_bytes = static_cast<uint64_t>(st_info.st_size);
  return OkStatus();
}

StatusOr<std::unique_ptr<Template>> MicrovmInstance::MakeTemplate(
    MicrovmBackend* backend, const std::string& key, const images::Stack& stack,
    const std::vector<int>& layers, int cpus, int64_t ram_mb, int64_t disk_mb, bool nic) {
  int64_t t0 = MonotonicMs();
  SandboxSpec spec;
  spec.id = "tmpl-" + RandomHex(6);
  spec.kind = Kind::kMicrovm;
  spec.hostname = "template";
  spec.resources.cpu = cpus;
  // The asking create's (clones of another size resize theirs), with room for the guest.
  spec.resources.disk_mb = std::clamp<int64_t>(disk_mb, 1, ram_mb / 2);
  spec.resources.memory_mb = ram_mb - spec.resources.disk_mb;
  MicrovmInstance t(backend, spec);
  t.mode_ = Mode::kTemplate;
  t.nic_ = nic ? Nic::kUnplugged : Nic::kNone;
  auto out = std::make_unique<Template>();
  out->key = key;
  out->id = spec.id;
  out->ram_mb = ram_mb;
  Status s = [&]() -> Status {
    DSEC_RETURN_IF_ERROR(t.ClaimDirectory());
    DSEC_RETURN_IF_ERROR(t.LeaseAndCgroup());
    out->ram.Reset(memfd_create("dsec-vm-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    out->state.Reset(memfd_create("dsec-vm-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!out->ram || !out->state) return ErrnoError("memfd_create");
    if (ftruncate(out->ram.get(), ram_mb << 20) < 0) return ErrnoError("size the template's RAM");
    t.ram_fd_.Reset(fcntl(out->ram.get(), F_DUPFD_CLOEXEC, 3));
    std::vector<UniqueFd> own;
    for (int fd : layers) own.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 3));
    DSEC_RETURN_IF_ERROR(t.SpawnQemu(std::move(own)));
    protocol::GuestSetup prepare = TemplatePlan(PlanInputs(*backend, stack, nic, spec.id));
    prepare.sandbox_id = spec.id;
    out->prepared = PreparedText(prepare);
    return t.SaveAsTemplate(out.get(), prepare);
  }();
  (void)t.Destroy();
  if (!s.ok()) return s;
  out->build_ms = MonotonicMs() - t0;
  return out;
}

}  // namespace dsec::backends::microvm
