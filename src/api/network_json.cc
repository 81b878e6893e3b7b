#include "api/network_json.h"

namespace dsec::api {

namespace {

using net::PortRange;

StatusOr<std::vector<PortRange>> PortsFromJson(const Json& j) {
  std::vector<PortRange> out;
  auto one = [&](const Json& e) -> Status {
    if (e.is_number_unsigned()) return net::AddPorts(std::to_string(e.get<uint64_t>()), &out);
    if (e.is_string()) return net::AddPorts(e.get_ref<const std::string&>(), &out);
    return InvalidArgument("network rule \"ports\" must be a port, \"a-b\", \"a,b-c\" or a list");
  };
  if (j.is_array()) {
    for (const auto& e : j) DSEC_RETURN_IF_ERROR(one(e));
  } else {
    DSEC_RETURN_IF_ERROR(one(j));
  }
  if (out.empty()) return InvalidArgument("network rule \"ports\" is empty");
  return out;
}

StatusOr<net::Rule> RuleFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("each network rule must be an object");
  for (const auto& [k, v] : j.items())
    if (k != "cidr" && k != "ports" && k != "proto")
      return InvalidArgument("unknown field \"network.rules[]." + k + "\"");
  auto cidr = j.find("cidr");
  if (cidr == j.end() || !cidr->is_string())
    return InvalidArgument("each network rule needs a \"cidr\" such as \"198.51.100.0/24\"");
  uint8_t protos = net::kAnyProto;
  if (auto p = j.find("proto"); p != j.end() && !p->is_null()) {
    if (!p->is_string())
      return InvalidArgument("network rule \"proto\" must be tcp, udp, icmp or any");
    DSEC_ASSIGN_OR_RETURN(protos, net::ParseProto(p->get_ref<const std::string&>()));
  }
  std::vector<PortRange> ports;
  if (auto p = j.find("ports"); p != j.end() && !p->is_null()) {
    if (protos == net::kIcmp) return InvalidArgument("an icmp network rule takes no \"ports\"");
    DSEC_ASSIGN_OR_RETURN(ports, PortsFromJson(*p));
  }
  return net::MakeRule(cidr->get_ref<const std::string&>(), protos, std::move(ports));
}

}  // namespace

StatusOr<net::NetworkPolicy> NetworkPolicyFromJson(const Json* j) {
  if (!j || j->is_null()) return net::NetworkPolicy{};
  if (!j->is_object() || !j->contains("mode") || !(*j)["mode"].is_string())
    return InvalidArgument(
        "\"network\" must be {\"mode\": \"none\" | \"allowlist\" | \"open\", \"rules\": [...], "
        "\"domains\": [...]}");
  for (const auto& [k, v] : j->items())
    if (k != "mode" && k != "rules" && k != "domains")
      return InvalidArgument("unknown field \"network." + k + "\"");
  DSEC_ASSIGN_OR_RETURN(net::NetMode mode,
                        net::ParseNetMode((*j)["mode"].get_ref<const std::string&>()));
  std::vector<net::Rule> rules;
  if (auto r = j->find("rules"); r != j->end() && !r->is_null()) {
    if (!r->is_array()) return InvalidArgument("\"network.rules\" must be a list");
    if (r->size() > net::kMaxRules)
      return InvalidArgument("at most " + std::to_string(net::kMaxRules) + " network rules");
    for (const auto& e : *r) {
      DSEC_ASSIGN_OR_RETURN(net::Rule rule, RuleFromJson(e));
      rules.push_back(std::move(rule));
    }
  }
  std::vector<std::string> domains;
  if (auto d = j->find("domains"); d != j->end() && !d->is_null()) {
    if (!d->is_array()) return InvalidArgument("\"network.domains\" must be a list of names");
    if (d->size() > net::kMaxDomains)
      return InvalidArgument("at most " + std::to_string(net::kMaxDomains) + " network domains");
    for (const auto& e : *d) {
      if (!e.is_string()) return InvalidArgument("\"network.domains\" must be a list of names");
      DSEC_ASSIGN_OR_RETURN(std::string name,
                            net::NormalizeDomain(e.get_ref<const std::string&>()));
      domains.push_back(std::move(name));
    }
  }
  return net::MakePolicy(mode, std::move(rules), std::move(domains));
}

Json ToJson(const net::NetworkPolicy& p) {
  Json j = {{"mode", net::NetModeName(p.mode)}};
  if (p.mode == net::NetMode::kNone) return j;
  Json rules = Json::array();
  for (const auto& r : p.rules) {
    Json e = {{"cidr", net::Ipv4ToString(r.addr) + "/" + std::to_string(r.prefix)},
              {"proto", net::ProtoName(r.protos)}};
    if (!r.ports.empty()) e["ports"] = net::PortsText(r.ports);
    rules.push_back(std::move(e));
  }
  j["rules"] = std::move(rules);
  j["domains"] = p.domains;
  return j;
}

}  // namespace dsec::api
