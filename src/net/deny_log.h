// Packets the node's policy refused, as the kernel hands them to the edge over NFLOG (the
// ruleset logs at most a few a minute per sandbox, so a port scan cannot flood the audit log),
// decoded to what an audit line needs. One thread; the callback runs on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>

#include "base/status.h"
#include "net/netlink.h"

namespace dsec::net {

struct DeniedPacket {
  uint32_t src = 0, dst = 0;  // host byte order
  uint8_t proto = 0;          // IPPROTO_*
  uint16_t dport = 0;         // TCP/UDP only
  bool ipv6 = false;          // an IPv6 destination (dst 0): refused at connect only
  bool at_connect = false;    // refused at connect()/send by the egress guard, not nftables
};

// The IPv4 header (and the ports after it) at the start of `packet`; false if it is not one.
bool DecodeDenied(std::string_view packet, DeniedPacket* out);

class DenyLog {
 public:
  static StatusOr<std::unique_ptr<DenyLog>> Start(uint16_t group,
                                                  std::function<void(const DeniedPacket&)> cb);
  ~DenyLog();  // stops and joins

 private:
  explicit DenyLog(Netlink nl) : nl_(std::move(nl)) {}
  void Loop();

  Netlink nl_;
  std::function<void(const DeniedPacket&)> cb_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsec::net
