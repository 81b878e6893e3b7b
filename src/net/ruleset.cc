#include "net/ruleset.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "base/strings.h"

namespace dsec::net {

namespace {

std::string Cidr(uint32_t a, uint8_t p) { return Ipv4ToString(a) + "/" + std::to_string(p); }

// "{ 443, 8000-8100 }"
std::string PortSet(const std::vector<PortRange>& ports) {
  std::string s = "{ ";
  for (size_t i = 0; i < ports.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(ports[i].lo);
    if (ports[i].hi != ports[i].lo) s += "-" + std::to_string(ports[i].hi);
  }
  return s + " }";
}

// The rule bodies (after the chain) that accept what `r` allows.
std::vector<std::string> RuleBodies(const Rule& r) {
  std::string dst = "ip daddr " + Cidr(r.addr, r.prefix) + " ";
  std::vector<std::string> out;
  auto l4 = [&](const char* proto) {
    if (r.ports.empty())
      out.push_back(dst + "meta l4proto " + proto + " accept");
    else
      out.push_back(dst + proto + " dport " + PortSet(r.ports) + " accept");
  };
  if (r.protos & kTcp) l4("tcp");
  if (r.protos & kUdp) l4("udp");
  if ((r.protos & kIcmp) && r.ports.empty()) out.push_back(dst + "meta l4proto icmp accept");
  return out;
}

// " inet <table> "
std::string In(const std::string& table) { return " inet " + table + " "; }

}  // namespace

std::string Hex8(uint32_t v) {
  char b[9];
  snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

std::string Ipv4Net::ToString() const { return Cidr(base, prefix); }

StatusOr<Ipv4Net> ParseSandboxRange(std::string_view cidr) {
  Ipv4Net n;
  bool host_bits = false;
  if (!ParseCidr(cidr, &n.base, &n.prefix, &host_bits) || host_bits || n.prefix < 8 ||
      n.prefix > 28)
    return InvalidArgument(
        "network_cidr must be an IPv4 network from /8 to /28, e.g. 10.213.0.0/16 (got \"" +
        std::string(cidr) + "\")");
  return n;
}

std::string CounterName(uint32_t addr) { return "dn_" + Hex8(addr); }

std::string RenderTable(const NodeTable& t) {
  // {name} placeholders are filled in below. The veths have no address of their own, so the
  // node's IGMP reports on them would carry the gateway's: dropped (output, raw) before
  // conntrack sees them.
  std::string r = R"(table inet {table} {
  set bind { type ifname . ipv4_addr; }
  set never { type ipv4_addr; flags interval; elements = { {never} } }
  set private { type ipv4_addr; flags interval; elements = { {private} } }
  map marks { type ipv4_addr : mark; }
  map denied { type ipv4_addr : counter; }
  map dispatch { type ipv4_addr : verdict; }
  set conns { type ipv4_addr; size 65535; flags dynamic; }
  set rate { type ipv4_addr; size 65535; flags dynamic, timeout; timeout 10s; }
  set lograte { type ipv4_addr; size 65535; flags dynamic, timeout; timeout 1m; }
  set nontcp { type ipv4_addr; size 65535; flags dynamic; }
  counter denied_total { }
  chain forward { type filter hook forward priority filter; policy accept;
    iifname "{veths}" jump from_sandbox
    oifname "{veths}" ct state established,related accept
    oifname "{veths}" reject with icmpx type admin-prohibited
  }
  chain from_sandbox {
    meta nfproto != ipv4 drop
    iifname . ip saddr != @bind drop
    ct state new ct mark set ip saddr map @marks
    ct state new add @conns { ip saddr ct count over {max_conns} } goto deny
    ct state new update @rate { ip saddr limit rate over {rate}/second burst {burst} packets } goto deny
    ip daddr @never goto deny
    ct state new meta l4proto != tcp add @nontcp { ip saddr }
    ip saddr vmap @dispatch
    goto deny
  }
  chain deny {
{log}    counter name denied_total
    counter name ip saddr map @denied
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }
  chain input { type filter hook input priority filter; policy accept;
    iifname "{veths}" jump to_node
  }
  chain to_node {
    meta nfproto != ipv4 drop
    iifname . ip saddr != @bind drop
    ct state new ct mark set ip saddr map @marks
    ct state new add @conns { ip saddr ct count over {max_conns} } goto deny
    ct state new update @rate { ip saddr limit rate over {rate}/second burst {burst} packets } goto deny
    ip daddr {gateway} udp dport 53 accept
    goto deny
  }
  chain output { type filter hook output priority raw; policy accept;
    oifname "{veths}" meta l4proto igmp drop
    oifname "{bridge}" meta l4proto igmp drop
  }
  chain postrouting { type nat hook postrouting priority srcnat; policy accept;
    ip saddr {range} oifname "{uplink}" masquerade
  }
}
)";
  const std::string log =
      t.log_group >= 0
          ? "    update @lograte { ip saddr limit rate 6/minute burst 5 packets } log group " +
                std::to_string(t.log_group) + "\n"
          : "";
  std::string never = kNeverNets[0].ToString() + ", " + t.range.ToString(), priv;
  for (size_t i = 1; i < std::size(kNeverNets); ++i) never += ", " + kNeverNets[i].ToString();
  for (const Ipv4Net& n : kPrivateNets) priv += (priv.empty() ? "" : ", ") + n.ToString();
  const std::pair<const char*, std::string> vars[] = {
      {"{never}", never},
      {"{private}", priv},
      {"{table}", t.table},
      {"{range}", t.range.ToString()},
      {"{veths}", t.veth_prefix + "*"},
      {"{bridge}", t.bridge},
      {"{uplink}", t.uplink},
      {"{gateway}", Ipv4ToString(t.range.gateway())},
      {"{max_conns}", std::to_string(t.max_conns)},
      {"{rate}", std::to_string(t.new_conns_per_s)},
      {"{burst}", std::to_string(2 * uint64_t{t.new_conns_per_s})},
      {"{log}", log},
  };
  for (const auto& [key, value] : vars)
    for (size_t at = r.find(key); at != std::string::npos; at = r.find(key, at + value.size()))
      r.replace(at, strlen(key), value);
  return r;
}

std::string RenderAttach(const std::string& table, uint32_t addr, const std::string& host_if) {
  const std::string a = Ipv4ToString(addr), x = Hex8(addr), t = In(table);
  return StrCat({"add element",
                 t,
                 "bind { \"",
                 host_if,
                 "\" . ",
                 a,
                 " }\n",  //
                 "add element",
                 t,
                 "marks { ",
                 a,
                 " : 0x",
                 x,
                 " }\n",  //
                 "add counter",
                 t,
                 "dn_",
                 x,
                 "\n",  //
                 "add element",
                 t,
                 "denied { ",
                 a,
                 " : \"dn_",
                 x,
                 "\" }\n",  //
                 "add set",
                 t,
                 "dns_",
                 x,
                 " { type ipv4_addr; flags timeout; }\n",  //
                 "add chain",
                 t,
                 "sb_",
                 x,
                 "\n"});
}

std::string RenderPolicy(const std::string& table, uint32_t addr, const NetworkPolicy& p,
                         bool dispatched) {
  const std::string x = Hex8(addr), t = In(table), chain = "sb_" + x;
  // What its earlier domains resolved to goes with them.
  std::string cmds = "flush chain" + t + chain + "\nflush set" + t + "dns_" + x + "\n";
  for (const auto& r : p.rules)
    for (const auto& body : RuleBodies(r)) cmds += "add rule" + t + chain + " " + body + "\n";
  if (!p.domains.empty())
    cmds += "add rule" + t + chain + " ip daddr @dns_" + x + " ip daddr != @private accept\n";
  if (p.mode == NetMode::kOpen) cmds += "add rule" + t + chain + " ip daddr != @private accept\n";
  bool dispatch = p.mode != NetMode::kNone;
  if (dispatch && !dispatched)
    cmds +=
        StrCat({"add element", t, "dispatch { ", Ipv4ToString(addr), " : jump ", chain, " }\n"});
  if (!dispatch && dispatched)
    cmds += StrCat({"delete element", t, "dispatch { ", Ipv4ToString(addr), " }\n"});
  return cmds;
}

std::string RenderDetach(const std::string& table, uint32_t addr, const std::string& host_if,
                         bool dispatched) {
  const std::string s = Ipv4ToString(addr), x = Hex8(addr), t = In(table);
  std::string cmds;
  if (dispatched) cmds += StrCat({"delete element", t, "dispatch { ", s, " }\n"});
  cmds += StrCat({"flush chain",    t, "sb_",       x,       "\n",                //
                  "delete chain",   t, "sb_",       x,       "\n",                //
                  "delete set",     t, "dns_",      x,       "\n",                //
                  "delete element", t, "bind { \"", host_if, "\" . ", s, " }\n",  //
                  "delete element", t, "marks { ",  s,       " }\n",              //
                  "delete element", t, "denied { ", s,       " }\n",              //
                  "delete counter", t, "dn_",       x,       "\n"});
  return cmds;
}

std::string RenderAllowResolved(const std::string& table, uint32_t sandbox,
                                const std::vector<dns::Address>& addrs) {
  std::string set = In(table) + "dns_" + Hex8(sandbox) + " { ", plain, timed;
  for (const auto& a : addrs) {
    // nft takes no timeout of 0.
    uint32_t ttl = std::clamp<uint32_t>(a.ttl, 1, 86400);
    plain += (plain.empty() ? "" : ", ") + Ipv4ToString(a.addr);
    timed += StrCat(
        {timed.empty() ? "" : ", ", Ipv4ToString(a.addr), " timeout ", std::to_string(ttl), "s"});
  }
  if (addrs.empty()) return "";
  return StrCat({"add element", set, plain, " }\ndelete element", set, plain, " }\nadd element",
                 set, timed, " }\n"});
}

}  // namespace dsec::net
