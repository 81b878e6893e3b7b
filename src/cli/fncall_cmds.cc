#include "cli/fncall_cmds.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "base/base64.h"
#include "base/file_util.h"
#include "base/strings.h"
#include "cli/attach.h"
#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

// Local inputs are read whole; the edge's JSON body limit (1 MiB by default) is the real bound.
constexpr size_t kMaxInputBytes = 64 << 20;
constexpr int64_t kEdgeDefaultTimeoutMs = 5000;  // what the edge uses without "timeout_ms"

std::string PoolPath(const std::string& name) { return "/v1/pools/" + UrlEncode(name, false); }

// ---- fn ------------------------------------------------------------------------------------

struct FnOpts {
  std::string runtime, file, stdin_file;
  std::optional<std::string> code;
  std::vector<std::string> files;  // NAME=PATH
  std::optional<int64_t> timeout_ms, memory_mb;
};

StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") return ReadFdToString(STDIN_FILENO, "stdin", kMaxInputBytes);
  return ReadFileToString(path, kMaxInputBytes);
}

// Bytes (stdin, input files) go base64-encoded, so binary input survives; the code is text.
StatusOr<Json> FnBody(const FnOpts& o, bool json_out) {
  if (o.code.has_value() == !o.file.empty())
    return InvalidArgument("fn: give the code as -c CODE or as a FILE (one of them)");
  Json b = {{"runtime", o.runtime}};
  if (o.code) {
    b["code"] = *o.code;
  } else {
    DSEC_ASSIGN_OR_RETURN(std::string code, ReadInput(o.file));
    b["code"] = std::move(code);
    if (o.file != "-") b["filename"] = BaseName(o.file);
  }
  if (!o.stdin_file.empty()) {
    if (o.stdin_file == "-" && o.file == "-")
      return InvalidArgument("fn: stdin cannot be both the code and --stdin-file");
    DSEC_ASSIGN_OR_RETURN(std::string in, ReadInput(o.stdin_file));
    b["stdin"] = Base64Encode(in);
    b["stdin_encoding"] = "base64";
  }
  DSEC_ASSIGN_OR_RETURN(auto files, ParseKeyValues(o.files, "--file"));
  if (!files.empty()) {
    Json f = Json::object();
    for (const auto& [name, path] : files) {
      auto data = ReadFileToString(path, kMaxInputBytes);
      if (!data.ok())
        return Status(data.status().code(), "--file " + name + ": " + data.status().message());
      f[name] = {{"base64", Base64Encode(*data)}};
    }
    b["files"] = std::move(f);
  }
  if (o.timeout_ms) b["timeout_ms"] = *o.timeout_ms;
  if (o.memory_mb) b["memory_mb"] = *o.memory_mb;
  // --json prints the edge's answer as is: text there; otherwise raw bytes to our stdout/stderr.
  if (!json_out) b["encoding"] = "base64";
  return b;
}

int Fn(const GlobalOptions& g, const FnOpts& o) {
  if (g.has_command) return Fail(InvalidArgument("fn: unexpected \"--\""), kExecFail);
  auto body = FnBody(o, g.json);
  if (!body.ok()) return Fail(body.status(), kExecFail);
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status(), kExecFail);
  auto r = (*c)->CallJson(Verb::post, "/v1/fncalls", &*body);
  if (!r.ok()) return Fail(r.status(), kExecFail);
  if (g.json) {
    PrintJson(*r);
  } else {
    for (auto [key, fd] :
         {std::pair{"stdout", STDOUT_FILENO}, std::pair{"stderr", STDERR_FILENO}}) {
      if (auto d = Base64Decode(r->value(key, ""))) (void)WriteAllFd(fd, *d, key);
    }
  }
  return ExitCodeForResult(*r, o.timeout_ms.value_or(kEdgeDefaultTimeoutMs) / 1000.0);
}

// ---- pool ----------------------------------------------------------------------------------

std::string Field(const Json& p, const char* key) {
  if (!p.contains(key) || p[key].is_null()) return "-";
  const Json& v = p[key];
  if (!v.is_array()) return Num(v);
  std::string out;  // preload as --preload takes it (a,b); a command as argv (a b)
  for (const auto& e : v)
    out += (out.empty() ? "" : std::string_view(key) == "preload" ? "," : " ") + Num(e);
  return out.empty() ? "-" : out;
}

std::string Workers(const Json& p, const char* key) {
  return p.contains("workers") && p["workers"].is_object() ? Field(p["workers"], key) : "-";
}

int ListPools(const GlobalOptions& g) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, "/v1/pools");
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : r->value("pools", Json::array()))
    rows.push_back({Field(p, "name"), Field(p, "kind"), Field(p, "runtime"), Field(p, "min_idle"),
                    Field(p, "max"), Workers(p, "idle"), Workers(p, "busy"), Workers(p, "starting"),
                    Field(p, "queued"), Field(p, "calls"), Field(p, "rejected")});
  PrintTable({"NAME", "KIND", "RUNTIME", "MIN", "MAX", "IDLE", "BUSY", "STARTING", "QUEUED",
              "CALLS", "REJECTED"},
             rows);
  return 0;
}

void ShowPool(const Json& p) {
  static const char* kKeys[] = {"name",           "kind",
                                "runtime",        "image",
                                "preload",        "command",
                                "min_idle",       "max",
                                "memory_mb",      "disk_mb",
                                "pids",           "cpu",
                                "max_queue",      "queue_timeout_ms",
                                "idle_timeout_s", "workers",
                                "queued",         "calls",
                                "taken",          "missed",
                                "rejected",       "replaced",
                                "last_error"};
  std::vector<std::pair<std::string, std::string>> rows;
  size_t w = 0;
  for (std::string k : kKeys) {
    if (!p.contains(k)) continue;
    rows.emplace_back(k, k == "workers"
                             ? "idle " + Workers(p, "idle") + ", busy " + Workers(p, "busy") +
                                   ", starting " + Workers(p, "starting")
                             : Field(p, k.c_str()));
    w = std::max(w, k.size());
  }
  for (const auto& [k, v] : rows)
    std::cout << k << ":" << std::string(w - k.size() + 2, ' ') << v << "\n";
}

int GetPool(const GlobalOptions& g, const std::string& name) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, PoolPath(name));
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    ShowPool(*r);
  return 0;
}

struct PoolOpts {
  std::string name;
  std::optional<std::string> kind, runtime, image, preload;
  std::optional<int64_t> min_idle, max, memory_mb, disk_mb, pids, max_queue, queue_timeout_ms,
      idle_timeout_s;
  std::optional<double> cpu;
};

int PutPool(const GlobalOptions& g, const PoolOpts& o) {
  Json b = Json::object();
  if (o.kind) b["kind"] = *o.kind;
  if (o.runtime) b["runtime"] = *o.runtime;
  if (o.image) b["image"] = *o.image;
  if (o.preload) {
    b["preload"] = Json::array();
    for (auto m : SplitString(*o.preload, ',', true)) b["preload"].push_back(TrimWhitespace(m));
  }
  if (g.has_command) b["command"] = g.command;
  for (auto [key, v] : {std::pair{"min_idle", &o.min_idle}, std::pair{"max", &o.max},
                        std::pair{"memory_mb", &o.memory_mb}, std::pair{"disk_mb", &o.disk_mb},
                        std::pair{"pids", &o.pids}, std::pair{"max_queue", &o.max_queue},
                        std::pair{"queue_timeout_ms", &o.queue_timeout_ms},
                        std::pair{"idle_timeout_s", &o.idle_timeout_s}})
    if (*v) b[key] = **v;
  if (o.cpu) b["cpu"] = *o.cpu;
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::put, PoolPath(o.name), &b);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    ShowPool(*r);
  return 0;
}

int RemovePools(const GlobalOptions& g, const std::vector<std::string>& names) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  int rc = 0;
  for (const auto& name : names) {
    auto r = (*c)->CallJson(Verb::delete_, PoolPath(name));
    if (!r.ok()) {
      rc = Fail(r.status());
      continue;
    }
    std::cout << name << "\n";
  }
  return rc;
}

}  // namespace

void RegisterFnCallCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  auto fo = std::make_shared<FnOpts>();
  CLI::App* fn = app.add_subcommand(
      "fn",
      "Run code on a warm worker of a runtime: dsec fn --runtime python -c CODE | FILE. Prints "
      "its output and exits with its exit code (128+signal if killed, 124 on timeout)");
  fn->add_option("--runtime", fo->runtime, "python, bash or another fncall pool")->required();
  fn->add_option("-c,--code", fo->code, "The code to run");
  fn->add_option("file", fo->file, "A file with the code to run ('-' reads stdin)");
  fn->add_option("--stdin-file", fo->stdin_file, "Give the code this file as stdin ('-': ours)");
  fn->add_option("--file", fo->files, "NAME=PATH: put PATH into the call's directory as NAME")
      ->expected(1)
      ->take_all();
  fn->add_option("--timeout-ms", fo->timeout_ms, "Kill the code after this long (default 5000)");
  fn->add_option("--memory-mb", fo->memory_mb, "Memory limit (default and most: the pool's)");
  fn->callback([fo, &g, exit_code] { *exit_code = Fn(g, *fo); });

  CLI::App* pool = app.add_subcommand("pool", "Warm pools: fncall runtimes and container pools");
  pool->require_subcommand(1);
  CLI::App* ls = pool->add_subcommand("ls", "List the pools");
  ls->callback([&g, exit_code] { *exit_code = ListPools(g); });

  auto get_name = std::make_shared<std::string>();
  CLI::App* get = pool->add_subcommand("get", "Show one pool");
  get->add_option("name", *get_name, "Pool name")->required();
  get->callback([=, &g] { *exit_code = GetPool(g, *get_name); });

  auto po = std::make_shared<PoolOpts>();
  CLI::App* put = pool->add_subcommand(
      "put",
      "Create or change a pool; fields not given keep their values (new pool: the node's "
      "defaults). For runtime exec, the command the code is appended to goes after --");
  put->add_option("name", po->name, "Pool name")->required();
  put->add_option("--kind", po->kind, "fncall (default) or container");
  put->add_option("--runtime", po->runtime, "fncall: python, bash or exec");
  put->add_option("--image", po->image, "Image (container pools: any; fncall: host)");
  put->add_option("--preload", po->preload, "python: modules to import once per worker (a,b)");
  put->add_option("--min-idle", po->min_idle, "Workers kept ready");
  put->add_option("--max", po->max, "Most workers (container: most ready sandboxes)");
  put->add_option("--memory-mb", po->memory_mb, "Memory limit (fncall: per call)");
  put->add_option("--disk-mb", po->disk_mb, "Disk (fncall: each call's directory and /tmp)");
  put->add_option("--pids", po->pids, "Process limit");
  put->add_option("--cpu", po->cpu, "CPU cap in cores");
  put->add_option("--max-queue", po->max_queue, "fncall: calls that may wait for a worker");
  put->add_option("--queue-timeout-ms", po->queue_timeout_ms, "fncall: longest wait for one");
  put->add_option("--idle-timeout-s", po->idle_timeout_s,
                  "fncall: idle workers beyond --min-idle go after this long");
  put->callback([po, &g, exit_code] { *exit_code = PutPool(g, *po); });

  auto rm_names = std::make_shared<std::vector<std::string>>();
  CLI::App* rm = pool->add_subcommand("rm", "Delete pools and their workers");
  rm->add_option("names", *rm_names, "Pool names")->required();
  rm->callback([=, &g] { *exit_code = RemovePools(g, *rm_names); });
}

}  // namespace dsec::cli
