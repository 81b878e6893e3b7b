#include "protocol/agent_ops.h"

namespace dsec::protocol {

namespace {

Json WithOp(std::string_view op, Json j) {
  j["op"] = std::string(op);
  return j;
}

template <class U>
Status GetUnsigned(const Json& j, const char* key, std::optional<uint64_t> def, uint64_t max,
                   U* out) {
  std::optional<int64_t> d;
  if (def) d = static_cast<int64_t>(*def);
  DSEC_ASSIGN_OR_RETURN(int64_t v, GetInt(j, key, d, 0, static_cast<int64_t>(max)));
  *out = static_cast<U>(v);
  return OkStatus();
}

Json AsJson(const RunAs& a, Json j) {
  j["uid"] = a.uid;
  j["gid"] = a.gid;
  return j;
}

// Required: the agent has no default user.
Status DecodeRunAs(const Json& j, RunAs* out) {
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "uid", std::nullopt, 65535, &out->uid));
  return GetUnsigned(j, "gid", std::nullopt, 65535, &out->gid);
}

Status DecodePath(const Json& j, std::string* out) {
  DSEC_ASSIGN_OR_RETURN(*out, GetString(j, "path"));
  return ValidateSandboxPath(*out);
}

StatusOr<std::string> ShellId(const Json& j) {
  DSEC_ASSIGN_OR_RETURN(std::string id, GetString(j, "shell_id"));
  if (id.empty() || id.size() > 64) return InvalidArgument("field \"shell_id\" is malformed");
  return id;
}

}  // namespace

Status ValidateSandboxPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return InvalidArgument("path must be absolute");
  if (path.size() > kMaxPathBytes) return InvalidArgument("path is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return InvalidArgument("path contains a NUL byte");
  return OkStatus();
}

Json Encode(const Hello& h) {
  return {{"version", h.version}, {"pid", h.pid}, {"shells", h.shells}};
}
Status Decode(const Json& j, Hello* out) {
  DSEC_ASSIGN_OR_RETURN(int64_t v, GetInt(j, "version", 1, 0, INT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t pid, GetInt(j, "pid", 0, 0, INT32_MAX));
  out->version = static_cast<int>(v);
  out->pid = static_cast<int>(pid);
  out->shells.clear();
  if (auto it = j.find("shells"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 4096)
      return InvalidArgument("field \"shells\" must be an array");
    for (const auto& s : *it) {
      if (!s.is_string()) return InvalidArgument("field \"shells\" must hold strings");
      out->shells.push_back(s.get<std::string>());
    }
  }
  return OkStatus();
}
Json Encode(const Auth& a) {
  Json j = {{"secret", a.secret}};
  if (a.identity) j["identity"] = ToJson(*a.identity);
  return j;
}
Status Decode(const Json& j, Auth* out) {
  DSEC_ASSIGN_OR_RETURN(out->secret, GetString(j, "secret"));
  if (out->secret.empty() || out->secret.size() > 256)
    return InvalidArgument("field \"secret\" is malformed");
  out->identity.reset();
  if (auto it = j.find("identity"); it != j.end() && !it->is_null()) {
    DSEC_ASSIGN_OR_RETURN(out->identity, GuestIdentityFromJson(*it));
  }
  return OkStatus();
}

Json Encode(const Ready& r) { return {{"pid", r.pid}, {"layer_fd", r.layer_fd}}; }
Status Decode(const Json& j, Ready* out) {
  DSEC_ASSIGN_OR_RETURN(int64_t pid, GetInt(j, "pid", 0, 0, INT32_MAX));
  DSEC_ASSIGN_OR_RETURN(int64_t fd, GetInt(j, "layer_fd", -1, -1, INT32_MAX));
  out->pid = static_cast<int>(pid);
  out->layer_fd = static_cast<int>(fd);
  return OkStatus();
}

Status CheckVersion(const Hello& h) {
  if (h.version < kMinProtocolVersion || h.version > kProtocolVersion)
    return FailedPrecondition("the agent speaks protocol version " + std::to_string(h.version) +
                              "; this edge speaks " + std::to_string(kMinProtocolVersion) + " to " +
                              std::to_string(kProtocolVersion));
  return OkStatus();
}

Json Encode(const OkResponse&) { return {{"ok", true}}; }
Status Decode(const Json& j, OkResponse*) { return StatusFromJson(j); }

Json Encode(const ExecRequest& r) { return WithOp(r.kOp, ToJson(r.spec)); }
Status Decode(const Json& j, ExecRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->spec, ExecSpecFromJson(j));
  return OkStatus();
}

Json Encode(const ShellOpenRequest& r) { return WithOp(r.kOp, ToJson(r.spec)); }
Status Decode(const Json& j, ShellOpenRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->spec, ExecSpecFromJson(j));
  return OkStatus();
}
Json Encode(const ShellOpenResponse& r) { return {{"shell_id", r.shell_id}}; }
Status Decode(const Json& j, ShellOpenResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_ASSIGN_OR_RETURN(out->shell_id, ShellId(j));
  return OkStatus();
}

Json Encode(const ShellRunRequest& r) {
  return WithOp(r.kOp, {{"shell_id", r.shell_id},
                        {"command", r.command},
                        {"timeout_ms", r.timeout_ms},
                        {"max_output_bytes", r.max_output_bytes}});
}
Status Decode(const Json& j, ShellRunRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->shell_id, ShellId(j));
  DSEC_ASSIGN_OR_RETURN(out->command, GetString(j, "command"));
  DSEC_ASSIGN_OR_RETURN(out->timeout_ms, GetInt(j, "timeout_ms", 0, 0, INT64_MAX / 2));
  return GetUnsigned(j, "max_output_bytes", 1 << 20, INT64_MAX, &out->max_output_bytes);
}
Json Encode(const ShellRunResponse& r) {
  Json j = ToJson(r.result);
  if (r.session_ended) j["session_ended"] = true;
  return j;
}
Status Decode(const Json& j, ShellRunResponse* out) {
  DSEC_ASSIGN_OR_RETURN(out->result, ExecResultFromJson(j));
  DSEC_ASSIGN_OR_RETURN(out->session_ended, GetBool(j, "session_ended", false));
  return OkStatus();
}

Json Encode(const ShellCloseRequest& r) { return WithOp(r.kOp, {{"shell_id", r.shell_id}}); }
Status Decode(const Json& j, ShellCloseRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->shell_id, ShellId(j));
  return OkStatus();
}

Json Encode(const SignalAllRequest& r) { return WithOp(r.kOp, {{"signal", r.signal}}); }
Status Decode(const Json& j, SignalAllRequest* out) {
  DSEC_ASSIGN_OR_RETURN(int64_t sig, GetInt(j, "signal", 9, 1, 64));
  out->signal = static_cast<int>(sig);
  return OkStatus();
}
Json Encode(const SignalAllResponse& r) { return {{"processes", r.processes}}; }
Status Decode(const Json& j, SignalAllResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  return GetUnsigned(j, "processes", 0, INT32_MAX, &out->processes);
}

Json Encode(const PortConnectRequest& r) { return WithOp(r.kOp, {{"port", r.port}}); }
Status Decode(const Json& j, PortConnectRequest* out) {
  DSEC_ASSIGN_OR_RETURN(int64_t port, GetInt(j, "port", std::nullopt, 1, 65535));
  out->port = static_cast<uint16_t>(port);
  return OkStatus();
}

Json Encode(const WatchDirRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path},
                                     {"recursive", r.recursive},
                                     {"include_entry", r.include_entry},
                                     {"max_dirs", r.max_dirs}}));
}
Status Decode(const Json& j, WatchDirRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_ASSIGN_OR_RETURN(out->recursive, GetBool(j, "recursive", false));
  DSEC_ASSIGN_OR_RETURN(out->include_entry, GetBool(j, "include_entry", false));
  DSEC_ASSIGN_OR_RETURN(int64_t max, GetInt(j, "max_dirs", 4096, 1, 65536));
  out->max_dirs = static_cast<uint32_t>(max);
  return OkStatus();
}
Json ToJson(const WatchEvent& e) {
  Json j = {{"name", e.name}, {"type", e.type}};
  if (e.entry) j["entry"] = ToJson(*e.entry);
  return j;
}
StatusOr<WatchEvent> WatchEventFromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("a watch event must be an object");
  WatchEvent e;
  DSEC_ASSIGN_OR_RETURN(e.name, GetString(j, "name"));
  DSEC_ASSIGN_OR_RETURN(e.type, GetString(j, "type"));
  if (e.type != "create" && e.type != "write" && e.type != "remove" && e.type != "rename" &&
      e.type != "chmod")
    return InvalidArgument("unknown watch event type \"" + e.type + "\"");
  if (auto it = j.find("entry"); it != j.end() && it->is_object()) {
    DSEC_ASSIGN_OR_RETURN(FileEntry fe, FileEntryFromJson(*it));
    e.entry = std::move(fe);
  }
  return e;
}

Json Encode(const CaptureLayerRequest& r) {
  return WithOp(r.kOp, {{"skip", r.skip},
                        {"empty", r.empty},
                        {"keep_setuid", r.keep_setuid},
                        {"max_apparent_bytes", r.max_apparent_bytes}});
}
Status Decode(const Json& j, CaptureLayerRequest* out) {
  for (auto [key, list] : {std::pair{"skip", &out->skip}, std::pair{"empty", &out->empty}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_array() || it->size() > 256)
      return InvalidArgument(std::string("field \"") + key + "\" must be a list of paths");
    for (const auto& p : *it) {
      if (!p.is_string() || p.get<std::string>().empty() || p.get<std::string>()[0] != '/')
        return InvalidArgument(std::string("field \"") + key + "\" must hold absolute paths");
      list->push_back(p.get<std::string>());
    }
  }
  DSEC_ASSIGN_OR_RETURN(out->keep_setuid, GetBool(j, "keep_setuid", false));
  return GetUnsigned(j, "max_apparent_bytes", 0, INT64_MAX, &out->max_apparent_bytes);
}

Json Encode(const PingRequest& r) { return WithOp(r.kOp, Json::object()); }
Status Decode(const Json&, PingRequest*) { return OkStatus(); }
Json Encode(const PingResponse& r) { return {{"pid", r.pid}, {"active", r.active}}; }
Status Decode(const Json& j, PingResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "pid", 0, INT32_MAX, &out->pid));
  return GetUnsigned(j, "active", 0, INT32_MAX, &out->active);
}

namespace {
StatusOr<std::string> JobId(const Json& j) {
  DSEC_ASSIGN_OR_RETURN(std::string id, GetString(j, "job_id"));
  if (id.empty() || id.size() > 64) return InvalidArgument("field \"job_id\" is malformed");
  return id;
}
}  // namespace

Json Encode(const JobInfo& i) {
  return {{"job_id", i.job_id},
          {"pid", i.pid},
          {"started_at", i.started_at},
          {"done", i.done},
          {"meta", i.meta},
          {"stdout_kept", i.stdout_kept},
          {"stderr_kept", i.stderr_kept},
          {"result", i.done ? ToJson(i.result) : Json(nullptr)}};
}
Status Decode(const Json& j, JobInfo* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_ASSIGN_OR_RETURN(out->job_id, JobId(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "pid", 0, INT32_MAX, &out->pid));
  DSEC_ASSIGN_OR_RETURN(out->started_at, GetInt(j, "started_at", 0, INT64_MIN, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(out->done, GetBool(j, "done", false));
  DSEC_ASSIGN_OR_RETURN(out->meta, GetString(j, "meta", ""));
  if (out->meta.size() > kMaxJobMeta) return InvalidArgument("field \"meta\" is too long");
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stdout_kept", 0, INT64_MAX, &out->stdout_kept));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stderr_kept", 0, INT64_MAX, &out->stderr_kept));
  if (out->done) {
    auto it = j.find("result");
    if (it == j.end() || !it->is_object()) return InvalidArgument("missing field \"result\"");
    DSEC_ASSIGN_OR_RETURN(out->result, ExecResultFromJson(*it));
  }
  return OkStatus();
}

Json Encode(const JobStartRequest& r) {
  Json j = ToJson(r.spec);
  j["job_id"] = r.job_id;
  j["started_at"] = r.started_at;
  j["meta"] = r.meta;
  j["keep"] = r.keep;
  j["max_kept_bytes"] = r.max_kept_bytes;
  return WithOp(r.kOp, std::move(j));
}
Status Decode(const Json& j, JobStartRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->job_id, JobId(j));
  DSEC_ASSIGN_OR_RETURN(out->started_at, GetInt(j, "started_at", 0, INT64_MIN, INT64_MAX));
  DSEC_ASSIGN_OR_RETURN(out->meta, GetString(j, "meta", ""));
  if (out->meta.size() > kMaxJobMeta) return InvalidArgument("field \"meta\" is too long");
  DSEC_ASSIGN_OR_RETURN(int64_t keep, GetInt(j, "keep", 256, 1, 100000));
  out->keep = static_cast<uint32_t>(keep);
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "max_kept_bytes", 64 << 20, INT64_MAX, &out->max_kept_bytes));
  DSEC_ASSIGN_OR_RETURN(out->spec, ExecSpecFromJson(j));
  if (out->spec.stdin_stream) return InvalidArgument("a job takes its stdin inline");
  return OkStatus();
}

Json Encode(const JobReadRequest& r) {
  return WithOp(r.kOp, {{"job_id", r.job_id},
                        {"stdout_offset", r.stdout_offset},
                        {"stderr_offset", r.stderr_offset},
                        {"max_bytes", r.max_bytes},
                        {"wait_ms", r.wait_ms},
                        {"wait_exit", r.wait_exit}});
}
Status Decode(const Json& j, JobReadRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->job_id, JobId(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stdout_offset", 0, INT64_MAX, &out->stdout_offset));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stderr_offset", 0, INT64_MAX, &out->stderr_offset));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "max_bytes", 1 << 20, kMaxJobRead, &out->max_bytes));
  DSEC_ASSIGN_OR_RETURN(out->wait_ms, GetInt(j, "wait_ms", 0, 0, kMaxJobWaitMs));
  DSEC_ASSIGN_OR_RETURN(out->wait_exit, GetBool(j, "wait_exit", false));
  return OkStatus();
}
Json Encode(const JobReadResponse& r) {
  Json j = Encode(r.info);
  j["stdout_offset"] = r.stdout_offset;
  j["stderr_offset"] = r.stderr_offset;
  j["stdout_sent"] = r.stdout_sent;
  j["stderr_sent"] = r.stderr_sent;
  return j;
}
Status Decode(const Json& j, JobReadResponse* out) {
  DSEC_RETURN_IF_ERROR(Decode(j, &out->info));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stdout_offset", 0, INT64_MAX, &out->stdout_offset));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stderr_offset", 0, INT64_MAX, &out->stderr_offset));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "stdout_sent", 0, kMaxJobRead, &out->stdout_sent));
  return GetUnsigned(j, "stderr_sent", 0, kMaxJobRead, &out->stderr_sent);
}

Json Encode(const JobKillRequest& r) {
  return WithOp(r.kOp, {{"job_id", r.job_id}, {"forget", r.forget}});
}
Status Decode(const Json& j, JobKillRequest* out) {
  DSEC_ASSIGN_OR_RETURN(out->job_id, JobId(j));
  DSEC_ASSIGN_OR_RETURN(out->forget, GetBool(j, "forget", false));
  return OkStatus();
}

Json Encode(const JobListRequest& r) { return WithOp(r.kOp, Json::object()); }
Status Decode(const Json&, JobListRequest*) { return OkStatus(); }
Json Encode(const JobListResponse& r) {
  Json jobs = Json::array();
  for (const auto& i : r.jobs) jobs.push_back(Encode(i));
  return {{"jobs", jobs}};
}
Status Decode(const Json& j, JobListResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  auto it = j.find("jobs");
  if (it == j.end() || !it->is_array() || it->size() > 100000)
    return InvalidArgument("missing field \"jobs\"");
  out->jobs.clear();
  for (const auto& e : *it) {
    if (!e.is_object()) return InvalidArgument("field \"jobs\" must hold objects");
    JobInfo i;
    DSEC_RETURN_IF_ERROR(Decode(e, &i));
    out->jobs.push_back(std::move(i));
  }
  return OkStatus();
}

Json Encode(const ReadFileRequest& r) {
  return WithOp(r.kOp,
                AsJson(r.as, {{"path", r.path}, {"max_bytes", r.max_bytes}, {"offset", r.offset}}));
}
Status Decode(const Json& j, ReadFileRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "max_bytes", 64 << 20, INT64_MAX, &out->max_bytes));
  return GetUnsigned(j, "offset", 0, INT64_MAX, &out->offset);
}
Json Encode(const ReadFileResponse& r) {
  return {{"size", r.size}, {"bytes", r.bytes}, {"truncated", r.truncated}};
}
Status Decode(const Json& j, ReadFileResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "size", 0, INT64_MAX, &out->size));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "bytes", 0, INT64_MAX, &out->bytes));
  DSEC_ASSIGN_OR_RETURN(out->truncated, GetBool(j, "truncated", false));
  return OkStatus();
}

Json Encode(const WriteFileRequest& r) {
  return WithOp(
      r.kOp,
      AsJson(r.as,
             {{"path", r.path}, {"mode", r.mode}, {"mkdirs", r.mkdirs}, {"append", r.append}}));
}
Status Decode(const Json& j, WriteFileRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "mode", 0644, 07777, &out->mode));
  DSEC_ASSIGN_OR_RETURN(out->mkdirs, GetBool(j, "mkdirs", true));
  DSEC_ASSIGN_OR_RETURN(out->append, GetBool(j, "append", false));
  return OkStatus();
}
Json Encode(const WriteFileResponse& r) { return {{"bytes", r.bytes}}; }
Status Decode(const Json& j, WriteFileResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  return GetUnsigned(j, "bytes", 0, INT64_MAX, &out->bytes);
}

Json Encode(const ListDirRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path}, {"max_entries", r.max_entries}}));
}
Status Decode(const Json& j, ListDirRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_ASSIGN_OR_RETURN(int64_t max, GetInt(j, "max_entries", 10000, 1, kMaxListEntries));
  out->max_entries = static_cast<uint32_t>(max);
  return OkStatus();
}
Json Encode(const ListDirResponse& r) {
  Json entries = Json::array();
  for (const auto& e : r.entries) entries.push_back(ToJson(e));
  return {{"entries", entries}, {"truncated", r.truncated}};
}
Status Decode(const Json& j, ListDirResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  auto it = j.find("entries");
  if (it == j.end() || !it->is_array()) return InvalidArgument("missing field \"entries\"");
  out->entries.clear();
  for (const auto& e : *it) {
    if (!e.is_object()) return InvalidArgument("field \"entries\" must hold objects");
    DSEC_ASSIGN_OR_RETURN(FileEntry fe, FileEntryFromJson(e));
    out->entries.push_back(std::move(fe));
  }
  DSEC_ASSIGN_OR_RETURN(out->truncated, GetBool(j, "truncated", false));
  return OkStatus();
}

Json Encode(const StatRequest& r) {
  Json j = AsJson(r.as, {{"path", r.path}});
  if (r.machine) j["machine"] = true;
  return WithOp(r.kOp, std::move(j));
}
Status Decode(const Json& j, StatRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_ASSIGN_OR_RETURN(out->machine, GetBool(j, "machine", false));
  return DecodePath(j, &out->path);
}
Json Encode(const StatResponse& r) {
  Json j = ToJson(r.entry);
  j["uid"] = r.uid;
  j["gid"] = r.gid;
  j["fs_bytes"] = r.fs_bytes;
  j["fs_used"] = r.fs_used;
  if (r.mem_total > 0) {
    j["mem_total"] = r.mem_total;
    j["mem_available"] = r.mem_available;
    j["user_pids"] = r.user_pids;
  }
  return j;
}
Status Decode(const Json& j, StatResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_ASSIGN_OR_RETURN(out->entry, FileEntryFromJson(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "uid", 0, UINT32_MAX, &out->uid));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "gid", 0, UINT32_MAX, &out->gid));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "fs_bytes", 0, INT64_MAX, &out->fs_bytes));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "mem_total", 0, INT64_MAX, &out->mem_total));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "mem_available", 0, INT64_MAX, &out->mem_available));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "user_pids", 0, INT64_MAX, &out->user_pids));
  return GetUnsigned(j, "fs_used", 0, INT64_MAX, &out->fs_used);
}

Json Encode(const MakeDirRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path}, {"mode", r.mode}, {"parents", r.parents}}));
}
Status Decode(const Json& j, MakeDirRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "mode", 0755, 07777, &out->mode));
  DSEC_ASSIGN_OR_RETURN(out->parents, GetBool(j, "parents", true));
  return OkStatus();
}

Json Encode(const RemoveRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path}, {"recursive", r.recursive}}));
}
Status Decode(const Json& j, RemoveRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  DSEC_ASSIGN_OR_RETURN(out->recursive, GetBool(j, "recursive", false));
  return OkStatus();
}

Json Encode(const TarExtractRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path}, {"max_bytes", r.max_bytes}}));
}
Status Decode(const Json& j, TarExtractRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  return GetUnsigned(j, "max_bytes", 1ull << 32, INT64_MAX, &out->max_bytes);
}
Json Encode(const TarExtractResponse& r) {
  return {{"entries", r.entries}, {"bytes", r.bytes}, {"skipped", r.skipped}};
}
Status Decode(const Json& j, TarExtractResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "entries", 0, INT64_MAX, &out->entries));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "bytes", 0, INT64_MAX, &out->bytes));
  return GetUnsigned(j, "skipped", 0, INT64_MAX, &out->skipped);
}

Json Encode(const TarCreateRequest& r) {
  return WithOp(r.kOp, AsJson(r.as, {{"path", r.path}, {"max_bytes", r.max_bytes}}));
}
Status Decode(const Json& j, TarCreateRequest* out) {
  DSEC_RETURN_IF_ERROR(DecodeRunAs(j, &out->as));
  DSEC_RETURN_IF_ERROR(DecodePath(j, &out->path));
  return GetUnsigned(j, "max_bytes", 0, INT64_MAX, &out->max_bytes);
}
Json Encode(const TarCreateResponse& r) { return {{"bytes", r.bytes}, {"skipped", r.skipped}}; }
Status Decode(const Json& j, TarCreateResponse* out) {
  DSEC_RETURN_IF_ERROR(StatusFromJson(j));
  DSEC_RETURN_IF_ERROR(GetUnsigned(j, "bytes", 0, INT64_MAX, &out->bytes));
  return GetUnsigned(j, "skipped", 0, INT64_MAX, &out->skipped);
}

}  // namespace dsec::protocol
