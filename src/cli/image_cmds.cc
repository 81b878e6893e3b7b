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

std::string HumanSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char b[32];
  snprintf(b, sizeof b, v < 9.95 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
  return b;
}

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

int Fork(const GlobalOptions& g, const std::string& id, int64_t count) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  Json body = {{"count", count}};
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

// ---- build ---------------------------------------------------------------------------------

// How often a followed build is polled (its record, and its log with --log).
constexpr std::chrono::milliseconds kBuildPoll(400);
// Log lines shown when a build fails (unless --log showed all of it).
constexpr size_t kTailLines = 20;
// How long `build` (after Ctrl-C) and `build-cancel` wait for a canceled build to end.
constexpr std::chrono::seconds kCancelWait(30);

std::string BuildPath(const std::string& id) { return "/v1/images/builds/" + UrlEncode(id, false); }

// A string field of a build record ("" when missing, null or not a string).
std::string Str(const Json& rec, const char* key) {
  auto it = rec.find(key);
  return it != rec.end() && it->is_string() ? it->get<std::string>() : "";
}

bool Finished(const Json& rec) {
  const std::string s = Str(rec, "state");
  return s == "succeeded" || s == "failed" || s == "canceled";
}

// The step the record is at: {1-based number, name}; {0, ""} when it runs none (queued, done).
std::pair<size_t, std::string> CurrentStep(const Json& rec) {
  auto step = rec.find("step");
  auto steps = rec.find("steps");
  if (step == rec.end() || !step->is_number_unsigned() || steps == rec.end() || !steps->is_array())
    return {0, ""};
  size_t k = step->get<size_t>();
  if (k >= steps->size() || !(*steps)[k].is_object()) return {0, ""};
  return {k + 1, Str((*steps)[k], "name")};
}

size_t StepCount(const Json& rec, const char* state = nullptr) {
  auto steps = rec.find("steps");
  if (steps == rec.end() || !steps->is_array()) return 0;
  if (!state) return steps->size();
  size_t n = 0;
  for (const auto& s : *steps) n += s.is_object() && Str(s, "state") == state;
  return n;
}

// The most of s that fits in `width` bytes, cut on a UTF-8 character boundary.
std::string Fit(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  size_t n = width;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// One page of a build's log from *offset: appends its text to *out, moves *offset on, and adds
// the bytes the edge no longer keeps (it keeps a tail) to *dropped. Returns the page's "done"
// (the build has finished) and whether it had any text.
struct LogPage {
  bool done = false, empty = true;
};
StatusOr<LogPage> ReadLog(EdgeClient& c, const std::string& id, uint64_t* offset, std::string* out,
                          uint64_t* dropped = nullptr) {
  DSEC_ASSIGN_OR_RETURN(
      Json j, c.CallJson(Verb::get, BuildPath(id) + "/log?offset=" + std::to_string(*offset)));
  if (!j.is_object()) return InternalError("the edge sent an invalid build log page");
  uint64_t from = j.value("offset", *offset), next = j.value("next_offset", from);
  if (from > *offset && dropped) *dropped += from - *offset;
  std::string text = Str(j, "text");
  LogPage p;
  p.done = j.value("done", false);
  p.empty = text.empty();
  out->append(text);
  *offset = std::max(next, from + text.size());
  return p;
}

// The last `lines` lines of a build's log (the edge's record says how long it is).
StatusOr<std::vector<std::string>> LogTail(EdgeClient& c, const Json& rec, size_t lines) {
  uint64_t size = rec.value("log_bytes", uint64_t{0});
  uint64_t start = size > (64 << 10) ? size - (64 << 10) : 0, offset = start;
  std::string text;
  for (int page = 0; page < 64; ++page) {
    DSEC_ASSIGN_OR_RETURN(LogPage p, ReadLog(c, Str(rec, "id"), &offset, &text));
    if (p.empty) break;
  }
  std::vector<std::string> out;
  size_t pos = 0;
  if (start > 0) pos = text.find('\n') == std::string::npos ? text.size() : text.find('\n') + 1;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  while (!out.empty() && out.back().empty()) out.pop_back();
  if (out.size() > lines) out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(lines));
  return out;
}

// What a followed build shows on stderr: on a terminal a one-line bar redrawn in place
// ("[####......] 2/5 run: pip install ...  12s") with the log (--log) scrolling above it;
// otherwise one line per step (or the log itself with --log). --quiet shows neither bar nor
// steps.
class BuildView {
 public:
  BuildView(std::string id, bool quiet, bool log)
      : id_(std::move(id)),
        tty_(isatty(STDERR_FILENO) == 1),
        bar_(tty_ && !quiet),
        steps_(!tty_ && !quiet && !log),
        start_(std::chrono::steady_clock::now()) {}
  ~BuildView() { Clear(); }
  BuildView(const BuildView&) = delete;
  BuildView& operator=(const BuildView&) = delete;

  void Update(const Json& rec) {
    last_ = rec;
    if (bar_) Draw();
    if (!steps_ || Finished(rec)) return;
    auto [k, name] = CurrentStep(rec);
    std::string line =
        k ? "step " + std::to_string(k) + "/" + std::to_string(StepCount(rec)) + ": " + name
          : Str(rec, "state");
    if (line == shown_) return;
    shown_ = line;
    std::cerr << id_ << ": " << line << "\n" << std::flush;
  }

  // Log text as it comes: whole lines go out at once (above the bar), a partial last line
  // waits for its end (or Flush).
  void Log(std::string_view text) {
    partial_.append(text);
    size_t nl = partial_.rfind('\n');
    if (nl == std::string::npos) return;
    Clear();
    std::cerr << std::string_view(partial_).substr(0, nl + 1);
    partial_.erase(0, nl + 1);
    if (bar_) Draw();
    std::cerr << std::flush;
  }
  void Dropped(uint64_t bytes) {
    Clear();
    std::cerr << "[dsec] ... " << bytes << " bytes of the log are no longer kept ...\n";
  }
  void Flush() {
    Clear();
    if (!partial_.empty()) std::cerr << partial_ << "\n";
    partial_.clear();
    std::cerr << std::flush;
  }
  void Clear() {
    if (drawn_) std::cerr << "\r\x1b[K" << std::flush;
    drawn_ = false;
  }
  std::string Elapsed() const {
    return Duration(std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start_)
                        .count());
  }

 private:
  void Draw() {
    size_t total = StepCount(last_), done = StepCount(last_, "done");
    constexpr size_t kWidth = 10;
    size_t fill = total ? done * kWidth / total : 0;
    auto [k, name] = CurrentStep(last_);
    std::string line = "[" + std::string(fill, '#') + std::string(kWidth - fill, '.') + "] " +
                       std::to_string(k ? k : done) + "/" + std::to_string(total) + " " +
                       (k ? name : Str(last_, "state"));
    std::string tail = "  " + Elapsed();
    struct winsize ws = {};
    size_t cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
    // One column short of the width: a full line would wrap and break the redraw.
    if (line.size() + tail.size() >= cols)
      line = Fit(line, cols > tail.size() + 5 ? cols - tail.size() - 5 : 0) + "...";
    std::cerr << "\r\x1b[K" << Fit(line + tail, cols ? cols - 1 : 0) << std::flush;
    drawn_ = true;
  }

  std::string id_;
  bool tty_, bar_, steps_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  Json last_ = Json::object();
  std::string shown_, partial_;
};

// While a build is followed, SIGINT and SIGTERM are blocked and taken synchronously between
// polls (sigtimedwait is the poll's sleep): the build is canceled, then the CLI exits 128+sig.
class Signals {
 public:
  Signals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~Signals() {
    // A signal still pending is dropped, not delivered as the mask is lifted.
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set_, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;

  // Sleeps up to d; returns the signal that ended the wait, or 0.
  int Wait(std::chrono::milliseconds d) {
    auto ms = d.count();
    struct timespec ts = {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    int s;
    do s = sigtimedwait(&set_, nullptr, &ts);
    while (s < 0 && errno == EINTR);
    return s > 0 ? s : 0;
  }
  int Pending() { return Wait(std::chrono::milliseconds(0)); }

 private:
  sigset_t set_, old_;
};

struct BuildOpts {
  std::string name, base, variant, workdir;
  std::vector<std::string> packages, from, run, env;
  std::optional<int64_t> memory_mb, disk_mb, timeout_s;
  bool detach = false, quiet = false, log = false;
};

StatusOr<Json> BuildBody(const BuildOpts& o) {
  if (o.base.empty() == o.from.empty())
    return InvalidArgument(
        "image build: give either --base debian:SUITE (a new root filesystem) or --from "
        "IMAGE[,IMAGE...] (existing images)");
  Json b = {{"name", o.name}};
  if (!o.base.empty()) b["base"] = o.base;
  // One image goes as a string, several as the stack (bottom first).
  if (o.from.size() == 1) b["from"] = o.from[0];
  if (o.from.size() > 1) b["from"] = o.from;
  if (!o.packages.empty()) b["packages"] = o.packages;
  if (!o.variant.empty()) b["variant"] = o.variant;
  if (!o.run.empty()) b["run"] = o.run;
  DSEC_ASSIGN_OR_RETURN(auto env, ParseKeyValues(o.env, "--env"));
  if (!env.empty()) b["env"] = env;
  if (!o.workdir.empty()) b["workdir"] = o.workdir;
  if (o.memory_mb) b["memory_mb"] = *o.memory_mb;
  if (o.disk_mb) b["disk_mb"] = *o.disk_mb;
  if (o.timeout_s) b["timeout_s"] = *o.timeout_s;
  return b;
}

// Polls a build until it is finished, or until sig reports a signal (then *signal is set and
// the last record returned). Shows it through view and, with log, streams its log.
StatusOr<Json> FollowBuild(EdgeClient& c, Json rec, BuildView& view, bool log, Signals& sig,
                           int* signal) {
  const std::string id = Str(rec, "id");
  uint64_t offset = 0, dropped = 0;
  for (;;) {
    view.Update(rec);
    if (log) {
      // Every page there is, then the next poll; after the end, until the log is drained.
      for (int page = 0; page < 16; ++page) {
        std::string text;
        uint64_t before = dropped;
        DSEC_ASSIGN_OR_RETURN(LogPage p, ReadLog(c, id, &offset, &text, &dropped));
        if (dropped != before) view.Dropped(dropped - before);
        view.Log(text);
        if (p.empty) break;
      }
    }
    if (Finished(rec)) {
      if (log) view.Flush();
      return rec;
    }
    if ((*signal = sig.Wait(kBuildPoll)) != 0) return rec;
    DSEC_ASSIGN_OR_RETURN(rec, c.CallJson(Verb::get, BuildPath(id)));
    if (!rec.is_object()) return InternalError("the edge sent an invalid build record");
  }
}

// Cancels a build and waits (up to kCancelWait, or until sig reports a signal) for it to end.
StatusOr<Json> CancelAndWait(EdgeClient& c, const std::string& id, Signals* sig) {
  DSEC_ASSIGN_OR_RETURN(Json rec, c.CallJson(Verb::delete_, BuildPath(id)));
  auto deadline = std::chrono::steady_clock::now() + kCancelWait;
  while (rec.is_object() && !Finished(rec) && std::chrono::steady_clock::now() < deadline) {
    if (sig) {
      if (sig->Wait(std::chrono::milliseconds(200))) break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    DSEC_ASSIGN_OR_RETURN(rec, c.CallJson(Verb::get, BuildPath(id)));
  }
  return rec;
}

int BuildImage(const GlobalOptions& g, const BuildOpts& o) {
  if (g.has_command)
    return Fail(
        InvalidArgument("image build: the commands go in --run 'CMD' (repeatable), not "
                        "after --"));
  auto body = BuildBody(o);
  if (!body.ok()) return Fail(body.status());
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  std::optional<Signals> sig;
  if (!o.detach) sig.emplace();  // before the POST: a Ctrl-C during it still cancels
  auto r = (*c)->CallJson(Verb::post, "/v1/images/build", &*body);
  if (!r.ok()) return Fail(r.status());
  if (!r->is_object() || Str(*r, "id").empty())
    return Fail(InternalError("the edge sent an invalid build record"));
  const std::string id = Str(*r, "id");
  if (o.detach) {
    if (g.json)
      PrintJson(*r);
    else
      std::cout << id << "\n";
    return 0;
  }

  BuildView view(id, o.quiet, o.log);
  int signal = sig->Pending();
  StatusOr<Json> rec = *r;
  if (!signal) rec = FollowBuild(**c, *r, view, o.log, *sig, &signal);
  if (!rec.ok()) {
    view.Flush();
    return Fail(rec.status().WithContext("following build " + id +
                                         " (it goes on; see dsec "
                                         "image build-status " +
                                         id + ")"));
  }
  if (signal) {
    view.Flush();
    std::cerr << "dsec: canceling build " << id << "\n";
    auto done = CancelAndWait(**c, id, &*sig);
    if (!done.ok()) {
      Fail(done.status().WithContext("canceling build " + id));
    } else if (Str(*done, "state") == "succeeded") {
      std::cerr << "dsec: build " << id << " had already succeeded: image " << Str(*done, "image")
                << "\n";
    } else if (Finished(*done)) {
      std::cerr << "dsec: build " << id << " " << Str(*done, "state") << "\n";
    } else {
      std::cerr << "dsec: build " << id << " is still " << Str(*done, "state")
                << " (canceled; it stops at its next step)\n";
    }
    return 128 + signal;
  }

  const std::string state = Str(*rec, "state");
  if (state == "succeeded") {
    view.Clear();
    if (!o.quiet) std::cerr << id << ": succeeded in " << view.Elapsed() << "\n";
    if (g.json)
      PrintJson(*rec);
    else
      std::cout << (Str(*rec, "image").empty() ? Str(*rec, "name") : Str(*rec, "image")) << "\n";
    return 0;
  }
  view.Clear();
  if (!o.log) {  // with --log all of it is on the screen already
    auto tail = LogTail(**c, *rec, kTailLines);
    if (tail.ok())
      for (const auto& l : *tail) std::cerr << l << "\n";
  }
  if (g.json) PrintJson(*rec);
  std::string error = Str(*rec, "error");
  if (state == "canceled")
    std::cerr << "dsec: build " << id << " was canceled"
              << (error.empty() || error == "canceled" ? "" : ": " + error) << "\n";
  else
    std::cerr << "dsec: build " << id << " failed: " << (error.empty() ? state : error) << "\n";
  return kFail;
}

int BuildStatus(const GlobalOptions& g, const std::string& id) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(Verb::get, BuildPath(id));
  if (!r.ok()) return Fail(r.status());
  if (g.json || !r->is_object()) {
    PrintJson(*r);
    return 0;
  }
  auto ms = [&](const char* key) -> std::optional<int64_t> {
    auto it = r->find(key);
    if (it == r->end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  };
  auto [k, name] = CurrentStep(*r);
  size_t total = StepCount(*r);
  std::string state = Str(*r, "state");
  if (k) state += " (step " + std::to_string(k) + "/" + std::to_string(total) + ": " + name + ")";
  int64_t now = NowMs();
  auto created = ms("created_at"), started = ms("started_at"), finished = ms("finished_at");
  std::vector<std::pair<std::string, std::string>> rows = {
      {"ID", Str(*r, "id")},
      {"NAME", Str(*r, "name")},
      {"STATE", state},
      {"STEPS", std::to_string(StepCount(*r, "done")) + "/" + std::to_string(total) + " done"},
      {"IMAGE", Str(*r, "image").empty() ? "-" : Str(*r, "image")},
      {"ERROR", Str(*r, "error").empty() ? "-" : Str(*r, "error")},
      {"CREATED", created ? Duration(now - *created) + " ago" : "-"},
      {"RAN", started ? Duration((finished ? *finished : now) - *started) : "-"},
      {"LOG", r->contains("log_bytes") && (*r)["log_bytes"].is_number_unsigned()
                  ? HumanSize((*r)["log_bytes"].get<uint64_t>())
                  : "-"}};
  if (!Str(*r, "sandbox").empty()) rows.insert(rows.begin() + 5, {"SANDBOX", Str(*r, "sandbox")});
  for (const auto& [key, v] : rows)
    std::cout << key << ":" << std::string(10 - std::min<size_t>(key.size(), 9), ' ') << v << "\n";
  std::vector<std::vector<std::string>> steps;
  size_t i = 0;
  if (r->contains("steps") && (*r)["steps"].is_array())
    for (const auto& s : (*r)["steps"])
      if (s.is_object()) steps.push_back({std::to_string(++i), Str(s, "state"), Str(s, "name")});
  if (!steps.empty()) {
    std::cout << "\n";
    PrintTable({"#", "STATE", "STEP"}, steps);
  }
  return 0;
}

// The log (all the edge keeps) on stdout; with follow, what comes next too, until the build
// has finished.
int BuildLog(const GlobalOptions& g, const std::string& id, bool follow) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  uint64_t offset = 0, dropped = 0;
  for (;;) {
    std::string text;
    uint64_t before = dropped;
    auto p = ReadLog(**c, id, &offset, &text, &dropped);
    if (!p.ok()) return Fail(p.status());
    if (dropped != before)  // the edge keeps a tail of each build's log
      std::cerr << "dsec: " << dropped - before << " bytes of the log are no longer kept\n";
    std::cout << text << std::flush;
    if (!p->empty) continue;
    if (!follow || p->done) break;
    std::this_thread::sleep_for(kBuildPoll);
  }
  return 0;
}

int BuildCancel(const GlobalOptions& g, const std::string& id) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto before = (*c)->CallJson(Verb::get, BuildPath(id));
  if (!before.ok()) return Fail(before.status());
  auto r = before->is_object() && Finished(*before) ? before : CancelAndWait(**c, id, nullptr);
  if (!r.ok()) return Fail(r.status());
  if (g.json)
    PrintJson(*r);
  else
    std::cout << id << " " << Str(*r, "state") << "\n";
  // Finished before the cancel could stop it: nothing was canceled.
  if (Finished(*r) && (Str(*r, "state") != "canceled" || Finished(*before)))
    return Fail(FailedPrecondition("build " + id + " had already finished; nothing to cancel"));
  if (!Finished(*r))
    std::cerr << "dsec: build " << id << " is canceled but still " << Str(*r, "state")
              << "; it stops at its next step\n";
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

  auto bo = std::make_shared<BuildOpts>();
  CLI::App* build = image->add_subcommand(
      "build",
      "Build an image on the edge: dsec image build NAME:TAG --base debian:SUITE "
      "[--packages A,B] or --from IMAGE[,IMAGE...], then --run 'CMD' steps (as root, in order). "
      "Follows the build and prints the image's name; Ctrl-C cancels it");
  build->add_option("name", bo->name, "New image (name:tag)")->required();
  build->add_option("--base", bo->base,
                    "debian:SUITE: a new root filesystem made with mmdebstrap from Debian's "
                    "mirror");
  build
      ->add_option("--packages", bo->packages,
                   "Packages to install with --base (repeat it or give A,B,...)")
      ->delimiter(',')
      ->expected(1)
      ->take_all();
  build->add_option("--variant", bo->variant,
                    "mmdebstrap variant with --base: minbase (default), apt, required, "
                    "important, standard, ...");
  build
      ->add_option("--from", bo->from,
                   "Start from these images (stacked, bottom first; \"host\" may come first); "
                   "repeat it or give A,B,...")
      ->delimiter(',')
      ->expected(1)
      ->take_all();
  build
      ->add_option("--run", bo->run,
                   "A shell command run as root in the build sandbox (repeatable, in order; "
                   "needed with --from)")
      ->expected(1)
      ->take_all();
  build->add_option("--env", bo->env, "KEY=VALUE for the commands, kept in the image (repeatable)")
      ->expected(1)
      ->take_all();
  build->add_option("--workdir", bo->workdir,
                    "Absolute directory the commands run in, kept in the image");
  build->add_option("--memory-mb", bo->memory_mb, "Build sandbox memory in MB (default 2048)");
  build->add_option("--disk-mb", bo->disk_mb, "Build sandbox disk in MB (default 4096)");
  build->add_option("--timeout-s", bo->timeout_s, "Time limit of the whole build (default 3600)");
  build->add_flag("-d,--detach", bo->detach, "Print the build's id and return at once");
  build->add_flag("--log", bo->log, "Stream the build's log to stderr");
  build->add_flag("-q,--quiet", bo->quiet, "No progress on stderr");
  build->callback([=, &g] { *exit_code = BuildImage(g, *bo); });

  auto status_id = std::make_shared<std::string>();
  CLI::App* status = image->add_subcommand(
      "build-status", "Show a build: state, steps, image or error (--json: the record)");
  status->add_option("id", *status_id, "Build id (bld-...)")->required();
  status->callback([=, &g] { *exit_code = BuildStatus(g, *status_id); });

  auto log_id = std::make_shared<std::string>();
  auto log_follow = std::make_shared<bool>(false);
  CLI::App* log =
      image->add_subcommand("build-log", "Print a build's log (the edge keeps its last 4 MiB)");
  log->add_option("id", *log_id, "Build id (bld-...)")->required();
  log->add_flag("-f,--follow", *log_follow, "Keep printing until the build has finished");
  log->callback([=, &g] { *exit_code = BuildLog(g, *log_id, *log_follow); });

  auto cancel_id = std::make_shared<std::string>();
  CLI::App* cancel = image->add_subcommand(
      "build-cancel", "Cancel a queued or running build; prints its id and final state");
  cancel->add_option("id", *cancel_id, "Build id (bld-...)")->required();
  cancel->callback([=, &g] { *exit_code = BuildCancel(g, *cancel_id); });

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
  fork->callback([=, &g] { *exit_code = Fork(g, *fork_id, *fork_count); });
}

}  // namespace dsec::cli
