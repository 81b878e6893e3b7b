#include "backends/microvm/qemu_cmd.h"

#include <cmath>
#include <cstdlib>

#include "base/enum_names.h"
#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::backends::microvm {

std::string GuestCmdline(const QemuConfig& c) {
  // console and panic: a panicking guest ends QEMU (-no-reboot) instead of hanging. The
  // timekeeping flags: TCG guests cannot calibrate their TSC when the host is busy (boots
  // hang), and the clocksource watchdog and friends cost an idle TCG guest six times its own
  // CPU (shared/notes/microvm-probe.md).
  std::string s =
      "console=ttyS0 reboot=t panic=-1 quiet loglevel=3 tsc=reliable clocksource=tsc "
      "nowatchdog nmi_watchdog=0 nohz=on workqueue.power_efficient=1 nosoftlockup audit=0";
  if (c.tsc_khz > 0) s += " tsc_early_khz=" + std::to_string(c.tsc_khz);
  s += " dsec.layers=" + std::to_string(c.layer_fds.size());
  s += " dsec.disk_mb=" + std::to_string(c.disk_mb);
  return s;
}

namespace {
constexpr EnumName<Accel> kAccels[] = {
    {Accel::kAuto, "auto"}, {Accel::kKvm, "kvm"}, {Accel::kTcg, "tcg"}};
}  // namespace

std::string_view AccelName(Accel a) { return NameIn(kAccels, a); }

StatusOr<Accel> ParseAccel(std::string_view s) {
  if (auto a = ValueIn(kAccels, s)) return *a;
  return InvalidArgument("microvm_accel must be " + NamesIn(kAccels) + ", not \"" + std::string(s) +
                         "\"");
}

std::vector<std::string> QemuArgv(const QemuConfig& c) {
  auto fd_path = [](int fd) { return "/proc/self/fd/" + std::to_string(fd); };
  std::vector<std::string> a = {
      c.qemu, "-M",
      // With a RAM file, the machine's RAM is that memory backend.
      std::string("microvm,x-option-roms=off,rtc=on") +
          (c.ram_fd >= 0 || c.ram_object ? ",memory-backend=mem" : ""),
      "-accel",
      c.accel == Accel::kKvm ? std::string("kvm")
                             : "tcg,thread=single,tb-size=" + std::to_string(c.tcg_tb_mb),
      "-cpu", c.accel == Accel::kKvm ? "host" : "max", "-smp", std::to_string(c.cpus), "-m",
      std::to_string(c.memory_mb) + "M", "-nodefaults", "-no-user-config", "-display", "none",
      "-no-reboot",
      // Its threads named on the host ("CPU 0/TCG", ...): the vCPUs' time and placement can
      // be told from QEMU's own.
      "-name", "dsec,debug-threads=on", "-kernel", fd_path(c.kernel_fd), "-initrd",
      fd_path(c.initrd_fd), "-append", GuestCmdline(c),
      // The guest's console: a bounded ring QMP can read (a guest
      // flooding its serial port fills nothing on the host).
      "-chardev", "ringbuf,id=con,size=65536", "-serial", "chardev:con", "-device",
      "virtio-serial-device", "-chardev",
      "socket,id=agent,fd=" + std::to_string(c.agent_listen_fd) + ",server=on,wait=off", "-device",
      "virtserialport,chardev=agent,name=dsec.agent", "-chardev",
      "socket,id=qmp,fd=" + std::to_string(c.qmp_listen_fd) + ",server=on,wait=off", "-mon",
      "chardev=qmp,mode=control"};
  if (c.ram_fd >= 0)
    a.insert(a.end(), {"-object", "memory-backend-file,id=mem,size=" + std::to_string(c.memory_mb) +
                                      "M,mem-path=" + fd_path(c.ram_fd) +
                                      ",share=" + (c.ram_shared ? "on" : "off")});
  else if (c.ram_object)
    a.insert(a.end(),
             {"-object", "memory-backend-ram,id=mem,size=" + std::to_string(c.memory_mb) + "M"});
  if (c.incoming) a.insert(a.end(), {"-incoming", "defer"});
  for (size_t i = 0; i < c.layer_fds.size(); ++i) {
    std::string set = std::to_string(i + 1), id = "layer" + std::to_string(i);
    a.insert(a.end(), {"-add-fd", "fd=" + std::to_string(c.layer_fds[i]) + ",set=" + set, "-drive",
                       "file=/dev/fdset/" + set + ",if=none,id=" + id +
                           ",format=raw,readonly=on,file.locking=off",
                       "-device", "virtio-blk-device,drive=" + id});
  }
  // After the disks, so they keep their names. The tap has no vnet header (QEMU asks it): a
  // template's hub port has none either, and clones restore the device state it saw.
  if (c.nic == Nic::kTap)
    a.insert(a.end(), {"-netdev", "tap,id=net0,fd=" + std::to_string(c.tap_fd)});
  else if (c.nic == Nic::kUnplugged)
    a.insert(a.end(), {"-netdev", "hubport,id=net0,hubid=0"});
  if (c.nic != Nic::kNone) a.insert(a.end(), {"-device", "virtio-net-device,netdev=net0"});
  if (c.seccomp)
    a.insert(a.end(), {"-sandbox",
                       "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"});
  return a;
}

int64_t HostTscKhz() {
  auto info = ReadFileToString("/proc/cpuinfo", 1 << 22);
  if (!info.ok()) return 0;
  for (std::string_view line : SplitString(*info, '\n', true)) {
    if (!StartsWith(line, "cpu MHz")) continue;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return 0;
    std::string v(TrimWhitespace(line.substr(colon + 1)));
    double mhz = strtod(v.c_str(), nullptr);
    return mhz > 0 ? static_cast<int64_t>(std::llround(mhz * 1000)) : 0;
  }
  return 0;
}

}  // namespace dsec::backends::microvm
