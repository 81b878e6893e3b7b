#include "net/deny_log.h"

#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace dsec::net {

bool DecodeDenied(std::string_view p, DeniedPacket* out) {
  if (p.size() < 20 || (static_cast<uint8_t>(p[0]) >> 4) != 4) return false;
  size_t ihl = (static_cast<uint8_t>(p[0]) & 0xf) * 4u;
  if (ihl < 20 || ihl > p.size()) return false;
  auto u32 = [&](size_t o) {
    return static_cast<uint32_t>(static_cast<uint8_t>(p[o])) << 24 |
           static_cast<uint32_t>(static_cast<uint8_t>(p[o + 1])) << 16 |
           static_cast<uint32_t>(static_cast<uint8_t>(p[o + 2])) << 8 |
           static_cast<uint8_t>(p[o + 3]);
  };
  out->proto = static_cast<uint8_t>(p[9]);
  out->src = u32(12);
  out->dst = u32(16);
  out->dport = 0;
  if ((out->proto == IPPROTO_TCP || out->proto == IPPROTO_UDP) && ihl + 4 <= p.size())
    out->dport = static_cast<uint16_t>(static_cast<uint8_t>(p[ihl + 2]) << 8 |
                                       static_cast<uint8_t>(p[ihl + 3]));
  return true;
}

StatusOr<std::unique_ptr<DenyLog>> DenyLog::Start(uint16_t group,
                                                  std::function<void(const DeniedPacket&)> cb) {
  DSEC_ASSIGN_OR_RETURN(Netlink nl, Netlink::Open(NETLINK_NETFILTER));
  DSEC_RETURN_IF_ERROR(nl.BindNflog(group, 64));
  timeval tv{0, 300000};  // how often the thread looks at stop_
  setsockopt(nl.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::unique_ptr<DenyLog> d(new DenyLog(std::move(nl)));
  d->cb_ = std::move(cb);
  d->thread_ = std::thread([p = d.get()] { p->Loop(); });
  return d;
}

DenyLog::~DenyLog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void DenyLog::Loop() {
  alignas(nlmsghdr) char buf[8192];
  while (!stop_) {
    ssize_t n = recv(nl_.fd(), buf, sizeof buf, 0);
    if (n <= 0) continue;  // timeout, or ENOBUFS after a burst: what was lost is lost
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(len));
         h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET)) continue;
      const char* p = static_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(nfgenmsg));
      const char* end = reinterpret_cast<const char*>(h) + h->nlmsg_len;
      while (p + sizeof(nlattr) <= end) {
        const auto* a = reinterpret_cast<const nlattr*>(p);
        if (a->nla_len < sizeof(nlattr) || p + a->nla_len > end) break;
        if ((a->nla_type & NLA_TYPE_MASK) == NFULA_PAYLOAD) {
          DeniedPacket d;
          if (DecodeDenied(std::string_view(p + NLA_HDRLEN, a->nla_len - NLA_HDRLEN), &d)) cb_(d);
        }
        p += NLA_ALIGN(a->nla_len);
      }
    }
  }
}

}  // namespace dsec::net
