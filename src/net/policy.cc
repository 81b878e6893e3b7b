#include "net/policy.h"

#include <algorithm>

#include "base/enum_names.h"
#include "base/strings.h"

namespace dsec::net {

namespace {

bool ParseUint(std::string_view s, uint32_t max, uint32_t* out) {
  if (s.empty() || s.size() > 10) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > max) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

constexpr EnumName<uint8_t> kProtos[] = {
    {kAnyProto, "any"}, {kTcp, "tcp"}, {kUdp, "udp"}, {kIcmp, "icmp"}};
constexpr EnumName<NetMode> kNetModes[] = {
    {NetMode::kNone, "none"}, {NetMode::kAllowlist, "allowlist"}, {NetMode::kOpen, "open"}};
}  // namespace

std::string_view NetModeName(NetMode m) { return NameIn(kNetModes, m); }

std::string Ipv4ToString(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "." +
         std::to_string((a >> 8) & 255) + "." + std::to_string(a & 255);
}

bool ParseIpv4(std::string_view s, uint32_t* addr) {
  auto parts = SplitString(s, '.', /*skip_empty=*/false);
  if (parts.size() != 4) return false;
  uint32_t a = 0;
  for (auto p : parts) {
    uint32_t v = 0;
    if (p.size() > 3 || (p.size() > 1 && p[0] == '0') || !ParseUint(p, 255, &v)) return false;
    a = a << 8 | v;
  }
  *addr = a;
  return true;
}

bool ParseCidr(std::string_view s, uint32_t* addr, uint8_t* prefix, bool* host_bits) {
  size_t slash = s.find('/');
  uint32_t a = 0, plen = 32;
  if (!ParseIpv4(s.substr(0, slash), &a)) return false;
  if (slash != std::string_view::npos) {
    auto p = s.substr(slash + 1);
    if ((p.size() > 1 && p[0] == '0') || !ParseUint(p, 32, &plen)) return false;
  }
  *prefix = static_cast<uint8_t>(plen);
  if (host_bits) *host_bits = (a & ~PrefixMask(*prefix)) != 0;
  *addr = a & PrefixMask(*prefix);
  return true;
}

StatusOr<NetMode> ParseNetMode(std::string_view name) {
  if (auto m = ValueIn(kNetModes, name)) return *m;
  return InvalidArgument("network mode must be \"none\", \"allowlist\" or \"open\"");
}

StatusOr<uint8_t> ParseProto(std::string_view name) {
  if (auto p = ValueIn(kProtos, name)) return *p;
  return InvalidArgument("network rule \"proto\" must be tcp, udp, icmp or any");
}

std::string_view ProtoName(uint8_t protos) { return NameIn(kProtos, protos); }

Status AddPorts(std::string_view text, std::vector<PortRange>* ports) {
  for (std::string_view item : SplitString(text, ',', /*skip_empty=*/false)) {
    item = TrimWhitespace(item);
    uint32_t lo = 0, hi = 0;
    size_t dash = item.find('-');
    bool ok = dash == std::string_view::npos ? ParseUint(item, 65535, &lo) && (hi = lo, true)
                                             : ParseUint(item.substr(0, dash), 65535, &lo) &&
                                                   ParseUint(item.substr(dash + 1), 65535, &hi);
    if (!ok || lo > hi || lo == 0)
      return InvalidArgument("bad port \"" + std::string(item) +
                             "\" in network rule: use 1-65535, \"a-b\" or a list of those");
    ports->push_back({static_cast<uint16_t>(lo), static_cast<uint16_t>(hi)});
  }
  return OkStatus();
}

std::string PortsText(const std::vector<PortRange>& ports) {
  std::string s;
  for (auto pr : ports)
    s += (s.empty() ? "" : ",") + std::to_string(pr.lo) +
         (pr.hi != pr.lo ? "-" + std::to_string(pr.hi) : "");
  return s;
}

StatusOr<Rule> MakeRule(std::string_view cidr, uint8_t protos, std::vector<PortRange> ports) {
  Rule r;
  const std::string c(cidr);
  bool host_bits = false;
  if (c.find(':') != std::string::npos)
    return InvalidArgument("network rule " + c + ": sandboxes have IPv4 only");
  if (!ParseCidr(c, &r.addr, &r.prefix, &host_bits))
    return InvalidArgument("bad network rule cidr \"" + c + "\": use a.b.c.d/n");
  if (host_bits)
    return InvalidArgument("network rule cidr " + c + " has host bits set (did you mean " +
                           Ipv4ToString(r.addr & PrefixMask(r.prefix)) + "/" +
                           std::to_string(r.prefix) + "?)");
  if (protos == 0 || (protos & ~kAnyProto) != 0)
    return InvalidArgument("network rule \"proto\" must be tcp, udp, icmp or any");
  r.protos = protos;
  if (ports.empty()) return r;
  if (protos == kIcmp) return InvalidArgument("an icmp network rule takes no \"ports\"");
  std::sort(ports.begin(), ports.end(), [](auto a, auto b) { return a.lo < b.lo; });
  for (auto p : ports) {
    if (!r.ports.empty() && p.lo <= static_cast<uint32_t>(r.ports.back().hi) + 1)
      r.ports.back().hi = std::max(r.ports.back().hi, p.hi);
    else
      r.ports.push_back(p);
  }
  if (r.ports.size() > kMaxPortRanges)
    return InvalidArgument("a network rule takes at most " + std::to_string(kMaxPortRanges) +
                           " port ranges");
  if (r.ports.size() == 1 && r.ports[0].lo == 1 && r.ports[0].hi == 65535) r.ports.clear();
  return r;
}

StatusOr<std::string> NormalizeDomain(std::string_view name) {
  std::string d(name);
  for (char& c : d) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  if (!d.empty() && d.back() == '.') d.pop_back();
  std::string_view body = d;
  if (StartsWith(body, "*.")) body.remove_prefix(2);
  bool ok = !body.empty() && body.size() <= 253;
  for (auto label : SplitString(body, '.', /*skip_empty=*/false)) {
    ok = ok && !label.empty() && label.size() <= 63 && label.front() != '-' && label.back() != '-';
    for (char c : label)
      ok = ok && (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  }
  if (!ok)
    return InvalidArgument("bad domain \"" + std::string(name) +
                           "\" in network.domains: use a name like pypi.org or *.example.org");
  return d;
}

StatusOr<NetworkPolicy> MakePolicy(NetMode mode, std::vector<Rule> rules,
                                   std::vector<std::string> domains) {
  if (rules.size() > kMaxRules)
    return InvalidArgument("at most " + std::to_string(kMaxRules) + " network rules");
  if (domains.size() > kMaxDomains)
    return InvalidArgument("at most " + std::to_string(kMaxDomains) + " network domains");
  if (mode == NetMode::kNone && (!rules.empty() || !domains.empty()))
    return InvalidArgument("network mode \"none\" takes no rules or domains");
  NetworkPolicy p;
  p.mode = mode;
  for (auto& r : rules)
    if (std::find(p.rules.begin(), p.rules.end(), r) == p.rules.end())
      p.rules.push_back(std::move(r));
  for (auto& d : domains)
    if (std::find(p.domains.begin(), p.domains.end(), d) == p.domains.end())
      p.domains.push_back(std::move(d));
  return p;
}

PolicyBuilder& PolicyBuilder::Allow(std::string_view cidr, std::string_view ports,
                                    std::string_view proto) {
  if (!error_.ok()) return *this;
  std::vector<PortRange> ranges;
  auto protos = ParseProto(proto);
  if (!protos.ok()) {
    error_ = protos.status();
    return *this;
  }
  if (!ports.empty()) error_ = AddPorts(ports, &ranges);
  if (!error_.ok()) return *this;
  auto rule = MakeRule(cidr, *protos, std::move(ranges));
  if (rule.ok())
    rules_.push_back(std::move(*rule));
  else
    error_ = rule.status();
  return *this;
}

PolicyBuilder& PolicyBuilder::Domain(std::string_view name) {
  if (!error_.ok()) return *this;
  auto d = NormalizeDomain(name);
  if (d.ok())
    domains_.push_back(std::move(*d));
  else
    error_ = d.status();
  return *this;
}

StatusOr<NetworkPolicy> PolicyBuilder::Build() const {
  if (!error_.ok()) return error_;
  return MakePolicy(mode_, rules_, domains_);
}

bool DomainAllowed(const NetworkPolicy& p, std::string_view name) {
  for (const auto& d : p.domains) {
    if (StartsWith(d, "*.")) {
      std::string_view suffix = std::string_view(d).substr(1);  // ".example.org"
      if (name.size() > suffix.size() && name.ends_with(suffix)) return true;
    } else if (name == d) {
      return true;
    }
  }
  return false;
}

}  // namespace dsec::net
