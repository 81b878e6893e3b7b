// A sandbox's network policy: the mode, CIDR/port/protocol rules and domain names, built and
// checked from typed parts (the REST layer's JSON is api/network_json.h). Pure values;
// net/node_network.h enforces them.
//
//   none       loopback only (the default)
//   allowlist  only the rules' destinations and the domains' resolved addresses
//   open       public addresses, plus private ones a rule names
// Ports: a number, "a-b", or a comma-separated list of those; none: every port. Protocols:
// tcp, udp, icmp or any (= all three); icmp takes no ports. CIDRs: IPv4 only ("a.b.c.d" is a
// /32), no host bits set. Domains: "pypi.org", or "*.example.org" for its subdomains.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

// The parts, each checked on its own; errors are InvalidArgument saying what is wrong.
StatusOr<NetMode> ParseNetMode(std::string_view name);
StatusOr<uint8_t> ParseProto(std::string_view name);  // tcp | udp | icmp | any
std::string_view ProtoName(uint8_t protos);
// Appends "443", "8000-8100" or "443,8000-8100" to `ports`.
Status AddPorts(std::string_view text, std::vector<PortRange>* ports);
std::string PortsText(const std::vector<PortRange>& ports);  // "443-444,8000-8100"
// A rule from its CIDR text; `ports` (as AddPorts gave them; empty: every port) are sorted
// and merged.
StatusOr<Rule> MakeRule(std::string_view cidr, uint8_t protos = kAnyProto,
                        std::vector<PortRange> ports = {});
// Lowercased, without a final dot; InvalidArgument unless a DNS name or "*." and one.
StatusOr<std::string> NormalizeDomain(std::string_view name);
// A policy from checked parts: duplicates dropped, limits and the mode's rules checked.
StatusOr<NetworkPolicy> MakePolicy(NetMode mode, std::vector<Rule> rules,
                                   std::vector<std::string> domains);

// Typed construction for code and tests; the first error is Build()'s:
//   PolicyBuilder(NetMode::kAllowlist).Allow("198.51.100.0/24", "443", "tcp")
//       .Domain("pypi.org").Build()
class PolicyBuilder {
 public:
  explicit PolicyBuilder(NetMode mode) : mode_(mode) {}
  PolicyBuilder& Allow(std::string_view cidr, std::string_view ports = "",
                       std::string_view proto = "any");
  PolicyBuilder& Domain(std::string_view name);
  StatusOr<NetworkPolicy> Build() const;

 private:
  NetMode mode_;
  std::vector<Rule> rules_;
  std::vector<std::string> domains_;
  Status error_;
};

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
