#include "cli/node_cmds.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

std::string NodePath(const std::string& node) { return "/v1/nodes/" + UrlEncode(node, false); }

// A node call's error. A dsec-edge has no /v1/nodes: say that DSEC_URL must name an apiserver.
Status NodeError(const Status& s) {
  if (s.code() == StatusCode::kNotFound && s.message().starts_with("no route for"))
    return Status(s.code(), s.message() +
                                " (dsec node talks to a dsec-apiserver: set DSEC_URL to one, "
                                "not to an edge)");
  return s;
}

// obj[key][sub] (or obj[key] when sub is null) as text; "-" when missing or null.
std::string Field(const Json& obj, const char* key, const char* sub = nullptr) {
  if (!obj.is_object()) return "-";
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "-";
  if (!sub) return Num(*it);
  if (!it->is_object()) return "-";
  auto s = it->find(sub);
  return s == it->end() || s->is_null() ? "-" : Num(*s);
}

std::string Joined(const Json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_array()) return "-";
  std::string out;
  for (const auto& v : obj[key]) out += (out.empty() ? "" : ",") + Num(v);
  return out.empty() ? "-" : out;
}

int ListNodes(const GlobalOptions& g) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, "/v1/nodes");
  if (!r.ok()) return Fail(NodeError(r.status()));
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  const Json nodes = r->is_object() && r->contains("nodes") ? (*r)["nodes"] : Json::array();
  for (const auto& n : nodes) {
    if (!n.is_object()) continue;
    rows.push_back(
        {Field(n, "node"), Field(n, "state"),
         Field(n, "usage", "sandboxes") + "/" + Field(n, "capacity", "max_sandboxes"),
         Field(n, "usage", "memory_mb") + "/" + Field(n, "capacity", "admit_memory_mb") + " MiB",
         Joined(n, "backends"), Field(n, "url")});
  }
  PrintTable({"NODE", "STATE", "SANDBOXES", "MEMORY", "BACKENDS", "URL"}, rows);
  return 0;
}

int GetNode(const GlobalOptions& g, const std::string& node) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, NodePath(node));
  if (!r.ok()) return Fail(NodeError(r.status()));
  PrintJson(*r);
  return 0;
}

// cordon / uncordon: prints "NODE STATE" (cordoned, ready; unavailable when the node is down).
int CordonNode(const GlobalOptions& g, const std::string& node, const std::string& action) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::post, NodePath(node) + "/" + action);
  if (!r.ok()) return Fail(NodeError(r.status()));
  if (g.json)
    PrintJson(*r);
  else
    std::cout << node << " " << Field(*r, "state") << "\n";
  return 0;
}

// The apiserver cordons the node (no new placements), then answers once its sandboxes are gone
// or timeout_s has passed. The client's reads have no deadline of their own (EdgeClient blocks
// until the answer), so the call outlives any drain timeout.
int DrainNode(const GlobalOptions& g, const std::string& node, int64_t timeout_s) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r =
      (*c)->CallJson(Verb::post, NodePath(node) + "/drain?timeout_s=" + std::to_string(timeout_s));
  if (!r.ok()) return Fail(NodeError(r.status()));
  bool drained = r->is_object() && r->contains("drained") && (*r)["drained"].is_boolean() &&
                 (*r)["drained"].get<bool>();
  if (g.json) PrintJson(*r);
  if (drained) {
    if (!g.json) std::cout << node << " drained (0 sandboxes)\n";
    return 0;
  }
  std::string state = Field(*r, "state");
  if (state == "unavailable")
    std::cerr << node << ": unavailable, its sandboxes not seen gone after " << timeout_s
              << " s (cordoned; no new placements)\n";
  else
    std::cerr << node << ": still has " << Field(*r, "usage", "sandboxes") << " sandboxes after "
              << timeout_s << " s (cordoned; no new placements)\n";
  return kFail;
}

}  // namespace

void RegisterNodeCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  CLI::App* node = app.add_subcommand(
      "node",
      "Cluster nodes, through a dsec-apiserver (DSEC_URL): ls, get, cordon, uncordon, drain");
  node->require_subcommand(1);

  CLI::App* ls = node->add_subcommand("ls", "List the cluster's nodes");
  ls->callback([&g, exit_code] { *exit_code = ListNodes(g); });

  auto get_name = std::make_shared<std::string>();
  CLI::App* get = node->add_subcommand("get", "Show a node's record as JSON");
  get->add_option("node", *get_name, "Node name")->required();
  get->callback([=, &g] { *exit_code = GetNode(g, *get_name); });

  for (const char* action : {"cordon", "uncordon"}) {
    auto name = std::make_shared<std::string>();
    CLI::App* sub = node->add_subcommand(
        action, std::string(action) == "cordon"
                    ? "No new sandboxes on a node (the ones there keep running)"
                    : "Let a cordoned or drained node take new sandboxes again");
    sub->add_option("node", *name, "Node name")->required();
    sub->callback([=, &g] { *exit_code = CordonNode(g, *name, action); });
  }

  auto drain_name = std::make_shared<std::string>();
  auto drain_timeout = std::make_shared<int64_t>(300);
  CLI::App* drain = node->add_subcommand(
      "drain",
      "Cordon a node and wait until its sandboxes are gone; exits 1 if some are still there "
      "after --timeout");
  drain->add_option("node", *drain_name, "Node name")->required();
  drain->add_option("--timeout", *drain_timeout, "Seconds to wait (0-86400, default 300)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  drain->callback([=, &g] { *exit_code = DrainNode(g, *drain_name, *drain_timeout); });
}

}  // namespace dsec::cli
