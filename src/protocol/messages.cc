#include "protocol/messages.h"

#include "base/base64.h"

namespace dsec::protocol {

namespace {

StatusOr<std::vector<std::string>> GetStringList(const Json& j, const char* key, size_t max) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array() || it->size() > max)
    return InvalidArgument(std::string("field \"") + key + "\" must be an array of at most " +
                           std::to_string(max) + " strings");
  for (const auto& e : *it) {
    if (!e.is_string())
      return InvalidArgument(std::string("field \"") + key + "\" must hold strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

Json ProgramsToJson(const std::vector<std::string>& progs) {
  Json a = Json::array();
  for (const auto& p : progs) a.push_back(Base64Encode(p));
  return a;
}

StatusOr<std::vector<std::string>> ProgramsFromJson(const Json& j, const char* key) {
  DSEC_ASSIGN_OR_RETURN(auto enc, GetStringList(j, key, 16));
  std::vector<std::string> out;
  for (const auto& e : enc) {
    auto d = Base64Decode(e);
    if (!d) return InvalidArgument(std::string("field \"") + key + "\" is not base64");
    out.push_back(std::move(*d));
  }
  return out;
}

// The directories and files a writable layer starts with (container and guest setup alike).
Json DirsToJson(const std::vector<isolation::DirSpec>& dirs) {
  Json ds = Json::array();
  for (const auto& d : dirs)
    ds.push_back({{"path", d.path}, {"mode", d.mode}, {"uid", d.uid}, {"gid", d.gid}});
  return ds;
}

Json FilesToJson(const std::vector<isolation::FileSpec>& files) {
  Json fs = Json::array();
  for (const auto& f : files)
    fs.push_back({{"path", f.path},
                  {"content", f.content},
                  {"mode", f.mode},
                  {"uid", f.uid},
                  {"gid", f.gid}});
  return fs;
}

// Mode and owner of a dir or file entry.
Status ModeAndOwner(const Json& e, int64_t default_mode, uint32_t* mode, uint32_t* uid,
                    uint32_t* gid) {
  DSEC_ASSIGN_OR_RETURN(int64_t m, GetInt(e, "mode", default_mode, 0, 07777));
  DSEC_ASSIGN_OR_RETURN(int64_t u, GetInt(e, "uid", 0, 0, UINT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t g, GetInt(e, "gid", 0, 0, UINT32_MAX));
  *mode = static_cast<uint32_t>(m);
  *uid = static_cast<uint32_t>(u);
  *gid = static_cast<uint32_t>(g);
  return OkStatus();
}

StatusOr<std::vector<isolation::DirSpec>> DirsFromJson(const Json& arr) {
  std::vector<isolation::DirSpec> out;
  for (const auto& d : arr) {
    isolation::DirSpec spec;
    DSEC_ASSIGN_OR_RETURN(spec.path, GetString(d, "path"));
    DSEC_RETURN_IF_ERROR(ModeAndOwner(d, 0755, &spec.mode, &spec.uid, &spec.gid));
    out.push_back(std::move(spec));
  }
  return out;
}

StatusOr<std::vector<isolation::FileSpec>> FilesFromJson(const Json& arr) {
  std::vector<isolation::FileSpec> out;
  for (const auto& f : arr) {
    isolation::FileSpec spec;
    DSEC_ASSIGN_OR_RETURN(spec.path, GetString(f, "path"));
    DSEC_ASSIGN_OR_RETURN(spec.content, GetString(f, "content", ""));
    DSEC_RETURN_IF_ERROR(ModeAndOwner(f, 0644, &spec.mode, &spec.uid, &spec.gid));
    out.push_back(std::move(spec));
  }
  return out;
}

Json ToJson(const isolation::RootfsSpec& r) {
  Json j = {{"size_bytes", r.size_bytes}, {"inodes", r.inodes}, {"userns", r.userns}};
  Json ov = Json::array();
  for (const auto& o : r.overlays) ov.push_back({{"target", o.target}, {"lower", o.lower_fds}});
  j["overlays"] = ov;
  Json sl = Json::array();
  for (const auto& s : r.symlinks) sl.push_back({{"path", s.path}, {"target", s.target}});
  j["symlinks"] = sl;
  j["dirs"] = DirsToJson(r.dirs);
  j["files"] = FilesToJson(r.files);
  j["pty_max"] = r.pty_max;
  Json sc = Json::object();
  for (const auto& [k, v] : r.sysctls) sc[k] = v;
  j["sysctls"] = sc;
  j["proc_views"] = r.proc_views;
  return j;
}

StatusOr<isolation::RootfsSpec> RootfsFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("rootfs must be an object");
  isolation::RootfsSpec r;
  DSEC_ASSIGN_OR_RETURN(int64_t size, GetInt(j, "size_bytes", {}, 1 << 20, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t inodes, GetInt(j, "inodes", {}, 64, INT64_MAX));
  r.size_bytes = static_cast<uint64_t>(size);
  r.inodes = static_cast<uint64_t>(inodes);
  DSEC_ASSIGN_OR_RETURN(r.userns, GetBool(j, "userns", false));
  auto arr = [&](const char* key) -> const Json& {
    static const Json kEmpty = Json::array();
    auto it = j.find(key);
    return it != j.end() && it->is_array() ? *it : kEmpty;
  };
  for (const auto& o : arr("overlays")) {
    isolation::OverlaySpec spec;
    DSEC_ASSIGN_OR_RETURN(spec.target, GetString(o, "target"));
    auto lower = o.find("lower");
    if (lower == o.end() || !lower->is_array())
      return InvalidArgument("overlay.lower must be an array");
    for (const auto& l : *lower) {
      if (!l.is_number_integer()) return InvalidArgument("overlay.lower must hold integers");
      spec.lower_fds.push_back(l.get<int>());
    }
    r.overlays.push_back(std::move(spec));
  }
  for (const auto& s : arr("symlinks")) {
    isolation::SymlinkSpec spec;
    DSEC_ASSIGN_OR_RETURN(spec.path, GetString(s, "path"));
    DSEC_ASSIGN_OR_RETURN(spec.target, GetString(s, "target"));
    r.symlinks.push_back(std::move(spec));
  }
  DSEC_ASSIGN_OR_RETURN(r.dirs, DirsFromJson(arr("dirs")));
  DSEC_ASSIGN_OR_RETURN(r.files, FilesFromJson(arr("files")));
  DSEC_ASSIGN_OR_RETURN(int64_t pty_max, GetInt(j, "pty_max", 0, 0, 1 << 20));
  r.pty_max = static_cast<uint32_t>(pty_max);
  DSEC_ASSIGN_OR_RETURN(r.proc_views, GetStringList(j, "proc_views", 16));
  if (auto sc = j.find("sysctls"); sc != j.end()) {
    if (!sc->is_object() || sc->size() > 64)
      return InvalidArgument("rootfs.sysctls must be an object of at most 64 strings");
    for (const auto& item : sc->items()) {
      if (!item.value().is_string()) return InvalidArgument("rootfs.sysctls values are strings");
      r.sysctls.emplace_back(item.key(), item.value().get<std::string>());
    }
  }
  return r;
}

}  // namespace

namespace {

Json RlimitsToJson(const isolation::Rlimits& r) {
  return {{"nofile", r.nofile}, {"fsize", r.fsize}, {"core", r.core}, {"stack", r.stack}};
}

Status RlimitsFromJson(const Json& j, isolation::Rlimits* out) {
  auto rl = j.find("rlimits");
  if (rl == j.end() || !rl->is_object()) return OkStatus();
  DSEC_ASSIGN_OR_RETURN(int64_t nofile, GetInt(*rl, "nofile", 65536, 16, 1 << 30));
  DSEC_ASSIGN_OR_RETURN(int64_t fsize, GetInt(*rl, "fsize", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t core, GetInt(*rl, "core", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t stack, GetInt(*rl, "stack", 8 << 20, 1 << 16, INT64_MAX));
  *out = {static_cast<uint64_t>(nofile), static_cast<uint64_t>(fsize), static_cast<uint64_t>(core),
          static_cast<uint64_t>(stack)};
  return OkStatus();
}

}  // namespace

Json ToJson(const SetupSpec& s) {
  return {{"sandbox_id", s.sandbox_id},
          {"hostname", s.hostname},
          {"secret", s.secret},
          {"rootfs", ToJson(s.rootfs)},
          {"rlimits", RlimitsToJson(s.rlimits)},
          {"seccomp", ProgramsToJson(s.seccomp)},
          {"agent_caps", s.agent_caps},
          {"cgroup_kill", s.cgroup_kill},
          {"max_execs", s.max_execs},
          {"orphan_timeout_ms", s.orphan_timeout_ms},
          {"zygote", s.zygote ? Json{{"args", s.zygote->args},
                                     {"env", s.zygote->env},
                                     {"call_seccomp", ProgramsToJson(s.zygote->call_seccomp)},
                                     {"caps", s.zygote->caps}}
                              : Json()},
          {"fds",
           {{"mount_dir", s.fds.mount_dir},
            {"listen", s.fds.listen},
            {"cgroup_user", s.fds.cgroup_user},
            {"first_layer", s.fds.first_layer},
            {"layer_count", s.fds.layer_count},
            {"zygote_binary", s.fds.zygote_binary},
            {"disk", s.fds.disk},
            {"uid_lease", s.fds.uid_lease},
            {"first_proc_view", s.fds.first_proc_view}}}};
}

Json ToJson(const GuestSetup& s) {
  return {{"sandbox_id", s.sandbox_id},
          {"hostname", s.hostname},
          {"secret", s.secret},
          {"realtime_ns", s.realtime_ns},
          {"entropy", s.entropy},
          {"disk_mb", s.disk_mb},
          {"rlimits", RlimitsToJson(s.rlimits)},
          {"max_execs", s.max_execs},
          {"orphan_timeout_ms", s.orphan_timeout_ms},
          {"pids", s.pids},
          {"net_address", s.net_address},
          {"net_gateway", s.net_gateway},
          {"dirs", DirsToJson(s.dirs)},
          {"files", FilesToJson(s.files)},
          {"prepare", s.prepare}};
}

StatusOr<GuestSetup> GuestSetupFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("guest setup must be an object");
  GuestSetup s;
  DSEC_ASSIGN_OR_RETURN(s.sandbox_id, GetString(j, "sandbox_id"));
  DSEC_ASSIGN_OR_RETURN(s.hostname, GetString(j, "hostname"));
  if (s.hostname.empty() || s.hostname.size() > 64) return InvalidArgument("bad hostname");
  DSEC_ASSIGN_OR_RETURN(s.secret, GetString(j, "secret"));
  DSEC_ASSIGN_OR_RETURN(s.realtime_ns, GetInt(j, "realtime_ns", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(s.entropy, GetString(j, "entropy", ""));
  if (s.entropy.size() > 1024) return InvalidArgument("entropy is at most 512 bytes");
  DSEC_ASSIGN_OR_RETURN(s.disk_mb, GetInt(j, "disk_mb", 0, 0, 1 << 30));
  DSEC_RETURN_IF_ERROR(RlimitsFromJson(j, &s.rlimits));
  DSEC_ASSIGN_OR_RETURN(int64_t max_execs, GetInt(j, "max_execs", 64, 1, 4096));
  s.max_execs = static_cast<uint32_t>(max_execs);
  DSEC_ASSIGN_OR_RETURN(s.orphan_timeout_ms, GetInt(j, "orphan_timeout_ms", -1, -1, INT64_MAX / 2));
  DSEC_ASSIGN_OR_RETURN(s.pids, GetInt(j, "pids", 0, 0, 1 << 22));
  DSEC_ASSIGN_OR_RETURN(s.net_address, GetString(j, "net_address", ""));
  DSEC_ASSIGN_OR_RETURN(s.net_gateway, GetString(j, "net_gateway", ""));
  if (s.net_address.size() > 15 || s.net_gateway.size() > 15 ||
      s.net_address.empty() != s.net_gateway.empty())
    return InvalidArgument("net_address and net_gateway are IPv4 addresses, both or neither");
  for (const char* key : {"dirs", "files"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_array())
      return InvalidArgument(std::string(key) + " must be an array");
  }
  static const Json kEmpty = Json::array();
  auto dirs = j.find("dirs"), files = j.find("files");
  DSEC_ASSIGN_OR_RETURN(s.dirs, DirsFromJson(dirs != j.end() ? *dirs : kEmpty));
  DSEC_ASSIGN_OR_RETURN(s.files, FilesFromJson(files != j.end() ? *files : kEmpty));
  DSEC_ASSIGN_OR_RETURN(s.prepare, GetBool(j, "prepare", false));
  return s;
}

Json ToJson(const GuestIdentity& g) {
  return {{"sandbox_id", g.sandbox_id}, {"hostname", g.hostname},
          {"secret", g.secret},         {"realtime_ns", g.realtime_ns},
          {"entropy", g.entropy},       {"files", FilesToJson(g.files)}};
}

StatusOr<GuestIdentity> GuestIdentityFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("guest identity must be an object");
  GuestIdentity g;
  DSEC_ASSIGN_OR_RETURN(g.sandbox_id, GetString(j, "sandbox_id"));
  DSEC_ASSIGN_OR_RETURN(g.hostname, GetString(j, "hostname"));
  if (g.hostname.empty() || g.hostname.size() > 64) return InvalidArgument("bad hostname");
  DSEC_ASSIGN_OR_RETURN(g.secret, GetString(j, "secret"));
  if (g.secret.empty() || g.secret.size() > 256)
    return InvalidArgument("field \"secret\" is malformed");
  DSEC_ASSIGN_OR_RETURN(g.realtime_ns, GetInt(j, "realtime_ns", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(g.entropy, GetString(j, "entropy", ""));
  if (g.entropy.size() > 1024) return InvalidArgument("entropy is at most 512 bytes");
  auto files = j.find("files");
  if (files != j.end() && !files->is_array()) return InvalidArgument("files must be an array");
  static const Json kEmpty = Json::array();
  DSEC_ASSIGN_OR_RETURN(g.files, FilesFromJson(files != j.end() ? *files : kEmpty));
  return g;
}

StatusOr<SetupSpec> SetupSpecFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("setup must be an object");
  SetupSpec s;
  DSEC_ASSIGN_OR_RETURN(s.sandbox_id, GetString(j, "sandbox_id"));
  DSEC_ASSIGN_OR_RETURN(s.hostname, GetString(j, "hostname"));
  DSEC_ASSIGN_OR_RETURN(s.secret, GetString(j, "secret"));
  auto rootfs = j.find("rootfs");
  if (rootfs == j.end()) return InvalidArgument("missing field \"rootfs\"");
  DSEC_ASSIGN_OR_RETURN(s.rootfs, RootfsFromJson(*rootfs));
  DSEC_RETURN_IF_ERROR(RlimitsFromJson(j, &s.rlimits));
  DSEC_ASSIGN_OR_RETURN(s.seccomp, ProgramsFromJson(j, "seccomp"));
  auto caps = j.find("agent_caps");
  if (caps != j.end() && caps->is_number_unsigned()) s.agent_caps = caps->get<uint64_t>();
  DSEC_ASSIGN_OR_RETURN(s.cgroup_kill, GetBool(j, "cgroup_kill", true));
  DSEC_ASSIGN_OR_RETURN(int64_t max_execs, GetInt(j, "max_execs", 64, 1, 4096));
  s.max_execs = static_cast<uint32_t>(max_execs);
  DSEC_ASSIGN_OR_RETURN(s.orphan_timeout_ms, GetInt(j, "orphan_timeout_ms", -1, -1, INT64_MAX / 2));
  auto fds = j.find("fds");
  if (fds == j.end() || !fds->is_object()) return InvalidArgument("missing field \"fds\"");
  DSEC_ASSIGN_OR_RETURN(int64_t md, GetInt(*fds, "mount_dir", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t ls, GetInt(*fds, "listen", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t cg, GetInt(*fds, "cgroup_user", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t fl, GetInt(*fds, "first_layer", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t lc, GetInt(*fds, "layer_count", 0, 0, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t zb, GetInt(*fds, "zygote_binary", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t dk, GetInt(*fds, "disk", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t ul, GetInt(*fds, "uid_lease", -1, -1, 252));
  DSEC_ASSIGN_OR_RETURN(int64_t pv, GetInt(*fds, "first_proc_view", -1, -1, 252));
  s.fds = {static_cast<int>(md), static_cast<int>(ls), static_cast<int>(cg),
           static_cast<int>(fl), static_cast<int>(lc), static_cast<int>(zb),
           static_cast<int>(dk), static_cast<int>(ul), static_cast<int>(pv)};
  if (auto z = j.find("zygote"); z != j.end() && !z->is_null()) {
    if (!z->is_object()) return InvalidArgument("zygote must be an object");
    ZygoteSpec zs;
    DSEC_ASSIGN_OR_RETURN(zs.args, GetStringList(*z, "args", 256));
    DSEC_ASSIGN_OR_RETURN(zs.env, GetStringList(*z, "env", 4096));
    DSEC_ASSIGN_OR_RETURN(zs.call_seccomp, ProgramsFromJson(*z, "call_seccomp"));
    auto zc = z->find("caps");
    if (zc != z->end() && zc->is_number_unsigned()) zs.caps = zc->get<uint64_t>();
    s.zygote = std::move(zs);
  }
  return s;
}

Json ToJson(const ExecSpec& s) {
  Json j = {{"argv", s.argv},
            {"env", s.env},
            {"cwd", s.cwd},
            {"uid", s.uid},
            {"gid", s.gid},
            {"root_caps", s.root_caps},
            {"timeout_ms", s.timeout_ms},
            {"max_output_bytes", s.max_output_bytes},
            {"stdin_stream", s.stdin_stream},
            {"tty", s.tty},
            {"cols", s.cols},
            {"rows", s.rows}};
  if (!s.stdin_data.empty()) j["stdin_b64"] = Base64Encode(s.stdin_data);
  if (s.fncall) j["fncall"] = ToJson(*s.fncall);
  return j;
}

Json ToJson(const FnCallSpec& f) {
  Json files = Json::array();
  for (const auto& [name, data] : f.files) files.push_back({name, Base64Encode(data)});
  return {{"code", f.code}, {"filename", f.filename}, {"files", files}};
}

StatusOr<FnCallSpec> FnCallSpecFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("fncall must be an object");
  FnCallSpec f;
  DSEC_ASSIGN_OR_RETURN(f.code, GetString(j, "code"));
  DSEC_ASSIGN_OR_RETURN(f.filename, GetString(j, "filename", ""));
  if (auto it = j.find("files"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 1024)
      return InvalidArgument("fncall.files must be an array of at most 1024 entries");
    for (const auto& e : *it) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
        return InvalidArgument("fncall.files entries must be [name, base64]");
      auto data = Base64Decode(e[1].get<std::string>());
      if (!data) return InvalidArgument("fncall.files content is not base64");
      f.files.emplace_back(e[0].get<std::string>(), std::move(*data));
    }
  }
  return f;
}

StatusOr<ExecSpec> ExecSpecFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("exec spec must be an object");
  ExecSpec s;
  if (auto fc = j.find("fncall"); fc != j.end() && !fc->is_null()) {
    DSEC_ASSIGN_OR_RETURN(s.fncall, FnCallSpecFromJson(*fc));
  }
  DSEC_ASSIGN_OR_RETURN(s.argv, GetStringList(j, "argv", 65536));
  if (!s.fncall && (s.argv.empty() || s.argv[0].empty()))
    return InvalidArgument("argv must not be empty");
  DSEC_ASSIGN_OR_RETURN(s.env, GetStringList(j, "env", 4096));
  DSEC_ASSIGN_OR_RETURN(s.cwd, GetString(j, "cwd", "/"));
  DSEC_ASSIGN_OR_RETURN(int64_t uid, GetInt(j, "uid", std::nullopt, 0, 65535));
  DSEC_ASSIGN_OR_RETURN(int64_t gid, GetInt(j, "gid", std::nullopt, 0, 65535));
  s.uid = static_cast<uint32_t>(uid);
  s.gid = static_cast<uint32_t>(gid);
  DSEC_ASSIGN_OR_RETURN(s.root_caps, GetBool(j, "root_caps", false));
  DSEC_ASSIGN_OR_RETURN(s.timeout_ms, GetInt(j, "timeout_ms", 0, 0, INT64_MAX / 2));
  DSEC_ASSIGN_OR_RETURN(int64_t maxout, GetInt(j, "max_output_bytes", 1 << 20, 0, INT64_MAX));
  s.max_output_bytes = static_cast<uint64_t>(maxout);
  DSEC_ASSIGN_OR_RETURN(s.stdin_stream, GetBool(j, "stdin_stream", false));
  DSEC_ASSIGN_OR_RETURN(std::string in, GetString(j, "stdin_b64", ""));
  auto dec = Base64Decode(in);
  if (!dec) return InvalidArgument("stdin_b64 is not base64");
  s.stdin_data = std::move(*dec);
  DSEC_ASSIGN_OR_RETURN(s.tty, GetBool(j, "tty", false));
  DSEC_ASSIGN_OR_RETURN(int64_t cols, GetInt(j, "cols", 80, 1, 10000));
  DSEC_ASSIGN_OR_RETURN(int64_t rows, GetInt(j, "rows", 24, 1, 10000));
  s.cols = static_cast<uint16_t>(cols);
  s.rows = static_cast<uint16_t>(rows);
  return s;
}

Json ToJson(const ExecResult& r) {
  return {{"exit_code", r.exit_code},
          {"signal", r.signal},
          {"timed_out", r.timed_out},
          {"oom_killed", r.oom_killed},
          {"stdout_truncated", r.stdout_truncated},
          {"stderr_truncated", r.stderr_truncated},
          {"stdout_bytes", r.stdout_bytes},
          {"stderr_bytes", r.stderr_bytes},
          {"duration_ms", r.duration_ms},
          {"pid", r.pid}};
}

StatusOr<ExecResult> ExecResultFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("exec result must be an object");
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  ExecResult r;
  DSEC_ASSIGN_OR_RETURN(int64_t code, GetInt(j, "exit_code", -1, INT32_MIN, INT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t sig, GetInt(j, "signal", 0, 0, 128));
  r.exit_code = static_cast<int>(code);
  r.signal = static_cast<int>(sig);
  DSEC_ASSIGN_OR_RETURN(r.timed_out, GetBool(j, "timed_out", false));
  DSEC_ASSIGN_OR_RETURN(r.oom_killed, GetBool(j, "oom_killed", false));
  DSEC_ASSIGN_OR_RETURN(r.stdout_truncated, GetBool(j, "stdout_truncated", false));
  DSEC_ASSIGN_OR_RETURN(r.stderr_truncated, GetBool(j, "stderr_truncated", false));
  DSEC_ASSIGN_OR_RETURN(int64_t ob, GetInt(j, "stdout_bytes", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t eb, GetInt(j, "stderr_bytes", 0, 0, INT64_MAX));
  r.stdout_bytes = static_cast<uint64_t>(ob);
  r.stderr_bytes = static_cast<uint64_t>(eb);
  auto d = j.find("duration_ms");
  if (d != j.end() && d->is_number()) r.duration_ms = d->get<double>();
  DSEC_ASSIGN_OR_RETURN(int64_t pid, GetInt(j, "pid", 0, 0, INT32_MAX));
  r.pid = static_cast<int>(pid);
  return r;
}

Json ToJson(const FileEntry& e) {
  return {{"name", e.name},
          {"type", e.type},
          {"size", e.size},
          {"mode", e.mode},
          {"mtime", e.mtime_ms}};
}

StatusOr<FileEntry> FileEntryFromJson(const Json& j) {
  FileEntry e;
  DSEC_ASSIGN_OR_RETURN(e.name, GetString(j, "name"));
  DSEC_ASSIGN_OR_RETURN(e.type, GetString(j, "type"));
  DSEC_ASSIGN_OR_RETURN(int64_t size, GetInt(j, "size", 0, 0, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t mode, GetInt(j, "mode", 0, 0, 0177777));
  DSEC_ASSIGN_OR_RETURN(e.mtime_ms, GetInt(j, "mtime", 0));
  e.size = static_cast<uint64_t>(size);
  e.mode = static_cast<uint32_t>(mode);
  return e;
}

Json ErrorJson(const Status& s) {
  return {{"error", {{"code", std::string(StatusCodeName(s.code()))}, {"message", s.message()}}}};
}

Status StatusFromJson(const Json& j) {
  auto it = j.find("error");
  if (it == j.end() || !it->is_object()) return OkStatus();
  std::string code = GetString(*it, "code", "internal").value_or("internal");
  std::string msg = GetString(*it, "message", "agent error").value_or("agent error");
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == code)
      return Status(static_cast<StatusCode>(c), msg);
  }
  return InternalError(msg);
}

}  // namespace dsec::protocol
