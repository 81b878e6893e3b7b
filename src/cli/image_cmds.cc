#include "cli/image_cmds.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "archive/tar.h"
#include "base/unique_fd.h"
#include "cli/build_cmds.h"
#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

constexpr size_t kChunk = 1 << 20;
// Smaller uploads are over before a meter would tell anything.
constexpr uint64_t kProgressMinBytes = 8 << 20;

// An image name escaped for a path segment or a query value. ':' stays as is (it is valid in
// both) so the request reads like the name; '/' is escaped (a name is one segment).
std::string EncodeName(const std::string& name) {
  std::string e = UrlEncode(name, false), out;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e.compare(i, 3, "%3A") == 0) {
      out += ':';
      i += 2;
    } else {
      out += e[i];
    }
  }
  return out;
}

std::string ImagePath(const std::string& name) { return "/v1/images/" + EncodeName(name); }

// A field of a record as text, whatever its JSON type ("-" when missing or null).
std::string Text(const Json& rec, const char* key) {
  auto it = rec.find(key);
  if (it == rec.end() || it->is_null()) return "-";
  return Num(*it);
}

// An image's created_at as ms since the epoch: an RFC 3339 string, or a number (ms; seconds
// when too small to be ms). nullopt when it is neither.
std::optional<int64_t> CreatedMs(const Json& j) {
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    return v < 100'000'000'000 ? v * 1000 : v;
  }
  if (!j.is_string()) return std::nullopt;
  const std::string s = j.get<std::string>();
  struct tm tm = {};
  int end = 0;
  if (sscanf(s.c_str(), "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &end) != 6 ||
      end == 0)
    return std::nullopt;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  int64_t sec = timegm(&tm);
  size_t i = static_cast<size_t>(end);
  if (i < s.size() && s[i] == '.')
    for (++i; i < s.size() && isdigit(static_cast<unsigned char>(s[i]));) ++i;
  int hh = 0, mm = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-') &&
      sscanf(s.c_str() + i + 1, "%2d:%2d", &hh, &mm) == 2)
    sec -= (s[i] == '+' ? 1 : -1) * (hh * 3600 + mm * 60);
  return sec * 1000;
}

// ---- ls / inspect / rm ---------------------------------------------------------------------

int ListImages(const GlobalOptions& g) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, "/v1/images");
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  int64_t now = NowMs();
  const Json images = r->is_object() && r->contains("images") ? (*r)["images"] : Json::array();
  for (const auto& img : images) {
    if (!img.is_object()) continue;
    const Json& layers = img.contains("layers") ? img["layers"] : Json();
    const Json& size = img.contains("size") ? img["size"] : Json();
    int64_t created = 0;  // unknown
    if (img.contains("created_at")) created = CreatedMs(img["created_at"]).value_or(0);
    rows.push_back({Text(img, "name"), layers.is_array() ? std::to_string(layers.size()) : "-",
                    size.is_number_unsigned() ? HumanSize(size.get<uint64_t>()) : Text(img, "size"),
                    Text(img, "source"), Text(img, "in_use"),
                    created > 0 ? Duration(now - created) : "-"});
  }
  PrintTable({"NAME", "LAYERS", "SIZE", "SOURCE", "IN USE", "CREATED"}, rows);
  return 0;
}

int InspectImage(const GlobalOptions& g, const std::string& name) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, ImagePath(name));
  if (!r.ok()) return Fail(r.status());
  PrintJson(*r);
  return 0;
}

// Deletes each image in turn; a failure is reported (one line) and the rest still go.
int RemoveImages(const GlobalOptions& g, const std::vector<std::string>& names) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  int rc = 0;
  Json out = Json::array();
  for (const auto& name : names) {
    auto r = (*c)->Call(Verb::delete_, ImagePath(name));
    if (!r.ok()) return Fail(r.status());
    if (r->status < 200 || r->status >= 300) {
      rc = Fail(ApiError(r->status, r->body));
      continue;
    }
    if (g.json)
      out.push_back(Json{{"name", name}});
    else
      std::cout << name << "\n";
  }
  if (g.json) PrintJson(out);
  return rc;
}

// ---- import --------------------------------------------------------------------------------

// A one-line upload meter on stderr, redrawn at most ten times a second, and only when stderr
// is a terminal. The line is erased when the meter goes, so errors and results print clean.
class Progress {
 public:
  Progress(std::string what, uint64_t total)
      : what_(std::move(what)),
        total_(total),
        on_(isatty(STDERR_FILENO) == 1 && (total == 0 || total >= kProgressMinBytes)) {}
  ~Progress() {
    if (on_ && drawn_) std::cerr << "\r\x1b[K" << std::flush;
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t n) {
    sent_ += n;
    auto now = std::chrono::steady_clock::now();
    if (!on_ || (drawn_ && now - last_ < std::chrono::milliseconds(100))) return;
    last_ = now;
    std::string line = what_ + ": " + HumanSize(sent_);
    if (total_) {
      line += " / " + HumanSize(total_);
      line += " (" + std::to_string(std::min<uint64_t>(100, sent_ * 100 / total_)) + "%)";
    }
    Draw(line);
  }
  // The whole body is out; the edge unpacks and stores it before it answers.
  void Sent() {
    if (on_) Draw(what_ + ": " + HumanSize(sent_) + " sent, the edge is storing the layers");
  }

 private:
  void Draw(const std::string& line) {
    std::cerr << "\r\x1b[K" << line << std::flush;
    drawn_ = true;
  }

  std::string what_;
  uint64_t total_;
  bool on_;
  bool drawn_ = false;
  uint64_t sent_ = 0;
  std::chrono::steady_clock::time_point last_;
};

struct ImportOpts {
  std::string name, path, format = "auto", layer_format, base;
};

// Streams the archive (a file, stdin, or a directory packed as it goes) as the request body;
// never holds more than one chunk. Returns the new image's record.
StatusOr<Json> Import(EdgeClient& c, const ImportOpts& o) {
  UniqueFd owned;
  int in = STDIN_FILENO;
  if (o.path != "-") {
    owned = UniqueFd(open(o.path.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC));
    if (!owned) return ErrnoError("image import: " + o.path);
    in = owned.get();
  }
  struct stat st;
  if (fstat(in, &st) != 0) return ErrnoError("image import: stat " + o.path);
  std::string format = o.format;
  std::unique_ptr<archive::TarCreator> tar;
  if (S_ISDIR(st.st_mode)) {
    // Owners (numeric) and full modes are kept, symlinks stored as links, mount points not
    // crossed; devices, FIFOs and sockets are skipped (counted below).
    if (format != "auto" && format != "rootfs")
      return InvalidArgument("image import: " + o.path +
                             " is a directory, sent as a rootfs tar; --format " + format +
                             " needs an archive file");
    format = "rootfs";
    DSEC_ASSIGN_OR_RETURN(tar, archive::TarCreator::Open(in, "."));
  }
  std::string target = "/v1/images/import?name=" + EncodeName(o.name) + "&format=" + format;
  if (!o.layer_format.empty()) target += "&layer_format=" + o.layer_format;
  if (!o.base.empty()) target += "&base=" + o.base;

  std::string response;
  {
    Progress progress("importing " + o.name, S_ISREG(st.st_mode) ? st.st_size : 0);
    bool done = false;
    DSEC_RETURN_IF_ERROR(c.Upload(
        Verb::post, target, "application/octet-stream",
        [&]() -> StatusOr<std::string> {
          std::string out;
          if (tar) {
            while (!done && out.size() < kChunk) {
              DSEC_ASSIGN_OR_RETURN(bool more, tar->Next(&out, kChunk - out.size()));
              done = !more;
            }
          } else {
            out.resize(kChunk);
            ssize_t n;
            do n = read(in, out.data(), out.size());
            while (n < 0 && errno == EINTR);
            if (n < 0) return ErrnoError("image import: reading " + o.path);
            out.resize(static_cast<size_t>(n));
          }
          progress.Add(out.size());
          if (out.empty()) progress.Sent();
          return out;
        },
        &response));
  }
  if (tar && tar->skipped() > 0)
    std::cerr << "dsec: image import: skipped " << tar->skipped()
              << " entries of " + o.path + " (devices, FIFOs, sockets, mount points)\n";
  if (response.empty()) return Json::object();
  auto j = ParseJson(response);
  if (!j.ok()) return InternalError("the edge sent invalid JSON for the import");
  return *j;
}

int ImportImage(const GlobalOptions& g, const ImportOpts& o) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = Import(**c, o);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << (r->contains("name") ? Text(*r, "name") : o.name) << "\n";
  return 0;
}

// ---- snapshot / fork -----------------------------------------------------------------------

int Snapshot(const GlobalOptions& g, const std::string& id, const std::string& image,
             bool keep_setuid) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json body = {{"image", image}};
  if (keep_setuid) body["keep_setuid"] = true;
  auto r = (*c)->CallJson(Verb::post, SbPath(id) + "/snapshot", &body);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << (r->is_object() && r->contains("name") ? Text(*r, "name") : image) << "\n";
  return 0;
}

int Fork(const GlobalOptions& g, const std::string& id, int64_t count, bool memory) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json body = {{"count", count}};
  if (memory) body["memory"] = true;
  auto r = (*c)->CallJson(Verb::post, SbPath(id) + "/fork", &body);
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  if (r->is_object() && r->contains("sandboxes") && (*r)["sandboxes"].is_array())
    for (const auto& s : (*r)["sandboxes"])
      if (s.is_object()) std::cout << Text(s, "id") << "\n";
  return 0;
}

}  // namespace

void RegisterImageCommands(CLI::App& app, GlobalOptions& g, int* exit_code) {
  CLI::App* image =
      app.add_subcommand("image", "Images on the edge: ls, inspect, rm, import, build");
  image->require_subcommand(1);

  CLI::App* ls = image->add_subcommand("ls", "List images");
  ls->callback([&g, exit_code] { *exit_code = ListImages(g); });

  auto inspect_name = std::make_shared<std::string>();
  CLI::App* inspect = image->add_subcommand("inspect", "Show an image's record as JSON");
  inspect->add_option("name", *inspect_name, "Image (name:tag)")->required();
  inspect->callback([=, &g] { *exit_code = InspectImage(g, *inspect_name); });

  auto rm_names = std::make_shared<std::vector<std::string>>();
  CLI::App* rm = image->add_subcommand(
      "rm", "Delete images (layers that sandboxes still use stay until those sandboxes go)");
  rm->add_option("names", *rm_names, "Images (name:tag)")->required();
  rm->callback([=, &g] { *exit_code = RemoveImages(g, *rm_names); });

  auto io = std::make_shared<ImportOpts>();
  CLI::App* imp = image->add_subcommand(
      "import",
      "Import an image: dsec image import NAME:TAG PATH (an archive, - for stdin, or a "
      "directory, sent as a rootfs tar); prints the image's name");
  imp->add_option("name", io->name, "New image (name:tag)")->required();
  imp->add_option("path", io->path,
                  "A tar, tar.gz or tar.zst of a root filesystem, an OCI layout tar, a "
                  "`docker save` tar, - (stdin), or a directory")
      ->required();
  imp->add_option("--format", io->format, "What PATH is: auto (default), rootfs, oci, docker")
      ->check(CLI::IsMember({"auto", "rootfs", "oci", "docker"}));
  imp->add_option("--layer-format", io->layer_format,
                  "How the edge stores the layers: dir or erofs (default: the edge's)")
      ->check(CLI::IsMember({"dir", "erofs"}));
  imp->add_option("--base", io->base,
                  "host: the files go on top of the built-in host image (default: PATH is the "
                  "whole root filesystem)")
      ->check(CLI::IsMember({"host"}));
  imp->callback([=, &g] { *exit_code = ImportImage(g, *io); });

  RegisterBuildCommands(image, g, exit_code);

  auto snap_id = std::make_shared<std::string>();
  auto snap_image = std::make_shared<std::string>();
  CLI::App* snap = app.add_subcommand(
      "snapshot", "Save a sandbox's current files as a new image: dsec snapshot ID NAME:TAG");
  snap->add_option("id", *snap_id, "Sandbox id")->required();
  snap->add_option("image", *snap_image, "New image (name:tag)")->required();
  auto snap_setuid = std::make_shared<bool>(false);
  snap->add_flag("--keep-setuid", *snap_setuid,
                 "Keep setuid/setgid bits of the sandbox's files (dropped by default)");
  snap->callback([=, &g] { *exit_code = Snapshot(g, *snap_id, *snap_image, *snap_setuid); });

  auto fork_id = std::make_shared<std::string>();
  auto fork_count = std::make_shared<int64_t>(1);
  CLI::App* fork = app.add_subcommand(
      "fork",
      "New sandboxes starting from a sandbox's current files (processes start fresh); prints "
      "their ids");
  fork->add_option("id", *fork_id, "Sandbox id")->required();
  fork->add_option("-n,--count", *fork_count, "How many (1-64, default 1)")
      ->check(CLI::Range(1, 64));
  auto fork_memory = std::make_shared<bool>(false);
  fork->add_flag("--memory", *fork_memory,
                 "Copy the running machine (memory, processes, files): microVMs only");
  fork->callback([=, &g] { *exit_code = Fork(g, *fork_id, *fork_count, *fork_memory); });
}

}  // namespace dsec::cli
