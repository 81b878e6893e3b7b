// The node's sandbox network: each sandbox that has one gets a veth from its own network
// namespace (eth0 there) to this node, a /32 address from a node-local range, and egress
// through NAT on the uplink, policed by this edge's own nftables table.
//
// Layout (all made narrowly, all removed by Stop):
//   - a port-less bridge `dsg<tag>` holding the gateway address (the first of the range), which
//     every sandbox reaches over its veth (the kernel answers ARP for local addresses);
//   - per sandbox: host veth `dsv<tag><n>` (forwarding on for it alone), a /32 route to it;
//     in the sandbox: eth0 with the /32 and `default via gateway onlink`, IPv6 off;
//   - IPv4 forwarding on the uplink (restored to what it was on Stop, also after a crash);
//   - `table inet dsec_<tag>`: the forward hook sends sandbox traffic through an anti-spoofing
//     check (interface . address), per-sandbox connection and new-connection-rate caps, a
//     never-reachable set (the range itself, loopback, link-local/metadata, multicast), then
//     the sandbox's own chain (its rules; for `open` every address outside private ranges)
//     and otherwise a reject (TCP reset / ICMP admin-prohibited) counted per sandbox. Every
//     packet a sandbox sends is checked, so a policy change cuts an established connection at
//     its next packet. Nothing may open a connection into a sandbox; the input hook refuses
//     everything from sandboxes to the node itself; postrouting masquerades to the uplink.
// Conntrack entries of a sandbox carry its address as mark and are flushed when it goes.
// Destroying a sandbox drops its namespace (the kernel removes the veth pair and its route).
//
// Thread safety: all methods are thread-safe. Privileges: CAP_NET_ADMIN, CAP_SYS_ADMIN.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "net/deny_log.h"
#include "net/dns_forwarder.h"
#include "net/egress_guard.h"
#include "net/policy.h"
#include "net/ruleset.h"

struct nft_ctx;

namespace dsec::net {

class Netlink;

struct NodeNetworkOptions {
  Ipv4Net range{0x0ad50000, 16};   // node-local, /8 to /28 (ParseSandboxRange): 10.213.0.0/16
  std::string uplink;              // empty: the interface of the IPv4 default route
  std::string tag;                 // 1-6 of [0-9a-z]: names the table, bridge and veths
  std::string state_file;          // remembers the uplink's forwarding setting across crashes
  uint32_t max_conns = 1024;       // tracked connections per sandbox
  uint32_t new_conns_per_s = 200;  // new connections per second per sandbox (burst: 2x)
  // A container sandbox's bandwidth each way, Mbit/s (a tbf qdisc on both ends of its veth:
  // the host end shapes what it receives, eth0 what it sends); 0: none. MicroVMs: not capped.
  uint32_t bandwidth_mbit = 0;
  // Where the DNS forwarder sends queries: "a.b.c.d" or "a.b.c.d:port"; empty: the first
  // nameserver of /etc/resolv.conf. Without one, policies with domains are refused.
  std::string dns_upstream;
  // The longest an address from a DNS answer stays allowed (DnsForwarderOptions::max_ttl_s).
  uint32_t dns_max_ttl_s = 3600;
  // Called (on a thread of its own) for refused packets: at most 6 a minute per sandbox (burst
  // 5), with the label its Attach gave. Unset: none are logged.
  std::function<void(const std::string& label, const DeniedPacket& p)> on_denied;
};

// The node's network as configured, checked without changing anything (edge start, and
// GET /v1/node): `config` is a configuration error (a network_cidr or network_dns that does
// not parse: the edge refuses to start); `node` a problem of the node (no default route, an
// uplink that is not an interface, a network_cidr whose gateway address is already a local
// address of someone else): creates that need a network answer 503 with it.
struct NetworkCheck {
  Status config;
  Status node;
  std::string uplink;        // what it would use
  std::string dns_upstream;  // "a.b.c.d:port"; empty: none (dns_error says why)
  std::string dns_error;
  uint32_t dns_addr = 0;  // host byte order
  uint16_t dns_port = 53;
};
NetworkCheck CheckNodeNetwork(const NodeNetworkOptions& o);

// Sends one query (". NS") to a DNS upstream and waits up to timeout_ms for any answer with
// its id: OK, or why not (no reply, refused).
Status ProbeDnsUpstream(uint32_t addr, uint16_t port, int timeout_ms);

// A sandbox's end of the network, as an adoption handle keeps it.
struct NetAttachment {
  uint32_t addr = 0;    // host byte order; 0: none
  std::string host_if;  // the host end of its veth
  explicit operator bool() const { return addr != 0; }
};

class NodeNetwork {
 public:
  static StatusOr<std::unique_ptr<NodeNetwork>> Start(NodeNetworkOptions opts);
  ~NodeNetwork();

  // Gives the namespace eth0 (a veth to this node) and an address; everything is refused
  // until Apply.
  // `label` names the sandbox in on_denied.
  // With `initial`, its policy is in force from the same nftables transaction (one fewer per
  // networked create); without, everything is refused until Apply.
  StatusOr<NetAttachment> Attach(int netns_fd, const std::string& label = "",
                                 const NetworkPolicy* initial = nullptr);
  // A microVM's end: a tap device on the node, named, routed and filtered as a veth's host
  // end is; *tap is its descriptor, for QEMU (-netdev tap,fd=). The guest gives its NIC the
  // attachment's address. The tap is not persistent: it goes, with its route, when the last
  // descriptor closes (QEMU's exit).
  StatusOr<NetAttachment> AttachTap(UniqueFd* tap, const std::string& label = "");
  // After an edge restart: the veth and route still exist; this takes the address again and
  // re-creates its rules.
  Status Readopt(const NetAttachment& a, const std::string& label = "");
  // Replaces the sandbox's policy (mode none: everything refused), atomically; then drops the
  // UDP/ICMP flows the old one let in.
  Status Apply(const NetAttachment& a, const NetworkPolicy& p);
  // Removes its rules and conntrack entries and frees the address (the veth goes with the
  // namespace).
  void Detach(const NetAttachment& a);
  // A live change to mode none: deletes the veth (both ends: the sandbox is left with loopback
  // only, as if it never had a network), then detaches. The address is free only once its
  // route has gone with the veth.
  void Unplug(const NetAttachment& a);
  // Packets the policy refused from this sandbox, and from all.
  uint64_t Denied(const NetAttachment& a);
  uint64_t DeniedTotal();
  // Lets `sandbox` reach `addrs` (the DNS forwarder's answers for it) until their TTLs end.
  void AllowResolved(uint32_t sandbox, const std::vector<dns::Address>& addrs);
  // The policy in force for a sandbox address; nullopt if none is attached there.
  std::optional<NetworkPolicy> PolicyFor(uint32_t addr);
  // Removes the table, the gateway bridge and the uplink's forwarding. Sandboxes still
  // attached lose their egress.
  void Stop();

  // The second layer of container sandboxes' egress (egress_guard.h); null if the kernel has
  // none to give: guard_error() says why.
  EgressGuard* guard() const { return guard_.get(); }
  const std::string& guard_error() const { return guard_error_; }

  uint32_t gateway() const { return gateway_; }
  const std::string& uplink() const { return uplink_; }
  const std::string& table() const { return table_; }
  std::string Describe() const;
  // The DNS forwarder's view of its upstream: "ok" (it answered last), "unreachable" (the last
  // query got no answer: lookups fail at once until a probe gets one), "unknown" (no query yet)
  // or "none" (no forwarder: dns_error() says why).
  std::string DnsState() const;
  const std::string& dns_error() const { return dns_error_; }

 private:
  explicit NodeNetwork(NodeNetworkOptions o) : opts_(std::move(o)) {}
  Status Init();
  // Runs nft commands as one transaction.
  Status Nft(const std::string& cmds) DSEC_REQUIRES(mu_);
  // Apply's rules; *had_flows: the old policy let traffic out (its flows may outlive it).
  Status ApplyRules(const NetAttachment& a, const NetworkPolicy& p, bool* had_flows);
  StatusOr<std::string> NftOutput(const std::string& cmds) DSEC_REQUIRES(mu_);
  std::string Ruleset() const;
  std::string AttachCmds(uint32_t addr, const std::string& host_if) const;
  StatusOr<uint32_t> AllocateAddress() DSEC_REQUIRES(mu_);
  // An address and a host interface name for a new attachment (released by ReleaseAddress).
  StatusOr<NetAttachment> Reserve();
  void ReleaseAddress(uint32_t addr);
  // The host side of a new attachment whose interface exists: no IPv6, forwarding, the route
  // to its address, its rules; on failure the interface is deleted and the address released.
  StatusOr<NetAttachment> FinishAttach(Netlink& rtnl, NetAttachment a, const std::string& label,
                                       const NetworkPolicy* initial);
  // Whether this node can enforce `p` (its domains need the DNS forwarder).
  Status CanEnforce(const NetworkPolicy& p) const;
  Status SetUplinkForwarding();
  void StartDns();
  void StartGuard();
  // The bandwidth cap on one end of a sandbox's veth.
  Status Shape(Netlink& nl, int ifindex) const;
  // on_denied for a refusal from the sandbox at p.src (nothing if none is attached there).
  void Denied(const DeniedPacket& p);

  NodeNetworkOptions opts_;
  uint32_t base_ = 0, gateway_ = 0;
  uint8_t prefix_ = 16;
  std::string uplink_, table_, bridge_, veth_prefix_;
  std::string uplink_forwarding_before_;

  mutable Mutex mu_;
  nft_ctx* nft_ DSEC_GUARDED_BY(mu_) = nullptr;
  std::vector<bool> used_ DSEC_GUARDED_BY(mu_);  // by offset in the range
  uint32_t next_ DSEC_GUARDED_BY(mu_) = 2;
  uint32_t veth_counter_ DSEC_GUARDED_BY(mu_) = 0;
  struct Attached {
    bool dispatched = false;  // in the dispatch map (mode other than none)
    NetworkPolicy policy;
    std::string label;
  };
  std::map<uint32_t, Attached> attached_ DSEC_GUARDED_BY(mu_);
  std::string dns_error_;  // why there is no forwarder
  NetworkCheck check_;     // what Init found (uplink, DNS upstream)
  std::unique_ptr<DnsForwarder> dns_;
  std::unique_ptr<DenyLog> deny_log_;
  std::unique_ptr<EgressGuard> guard_;
  std::string guard_error_;
  uint16_t log_group_ = 0;
  bool stopped_ DSEC_GUARDED_BY(mu_) = false;
};

// The node network, started at its first use (nothing on the host changes before) and kept.
// A start that fails is retried at the next use. Thread-safe.
class LazyNodeNetwork {
 public:
  explicit LazyNodeNetwork(NodeNetworkOptions o) : opts_(std::move(o)) {}
  // Every failure to start is the node's, not the caller's: Unavailable, with the reason.
  StatusOr<NodeNetwork*> Get();
  NodeNetwork* IfStarted();
  void Stop();  // when started

  // What GET /v1/node shows: the settings, whether it works (started, or its check passed),
  // the reason when not, and the DNS upstream's state.
  struct Info {
    bool started = false;
    std::string reason;  // empty: fine as far as known
    std::string cidr, uplink, dns_upstream;
    std::string dns_state;  // "ok", "unreachable", "unknown", "none"
    std::string dns_error;
    std::string egress_guard;  // "on", or why not; empty: not started
  };
  Info Describe();
  // Checks the node (CheckNodeNetwork) and, when it has a DNS upstream, probes it (a second
  // or two: call it off the start path). Logs what is wrong.
  NetworkCheck Check();
  void ProbeDns();

 private:
  NodeNetworkOptions opts_;
  Mutex mu_;
  std::unique_ptr<NodeNetwork> net_ DSEC_GUARDED_BY(mu_);
  NetworkCheck check_ DSEC_GUARDED_BY(mu_);
  std::string start_error_ DSEC_GUARDED_BY(mu_);
  std::string dns_probe_ DSEC_GUARDED_BY(mu_);  // "": not probed; "ok"; else the error
};

}  // namespace dsec::net
