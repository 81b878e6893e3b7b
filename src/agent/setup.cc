#include "agent/setup.h"

#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "base/fd_passing.h"
#include "isolation/credentials.h"
#include "isolation/rootfs.h"

namespace dsec::agent {

Status ReceiveFrameWithFds(int sock, protocol::Frame* frame, std::vector<UniqueFd>* fds) {
  protocol::FrameDecoder decoder;
  std::string buf;
  while (true) {
    auto n = RecvWithFds(sock, 64 * 1024, 253, &buf, fds);
    if (!n.ok()) return n.status().WithContext("receive setup");
    if (*n == 0) return Unavailable("edge closed the connection during setup");
    DSEC_RETURN_IF_ERROR(decoder.Feed(buf));
    if (decoder.Next(frame)) return OkStatus();
  }
}

Status BringUpLoopback() {
  UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return ErrnoError("socket for loopback");
  ifreq ifr{};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(s.get(), SIOCGIFFLAGS, &ifr) < 0) return ErrnoError("SIOCGIFFLAGS lo");
  if (ifr.ifr_flags & IFF_UP) return OkStatus();  // a pooled namespace the edge prepared
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(s.get(), SIOCSIFFLAGS, &ifr) < 0) return ErrnoError("SIOCSIFFLAGS lo");
  return OkStatus();
}

namespace {

// A user namespace's projid_map can be written once, by anyone inside it, with no capability
// ("anyone can set any valid project id"): left empty, code in the sandbox (even the sandbox
// user, through /proc/self/projid_map) could choose which host project ids its own project ids
// stand for. Write it first: project 0 only, the default project.
Status SealProjidMap() {
  UniqueFd fd(open("/proc/self/projid_map", O_WRONLY | O_CLOEXEC));
  if (!fd) return ErrnoError("open /proc/self/projid_map");
  static constexpr char kMap[] = "0 0 1\n";
  if (write(fd.get(), kMap, sizeof kMap - 1) == static_cast<ssize_t>(sizeof kMap - 1))
    return OkStatus();
  int err = errno;
  // Already written (by whoever prepared the namespace) is as good.
  char buf[256];
  UniqueFd r(open("/proc/self/projid_map", O_RDONLY | O_CLOEXEC));
  ssize_t n = r ? read(r.get(), buf, sizeof buf) : -1;
  if (n > 0) return OkStatus();
  return ErrnoStatus(err, "write /proc/self/projid_map");
}

}  // namespace

StatusOr<SetupResult> RunSetup(const protocol::SetupSpec& spec, std::vector<UniqueFd>& fds) {
  auto take = [&](int index, const char* what) -> StatusOr<UniqueFd> {
    if (index < 0) return UniqueFd();
    if (static_cast<size_t>(index) >= fds.size())
      return InvalidArgument(std::string("setup is missing the ") + what + " fd");
    return std::move(fds[static_cast<size_t>(index)]);
  };
  DSEC_ASSIGN_OR_RETURN(UniqueFd mount_dir, take(spec.fds.mount_dir, "mount dir"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd listen, take(spec.fds.listen, "listen"));
  // The edge only binds it: listening here makes SO_PEERCRED name the agent, so a reconnecting
  // edge can check who it talks to.
  if (listen && ::listen(listen.get(), 4) < 0) return ErrnoError("listen agent.sock");
  DSEC_ASSIGN_OR_RETURN(UniqueFd cgroup_user, take(spec.fds.cgroup_user, "cgroup"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd zygote_binary, take(spec.fds.zygote_binary, "zygote binary"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd disk, take(spec.fds.disk, "disk"));
  DSEC_ASSIGN_OR_RETURN(UniqueFd uid_lease, take(spec.fds.uid_lease, "uid lease"));
  if (spec.zygote && !zygote_binary) return InvalidArgument("setup is missing the zygote binary");
  std::vector<UniqueFd> layers;
  std::vector<int> layer_fds;
  for (int i = 0; i < spec.fds.layer_count; ++i) {
    DSEC_ASSIGN_OR_RETURN(UniqueFd l, take(spec.fds.first_layer + i, "layer"));
    if (!l) return InvalidArgument("setup layer fd missing");
    layer_fds.push_back(l.get());
    layers.push_back(std::move(l));
  }
  if (!mount_dir) return InvalidArgument("setup needs a mount dir fd");
  std::vector<UniqueFd> views;
  std::vector<int> view_fds;
  if (!spec.rootfs.proc_views.empty()) {
    if (spec.fds.first_proc_view < 0) return InvalidArgument("setup is missing the proc views");
    for (size_t i = 0; i < spec.rootfs.proc_views.size(); ++i) {
      DSEC_ASSIGN_OR_RETURN(UniqueFd v,
                            take(spec.fds.first_proc_view + static_cast<int>(i), "proc view"));
      if (!v) return InvalidArgument("setup proc view fd missing");
      view_fds.push_back(v.get());
      views.push_back(std::move(v));
    }
  }

  // The agent keeps no supplementary groups (without a user namespace it would otherwise hold
  // the edge's), and its cgroup namespace is rooted at its own cgroup whether or not the
  // launcher could clone it straight into it.
  if (setgroups(0, nullptr) < 0) return ErrnoError("setgroups(0)");
  if (unshare(CLONE_NEWCGROUP) < 0) return ErrnoError("unshare(CLONE_NEWCGROUP)");
  if (sethostname(spec.hostname.data(), spec.hostname.size()) < 0) return ErrnoError("sethostname");
  DSEC_RETURN_IF_ERROR(BringUpLoopback());
  UniqueFd writable;
  DSEC_RETURN_IF_ERROR(isolation::BuildRootfsAndPivot(spec.rootfs, layer_fds, mount_dir.get(),
                                                      &writable, disk ? disk.get() : -1, view_fds));
  layers.clear();
  views.clear();
  disk.Reset();
  mount_dir.Reset();
  fds.clear();  // anything unexpected the edge sent goes too
  if (spec.rootfs.userns) DSEC_RETURN_IF_ERROR(SealProjidMap());

  // From here on the agent runs under the same seccomp profile as user code (it needs nothing
  // the profile refuses), with no new privileges and a reduced capability set. Children
  // inherit the compiled filter, so no exec pays for compiling it again.
  DSEC_RETURN_IF_ERROR(isolation::SetNoNewPrivs());
  DSEC_RETURN_IF_ERROR(isolation::InstallSeccompPrograms(spec.seccomp));
  DSEC_RETURN_IF_ERROR(isolation::DropBoundingSet(spec.agent_caps));
  DSEC_RETURN_IF_ERROR(isolation::SetCapabilities(spec.agent_caps));

  SetupResult r;
  r.listen = std::move(listen);
  r.config.rlimits = spec.rlimits;
  r.config.cgroup_user = std::move(cgroup_user);
  r.config.cgroup_kill = spec.cgroup_kill;
  r.config.max_execs = spec.max_execs;
  r.config.secret = spec.secret;
  r.config.orphan_timeout_ms = spec.orphan_timeout_ms;
  r.config.zygote = spec.zygote;
  r.config.zygote_binary = std::move(zygote_binary);
  r.config.writable_layer = std::move(writable);
  r.config.uid_lease = std::move(uid_lease);
  return r;
}

}  // namespace dsec::agent
