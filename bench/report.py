#!/usr/bin/env python3
"""Turns bench/run's JSON lines into bench/RESULTS.md: medians over rounds per system and
concurrency, with ratios to DSec."""
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
for line in open(raw):
    if line.startswith("JSON "):
        r = json.loads(line[5:])
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
print("## Lifecycle: create -> exec `true` -> destroy\n")
print("| system | workers | p50 ms | p99 ms | cycles/s | DSec rate / this |")
print("|---|---:|---:|---:|---:|---:|")
systems = ["dsec", "bwrap", "crun", "fork+exec"]
for c in sorted({k[2] for k in rows}):
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
