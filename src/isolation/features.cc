// Feature detection. The userns probe does for real what sandbox creation will do: a child in
// a new user+mount namespace attaches an idmapped clone of /usr that the parent made, mounts a
// tmpfs with a user xattr and an overlay with userxattr over both, and writes through it.
#include "isolation/features.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "base/unique_fd.h"
#include "isolation/userns.h"
#include "sys/syscalls.h"

namespace dsec::isolation {

int KernelVersionCode() {
  utsname u{};
  if (uname(&u) != 0) return 0;
  int major = 0, minor = 0;
  if (sscanf(u.release, "%d.%d", &major, &minor) != 2) return 0;
  return major * 1000 + minor;
}

namespace {

// Runs in the forked child: only syscalls, no allocation (the parent may be multithreaded).
[[noreturn]] void UsernsProbeChild(int sock) {
  char c = 0;
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(10);
  if (write(sock, "u", 1) != 1) _exit(11);
  char buf[1];
  iovec io{buf, 1};
  alignas(cmsghdr) char cm[CMSG_SPACE(sizeof(int) * 2)];
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = cm;
  m.msg_controllen = sizeof cm;
  if (recvmsg(sock, &m, 0) != 1 || buf[0] != 'f') _exit(12);
  cmsghdr* h = CMSG_FIRSTHDR(&m);
  if (!h || h->cmsg_type != SCM_RIGHTS || h->cmsg_len != CMSG_LEN(sizeof(int) * 2)) _exit(13);
  int trees[2];
  memcpy(trees, CMSG_DATA(h), sizeof trees);
  int tree = trees[0], mask = trees[1];
  if (setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0) _exit(14);
  if (mount("", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(15);
  int fs = sys::FsOpen("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0 || sys::FsConfig(fs, FSCONFIG_SET_STRING, "size", "1m", 0) != 0 ||
      sys::FsConfig(fs, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
    _exit(16);
  int mnt = sys::FsMount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID);
  if (mnt < 0) _exit(17);
  if (sys::MoveMount(mnt, "", AT_FDCWD, "/tmp", MOVE_MOUNT_F_EMPTY_PATH) != 0) _exit(18);
  if (chdir("/tmp") != 0) _exit(19);
  for (const char* d : {"l", "k", "u", "w", "m"})
    if (mkdir(d, 0755) != 0) _exit(20);
  if (setxattr("u", "user.dsec", "1", 1, 0) != 0) _exit(21);
  if (sys::MoveMount(tree, "", AT_FDCWD, "l", MOVE_MOUNT_F_EMPTY_PATH) != 0) _exit(22);
  if (sys::MoveMount(mask, "", AT_FDCWD, "k", MOVE_MOUNT_F_EMPTY_PATH) != 0) _exit(26);
  if (mount("overlay", "m", "overlay", MS_NOSUID | MS_NODEV,
            "lowerdir=k:l,upperdir=u,workdir=w,userxattr") != 0)
    _exit(23);
  struct stat st;
  if (stat("m/bin", &st) != 0 || st.st_uid != 0) _exit(24);
  int fd = open("m/dsec-probe", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) _exit(25);
  (void)c;
  _exit(0);
}

std::string ProbeUserns() {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) return "socketpair failed";
  UniqueFd parent(sp[0]), child(sp[1]);
  pid_t pid = fork();
  if (pid < 0) return std::string("fork: ") + strerror(errno);
  if (pid == 0) UsernsProbeChild(child.get());
  child.Reset();
  std::string reason;
  char c;
  if (read(parent.get(), &c, 1) == 1) {
    UsernsMap map{0x7ff00000u, 65536};
    Status s = WriteIdMaps(pid, map);
    StatusOr<UniqueFd> ns = s.ok() ? OpenUserns(pid) : StatusOr<UniqueFd>(s);
    StatusOr<UniqueFd> tree = ns.ok() ? MakeIdmappedMount("/usr", ns->get()) : ns.status();
    // A tmpfs layer too (the host image's mask is one): idmapping tmpfs needs 6.3+.
    UniqueFd fs(sys::FsOpen("tmpfs", FSOPEN_CLOEXEC));
    UniqueFd tmp;
    if (fs && sys::FsConfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0)
      tmp.Reset(sys::FsMount(fs.get(), FSMOUNT_CLOEXEC, 0));
    StatusOr<UniqueFd> mask = tmp && ns.ok() ? MakeIdmappedMount("", ns->get(), tmp.get())
                                             : StatusOr<UniqueFd>(Unimplemented("tmpfs layer"));
    if (tree.ok() && !mask.ok())
      tree = Status(mask.status().code(), "idmapped tmpfs: " + mask.status().message());
    if (tree.ok()) {
      alignas(cmsghdr) char cm[CMSG_SPACE(sizeof(int) * 2)] = {};
      char b = 'f';
      iovec io{&b, 1};
      msghdr m{};
      m.msg_iov = &io;
      m.msg_iovlen = 1;
      m.msg_control = cm;
      m.msg_controllen = sizeof cm;
      cmsghdr* h = CMSG_FIRSTHDR(&m);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int) * 2);
      int tfds[2] = {tree->get(), mask->get()};
      memcpy(CMSG_DATA(h), tfds, sizeof tfds);
      if (sendmsg(parent.get(), &m, MSG_NOSIGNAL) != 1) reason = "sendmsg failed";
    } else {
      reason = tree.status().message();
    }
  }
  parent.Reset();
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!reason.empty()) return reason;
  if (!WIFEXITED(status)) return "probe child killed";
  switch (WEXITSTATUS(status)) {
    case 0:
      return "";
    case 10:
      return "unshare(CLONE_NEWUSER) not permitted";
    case 16:
    case 17:
      return "tmpfs cannot be mounted in a user namespace";
    case 21:
      return "tmpfs lacks user xattrs (kernel < 6.6)";
    case 22:
      return "idmapped mount cannot be attached in the user namespace";
    case 23:
      return "overlay over idmapped layers not supported in a user namespace";
    default:
      return "probe step " + std::to_string(WEXITSTATUS(status)) + " failed";
  }
}

}  // namespace

KernelFeatures KernelFeatures::Detect(const FeatureSwitches& sw) {
  KernelFeatures f;
  utsname u{};
  if (uname(&u) == 0) f.kernel_release = u.release;
  int v = KernelVersionCode();
  f.clone_into_cgroup = sw.clone_into_cgroup && v >= 5007;
  f.cgroup_kill = sw.cgroup_kill && v >= 5014;
  if (!sw.userns) {
    f.userns_reason = "disabled by configuration";
  } else {
    f.userns_reason = ProbeUserns();
    f.userns = f.userns_reason.empty();
  }
  return f;
}

std::string KernelFeatures::Describe() const {
  std::string s = "kernel=" + kernel_release + " userns=" + (userns ? "on" : "off");
  if (!userns) s += " (" + userns_reason + ")";
  s += std::string(" clone_into_cgroup=") + (clone_into_cgroup ? "on" : "off");
  s += std::string(" cgroup_kill=") + (cgroup_kill ? "on" : "off");
  return s;
}

}  // namespace dsec::isolation
