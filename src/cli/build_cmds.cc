// `dsec image build|builds|build-status|build-log|build-cancel`: image builds on the edge, followed
// with a live view of their steps and log, canceled on Ctrl-C.
#include "cli/build_cmds.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/cmd_util.h"
#include "cli/edge_client.h"

namespace dsec::cli {

namespace {

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

// `dsec image builds [--state S]`: the builds the edge keeps, newest first.
int ListBuilds(const GlobalOptions& g, const std::string& state) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->CallJson(
      Verb::get, "/v1/images/builds" + (state.empty() ? "" : "?state=" + UrlEncode(state)));
  if (!r.ok()) return Fail(r.status());
  if (g.json) {
    PrintJson(*r);
    return 0;
  }
  int64_t now = NowMs();
  std::vector<std::vector<std::string>> rows;
  for (const auto& b : r->value("builds", Json::array())) {
    if (!b.is_object()) continue;
    auto [k, step] = CurrentStep(b);
    std::string st = Str(b, "state");
    if (k) st += " (" + std::to_string(k) + "/" + std::to_string(StepCount(b)) + " " + step + ")";
    int64_t created = b.value("created_at", int64_t{0});
    rows.push_back({Str(b, "id"), Str(b, "name"), st, created ? Duration(now - created) : "-",
                    Str(b, "error").empty() ? "-" : Str(b, "error")});
  }
  PrintTable({"ID", "NAME", "STATE", "AGE", "ERROR"}, rows);
  return 0;
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

void RegisterBuildCommands(CLI::App* image, GlobalOptions& g, int* exit_code) {
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

  auto builds_state = std::make_shared<std::string>();
  CLI::App* builds = image->add_subcommand(
      "builds", "List the builds the edge keeps (queued, running, the last 100 finished)");
  builds->add_option("--state", *builds_state,
                     "queued|running|canceling|succeeded|failed|canceled");
  builds->callback([=, &g] { *exit_code = ListBuilds(g, *builds_state); });

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
}

}  // namespace dsec::cli
