// MicroVM templates (microvm_backend.h): saving a booted VM as a template, and a clone's restore
// from one. The template's RAM and device state are memfds, sealed once saved. Also a running
// VM's whole state saved for forks that carry memory, and a fork's restore from it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "backends/microvm/microvm_backend.h"
#include "backends/microvm/microvm_instance.h"
#include "backends/session/bootstrap.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/scope_guard.h"
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

Status MicrovmInstance::Restore(int state_fd) {
  MicrovmBackend& b = *backend_;
  auto qmp = QmpClient::Connect(JoinPath(dir_, "qmp.sock"), 5000);
  // (A QEMU that refused its command line is gone already: its log says why.)
  if (!qmp.ok()) return Carrier().explain(qmp.status()).WithContext("QMP of " + spec_.id);
  qmp_.emplace(std::move(*qmp));
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-set-capabilities", kIgnoreShared).status());
  // A description of its own (offset 0): clones restore side by side.
  UniqueFd state(open(("/proc/self/fd/" + std::to_string(state_fd)).c_str(), O_RDONLY | O_CLOEXEC));
  if (!state) return ErrnoError("open the saved state");
  DSEC_RETURN_IF_ERROR(qmp_->Execute("getfd", {{"fdname", "state"}}, 5000, state.get()).status());
  DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-incoming", {{"uri", "fd:state"}}).status());
  DSEC_ASSIGN_OR_RETURN(std::string st,
                        qmp_->WaitStatus("query-status", {"inmigrate"}, b.opts_.boot_timeout_ms));
  if (st != "paused" && st != "running")
    return Unavailable("restoring the saved state of " + spec_.id + " ended " + st);
  return qmp_->Execute("cont").status();
}

StatusOr<std::shared_ptr<const MachineState>> MicrovmInstance::SaveMachine(bool running) {
  if (!qmp_) return FailedPrecondition("microVM " + spec_.id + " has no QMP connection");
  if (nic_ != Nic::kNone)
    return Unimplemented(
        "a fork with memory of a microVM with a network is not supported (its guest would keep "
        "its source's address); fork it without memory, or create it with network none");
  auto out = std::make_shared<VmState>();
  out->stream.Reset(memfd_create("dsec-vm-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!out->stream) return ErrnoError("memfd for the VM's state");
  out->secret = secret_;
  for (const auto& l : stack_.layers) out->layer_digests.push_back(l.digest);
  out->cpus = Cpus();
  out->ram_mb = GuestRamMb();
  out->ram_object = ram_object_;
  // QEMU writes the stream into a pipe and the edge copies it into the memfd: its pages are the
  // edge's to hold, not charged to the VM's cgroup (that has room for the guest's RAM once).
  // At most the guest's RAM and its devices' state: a QEMU taken over by its guest cannot make
  // the edge hold more.
  const uint64_t max_bytes = (static_cast<uint64_t>(out->ram_mb) << 20) + (64u << 20);
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return ErrnoError("pipe for the VM's state");
  UniqueFd rd(p[0]), wr(p[1]);
  Status copied;
  std::atomic<bool> stop{false};  // the save is over: a QEMU that never closes is not waited for
  std::thread copier([&, fd = out->stream.get()] {
    char buf[1 << 16];
    int quiet = 0;  // 200-ms polls without a byte since the save was over
    while (true) {
      pollfd pf{rd.get(), POLLIN, 0};
      int ready = poll(&pf, 1, 200);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        if (!stop || ++quiet < 25) continue;
        copied = DeadlineExceeded("QEMU did not finish the VM's state");
        return;
      }
      ssize_t n = read(rd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) copied = ErrnoError("read the VM's state");
      if (n <= 0) return;
      if (out->bytes + static_cast<uint64_t>(n) > max_bytes) {
        copied = ResourceExhausted("the VM's state is larger than its memory");
        return;
      }
      copied = WriteAllFd(fd, std::string_view(buf, static_cast<size_t>(n)), "the VM's state");
      if (!copied.ok()) return;
      out->bytes += static_cast<uint64_t>(n);
    }
  });
  auto join = MakeScopeGuard([&] {
    wr.Reset();  // (a save that never reached QEMU: EOF at once)
    stop = true;
    if (copier.joinable()) copier.join();
  });
  auto migrate = [&]() -> Status {
    DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate-set-capabilities", kIgnoreShared).status());
    // Unthrottled: QEMU's default cap (128 MiB/s) is for live migration over a network; this
    // one is a stopped VM into memory.
    DSEC_RETURN_IF_ERROR(
        qmp_->Execute("migrate-set-parameters", {{"max-bandwidth", int64_t{1} << 40}}).status());
    DSEC_RETURN_IF_ERROR(qmp_->Execute("getfd", {{"fdname", "fork"}}, 5000, wr.get()).status());
    wr.Reset();  // QEMU holds the only write end: its close is the copier's EOF
    DSEC_RETURN_IF_ERROR(qmp_->Execute("migrate", {{"uri", "fd:fork"}}).status());
    DSEC_ASSIGN_OR_RETURN(std::string st, qmp_->WaitStatus("query-migrate",
                                                           {"", "none", "setup", "active",
                                                            "pre-switchover", "device"},
                                                           backend_->opts_.boot_timeout_ms));
    if (st != "completed") return Unavailable("saving microVM " + spec_.id + " ended " + st);
    return OkStatus();
  };
  const int64_t t0 = MonotonicUs();
  if (running) DSEC_RETURN_IF_ERROR(qmp_->Execute("stop").status());
  Status saved = migrate();
  // It runs on (a migration that completed leaves the source stopped; a failed one too).
  if (running) {
    Status cont = qmp_->Execute("cont").status();
    if (saved.ok()) saved = cont;
  }
  if (!saved.ok()) (void)qmp_->Execute("migrate_cancel");  // (QEMU closes its end)
  DSEC_RETURN_IF_ERROR(saved);
  stop = true;
  if (copier.joinable()) copier.join();
  DSEC_RETURN_IF_ERROR(copied);
  DSEC_RETURN_IF_ERROR(Seal(out->stream.get(), "VM state"));
  DSEC_LOG_INFO("microvm {}: saved its machine for forks ({} MiB in {:.1f} ms)", spec_.id,
                out->bytes >> 20, static_cast<double>(MonotonicUs() - t0) / 1000.0);
  return std::shared_ptr<const MachineState>(std::move(out));
}

StatusOr<protocol::Hello> MicrovmInstance::TakeIdentity(UniqueFd* conn) {
  MicrovmBackend& b = *backend_;
  protocol::Auth auth;
  auth.secret = fork_->secret;
  protocol::GuestIdentity id;
  id.sandbox_id = spec_.id;
  id.hostname = spec_.hostname;
  id.secret = RandomHex(32);
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  id.realtime_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  id.entropy = RandomHex(64);
  // The files that name the machine; the rest of its writable layer is its source's.
  protocol::GuestSetup plan;
  PlanFiles(PlanInputs(b, stack_, /*nic=*/false, spec_.id), spec_.hostname, spec_.workdir,
            kSandboxUid, kSandboxGid, &plan);
  for (auto& f : plan.files)
    if (f.path == "/etc/hostname" || f.path == "/etc/hosts") id.files.push_back(std::move(f));
  id.files.push_back(MachineId(RandomHex(16)));
  auth.identity = std::move(id);
  const int64_t deadline = MonotonicMs() + b.opts_.boot_timeout_ms;
  auto hello = Reauthenticate(conn->get(), auth, deadline);
  if (!hello.ok() && hello.status().code() == StatusCode::kDeadlineExceeded) {
    // (a port the restored guest had not yet seen hang up) once more, on a new connection
    DSEC_LOG_WARN("microvm {}: no hello from the forked guest; reconnecting", spec_.id);
    conn->Reset();
    DSEC_ASSIGN_OR_RETURN(*conn, ConnectAgent());
    hello = Reauthenticate(conn->get(), auth, deadline);
  }
  if (!hello.ok()) return Carrier().explain(hello.status()).WithContext("the forked guest");
  secret_ = auth.identity->secret;
  return hello;
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
