#include "net/node_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ifaddrs.h>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <random>
#include <thread>

#include "base/file_util.h"
#include "base/ids.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "net/netlink.h"
#include "net/ruleset.h"

namespace dsec::net {

namespace {

Status WriteSysctl(const std::string& path, const char* value) {
  return WriteStringToFile(path, value);
}

// Sets up the sandbox's side from inside its namespace: no IPv6, and sockets that stay there.
struct Inside {
  UniqueFd rtnl, inet;
};
StatusOr<Inside> EnterOnce(int netns_fd) {
  Inside in;
  Status s;
  std::thread t([&] {
    if (setns(netns_fd, CLONE_NEWNET) < 0) {
      s = ErrnoError("setns into the sandbox's network namespace");
      return;
    }
    // New links take "default"; there is no IPv6 address, route or filter for a sandbox.
    for (const char* f : {"/proc/sys/net/ipv6/conf/default/disable_ipv6",
                          "/proc/sys/net/ipv6/conf/all/disable_ipv6"})
      if (access(f, F_OK) == 0) (void)WriteSysctl(f, "1");
    in.rtnl.Reset(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
    in.inet.Reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!in.rtnl || !in.inet) s = ErrnoError("socket in the sandbox's network namespace");
  });
  t.join();
  if (!s.ok()) return s;
  return in;
}

// "packets N" in `nft list counter` output.
uint64_t PacketsOf(const std::string& out) {
  size_t p = out.find("packets ");
  if (p == std::string::npos) return 0;
  p += 8;
  return ParseUint64(out.substr(p, out.find_first_not_of("0123456789", p) - p)).value_or(0);
}

}  // namespace

NetworkCheck CheckNodeNetwork(const NodeNetworkOptions& o) {
  NetworkCheck c;
  // (Parsed where the configuration is read: ParseSandboxRange. This only guards the type.)
  if (o.range.prefix < 8 || o.range.prefix > 28 ||
      (o.range.base & ~PrefixMask(o.range.prefix)) != 0) {
    c.config = InvalidArgument("network_cidr must be an IPv4 network from /8 to /28 (got " +
                               o.range.ToString() + ")");
    return c;
  }
  const uint32_t gateway = o.range.gateway();
  // The DNS upstream: network_dns, else the first nameserver of /etc/resolv.conf.
  if (o.dns_upstream.empty()) {
    auto conf = ReadFileToString("/etc/resolv.conf");
    auto ns = conf.ok() ? FirstNameserver(*conf) : std::nullopt;
    if (ns) {
      c.dns_addr = *ns;
    } else {
      c.dns_error = "no IPv4 nameserver in /etc/resolv.conf (set network_dns)";
    }
  } else {
    const std::string& spec = o.dns_upstream;
    size_t colon = spec.find(':');
    auto p = colon == std::string::npos ? std::optional<uint64_t>(53)
                                        : ParseUint64(spec.substr(colon + 1));
    if (!ParseIpv4(spec.substr(0, colon), &c.dns_addr) || !p || *p == 0 || *p > 65535) {
      c.config = InvalidArgument("network_dns \"" + spec + "\" is not a.b.c.d[:port]");
      return c;
    }
    c.dns_port = static_cast<uint16_t>(*p);
  }
  if (c.dns_addr) c.dns_upstream = Ipv4ToString(c.dns_addr) + ":" + std::to_string(c.dns_port);

  auto rtnl = Netlink::Open(NETLINK_ROUTE);
  if (!rtnl.ok()) {
    c.node = Unavailable("netlink: " + rtnl.status().message());
    return c;
  }
  c.uplink = o.uplink;
  if (c.uplink.empty()) {
    auto dflt = rtnl->DefaultRouteInterface();
    if (!dflt.ok()) {
      c.node = Unavailable(
          "this node has no IPv4 default route to reach the outside through: "
          "add one or set network_uplink");
      return c;
    }
    c.uplink = *dflt;
  }
  if (!rtnl->LinkIndex(c.uplink).ok()) {
    c.node = Unavailable("network_uplink " + c.uplink + " is not an interface of this node");
    return c;
  }
  // The gateway address must be nobody's yet, unless it is on this edge's own bridge from an
  // earlier run (which the start makes again).
  if (!o.tag.empty() && rtnl->LinkIndex("dsg" + o.tag).ok()) return c;
  UniqueFd probe(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(gateway);
  if (probe && bind(probe.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0)
    c.node = Unavailable("network_cidr " + o.range.ToString() + " is in use on this node (" +
                         Ipv4ToString(gateway) +
                         " is already a local address): choose another network_cidr");
  return c;
}

Status ProbeDnsUpstream(uint32_t addr, uint16_t port, int timeout_ms) {
  UniqueFd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return ErrnoError("socket");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(addr);
  sa.sin_port = htons(port);
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
    return Unavailable(std::string("cannot reach it: ") + strerror(errno));
  // ". IN NS", recursion desired, with a random id.
  std::string id = RandomBytes(2);
  std::string q = id + std::string("\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 10) +
                  std::string("\x00\x00\x02\x00\x01", 5);
  if (send(s.get(), q.data(), q.size(), 0) < 0)
    return Unavailable(std::string("cannot send to it: ") + strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count();
    if (left <= 0) return Unavailable("did not answer in " + std::to_string(timeout_ms) + " ms");
    pollfd p{s.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return ErrnoError("poll");
    if (!p.revents) continue;
    char buf[512];
    ssize_t n = recv(s.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == ECONNREFUSED) return Unavailable("refused (nothing listens there)");
    if (n >= 12 && buf[0] == id[0] && buf[1] == id[1]) return OkStatus();
  }
}

StatusOr<std::unique_ptr<NodeNetwork>> NodeNetwork::Start(NodeNetworkOptions opts) {
  std::unique_ptr<NodeNetwork> n(new NodeNetwork(std::move(opts)));
  if (Status s = n->Init(); !s.ok()) {
    n->Stop();  // what Init made so far
    return s.WithContext("sandbox network");
  }
  return n;
}

NodeNetwork::~NodeNetwork() {
  dns_.reset();
  deny_log_.reset();
  MutexLock l(mu_);
  if (nft_) nft_ctx_free(nft_);
}

Status NodeNetwork::Init() {
  const auto& t = opts_.tag;
  if (t.empty() || t.size() > 6 ||
      t.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyz") != std::string::npos)
    return InvalidArgument("network tag must be 1-6 characters of [0-9a-z]");
  check_ = CheckNodeNetwork(opts_);
  DSEC_RETURN_IF_ERROR(check_.config);
  base_ = opts_.range.base;
  prefix_ = opts_.range.prefix;
  gateway_ = opts_.range.gateway();
  DSEC_RETURN_IF_ERROR(check_.node);
  // An NFLOG group of this edge's own (two edges on one host log apart).
  uint32_t h = 2166136261u;
  for (char c : t) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  log_group_ = static_cast<uint16_t>(0x4000 | (h & 0x3fff));
  table_ = "dsec_" + t;
  bridge_ = "dsg" + t;
  veth_prefix_ = "dsv" + t;
  DSEC_ASSIGN_OR_RETURN(Netlink rtnl, Netlink::Open(NETLINK_ROUTE));
  uplink_ = check_.uplink;

  {
    MutexLock l(mu_);
    nft_ = nft_ctx_new(NFT_CTX_DEFAULT);
    if (!nft_) return InternalError("libnftables: nft_ctx_new failed");
    nft_ctx_buffer_output(nft_);
    nft_ctx_buffer_error(nft_);
    // A table left by a crashed run of this edge is replaced in the same transaction.
    bool existed = NftOutput("list table inet " + table_).ok();
    DSEC_RETURN_IF_ERROR(
        Nft("add table inet " + table_ + "\ndelete table inet " + table_ + "\n" + Ruleset()));
    if (existed) {
      DSEC_ASSIGN_OR_RETURN(Netlink ct, Netlink::Open(NETLINK_NETFILTER));
      (void)ct.FlushConntrack(base_, PrefixMask(prefix_));
    }
    used_.assign(size_t{1} << (32 - prefix_), false);
    used_[0] = used_[1] = true;
    used_.back() = true;
    std::random_device rd;
    veth_counter_ = rd();
  }
  // The gateway (after the table, which keeps its IGMP reports out of conntrack): ours from
  // an earlier run of this edge (re-made), or nobody's.
  if (auto old = rtnl.LinkIndex(bridge_); old.ok()) DSEC_RETURN_IF_ERROR(rtnl.DeleteLink(*old));
  DSEC_RETURN_IF_ERROR(rtnl.CreateBridge(bridge_));
  DSEC_ASSIGN_OR_RETURN(int br, rtnl.LinkIndex(bridge_));
  (void)WriteSysctl("/proc/sys/net/ipv6/conf/" + bridge_ + "/disable_ipv6", "1");
  DSEC_RETURN_IF_ERROR(rtnl.AddAddress4(br, gateway_, 32).WithContext("gateway address"));
  StartDns();
  StartGuard();
  if (opts_.on_denied) {
    auto d = DenyLog::Start(log_group_, [this](const DeniedPacket& p) { Denied(p); });
    if (d.ok()) {
      deny_log_ = std::move(*d);
    } else {
      DSEC_LOG_WARN("network: refused packets are counted but not logged: {}",
                    d.status().ToString());
    }
  }

  return SetUplinkForwarding();
}

Status NodeNetwork::Shape(Netlink& nl, int ifindex) const {
  const uint64_t rate = uint64_t{opts_.bandwidth_mbit} * 1000000 / 8;  // bytes/s
  // A burst of 10 ms at the rate, at least 64 KiB (a GSO segment must fit the bucket), and
  // 50 ms of queue: bulk transfers keep the rate without a standing delay.
  const uint32_t burst = static_cast<uint32_t>(std::max<uint64_t>(rate / 100, 64 * 1024));
  return nl.SetTokenBucket(ifindex, rate, burst, 50);
}

void NodeNetwork::Denied(const DeniedPacket& p) {
  if (!opts_.on_denied) return;
  std::string label;
  {
    MutexLock l(mu_);
    auto it = attached_.find(p.src);
    if (it == attached_.end()) return;
    label = it->second.label;
  }
  opts_.on_denied(label, p);
}

void NodeNetwork::StartGuard() {
  EgressGuardOptions g;
  g.range = opts_.range;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) == 0) {
    for (ifaddrs* i = ifa; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
        g.node_addrs.push_back(ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr));
    freeifaddrs(ifa);
  }
  g.on_denied = [this](const DeniedPacket& p) { Denied(p); };
  auto guard = EgressGuard::Start(std::move(g));
  if (guard.ok()) {
    guard_ = std::move(*guard);
  } else {
    guard_error_ = guard.status().message();
    DSEC_LOG_WARN("network: container sandboxes get no egress guard (nftables alone enforce): {}",
                  guard_error_);
  }
}

Status NodeNetwork::SetUplinkForwarding() {
  std::string path = "/proc/sys/net/ipv4/conf/" + uplink_ + "/forwarding";
  DSEC_ASSIGN_OR_RETURN(std::string now, ReadFileToString(path));
  now = std::string(TrimWhitespace(now));
  uplink_forwarding_before_ = now;
  // After a crash the file says what it was before that run changed it.
  if (!opts_.state_file.empty()) {
    if (auto f = ReadFileToString(opts_.state_file); f.ok()) {
      if (auto j = ParseJson(*f); j.ok() && j->value("uplink", "") == uplink_)
        uplink_forwarding_before_ = j->value("forwarding", now);
    } else {
      Json j = {{"uplink", uplink_}, {"forwarding", now}};
      DSEC_RETURN_IF_ERROR(
          WriteStringToFile(opts_.state_file, j.dump(), O_WRONLY | O_CREAT | O_TRUNC));
    }
  }
  if (now != "1") DSEC_RETURN_IF_ERROR(WriteSysctl(path, "1"));
  return OkStatus();
}

std::string NodeNetwork::Ruleset() const {
  NodeTable t;
  t.table = table_;
  t.bridge = bridge_;
  t.veth_prefix = veth_prefix_;
  t.uplink = uplink_;
  t.range = opts_.range;
  t.max_conns = opts_.max_conns;
  t.new_conns_per_s = opts_.new_conns_per_s;
  if (opts_.on_denied) t.log_group = log_group_;
  return RenderTable(t);
}

Status NodeNetwork::Nft(const std::string& cmds) { return NftOutput(cmds).status(); }

StatusOr<std::string> NodeNetwork::NftOutput(const std::string& cmds) {
  if (!nft_) return FailedPrecondition("the node network is stopped");
  int rc = nft_run_cmd_from_buffer(nft_, cmds.c_str());
  std::string out = nft_ctx_get_output_buffer(nft_);
  std::string err = nft_ctx_get_error_buffer(nft_);
  if (rc != 0) {
    std::string first = err.substr(0, err.find('\n'));
    return InternalError("nftables: " + (first.empty() ? std::string("command failed") : first));
  }
  return out;
}

StatusOr<uint32_t> NodeNetwork::AllocateAddress() {
  size_t n = used_.size();
  for (size_t i = 0; i < n; ++i) {
    uint32_t off = static_cast<uint32_t>((next_ + i) % n);
    if (used_[off]) continue;
    used_[off] = true;
    next_ = off + 1;  // next-fit: an address is reused as late as possible
    return base_ + off;
  }
  return OverCapacity("the node's sandbox network " + opts_.range.ToString() +
                      " has no free address");
}

StatusOr<NetAttachment> NodeNetwork::Reserve() {
  MutexLock l(mu_);
  if (stopped_) return FailedPrecondition("the node network is stopped");
  NetAttachment a;
  DSEC_ASSIGN_OR_RETURN(a.addr, AllocateAddress());
  // Unique names: a dropped namespace's veth lingers for a moment (the kernel removes it
  // asynchronously), so a name is never reused soon.
  const size_t width = std::min<size_t>(8, IFNAMSIZ - 1 - veth_prefix_.size());
  a.host_if = veth_prefix_ + Hex8(veth_counter_++).substr(8 - width);
  return a;
}

void NodeNetwork::ReleaseAddress(uint32_t addr) {
  MutexLock l(mu_);
  used_[addr - base_] = false;
}

Status NodeNetwork::CanEnforce(const NetworkPolicy& p) const {
  if (!p.domains.empty() && !dns_)
    return Unimplemented("network domains need the node's DNS forwarder, which is off: " +
                         dns_error_);
  return OkStatus();
}

StatusOr<NetAttachment> NodeNetwork::FinishAttach(Netlink& rtnl, NetAttachment a,
                                                  const std::string& label,
                                                  const NetworkPolicy* initial) {
  auto undo = [&](Status s) {
    if (auto i = rtnl.LinkIndex(a.host_if); i.ok()) (void)rtnl.DeleteLink(*i);
    ReleaseAddress(a.addr);
    return s.WithContext("attach the sandbox network");
  };
  auto host = rtnl.LinkIndex(a.host_if);
  if (!host.ok()) return undo(host.status());
  (void)WriteSysctl("/proc/sys/net/ipv6/conf/" + a.host_if + "/disable_ipv6", "1");
  if (Status s = WriteSysctl("/proc/sys/net/ipv4/conf/" + a.host_if + "/forwarding", "1"); !s.ok())
    return undo(s);
  if (Status s = rtnl.SetUp(*host); !s.ok()) return undo(s);
  if (Status s = rtnl.AddRoute4(a.addr, 32, *host, 0, false); !s.ok()) return undo(s);
  Status s;
  {
    MutexLock l(mu_);
    std::string cmds = RenderAttach(table_, a.addr, a.host_if);
    if (initial) cmds += RenderPolicy(table_, a.addr, *initial, /*dispatched=*/false);
    s = Nft(cmds);
    if (s.ok()) {
      attached_[a.addr] = {.label = label};
      if (initial) {
        attached_[a.addr].dispatched = initial->mode != NetMode::kNone;
        attached_[a.addr].policy = *initial;
      }
    }
  }
  if (!s.ok()) return undo(s);
  return a;
}

StatusOr<NetAttachment> NodeNetwork::Attach(int netns_fd, const std::string& label,
                                            const NetworkPolicy* initial) {
  if (initial) DSEC_RETURN_IF_ERROR(CanEnforce(*initial));
  DSEC_ASSIGN_OR_RETURN(NetAttachment a, Reserve());
  auto fail = [&](Status s) {
    ReleaseAddress(a.addr);
    return s;
  };
  auto in = EnterOnce(netns_fd);
  if (!in.ok()) return fail(in.status());
  auto rtnl = Netlink::Open(NETLINK_ROUTE);
  if (!rtnl.ok()) return fail(rtnl.status());
  if (Status s = rtnl->CreateVeth(a.host_if, "eth0", netns_fd); !s.ok()) return fail(s);
  // The sandbox's side, from inside: eth0 up with the address, the gateway on the link.
  Status inside = [&]() -> Status {
    ifreq ifr{};
    strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
    if (ioctl(in->inet.get(), SIOCGIFINDEX, &ifr) < 0) return ErrnoError("eth0 index");
    int eth0 = ifr.ifr_ifindex;
    Netlink inner = Netlink::FromFd(std::move(in->rtnl));
    DSEC_RETURN_IF_ERROR(inner.SetUp(eth0));
    DSEC_RETURN_IF_ERROR(inner.AddAddress4(eth0, a.addr, 32));
    DSEC_RETURN_IF_ERROR(inner.AddRoute4(0, 0, eth0, gateway_, /*onlink=*/true));
    // What it sends is shaped at eth0 (its namespace is the node's, not the sandbox's to
    // change), what it receives at the host end.
    if (opts_.bandwidth_mbit) {
      DSEC_RETURN_IF_ERROR(Shape(inner, eth0));
      DSEC_ASSIGN_OR_RETURN(int host, rtnl->LinkIndex(a.host_if));
      DSEC_RETURN_IF_ERROR(Shape(*rtnl, host));
    }
    return OkStatus();
  }();
  if (!inside.ok()) {
    if (auto i = rtnl->LinkIndex(a.host_if); i.ok()) (void)rtnl->DeleteLink(*i);
    return fail(inside.WithContext("attach the sandbox network"));
  }
  return FinishAttach(*rtnl, a, label, initial);
}

StatusOr<NetAttachment> NodeNetwork::AttachTap(UniqueFd* tap, const std::string& label) {
  DSEC_ASSIGN_OR_RETURN(NetAttachment a, Reserve());
  auto rtnl = Netlink::Open(NETLINK_ROUTE);
  if (!rtnl.ok()) {
    ReleaseAddress(a.addr);
    return rtnl.status();
  }
  // No IFF_VNET_HDR: the guest's virtio-net and a template's (which has no tap) agree.
  UniqueFd fd(open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  ifreq ifr{};
  strncpy(ifr.ifr_name, a.host_if.c_str(), IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  if (!fd || ioctl(fd.get(), TUNSETIFF, &ifr) < 0) {
    Status s = ErrnoError("create tap " + a.host_if);
    ReleaseAddress(a.addr);
    return s;
  }
  DSEC_ASSIGN_OR_RETURN(a, FinishAttach(*rtnl, a, label, nullptr));
  *tap = std::move(fd);
  return a;
}

Status NodeNetwork::Readopt(const NetAttachment& a, const std::string& label) {
  MutexLock l(mu_);
  if (a.addr <= base_ || a.addr - base_ >= used_.size())
    return InvalidArgument("address " + Ipv4ToString(a.addr) + " is outside " +
                           opts_.range.ToString());
  if (attached_.count(a.addr))
    return Status(StatusCode::kAlreadyExists, Ipv4ToString(a.addr) + " is attached");
  DSEC_RETURN_IF_ERROR(Nft(RenderAttach(table_, a.addr, a.host_if)));
  used_[a.addr - base_] = true;
  attached_[a.addr] = {.label = label};
  return OkStatus();
}

Status NodeNetwork::Apply(const NetAttachment& a, const NetworkPolicy& p) {
  bool had_flows = false;
  DSEC_RETURN_IF_ERROR(ApplyRules(a, p, &had_flows));
  // Replies are let in by connection state, not by the policy, so a flow the old policy opened
  // would outlive it: a remote peer could go on pushing datagrams into an open UDP flow after a
  // PATCH to `none`. Such flows go (a sandbox that still may reach its peer makes a new entry
  // with its next datagram). TCP stays: the sandbox's every packet is checked against the
  // policy, so a connection it may no longer make is reset at its next segment, while one it
  // still may make must survive the change (without its entry the peer's next segment would
  // reach the node's own stack, not the sandbox, and be answered with a reset). Only a sandbox
  // whose old policy let anything out can have such flows (not at create, not from `none`);
  // the dump walks the whole conntrack table, outside the lock.
  if (!had_flows) return OkStatus();
  // Only a sandbox that ever made a non-TCP flow (set @nontcp remembers it, until it goes) can
  // have one: the walk (the whole conntrack table, a lock per bucket: 2-20 ms) is skipped for
  // the others. Asked after the new rules are in force: a flow made before then is marked; one
  // made after is the new policy's. (A read, no transaction: no grace period to wait for.)
  {
    MutexLock l(mu_);
    if (!Nft(StrCat({"get element inet ", table_, " nontcp { ", Ipv4ToString(a.addr), " }\n"}))
             .ok())
      return OkStatus();  // none
  }
  if (auto ct = Netlink::Open(NETLINK_NETFILTER); ct.ok()) {
    if (auto n = ct->FlushConntrackButTcp(a.addr, 0xffffffff); !n.ok())
      DSEC_LOG_WARN("network: conntrack flush {}: {}", Ipv4ToString(a.addr), n.status().ToString());
  }
  return OkStatus();
}

Status NodeNetwork::ApplyRules(const NetAttachment& a, const NetworkPolicy& p, bool* had_flows) {
  MutexLock l(mu_);
  auto it = attached_.find(a.addr);
  if (it == attached_.end()) return FailedPrecondition("the sandbox has no network attachment");
  DSEC_RETURN_IF_ERROR(CanEnforce(p));
  const bool dispatch = p.mode != NetMode::kNone;
  DSEC_RETURN_IF_ERROR(Nft(RenderPolicy(table_, a.addr, p, it->second.dispatched)));
  *had_flows = it->second.dispatched;
  it->second.dispatched = dispatch;
  it->second.policy = p;
  return OkStatus();
}

void NodeNetwork::Detach(const NetAttachment& a) {
  {
    MutexLock l(mu_);
    auto it = attached_.find(a.addr);
    if (it == attached_.end()) return;
    const std::string s = Ipv4ToString(a.addr);
    std::string cmds = RenderDetach(table_, a.addr, a.host_if, it->second.dispatched);
    if (Status st = Nft(cmds); !st.ok()) DSEC_LOG_WARN("network: detach {}: {}", s, st.ToString());
    // (Its non-TCP mark, if any, is not the next sandbox's at this address.)
    (void)Nft(StrCat({"delete element inet ", table_, " nontcp { ", s, " }\n"}));
    attached_.erase(it);
    used_[a.addr - base_] = false;
  }
  if (auto ct = Netlink::Open(NETLINK_NETFILTER); ct.ok()) {
    if (Status s = ct->FlushConntrack(a.addr, 0xffffffff); !s.ok())
      DSEC_LOG_WARN("network: conntrack flush {}: {}", Ipv4ToString(a.addr), s.ToString());
  }
}

void NodeNetwork::Unplug(const NetAttachment& a) {
  if (auto rtnl = Netlink::Open(NETLINK_ROUTE); rtnl.ok()) {
    if (auto i = rtnl->LinkIndex(a.host_if); i.ok()) {
      if (Status s = rtnl->DeleteLink(*i); !s.ok())
        DSEC_LOG_WARN("network: delete {}: {}", a.host_if, s.ToString());
    }
  }
  Detach(a);
}

uint64_t NodeNetwork::Denied(const NetAttachment& a) {
  MutexLock l(mu_);
  auto out = NftOutput("list counter inet " + table_ + " " + CounterName(a.addr));
  if (!out.ok()) return 0;
  return PacketsOf(*out);
}

uint64_t NodeNetwork::DeniedTotal() {
  uint64_t at_connect = guard_ ? guard_->DeniedTotal() : 0;
  MutexLock l(mu_);
  auto out = NftOutput("list counter inet " + table_ + " denied_total");
  if (!out.ok()) return at_connect;
  return at_connect + PacketsOf(*out);
}

void NodeNetwork::StartDns() {
  if (!check_.dns_addr) {
    dns_error_ = check_.dns_error;
    DSEC_LOG_WARN("network: no DNS forwarder: {}", dns_error_);
    return;
  }
  DnsForwarderOptions fo;
  fo.max_ttl_s = opts_.dns_max_ttl_s;
  auto f = DnsForwarder::Start(
      gateway_, check_.dns_addr, check_.dns_port, [this](uint32_t src) { return PolicyFor(src); },
      [this](uint32_t src, const std::vector<dns::Address>& a) { AllowResolved(src, a); }, fo);
  if (!f.ok()) {
    dns_error_ = f.status().ToString();
    DSEC_LOG_WARN("network: no DNS forwarder: {}", dns_error_);
    return;
  }
  dns_ = std::move(*f);
}

std::optional<NetworkPolicy> NodeNetwork::PolicyFor(uint32_t addr) {
  MutexLock l(mu_);
  auto it = attached_.find(addr);
  if (it == attached_.end()) return std::nullopt;
  return it->second.policy;
}

void NodeNetwork::AllowResolved(uint32_t sandbox, const std::vector<dns::Address>& addrs) {
  MutexLock l(mu_);
  if (!attached_.count(sandbox)) return;
  std::string cmds = RenderAllowResolved(table_, sandbox, addrs);
  if (cmds.empty()) return;
  Status s = Nft(cmds);
  if (!s.ok())
    DSEC_LOG_WARN("network: allow resolved for {}: {}", Ipv4ToString(sandbox), s.ToString());
}

void NodeNetwork::Stop() {
  dns_.reset();  // its thread calls back into this object
  deny_log_.reset();
  MutexLock l(mu_);
  if (stopped_) return;
  stopped_ = true;
  if (nft_ && NftOutput("list table inet " + table_).ok()) {
    if (Status s = Nft("delete table inet " + table_); !s.ok())
      DSEC_LOG_WARN("network: delete table: {}", s.ToString());
  }
  if (auto rtnl = Netlink::Open(NETLINK_ROUTE); rtnl.ok()) {
    if (auto i = rtnl->LinkIndex(bridge_); i.ok()) (void)rtnl->DeleteLink(*i);
  }
  if (auto ct = Netlink::Open(NETLINK_NETFILTER); ct.ok())
    (void)ct->FlushConntrack(base_, PrefixMask(prefix_));
  if (uplink_forwarding_before_.empty()) return;  // Init did not get that far
  if (uplink_forwarding_before_ != "1")
    (void)WriteSysctl("/proc/sys/net/ipv4/conf/" + uplink_ + "/forwarding",
                      uplink_forwarding_before_.c_str());
  if (!opts_.state_file.empty()) (void)unlink(opts_.state_file.c_str());
  attached_.clear();
}

std::string NodeNetwork::Describe() const {
  return StrCat({"range ", opts_.range.ToString(), ", gateway ", Ipv4ToString(gateway_),
                 ", uplink ", uplink_, ", table inet ", table_});
}

std::string NodeNetwork::DnsState() const {
  if (!dns_) return "none";
  switch (dns_->upstream()) {
    case DnsForwarder::Upstream::kOk:
      return "ok";
    case DnsForwarder::Upstream::kUnreachable:
      return "unreachable";
    case DnsForwarder::Upstream::kUnknown:
      break;
  }
  return "unknown";
}

StatusOr<NodeNetwork*> LazyNodeNetwork::Get() {
  MutexLock l(mu_);
  if (!net_) {
    auto n = NodeNetwork::Start(opts_);
    if (!n.ok()) {
      DSEC_LOG_WARN("network: {}", n.status().ToString());
      start_error_ = n.status().message();
      // The node's problem, whatever the kind of failure: 503 with the reason.
      return Unavailable("the node's sandbox network is unavailable: " + n.status().message());
    }
    start_error_.clear();
    net_ = std::move(*n);
    DSEC_LOG_INFO("network: {}", net_->Describe());
  }
  return net_.get();
}

NetworkCheck LazyNodeNetwork::Check() {
  NetworkCheck c = CheckNodeNetwork(opts_);
  if (!c.config.ok()) {
    DSEC_LOG_WARN("network: {}", c.config.message());
  } else if (!c.node.ok()) {
    DSEC_LOG_WARN("network: unavailable until fixed (creates that need it answer 503): {}",
                  c.node.message());
  } else if (!c.dns_error.empty()) {
    DSEC_LOG_WARN("network: no DNS forwarder: {}", c.dns_error);
  }
  MutexLock l(mu_);
  check_ = c;
  return c;
}

void LazyNodeNetwork::ProbeDns() {
  uint32_t addr = 0;
  uint16_t port = 0;
  std::string name;
  {
    MutexLock l(mu_);
    addr = check_.dns_addr;
    port = check_.dns_port;
    name = check_.dns_upstream;
  }
  if (!addr) return;
  Status s = ProbeDnsUpstream(addr, port, 2000);
  if (!s.ok())
    DSEC_LOG_WARN("network: DNS upstream {} {}: sandbox domain lookups will fail (set network_dns)",
                  name, s.message());
  MutexLock l(mu_);
  dns_probe_ = s.ok() ? "ok" : s.message();
}

LazyNodeNetwork::Info LazyNodeNetwork::Describe() {
  MutexLock l(mu_);
  Info i;
  i.cidr = opts_.range.ToString();
  i.started = net_ != nullptr;
  i.dns_upstream = check_.dns_upstream;
  if (net_) {
    i.egress_guard = net_->guard() ? "on" : net_->guard_error();
    i.uplink = net_->uplink();
    i.dns_state = net_->DnsState();
    i.dns_error = net_->dns_error();
  } else {
    i.uplink = check_.uplink;
    i.reason = !start_error_.empty() ? start_error_
               : !check_.config.ok() ? check_.config.message()
                                     : check_.node.message();
    i.dns_state = check_.dns_addr ? "unknown" : "none";
    i.dns_error = check_.dns_error;
  }
  // No query has told yet: the start's probe does.
  if (i.dns_state == "unknown" && !dns_probe_.empty()) {
    i.dns_state = dns_probe_ == "ok" ? "ok" : "unreachable";
    if (dns_probe_ != "ok") i.dns_error = dns_probe_;
  }
  return i;
}

NodeNetwork* LazyNodeNetwork::IfStarted() {
  MutexLock l(mu_);
  return net_.get();
}

void LazyNodeNetwork::Stop() {
  MutexLock l(mu_);
  if (net_) net_->Stop();
}

}  // namespace dsec::net
