// The nftables text of the node's sandbox network (node_network.h), rendered by pure functions:
// everything the kernel is told about sandbox traffic is here, reviewable in one place and
// tested without root against golden files (net/testdata/*.nft); NodeNetwork only runs it and
// keeps the state that decides which of these it runs.
//
// Names in the table, per sandbox address a (hex x = %08x of a):
//   sb_x    its policy's chain (dispatched to from `from_sandbox` while its mode is not none)
//   dns_x   the addresses its allowed domains resolved to, with their TTLs as timeouts
//   dn_x    the counter of its refused packets
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "net/dns.h"
#include "net/policy.h"

namespace dsec::net {

// An IPv4 network, host byte order.
struct Ipv4Net {
  uint32_t base = 0;
  uint8_t prefix = 32;

  uint32_t gateway() const { return base + 1; }  // the node's address in a sandbox range
  uint64_t size() const { return uint64_t{1} << (32 - prefix); }
  bool Contains(uint32_t a) const { return (a & PrefixMask(prefix)) == base; }
  std::string ToString() const;  // "10.213.0.0/16"
  bool operator==(const Ipv4Net&) const = default;
};

// Destinations the table refuses for every policy (`never`, with the sandbox range after the
// first): this host (0/8), loopback, link-local and metadata, multicast and reserved.
inline constexpr Ipv4Net kNeverNets[] = {
    {0x00000000, 8}, {0x7f000000, 8}, {0xa9fe0000, 16}, {0xe0000000, 3}};
// Private ranges (`private`): reachable only where a rule names them.
inline constexpr Ipv4Net kPrivateNets[] = {{0x0a000000, 8},  {0x64400000, 10}, {0xac100000, 12},
                                           {0xc0000000, 24}, {0xc0a80000, 16}, {0xc6120000, 15}};

// The node's sandbox range (network_cidr): an IPv4 network from /8 to /28 without host bits.
// Parsed once, where the configuration is read; everything after takes the Ipv4Net.
StatusOr<Ipv4Net> ParseSandboxRange(std::string_view cidr);

// What names the node's table and what its shared rules say.
struct NodeTable {
  std::string table;        // dsec_<tag>
  std::string bridge;       // the gateway's port-less bridge
  std::string veth_prefix;  // host ends of the sandboxes' veths: <prefix>*
  std::string uplink;
  Ipv4Net range;
  uint32_t max_conns = 1024;
  uint32_t new_conns_per_s = 200;  // burst: twice this
  int log_group = -1;              // NFLOG group for refused packets; -1: not logged
};

// The whole table (created atomically in place of a crashed run's; see node_network.h).
std::string RenderTable(const NodeTable& t);
// A newly attached sandbox: its (ifname . address) binding, conntrack mark, counter, DNS set
// and an empty chain. Until its policy is applied nothing dispatches to it: all is refused.
std::string RenderAttach(const std::string& table, uint32_t addr, const std::string& host_if);
// Replaces its policy's rules; `dispatched`: whether it is in the dispatch map now (its old
// mode was not none). The domains' resolved addresses are flushed with the old rules.
std::string RenderPolicy(const std::string& table, uint32_t addr, const NetworkPolicy& p,
                         bool dispatched);
// Removes everything RenderAttach and RenderPolicy made.
std::string RenderDetach(const std::string& table, uint32_t addr, const std::string& host_if,
                         bool dispatched);
// Lets `sandbox` reach `addrs` until their TTLs (1 s to a day) end; a shorter earlier timeout
// of the same address is replaced (add + delete + add in one transaction).
std::string RenderAllowResolved(const std::string& table, uint32_t sandbox,
                                const std::vector<dns::Address>& addrs);
// "%08x": how an address names its objects in the table (and the edge its veths).
std::string Hex8(uint32_t v);
// The counter of a sandbox's refused packets.
std::string CounterName(uint32_t addr);

}  // namespace dsec::net
