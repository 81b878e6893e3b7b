// The node network against real kernel objects, in namespaces of its own: the test moves its
// main thread into a fresh "node" namespace whose uplink is a veth into a "test internet"
// namespace (echo servers on 198.51.100.10 and 10.9.9.9), so no packet can leave the machine
// and everything goes when the namespaces do.
#include "net/node_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/if_tun.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "base/file_util.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "net/dns.h"
#include "net/netlink.h"
#include "sys/bpf.h"

namespace dsec::net {
namespace {

constexpr uint32_t kServer = 0xc633640a;   // 198.51.100.10: "public"
constexpr uint32_t kPrivate = 0x0a090909;  // 10.9.9.9: a private address on the internet
constexpr uint32_t kUplinkAddr = 0xcb007101, kInternetAddr = 0xcb007102;  // 203.0.113.1/.2

void InNs(int ns, const std::function<void()>& fn) {
  std::thread t([&] {
    ASSERT_EQ(setns(ns, CLONE_NEWNET), 0);
    fn();
  });
  t.join();
}

UniqueFd NewNs() {
  UniqueFd fd;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) == 0)
      fd.Reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  });
  t.join();
  return fd;
}

void LinkUp(Netlink& nl, const char* name) {
  auto i = nl.LinkIndex(name);
  ASSERT_TRUE(i.ok()) << name;
  ASSERT_TRUE(nl.SetUp(*i).ok()) << name;
}

// Connects from inside `ns`; the errno on failure (ECONNREFUSED: rejected, ETIMEDOUT: dropped).
int ConnectFrom(int ns, uint32_t addr, uint16_t port, UniqueFd* out = nullptr,
                uint32_t bind_addr = 0, int timeout_ms = 1500) {
  UniqueFd s;
  InNs(ns, [&] { s.Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)); });
  if (!s) return errno;
  if (bind_addr) {
    sockaddr_in b{};
    b.sin_family = AF_INET;
    b.sin_addr.s_addr = htonl(bind_addr);
    int one = 1;
    setsockopt(s.get(), SOL_IP, IP_FREEBIND, &one, sizeof one);
    if (bind(s.get(), reinterpret_cast<sockaddr*>(&b), sizeof b) < 0) return errno;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(addr);
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0 && errno != EINPROGRESS)
    return errno;
  pollfd p{s.get(), POLLOUT, 0};
  if (poll(&p, 1, timeout_ms) == 0) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) return err;
  int fl = fcntl(s.get(), F_GETFL);
  fcntl(s.get(), F_SETFL, fl & ~O_NONBLOCK);
  timeval tv{2, 0};
  setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (out) *out = std::move(s);
  return 0;
}

// Sends and reads the echo; 0 or the errno.
int Echo(int fd) {
  if (send(fd, "ping", 4, MSG_NOSIGNAL) != 4) return errno;
  char buf[8];
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n == 4) return 0;
  return n == 0 ? EPIPE : errno;
}

// "\x04pypi\x04test\x00"-style query for an A record.
std::string DnsQuery(uint16_t id, const std::string& name) {
  std::string m = {static_cast<char>(id >> 8), static_cast<char>(id), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  for (auto label : SplitString(name, '.')) {
    m += static_cast<char>(label.size());
    m += label;
  }
  m += std::string("\0\0\x01\0\x01", 5);
  return m;
}

// The test internet's resolver: pypi.test -> 198.51.100.10, private.test -> 10.9.9.9 (TTL 300),
// NXDOMAIN for the rest.
void ServeDns(int fd) {
  char buf[512];
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) return;
    std::string q(buf, static_cast<size_t>(n));
    auto p = dns::ParseQuery(q);
    if (!p) continue;
    uint32_t addr = p->name == "pypi.test" ? kServer : p->name == "private.test" ? kPrivate : 0;
    std::string r = dns::Reply(q, *p, addr ? dns::kNoError : dns::kNxDomain);
    if (addr) {
      r[7] = 1;
      r += std::string("\xc0\x0c\0\x01\0\x01\0\0\x01\x2c\0\x04", 12);
      for (int i = 3; i >= 0; --i) r += static_cast<char>(addr >> (8 * i));
    }
    sendto(fd, r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
  }
}

// Asks the node's forwarder from inside `ns`: the A records, "NXDOMAIN", or "" (no answer).
std::string Resolve(int ns, uint32_t gateway, const std::string& name) {
  UniqueFd s;
  InNs(ns, [&] { s.Reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)); });
  timeval tv{0, 500000};
  setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(53);
  sa.sin_addr.s_addr = htonl(gateway);
  std::string q = DnsQuery(0x4242, name);
  sendto(s.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  char buf[512];
  ssize_t n = recv(s.get(), buf, sizeof buf, 0);
  if (n <= 0) return "";
  std::string_view ans(buf, static_cast<size_t>(n));
  if ((buf[3] & 0xf) == dns::kNxDomain) return "NXDOMAIN";
  auto a = dns::AnswerAddresses(ans, *dns::ParseQuery(q));
  std::string out;
  for (const auto& r : a.value_or(std::vector<dns::Address>{})) out += Ipv4ToString(r.addr) + " ";
  return out;
}

// Cgroup2 directories of the test's own, a parent and sandboxes below it (in the unified mount
// of a hybrid host, or the v2 root), removed when it goes; nullopt if the host has none.
struct TestCgroup {
  std::string parent;
  std::vector<std::string> made;
  UniqueFd fd;  // the first sandbox's
  static std::optional<TestCgroup> Make() {
    for (const char* root : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
      if (access((std::string(root) + "/cgroup.procs").c_str(), F_OK) != 0) continue;
      if (std::string(root) == "/sys/fs/cgroup" &&
          access("/sys/fs/cgroup/cgroup.subtree_control", F_OK) != 0)
        continue;  // a v1 root
      TestCgroup c;
      c.parent = std::string(root) + "/dsec-guard-test-" + std::to_string(getpid());
      if (mkdir(c.parent.c_str(), 0755) < 0) continue;
      c.made.push_back(c.parent);
      c.fd = c.Sandbox("sb0");
      if (c.fd) return c;
    }
    return std::nullopt;
  }
  UniqueFd Sandbox(const std::string& name) {
    std::string path = parent + "/" + name;
    if (mkdir(path.c_str(), 0755) < 0) return UniqueFd();
    made.push_back(path);
    return UniqueFd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  TestCgroup() = default;
  TestCgroup(TestCgroup&&) = default;
  ~TestCgroup() {
    for (auto it = made.rbegin(); it != made.rend(); ++it) rmdir(it->c_str());
  }
};

// From a child process in cgroup `cg` and namespace `ns`: a TCP connect (SOCK_STREAM) or a UDP
// send (SOCK_DGRAM) to addr:port; 0 or the errno (ETIMEDOUT: no answer in 1.5 s).
int FromCgroup(int cg, int ns, int family, int type, const char* addr, uint16_t port) {
  pid_t pid = fork();
  if (pid == 0) {
    UniqueFd procs(openat(cg, "cgroup.procs", O_WRONLY | O_CLOEXEC));
    std::string me = std::to_string(getpid());
    if (!procs || write(procs.get(), me.data(), me.size()) < 0 || setns(ns, CLONE_NEWNET) < 0)
      _exit(200);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
      auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
      sa->sin_family = AF_INET;
      sa->sin_port = htons(port);
      inet_pton(AF_INET, addr, &sa->sin_addr);
      len = sizeof *sa;
    } else {
      auto* sa = reinterpret_cast<sockaddr_in6*>(&ss);
      sa->sin6_family = AF_INET6;
      sa->sin6_port = htons(port);
      inet_pton(AF_INET6, addr, &sa->sin6_addr);
      len = sizeof *sa;
    }
    int s = socket(family, type | SOCK_NONBLOCK, 0);
    if (s < 0) _exit(201);
    if (type == SOCK_DGRAM)
      _exit(sendto(s, "x", 1, 0, reinterpret_cast<sockaddr*>(&ss), len) < 0 ? errno : 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&ss), len) < 0 && errno != EINPROGRESS) _exit(errno);
    pollfd p{s, POLLOUT, 0};
    if (poll(&p, 1, 1500) == 0) _exit(ETIMEDOUT);
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el);
    _exit(err);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

class NodeNetworkPrivilegedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, nftables)";
    orig_.Reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(orig_);
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << strerror(errno);
    node_.Reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    internet_ = NewNs();
    ASSERT_TRUE(internet_);
    auto nl = Netlink::Open(NETLINK_ROUTE);
    ASSERT_TRUE(nl.ok());
    LinkUp(*nl, "lo");
    ASSERT_TRUE(nl->CreateVeth("up0", "wan0", internet_.get()).ok());
    auto up0 = nl->LinkIndex("up0");
    ASSERT_TRUE(up0.ok());
    ASSERT_TRUE(nl->AddAddress4(*up0, kUplinkAddr, 24).ok());
    ASSERT_TRUE(nl->AddRoute4(0, 0, *up0, kInternetAddr, false).ok());
    InNs(internet_.get(), [&] {
      auto in = Netlink::Open(NETLINK_ROUTE);
      ASSERT_TRUE(in.ok());
      LinkUp(*in, "lo");
      LinkUp(*in, "wan0");
      auto wan = in->LinkIndex("wan0");
      auto lo = in->LinkIndex("lo");
      ASSERT_TRUE(in->AddAddress4(*wan, kInternetAddr, 24).ok());
      ASSERT_TRUE(in->AddAddress4(*lo, kServer, 32).ok());
      ASSERT_TRUE(in->AddAddress4(*lo, kPrivate, 32).ok());
      for (uint32_t a : {kServer, kPrivate})
        for (uint16_t port : {80, 8080}) Listen(a, port);
      dns_.Reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(53);
      sa.sin_addr.s_addr = htonl(kServer);
      ASSERT_EQ(bind(dns_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    });
    servers_.emplace_back([fd = dns_.get()] { ServeDns(fd); });
    for (auto& l : listeners_) servers_.emplace_back([this, fd = l.get()] { Serve(fd); });
    NodeNetworkOptions o;
    o.tag = "t1";
    o.state_file = state_.path() + "/net.json";
    o.dns_upstream = "198.51.100.10";
    auto n = NodeNetwork::Start(o);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    net_ = std::move(*n);
    EXPECT_EQ(net_->uplink(), "up0");
  }

  void TearDown() override {
    if (net_) net_->Stop();
    for (auto& l : listeners_) shutdown(l.get(), SHUT_RDWR);
    if (dns_) shutdown(dns_.get(), SHUT_RDWR);
    for (auto& t : servers_) t.join();
    if (orig_) {
      EXPECT_EQ(setns(orig_.get(), CLONE_NEWNET), 0);
    }
  }

  void Listen(uint32_t addr, uint16_t port) {
    UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(addr);
    ASSERT_EQ(bind(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    ASSERT_EQ(listen(s.get(), 64), 0);
    listeners_.push_back(std::move(s));
  }
  static void Serve(int lfd) {
    for (;;) {
      int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      std::thread([c] {
        char buf[4096];
        ssize_t n;
        while ((n = recv(c, buf, sizeof buf, 0)) > 0)
          send(c, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
        close(c);
      }).detach();
    }
  }

  struct Sandbox {
    UniqueFd ns;
    NetAttachment a;
  };
  Sandbox Attach() {
    Sandbox s;
    s.ns = NewNs();
    InNs(s.ns.get(), [] {
      auto nl = Netlink::Open(NETLINK_ROUTE);
      LinkUp(*nl, "lo");
    });
    auto a = net_->Attach(s.ns.get());
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (a.ok()) s.a = *a;
    return s;
  }
  // A stand-in for a microVM: the node's tap (AttachTap) relayed frame by frame to a tap named
  // eth0 in a namespace of its own, configured as the guest agent configures its NIC.
  struct TapSandbox {
    UniqueFd ns, node_tap, guest_tap, stop;
    NetAttachment a;
    std::thread relay;
    ~TapSandbox() {
      if (relay.joinable()) {
        uint64_t one = 1;
        (void)!write(stop.get(), &one, sizeof one);
        relay.join();
      }
    }
  };
  std::unique_ptr<TapSandbox> AttachTap() {
    auto s = std::make_unique<TapSandbox>();
    auto a = net_->AttachTap(&s->node_tap);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return s;
    s->a = *a;
    s->ns = NewNs();
    InNs(s->ns.get(), [&] {
      s->guest_tap.Reset(open("/dev/net/tun", O_RDWR | O_CLOEXEC));
      ifreq ifr{};
      strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
      ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
      ASSERT_EQ(ioctl(s->guest_tap.get(), TUNSETIFF, &ifr), 0);
      auto nl = Netlink::Open(NETLINK_ROUTE);
      LinkUp(*nl, "lo");
      LinkUp(*nl, "eth0");
      int eth0 = nl->LinkIndex("eth0").value();
      ASSERT_TRUE(nl->AddAddress4(eth0, s->a.addr, 32).ok());
      ASSERT_TRUE(nl->AddRoute4(0, 0, eth0, net_->gateway(), /*onlink=*/true).ok());
    });
    s->stop.Reset(eventfd(0, EFD_CLOEXEC));
    s->relay = std::thread([t = s.get()] {
      char frame[65536];
      for (;;) {
        pollfd p[3] = {{t->node_tap.get(), POLLIN, 0},
                       {t->guest_tap.get(), POLLIN, 0},
                       {t->stop.get(), POLLIN, 0}};
        if (poll(p, 3, -1) < 0 || p[2].revents) return;
        for (int i = 0; i < 2; ++i) {
          if (!(p[i].revents & POLLIN)) continue;
          ssize_t n = read(p[i].fd, frame, sizeof frame);
          if (n > 0) (void)!write(p[1 - i].fd, frame, static_cast<size_t>(n));
        }
      }
    });
    return s;
  }
  static NetworkPolicy Policy(const PolicyBuilder& b) {
    auto p = b.Build();
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : NetworkPolicy{};
  }
  static NetworkPolicy Mode(NetMode m) { return Policy(PolicyBuilder(m)); }

  UniqueFd orig_, node_, internet_, dns_;
  std::vector<UniqueFd> listeners_;
  std::vector<std::thread> servers_;
  TempDir state_ = TempDir::Create("/tmp/dsec-net-test-").value();
  std::unique_ptr<NodeNetwork> net_;
};

TEST_F(NodeNetworkPrivilegedTest, NoneRefusesEverythingAtOnce) {
  Sandbox sb = Attach();
  ASSERT_TRUE(sb.a);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), ECONNREFUSED);
  ASSERT_TRUE(net_->Apply(sb.a, Mode(NetMode::kNone)).ok());
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 8080), ECONNREFUSED);
  EXPECT_GE(net_->Denied(sb.a), 2u);
  EXPECT_GE(net_->DeniedTotal(), 2u);
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, AllowlistReachesExactlyItsRules) {
  Sandbox sb = Attach();
  ASSERT_TRUE(net_->Apply(sb.a, Policy(PolicyBuilder(NetMode::kAllowlist)
                                           .Allow("198.51.100.0/24", "80", "tcp")
                                           .Allow("10.9.9.9", "8000-8100")))
                  .ok());
  UniqueFd c;
  ASSERT_EQ(ConnectFrom(sb.ns.get(), kServer, 80, &c), 0);
  EXPECT_EQ(Echo(c.get()), 0);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 8080), ECONNREFUSED);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kPrivate, 8080), 0);  // a rule may name a private address
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kPrivate, 80), ECONNREFUSED);
  // The node itself: its uplink address and the gateway.
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kUplinkAddr, 22), ECONNREFUSED);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), net_->gateway(), 80), ECONNREFUSED);
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, TapAttachmentsFollowThePolicyAndGoWithTheirDescriptor) {
  auto vm = AttachTap();
  ASSERT_TRUE(vm->a);
  EXPECT_TRUE(StartsWith(vm->a.host_if, "dsvt1"));
  // Everything is refused until a policy; then exactly its rules, as for a veth.
  EXPECT_EQ(ConnectFrom(vm->ns.get(), kServer, 80), ECONNREFUSED);
  ASSERT_TRUE(
      net_->Apply(vm->a, Policy(PolicyBuilder(NetMode::kAllowlist).Allow("198.51.100.10", "80")))
          .ok());
  UniqueFd c;
  ASSERT_EQ(ConnectFrom(vm->ns.get(), kServer, 80, &c), 0);
  EXPECT_EQ(Echo(c.get()), 0);
  EXPECT_EQ(ConnectFrom(vm->ns.get(), kServer, 8080), ECONNREFUSED);
  EXPECT_EQ(ConnectFrom(vm->ns.get(), net_->gateway(), 80), ECONNREFUSED);
  EXPECT_GE(net_->Denied(vm->a), 3u);
  // A guest whose root took a neighbour's address sends nothing: dropped at the node.
  auto other = AttachTap();
  ASSERT_TRUE(net_->Apply(other->a, Mode(NetMode::kOpen)).ok());
  ASSERT_TRUE(net_->Apply(vm->a, Mode(NetMode::kOpen)).ok());
  InNs(vm->ns.get(), [&] {
    auto nl = Netlink::Open(NETLINK_ROUTE);
    ASSERT_TRUE(nl->AddAddress4(nl->LinkIndex("eth0").value(), other->a.addr, 32).ok());
  });
  EXPECT_EQ(ConnectFrom(vm->ns.get(), kServer, 8080, nullptr, other->a.addr, 300), ETIMEDOUT);
  EXPECT_EQ(ConnectFrom(other->ns.get(), kServer, 8080), 0);  // the neighbour is unharmed
  // Readopt after an edge restart takes the same tap again.
  const NetAttachment kept = vm->a;
  net_->Detach(vm->a);
  EXPECT_EQ(ConnectFrom(vm->ns.get(), kServer, 8080), ETIMEDOUT);  // no rules: dropped
  ASSERT_TRUE(net_->Readopt(kept).ok());
  ASSERT_TRUE(net_->Apply(kept, Mode(NetMode::kOpen)).ok());
  EXPECT_EQ(ConnectFrom(vm->ns.get(), kServer, 8080), 0);
  // The tap is the descriptor's: closed (QEMU's exit), the link and its route are gone.
  auto rtnl = Netlink::Open(NETLINK_ROUTE);
  ASSERT_TRUE(rtnl->LinkIndex(kept.host_if).ok());
  const std::string name = kept.host_if;
  net_->Detach(kept);
  vm.reset();
  EXPECT_FALSE(rtnl->LinkIndex(name).ok()) << name << " outlived its descriptor";
  net_->Detach(other->a);
}

TEST_F(NodeNetworkPrivilegedTest, OpenReachesPublicButNotPrivateNodeOrNeighbours) {
  Sandbox a = Attach(), b = Attach();
  ASSERT_TRUE(net_->Apply(a.a, Mode(NetMode::kOpen)).ok());
  ASSERT_TRUE(net_->Apply(b.a, Mode(NetMode::kOpen)).ok());
  EXPECT_EQ(ConnectFrom(a.ns.get(), kServer, 8080), 0);
  EXPECT_EQ(ConnectFrom(a.ns.get(), kPrivate, 80), ECONNREFUSED);
  EXPECT_EQ(ConnectFrom(a.ns.get(), kUplinkAddr, 22), ECONNREFUSED);
  // b listens on its own address; a cannot reach it, even with a rule naming it.
  UniqueFd l;
  InNs(b.ns.get(), [&] { l.Reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9000);
  sa.sin_addr.s_addr = htonl(b.a.addr);
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(l.get(), 4), 0);
  ASSERT_TRUE(net_->Apply(a.a, Policy(PolicyBuilder(NetMode::kOpen).Allow("0.0.0.0/0"))).ok());
  EXPECT_EQ(ConnectFrom(a.ns.get(), b.a.addr, 9000), ECONNREFUSED);
  EXPECT_EQ(ConnectFrom(a.ns.get(), 0xa9fea9fe, 80), ECONNREFUSED);  // 169.254.169.254
  EXPECT_EQ(ConnectFrom(a.ns.get(), kPrivate, 80), 0);  // the rule allows private ranges
  // Spoofing b's address from a is dropped (not even a reject to learn from). Code in a
  // sandbox cannot add an address (the namespace is not its own); the test, as root, can.
  InNs(a.ns.get(), [&] {
    auto nl = Netlink::Open(NETLINK_ROUTE);
    ASSERT_TRUE(nl->AddAddress4(nl->LinkIndex("eth0").value(), b.a.addr, 32).ok());
  });
  EXPECT_EQ(ConnectFrom(a.ns.get(), kServer, 8080, nullptr, b.a.addr, 300), ETIMEDOUT);
  net_->Detach(a.a);
  net_->Detach(b.a);
}

TEST_F(NodeNetworkPrivilegedTest, LiveChangeCutsAnEstablishedConnection) {
  Sandbox sb = Attach();
  ASSERT_TRUE(
      net_->Apply(sb.a, Policy(PolicyBuilder(NetMode::kAllowlist).Allow("198.51.100.10"))).ok());
  UniqueFd c;
  ASSERT_EQ(ConnectFrom(sb.ns.get(), kServer, 80, &c), 0);
  ASSERT_EQ(Echo(c.get()), 0);
  ASSERT_TRUE(
      net_->Apply(sb.a, Policy(PolicyBuilder(NetMode::kAllowlist).Allow("198.51.100.10", "8080")))
          .ok());
  EXPECT_EQ(Echo(c.get()), ECONNRESET);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 8080), 0);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), ECONNREFUSED);
  // And back: allowed again at the next connection.
  ASSERT_TRUE(net_->Apply(sb.a, Mode(NetMode::kOpen)).ok());
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), 0);
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, DomainsResolveAndConnectOnlyWhenListed) {
  Sandbox sb = Attach(), none = Attach();
  ASSERT_TRUE(net_->Apply(sb.a, Policy(PolicyBuilder(NetMode::kAllowlist)
                                           .Domain("pypi.test")
                                           .Domain("*.corp.test")
                                           .Domain("private.test")))
                  .ok());
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), ECONNREFUSED);  // not resolved yet
  EXPECT_EQ(Resolve(sb.ns.get(), net_->gateway(), "PyPI.test"), "198.51.100.10 ");
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), 0);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 8080), 0);  // a domain allows every port
  EXPECT_EQ(Resolve(sb.ns.get(), net_->gateway(), "other.test"), "NXDOMAIN");
  // A listed name that resolves to a private address does not open it.
  EXPECT_EQ(Resolve(sb.ns.get(), net_->gateway(), "private.test"), "10.9.9.9 ");
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kPrivate, 80), ECONNREFUSED);
  // A sandbox whose policy is none gets no answer at all.
  ASSERT_TRUE(net_->Apply(none.a, Mode(NetMode::kNone)).ok());
  EXPECT_EQ(Resolve(none.ns.get(), net_->gateway(), "pypi.test"), "");
  // Domains removed: what they resolved to goes too, established connections included.
  UniqueFd c;
  ASSERT_EQ(ConnectFrom(sb.ns.get(), kServer, 80, &c), 0);
  ASSERT_TRUE(
      net_->Apply(sb.a, Policy(PolicyBuilder(NetMode::kAllowlist).Domain("other.test"))).ok());
  EXPECT_EQ(Echo(c.get()), ECONNRESET);
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), ECONNREFUSED);
  net_->Detach(sb.a);
  net_->Detach(none.a);
}

TEST_F(NodeNetworkPrivilegedTest, EgressGuardRefusesAtConnectWhatNoPolicyMayReach) {
  EgressGuard* g = net_->guard();
  if (!g) GTEST_SKIP() << "no egress guard on this kernel: " << net_->guard_error();
  auto cg = TestCgroup::Make();
  if (!cg) GTEST_SKIP() << "no cgroup2 hierarchy to attach cgroup BPF programs to";
  Sandbox sb = Attach();
  ASSERT_TRUE(sb.a);
  int c = cg->fd.get(), ns = sb.ns.get();
  NetworkPolicy p = Policy(PolicyBuilder(NetMode::kOpen).Allow("10.9.9.0/24", "8080", "tcp"));
  ASSERT_TRUE(net_->Apply(sb.a, p).ok());
  ASSERT_TRUE(g->Attach(c).ok());
  ASSERT_TRUE(g->Set(c, sb.a.addr, p).ok());
  const std::string gw = Ipv4ToString(net_->gateway()), me = Ipv4ToString(sb.a.addr),
                    other = Ipv4ToString(net_->gateway() + 7);
  // What the policy allows; its own loopback and address answer as usual.
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "198.51.100.10", 80), 0);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "10.9.9.9", 8080), 0);  // its rule
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "127.0.0.1", 9), ECONNREFUSED);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, me.c_str(), 9), ECONNREFUSED);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_DGRAM, gw.c_str(), 53), 0);  // DNS
  EXPECT_EQ(FromCgroup(c, ns, AF_INET6, SOCK_STREAM, "::ffff:198.51.100.10", 80), 0);
  // Refused at connect (EPERM), where nftables answers a reset (ECONNREFUSED) to a packet.
  uint64_t before = g->Denied(c), total = g->DeniedTotal();
  for (auto [type, addr, port] : {std::tuple{SOCK_STREAM, "169.254.169.254", 80},
                                  {SOCK_DGRAM, "169.254.169.254", 53},
                                  {SOCK_STREAM, gw.c_str(), 80},     // the node on the gateway
                                  {SOCK_STREAM, gw.c_str(), 53},     // DNS is UDP only
                                  {SOCK_STREAM, "203.0.113.1", 22},  // the node's uplink
                                  {SOCK_STREAM, other.c_str(), 80},  // another sandbox
                                  {SOCK_STREAM, "172.16.0.1", 80},   // private, no rule
                                  {SOCK_DGRAM, "224.0.0.251", 5353}})
    EXPECT_EQ(FromCgroup(c, ns, AF_INET, type, addr, port), EPERM) << addr << ":" << port;
  for (const char* addr : {"::ffff:169.254.169.254", "2001:db8::1"})
    EXPECT_EQ(FromCgroup(c, ns, AF_INET6, SOCK_STREAM, addr, 80), EPERM) << addr;
  EXPECT_EQ(g->Denied(c), before + 10);
  EXPECT_GE(g->DeniedTotal(), total + 10);

  // A neighbour under the same parent has its own policy (the same namespace will do here);
  // a cgroup with no slot is left to nftables.
  UniqueFd sb1 = cg->Sandbox("sb1"), plain = cg->Sandbox("plain");
  ASSERT_TRUE(sb1 && plain);
  ASSERT_TRUE(g->Attach(sb1.get()).ok());
  EXPECT_EQ(FromCgroup(sb1.get(), ns, AF_INET, SOCK_STREAM, "198.51.100.10", 80), EPERM);
  ASSERT_TRUE(g->Set(sb1.get(), sb.a.addr + 100, Mode(NetMode::kOpen)).ok());
  EXPECT_EQ(FromCgroup(sb1.get(), ns, AF_INET, SOCK_STREAM, "10.9.9.9", 8080), EPERM);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "10.9.9.9", 8080), 0);
  EXPECT_EQ(FromCgroup(plain.get(), ns, AF_INET, SOCK_STREAM, "169.254.169.254", 80), ECONNREFUSED);
  EXPECT_EQ(g->Denied(c), before + 10);
  g->Forget(sb1.get());
  EXPECT_EQ(FromCgroup(sb1.get(), ns, AF_INET, SOCK_STREAM, "169.254.169.254", 80), ECONNREFUSED);

  // A live change: the rule goes, then the network.
  NetworkPolicy open = Mode(NetMode::kOpen);
  ASSERT_TRUE(g->Set(c, sb.a.addr, open).ok());
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "10.9.9.9", 8080), EPERM);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "198.51.100.10", 80), 0);
  // Mode none: the network (here still the veth and nftables' refusal) answers, as for a
  // sandbox created without one.
  ASSERT_TRUE(g->Set(c, 0, Mode(NetMode::kNone)).ok());
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "169.254.169.254", 80), ECONNREFUSED);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "127.0.0.1", 9), ECONNREFUSED);

  // A later edge's guard replaces this one's programs (whose maps it cannot reach).
  EgressGuardOptions o;
  o.range = {net_->gateway() - 1, 16};
  auto next = EgressGuard::Start(o);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE((*next)->Attach(c).ok());
  // Until its first policy, the new programs refuse all but loopback.
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "198.51.100.10", 80), EPERM);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "127.0.0.1", 9), ECONNREFUSED);
  UniqueFd parent(::open(cg->parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto ids = bpf::AttachedPrograms(parent.get(), BPF_CGROUP_INET4_CONNECT);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 1u);
  EXPECT_EQ(bpf::AttachedPrograms(c, BPF_CGROUP_INET4_CONNECT).value().size(), 0u);
  ASSERT_TRUE((*next)->Set(c, sb.a.addr, open).ok());
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "198.51.100.10", 80), 0);
  EXPECT_EQ(FromCgroup(c, ns, AF_INET, SOCK_STREAM, "169.254.169.254", 80), EPERM);
  (*next)->Forget(c);
  g->Forget(c);
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, RefusedPacketsAreLoggedRateLimited) {
  net_->Stop();
  Mutex mu;
  std::vector<std::pair<std::string, DeniedPacket>> seen;
  NodeNetworkOptions o;
  o.tag = "t3";
  o.on_denied = [&](const std::string& label, const DeniedPacket& p) {
    MutexLock l(mu);
    seen.push_back({label, p});
  };
  net_ = NodeNetwork::Start(o).value();
  Sandbox sb;
  sb.ns = NewNs();
  auto a = net_->Attach(sb.ns.get(), "sb-logged");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  sb.a = *a;
  for (int i = 0; i < 30; ++i) EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 8080), ECONNREFUSED);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MutexLock l(mu);
  ASSERT_FALSE(seen.empty());
  EXPECT_LE(seen.size(), 6u);  // burst 5 (+1 for the minute's rate) of 30
  EXPECT_EQ(seen[0].first, "sb-logged");
  EXPECT_EQ(seen[0].second.dst, kServer);
  EXPECT_EQ(seen[0].second.dport, 8080);
  EXPECT_EQ(seen[0].second.proto, IPPROTO_TCP);
  EXPECT_GE(net_->Denied(sb.a), 30u);  // every one is counted
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, RefusalsAtConnectAreLoggedRateLimitedToo) {
  net_->Stop();
  Mutex mu;
  std::vector<std::pair<std::string, DeniedPacket>> seen;
  NodeNetworkOptions o;
  o.tag = "t4";
  o.on_denied = [&](const std::string& label, const DeniedPacket& p) {
    MutexLock l(mu);
    seen.push_back({label, p});
  };
  net_ = NodeNetwork::Start(o).value();
  EgressGuard* g = net_->guard();
  if (!g) GTEST_SKIP() << "no egress guard on this kernel: " << net_->guard_error();
  auto cg = TestCgroup::Make();
  if (!cg) GTEST_SKIP() << "no cgroup2 hierarchy to attach cgroup BPF programs to";
  Sandbox sb;
  sb.ns = NewNs();
  NetworkPolicy open = Mode(NetMode::kOpen);
  auto a = net_->Attach(sb.ns.get(), "sb-guarded", &open);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  sb.a = *a;
  ASSERT_TRUE(g->Attach(cg->fd.get()).ok());
  ASSERT_TRUE(g->Set(cg->fd.get(), sb.a.addr, open).ok());
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(FromCgroup(cg->fd.get(), sb.ns.get(), AF_INET, SOCK_STREAM, "169.254.169.254", 80),
              EPERM);
  EXPECT_EQ(FromCgroup(cg->fd.get(), sb.ns.get(), AF_INET6, SOCK_DGRAM, "2001:db8::1", 53), EPERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    MutexLock l(mu);
    ASSERT_EQ(seen.size(), 5u);  // the burst, of 21
    EXPECT_EQ(seen[0].first, "sb-guarded");
    EXPECT_TRUE(seen[0].second.at_connect);
    EXPECT_EQ(seen[0].second.src, sb.a.addr);
    EXPECT_EQ(seen[0].second.dst, 0xa9fea9feu);
    EXPECT_EQ(seen[0].second.dport, 80);
    EXPECT_EQ(seen[0].second.proto, IPPROTO_TCP);
  }
  EXPECT_EQ(g->Denied(cg->fd.get()), 21u);  // every one is counted
  g->Forget(cg->fd.get());
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, BandwidthIsCappedEachWay) {
  net_->Stop();
  NodeNetworkOptions o;
  o.tag = "t5";
  o.bandwidth_mbit = 16;  // 2 MB/s each way
  net_ = NodeNetwork::Start(o).value();
  Sandbox sb;
  sb.ns = NewNs();
  NetworkPolicy open = Mode(NetMode::kOpen);
  auto a = net_->Attach(sb.ns.get(), "sb-capped", &open);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  sb.a = *a;
  UniqueFd c;
  ASSERT_EQ(ConnectFrom(sb.ns.get(), kServer, 80, &c), 0);
  // 3 MB up to the echo server and back down: at 2 MB/s each way (a 64 KiB burst) that takes
  // at least ~1.4 s; uncapped, on loopback veths, a few ms.
  timeval tv{10, 0};
  setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string chunk(64 * 1024, 'x');
  constexpr size_t kTotal = 3 << 20;
  auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] {
    for (size_t sent = 0; sent < kTotal; sent += chunk.size())
      if (send(c.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) return;
  });
  size_t got = 0;
  char buf[65536];
  while (got < kTotal) {
    ssize_t n = recv(c.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  writer.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got, kTotal);
  EXPECT_GE(secs, 1.2) << "3 MB each way in " << secs << " s: not capped at 2 MB/s";
  EXPECT_LE(secs, 4.0) << "3 MB each way in " << secs << " s: far below the cap";
  net_->Detach(sb.a);
}

TEST_F(NodeNetworkPrivilegedTest, ConnectionFloodStaysInItsSandbox) {
  net_->Stop();
  NodeNetworkOptions o;
  o.tag = "t2";
  o.max_conns = 20;
  o.new_conns_per_s = 1000;
  net_ = NodeNetwork::Start(o).value();
  Sandbox flood = Attach(), neighbour = Attach();
  ASSERT_TRUE(net_->Apply(flood.a, Mode(NetMode::kOpen)).ok());
  ASSERT_TRUE(net_->Apply(neighbour.a, Mode(NetMode::kOpen)).ok());
  std::vector<UniqueFd> held;
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    UniqueFd c;
    int e = ConnectFrom(flood.ns.get(), kServer, 80, &c);
    if (e == 0)
      held.push_back(std::move(c));
    else if (e == ECONNREFUSED)
      ++refused;
  }
  EXPECT_LE(held.size(), 21u);
  EXPECT_GE(refused, 19);
  // The neighbour is not affected.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(ConnectFrom(neighbour.ns.get(), kServer, 80), 0);
  net_->Detach(flood.a);
  net_->Detach(neighbour.a);
}

TEST_F(NodeNetworkPrivilegedTest, RestartReadoptsAndStopLeavesNothing) {
  Sandbox sb = Attach();
  ASSERT_TRUE(net_->Apply(sb.a, Mode(NetMode::kOpen)).ok());
  ASSERT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), 0);
  // A crash: the object goes without Stop; the next Start replaces its table.
  net_.reset();
  NodeNetworkOptions o;
  o.tag = "t1";
  o.state_file = state_.path() + "/net.json";
  net_ = NodeNetwork::Start(o).value();
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80, nullptr, 0, 300), ETIMEDOUT);  // unknown: dropped
  ASSERT_TRUE(net_->Readopt(sb.a).ok());
  ASSERT_TRUE(net_->Apply(sb.a, Mode(NetMode::kOpen)).ok());
  EXPECT_EQ(ConnectFrom(sb.ns.get(), kServer, 80), 0);
  net_->Detach(sb.a);
  sb.ns.Reset();
  net_->Stop();
  net_.reset();
  // Nothing of ours is left in the node namespace.
  auto nl = Netlink::Open(NETLINK_ROUTE);
  EXPECT_FALSE(nl->LinkIndex("dsgt1").ok());
  auto fwd = ReadFileToString("/proc/sys/net/ipv4/conf/up0/forwarding");
  EXPECT_EQ(*fwd, "0\n");
  EXPECT_NE(access((state_.path() + "/net.json").c_str(), F_OK), 0);
  auto ct = ReadFileToString("/proc/net/nf_conntrack");
  if (ct.ok()) {
    EXPECT_EQ(ct->find("src=10.213."), std::string::npos) << *ct;
  }
}

}  // namespace
}  // namespace dsec::net
