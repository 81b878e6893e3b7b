// Real microVMs through the microVM backend (privileged: root, QEMU and the guest kernel of
// scripts/guest-kernel; skipped with the reason otherwise). On TCG a cold boot takes ~2 s of
// two cores, so the cases share few VMs.
#include "backends/microvm/microvm_instance.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>

#include <climits>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>

#include "backends/microvm/microvm_backend.h"
#include "backends/session/bootstrap.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/strings.h"
#include "base/testing/poll.h"
#include "images/import.h"
#include "images/store.h"

namespace dsec::backends::microvm {
namespace {

int Sh(const std::string& cmd) { return system(cmd.c_str()); }

struct Env {
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<images::ImageStore> store;
  std::unique_ptr<MicrovmBackend> backend;
  std::string skip;
};

// A busybox root filesystem imported as "bb:1".
Status ImportBusybox(Env& e) {
  std::string src = e.dir->path() + "/rootfs";
  if (Sh("mkdir -p " + src + "/bin " + src + "/etc " + src + "/tmp && cp /bin/busybox " + src +
         "/bin/ && for a in sh echo cat id hostname uname ls sleep true head dd mount; do ln -s "
         "busybox " +
         src + "/bin/$a; done && printf 'root:x:0:0:root:/root:/bin/sh\\n' > " + src +
         "/etc/passwd && tar -C " + src + " --numeric-owner -cf " + e.dir->path() + "/bb.tar .") !=
      0)
    return InternalError("making the busybox rootfs failed");
  images::ImportOptions o;
  o.name = "bb:1";
  return images::ImportFile(e.store.get(), e.dir->path() + "/bb.tar", o).status();
}

Env& GetEnv() {
  static Env e;
  if (e.backend || !e.skip.empty()) return e;
  if (geteuid() != 0) return e.skip = "needs root", e;
  if (access("/bin/busybox", X_OK) != 0) return e.skip = "needs busybox-static", e;
  auto d = TempDir::Create("/tmp/dsec-vmtest-");
  if (!d.ok()) return e.skip = d.status().ToString(), e;
  e.dir = std::make_unique<TempDir>(std::move(*d));
  images::StoreOptions so;
  so.root = e.dir->path() + "/state/images";
  auto store = images::ImageStore::Open(so);
  if (!store.ok()) return e.skip = store.status().ToString(), e;
  e.store = std::move(*store);
  if (Status s = ImportBusybox(e); !s.ok()) return e.skip = s.ToString(), e;
  MicrovmBackendOptions o;
  o.state_dir = e.dir->path() + "/state";
  o.agent_path = DSEC_TEST_AGENT_PATH;
  o.image_store = e.store.get();
  if (const char* k = getenv("DSEC_GUEST_KERNEL")) o.kernel_dir = k;
  auto b = MicrovmBackend::Create(o);
  // A machine without QEMU or the guest kernel cannot run these: say which.
  if (!b.ok()) return e.skip = b.status().ToString(), e;
  e.backend = std::move(*b);
  return e;
}

class MicrovmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Env& e = GetEnv();
    if (!e.skip.empty()) GTEST_SKIP() << "[  SKIPPED ] " << e.skip;
    backend_ = e.backend.get();
  }
  SandboxSpec Spec(const std::string& id) {
    SandboxSpec s;
    s.id = id;
    s.kind = Kind::kMicrovm;
    s.image = "bb:1";
    s.resources.memory_mb = 192;
    s.resources.disk_mb = 64;
    return s;
  }
  ExecOutput Run(Sandbox& sb, const std::string& shell) {
    ExecRequest r;
    r.shell = shell;
    r.timeout_ms = 60000;
    auto out = sb.Exec(r);
    EXPECT_TRUE(out.ok()) << shell << ": " << out.status().ToString();
    return out.ok() ? *out : ExecOutput{};
  }
  MicrovmBackend* backend_ = nullptr;
};

TEST_F(MicrovmTest, BootsAnImageRunsCommandsAndLeavesNothingBehind) {
  auto sb = backend_->Create(Spec("vm-one"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto& inst = static_cast<MicrovmInstance&>((*sb)->instance());
  std::string dir = inst.dir();
  pid_t qemu = inst.qemu_pid();
  EXPECT_EQ((*sb)->state(), SandboxState::kRunning);

  // Its own kernel (the guest's, not the host's), hostname and user.
  auto out = Run(**sb, "uname -r; hostname; id -u; cat /proc/1/cmdline; echo; pwd");
  EXPECT_EQ(out.result.exit_code, 0) << out.stderr_data;
  auto lines = SplitString(out.stdout_data, '\n', true);
  ASSERT_GE(lines.size(), 5u) << out.stdout_data;
  EXPECT_EQ(lines[0], backend_->kernel().version);
  EXPECT_EQ(lines[1], "vm-one");
  EXPECT_EQ(lines[2], "1000");
  EXPECT_EQ(lines[3].substr(0, 5), "/init");
  EXPECT_EQ(lines[4], "/workspace");
  out = Run(**sb, "echo err >&2; exit 3");
  EXPECT_EQ(out.result.exit_code, 3);
  EXPECT_EQ(out.stderr_data, "err\n");

  // Files through the agent, the root an overlay over the image's read-only block device.
  ASSERT_TRUE((*sb)->WriteFile("/workspace/a.txt", std::string("hello vm\n"), 0644).ok());
  auto read = (*sb)->ReadFile("/workspace/a.txt", 1 << 20);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "hello vm\n");
  auto ls = (*sb)->ListDir("/bin");
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  EXPECT_GE(ls->size(), 10u);
  out = Run(**sb, "grep ' / ' /proc/mounts; cat /sys/block/vda/ro");
  EXPECT_NE(out.stdout_data.find("overlay / overlay"), std::string::npos) << out.stdout_data;
  EXPECT_NE(out.stdout_data.find("\n1\n"), std::string::npos) << out.stdout_data;

  // QEMU runs as its own unprivileged uid, under its seccomp sandbox, in the VM's cgroup.
  auto status = ReadFileToString("/proc/" + std::to_string(qemu) + "/status");
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("Uid:\t" + std::to_string(inst.qemu_uid())), std::string::npos);
  EXPECT_NE(inst.qemu_uid(), 0u);
  EXPECT_NE(status->find("Seccomp:\t2"), std::string::npos);
  EXPECT_NE(status->find("NoNewPrivs:\t1"), std::string::npos);
  // In a network namespace of its own (it needs none: its sockets are inherited), and its uid
  // lease is a read-only descriptor of the host-wide lease file (issue 35 item 8).
  auto ns_of = [](const std::string& pid, const char* ns) {
    char buf[64] = {};
    ssize_t n = readlink(("/proc/" + pid + "/ns/" + ns).c_str(), buf, sizeof buf - 1);
    return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
  };
  // Its jail (isolation/jail.h): every namespace but the user one its own, PID 1 in its pid
  // namespace, and a root holding only what it runs from.
  for (const char* ns : {"net", "mnt", "pid", "ipc", "uts"}) {
    EXPECT_NE(ns_of(std::to_string(qemu), ns), ns_of("self", ns)) << ns;
    EXPECT_NE(ns_of(std::to_string(qemu), ns), "") << ns;
  }
  EXPECT_NE(status->find("NSpid:\t" + std::to_string(qemu) + "\t1\n"), std::string::npos)
      << *status;
  auto root = ListDir("/proc/" + std::to_string(qemu) + "/root");
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  std::sort(root->begin(), root->end());
  for (const std::string& e : *root)
    EXPECT_TRUE(e == "bin" || e == "dev" || e == "etc" || e == "lib" || e == "lib64" ||
                e == "proc" || e == "usr")
        << "QEMU's root holds " << e;
  auto dev = ListDir("/proc/" + std::to_string(qemu) + "/root/dev");
  ASSERT_TRUE(dev.ok());
  EXPECT_LE(dev->size(), 3u);  // null, urandom (and kvm under KVM)
  int lease_fds = 0;
  const std::string fd_dir = "/proc/" + std::to_string(qemu) + "/fd";
  auto fds = ListDir(fd_dir);
  ASSERT_TRUE(fds.ok()) << fds.status().ToString();
  for (const std::string& fd : *fds) {
    char target[PATH_MAX] = {};
    if (readlink((fd_dir + "/" + fd).c_str(), target, sizeof target - 1) <= 0) continue;
    if (std::string(target) != MicrovmBackendOptions().uid_lock_file) continue;
    ++lease_fds;
    auto info = ReadFileToString("/proc/" + std::to_string(qemu) + "/fdinfo/" + fd);
    ASSERT_TRUE(info.ok());
    size_t at = info->find("flags:\t");
    ASSERT_NE(at, std::string::npos);
    unsigned long flags = std::stoul(info->substr(at + 7), nullptr, 8);
    EXPECT_EQ(flags & O_ACCMODE, static_cast<unsigned long>(O_RDONLY)) << *info;
  }
  EXPECT_EQ(lease_fds, 1);
  auto st = (*sb)->Stats();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_GT(st->memory_current, 16u << 20);  // guest RAM QEMU touched
  EXPECT_GE(st->pids, 1u);

  // Pause stops the guest (QMP stop); an exec resumes it transparently.
  ASSERT_TRUE((*sb)->Pause().ok());
  EXPECT_EQ((*sb)->state(), SandboxState::kPaused);
  out = Run(**sb, "echo back");
  EXPECT_EQ(out.stdout_data, "back\n");

  ASSERT_TRUE((*sb)->Destroy().ok());
  EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir << " is left";
  EXPECT_NE(kill(qemu, 0), 0) << "QEMU " << qemu << " is left";
  for (const char* h : {"unified", "memory", "pids", ""}) {
    std::string cg =
        std::string("/sys/fs/cgroup/") + h + "/dsec-" + backend_->instance_id() + "-vm/vm-one";
    EXPECT_NE(access(cg.c_str(), F_OK), 0) << cg << " is left";
  }
}

TEST_F(MicrovmTest, QemuDyingFailsTheSandbox) {
  auto sb = backend_->Create(Spec("vm-dies"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  pid_t qemu = static_cast<MicrovmInstance&>((*sb)->instance()).qemu_pid();
  ASSERT_EQ(kill(qemu, SIGKILL), 0);
  EXPECT_TRUE(testing::PollUntil([&] { return (*sb)->state() == SandboxState::kFailed; }, 10000));
  ExecRequest r;
  r.cmd = {"true"};
  EXPECT_FALSE((*sb)->Exec(r).ok());
  EXPECT_TRUE((*sb)->Destroy().ok());
}

// Root in the guest floods the serial console, tries to write the image's block device and
// panics the kernel: the host keeps nothing of the flood, the layer is unchanged, and the
// panic ends QEMU, which fails the sandbox (and nothing else).
TEST_F(MicrovmTest, RootInTheGuestCannotReachPastTheVm) {
  auto sb = backend_->Create(Spec("vm-root"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  auto& inst = static_cast<MicrovmInstance&>((*sb)->instance());
  std::string log = inst.dir() + "/qemu.log";
  auto run_root = [&](const std::string& shell, int64_t timeout_ms = 60000) {
    ExecRequest r;
    r.shell = shell;
    r.user = "root";
    r.timeout_ms = timeout_ms;
    auto out = (*sb)->Exec(r);
    EXPECT_TRUE(out.ok()) << shell << ": " << out.status().ToString();
    return out.ok() ? *out : ExecOutput{};
  };
  EXPECT_EQ(run_root("id -u").stdout_data, "0\n");
  // 8 MiB at the console: the host end is a 64 KiB ring, so nothing of it lands on disk.
  run_root("dd if=/dev/zero of=/dev/ttyS0 bs=64k count=128 2>/dev/null; echo done", 20000);
  struct stat st;
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  EXPECT_LT(st.st_size, 4096) << "QEMU's log grew with the guest's console";
  // The layers are read-only devices; the initramfs (with /init) is gone.
  auto w = run_root("dd if=/dev/zero of=/dev/vda bs=512 count=1 2>&1; echo rc=$?; ls /init 2>&1");
  EXPECT_NE(w.stdout_data.find("rc=1"), std::string::npos) << w.stdout_data;
  EXPECT_NE(w.stdout_data.find("No such file"), std::string::npos) << w.stdout_data;
  EXPECT_EQ(Run(**sb, "echo still here").stdout_data, "still here\n");
  // A kernel panic ends the VM (panic=-1, -no-reboot): the sandbox fails, says so.
  ExecRequest panic;
  panic.shell = "echo c > /proc/sysrq-trigger";
  panic.user = "root";
  (void)(*sb)->Exec(panic);
  EXPECT_TRUE(testing::PollUntil([&] { return (*sb)->state() == SandboxState::kFailed; }, 30000));
  EXPECT_TRUE((*sb)->Destroy().ok());
}

int64_t PssKb(pid_t pid) {
  auto s = ReadFileToString("/proc/" + std::to_string(pid) + "/smaps_rollup");
  if (!s.ok()) return -1;
  size_t at = s->find("\nPss:");
  return at == std::string::npos ? -1 : strtoll(s->c_str() + at + 5, nullptr, 10);
}

// Creates of one image and size restore a template: each clone is its own machine (hostname,
// fresh entropy, the host's clock, its own writable layer), sharing only the template's
// sealed RAM copy-on-write.
TEST_F(MicrovmTest, ClonesOfATemplateAreSeparateMachines) {
  auto a = backend_->Create(Spec("vm-a"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = backend_->Create(Spec("vm-b"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto& ia = static_cast<MicrovmInstance&>((*a)->instance());
  auto& ib = static_cast<MicrovmInstance&>((*b)->instance());
  EXPECT_TRUE(ia.from_template());
  EXPECT_TRUE(ib.from_template());
  EXPECT_GE(backend_->template_count(), 1u);
  const std::string probe = "hostname; head -c 16 /dev/urandom | od -An -tx1; date +%s";
  const std::string out_a = Run(**a, probe).stdout_data, out_b = Run(**b, probe).stdout_data;
  auto oa = SplitString(out_a, '\n', true);
  auto ob = SplitString(out_b, '\n', true);
  ASSERT_EQ(oa.size(), 3u);
  ASSERT_EQ(ob.size(), 3u);
  EXPECT_EQ(oa[0], "vm-a");
  EXPECT_EQ(ob[0], "vm-b");
  EXPECT_NE(oa[1], ob[1]) << "clones share their entropy";
  // The clock is the host's, not the template's instant.
  int64_t now = time(nullptr);
  EXPECT_LE(std::abs(ParseInt64(oa[2]).value_or(0) - now), 10);
  EXPECT_LE(std::abs(ParseInt64(ob[2]).value_or(0) - now), 10);
  ASSERT_TRUE((*a)->WriteFile("/workspace/only-a", std::string("a"), 0644).ok());
  EXPECT_EQ(Run(**b, "ls /workspace/only-a 2>&1 || true").stdout_data.find("only-a\n"),
            std::string::npos);
  // What a clone maps is the template's sealed memfd: not even root (nor a QEMU that is taken
  // over) can write it through any descriptor.
  bool saw_ram = false;
  std::string fds = "/proc/" + std::to_string(ia.qemu_pid()) + "/fd";
  auto entries = ListDir(fds);
  ASSERT_TRUE(entries.ok());
  for (const auto& e : *entries) {
    char target[256] = {};
    if (readlink((fds + "/" + e).c_str(), target, sizeof target - 1) <= 0) continue;
    if (std::string(target).find("memfd:dsec-vm-ram") == std::string::npos) continue;
    saw_ram = true;
    UniqueFd ram(open((fds + "/" + e).c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(ram.valid());
    EXPECT_TRUE(fcntl(ram.get(), F_GET_SEALS) & F_SEAL_WRITE);
    EXPECT_EQ(pwrite(ram.get(), "x", 1, 4096), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(ftruncate(ram.get(), 4096), -1);
  }
  EXPECT_TRUE(saw_ram) << "no template RAM among the clone's descriptors";
  std::cout << "[          ] clone QEMU PSS: " << PssKb(ia.qemu_pid()) / 1024 << " MiB, "
            << PssKb(ib.qemu_pid()) / 1024 << " MiB\n";
  EXPECT_TRUE((*a)->Destroy().ok());
  EXPECT_TRUE((*b)->Destroy().ok());
}

// A fork that carries memory: its processes run on from their state at the fork (a shell loop's
// counter in its variables, a sleeping process), its files are its source's, and it is a
// machine of its own (hostname, machine-id, entropy, the agent's secret); source and fork go
// their own ways afterwards. A paused source stays paused.
TEST_F(MicrovmTest, AForkWithMemoryCarriesProcessesAndIsItsOwnMachine) {
  auto Count = [&](Sandbox& sb) {
    return ParseInt64(TrimWhitespace(Run(sb, "cat /tmp/count").stdout_data)).value_or(0);
  };
  auto src = backend_->Create(Spec("vm-src"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_TRUE((*src)->WriteFile("/workspace/file", std::string("from the source\n"), 0644).ok());
  // A counter only the process's memory holds, written out once a second.
  Run(**src,
      "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done) >/dev/null 2>&1 &"
      " sleep 2000 >/dev/null 2>&1 &");
  ASSERT_TRUE(testing::PollUntil([&] { return Count(**src) >= 3; }, 30000));
  auto state = (*src)->SaveMachine();
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const auto* vm = dynamic_cast<const VmState*>(state->get());
  ASSERT_NE(vm, nullptr);
  EXPECT_GT(vm->bytes, 1u << 20);
  EXPECT_TRUE(fcntl(vm->stream.get(), F_GET_SEALS) & F_SEAL_WRITE);
  EXPECT_EQ((*src)->state(), SandboxState::kRunning);
  const int64_t at_fork = Count(**src);

  SandboxSpec fs = Spec("vm-fork");
  fs.machine = *state;
  auto fork = backend_->Create(fs);
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  // The loop runs on in the fork from where it was (not from 0), and the sleeper is there.
  ASSERT_TRUE(testing::PollUntil([&] { return Count(**fork) > at_fork + 1; }, 30000));
  EXPECT_NE(Run(**fork, "ps").stdout_data.find("sleep 2000"), std::string::npos);
  EXPECT_EQ(Run(**fork, "cat /workspace/file").stdout_data, "from the source\n");
  const std::string probe =
      "hostname; cat /etc/hostname /etc/machine-id; head -c 16 /dev/urandom"
      " | od -An -tx1; date +%s";
  const std::string out_f = Run(**fork, probe).stdout_data, out_s = Run(**src, probe).stdout_data;
  auto of = SplitString(out_f, '\n', true);
  auto os = SplitString(out_s, '\n', true);
  ASSERT_EQ(of.size(), 5u);
  ASSERT_EQ(os.size(), 5u);
  EXPECT_EQ(of[0], "vm-fork");
  EXPECT_EQ(of[1], "vm-fork");
  EXPECT_EQ(os[0], "vm-src");
  EXPECT_NE(of[2], os[2]) << "a fork has its own machine-id";
  EXPECT_NE(of[3], os[3]) << "a fork shares its source's entropy";
  EXPECT_LE(std::abs(ParseInt64(of[4]).value_or(0) - time(nullptr)), 10);
  // Their own ways: a file written in one is not in the other.
  ASSERT_TRUE((*fork)->WriteFile("/workspace/only-fork", std::string("f"), 0644).ok());
  EXPECT_NE(Run(**src, "cat /workspace/only-fork 2>&1 || true").stdout_data, "f");
  // The source's secret no longer opens the fork's agent; the fork's own handle does.
  std::string handle = (*fork)->AdoptionHandle();
  EXPECT_EQ(handle.find(vm->secret), std::string::npos);
  const std::string port = static_cast<MicrovmInstance&>((*fork)->instance()).dir() + "/agent.sock";
  (*fork)->Detach();
  {
    UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, port.data(), port.size());
    ASSERT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    auto old = Reauthenticate(s.get(), vm->secret, MonotonicMs() + 20000);
    ASSERT_FALSE(old.ok());
    EXPECT_EQ(old.status().code(), StatusCode::kUnauthenticated) << old.status().ToString();
  }
  auto again = backend_->Adopt(Spec("vm-fork"), handle);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Run(**again, "hostname").stdout_data, "vm-fork\n");
  // A fork of that adopted fork: what its RAM is was found again (over QMP) on adoption.
  auto state2 = (*again)->SaveMachine();
  ASSERT_TRUE(state2.ok()) << state2.status().ToString();
  SandboxSpec gs = Spec("vm-fork2");
  gs.machine = *state2;
  state2->reset();
  auto grand = backend_->Create(gs);
  ASSERT_TRUE(grand.ok()) << grand.status().ToString();
  EXPECT_EQ(Run(**grand, "hostname; cat /workspace/only-fork").stdout_data, "vm-fork2\nf");
  EXPECT_TRUE((*grand)->Destroy().ok());

  // A paused source is saved as it is and stays paused.
  ASSERT_TRUE((*src)->Pause().ok());
  auto paused = (*src)->SaveMachine();
  ASSERT_TRUE(paused.ok()) << paused.status().ToString();
  EXPECT_EQ((*src)->state(), SandboxState::kPaused);
  // A fork whose shape differs from its source's is refused.
  SandboxSpec bigger = Spec("vm-bad-fork");
  bigger.machine = *paused;
  bigger.resources.memory_mb = 256;
  auto bad = backend_->Create(bigger);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition) << bad.status().ToString();
  EXPECT_NE(access((GetEnv().dir->path() + "/state/microvms/vm-bad-fork").c_str(), F_OK), 0);
  EXPECT_TRUE((*again)->Destroy().ok());
  EXPECT_TRUE((*src)->Destroy().ok());
}

// A detached VM keeps running (QEMU, its processes, its files, paused or not) and the next
// Adopt reconnects to its agent with the handle's secret. A handle with a wrong secret is
// refused, and what it named is destroyed (a VM nobody can speak for is not served).
TEST_F(MicrovmTest, ADetachedVmIsAdoptedWithItsProcessesAndFiles) {
  auto sb = backend_->Create(Spec("vm-adopt"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  pid_t qemu = static_cast<MicrovmInstance&>((*sb)->instance()).qemu_pid();
  ASSERT_TRUE((*sb)->WriteFile("/workspace/kept", std::string("kept\n"), 0644).ok());
  Run(**sb, "sleep 1000 >/dev/null 2>&1 &");
  ASSERT_TRUE((*sb)->Pause().ok());
  std::string handle = (*sb)->AdoptionHandle();
  (*sb)->Detach();
  EXPECT_EQ(kill(qemu, 0), 0) << "a detached VM must keep running";

  auto again = backend_->Adopt(Spec("vm-adopt"), handle);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->state(), SandboxState::kPaused);
  EXPECT_EQ(Run(**again, "cat /workspace/kept").stdout_data, "kept\n");  // resumes it
  EXPECT_NE(Run(**again, "ps").stdout_data.find("sleep 1000"), std::string::npos);

  std::string forged = (*again)->AdoptionHandle();
  (*again)->Detach();
  size_t at = forged.find("\"secret\":\"") + 10;
  forged[at] = forged[at] == 'a' ? 'b' : 'a';
  auto bad = backend_->Adopt(Spec("vm-adopt"), forged);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnauthenticated) << bad.status().ToString();
  EXPECT_TRUE(testing::PollUntil([&] { return kill(qemu, 0) != 0; }, 5000));
  EXPECT_NE(access((GetEnv().dir->path() + "/state/microvms/vm-adopt").c_str(), F_OK), 0);
}

// Without templates every create boots the kernel (the path a set that cannot be templated
// takes); it works the same.
TEST_F(MicrovmTest, ColdBootsWithoutTemplates) {
  MicrovmBackendOptions o;
  o.state_dir = GetEnv().dir->path() + "/state-cold";
  o.agent_path = DSEC_TEST_AGENT_PATH;
  o.image_store = GetEnv().store.get();
  o.templates = false;
  if (const char* k = getenv("DSEC_GUEST_KERNEL")) o.kernel_dir = k;
  auto cold = MicrovmBackend::Create(o);
  ASSERT_TRUE(cold.ok()) << cold.status().ToString();
  auto sb = (*cold)->Create(Spec("vm-cold"));
  ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  EXPECT_FALSE(static_cast<MicrovmInstance&>((*sb)->instance()).from_template());
  EXPECT_EQ(Run(**sb, "hostname").stdout_data, "vm-cold\n");
  EXPECT_TRUE((*sb)->Destroy().ok());
  EXPECT_EQ((*cold)->template_count(), 0u);
}

// microvm_accel auto: a kvm device that does not open means TCG at once; one that opens gets a
// probe boot under KVM in the background (creates wait for it), and TCG with the reason when
// the guest does not boot (here the "device" is a plain file, so QEMU finds no KVM). kvm when
// the device does not open is refused at start.
TEST_F(MicrovmTest, TheAcceleratorIsChosenByBootingAProbe) {
  auto backend_with = [&](Accel accel, const std::string& device) {
    MicrovmBackendOptions o;
    o.state_dir = GetEnv().dir->path() + "/state-accel";
    o.agent_path = DSEC_TEST_AGENT_PATH;
    o.image_store = GetEnv().store.get();
    o.accel = accel;
    o.kvm_device = device;
    if (const char* k = getenv("DSEC_GUEST_KERNEL")) o.kernel_dir = k;
    return MicrovmBackend::Create(o);
  };
  std::string missing = GetEnv().dir->path() + "/no-kvm";
  auto none = backend_with(Accel::kAuto, missing);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ((*none)->AccelNow(), "tcg");
  EXPECT_NE((*none)->accel_reason().find("cannot be opened"), std::string::npos);
  none->reset();

  auto forced = backend_with(Accel::kKvm, missing);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), StatusCode::kFailedPrecondition);

  std::string fake = GetEnv().dir->path() + "/fake-kvm";
  ASSERT_TRUE(WriteStringToFile(fake, "", O_WRONLY | O_CREAT).ok());
  auto probed = backend_with(Accel::kAuto, fake);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  std::string accel(AccelName((*probed)->accel()));  // waits for the probe
  if (access("/dev/kvm", R_OK | W_OK) != 0) {
    EXPECT_EQ(accel, "tcg");
    EXPECT_NE((*probed)->accel_reason().find("does not boot under KVM"), std::string::npos)
        << (*probed)->accel_reason();
  } else {
    EXPECT_TRUE(accel == "kvm" || accel == "tcg") << accel;
  }
  // The probe left nothing behind.
  auto left = ListDir(GetEnv().dir->path() + "/state-accel/microvms");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

TEST_F(MicrovmTest, WhatCannotBootIsRefusedClearly) {
  SandboxSpec s = Spec("vm-host");
  s.image = "host";
  auto sb = backend_->Create(s);
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), StatusCode::kUnimplemented) << sb.status().ToString();
  EXPECT_NE(sb.status().message().find("host"), std::string::npos);
  s.image = "nope:1";
  sb = backend_->Create(s);
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), StatusCode::kNotFound) << sb.status().ToString();
  // Nothing of either is left.
  auto left = ListDir(GetEnv().dir->path() + "/state/microvms");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

}  // namespace
}  // namespace dsec::backends::microvm
