// File and archive routes. Paths come from the query string and are resolved by the agent
// inside the sandbox root (openat2 RESOLVE_IN_ROOT), acting as the sandbox's user; the edge
// only checks their shape. Bodies are bounded by max_upload_bytes / max_download_bytes; an
// upload over 1 MiB arrives in a spooled file and goes to the agent a piece at a time.
#include "edge/api.h"

namespace dsec::edge {

namespace {

StatusOr<std::string> PathQuery(const std::shared_ptr<Ctx>& c) {
  auto q = c->RequiredQuery("path");
  if (!q.ok()) return q.status();
  const std::string& p = *q;
  if (!p.starts_with('/')) return InvalidArgument("\"path\" must be absolute");
  if (p.size() > 4096) return InvalidArgument("\"path\" is too long");
  return p;
}

StatusOr<uint32_t> ModeQuery(const std::shared_ptr<Ctx>& c, uint32_t def) {
  const std::string* m = c->req.Query("mode");
  if (!m || m->empty()) return def;
  if (m->size() > 5) return InvalidArgument("\"mode\" must be octal, like 0644");
  uint32_t v = 0;
  for (char ch : *m) {
    if (ch < '0' || ch > '7') return InvalidArgument("\"mode\" must be octal, like 0644");
    v = v * 8 + static_cast<uint32_t>(ch - '0');
  }
  if (v > 07777) return InvalidArgument("\"mode\" must be at most 07777");
  return v;
}

// The request body: in memory, or (a large upload) the file the HTTP layer spooled it to.
backends::UploadBody Body(const std::shared_ptr<Ctx>& c) {
  if (c->req.body_file) return {c->req.body_file.get(), c->req.body_size};
  return c->req.body;
}

Json EntryJson(const backends::FileEntry& e) {
  return {{"name", e.name},
          {"type", e.type},
          {"size", e.size},
          {"mode", e.mode & 07777},
          {"mtime", e.mtime_ms}};
}

void PutFile(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(uint32_t mode, ModeQuery(c, 0644));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    return sb->WriteFile(path, Body(c), mode);
  };
  Status s = run();
  c->req.body_file.Reset();  // the spooled body's space goes before the answer does
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

void GetFile(const std::shared_ptr<Ctx>& c) {
  const auto& cfg = c->api->deps().cfg;
  auto run = [&]() -> StatusOr<std::string> {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    uint64_t cap = std::min<uint64_t>(64ull << 20, cfg.max_download_bytes);
    DSEC_ASSIGN_OR_RETURN(int64_t max, c->IntQuery("max_bytes", static_cast<int64_t>(cap), 0,
                                                   static_cast<int64_t>(cfg.max_download_bytes)));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    // Stat does not follow a final symlink; the read does (inside the sandbox root), and the
    // agent refuses what is not a regular file. Without a stat to go by, the read's own bound
    // (max_bytes + 1) tells a file that is too large.
    DSEC_ASSIGN_OR_RETURN(backends::FileEntry st, sb->Stat(path));
    if (st.type == "dir") return InvalidArgument("\"" + path + "\" is a directory");
    if (st.type != "file" && st.type != "symlink")
      return InvalidArgument("\"" + path + "\" is not a regular file");
    if (st.type == "file" && st.size > static_cast<uint64_t>(max))
      return TooLarge("\"" + path + "\" has " + std::to_string(st.size) +
                      " bytes, more than max_bytes=" + std::to_string(max));
    // One byte more than allowed tells a file that grew since the stat.
    DSEC_ASSIGN_OR_RETURN(std::string data, sb->ReadFile(path, static_cast<uint64_t>(max) + 1));
    if (data.size() > static_cast<uint64_t>(max))
      return TooLarge("\"" + path + "\" is larger than max_bytes=" + std::to_string(max));
    return data;
  };
  auto data = run();
  if (!data.ok()) return c->Fail(data.status());
  c->Raw(200, "application/octet-stream", std::move(*data));
}

void DeleteFile(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    if (path == "/") return InvalidArgument("refusing to remove \"/\"");
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    return sb->Remove(path, c->FlagQuery("recursive"));
  };
  Status s = run();
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

void ListFiles(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<Json> {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    DSEC_ASSIGN_OR_RETURN(auto entries, sb->ListDir(path));
    Json list = Json::array();
    for (const auto& e : entries) list.push_back(EntryJson(e));
    return Json{{"entries", list}};
  };
  auto r = run();
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, *r);
}

void StatFile(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<Json> {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    DSEC_ASSIGN_OR_RETURN(auto e, sb->Stat(path));
    return EntryJson(e);
  };
  auto r = run();
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(200, *r);
}

void MakeDir(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(uint32_t mode, ModeQuery(c, 0755));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    Status s = sb->MakeDir(path, mode);
    return s.code() == StatusCode::kAlreadyExists ? OkStatus() : s;
  };
  Status s = run();
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

void PutArchive(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> Status {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    // The agent makes the target directory (and removes what it made if the archive is
    // refused before anything was extracted).
    return sb->ExtractTar(path, Body(c));
  };
  Status s = run();
  c->req.body_file.Reset();
  if (!s.ok()) return c->Fail(s);
  c->NoContent();
}

void GetArchive(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<std::string> {
    DSEC_ASSIGN_OR_RETURN(std::string path, PathQuery(c));
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox());
    return sb->CreateTar(path, c->api->deps().cfg.max_download_bytes);
  };
  auto data = run();
  if (!data.ok()) return c->Fail(data.status());
  c->Raw(200, "application/x-tar", std::move(*data));
}

}  // namespace

void RegisterFileRoutes(Api* a) {
  a->Bind(api::RouteId::kPutFile, PutFile);
  a->Bind(api::RouteId::kGetFile, GetFile);
  a->Bind(api::RouteId::kDeleteFile, DeleteFile);
  a->Bind(api::RouteId::kListFiles, ListFiles);
  a->Bind(api::RouteId::kStatFile, StatFile);
  a->Bind(api::RouteId::kMakeDir, MakeDir);
  a->Bind(api::RouteId::kPutArchive, PutArchive);
  a->Bind(api::RouteId::kGetArchive, GetArchive);
}

}  // namespace dsec::edge
