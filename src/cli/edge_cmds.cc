#include "cli/edge_cmds.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "base/base64.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/scope_guard.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "cli/attach.h"
#include "cli/cmd_util.h"
#include "cli/copy_cmd.h"
#include "cli/edge_client.h"
#include "cli/terminal_filter.h"

namespace dsec::cli {

namespace {

std::string Labels(const Json& rec) {
  std::string out;
  if (!rec.contains("labels") || !rec["labels"].is_object()) return out;
  for (const auto& [k, v] : rec["labels"].items()) {
    if (!out.empty()) out += ",";
    out += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

// An image for a table: a forked sandbox's layer digests (64 hex digits each) shortened to
// their first 12, as docker shows ids.
std::string ShortImage(const Json& image) {
  std::string out;
  for (auto part : SplitString(ImageText(image), ',')) {
    std::string_view p = part;
    std::string_view prefix;
    if (p.starts_with("sha256:")) prefix = "sha256:", p.remove_prefix(7);
    bool digest = p.size() == 64 && p.find_first_not_of("0123456789abcdef") == p.npos;
    out +=
        (out.empty() ? "" : ",") + std::string(prefix) + std::string(digest ? p.substr(0, 12) : p);
  }
  return out;
}

std::vector<std::string> Row(const Json& r, int64_t now) {
  const Json& l = r.contains("limits") ? r["limits"] : Json::object();
  return {r.value("id", ""),
          r.value("state", ""),
          r.value("kind", ""),
          r.contains("image") ? ShortImage(r["image"]) : "",
          l.contains("cpu") ? Num(l["cpu"]) : "",
          l.contains("memory_mb") ? Num(l["memory_mb"]) + "M" : "",
          l.contains("disk_mb") ? Num(l["disk_mb"]) + "M" : "",
          r.contains("network") && r["network"].is_object() ? r["network"].value("mode", "") : "",
          Duration(now - r.value("created_at", now)),
          r.contains("expires_at") && r["expires_at"].is_number()
              ? Duration(r["expires_at"].get<int64_t>() - now)
              : "-",
          r.value("idle_ttl_s", int64_t{0}) > 0 ? Duration(r.value("idle_ttl_s", int64_t{0}) * 1000)
                                                : "-",
          Labels(r)};
}

const std::vector<std::string> kHead = {"ID",   "STATE",   "KIND", "IMAGE",   "CPU",  "MEM",
                                        "DISK", "NETWORK", "AGE",  "EXPIRES", "IDLE", "LABELS"};

// ---- create ------------------------------------------------------------------------------

// --network MODE, --allow CIDR[:PORTS[:PROTO]], --allow-domain NAME (create and update).
struct NetworkOpts {
  std::string mode;
  std::vector<std::string> allow, domains;
  bool given() const { return !mode.empty() || !allow.empty() || !domains.empty(); }
};

void AddNetworkFlags(CLI::App* cmd, NetworkOpts* o) {
  cmd->add_option("--network", o->mode,
                  "none (loopback only), allowlist (only --allow and --allow-domain) or open "
                  "(public addresses)")
      ->check(CLI::IsMember({"none", "allowlist", "open"}));
  cmd->add_option("--allow", o->allow,
                  "Egress rule CIDR[:PORTS[:PROTO]], e.g. 198.51.100.0/24:443,8000-8100:tcp "
                  "(repeatable; implies --network allowlist)")
      ->expected(1)
      ->take_all();
  cmd->add_option("--allow-domain", o->domains,
                  "A name the sandbox may resolve and reach, e.g. pypi.org or *.example.org "
                  "(repeatable; implies --network allowlist)")
      ->expected(1)
      ->take_all();
}

// The API's "network" object; the edge checks the details.
StatusOr<Json> NetworkBody(const NetworkOpts& o) {
  Json n = {{"mode", o.mode.empty() ? "allowlist" : o.mode}};
  Json rules = Json::array();
  for (const auto& a : o.allow) {
    auto parts = SplitString(a, ':');
    if (parts.empty() || parts.size() > 3 || parts[0].empty())
      return InvalidArgument("--allow " + a + ": use CIDR[:PORTS[:PROTO]]");
    Json r = {{"cidr", std::string(parts[0])}};
    if (parts.size() > 1 && !parts[1].empty()) r["ports"] = std::string(parts[1]);
    if (parts.size() > 2) r["proto"] = std::string(parts[2]);
    rules.push_back(std::move(r));
  }
  if (!rules.empty()) n["rules"] = std::move(rules);
  if (!o.domains.empty()) n["domains"] = o.domains;
  return n;
}

struct CreateOpts {
  std::vector<std::string> images;  // stacked bottom first
  std::string kind, user, workdir, pool;
  std::optional<double> cpu;
  std::optional<int64_t> memory_mb, pids, disk_mb, ttl_s, idle_ttl_s, count;
  std::vector<std::string> env, labels;
  NetworkOpts net;
  std::string trajectory;
  std::optional<int64_t> checkpoint_every;
  std::string node;
};

StatusOr<Json> CreateBody(const CreateOpts& o) {
  Json b = Json::object();
  // One image goes as a string (what every edge understands), several as the stack.
  if (o.images.size() == 1) b["image"] = o.images[0];
  if (o.images.size() > 1) b["image"] = o.images;
  if (!o.pool.empty()) b["pool"] = o.pool;
  if (!o.kind.empty()) b["kind"] = o.kind;
  if (o.cpu) b["cpu"] = *o.cpu;
  if (o.memory_mb) b["memory_mb"] = *o.memory_mb;
  if (o.pids) b["pids"] = *o.pids;
  if (o.disk_mb) b["disk_mb"] = *o.disk_mb;
  if (o.ttl_s) b["ttl_s"] = *o.ttl_s;
  if (o.idle_ttl_s) b["idle_ttl_s"] = *o.idle_ttl_s;
  if (!o.user.empty()) b["user"] = o.user;
  if (!o.workdir.empty()) b["workdir"] = o.workdir;
  DSEC_ASSIGN_OR_RETURN(auto env, ParseKeyValues(o.env, "--env"));
  DSEC_ASSIGN_OR_RETURN(auto labels, ParseKeyValues(o.labels, "--label"));
  if (!env.empty()) b["env"] = env;
  if (!labels.empty()) b["labels"] = labels;
  if (o.count) b["count"] = *o.count;
  if (!o.node.empty()) b["node"] = o.node;
  if (!o.trajectory.empty()) {
    b["trajectory"] = {{"id", o.trajectory}};
    if (o.checkpoint_every) b["trajectory"]["checkpoint_every"] = *o.checkpoint_every;
  } else if (o.checkpoint_every) {
    return InvalidArgument("--checkpoint-every is for a sandbox with --trajectory");
  }
  if (o.net.given()) {
    DSEC_ASSIGN_OR_RETURN(b["network"], NetworkBody(o.net));
  }
  return b;
}

int Create(const GlobalOptions& g, const CreateOpts& o) {
  auto body = CreateBody(o);
  if (!body.ok()) return Fail(body.status());
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::post, "/v1/sandboxes", &*body);
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
  } else if (r->contains("sandboxes")) {
    for (const auto& s : (*r)["sandboxes"]) std::cout << s.value("id", "") << "\n";
  } else {
    std::cout << r->value("id", "") << "\n";
  }
  return 0;
}

void AddCreateFlags(CLI::App* cmd, CreateOpts* o) {
  cmd->add_option(
         "--image", o->images,
         "Image (default: host; a microVM's: the node's microvm_image, Debian with python3, "
         "made at its first use); repeat it or give A,B,... to stack images, bottom first")
      ->delimiter(',')
      ->expected(1)
      ->take_all();
  cmd->add_option("--kind", o->kind,
                  "container (default) or microvm (a VM of its own, of an image from the store)")
      ->check(CLI::IsMember({"container", "microvm"}));
  cmd->add_option("--cpu", o->cpu, "CPU cap in cores");
  cmd->add_option("--memory", o->memory_mb, "Memory limit in MB");
  cmd->add_option("--pids", o->pids, "Process limit");
  cmd->add_option("--disk", o->disk_mb, "Writable layer size in MB");
  cmd->add_option("--ttl", o->ttl_s, "Delete after this many seconds (0: no TTL; default 3600)")
      ->check(CLI::Range(int64_t{0}, int64_t{2592000}));
  cmd->add_option("--idle-ttl", o->idle_ttl_s, "Delete after this many idle seconds (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{2592000}));
  cmd->add_option("--user", o->user, "sandbox (default), root, or uid[:gid]");
  cmd->add_option("--workdir", o->workdir, "Working directory (default /workspace)");
  cmd->add_option("--env", o->env, "KEY=VALUE (repeatable)")->expected(1)->take_all();
  cmd->add_option("--label", o->labels, "KEY=VALUE (repeatable)")->expected(1)->take_all();
  AddNetworkFlags(cmd, &o->net);
  cmd->add_option("--trajectory", o->trajectory,
                  "Record its calls in the trajectory log under this id (dsec trajectory)");
  cmd->add_option("--checkpoint-every", o->checkpoint_every,
                  "With --trajectory: mutating calls between checkpoints (0: only at preempt)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--node", o->node,
                  "Make it on this node of a cluster (admins; dsec node ls names them)");
}

struct UpdateOpts {
  std::string id;
  std::optional<int64_t> ttl_s, idle_ttl_s;
  std::vector<std::string> labels;  // KEY=VALUE sets, KEY= removes
  NetworkOpts net;
};

int Update(const GlobalOptions& g, const UpdateOpts& o) {
  Json b = Json::object();
  if (o.ttl_s) b["ttl_s"] = *o.ttl_s;
  if (o.idle_ttl_s) b["idle_ttl_s"] = *o.idle_ttl_s;
  Json labels = Json::object();
  for (const auto& kv : o.labels) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Fail(InvalidArgument("--label " + kv + ": use KEY=VALUE (KEY= removes it)"));
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    labels[k] = v.empty() ? Json(nullptr) : Json(v);
  }
  if (!labels.empty()) b["labels"] = labels;
  if (o.net.given()) {
    auto n = NetworkBody(o.net);
    if (!n.ok()) return Fail(n.status());
    b["network"] = *n;
  }
  if (b.empty()) return Fail(InvalidArgument("update: nothing to change (see --help)"));
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::patch, SbPath(o.id), &b);
  if (!r.ok()) return Fail(r.status());
  if (g.json) PrintJson(*r);
  return 0;
}

// ---- ls / get ----------------------------------------------------------------------------

int List(const GlobalOptions& g, const std::vector<std::string>& labels, const std::string& state,
         const std::string& kind) {
  std::string q = "?limit=1000";
  if (auto valid = ParseKeyValues(labels, "--label"); !valid.ok()) return Fail(valid.status());
  for (const auto& l : labels) q += "&label=" + UrlEncode(l, false);  // each one, ANDed
  if (!state.empty()) q += "&state=" + UrlEncode(state, false);
  if (!kind.empty()) q += "&kind=" + UrlEncode(kind, false);
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json all = Json::array();
  std::string cursor;
  for (int page = 0; page < 100000; ++page) {
    std::string t = "/v1/sandboxes" + q + (cursor.empty() ? "" : "&cursor=" + UrlEncode(cursor));
    auto r = (*c)->CallJson(Verb::get, t);
    if (!r.ok()) return Fail(r.status());
    for (auto& s : (*r)["sandboxes"]) all.push_back(std::move(s));
    if (!r->contains("next_cursor") || !(*r)["next_cursor"].is_string()) break;
    cursor = (*r)["next_cursor"];
  }
  if (g.json) {
    PrintJson(Json{{"sandboxes", all}});
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  int64_t now = NowMs();
  for (const auto& s : all) rows.push_back(Row(s, now));
  PrintTable(kHead, rows);
  return 0;
}

int Get(const GlobalOptions& g, const std::string& id, bool stats) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, SbPath(id));
  if (!r.ok()) return Fail(r.status());
  std::optional<Json> st;
  if (stats) {
    auto s = (*c)->CallJson(Verb::get, SbPath(id) + "/stats");
    if (!s.ok()) return Fail(s.status());
    st = *s;
  }
  if (g.json) {
    Json out = *r;
    if (st) out["stats"] = *st;
    PrintJson(out);
    return 0;
  }
  int64_t now = NowMs();
  auto row = Row(*r, now);
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < kHead.size(); ++i) rows.push_back({kHead[i], row[i]});
  rows.push_back({"NODE", r->value("node", "")});
  rows.push_back({"USER", r->value("user", "")});
  rows.push_back({"WORKDIR", r->value("workdir", "")});
  if (r->contains("network") && (*r)["network"].is_object() && (*r)["network"].contains("address"))
    rows.push_back({"ADDRESS", (*r)["network"].value("address", "")});
  if (r->contains("reason") && (*r)["reason"].is_string())
    rows.push_back({"REASON", (*r)["reason"].get<std::string>()});
  if (st)
    for (const auto& [k, v] : st->items()) rows.push_back({k, StatText(k, v)});
  for (const auto& rr : rows)
    std::cout << rr[0] << ":" << std::string(10 - std::min<size_t>(rr[0].size(), 9), ' ') << rr[1]
              << "\n";
  return 0;
}

// ---- exec ----------------------------------------------------------------------------------

struct ExecOpts {
  std::string id;
  bool interactive = false, tty = false;
  bool raw = false;  // control sequences reach the terminal as they are
  bool grader = false;
  std::vector<std::string> env;
  std::string cwd, user;
  double timeout_s = 0;
  std::vector<std::string> cmd;
};

// Non-interactive exec: NDJSON stream, output written as it arrives (base64 on the wire so
// binary output survives).
int StreamExec(EdgeClient& c, const ExecOpts& o, bool json) {
  Json body = {{"cmd", o.cmd},
               {"encoding", "base64"},
               {"max_output_bytes", 256 << 20},
               {"timeout_ms", static_cast<int64_t>(o.timeout_s * 1000)}};
  auto env = ParseKeyValues(o.env, "--env");
  if (!env.ok()) return Fail(env.status(), kExecFail);
  if (!env->empty()) body["env"] = *env;
  if (!o.cwd.empty()) body["cwd"] = o.cwd;
  if (!o.user.empty()) body["user"] = o.user;
  if (o.grader) body["grader"] = true;
  std::string pending;
  std::optional<Json> result;
  Status stream_error;
  // On a terminal, the command's escape sequences are shown, not obeyed (terminal_filter.h).
  TerminalFilter filters[2];
  const bool safe[2] = {!o.raw && isatty(STDOUT_FILENO) == 1, !o.raw && isatty(STDERR_FILENO) == 1};
  std::string captured[2];  // --json: the output goes into the result instead
  auto emit = [&](int i, std::string_view d) {
    if (json) {
      captured[i].append(d);
      return;
    }
    int fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
    (void)WriteAllFd(fd, safe[i] ? filters[i].Filter(d) : std::string(d), i ? "stderr" : "stdout");
  };
  Status s = c.Download(Verb::post, SbPath(o.id) + "/exec?stream=1", body.dump(),
                        [&](std::string_view data) -> Status {
                          pending.append(data);
                          size_t start = 0, nl;
                          while ((nl = pending.find('\n', start)) != std::string::npos) {
                            auto j = ParseJson(std::string_view(pending).substr(start, nl - start));
                            start = nl + 1;
                            if (!j.ok() || !j->is_object()) continue;
                            for (int i = 0; i < 2; ++i) {
                              if (auto it = j->find(i ? "stderr" : "stdout");
                                  it != j->end() && it->is_string()) {
                                if (auto d = Base64Decode(it->get<std::string>())) emit(i, *d);
                              }
                            }
                            if (auto it = j->find("exit"); it != j->end()) result = *it;
                            if (auto it = j->find("error"); it != j->end() && it->is_object())
                              stream_error = InternalError(it->value("message", "exec failed"));
                          }
                          pending.erase(0, start);
                          return OkStatus();
                        });
  for (int i = 0; i < 2; ++i)
    if (safe[i]) (void)WriteAllFd(i ? STDERR_FILENO : STDOUT_FILENO, filters[i].Flush(), "out");
  if (!s.ok()) return Fail(s, kExecFail);
  if (!stream_error.ok()) return Fail(stream_error, kExecFail);
  if (!result) return Fail(Unavailable("the exec stream ended without an exit status"), kExecFail);
  if (json) {
    PrintResultJson(*result, captured[0], captured[1]);
  }
  return ExitCodeForResult(*result, o.timeout_s);
}

int Exec(const GlobalOptions& g, ExecOpts o) {
  if (o.cmd.empty())
    return Fail(InvalidArgument("exec needs a command: dsec exec ID -- CMD..."), kExecFail);
  if (o.timeout_s < 0) return Fail(InvalidArgument("--timeout must not be negative"), kExecFail);
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status(), kExecFail);
  if (o.grader && (o.interactive || o.tty))
    return Fail(InvalidArgument("--grader runs non-interactively: no -i or -t"), kExecFail);
  if (!o.interactive && !o.tty) {
    // Data waiting on a piped or redirected stdin is not sent without -i: say so, rather than
    // have the command read nothing in silence.
    struct stat st;
    int avail = 0;
    if (fstat(STDIN_FILENO, &st) == 0 &&
        ((S_ISFIFO(st.st_mode) && ioctl(STDIN_FILENO, FIONREAD, &avail) == 0 && avail > 0) ||
         (S_ISREG(st.st_mode) && st.st_size > 0)))
      std::cerr << "dsec: stdin is not sent without -i (dsec exec -i ID -- CMD streams it)\n";
    return StreamExec(**c, o, g.json);
  }
  AttachOptions a;
  a.cmd = o.cmd;
  a.tty = o.tty;
  a.forward_stdin = o.interactive;
  a.user = o.user;
  a.cwd = o.cwd;
  a.env = o.env;
  if (auto env = ParseKeyValues(o.env, "--env"); !env.ok()) return Fail(env.status(), kExecFail);
  a.timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  auto r = AttachAndRun(**c, o.id, a);
  if (!r.ok()) return Fail(r.status(), kExecFail);
  return ExitCodeForResult(*r, o.timeout_s);
}

// ---- shell ---------------------------------------------------------------------------------

// On a terminal: an interactive login shell with a PTY. Otherwise each line of stdin runs in one
// persistent shell session (cwd, env and background jobs carry over), output printed per
// command; the exit code is the last command's.
int Shell(const GlobalOptions& g, const std::string& id, const std::string& user,
          const std::string& session) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  if (StdioIsTerminal() && session.empty()) {
    AttachOptions a;
    a.shell = "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";
    a.tty = true;
    a.user = user;
    auto r = AttachAndRun(**c, id, a);
    if (!r.ok()) return Fail(r.status());
    return ExitCodeForResult(*r, 0);
  }
  std::string sid = session;
  bool own = sid.empty();
  if (own) {
    Json body = Json::object();
    if (!user.empty()) body["user"] = user;
    auto r = (*c)->CallJson(Verb::post, SbPath(id) + "/shells", &body);
    if (!r.ok()) return Fail(r.status());
    sid = r->value("shell_id", "");
  }
  auto close = MakeScopeGuard([&] {
    if (own) (void)(*c)->Call(Verb::delete_, SbPath(id) + "/shells/" + UrlEncode(sid, false));
  });
  int last = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (TrimWhitespace(line).empty()) continue;
    Json body = {{"command", line}, {"timeout_ms", 0}, {"encoding", "base64"}};
    auto r =
        (*c)->CallJson(Verb::post, SbPath(id) + "/shells/" + UrlEncode(sid, false) + "/run", &body);
    if (!r.ok()) return Fail(r.status());
    for (auto [key, fd] :
         {std::pair{"stdout", STDOUT_FILENO}, std::pair{"stderr", STDERR_FILENO}}) {
      auto d = Base64Decode(r->value(key, ""));
      if (!d) continue;
      // Whole results: a fresh filter each, nothing held back between them.
      TerminalFilter f;
      (void)WriteAllFd(fd, isatty(fd) == 1 ? f.Filter(*d) + f.Flush() : *d, key);
    }
    last = ExitCodeForResult(*r, 0);
  }
  return last;
}

// ---- pause / resume / rm ------------------------------------------------------------------

int ForEach(const GlobalOptions& g, const std::vector<std::string>& ids, Verb verb,
            const std::string& suffix, bool missing_ok) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  int rc = 0;
  Json out = Json::array();
  for (const auto& id : ids) {
    auto r = (*c)->Call(verb, SbPath(id) + suffix);
    if (!r.ok()) return Fail(r.status());
    if (r->status == 404 && missing_ok) continue;
    if (r->status < 200 || r->status >= 300) {
      rc = Fail(ApiError(r->status, r->body));
      continue;
    }
    if (g.json) {
      auto j = ParseJson(r->body);
      out.push_back(j.ok() && !r->body.empty() ? *j : Json{{"id", id}});
    } else {
      std::cout << id << "\n";
    }
  }
  if (g.json) PrintJson(out);
  return rc;
}

// POST /v1/jobs/{job}/pause|resume.
int JobAction(const GlobalOptions& g, const std::string& job, const std::string& what) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::post, "/v1/jobs/" + UrlEncode(job, false) + "/" + what);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << (what == "pause" ? "paused " : "resumed ") << r->value("affected", 0)
              << " sandboxes of job " << job << "\n";
  return 0;
}

int Stats(const GlobalOptions& g, const std::string& id) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto s = (*c)->CallJson(Verb::get, SbPath(id) + "/stats");
  if (!s.ok()) return Fail(s.status());
  if (g.json) {
    PrintJson(*s);
    return 0;
  }
  for (const auto& [k, v] : s->items()) std::cout << k << ": " << StatText(k, v) << "\n";
  return 0;
}

int RemoveJob(const GlobalOptions& g, const std::string& job) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::delete_, "/v1/jobs/" + UrlEncode(job, false));
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << "deleted " << r->value("affected", 0) << " sandboxes of job " << job << "\n";
  return 0;
}

}  // namespace

int MaybeRunThroughEdge(const GlobalOptions& g, const RunThroughEdge& o) {
  if (g.local) return -1;
  auto ep = ResolveEndpoint(g.url, g.token, g.project);
  if (!ep.ok()) return Fail(ep.status(), kExecFail);
  EdgeClient c(*ep);
  if (!ep->configured && !c.Reachable()) return -1;  // no edge here: run locally
  Json body = {{"image", o.image},
               {"user", o.user},
               {"workdir", o.workdir},
               {"ttl_s", std::max<int64_t>(3600, static_cast<int64_t>(o.timeout_s) + 600)},
               {"labels", {{"dsec-run", "1"}}}};
  body.update(ToJson(o.resources));
  auto env = ParseKeyValues(o.env, "--env");
  if (!env.ok()) return Fail(env.status(), kExecFail);
  if (!env->empty()) body["env"] = *env;
  auto r = c.CallJson(Verb::post, "/v1/sandboxes", &body);
  if (!r.ok()) return Fail(r.status(), kExecFail);
  std::string id = r->value("id", "");
  auto del = MakeScopeGuard([&] {
    auto d = c.Call(Verb::delete_, SbPath(id));
    if (!d.ok() || (d->status != 204 && d->status != 404))
      std::cerr << "dsec: cleanup: could not delete " << id << "\n";
  });
  if (g.json && o.tty != "always") {
    // --json: one result object (exit status and the output) instead of the streams.
    ExecOpts eo;
    eo.id = id;
    eo.cmd = o.cmd;
    eo.timeout_s = o.timeout_s;
    eo.raw = true;
    return StreamExec(c, eo, /*json=*/true);
  }
  AttachOptions a;
  a.cmd = o.cmd;
  a.tty = o.tty == "always" || (o.tty == "auto" && StdioIsTerminal());
  a.timeout_ms = static_cast<int64_t>(o.timeout_s * 1000);
  auto res = AttachAndRun(c, id, a);
  if (!res.ok()) return Fail(res.status(), kExecFail);
  return ExitCodeForResult(*res, o.timeout_s);
}

namespace {

void AddExecCommand(CLI::App& app, GlobalOptions& g, int* exit_code) {
  auto eo = std::make_shared<ExecOpts>();
  CLI::App* ex = app.add_subcommand("exec", "Run a command in a sandbox: dsec exec ID -- CMD...");
  ex->add_option("id", eo->id, "Sandbox id")->required();
  ex->add_flag("-i,--interactive", eo->interactive, "Stream stdin to the command");
  ex->add_flag("-t,--tty", eo->tty, "Run on a pseudo-terminal");
  ex->add_flag("--grader", eo->grader,
               "Kill every process in the sandbox first, then run as a user of its own with a "
               "clean environment (for grading what an agent left)");
  ex->add_flag("--raw", eo->raw,
               "Write the command's terminal control sequences as they are (by default, on a "
               "terminal, they are shown as ^[ ... instead of acting on it)");
  ex->add_option("--env", eo->env, "KEY=VALUE (repeatable)")->expected(1)->take_all();
  ex->add_option("--cwd", eo->cwd, "Working directory");
  ex->add_option("--user", eo->user, "User to run as");
  ex->add_option("--timeout", eo->timeout_s, "Kill the command after this many seconds");
  ex->add_option("cmd", eo->cmd, "Command (after --)");
  ex->callback([eo, &g, exit_code] {
    ExecOpts o = *eo;
    if (g.has_command) {
      if (!o.cmd.empty()) {
        *exit_code =
            Fail(InvalidArgument("unexpected argument \"" + o.cmd[0] + "\" before --"), kExecFail);
        return;
      }
      o.cmd = g.command;
    }
    *exit_code = Exec(g, o);
  });
}

void AddRmCommand(CLI::App& app, GlobalOptions& g, int* exit_code) {
  auto rm_ids = std::make_shared<std::vector<std::string>>();
  auto rm_job = std::make_shared<std::string>();
  auto rm_force = std::make_shared<bool>(false);
  CLI::App* rm = app.add_subcommand("rm", "Delete sandboxes (or every sandbox of --job)");
  rm->add_option("ids", *rm_ids, "Sandbox ids");
  rm->add_option("--job", *rm_job, "Delete the sandboxes labelled job=JOB");
  rm->add_flag("-f,--force", *rm_force, "No error for ids that do not exist");
  rm->callback([=, &g] {
    if (!rm_job->empty()) {
      *exit_code = rm_ids->empty() ? RemoveJob(g, *rm_job)
                                   : Fail(InvalidArgument("rm: give ids or --job, not both"));
      return;
    }
    if (rm_ids->empty()) {
      *exit_code = Fail(InvalidArgument("rm: which sandboxes? give ids or --job"));
      return;
    }
    *exit_code = ForEach(g, *rm_ids, Verb::delete_, "", *rm_force);
  });
}
}  // namespace

void RegisterEdgeCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  auto co = std::make_shared<CreateOpts>();
  CLI::App* create = app.add_subcommand("create", "Create a sandbox on the edge; prints its id");
  AddCreateFlags(create, co.get());
  create->add_option("--count", co->count, "Create this many alike (1-256)");
  create->add_option("--pool", co->pool,
                     "Take a ready sandbox from this container pool (it sets the limits)");
  create->callback([co, &g, exit_code] { *exit_code = Create(g, *co); });

  auto ls_labels = std::make_shared<std::vector<std::string>>();
  auto ls_state = std::make_shared<std::string>();
  CLI::App* ls = app.add_subcommand("ls", "List sandboxes");
  ls->add_option("--label", *ls_labels, "KEY=VALUE filter (repeatable, ANDed)")
      ->expected(1)
      ->take_all();
  ls->add_option("--state", *ls_state, "creating|running|paused|failed");
  auto ls_kind = std::make_shared<std::string>();
  ls->add_option("--kind", *ls_kind, "container|microvm");
  ls->callback([=, &g] { *exit_code = List(g, *ls_labels, *ls_state, *ls_kind); });

  auto get_id = std::make_shared<std::string>();
  auto get_stats = std::make_shared<bool>(false);
  CLI::App* get = app.add_subcommand("get", "Show one sandbox");
  get->add_option("id", *get_id, "Sandbox id")->required();
  get->add_flag("--stats", *get_stats, "Also show resource usage");
  get->callback([=, &g] { *exit_code = Get(g, *get_id, *get_stats); });

  AddExecCommand(app, g, exit_code);

  auto sh_id = std::make_shared<std::string>();
  auto sh_user = std::make_shared<std::string>();
  auto sh_session = std::make_shared<std::string>();
  CLI::App* sh = app.add_subcommand(
      "shell",
      "Interactive shell in a sandbox (on a terminal); else run stdin's lines in one "
      "persistent shell session");
  sh->add_option("id", *sh_id, "Sandbox id")->required();
  sh->add_option("--user", *sh_user, "User to run as");
  sh->add_option("--session", *sh_session, "Use this existing shell session (from the API)");
  sh->callback([=, &g] { *exit_code = Shell(g, *sh_id, *sh_user, *sh_session); });

  auto cp_src = std::make_shared<std::string>();
  auto cp_dst = std::make_shared<std::string>();
  CLI::App* cp = app.add_subcommand(
      "cp", "Copy files or directories: dsec cp PATH ID:/path, dsec cp ID:/path PATH");
  cp->add_option("src", *cp_src, "Source")->required();
  cp->add_option("dst", *cp_dst, "Destination")->required();
  cp->callback([=, &g] { *exit_code = Copy(g, *cp_src, *cp_dst); });

  for (const char* verb : {"pause", "resume"}) {
    auto ids = std::make_shared<std::vector<std::string>>();
    auto job = std::make_shared<std::string>();
    std::string what = verb;
    CLI::App* cmd = app.add_subcommand(
        verb, what == "pause" ? "Freeze sandboxes (they keep their memory), or every one of --job"
                              : "Thaw paused sandboxes, or every one of --job");
    cmd->add_option("ids", *ids, "Sandbox ids");
    cmd->add_option("--job", *job, "Every sandbox labelled job=JOB");
    cmd->callback([=, &g] {
      if (job->empty() == ids->empty()) {
        *exit_code = Fail(InvalidArgument(what + ": give sandbox ids or --job, not both"));
      } else if (!job->empty()) {
        *exit_code = JobAction(g, *job, what);
      } else {
        *exit_code = ForEach(g, *ids, Verb::post, "/" + what, false);
      }
    });
  }

  auto stats_id = std::make_shared<std::string>();
  CLI::App* stats = app.add_subcommand("stats", "Resource usage of a sandbox");
  stats->add_option("id", *stats_id, "Sandbox id")->required();
  stats->callback([=, &g] { *exit_code = Stats(g, *stats_id); });

  AddRmCommand(app, g, exit_code);

  auto port_id = std::make_shared<std::string>();
  auto port_num = std::make_shared<int>(0);
  auto port_path = std::make_shared<std::string>();
  CLI::App* port = app.add_subcommand(
      "port", "Print the URL of the edge's proxy to a server on PORT inside a sandbox");
  port->add_option("id", *port_id, "Sandbox id")->required();
  port->add_option("port", *port_num, "Port the server listens on inside the sandbox")
      ->required()
      ->check(CLI::Range(1, 65535));
  port->add_option("path", *port_path, "Path on that server (default /)");
  auto port_signed = std::make_shared<bool>(false);
  auto port_ttl = std::make_shared<int64_t>(3600);
  port->add_flag("--signed", *port_signed,
                 "A URL that needs no token (for a browser or a tool), valid for --ttl seconds "
                 "(host-based when the node has a port_domain)");
  port->add_option("--ttl", *port_ttl, "Seconds a --signed URL stays valid (default 3600)")
      ->check(CLI::Range(int64_t{1}, int64_t{2592000}));
  port->callback([=, &g] {
    auto c = Connect(g);
    if (!c.ok()) {
      *exit_code = Fail(c.status());
      return;
    }
    auto rec = (*c)->CallJson(Verb::get, SbPath(*port_id));
    if (!rec.ok()) {
      *exit_code = Fail(rec.status());
      return;
    }
    // Refused up front where the node says the kind has no proxy, not at the first request.
    const std::string kind = rec->value("kind", "container");
    if (auto node = (*c)->CallJson(Verb::get, "/v1/node"); node.ok()) {
      const Json* caps = nullptr;
      if (auto f = node->find("features"); f != node->end() && f->is_object())
        if (auto k = f->find("kinds"); k != f->end() && k->is_object())
          if (auto kc = k->find(kind); kc != k->end() && kc->is_object()) caps = &*kc;
      if (caps && !caps->value("port_proxy", true)) {
        *exit_code = Fail(InvalidArgument("the port proxy is not available for " + kind +
                                          " sandboxes on this node"));
        return;
      }
    }
    auto ep = ResolveEndpoint(g.url, g.token, g.project);
    if (!ep.ok()) {
      *exit_code = Fail(ep.status());
      return;
    }
    const std::string path = StartsWith(*port_path, "/") ? port_path->substr(1) : *port_path;
    std::string rest = SbPath(*port_id) + "/ports/" + std::to_string(*port_num) + "/" + path;
    if (*port_signed) {
      Json body = {{"port", *port_num}, {"ttl_s", *port_ttl}};
      auto u = (*c)->CallJson(Verb::post, SbPath(*port_id) + "/port-urls", &body);
      if (!u.ok()) {
        *exit_code = Fail(u.status());
        return;
      }
      // The host-based form when the node has a port domain: absolute links work there.
      if (auto h = u->find("host_url"); h != u->end() && h->is_string()) {
        std::string host_url = h->get<std::string>();
        size_t q = host_url.find("/?");
        if (q != std::string::npos) host_url.insert(q + 1, path);
        if (g.json) {
          PrintJson(Json{{"url", host_url}});
        } else {
          std::cout << host_url << "\n";
        }
        *exit_code = 0;
        return;
      }
      rest = u->value("path", std::string("/")) + path;
    }
    std::string url = ep->is_unix ? "unix://" + ep->unix_path + ":" + rest
                                  : "http://" + ep->host + ":" + ep->port + rest;
    if (g.json) {
      PrintJson(Json{{"url", url}});
    } else {
      std::cout << url << "\n";
    }
    *exit_code = 0;
  });

  auto uo = std::make_shared<UpdateOpts>();
  CLI::App* update =
      app.add_subcommand("update", "Change a sandbox's TTLs, labels or network policy (live)");
  update->add_option("id", uo->id, "Sandbox id")->required();
  update->add_option("--ttl", uo->ttl_s, "Delete this many seconds from now (0: no TTL)")
      ->check(CLI::Range(int64_t{0}, int64_t{2592000}));
  update->add_option("--idle-ttl", uo->idle_ttl_s, "Delete after this many idle seconds (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{2592000}));
  update->add_option("--label", uo->labels, "KEY=VALUE sets, KEY= removes (repeatable)")
      ->expected(1)
      ->take_all();
  AddNetworkFlags(update, &uo->net);
  update->callback([uo, &g, exit_code] { *exit_code = Update(g, *uo); });
}

}  // namespace dsec::cli
