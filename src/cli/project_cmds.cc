#include "cli/project_cmds.h"

#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/strings.h"
#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

// A dsec-edge has no /v1/projects: say that DSEC_URL must name an apiserver.
Status AccessError(const Status& s) {
  if (s.code() == StatusCode::kNotFound && s.message().starts_with("no route for"))
    return Status(s.code(), s.message() +
                                " (projects and tokens live in a cluster: set DSEC_URL to a "
                                "dsec-apiserver, not to an edge)");
  return s;
}

std::string Time(const Json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) return "-";
  time_t t = static_cast<time_t>(v.get<int64_t>() / 1000);
  char buf[32];
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

// The project a token command is about: --project (global) or $DSEC_PROJECT.
StatusOr<std::string> TokenProject(const GlobalOptions& g) {
  std::string p = g.project;
  if (p.empty()) {
    const char* e = getenv("DSEC_PROJECT");
    p = e ? e : "";
  }
  if (p.empty()) return InvalidArgument("name the project: --project P (or DSEC_PROJECT)");
  return p;
}

std::string TokensPath(const std::string& project) {
  return "/v1/projects/" + UrlEncode(project, false) + "/tokens";
}

int Run(const GlobalOptions& g, const std::function<int(EdgeClient&)>& fn) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  return fn(**c);
}

// The quota path of a level: --org, or --project P (global; or $DSEC_PROJECT) with --token.
struct QuotaLevel {
  bool org = false;
  std::string token;
};
StatusOr<std::string> QuotaPath(const GlobalOptions& g, const QuotaLevel& l) {
  if (l.org) {
    if (!l.token.empty()) return InvalidArgument("--org and --token do not go together");
    return std::string("/v1/quota");
  }
  DSEC_ASSIGN_OR_RETURN(std::string p, TokenProject(g));
  std::string path = "/v1/projects/" + UrlEncode(p, false);
  if (!l.token.empty()) path += "/tokens/" + UrlEncode(l.token, false);
  return path + "/quota";
}

// A limit as given: a number, or "none" (no limit). Cores for cpu.
StatusOr<Json> LimitValue(const std::string& flag, const std::string& v, bool cores) {
  if (v == "none") return Json(nullptr);
  if (cores) {
    char* end = nullptr;
    double d = strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || d < 0)
      return InvalidArgument(flag + " must be a number of cores or none, not \"" + v + "\"");
    return Json(d);
  }
  auto n = ParseInt64(v);
  if (!n || *n < 0)
    return InvalidArgument(flag + " must be a whole number or none, not \"" + v + "\"");
  return Json(*n);
}

void PrintQuota(const Json& r) {
  const Json lim = r.value("limits", Json::object());
  const Json use = r.value("usage", Json::object());
  const Json held = r.value("held", Json::object());
  auto show = [](const Json& v) {
    if (v.is_null()) return std::string("-");
    if (v.is_number_float()) return FormatNumber(v.get<double>());
    return v.dump();
  };
  std::cout << "LEVEL " << r.value("level", "-");
  if (lim.contains("parent") && lim["parent"].is_string())
    std::cout << " (parent project " << lim["parent"].get<std::string>() << ")";
  std::cout << "\n";
  std::vector<std::vector<std::string>> rows;
  for (const char* k : {"sandboxes", "memory_mb", "cpu"})
    rows.push_back(
        {k, show(lim.value(k, Json())), show(use.value(k, Json())), show(held.value(k, Json()))});
  rows.push_back({"creates_per_s", show(lim.value("creates_per_s", Json())),
                  show(r.value("creates_this_second", Json())), "-"});
  PrintTable({"QUOTA", "LIMIT", "USAGE", "HELD"}, rows);
}

void RegisterQuotaCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  CLI::App* quota = app.add_subcommand(
      "quota", "Quotas of a cluster's levels, through a dsec-apiserver: get, set");
  quota->require_subcommand(1);
  auto level = std::make_shared<QuotaLevel>();
  auto add_level = [&](CLI::App* c) {
    c->add_flag("--org", level->org, "The organisation's level (else --project P's)");
    c->add_option("--token", level->token, "A token's level within --project P");
  };
  CLI::App* get = quota->add_subcommand("get", "A level's limits and usage");
  add_level(get);
  // One call on the level's quota (a GET, or a PATCH of `body`), printed.
  auto call = [](const GlobalOptions& g, const QuotaLevel& l, const Json* body) {
    return Run(g, [&](EdgeClient& c) {
      auto path = QuotaPath(g, l);
      if (!path.ok()) return Fail(path.status());
      auto r = c.CallJson(body ? Verb::patch : Verb::get, *path, body);
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (g.json)
        PrintJson(*r);
      else
        PrintQuota(*r);
      return 0;
    });
  };
  get->callback([=, &g] { *exit_code = call(g, *level, nullptr); });
  struct SetArgs {
    std::string sandboxes, memory_mb, cpu, creates_per_s, parent;
  };
  auto a = std::make_shared<SetArgs>();
  CLI::App* set = quota->add_subcommand(
      "set", "Change a level's limits (admin): those named; `none` removes one");
  add_level(set);
  set->add_option("--sandboxes", a->sandboxes, "Sandboxes at once");
  set->add_option("--memory-mb", a->memory_mb, "Their memory_mb together");
  set->add_option("--cpu", a->cpu, "Their CPU caps together, in cores");
  set->add_option("--creates-per-s", a->creates_per_s, "Creates per second");
  set->add_option("--parent", a->parent,
                  "A project whose limits hold this project's too (`none`: no parent)");
  set->callback([=, &g] {
    *exit_code = [&] {
      Json body = Json::object();
      for (auto [flag, key, v, cores] :
           {std::tuple{"--sandboxes", "sandboxes", &a->sandboxes, false},
            std::tuple{"--memory-mb", "memory_mb", &a->memory_mb, false},
            std::tuple{"--cpu", "cpu", &a->cpu, true},
            std::tuple{"--creates-per-s", "creates_per_s", &a->creates_per_s, false}}) {
        if (v->empty()) continue;
        auto j = LimitValue(flag, *v, cores);
        if (!j.ok()) return Fail(j.status());
        body[key] = *j;
      }
      if (!a->parent.empty())
        body["parent"] = a->parent == "none" ? Json(nullptr) : Json(a->parent);
      if (body.empty())
        return Fail(InvalidArgument(
            "name a limit to set: --sandboxes, --memory-mb, --cpu, --creates-per-s or --parent"));
      return call(g, *level, &body);
    }();
  });
}

}  // namespace

void RegisterProjectCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  CLI::App* project = app.add_subcommand(
      "project", "A cluster's projects, through a dsec-apiserver (admin): create, ls, rm");
  project->require_subcommand(1);

  auto create_name = std::make_shared<std::string>();
  CLI::App* create = project->add_subcommand("create", "Make a project");
  create->add_option("name", *create_name, "Project name (a-z 0-9 -)")->required();
  create->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      Json body = {{"name", *create_name}};
      auto r = c.CallJson(Verb::post, "/v1/projects", &body);
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (g.json)
        PrintJson(*r);
      else
        std::cout << r->value("name", *create_name) << "\n";
      return 0;
    });
  });

  CLI::App* ls = project->add_subcommand("ls", "List projects (a member sees its own)");
  ls->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      auto r = c.CallJson(Verb::get, "/v1/projects");
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (g.json) {
        PrintJson(*r);
        return 0;
      }
      std::vector<std::vector<std::string>> rows;
      for (const auto& p : r->value("projects", Json::array()))
        rows.push_back({p.value("name", "-"), Time(p.value("created_at", Json()))});
      PrintTable({"PROJECT", "CREATED"}, rows);
      return 0;
    });
  });

  auto rm_name = std::make_shared<std::string>();
  CLI::App* rm =
      project->add_subcommand("rm", "Remove a project and its tokens (none of its sandboxes left)");
  rm->add_option("name", *rm_name, "Project name")->required();
  rm->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      auto r = c.CallJson(Verb::delete_, "/v1/projects/" + UrlEncode(*rm_name, false));
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (!g.json) std::cout << *rm_name << " removed\n";
      return 0;
    });
  });

  CLI::App* token = app.add_subcommand(
      "token", "A project's tokens, through a dsec-apiserver (admin): create, ls, revoke");
  token->require_subcommand(1);

  auto t_name = std::make_shared<std::string>();
  auto t_role = std::make_shared<std::string>("member");
  auto t_ttl = std::make_shared<int64_t>(0);
  CLI::App* tcreate = token->add_subcommand(
      "create", "Make a token of --project P; prints it once, as the last line");
  tcreate->add_option("name", *t_name, "Token name (a-z 0-9 -)")->required();
  tcreate->add_option("--role", *t_role, "admin, member or viewer (default member)")
      ->check(CLI::IsMember({"admin", "member", "viewer"}));
  tcreate->add_option("--ttl", *t_ttl, "Expire after this many seconds (default: never)")
      ->check(CLI::Range(int64_t{1}, int64_t{316224000}));
  tcreate->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      auto p = TokenProject(g);
      if (!p.ok()) return Fail(p.status());
      Json body = {{"name", *t_name}, {"role", *t_role}};
      if (*t_ttl > 0) body["ttl_s"] = *t_ttl;
      auto r = c.CallJson(Verb::post, TokensPath(*p), &body);
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (g.json) {
        PrintJson(*r);
        return 0;
      }
      std::cerr << "token " << r->value("name", "") << " of project " << r->value("project", "")
                << ", role " << r->value("role", "") << ", expires "
                << Time(r->value("expires_at", Json())) << " (shown once: keep it now)\n";
      std::cout << r->value("token", "") << "\n";
      return 0;
    });
  });

  CLI::App* tls = token->add_subcommand("ls", "List the tokens of --project P (no secrets)");
  tls->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      auto p = TokenProject(g);
      if (!p.ok()) return Fail(p.status());
      auto r = c.CallJson(Verb::get, TokensPath(*p));
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (g.json) {
        PrintJson(*r);
        return 0;
      }
      std::vector<std::vector<std::string>> rows;
      for (const auto& t : r->value("tokens", Json::array()))
        rows.push_back({t.value("name", "-"), t.value("role", "-"),
                        Time(t.value("created_at", Json())), Time(t.value("expires_at", Json()))});
      PrintTable({"TOKEN", "ROLE", "CREATED", "EXPIRES"}, rows);
      return 0;
    });
  });

  auto r_name = std::make_shared<std::string>();
  CLI::App* revoke = token->add_subcommand(
      "revoke", "Revoke a token of --project P (refused on every apiserver within a second)");
  revoke->add_option("name", *r_name, "Token name")->required();
  revoke->callback([=, &g] {
    *exit_code = Run(g, [&](EdgeClient& c) {
      auto p = TokenProject(g);
      if (!p.ok()) return Fail(p.status());
      auto r = c.CallJson(Verb::delete_, TokensPath(*p) + "/" + UrlEncode(*r_name, false));
      if (!r.ok()) return Fail(AccessError(r.status()));
      if (!g.json) std::cout << *r_name << " revoked\n";
      return 0;
    });
  });

  RegisterQuotaCommands(app, g, exit_code);
}

}  // namespace dsec::cli
