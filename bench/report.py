#!/usr/bin/env python3
"""Turns bench/run's JSON lines into bench/RESULTS.md: medians over rounds per system and
concurrency, with ratios to DSec (lifecycle_bench), the API benchmark (api_bench.py, medians
over rounds) and the idle density run (density_bench.py)."""
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

raw, commit = sys.argv[1], sys.argv[2]
rows = collections.defaultdict(list)
density = []
for line in open(raw):
    if line.startswith("JSON "):
        r = json.loads(line[5:])
        if r["workload"] == "density":
            density.append(r)
        else:
            rows[(r["workload"], r["system"], r["concurrency"])].append(r)


def med(key, k):
    return statistics.median(x[k] for x in rows[key])


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
rounds = max((len(v) for v in rows.values()), default=0)
print("# Benchmark results\n")
print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
print(f"- machine: {os.cpu_count()} vCPU {cpu_model()}, {mem_gib:.0f} GiB RAM, kernel {platform.release()}"
      f" ({subprocess.run(['sh', '-c', '. /etc/os-release; echo $PRETTY_NAME'], capture_output=True, text=True).stdout.strip()})")
print(f"- commit: {commit}; {rounds} interleaved rounds, medians shown")
print("- workload: create a sandbox -> run /bin/true in it -> destroy it. DSec is timed in-process"
      " through the container backend (no CLI start); peers are timed per command via posix_spawn.\n")
life_rows = sorted(k for k in rows if k[0] == "lifecycle")
if life_rows:
    print("## Lifecycle: create -> exec `true` -> destroy\n")
    print("| system | workers | p50 ms | p99 ms | cycles/s | DSec rate / this |")
    print("|---|---:|---:|---:|---:|---:|")
systems = ["dsec", "bwrap", "crun", "fork+exec"]
for c in sorted({k[2] for k in life_rows}):
    dsec_key = ("lifecycle", "dsec", c)
    for s in systems:
        key = ("lifecycle", s, c)
        if key not in rows:
            continue
        ratio = med(dsec_key, "rate") / med(key, "rate") if dsec_key in rows else float("nan")
        print(f"| {s} | {c} | {med(key, 'p50'):.2f} | {med(key, 'p99'):.2f} | {med(key, 'rate'):.0f} |"
              f" {ratio:.2f} |")
exec_rows = sorted(k for k in rows if k[0] == "exec")
if exec_rows:
    print("\n## Exec `true` in a live DSec sandbox (through the agent)\n")
    print("| workers | p50 ms | p99 ms | execs/s |")
    print("|---:|---:|---:|---:|")
    for k in exec_rows:
        print(f"| {k[2]} | {med(k, 'p50'):.2f} | {med(k, 'p99'):.2f} | {med(k, 'rate'):.0f} |")
api_rows = sorted((k for k in rows if k[0] == "api"), key=lambda k: k[2])
if api_rows:
    print("\n## Through the API: create -> exec `true` -> delete via dsec-edge\n")
    print("Python SDK (AsyncDSecClient, keep-alive) over loopback TCP with a token, N clients each"
          " running cycles back to back; the create call returns when the sandbox runs"
          " (bench/api_bench.py). Medians over rounds.\n")
    print("| clients | p50 ms | p90 ms | p99 ms | cycles/s | create p50/p99 | exec p50/p99"
          " | delete p50/p99 | client CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in api_rows:
        def pair(op):
            return f"{med(k, op + '_p50'):.1f} / {med(k, op + '_p99'):.1f}"
        print(f"| {k[2]} | {med(k, 'p50'):.1f} | {med(k, 'p90'):.1f} | {med(k, 'p99'):.1f} |"
              f" {med(k, 'rate'):.0f} | {pair('create')} | {pair('exec')} | {pair('delete')} |"
              f" {med(k, 'client_cpu') * 100:.0f}% |")
fn_rows = [k for k in rows if k[0] == "fncall"]
if fn_rows:
    print("\n## Function calls: `print(1)` in python, through the API and side by side\n")
    print("bench/fncall_bench.py: **dsec** = `POST /v1/fncalls` through dsec-edge (keep-alive"
          " HTTP over loopback with a token, a thread per client), each call forked from a warm"
          " zygote into fresh pid/mount/ipc namespaces with fresh tmpfs dirs, no capabilities and"
          " the full seccomp profile, inside a worker sandbox; **fork-server** = a bare, unisolated"
          " python fork-server on a unix socket (the floor); **cold-python** = `python3 -c` per"
          " call; **bwrap+python** = a fresh `bwrap --unshare-all` sandbox running `python3 -c` per"
          " call. Medians over rounds.\n")
    print("| system | clients | p50 ms | p99 ms | calls/s | DSec rate / this |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in sorted({k[2] for k in fn_rows}):
        dsec_key = ("fncall", "dsec", c)
        for s in ["dsec", "fork-server", "cold-python", "bwrap+python"]:
            key = ("fncall", s, c)
            if key not in rows:
                continue
            ratio = med(dsec_key, "rate") / med(key, "rate") if dsec_key in rows else float("nan")
            print(f"| {s} | {c} | {med(key, 'p50_ms'):.2f} | {med(key, 'p99_ms'):.2f} |"
                  f" {med(key, 'rate'):.0f} | {ratio:.2f} |")
pc_rows = [k for k in rows if k[0] == "pool_create"]
if pc_rows:
    print("\n## Container create from a pool vs a fresh create (through the API)\n")
    print("`POST /v1/sandboxes {\"pool\": ...}` (a pre-created sandbox; the pool refills in the"
          " background) against a plain create, each followed by a delete, one at a time.\n")
    print("| create | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for s in ["pool", "fresh"]:
        key = ("pool_create", s, 1)
        if key in rows:
            print(f"| {s} | {med(key, 'p50_ms'):.2f} | {med(key, 'p99_ms'):.2f} |")
for d in density[-1:]:
    n = d.get("reached", 0)
    print(f"\n## Idle density: {n:,} idle sandboxes on one edge\n")
    print(f"Sandboxes with memory_mb={d['memory_mb']}, disk_mb={d['disk_mb']}, created with"
          f" `count` in batches of {d['batch']} ({d['parallel']} in flight), left idle"
          " (bench/density_bench.py).\n")
    print("| measure | value |")
    print("|---|---:|")
    fill = f"{n:,} of {d['target']:,} in {d['fill_s']} s ({d['create_rate']}/s)"
    print(f"| created | {fill} |")
    if "failure" in d:
        print(f"| stopped by | {d['failure']} |")
    if "edge_rss_mb" in d:
        print(f"| edge RSS | {d['edge_rss_base_mb']} MB -> {d['edge_rss_mb']} MB |")
        print(f"| edge memory per sandbox (RSS delta / n) | {d['edge_kb_per_sb']:.0f} kB |")
        print(f"| host memory per sandbox (MemTotal - MemAvailable delta / n) |"
              f" {d['host_kb_per_sb']:.0f} kB |")
        k = d["kernel_kb_per_sb"]
        print(f"| of which slab / page tables / kernel stacks per sandbox |"
              f" {k['Slab']:.0f} / {k['PageTables']:.0f} / {k['KernelStack']:.0f} kB |")
        if d.get("cgroup_kb_per_sb") is not None:
            print(f"| charged to the sandboxes' memory cgroup, per sandbox |"
                  f" {d['cgroup_kb_per_sb']:.0f} kB |")
        print(f"| edge fds / threads | {d['edge_fds']:,} / {d['edge_threads']} |")
    if "exec_p50" in d:
        print(f"| exec `true` in a random idle sandbox, p50 / p99 ({d['exec_samples']} samples,"
              f" {d['exec_concurrency']} at a time) | {d['exec_p50']:.1f} / {d['exec_p99']:.1f}"
              " ms |")
    if "deleted" in d:
        print(f"| delete all (`DELETE /v1/jobs/{{job}}`) | {d['deleted']:,} in {d['delete_s']} s |")
    if "cleanup" in d:
        print(f"| left on the host after SIGTERM | "
              f"{'nothing' if not d['cleanup'] else '; '.join(d['cleanup'])} |")
if life_rows:
    print("""
What each does per cycle:
- **dsec**: cgroups (memory+disk, pids, cpu quota) in every v1 hierarchy plus cgroup2
  tracking, user namespace with an idmapped host root, new mount/pid/uts/ipc/cgroup namespaces
  and a pooled loopback-only network namespace, one overlay root (in-memory mask layer that
  hides secrets and non-allowlisted paths, over the host /) with a size-limited tmpfs upper, masked /proc, minimal /dev, seccomp, agent start and handshake,
  exec through the agent, then full teardown.
- **bwrap** `--unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true`: new namespaces
  (including a fresh network namespace), bind mounts; no cgroups, no writable layer, no agent.
- **crun**: OCI bundle with the host / read-only, memory/pids/cpu cgroup limits, default
  namespaces and mounts, run via `crun run` (create, start, wait, delete).
- **fork+exec**: `/bin/true` with no isolation (the floor).
""")
