#include "isolation/netns.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace dsec::isolation {

namespace {

Status LoopbackUp() {
  UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return ErrnoError("socket");
  ifreq ifr{};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(s.get(), SIOCGIFFLAGS, &ifr) < 0) return ErrnoError("SIOCGIFFLAGS lo");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(s.get(), SIOCSIFFLAGS, &ifr) < 0) return ErrnoError("SIOCSIFFLAGS lo");
  return OkStatus();
}

// True if a sockstat file shows TCP sockets in use or in TIME_WAIT:
//   "TCP: inuse 0 orphan 0 tw 0 alloc 3 mem 1" / "TCP6: inuse 0".
bool HasTcpState(int fd) {
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return true;  // cannot tell: do not reuse
  buf[n] = '\0';
  for (const char* line = buf; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : nullptr) {
    if (strncmp(line, "TCP:", 4) != 0 && strncmp(line, "TCP6:", 5) != 0) continue;
    unsigned long inuse = 0, tw = 0;
    const char* p = strstr(line, "inuse ");
    if (p) inuse = strtoul(p + 6, nullptr, 10);
    const char* q = strstr(line, " tw ");
    if (q && (!strchr(line, '\n') || q < strchr(line, '\n'))) tw = strtoul(q + 4, nullptr, 10);
    if (inuse || tw) return true;
  }
  return false;
}

}  // namespace

StatusOr<Netns> NetnsPool::CreateLoopbackOnly() {
  Netns out;
  Status s;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) < 0) {
      s = ErrnoError("unshare(CLONE_NEWNET)");
      return;
    }
    out.ns.Reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!out.ns) {
      s = ErrnoError("open /proc/thread-self/ns/net");
      return;
    }
    s = LoopbackUp();
  });
  t.join();
  if (!s.ok()) return s;
  return out;
}

bool NetnsPool::IsQuiet(const Netns& ns) {
  bool quiet = false;
  std::thread t([&] {
    if (setns(ns.ns.get(), CLONE_NEWNET) < 0) return;  // cannot tell: not reused
    UniqueFd v4(open("/proc/thread-self/net/sockstat", O_RDONLY | O_CLOEXEC));
    UniqueFd v6(
        open("/proc/thread-self/net/sockstat6", O_RDONLY | O_CLOEXEC));  // absent without IPv6
    quiet = v4 && !HasTcpState(v4.get()) && !HasTcpState(v6.get());
  });
  t.join();
  return quiet;
}

StatusOr<Netns> NetnsPool::Acquire() {
  {
    MutexLock l(mu_);
    if (!idle_.empty()) {
      Netns n = std::move(idle_.back());
      idle_.pop_back();
      return n;
    }
  }
  return CreateLoopbackOnly();
}

void NetnsPool::Release(Netns ns) {
  if (!ns.ns || !IsQuiet(ns)) return;  // dropped: the kernel tears it down
  MutexLock l(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(ns));
}

size_t NetnsPool::idle() const {
  MutexLock l(mu_);
  return idle_.size();
}

}  // namespace dsec::isolation
