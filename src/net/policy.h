// A sandbox's network policy (API `network`): the mode, CIDR/port/protocol rules and domain
// names, parsed and checked from JSON and rendered back. Pure values; net/node_network.h
// enforces them.
//
//   {"mode": "none"}                                   loopback only (the default)
//   {"mode": "allowlist", "rules": [{"cidr": "198.51.100.0/24", "ports": "443,8000-8100",
//    "proto": "tcp"}], "domains": ["pypi.org", "*.pythonhosted.org"]}
//   {"mode": "open", "rules": [...]}                   public addresses, plus private ones a
//                                                      rule names
// `ports`: a number, "a-b", a comma-separated list of those, or a JSON list of them; absent:
// every port. `proto`: tcp, udp, icmp or any (default: any = all three); icmp takes no ports.
// `cidr`: IPv4 only ("a.b.c.d" is a /32), no host bits set.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::net {

enum class NetMode { kNone, kAllowlist, kOpen };
std::string_view NetModeName(NetMode m);

inline constexpr uint8_t kTcp = 1, kUdp = 2, kIcmp = 4, kAnyProto = kTcp | kUdp | kIcmp;

struct PortRange {
  uint16_t lo = 0, hi = 65535;
  bool operator==(const PortRange&) const = default;
};

struct Rule {
  uint32_t addr = 0;  // host byte order, host bits clear
  uint8_t prefix = 32;
  uint8_t protos = kAnyProto;
  std::vector<PortRange> ports;  // sorted, merged; empty: every port
  bool operator==(const Rule&) const = default;
};

struct NetworkPolicy {
  NetMode mode = NetMode::kNone;
  std::vector<Rule> rules;
  std::vector<std::string> domains;  // lowercased; "*.example.org" matches subdomains only
  bool operator==(const NetworkPolicy&) const = default;
};

inline constexpr size_t kMaxRules = 256, kMaxDomains = 256, kMaxPortRanges = 64;

// Null or absent JSON is mode none. Errors are InvalidArgument naming the field.
StatusOr<NetworkPolicy> ParsePolicy(const Json* j);
Json ToJson(const NetworkPolicy& p);

// "a.b.c.d" for a host-order address; parsing is strict dotted quad.
std::string Ipv4ToString(uint32_t addr);
bool ParseIpv4(std::string_view s, uint32_t* addr);
// "a.b.c.d/n" (or a bare address: /32) into a network; false if malformed.
bool ParseCidr(std::string_view s, uint32_t* addr, uint8_t* prefix, bool* host_bits = nullptr);
inline uint32_t PrefixMask(uint8_t prefix) {
  return prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
}

// Whether `name` (a DNS name, lowercased, without the final dot) is one the policy lists.
bool DomainAllowed(const NetworkPolicy& p, std::string_view name);

}  // namespace dsec::net
