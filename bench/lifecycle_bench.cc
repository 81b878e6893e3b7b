// Lifecycle benchmark: create -> exec `true` -> destroy through the container backend,
// in-process (no CLI start), serial latency and throughput with N concurrent workers.
// Usage: lifecycle_bench [--iterations N] [--concurrency 1,2,8] [--state-dir DIR] [--no-userns]
//                        [--exec-only] (exec latency in one live sandbox)
// Prints one line per configuration: p50/p90/p99/max in ms and cycles per second.
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

using namespace dsec;

namespace {

struct Summary {
  double p50, p90, p99, max, per_sec;
};

Summary Summarize(std::vector<double> v, double wall_s) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
  return {pct(0.5), pct(0.9), pct(0.99), v.back(), v.size() / wall_s};
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  std::vector<int> concurrency = {1, 2, 8};
  std::string state_dir;
  bool no_userns = false, exec_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) iterations = std::stoi(argv[++i]);
    else if (a == "--concurrency" && i + 1 < argc) {
      concurrency.clear();
      for (auto c : SplitString(argv[++i], ',', true)) concurrency.push_back(std::stoi(std::string(c)));
    } else if (a == "--state-dir" && i + 1 < argc) state_dir = argv[++i];
    else if (a == "--no-userns") no_userns = true;
    else if (a == "--exec-only") exec_only = true;
    else {
      fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
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
      std::atomic<int> next{0};
      Stopwatch wall;
      std::vector<std::thread> ts;
      for (int w = 0; w < c; ++w)
        ts.emplace_back([&] {
          for (int i; (i = next++) < iterations;) {
            Stopwatch sw;
            auto r = (*sb)->Exec(req);
            if (!r.ok() || r->result.exit_code != 0) fprintf(stderr, "exec failed\n");
            lat[static_cast<size_t>(i)] = sw.ElapsedMs();
            if (r.ok()) agent_ms[static_cast<size_t>(i)] = r->result.duration_ms;
          }
        });
      for (auto& t : ts) t.join();
      auto s = Summarize(lat, wall.ElapsedMs() / 1000);
      printf("exec_true concurrency=%d n=%d p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms rate=%.0f/s\n", c,
             iterations, s.p50, s.p90, s.p99, s.max, s.per_sec);
      auto a = Summarize(agent_ms, 1);
      printf("  in the agent (spawn to exit) p50=%.2fms\n", a.p50);
    }
    (void)(*sb)->Destroy();
  } else {
    for (int c : concurrency) {
      std::vector<double> lat(static_cast<size_t>(iterations)), create(lat.size()), exec(lat.size()),
          destroy(lat.size());
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
              fprintf(stderr, "create: %s\n", sb.status().ToString().c_str());
              failures++;
              continue;
            }
            double t1 = sw.ElapsedMs();
            auto r = (*sb)->Exec(req);
            if (!r.ok() || r->result.exit_code != 0) failures++;
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
      printf("lifecycle concurrency=%d n=%d p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms rate=%.0f/s failures=%d\n",
             c, iterations, s.p50, s.p90, s.p99, s.max, s.per_sec, failures.load());
      auto cs = Summarize(create, secs), es = Summarize(exec, secs), ds = Summarize(destroy, secs);
      printf("  phases p50: create=%.2fms exec=%.2fms destroy=%.2fms\n", cs.p50, es.p50, ds.p50);
    }
  }
  (void)(*backend)->Shutdown();
  return 0;
}
