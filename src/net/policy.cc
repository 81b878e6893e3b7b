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

Status ParsePortItem(std::string_view item, std::vector<PortRange>* out) {
  item = TrimWhitespace(item);
  uint32_t lo = 0, hi = 0;
  size_t dash = item.find('-');
  bool ok = dash == std::string_view::npos ? ParseUint(item, 65535, &lo) && (hi = lo, true)
                                           : ParseUint(item.substr(0, dash), 65535, &lo) &&
                                                 ParseUint(item.substr(dash + 1), 65535, &hi);
  if (!ok || lo > hi || lo == 0)
    return InvalidArgument("bad port \"" + std::string(item) +
                           "\" in network rule: use 1-65535, \"a-b\" or a list of those");
  out->push_back({static_cast<uint16_t>(lo), static_cast<uint16_t>(hi)});
  return OkStatus();
}

StatusOr<std::vector<PortRange>> ParsePorts(const Json& j) {
  std::vector<PortRange> out;
  auto one = [&](const Json& e) -> Status {
    if (e.is_number_unsigned()) {
      return ParsePortItem(std::to_string(e.get<uint64_t>()), &out);
    }
    if (e.is_string()) {
      const std::string& text = e.get_ref<const std::string&>();
      for (auto part : SplitString(text, ',', /*skip_empty=*/false))
        DSEC_RETURN_IF_ERROR(ParsePortItem(part, &out));
      return OkStatus();
    }
    return InvalidArgument("network rule \"ports\" must be a port, \"a-b\", \"a,b-c\" or a list");
  };
  if (j.is_array()) {
    for (const auto& e : j) DSEC_RETURN_IF_ERROR(one(e));
  } else {
    DSEC_RETURN_IF_ERROR(one(j));
  }
  if (out.empty()) return InvalidArgument("network rule \"ports\" is empty");
  std::sort(out.begin(), out.end(), [](auto a, auto b) { return a.lo < b.lo; });
  std::vector<PortRange> merged;
  for (auto r : out) {
    if (!merged.empty() && r.lo <= static_cast<uint32_t>(merged.back().hi) + 1)
      merged.back().hi = std::max(merged.back().hi, r.hi);
    else
      merged.push_back(r);
  }
  if (merged.size() > kMaxPortRanges)
    return InvalidArgument("a network rule takes at most " + std::to_string(kMaxPortRanges) +
                           " port ranges");
  if (merged.size() == 1 && merged[0].lo == 1 && merged[0].hi == 65535) merged.clear();
  return merged;
}

StatusOr<Rule> ParseRule(const Json& j) {
  if (!j.is_object()) return InvalidArgument("each network rule must be an object");
  for (const auto& [k, v] : j.items())
    if (k != "cidr" && k != "ports" && k != "proto")
      return InvalidArgument("unknown field \"network.rules[]." + k + "\"");
  Rule r;
  auto cidr = j.find("cidr");
  if (cidr == j.end() || !cidr->is_string())
    return InvalidArgument("each network rule needs a \"cidr\" such as \"198.51.100.0/24\"");
  std::string c = cidr->get<std::string>();
  bool host_bits = false;
  if (c.find(':') != std::string::npos)
    return InvalidArgument("network rule " + c + ": sandboxes have IPv4 only");
  if (!ParseCidr(c, &r.addr, &r.prefix, &host_bits))
    return InvalidArgument("bad network rule cidr \"" + c + "\": use a.b.c.d/n");
  if (host_bits)
    return InvalidArgument("network rule cidr " + c + " has host bits set (did you mean " +
                           Ipv4ToString(r.addr & PrefixMask(r.prefix)) + "/" +
                           std::to_string(r.prefix) + "?)");
  if (auto p = j.find("proto"); p != j.end() && !p->is_null()) {
    std::string s = p->is_string() ? p->get<std::string>() : "";
    if (s == "tcp")
      r.protos = kTcp;
    else if (s == "udp")
      r.protos = kUdp;
    else if (s == "icmp")
      r.protos = kIcmp;
    else if (s == "any")
      r.protos = kAnyProto;
    else
      return InvalidArgument("network rule \"proto\" must be tcp, udp, icmp or any");
  }
  if (auto p = j.find("ports"); p != j.end() && !p->is_null()) {
    if (r.protos == kIcmp) return InvalidArgument("an icmp network rule takes no \"ports\"");
    DSEC_ASSIGN_OR_RETURN(r.ports, ParsePorts(*p));
  }
  return r;
}

StatusOr<std::string> ParseDomain(const Json& j) {
  if (!j.is_string()) return InvalidArgument("\"network.domains\" must be a list of names");
  std::string d = j.get<std::string>();
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
    return InvalidArgument("bad domain \"" + j.get<std::string>() +
                           "\" in network.domains: use a name like pypi.org or *.example.org");
  return d;
}

}  // namespace

namespace {
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

StatusOr<NetworkPolicy> ParsePolicy(const Json* j) {
  NetworkPolicy p;
  if (!j || j->is_null()) return p;
  if (!j->is_object() || !j->contains("mode") || !(*j)["mode"].is_string())
    return InvalidArgument(
        "\"network\" must be {\"mode\": \"none\" | \"allowlist\" | \"open\", \"rules\": [...], "
        "\"domains\": [...]}");
  for (const auto& [k, v] : j->items())
    if (k != "mode" && k != "rules" && k != "domains")
      return InvalidArgument("unknown field \"network." + k + "\"");
  auto mode = ValueIn(kNetModes, (*j)["mode"].get_ref<const std::string&>());
  if (!mode) return InvalidArgument("network mode must be \"none\", \"allowlist\" or \"open\"");
  p.mode = *mode;
  if (auto r = j->find("rules"); r != j->end() && !r->is_null()) {
    if (!r->is_array()) return InvalidArgument("\"network.rules\" must be a list");
    if (r->size() > kMaxRules)
      return InvalidArgument("at most " + std::to_string(kMaxRules) + " network rules");
    for (const auto& e : *r) {
      DSEC_ASSIGN_OR_RETURN(Rule rule, ParseRule(e));
      if (std::find(p.rules.begin(), p.rules.end(), rule) == p.rules.end())
        p.rules.push_back(std::move(rule));
    }
  }
  if (auto d = j->find("domains"); d != j->end() && !d->is_null()) {
    if (!d->is_array()) return InvalidArgument("\"network.domains\" must be a list of names");
    if (d->size() > kMaxDomains)
      return InvalidArgument("at most " + std::to_string(kMaxDomains) + " network domains");
    for (const auto& e : *d) {
      DSEC_ASSIGN_OR_RETURN(std::string name, ParseDomain(e));
      if (std::find(p.domains.begin(), p.domains.end(), name) == p.domains.end())
        p.domains.push_back(std::move(name));
    }
  }
  if (p.mode == NetMode::kNone && (!p.rules.empty() || !p.domains.empty()))
    return InvalidArgument("network mode \"none\" takes no rules or domains");
  return p;
}

Json ToJson(const NetworkPolicy& p) {
  Json j = {{"mode", NetModeName(p.mode)}};
  if (p.mode == NetMode::kNone) return j;
  Json rules = Json::array();
  for (const auto& r : p.rules) {
    Json e = {{"cidr", Ipv4ToString(r.addr) + "/" + std::to_string(r.prefix)}};
    e["proto"] = r.protos == kTcp    ? "tcp"
                 : r.protos == kUdp  ? "udp"
                 : r.protos == kIcmp ? "icmp"
                                     : "any";
    if (!r.ports.empty()) {
      std::string s;
      for (auto pr : r.ports)
        s += (s.empty() ? "" : ",") + std::to_string(pr.lo) +
             (pr.hi != pr.lo ? "-" + std::to_string(pr.hi) : "");
      e["ports"] = s;
    }
    rules.push_back(std::move(e));
  }
  j["rules"] = std::move(rules);
  j["domains"] = p.domains;
  return j;
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
