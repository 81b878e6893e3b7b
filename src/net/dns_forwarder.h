// The node's DNS forwarder for sandboxes: listens on the sandbox gateway (UDP port 53) and
// answers only what the asking sandbox's policy allows (identified by its source address,
// which the node's anti-spoofing rules vouch for). Allowlist: listed domains are resolved
// upstream and every A record of the answer is allowed for that sandbox for the record's TTL
// (before the answer is sent, so the connection right after it works); other names are
// NXDOMAIN. Open: every name is forwarded. AAAA is answered empty (sandboxes have IPv4 only).
// Unknown or `none` sources get nothing. One thread, non-blocking: at most 512 queries
// upstream at once, 8 per sandbox, each answered SERVFAIL after 3 s without an upstream reply.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "net/dns.h"
#include "net/policy.h"

namespace dsec::net {

class DnsForwarder {
 public:
  using PolicyFn = std::function<std::optional<NetworkPolicy>(uint32_t source)>;
  using AllowFn = std::function<void(uint32_t source, const std::vector<dns::Address>& addrs)>;
  // listen and upstream: host byte order addresses.
  static StatusOr<std::unique_ptr<DnsForwarder>> Start(uint32_t listen_addr, uint32_t upstream,
                                                       uint16_t upstream_port, PolicyFn policy,
                                                       AllowFn allow);
  ~DnsForwarder();  // stops and joins
  uint64_t answered() const { return answered_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  DnsForwarder() = default;
  void Loop();

  UniqueFd sock_, stop_;
  sockaddr_in upstream_{};
  PolicyFn policy_;
  AllowFn allow_;
  std::thread thread_;
  std::atomic<uint64_t> answered_{0}, refused_{0};
};

// The first IPv4 nameserver in a resolv.conf text; nullopt if none.
std::optional<uint32_t> FirstNameserver(const std::string& resolv_conf);

}  // namespace dsec::net
