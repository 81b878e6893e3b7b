#include "net/netlink.h"

#include <arpa/inet.h>
#include <linux/if_link.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <sys/socket.h>

#include <thread>

#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <cerrno>

#include <algorithm>
#include <cstring>
#include <vector>

namespace dsec::net {

// A netlink request being built: header, fixed part, attributes (nestable).
class Netlink::Msg {
 public:
  Msg(uint16_t type, uint16_t flags, const void* fixed, size_t fixed_len) {
    buf_.resize(NLMSG_SPACE(fixed_len));
    hdr()->nlmsg_len = static_cast<uint32_t>(NLMSG_LENGTH(fixed_len));
    hdr()->nlmsg_type = type;
    hdr()->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
    memcpy(buf_.data() + NLMSG_HDRLEN, fixed, fixed_len);
  }
  nlmsghdr* hdr() { return reinterpret_cast<nlmsghdr*>(buf_.data()); }
  void Attr(uint16_t type, const void* data, size_t len) {
    size_t off = NLMSG_ALIGN(hdr()->nlmsg_len);
    buf_.resize(off + RTA_SPACE(len));
    auto* a = reinterpret_cast<rtattr*>(buf_.data() + off);
    a->rta_type = type;
    a->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
    if (len) memcpy(RTA_DATA(a), data, len);
    hdr()->nlmsg_len = static_cast<uint32_t>(off + RTA_ALIGN(a->rta_len));
  }
  void Str(uint16_t type, const std::string& s) { Attr(type, s.c_str(), s.size() + 1); }
  void U32(uint16_t type, uint32_t v) { Attr(type, &v, 4); }
  size_t Begin(uint16_t type) {
    size_t off = NLMSG_ALIGN(hdr()->nlmsg_len);
    Attr(type, nullptr, 0);
    return off;
  }
  void End(size_t off) {
    reinterpret_cast<rtattr*>(buf_.data() + off)->rta_len =
        static_cast<uint16_t>(hdr()->nlmsg_len - off);
  }
  // Raw bytes inside the current nest (the peer's ifinfomsg of a veth).
  void Raw(const void* data, size_t len) {
    size_t off = NLMSG_ALIGN(hdr()->nlmsg_len);
    buf_.resize(off + NLMSG_ALIGN(len));
    memcpy(buf_.data() + off, data, len);
    hdr()->nlmsg_len = static_cast<uint32_t>(off + NLMSG_ALIGN(len));
  }
  const char* data() { return buf_.data(); }

 private:
  std::vector<char> buf_;
};

StatusOr<UniqueFd> SocketIn(int netns_fd, int domain, int type, int protocol) {
  UniqueFd s;
  Status st;
  std::thread t([&] {
    if (setns(netns_fd, CLONE_NEWNET) < 0) {
      st = ErrnoError("setns into a network namespace");
      return;
    }
    s.Reset(socket(domain, type, protocol));
    if (!s) st = ErrnoError("socket");
  });
  t.join();
  DSEC_RETURN_IF_ERROR(st);
  return s;
}

StatusOr<Netlink> Netlink::Open(int protocol) {
  UniqueFd fd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, protocol));
  if (!fd) return ErrnoError("netlink socket");
  sockaddr_nl sa{};
  sa.nl_family = AF_NETLINK;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
    return ErrnoError("bind netlink socket");
  int one = 1;
  (void)setsockopt(fd.get(), SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one);
  return Netlink(std::move(fd));
}

Status Netlink::Talk(Msg& m) {
  return Talk(m, [](const nlmsghdr*) {});
}

template <typename F>
Status Netlink::Talk(Msg& m, F&& on_reply) {
  nlmsghdr* h = m.hdr();
  h->nlmsg_seq = ++seq_;
  bool dump = (h->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  if (!dump) h->nlmsg_flags |= NLM_F_ACK;
  if (send(fd_.get(), m.data(), h->nlmsg_len, 0) < 0) return ErrnoError("netlink send");
  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t n = recv(fd_.get(), buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("netlink recv");
    }
    int len = static_cast<int>(n);
    for (auto* r = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(r, static_cast<unsigned>(len));
         r = NLMSG_NEXT(r, len)) {
      if (r->nlmsg_seq != seq_) continue;
      if (r->nlmsg_type == NLMSG_DONE) return OkStatus();
      if (r->nlmsg_type == NLMSG_ERROR) {
        int err = reinterpret_cast<nlmsgerr*>(NLMSG_DATA(r))->error;
        if (err == 0) return OkStatus();
        errno = -err;
        return ErrnoError("netlink request");
      }
      on_reply(r);
    }
  }
}

Status Netlink::SetTokenBucket(int ifindex, uint64_t rate, uint32_t burst, uint32_t latency_ms) {
  tcmsg tcm{};
  tcm.tcm_family = AF_UNSPEC;
  tcm.tcm_ifindex = ifindex;
  tcm.tcm_handle = 0x10000;  // 1:
  tcm.tcm_parent = TC_H_ROOT;
  Msg m(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, &tcm, sizeof tcm);
  m.Str(TCA_KIND, "tbf");
  size_t opts = m.Begin(TCA_OPTIONS);
  tc_tbf_qopt q{};
  q.rate.rate = rate > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(rate);
  q.rate.linklayer = TC_LINKLAYER_ETHERNET;
  q.limit = static_cast<uint32_t>(std::min<uint64_t>(rate * latency_ms / 1000 + burst, UINT32_MAX));
  // The bucket's depth in scheduler ticks (64 ns); TCA_TBF_BURST below says it in bytes too.
  q.buffer =
      static_cast<uint32_t>(std::min<uint64_t>(burst * 1000000000ull / rate / 64, UINT32_MAX));
  m.Attr(TCA_TBF_PARMS, &q, sizeof q);
  if (rate > UINT32_MAX) m.Attr(TCA_TBF_RATE64, &rate, sizeof rate);
  m.U32(TCA_TBF_BURST, burst);
  m.End(opts);
  return Talk(m).WithContext("tc tbf on interface " + std::to_string(ifindex));
}

Status Netlink::CreateVeth(const std::string& host, const std::string& peer, int peer_netns_fd) {
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  ifi.ifi_flags = IFF_UP;
  ifi.ifi_change = IFF_UP;
  Msg m(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifi, sizeof ifi);
  m.Str(IFLA_IFNAME, host);
  size_t info = m.Begin(IFLA_LINKINFO);
  m.Attr(IFLA_INFO_KIND, "veth", 4);
  size_t data = m.Begin(IFLA_INFO_DATA);
  size_t p = m.Begin(VETH_INFO_PEER);
  ifinfomsg peer_ifi{};  // not up: veth_open would fail (ENOTCONN) before the pair is linked
  peer_ifi.ifi_family = AF_UNSPEC;
  m.Raw(&peer_ifi, sizeof peer_ifi);
  m.Str(IFLA_IFNAME, peer);
  m.U32(IFLA_NET_NS_FD, static_cast<uint32_t>(peer_netns_fd));
  m.End(p);
  m.End(data);
  m.End(info);
  return Talk(m).WithContext("create veth " + host);
}

Status Netlink::CreateBridge(const std::string& name) {
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  // Without multicast before it goes up, so it never joins a group or sends an IGMP report.
  ifi.ifi_change = IFF_MULTICAST;
  Msg m(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifi, sizeof ifi);
  m.Str(IFLA_IFNAME, name);
  size_t info = m.Begin(IFLA_LINKINFO);
  m.Attr(IFLA_INFO_KIND, "bridge", 6);
  m.End(info);
  DSEC_RETURN_IF_ERROR(Talk(m).WithContext("create bridge " + name));
  DSEC_ASSIGN_OR_RETURN(int index, LinkIndex(name));
  return SetUp(index);
}

Status Netlink::DeleteLink(int ifindex) {
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  ifi.ifi_index = ifindex;
  Msg m(RTM_DELLINK, 0, &ifi, sizeof ifi);
  return Talk(m);
}

Status Netlink::SetUp(int ifindex) {
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  ifi.ifi_index = ifindex;
  ifi.ifi_flags = IFF_UP;
  ifi.ifi_change = IFF_UP;
  Msg m(RTM_NEWLINK, 0, &ifi, sizeof ifi);
  return Talk(m);
}

StatusOr<int> Netlink::LinkIndex(const std::string& name) {
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  Msg m(RTM_GETLINK, 0, &ifi, sizeof ifi);
  m.Str(IFLA_IFNAME, name);
  int index = 0;
  Status s = Talk(m, [&](const nlmsghdr* r) {
    if (r->nlmsg_type == RTM_NEWLINK)
      index = static_cast<const ifinfomsg*>(NLMSG_DATA(r))->ifi_index;
  });
  if (!s.ok() && s.error_number() == ENODEV) return NotFound("no link " + name);
  if (!s.ok()) return s;
  if (index == 0) return NotFound("no link " + name);
  return index;
}

Status Netlink::AddAddress4(int ifindex, uint32_t addr, uint8_t prefix) {
  ifaddrmsg ifa{};
  ifa.ifa_family = AF_INET;
  ifa.ifa_prefixlen = prefix;
  ifa.ifa_index = static_cast<uint32_t>(ifindex);
  Msg m(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &ifa, sizeof ifa);
  uint32_t be = htonl(addr);
  m.U32(IFA_LOCAL, be);
  m.U32(IFA_ADDRESS, be);
  return Talk(m);
}

Status Netlink::AddRoute4(uint32_t dst, uint8_t prefix, int oif, uint32_t gateway, bool onlink) {
  rtmsg rt{};
  rt.rtm_family = AF_INET;
  rt.rtm_dst_len = prefix;
  rt.rtm_table = RT_TABLE_MAIN;
  rt.rtm_protocol = RTPROT_STATIC;
  rt.rtm_scope = gateway ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
  rt.rtm_type = RTN_UNICAST;
  if (onlink) rt.rtm_flags = RTNH_F_ONLINK;
  Msg m(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &rt, sizeof rt);
  if (prefix) m.U32(RTA_DST, htonl(dst));
  if (gateway) m.U32(RTA_GATEWAY, htonl(gateway));
  m.U32(RTA_OIF, static_cast<uint32_t>(oif));
  return Talk(m);
}

StatusOr<std::string> Netlink::DefaultRouteInterface() {
  rtmsg rt{};
  rt.rtm_family = AF_INET;
  Msg m(RTM_GETROUTE, NLM_F_DUMP, &rt, sizeof rt);
  int oif = 0;
  Status s = Talk(m, [&](const nlmsghdr* r) {
    if (r->nlmsg_type != RTM_NEWROUTE || oif) return;
    const auto* msg = static_cast<const rtmsg*>(NLMSG_DATA(r));
    if (msg->rtm_dst_len != 0 || msg->rtm_table != RT_TABLE_MAIN) return;
    int len = static_cast<int>(RTM_PAYLOAD(r));
    for (auto* a = RTM_RTA(msg); RTA_OK(a, len); a = RTA_NEXT(a, len))
      if (a->rta_type == RTA_OIF) memcpy(&oif, RTA_DATA(a), 4);
  });
  if (!s.ok()) return s;
  char name[IF_NAMESIZE] = {};
  if (!oif || !if_indextoname(static_cast<unsigned>(oif), name))
    return NotFound("this node has no IPv4 default route (set network_uplink)");
  return std::string(name);
}

Status Netlink::FlushConntrack(uint32_t mark, uint32_t mask) {
  nfgenmsg nfg{};
  nfg.nfgen_family = AF_INET;
  nfg.version = NFNETLINK_V0;
  Msg m(static_cast<uint16_t>((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE), 0, &nfg,
        sizeof nfg);
  m.U32(CTA_MARK, htonl(mark));
  m.U32(CTA_MARK_MASK, htonl(mask));
  Status s = Talk(m);
  if (!s.ok() && s.error_number() == ENOENT) return OkStatus();  // nothing matched
  return s;
}

StatusOr<int> Netlink::FlushConntrackButTcp(uint32_t mark, uint32_t mask) {
  nfgenmsg nfg{};
  nfg.nfgen_family = AF_INET;
  nfg.version = NFNETLINK_V0;
  // The kernel filters a dump by mark but cannot delete by protocol: dump, then delete each
  // entry by its original tuple (an entry gone in between is ENOENT, which is fine).
  Msg dump(static_cast<uint16_t>((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET), NLM_F_DUMP,
           &nfg, sizeof nfg);
  dump.U32(CTA_MARK, htonl(mark));
  dump.U32(CTA_MARK_MASK, htonl(mask));
  std::vector<std::string> tuples;  // CTA_TUPLE_ORIG attributes, header and all
  DSEC_RETURN_IF_ERROR(
      Talk(dump, [&](const nlmsghdr* r) {
        if (r->nlmsg_len < NLMSG_LENGTH(sizeof(nfgenmsg))) return;
        const char* p = static_cast<const char*>(NLMSG_DATA(r)) + NLMSG_ALIGN(sizeof(nfgenmsg));
        int left = static_cast<int>(r->nlmsg_len - NLMSG_LENGTH(sizeof(nfgenmsg)));
        for (auto* a = reinterpret_cast<const rtattr*>(p); RTA_OK(a, left); a = RTA_NEXT(a, left)) {
          if ((a->rta_type & NLA_TYPE_MASK) != CTA_TUPLE_ORIG) continue;
          int proto = -1;
          int tl = static_cast<int>(RTA_PAYLOAD(a));
          for (auto* t = static_cast<const rtattr*>(RTA_DATA(a)); RTA_OK(t, tl);
               t = RTA_NEXT(t, tl)) {
            if ((t->rta_type & NLA_TYPE_MASK) != CTA_TUPLE_PROTO) continue;
            int pl = static_cast<int>(RTA_PAYLOAD(t));
            for (auto* q = static_cast<const rtattr*>(RTA_DATA(t)); RTA_OK(q, pl);
                 q = RTA_NEXT(q, pl))
              if ((q->rta_type & NLA_TYPE_MASK) == CTA_PROTO_NUM && RTA_PAYLOAD(q) >= 1)
                proto = *static_cast<const uint8_t*>(RTA_DATA(q));
          }
          if (proto >= 0 && proto != IPPROTO_TCP)
            tuples.emplace_back(reinterpret_cast<const char*>(a), a->rta_len);
        }
      }).WithContext("dump conntrack"));
  int deleted = 0;
  for (const std::string& t : tuples) {
    Msg del(static_cast<uint16_t>((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE), 0, &nfg,
            sizeof nfg);
    del.Raw(t.data(), t.size());
    Status s = Talk(del);
    if (s.ok())
      ++deleted;
    else if (s.error_number() != ENOENT)
      return s.WithContext("delete a conntrack entry");
  }
  return deleted;
}

Status Netlink::BindNflog(uint16_t group, uint32_t copy_range) {
  nfgenmsg nfg{};
  nfg.nfgen_family = AF_UNSPEC;
  nfg.version = NFNETLINK_V0;
  nfg.res_id = htons(group);
  const auto type = static_cast<uint16_t>((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG);
  Msg bind(type, 0, &nfg, sizeof nfg);
  nfulnl_msg_config_cmd cmd{NFULNL_CFG_CMD_BIND};
  bind.Attr(NFULA_CFG_CMD, &cmd, sizeof cmd);
  DSEC_RETURN_IF_ERROR(Talk(bind).WithContext("bind NFLOG group " + std::to_string(group)));
  Msg mode(type, 0, &nfg, sizeof nfg);
  nfulnl_msg_config_mode m{};
  m.copy_range = htonl(copy_range);
  m.copy_mode = NFULNL_COPY_PACKET;
  mode.Attr(NFULA_CFG_MODE, &m, sizeof m);
  uint32_t one = htonl(1);  // each packet at once (the default batches 100, or waits 1 s)
  mode.Attr(NFULA_CFG_QTHRESH, &one, sizeof one);
  return Talk(mode).WithContext("NFLOG copy mode");
}

}  // namespace dsec::net
