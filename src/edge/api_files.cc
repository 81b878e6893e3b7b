// File and archive routes. Paths come from the query string and are resolved by the agent
// inside the sandbox root (openat2 RESOLVE_IN_ROOT), acting as the sandbox's user; the edge
// only checks their shape. Bodies are bounded by max_upload_bytes / max_download_bytes; an
// upload over 1 MiB arrives in a spooled file and goes to the agent a piece at a time.
#include <fcntl.h>
#include <unistd.h>

#include "api/files_json.h"
#include "base/file_util.h"
#include "edge/api.h"
#include "images/import.h"

namespace dsec::edge {

namespace {

// The first bytes of an upload body (in memory or spooled), enough to tell a compressed one.
std::string BodyHead(const std::shared_ptr<Ctx>& c) {
  if (!c->req.body_file) return c->req.body.substr(0, 4);
  char b[4];
  ssize_t n = pread(c->req.body_file.get(), b, sizeof b, 0);
  return n > 0 ? std::string(b, static_cast<size_t>(n)) : std::string();
}

// A gzip or zstd tar (what image import takes too) decompressed into an unlinked file of the
// spool directory, at most `cap` bytes (the sandbox's disk: more could never be extracted, and
// a small archive must not become a huge file on the node).
StatusOr<UniqueFd> Decompress(const std::shared_ptr<Ctx>& c, uint64_t cap, uint64_t* size) {
  const std::string dir = JoinPath(c->api->deps().cfg.state_dir, "spool");
  UniqueFd out(open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!out) return ErrnoError("spool a decompressed archive in " + dir);
  *size = 0;
  images::Decoder dec([&](std::string_view d) -> Status {
    if (*size + d.size() > cap)
      return TooLarge("the archive decompresses to more than " + std::to_string(cap >> 20) +
                      " MiB, the sandbox's disk (disk_mb)");
    DSEC_RETURN_IF_ERROR(WriteAllFd(out.get(), d, "spooled archive"));
    *size += d.size();
    return OkStatus();
  });
  if (!c->req.body_file) {
    DSEC_RETURN_IF_ERROR(dec.Feed(c->req.body));
  } else {
    std::string buf(256 << 10, '\0');
    for (uint64_t off = 0; off < c->req.body_size;) {
      ssize_t n = pread(c->req.body_file.get(), buf.data(), buf.size(), static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read the uploaded archive");
      if (n == 0) break;
      DSEC_RETURN_IF_ERROR(dec.Feed(std::string_view(buf.data(), static_cast<size_t>(n))));
      off += static_cast<uint64_t>(n);
    }
  }
  if (Status s = dec.Finish(); !s.ok())
    return InvalidArgument("the compressed archive is cut short or corrupt: " + s.message());
  return out;
}

StatusOr<std::string> PathQuery(const std::shared_ptr<Ctx>& c) {
  auto q = c->RequiredQuery("path");
  if (!q.ok()) return q.status();
  return api::CheckFilePath(std::move(*q));
}

StatusOr<uint32_t> ModeQuery(const std::shared_ptr<Ctx>& c, uint32_t def) {
  return api::ParseFileMode(c->req.Query("mode"), def);
}

// The request body: in memory, or (a large upload) the file the HTTP layer spooled it to.
backends::UploadBody Body(const std::shared_ptr<Ctx>& c) {
  if (c->req.body_file) return {c->req.body_file.get(), c->req.body_size};
  return c->req.body;
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
    return api::EntriesJson(entries);
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
    return api::FileEntryJson(e);
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
    std::shared_ptr<SandboxEntry> entry;
    DSEC_ASSIGN_OR_RETURN(auto sb, c->Sandbox(&entry));
    // The agent makes the target directory (and removes what it made if the archive is
    // refused before anything was extracted).
    if (!images::Decoder::Compressed(BodyHead(c))) return sb->ExtractTar(path, Body(c));
    // gzip or zstd (by its first bytes): the agent gets the tar.
    uint64_t size = 0;
    DSEC_ASSIGN_OR_RETURN(
        UniqueFd tar,
        Decompress(c, static_cast<uint64_t>(entry->params.resources.disk_mb) << 20, &size));
    c->req.body_file.Reset();  // the compressed one's space goes first
    return sb->ExtractTar(path, backends::UploadBody(tar.get(), size));
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
