#include "agent/guest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/setup.h"
#include "base/file_util.h"
#include "base/resources.h"
#include "base/strings.h"
#include "isolation/rootfs.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::agent {
namespace {

using protocol::FrameType;

constexpr char kPortName[] = "dsec.agent";
constexpr char kUpper[] = "/rw";  // the tmpfs of the writable layer (before the move)
constexpr int kDeviceWaitMs = 10000;

int g_port = -1;  // once found: where a fatal error is reported

[[noreturn]] void PowerOff() {
  sync();
  reboot(RB_POWER_OFF);
  _exit(1);  // PID 1 exiting panics the kernel, which (panic=-1, -no-reboot) ends QEMU too
}

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

[[noreturn]] void Fail(const Status& s) {
  std::string line = "dsec-agent: guest init: " + s.ToString() + "\n";
  (void)!write(2, line.data(), line.size());
  if (g_port >= 0)
    WriteAll(g_port,
             protocol::EncodeFrameOrDie(FrameType::kError, 0, 0, protocol::ErrorJson(s).dump()));
  PowerOff();
}

void Check(const Status& s) {
  if (!s.ok()) Fail(s);
}

Status Mount(const char* src, const char* dst, const char* type, unsigned long flags,
             const char* data) {
  if (mount(src, dst, type, flags, data) < 0)
    return ErrnoError(std::string("mount ") + type + " on " + dst);
  return OkStatus();
}

// key=value from /proc/cmdline ("" when absent).
std::string CmdlineValue(const std::string& cmdline, const std::string& key) {
  for (std::string_view w : SplitString(cmdline, ' ', true)) {
    if (w.size() > key.size() && StartsWith(w, key) && w[key.size()] == '=')
      return std::string(TrimWhitespace(w.substr(key.size() + 1)));
  }
  return "";
}

void SleepMs(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

// The modules the backend packed, in /lib/modules/order (dependencies first).
Status LoadModules() {
  auto order = ReadFileToString("/lib/modules/order");
  if (!order.ok()) return order.status().WithContext("module list");
  for (std::string_view name : SplitString(*order, '\n', true)) {
    std::string n(TrimWhitespace(name));
    if (n.empty()) continue;
    std::string path = "/lib/modules/" + n;
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoError("open " + path);
    if (syscall(SYS_finit_module, fd.get(), "", 0) < 0 && errno != EEXIST)
      return ErrnoError("load module " + n);
    unlink(path.c_str());  // the initramfs is RAM: give it back
  }
  return OkStatus();
}

// /dev/vportNpM of the port named dsec.agent (its name arrives shortly after the port).
StatusOr<std::string> FindPort() {
  for (int waited = 0; waited < kDeviceWaitMs; waited += 2) {
    if (DIR* d = opendir("/sys/class/virtio-ports")) {
      std::string found;
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        auto name = ReadFileToString(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
        if (name.ok() && TrimWhitespace(*name) == kPortName)
          found = std::string("/dev/") + e->d_name;
      }
      closedir(d);
      if (!found.empty() && access(found.c_str(), F_OK) == 0) return found;
    }
    SleepMs(2);
  }
  return Unavailable(std::string("no virtio-serial port named ") + kPortName);
}

Status WaitForBlockDevice(const std::string& dev) {
  for (int waited = 0; waited < kDeviceWaitMs; waited += 2) {
    if (access(dev.c_str(), F_OK) == 0) return OkStatus();
    SleepMs(2);
  }
  return Unavailable("no block device " + dev + " (an image layer)");
}

// Layers /dev/vda (bottom) .. vd<N-1> (top), read-only, under a tmpfs upper, at /newroot.
Status BuildRoot(int layers, int64_t disk_mb) {
  if (layers < 1 || layers > 24) return InvalidArgument("dsec.layers must be 1..24");
  std::string lower;
  for (int i = 0; i < layers; ++i) {
    std::string dev = std::string("/dev/vd") + static_cast<char>('a' + i);
    std::string dir = "/layers/" + std::to_string(i);
    DSEC_RETURN_IF_ERROR(WaitForBlockDevice(dev));
    if (mkdir(dir.c_str(), 0755) < 0 && errno != EEXIST) return ErrnoError("mkdir " + dir);
    DSEC_RETURN_IF_ERROR(Mount(dev.c_str(), dir.c_str(), "erofs", MS_RDONLY, nullptr));
    lower = i == 0 ? dir : dir + ":" + lower;  // overlayfs lists the top layer first
  }
  std::string opts = "size=" + std::to_string(disk_mb > 0 ? disk_mb : 256) + "m,mode=0755";
  DSEC_RETURN_IF_ERROR(Mount("tmpfs", kUpper, "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()));
  if (mkdir("/rw/upper", 0755) < 0 || mkdir("/rw/work", 0755) < 0)
    return ErrnoError("mkdir the writable layer");
  std::string ov = "lowerdir=" + lower + ",upperdir=/rw/upper,workdir=/rw/work";
  // xino: readdir's inode numbers match stat's (see isolation/rootfs.cc); without if refused.
  if (Mount("overlay", "/newroot", "overlay", 0, (ov + ",xino=on").c_str()).ok()) return OkStatus();
  return Mount("overlay", "/newroot", "overlay", 0, ov.c_str());
}

// Moves /newroot over / (an initramfs cannot be pivot_root'ed away) and gives it the kernel
// filesystems a machine has.
Status SwitchRoot() {
  for (const char* d : {"/newroot/dev", "/newroot/proc", "/newroot/sys", "/newroot/tmp"})
    if (mkdir(d, 0755) < 0 && errno != EEXIST) return ErrnoError(std::string("mkdir ") + d);
  DSEC_RETURN_IF_ERROR(Mount("/dev", "/newroot/dev", nullptr, MS_MOVE, nullptr));
  umount2("/proc", MNT_DETACH);
  umount2("/sys", MNT_DETACH);
  if (chdir("/newroot") < 0) return ErrnoError("chdir /newroot");
  DSEC_RETURN_IF_ERROR(Mount(".", "/", nullptr, MS_MOVE, nullptr));
  if (chroot(".") < 0) return ErrnoError("chroot");
  if (chdir("/") < 0) return ErrnoError("chdir /");
  DSEC_RETURN_IF_ERROR(Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr));
  DSEC_RETURN_IF_ERROR(Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr));
  DSEC_RETURN_IF_ERROR(
      Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr));
  mkdir("/dev/pts", 0755);
  mkdir("/dev/shm", 01777);
  DSEC_RETURN_IF_ERROR(
      Mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=0666"));
  DSEC_RETURN_IF_ERROR(Mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
  chmod("/tmp", 01777);
  return OkStatus();
}

// A cgroup of its own for what the agent starts (spawn.cc tracks and kills execs by it), with
// the pids controller (the setup sets its limit).
StatusOr<UniqueFd> UserCgroup() {
  DSEC_RETURN_IF_ERROR(WriteStringToFile("/sys/fs/cgroup/cgroup.subtree_control", "+pids")
                           .WithContext("the guest's pids controller"));
  if (mkdir("/sys/fs/cgroup/dsec-user", 0755) < 0 && errno != EEXIST)
    return ErrnoError("mkdir the user cgroup");
  UniqueFd fd(open("/sys/fs/cgroup/dsec-user", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoError("open the user cgroup");
  return fd;
}

Status WriteStartFiles(const protocol::GuestSetup& s);

// Sends hello and waits for the setup frame. A host end that goes away (a template being
// saved; the clone restored from it gets a new one) is waited for and greeted again. A
// template's boot may first be asked to prepare its writable layer (GuestSetup::prepare).
StatusOr<protocol::GuestSetup> Greet(int port) {
  std::string hello = protocol::EncodeFrameOrDie(
      FrameType::kHello, 0, 0,
      protocol::Encode(protocol::Hello{protocol::kProtocolVersion, getpid(), {}}).dump());
  while (true) {
    if (!WriteAll(port, hello)) return ErrnoError("write hello");  // blocks until a host is there
    protocol::FrameDecoder decoder;
    protocol::Frame frame;
    char buf[16384];
    while (true) {
      ssize_t n = read(port, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read setup");
      if (n == 0) break;  // no host end any more
      DSEC_RETURN_IF_ERROR(decoder.Feed(std::string_view(buf, static_cast<size_t>(n))));
      if (!decoder.Next(&frame)) continue;
      if (frame.type != FrameType::kSetup) return InvalidArgument("expected a setup frame");
      DSEC_ASSIGN_OR_RETURN(protocol::Json j, protocol::ParseJson(frame.payload));
      DSEC_ASSIGN_OR_RETURN(protocol::GuestSetup setup, protocol::GuestSetupFromJson(j));
      if (!setup.prepare) return setup;
      // A template's boot: the dirs and files every clone's plan makes, made once here (in
      // the writable layer its clones start from), then the next host end is greeted.
      DSEC_RETURN_IF_ERROR(WriteStartFiles(setup).WithContext("prepare the template"));
      if (!WriteAll(port, protocol::EncodeFrameOrDie(
                              FrameType::kReady, 0, 0,
                              protocol::Encode(protocol::Ready{getpid(), -1}).dump())))
        return ErrnoError("write ready");
    }
    SleepMs(1);
  }
}

Status AddEntropy(const std::string& hex) {
  if (hex.empty()) return OkStatus();
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = nib(hex[i]), lo = nib(hex[i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("entropy must be lowercase hex");
    bytes.push_back(static_cast<char>(hi * 16 + lo));
  }
  // Credited, so the guest's pool counts as seeded: the host's getrandom() made these bytes.
  std::vector<char> buf(sizeof(rand_pool_info) + bytes.size());
  auto* info = reinterpret_cast<rand_pool_info*>(buf.data());
  info->entropy_count = static_cast<int>(bytes.size() * 8);
  info->buf_size = static_cast<int>(bytes.size());
  memcpy(info->buf, bytes.data(), bytes.size());
  UniqueFd r(open("/dev/urandom", O_WRONLY | O_CLOEXEC));
  if (!r || ioctl(r.get(), RNDADDENTROPY, info) < 0) return ErrnoError("add entropy");
  // Credited input does not reach a crng that is already seeded until its next scheduled
  // reseed (up to a minute away): a clone would read its template's stream until then.
  if (ioctl(r.get(), RNDRESEEDCRNG) < 0) return ErrnoError("reseed the crng");
  return OkStatus();
}

// The plan's directories and files, written through the root overlay by the container path's
// own writer (isolation/rootfs.h); nothing of the user's has run yet.
Status WriteStartFiles(const protocol::GuestSetup& s) {
  UniqueFd root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return ErrnoError("open /");
  return isolation::WriteRootPlan(root.get(), s.dirs, s.files, {}, InRoot::kFollowInside);
}

// eth0, the VM's NIC on the node's network: the sandbox's address (a /32), the gateway on the
// link and the default route through it — what the edge gives a container's eth0 from
// outside. No IPv6 (the node forwards IPv4 only).
Status ConfigureNic(const protocol::GuestSetup& s) {
  if (s.net_address.empty()) return OkStatus();
  in_addr addr{}, gateway{};
  if (inet_pton(AF_INET, s.net_address.c_str(), &addr) != 1 ||
      inet_pton(AF_INET, s.net_gateway.c_str(), &gateway) != 1)
    return InvalidArgument("bad network address " + s.net_address + " via " + s.net_gateway);
  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return ErrnoError("socket for eth0");
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  for (int waited = 0; ioctl(sock.get(), SIOCGIFFLAGS, &ifr) < 0; waited += 2) {
    if (errno != ENODEV || waited >= kDeviceWaitMs) return ErrnoError("the NIC eth0");
    usleep(2000);
  }
  (void)WriteStringToFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", "1");
  auto set_addr = [&](unsigned long request, in_addr a, const char* what) -> Status {
    ifreq r{};
    strncpy(r.ifr_name, "eth0", IFNAMSIZ - 1);
    auto* sin = reinterpret_cast<sockaddr_in*>(&r.ifr_addr);
    sin->sin_family = AF_INET;
    sin->sin_addr = a;
    if (ioctl(sock.get(), request, &r) < 0) return ErrnoError(what);
    return OkStatus();
  };
  DSEC_RETURN_IF_ERROR(set_addr(SIOCSIFADDR, addr, "eth0's address"));
  DSEC_RETURN_IF_ERROR(set_addr(SIOCSIFNETMASK, in_addr{INADDR_BROADCAST}, "eth0's netmask"));
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(sock.get(), SIOCSIFFLAGS, &ifr) < 0) return ErrnoError("bring up eth0");
  auto add_route = [&](in_addr dst, in_addr mask, in_addr via, short flags) -> Status {
    rtentry rt{};
    auto put = [](sockaddr* sa, in_addr a) {
      auto* sin = reinterpret_cast<sockaddr_in*>(sa);
      sin->sin_family = AF_INET;
      sin->sin_addr = a;
    };
    put(&rt.rt_dst, dst);
    put(&rt.rt_genmask, mask);
    put(&rt.rt_gateway, via);
    rt.rt_flags = static_cast<unsigned short>(RTF_UP | flags);
    char dev[] = "eth0";
    rt.rt_dev = dev;
    if (ioctl(sock.get(), SIOCADDRT, &rt) < 0 && errno != EEXIST) return ErrnoError("add a route");
    return OkStatus();
  };
  DSEC_RETURN_IF_ERROR(add_route(gateway, in_addr{INADDR_BROADCAST}, in_addr{}, RTF_HOST));
  return add_route(in_addr{}, in_addr{}, gateway, RTF_GATEWAY);
}

// boot_disk_mb: the writable layer's size at boot (dsec.disk_mb); a clone of a template made at
// another size resizes it.
// The machine's name, the host's clock (a restored guest is behind) and fresh entropy (restored
// guests share their source's pool).
Status SetNameClockEntropy(const std::string& hostname, int64_t realtime_ns,
                           const std::string& entropy) {
  if (sethostname(hostname.data(), hostname.size()) < 0) return ErrnoError("sethostname");
  if (realtime_ns > 0) {
    timespec ts{static_cast<time_t>(realtime_ns / 1000000000),
                static_cast<long>(realtime_ns % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0) return ErrnoError("clock_settime");
  }
  return AddEntropy(entropy);
}

Status ApplySetup(const protocol::GuestSetup& s, int upper_fd, int64_t boot_disk_mb) {
  DSEC_RETURN_IF_ERROR(SetNameClockEntropy(s.hostname, s.realtime_ns, s.entropy));
  DSEC_RETURN_IF_ERROR(WriteStartFiles(s));
  DSEC_RETURN_IF_ERROR(ConfigureNic(s));
  // The sandbox's pids limit holds inside the guest as a container's does (a fork bomb stops
  // there; the agent, outside that cgroup, keeps answering).
  if (s.pids > 0)
    DSEC_RETURN_IF_ERROR(
        WriteStringToFile("/sys/fs/cgroup/dsec-user/pids.max", std::to_string(s.pids))
            .WithContext("the guest's pids limit"));
  if (s.disk_mb > 0 && s.disk_mb != boot_disk_mb) {
    std::string path = "/proc/self/fd/" + std::to_string(upper_fd);
    std::string opts = "size=" + std::to_string(s.disk_mb) + "m";
    DSEC_RETURN_IF_ERROR(
        Mount(nullptr, path.c_str(), nullptr, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts.c_str()));
  }
  return OkStatus();
}

// A VM restored from another's running state becomes its own machine (protocol::GuestIdentity).
Status ApplyIdentity(const protocol::GuestIdentity& g) {
  DSEC_RETURN_IF_ERROR(SetNameClockEntropy(g.hostname, g.realtime_ns, g.entropy));
  UniqueFd root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return ErrnoError("open /");
  return isolation::WriteRootPlan(root.get(), {}, g.files, {}, InRoot::kFollowInside);
}

}  // namespace

bool IsGuestInit(int argc, char** argv) {
  return getpid() == 1 && argc >= 1 && strcmp(argv[0], "/init") == 0;
}

void GuestMain() {
  prctl(PR_SET_NAME, "dsec-agent", 0, 0, 0);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  // The agent reads SIGCHLD from a signalfd: it must be blocked (as main() does for containers).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  Check(Mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr));
  Check(Mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr));
  Check(Mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"));
  if (int c = open("/dev/console", O_RDWR | O_CLOEXEC); c >= 0) {
    for (int fd = 0; fd < 3; ++fd) dup2(c, fd);
    close(c);
  }
  auto cmdline = ReadFileToString("/proc/cmdline");
  if (!cmdline.ok()) Fail(cmdline.status());
  Check(LoadModules());
  auto port_path = FindPort();
  if (!port_path.ok()) Fail(port_path.status());
  g_port = open(port_path->c_str(), O_RDWR | O_CLOEXEC);
  if (g_port < 0) Fail(ErrnoError("open " + *port_path));

  int64_t layers = ParseInt64(CmdlineValue(*cmdline, "dsec.layers")).value_or(0);
  int64_t disk_mb = ParseInt64(CmdlineValue(*cmdline, "dsec.disk_mb")).value_or(0);
  Check(BuildRoot(static_cast<int>(layers), disk_mb));
  // Held for resizing the writable layer at setup (its path is gone after the move), and for
  // snapshots (capture_layer reads its upper dir).
  int upper_fd = open(kUpper, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (upper_fd < 0) Fail(ErrnoError("open the writable layer"));
  UniqueFd layer(open(kUpper, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!layer) Fail(ErrnoError("open the writable layer"));
  unlink("/init");  // the initramfs is RAM; nothing needs it after the move
  Check(SwitchRoot());
  auto cgroup = UserCgroup();
  if (!cgroup.ok()) Fail(cgroup.status());

  // Everything that is not the sandbox's own happens before the greeting: a template is saved
  // there, and whatever a clone runs after its restore is translated afresh under TCG.
  Check(BringUpLoopback());
  auto setup = Greet(g_port);
  if (!setup.ok()) Fail(setup.status().WithContext("guest setup"));
  Check(ApplySetup(*setup, upper_fd, disk_mb));
  close(upper_fd);

  AgentConfig cfg;
  cfg.rlimits = setup->rlimits;
  cfg.cgroup_user = std::move(*cgroup);
  cfg.cgroup_kill = true;
  cfg.max_execs = setup->max_execs;
  cfg.secret = setup->secret;
  cfg.orphan_timeout_ms = setup->orphan_timeout_ms;
  cfg.guest_port = true;
  cfg.apply_identity = ApplyIdentity;
  cfg.writable_layer = std::move(layer);
  WriteAll(g_port,
           protocol::EncodeFrameOrDie(FrameType::kReady, 0, 0,
                                      protocol::Encode(protocol::Ready{getpid(), -1}).dump()));
  Agent agent(std::move(cfg), UniqueFd(g_port), UniqueFd());
  g_port = -1;
  int rc = agent.Run();
  std::string line = "dsec-agent: guest agent ended (" + std::to_string(rc) + ")\n";
  (void)!write(2, line.data(), line.size());
  PowerOff();
}

}  // namespace dsec::agent
