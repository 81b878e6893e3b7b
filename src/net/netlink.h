// A small rtnetlink / ctnetlink client: what the node network needs, with no library. Every
// request is acknowledged (NLM_F_ACK) and its error returned. A socket works in the network
// namespace it was opened in (the caller's thread's), whatever thread uses it later.
// Thread safety: one Netlink per thread at a time.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::net {

// A socket made in the network namespace `netns_fd` (on a short-lived thread: no caller thread
// ever changes namespace); it stays in that namespace wherever it is used.
StatusOr<UniqueFd> SocketIn(int netns_fd, int domain, int type, int protocol);

class Netlink {
 public:
  // protocol: NETLINK_ROUTE or NETLINK_NETFILTER.
  static StatusOr<Netlink> Open(int protocol);
  // A socket opened elsewhere (in another namespace), bound or not.
  static Netlink FromFd(UniqueFd fd) { return Netlink(std::move(fd)); }

  // A veth pair: `host` here, up; `peer` created in the namespace `peer_netns_fd`, down (it
  // can only go up once both ends exist: bring it up from a socket in that namespace).
  Status CreateVeth(const std::string& host, const std::string& peer, int peer_netns_fd);
  // A bridge with no ports and no multicast, up: a stable home for an address.
  Status CreateBridge(const std::string& name);
  Status DeleteLink(int ifindex);
  Status SetUp(int ifindex);
  // A token bucket (tc tbf) as the root qdisc of an interface: `rate` bytes/s, bursts of
  // `burst` bytes, up to `latency_ms` of queue.
  Status SetTokenBucket(int ifindex, uint64_t rate, uint32_t burst, uint32_t latency_ms);
  // The index of a link in this socket's namespace, or NotFound.
  StatusOr<int> LinkIndex(const std::string& name);
  // addr in host byte order.
  Status AddAddress4(int ifindex, uint32_t addr, uint8_t prefix);
  // A route to dst/prefix through `oif`; gateway 0: directly on the link. `onlink`: the
  // gateway is on the link even though no address covers it.
  Status AddRoute4(uint32_t dst, uint8_t prefix, int oif, uint32_t gateway, bool onlink);
  // The interface of the main table's IPv4 default route, or NotFound.
  StatusOr<std::string> DefaultRouteInterface();
  // NETLINK_NETFILTER: deletes every IPv4 conntrack entry whose mark & mask == mark.
  Status FlushConntrack(uint32_t mark, uint32_t mask);
  // NETLINK_NETFILTER: deletes the IPv4 conntrack entries whose mark & mask == mark and whose
  // protocol is not TCP (UDP, ICMP, ...); returns how many went.
  StatusOr<int> FlushConntrackButTcp(uint32_t mark, uint32_t mask);
  // NETLINK_NETFILTER: receives the packets nftables logs to NFLOG `group`, the first
  // `copy_range` bytes of each (their IP header on), as NFULNL_MSG_PACKET messages on fd().
  Status BindNflog(uint16_t group, uint32_t copy_range);
  int fd() const { return fd_.get(); }

 private:
  explicit Netlink(UniqueFd fd) : fd_(std::move(fd)) {}
  class Msg;
  // Sends and reads until the ack (or, for dumps, NLMSG_DONE); `on_reply` sees every other
  // message of the answer.
  template <typename F>
  Status Talk(Msg& m, F&& on_reply);
  Status Talk(Msg& m);

  UniqueFd fd_;
  uint32_t seq_ = 0;
};

}  // namespace dsec::net
