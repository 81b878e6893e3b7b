// Lifecycle benchmark: create -> exec `true` -> destroy through the container backend,
// in-process (no CLI start), serial latency and throughput with N concurrent workers.
// Usage: lifecycle_bench [--iterations N] [--concurrency 1,2,8] [--state-dir DIR] [--no-userns]
//                        [--exec-only] (exec latency in one live sandbox)
//                        [--peer NAME -- CMD...] (time an external command per cycle instead,
//                        e.g. bwrap or crun, with the same workers and statistics)
// Prints one line per configuration: p50/p90/p99/max in ms and cycles per second, and with
// --json a machine-readable line per configuration for bench/run, with "cdf": the p0..p100
// latency percentiles (101 values, ms) for bench/plots.py (and, for DSec cycles, the create,
// exec and destroy phases' p50 in ms). A cycle that fails (a create or exec error, or a peer
// command exiting non-zero) is counted in "failures", the first few are described on stderr,
// and the exit status is 1 if any cycle failed.
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/container/container_backend.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"

#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

using namespace dsec;

namespace {

struct Summary {
  double p50, p90, p99, max, per_sec;
  std::vector<double> cdf;  // p0..p100
};

// Runs argv once, output to /dev/null; returns the wait status, or -1 if it could not start.
int RunOnce(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string DescribeStatus(int status) {
  if (status < 0) return "could not be started";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended oddly";
}

// Reports at most a few failures on stderr (the count goes into the summary line).
void NoteFailure(std::atomic<int>& failures, const std::string& what) {
  if (failures++ < 3) fprintf(stderr, "lifecycle_bench: %s\n", what.c_str());
}

Summary Summarize(std::vector<double> v, double wall_s) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
  Summary s{pct(0.5), pct(0.9), pct(0.99), v.back(), v.size() / wall_s, {}};
  for (int p = 0; p <= 100; ++p)  // nearest rank over the sorted samples, p0 = min, p100 = max
    s.cdf.push_back(v[static_cast<size_t>(p * (v.size() - 1) / 100.0 + 0.5)]);
  return s;
}

std::string CdfJson(const Summary& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.cdf.size(); ++i) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%s%.3f", i ? "," : "", s.cdf[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  std::vector<int> concurrency = {1, 2, 8};
  std::string state_dir;
  bool no_userns = false, exec_only = false, json = false;
  std::string peer;
  std::vector<std::string> peer_cmd;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      peer_cmd.assign(argv + i + 1, argv + argc);
      break;
    }
    if (a == "--iterations" && i + 1 < argc)
      iterations = std::stoi(argv[++i]);
    else if (a == "--concurrency" && i + 1 < argc) {
      concurrency.clear();
      for (auto c : SplitString(argv[++i], ',', true))
        concurrency.push_back(std::stoi(std::string(c)));
    } else if (a == "--state-dir" && i + 1 < argc)
      state_dir = argv[++i];
    else if (a == "--no-userns")
      no_userns = true;
    else if (a == "--exec-only")
      exec_only = true;
    else if (a == "--json")
      json = true;
    else if (a == "--peer" && i + 1 < argc)
      peer = argv[++i];
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  bool any_failures = false;
  // extra: more JSON fields (",\"k\":v,..."), e.g. the phases' medians for bench/run's A/B.
  auto report = [&](const char* what, const std::string& name, int c, const Summary& s,
                    int failures, const std::string& extra = "") {
    printf(
        "%s %s concurrency=%d n=%d p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms rate=%.0f/s "
        "failures=%d\n",
        what, name.c_str(), c, iterations, s.p50, s.p90, s.p99, s.max, s.per_sec, failures);
    if (json)
      printf(
          "JSON {\"workload\":\"%s\",\"system\":\"%s\",\"concurrency\":%d,\"n\":%d,\"p50\":%.3f,"
          "\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f,\"rate\":%.1f,\"failures\":%d,"
          "\"cdf\":%s%s}\n",
          what, name.c_str(), c, iterations, s.p50, s.p90, s.p99, s.max, s.per_sec, failures,
          CdfJson(s).c_str(), extra.c_str());
    fflush(stdout);
    if (failures > 0) any_failures = true;
  };
  if (!peer.empty()) {
    if (peer_cmd.empty()) {
      fprintf(stderr, "--peer needs -- CMD...\n");
      return 2;
    }
    for (int c : concurrency) {
      std::vector<double> lat(static_cast<size_t>(iterations));
      std::atomic<int> next{0}, failures{0};
      Stopwatch wall;
      std::vector<std::thread> ts;
      for (int w = 0; w < c; ++w)
        ts.emplace_back([&] {
          for (int i; (i = next++) < iterations;) {
            Stopwatch sw;
            int status = RunOnce(peer_cmd);
            lat[static_cast<size_t>(i)] = sw.ElapsedMs();
            if (status != 0)
              NoteFailure(failures, peer + ": cycle " + std::to_string(i) + ": " + peer_cmd[0] +
                                        " " + DescribeStatus(status));
          }
        });
      for (auto& t : ts) t.join();
      report("lifecycle", peer, c, Summarize(lat, wall.ElapsedMs() / 1000), failures.load());
    }
    return any_failures ? 1 : 0;
  }
  auto tmp = TempDir::Create("/tmp/dsec-bench-");
  if (!tmp.ok()) return 1;
  backends::container::ContainerBackendOptions o;
  o.state_dir = state_dir.empty() ? tmp->path() + "/state" : state_dir;
  o.features.userns = !no_userns;
  o.io_threads = 2;
  auto backend = backends::container::ContainerBackend::Create(o);
  if (!backend.ok()) {
    fprintf(stderr, "backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  printf("# %s\n", (*backend)->Describe().c_str());
  backends::ExecRequest req;
  req.cmd = {"true"};

  if (exec_only) {
    backends::SandboxSpec spec;
    spec.id = NewSandboxId("bench");
    auto sb = (*backend)->Create(spec);
    if (!sb.ok()) return 1;
    for (int c : concurrency) {
      std::vector<double> lat(static_cast<size_t>(iterations)), agent_ms(lat.size());
      std::atomic<int> next{0}, failures{0};
      Stopwatch wall;
      std::vector<std::thread> ts;
      for (int w = 0; w < c; ++w)
        ts.emplace_back([&] {
          for (int i; (i = next++) < iterations;) {
            Stopwatch sw;
            auto r = (*sb)->Exec(req);
            if (!r.ok())
              NoteFailure(failures, "exec: " + r.status().ToString());
            else if (r->result.exit_code != 0)
              NoteFailure(failures, "exec: true exited " + std::to_string(r->result.exit_code));
            lat[static_cast<size_t>(i)] = sw.ElapsedMs();
            if (r.ok()) agent_ms[static_cast<size_t>(i)] = r->result.duration_ms;
          }
        });
      for (auto& t : ts) t.join();
      auto s = Summarize(lat, wall.ElapsedMs() / 1000);
      report("exec", "dsec", c, s, failures.load());
      auto a = Summarize(agent_ms, 1);
      printf("  in the agent (spawn to exit) p50=%.2fms\n", a.p50);
    }
    (void)(*sb)->Destroy();
  } else {
    for (int c : concurrency) {
      std::vector<double> lat(static_cast<size_t>(iterations)), create(lat.size()),
          exec(lat.size()), destroy(lat.size());
      std::atomic<int> next{0}, failures{0};
      Stopwatch wall;
      std::vector<std::thread> ts;
      for (int w = 0; w < c; ++w)
        ts.emplace_back([&] {
          for (int i; (i = next++) < iterations;) {
            Stopwatch sw;
            backends::SandboxSpec spec;
            spec.id = NewSandboxId("bench");
            auto sb = (*backend)->Create(spec);
            if (!sb.ok()) {
              NoteFailure(failures, "create: " + sb.status().ToString());
              lat[static_cast<size_t>(i)] = sw.ElapsedMs();
              continue;
            }
            double t1 = sw.ElapsedMs();
            auto r = (*sb)->Exec(req);
            if (!r.ok())
              NoteFailure(failures, "exec: " + r.status().ToString());
            else if (r->result.exit_code != 0)
              NoteFailure(failures, "exec: true exited " + std::to_string(r->result.exit_code));
            double t2 = sw.ElapsedMs();
            (void)(*sb)->Destroy();
            double t3 = sw.ElapsedMs();
            size_t k = static_cast<size_t>(i);
            lat[k] = t3;
            create[k] = t1;
            exec[k] = t2 - t1;
            destroy[k] = t3 - t2;
          }
        });
      for (auto& t : ts) t.join();
      double secs = wall.ElapsedMs() / 1000;
      auto s = Summarize(lat, secs);
      auto cs = Summarize(create, secs), es = Summarize(exec, secs), ds = Summarize(destroy, secs);
      char phases[160];
      snprintf(phases, sizeof(phases),
               ",\"create_p50\":%.3f,\"exec_p50\":%.3f,\"destroy_p50\":%.3f", cs.p50, es.p50,
               ds.p50);
      report("lifecycle", "dsec", c, s, failures.load(), phases);
      printf("  phases p50: create=%.2fms exec=%.2fms destroy=%.2fms\n", cs.p50, es.p50, ds.p50);
      printf("  phases p90: create=%.2fms exec=%.2fms destroy=%.2fms\n", cs.p90, es.p90, ds.p90);
    }
  }
  (void)(*backend)->Shutdown();
  return any_failures ? 1 : 0;
}
