// The node's DNS forwarder for sandboxes: listens on the sandbox gateway (UDP port 53) and
// answers only what the asking sandbox's policy allows (identified by its source address,
// which the node's anti-spoofing rules vouch for).
// - Allowlist: listed domains are resolved upstream; the A records of the name's own answer
//   (owned by the name or a name on its CNAME chain, at most dns::kMaxCnameChain links) are
//   allowed for that sandbox for the record's TTL, at least a minute (unless the cap is less)
//   and at most max_ttl_s, before the answer is sent, so the connection right after it works.
//   Other names are NXDOMAIN. Open: every name is forwarded.
// - A queries are answered with just that chain and those records (any other A record of the
//   upstream's answer is neither allowed nor passed on); other types as the upstream answered.
//   AAAA is answered empty (sandboxes have IPv4 only).
// - Names with a label holding a byte no host name has ('.', NUL...: dns::Question::odd_label)
//   are REFUSED in every mode: the policy would judge another name than the one resolved.
// - Upstream queries carry an id of the forwarder's own (getrandom), never the sandbox's, so a
//   sandbox cannot help a spoofed answer along; a reply counts only with that id and the same
//   question, and the sandbox gets its own id back.
// - Unknown or `none` sources get nothing. One thread, non-blocking: at most 512 queries
//   upstream at once, 8 per sandbox, each answered SERVFAIL after 3 s without an upstream reply.
// - An upstream that left a query unanswered (or refused it) is marked unreachable and logged:
//   queries are then answered SERVFAIL at once, so tools fail fast instead of waiting out their
//   resolver's retries, except one every 2 s, which goes upstream as a probe; its answer marks
//   the upstream reachable again.
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

struct DnsForwarderOptions {
  // The longest an answer's address stays allowed (edge config network_dns_max_ttl_s), and the
  // longest TTL the sandbox is told: an upstream's day-long TTL would otherwise keep an address
  // open long after the name moved away from it.
  uint32_t max_ttl_s = 3600;
  uint16_t listen_port = 53;  // 0: any free port (tests; see DnsForwarder::port())
};

class DnsForwarder {
 public:
  using PolicyFn = std::function<std::optional<NetworkPolicy>(uint32_t source)>;
  using AllowFn = std::function<void(uint32_t source, const std::vector<dns::Address>& addrs)>;
  using Options = DnsForwarderOptions;
  // listen and upstream: host byte order addresses. `allow` gets TTLs already bounded.
  static StatusOr<std::unique_ptr<DnsForwarder>> Start(uint32_t listen_addr, uint32_t upstream,
                                                       uint16_t upstream_port, PolicyFn policy,
                                                       AllowFn allow, Options options = {});
  ~DnsForwarder();                         // stops and joins
  uint16_t port() const { return port_; }  // where it listens
  uint64_t answered() const { return answered_.load(); }
  uint64_t refused() const { return refused_.load(); }
  uint64_t failed_fast() const { return failed_fast_.load(); }
  enum class Upstream { kUnknown, kOk, kUnreachable };
  Upstream upstream() const { return static_cast<Upstream>(upstream_state_.load()); }

 private:
  DnsForwarder() = default;
  void Loop();

  UniqueFd sock_, stop_;
  uint16_t port_ = 0;
  Options options_;
  sockaddr_in upstream_{};
  PolicyFn policy_;
  AllowFn allow_;
  std::thread thread_;
  std::atomic<uint64_t> answered_{0}, refused_{0}, failed_fast_{0};
  std::atomic<int> upstream_state_{0};  // an Upstream
};

// The first IPv4 nameserver in a resolv.conf text; nullopt if none.
std::optional<uint32_t> FirstNameserver(const std::string& resolv_conf);

}  // namespace dsec::net
