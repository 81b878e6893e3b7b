#include "cli/trajectory_cmds.h"

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

std::string TrajectoryPath(const std::string& id) {
  return "/v1/trajectories/" + UrlEncode(id, false);
}

std::string Text(const Json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

int Preempt(const GlobalOptions& g, const std::string& job, const std::string& others) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json body = {{"others", others}};
  auto r = (*c)->CallJson(Verb::post, "/v1/jobs/" + UrlEncode(job, false) + "/preempt", &body);
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::cout << "preempted " << r->value("affected", 0) << " sandboxes of job " << job << "\n";
  for (const auto& x : r->value("checkpointed", Json::array()))
    std::cout << "  " << Text(x["sandbox"]) << ": trajectory " << Text(x["trajectory"])
              << " checkpointed at call " << Text(x["seq"]) << " (branch " << Text(x["branch"])
              << ")\n";
  for (const auto& x : r->value("snapshots", Json::array()))
    std::cout << "  " << Text(x["sandbox"]) << ": snapshot " << Text(x["image"]) << "\n";
  int rc = 0;
  for (const auto& x : r->value("failed", Json::array())) {
    std::cerr << "dsec: " << Text(x["sandbox"]) << ": " << Text(x["error"]) << "\n";
    rc = 1;
  }
  return rc;
}

int List(const GlobalOptions& g) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, "/v1/trajectories");
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::cout << "ID\tSTATE\tSANDBOX\tHEAD\tBRANCHES\n";
  for (const auto& t : r->value("trajectories", Json::array()))
    std::cout << Text(t["id"]) << "\t" << Text(t["state"]) << "\t" << Text(t["sandbox"]) << "\t"
              << Text(t["head"]) << "\t" << Text(t["branches"]) << "\n";
  return 0;
}

int Get(const GlobalOptions& g, const std::string& id, std::optional<int64_t> branch) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  std::string path = TrajectoryPath(id);
  if (branch) path += "?branch=" + std::to_string(*branch);
  auto r = (*c)->CallJson(Verb::get, path);
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::cout << "trajectory " << Text((*r)["id"]) << ": " << Text((*r)["state"]) << ", sandbox "
            << Text((*r)["sandbox"]) << ", branch " << Text((*r)["branch"]) << " (head "
            << Text((*r)["head"]) << ")\n";
  for (const auto& b : r->value("branches", Json::array()))
    std::cout << "  branch " << Text(b["branch"]) << ": " << Text(b["entries"]) << " calls"
              << (b["parent"].is_null()
                      ? std::string()
                      : ", forked from " + Text(b["parent"]) + " at " + Text(b["fork_seq"]))
              << "\n";
  for (const auto& cp : r->value("checkpoints", Json::array()))
    std::cout << "  checkpoint after call " << Text(cp["seq"]) << "\n";
  std::cout << "SEQ\tSTATUS\tMETHOD\tTARGET\n";
  for (const auto& e : r->value("entries", Json::array()))
    std::cout << Text(e["seq"]) << "\t" << Text(e["status"]) << "\t" << Text(e["method"]) << "\t"
              << Text(e["target"]) << "\n";
  return 0;
}

int Resume(const GlobalOptions& g, const std::string& id, std::optional<int64_t> branch) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json body = Json::object();
  if (branch) body["branch"] = *branch;
  auto r = (*c)->CallJson(Verb::post, TrajectoryPath(id) + "/resume", &body);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << r->value("id", "") << "\n";
  return 0;
}

int Remove(const GlobalOptions& g, const std::string& id) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::delete_, TrajectoryPath(id));
  if (!r.ok()) return Fail(r.status());
  return 0;
}

}  // namespace

void RegisterTrajectoryCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  auto job = std::make_shared<std::string>();
  auto others = std::make_shared<std::string>("delete");
  CLI::App* preempt = app.add_subcommand(
      "preempt",
      "Preempt a job: checkpoint its recorded trajectories, then delete all its sandboxes");
  preempt->add_option("--job", *job, "Every sandbox labelled job=JOB")->required();
  preempt
      ->add_option("--others", *others,
                   "Sandboxes without a trajectory: delete (default) or snapshot into an image "
                   "first")
      ->check(CLI::IsMember({"delete", "snapshot"}));
  preempt->callback([=, &g] { *exit_code = Preempt(g, *job, *others); });

  CLI::App* t =
      app.add_subcommand("trajectory", "Trajectory logs (record with create --trajectory)");
  t->require_subcommand(1);
  t->add_subcommand("ls", "The project's trajectories")->callback([=, &g] {
    *exit_code = List(g);
  });
  auto id = std::make_shared<std::string>();
  auto branch = std::make_shared<std::optional<int64_t>>();
  CLI::App* get = t->add_subcommand("get", "A trajectory's branches, checkpoints and calls");
  get->add_option("id", *id, "Trajectory id")->required();
  get->add_option("--branch", *branch, "Which branch (default: the head)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  get->callback([=, &g] { *exit_code = Get(g, *id, *branch); });
  CLI::App* resume = t->add_subcommand(
      "resume", "A sandbox that answers the logged calls from the log, then goes live");
  resume->add_option("id", *id, "Trajectory id")->required();
  resume->add_option("--branch", *branch, "Which branch (default: the head)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  resume->callback([=, &g] { *exit_code = Resume(g, *id, *branch); });
  CLI::App* rm = t->add_subcommand("rm", "Delete a trajectory (not while a sandbox follows it)");
  rm->add_option("id", *id, "Trajectory id")->required();
  rm->callback([=, &g] { *exit_code = Remove(g, *id); });
}

}  // namespace dsec::cli
