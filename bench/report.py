#!/usr/bin/env python3
"""Turns bench/run's JSON lines into bench/RESULTS.md: per workload, medians over rounds per
system and concurrency with p99 and "DSec rate / this" ratios, the plots bench/plots.py wrote,
the issue-7 goals measured on this host (computed from the data), and what each system does.

    report.py RAW COMMIT [PLOT_DIR [PLOT_LINK_PREFIX]]

PLOT_DIR (default bench/plots) is where the PNGs are; they are linked as
PLOT_LINK_PREFIX/NAME.png (default plots/, relative to bench/RESULTS.md). Every section is
optional: a workload missing from the raw file is left out."""
import collections
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys

import rawjson

raw, commit = sys.argv[1], sys.argv[2]
plot_dir = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "plots")
plot_link = sys.argv[4] if len(sys.argv) > 4 else "plots"
rows = collections.defaultdict(list)
density, scaling, skipped, notes = [], [], {}, collections.defaultdict(dict)
images = collections.defaultdict(list)  # bench/image_bench.py's records by kind
microvm = []  # bench/microvm_bench.py's records
for r in rawjson.records(raw):
    w = r.get("workload")
    if w == "images":
        images[r.get("kind")].append(r)
    elif w == "microvm" and r.get("case") != "density":
        microvm.append(r)
    elif w == "density":
        density.append(r)
    elif w == "scaling":
        scaling.append(r)
    elif w == "skipped":
        skipped[r["system"]] = r.get("reason", "")
    elif w == "note":
        notes[r["system"]].update({k: v for k, v in r.items() if k not in ("workload", "system")})
    elif "system" in r and "concurrency" in r:
        rows[(w, r["system"], r["concurrency"])].append(r)

NAN = float("nan")


def med(key, k, default=NAN):
    vals = [x[k] for x in rows.get(key, []) if isinstance(x.get(k), (int, float))]
    return statistics.median(vals) if vals else default


def lat(key, p):
    """Median over rounds of p50/p99, under either name the benches use."""
    v = med(key, f"p{p}")
    return med(key, f"p{p}_ms") if math.isnan(v) else v


def fmt(v, digits=2):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(a, b):
    return a / b if b and not math.isnan(a) and not math.isnan(b) else NAN


def plot(name, alt):
    if os.path.exists(os.path.join(plot_dir, name)):
        print(f"\n![{alt}]({plot_link}/{name})\n")


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


ORDER = ["dsec", "dsec-edge", "dsec-pool", "bwrap", "bwrap+python", "crun", "runsc", "sfl",
         "fork+exec", "fork-server", "cold-python", "qemu-microvm"]


def systems_of(workload):
    names = {k[1] for k in rows if k[0] == workload}
    return sorted(names, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))


def side_by_side(workload, dsec_name, unit, heading, intro="", who="workers"):
    keys = [k for k in rows if k[0] == workload]
    if not keys:
        return
    print(f"\n## {heading}\n")
    if intro:
        print(intro + "\n")
    any_fail = any(x.get("failures") for k in keys for x in rows[k])
    print(f"| system | {who} | p50 ms | p99 ms | {unit}/s | DSec rate / this |"
          + (" failed cycles |" if any_fail else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if any_fail else ""))
    for c in sorted({k[2] for k in keys}):
        for s in systems_of(workload):
            key = (workload, s, c)
            if key not in rows:
                continue
            rate = med(key, "rate")
            r = ratio(med((workload, dsec_name, c), "rate"), rate)
            rdig = 2 if r < 10 else 1 if r < 100 else 0
            fails = sum(x.get("failures", 0) for x in rows[key])
            print(f"| {s} | {c} | {fmt(lat(key, 50))} | {fmt(lat(key, 99))} |"
                  f" {fmt(rate, 1) if rate < 100 else fmt(rate, 0)} | {fmt(r, rdig)} |"
                  + (f" {fails} |" if any_fail else ""))


mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
rounds = max((len(v) for k, v in rows.items() if k[0] == "lifecycle"), default=0) or \
    max((len(v) for v in rows.values()), default=0)
os_name = subprocess.run(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"],
                         capture_output=True, text=True).stdout.strip()
print("# Benchmark results\n")
print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
print(f"- machine: {os.cpu_count()} vCPU {cpu_model()}, {mem_gib:.0f} GiB RAM, kernel"
      f" {platform.release()} ({os_name})")
print(f"- commit: {commit}; {rounds} interleaved round(s), medians over rounds shown")
print("- made by `bench/run` (bench/report.py, bench/plots.py); every figure below comes from"
      " the same session on this machine, so ratios are the claim, absolute numbers are this"
      " host's")
if "qemu-microvm" in notes and notes["qemu-microvm"].get("accel"):
    print(f"- qemu-microvm accelerator: {notes['qemu-microvm']['accel']}")
if skipped:
    print("- skipped peers: " + "; ".join(f"**{s}** ({why})" for s, why in skipped.items()))

# ---- goals (issue 7), computed from the data ----
goals = []


def goal(text, measured, ok, how=""):
    goals.append((text, measured, ok, how))


def rate(w, s, c):
    return med((w, s, c), "rate")


api8, bw8, crun8 = rate("api", "dsec-edge", 8), rate("lifecycle", "bwrap", 8), \
    rate("lifecycle", "crun", 8)
if not math.isnan(api8) and not math.isnan(bw8):
    goal("lifecycle through the API: throughput ≥ bwrap's (8 workers)",
         f"{api8:.0f} vs {bw8:.0f}/s = {api8 / bw8:.2f}×", api8 >= bw8)
if not math.isnan(api8) and not math.isnan(crun8):
    goal("lifecycle through the API: throughput ≥ 1.5× crun's (8 workers)",
         f"{api8:.0f} vs {crun8:.0f}/s = {api8 / crun8:.2f}×", api8 >= 1.5 * crun8)
api1, bw1 = lat(("api", "dsec-edge", 1), 50), lat(("lifecycle", "bwrap", 1), 50)
if not math.isnan(api1) and not math.isnan(bw1):
    goal("lifecycle through the API: serial p50 ≤ bwrap's", f"{api1:.2f} vs {bw1:.2f} ms",
         api1 <= bw1)
in8 = rate("lifecycle", "dsec", 8)
if not math.isnan(in8) and not math.isnan(bw8):
    goal("(in-process backend, no API) lifecycle throughput ≥ bwrap's (8 workers)",
         f"{in8:.0f} vs {bw8:.0f}/s = {in8 / bw8:.2f}×", in8 >= bw8)
# Pooled lifecycles: a burst from a pool filled beforehand (api_bench.py --pool-burst).
pool8 = rate("api", "dsec-edge-pool", 8)
if not math.isnan(pool8) and not math.isnan(bw8):
    goal("from a warm pool: lifecycle throughput through the API ≥ 3× bwrap's (8 workers;"
         " a burst from a pool filled beforehand)",
         f"{pool8:.0f} vs {bw8:.0f}/s = {pool8 / bw8:.2f}×", pool8 >= 3 * bw8)
pool_p50 = lat(("pool_create", "pool", 1), 50)
if math.isnan(pool8) and not math.isnan(pool_p50) and not math.isnan(bw1):
    goal("from a warm pool: ≥ 3× bwrap (serial latency: bwrap cycle p50 / pool create p50;"
         " no pooled throughput run)",
         f"{bw1:.2f} / {pool_p50:.2f} ms = {bw1 / pool_p50:.2f}×", bw1 >= 3 * pool_p50)
fn8, bwp8, fs8 = rate("fncall", "dsec", 8), rate("fncall", "bwrap+python", 8), \
    rate("fncall", "fork-server", 8)
if not math.isnan(fn8) and not math.isnan(bwp8):
    goal("fncall through the API: ≥ 5× the calls/s of bwrap + cold python (8 clients)",
         f"{fn8:.0f} vs {bwp8:.0f}/s = {fn8 / bwp8:.1f}×", fn8 >= 5 * bwp8)
if not math.isnan(fn8) and not math.isnan(fs8):
    goal("fncall through the API: ≥ 50% of the bare python fork-server's calls/s (8 clients)",
         f"{fn8:.0f} vs {fs8:.0f}/s = {100 * fn8 / fs8:.0f}%", fn8 >= 0.5 * fs8)
fn1 = lat(("fncall", "dsec", 1), 50)
if not math.isnan(fn1):
    goal("fncall through the API: serial p50 ≤ 2 ms", f"{fn1:.2f} ms", fn1 <= 2.0)
if density:
    d = density[-1]
    n = d.get("reached", 0)
    goal("density: ≥ 1,000 idle container sandboxes", f"{n:,} (target {d.get('target', 0):,})",
         n >= 1000)
    if "host_kb_per_sb" in d:
        goal("density: ≤ 2 MiB host memory per idle sandbox",
             f"{d['host_kb_per_sb']:.0f} kB", d["host_kb_per_sb"] <= 2048)
    if "exec_p99" in d:
        goal("density: exec p99 ≤ 20 ms while they idle", f"{d['exec_p99']:.1f} ms",
             d["exec_p99"] <= 20)
if goals:
    print("\n## Goals (issue 7) on this host\n")
    print("Computed by bench/report.py from this run's data.\n")
    print("| goal | measured | |")
    print("|---|---:|---|")
    for text, measured, ok, _ in goals:
        print(f"| {text} | {measured} | {'met' if ok else '**not met**'} |")

# ---- lifecycle ----
side_by_side("lifecycle", "dsec", "cycles", "Lifecycle: create -> exec `true` -> destroy",
             "DSec is timed in-process through the container backend (no CLI or API); peers are"
             " timed per command via posix_spawn (bench/lifecycle_bench.cc), with N workers"
             " running cycles back to back. runsc and qemu-microvm run fewer cycles and"
             " concurrency levels (they are slow).")
plot("lifecycle_cdf.png", "lifecycle latency CDF, serial")
plot("lifecycle_throughput.png", "lifecycle throughput vs workers")
exec_rows = sorted(k for k in rows if k[0] == "exec")
if exec_rows:
    print("\n## Exec `true` in a live DSec sandbox (through the agent)\n")
    print("| workers | p50 ms | p99 ms | execs/s |")
    print("|---:|---:|---:|---:|")
    for k in exec_rows:
        print(f"| {k[2]} | {fmt(lat(k, 50))} | {fmt(lat(k, 99))} | {fmt(med(k, 'rate'), 0)} |")
    plot("exec_cdf.png", "exec latency CDF")

# ---- api ----
api_rows = sorted((k for k in rows if k[0] == "api"), key=lambda k: (k[1] != "dsec-edge", k[2]))
if api_rows:
    print("\n## Through the API: create -> exec `true` -> delete via dsec-edge\n")
    print("Python SDK (AsyncDSecClient, keep-alive) over loopback TCP with a token, N clients each"
          " running cycles back to back; the create call returns when the sandbox runs"
          " (bench/api_bench.py). **dsec-edge-pool** rows: a burst of cycles whose sandboxes come"
          " from a warm container pool filled beforehand (it refills in the background during"
          " the burst). The last column compares with bwrap's lifecycle rate at the same"
          " concurrency.\n")
    print("| system | clients | p50 ms | p90 ms | p99 ms | cycles/s | create p50/p99 | exec p50/p99"
          " | delete p50/p99 | client CPU | DSec rate / bwrap |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in api_rows:
        def pair(op):
            return f"{fmt(med(k, op + '_p50'), 1)} / {fmt(med(k, op + '_p99'), 1)}"
        print(f"| {k[1]} | {k[2]} | {fmt(med(k, 'p50'), 1)} | {fmt(med(k, 'p90'), 1)} |"
              f" {fmt(med(k, 'p99'), 1)} | {fmt(med(k, 'rate'), 0)} | {pair('create')} |"
              f" {pair('exec')} | {pair('delete')} | {med(k, 'client_cpu', 0) * 100:.0f}% |"
              f" {fmt(ratio(med(k, 'rate'), rate('lifecycle', 'bwrap', k[2])))} |")
    plot("api_cdf.png", "API cycle latency CDF")

# ---- fncall ----
side_by_side("fncall", "dsec", "calls", "Function calls: `print(1)` in python, side by side",
             "bench/fncall_bench.py: **dsec** = `POST /v1/fncalls` through dsec-edge (keep-alive"
             " HTTP over loopback with a token, a thread per client), each call forked from a warm"
             " zygote into fresh pid/mount/ipc namespaces with fresh tmpfs dirs, no capabilities"
             " and the full seccomp profile, inside a worker sandbox; **fork-server** = a bare,"
             " unisolated python fork-server on a unix socket (the floor); **cold-python** ="
             " `python3 -c` per call; **bwrap+python** = a fresh `bwrap --unshare-all` sandbox"
             " running `python3 -c` per call.", who="clients")
plot("fncall_cdf.png", "function call latency CDF, serial")
plot("fncall_throughput.png", "function call throughput vs clients")
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
            print(f"| {s} | {fmt(lat(key, 50))} | {fmt(lat(key, 99))} |")

# ---- episode ----
side_by_side("episode", "dsec", "episodes", "Episodes: write files, run a small pytest suite,"
             " read results", "bench/episode_bench.py; **dsec** goes through the API/SDK,"
             " **dsec-pool** takes its sandbox from a warm pool, **fork+exec** runs the episode"
             " unisolated (the floor).", who="at a time")
plot("episode_cdf.png", "episode latency CDF, serial")
plot("episode_throughput.png", "episode throughput vs concurrency")

# ---- density and scaling ----
for d in density[-1:]:
    n = d.get("reached", 0)
    print(f"\n## Idle density: {n:,} idle sandboxes on one edge\n")
    print(f"Sandboxes with memory_mb={d.get('memory_mb')}, disk_mb={d.get('disk_mb')}, created"
          f" with `count` in batches of {d.get('batch')} ({d.get('parallel')} in flight), left"
          " idle (bench/density_bench.py).\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| created | {n:,} of {d.get('target', 0):,} in {d.get('fill_s')} s"
          f" ({d.get('create_rate')}/s) |")
    if "failure" in d:
        print(f"| stopped by | {d['failure']} |")
    if "edge_rss_mb" in d:
        print(f"| edge RSS | {d.get('edge_rss_base_mb')} MB -> {d['edge_rss_mb']} MB |")
        print(f"| edge memory per sandbox (RSS delta / n) | {d.get('edge_kb_per_sb', 0):.0f} kB |")
        print(f"| host memory per sandbox (MemTotal - MemAvailable delta / n) |"
              f" {d.get('host_kb_per_sb', 0):.0f} kB |")
        k = d.get("kernel_kb_per_sb")
        if k:
            print(f"| of which slab / page tables / kernel stacks per sandbox |"
                  f" {k['Slab']:.0f} / {k['PageTables']:.0f} / {k['KernelStack']:.0f} kB |")
        if d.get("cgroup_kb_per_sb") is not None:
            print(f"| charged to the sandboxes' memory cgroup, per sandbox |"
                  f" {d['cgroup_kb_per_sb']:.0f} kB |")
        print(f"| edge fds / threads | {d.get('edge_fds', 0):,} / {d.get('edge_threads')} |")
    if "exec_p50" in d:
        print(f"| exec `true` in a random idle sandbox, p50 / p99 ({d.get('exec_samples')}"
              f" samples, {d.get('exec_concurrency')} at a time) | {d['exec_p50']:.1f} /"
              f" {d['exec_p99']:.1f} ms |")
    if "deleted" in d:
        print(f"| delete all (`DELETE /v1/jobs/{{job}}`) | {d['deleted']:,} in"
              f" {d.get('delete_s')} s |")
    if "cleanup" in d:
        print(f"| left on the host after SIGTERM | "
              f"{'nothing' if not d['cleanup'] else '; '.join(d['cleanup'])} |")
if scaling:
    print("\n## Scaling: latency and memory vs live sandboxes\n")
    print("Checkpoints while the density run fills the edge (bench/density_bench.py): create and"
          " exec latency through the API with that many sandboxes idling, edge and host"
          " memory.\n")
    print("| live | create p50 / p99 ms | exec p50 / p99 ms | edge RSS MiB | edge fds |"
          " host used MiB | host kB / sandbox |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in sorted(scaling, key=lambda r: r.get("live", 0)):
        def g(k, scale=1.0, digits=1):
            v = s.get(k)
            return fmt(v / scale, digits) if isinstance(v, (int, float)) else "–"
        print(f"| {s.get('live', 0):,} | {g('create_p50')} / {g('create_p99')} |"
              f" {g('exec_p50')} / {g('exec_p99')} | {g('edge_rss_kb', 1024)} |"
              f" {g('edge_fds', 1, 0)} | {g('host_used_kb', 1024, 0)} |"
              f" {g('host_per_sandbox_kb', 1, 0)} |")
    plot("scaling_memory.png", "memory vs live sandboxes")
    plot("scaling_latency.png", "create and exec latency vs live sandboxes")


# ---- images (issue 5) ----
def img_med(recs, k):
    vals = [x[k] for x in recs if isinstance(x.get(k), (int, float))]
    return statistics.median(vals) if vals else NAN


def img_pick(kind, **match):
    return [x for x in images.get(kind, []) if all(x.get(k) == v for k, v in match.items())]


def mib(v):
    return fmt(v / 2**20, 1) if not math.isnan(v) else "–"


IMAGE_NAMES = {"host": "`host`", "host+3": "`[\"host\", l1, l2, l3]`",
               "busybox-3": "`[busybox, bl1, bl2]` (no host)"}
if images:
    metas = images.get("meta") or [{}]
    meta = metas[-1]
    loads = [x for m in metas for x in (m.get("load_start", [])[:1] + m.get("load_end", [])[:1])]
    runs = (f"{len(metas)} runs of the stage, {fmt(min(m.get('duration_s', NAN) for m in metas), 0)}"
            f"–{fmt(max(m.get('duration_s', NAN) for m in metas), 0)} s each" if len(metas) > 1
            else f"stage time {fmt(meta.get('duration_s', NAN), 0)} s")
    print("\n## Images (issue 5)\n")
    print("bench/image_bench.py: two private edges on this host, one storing layers as"
          " directories (`image_layer_format: dir`), one as EROFS images on loop devices"
          " (`erofs`); the same archives are imported into both. The cases are interleaved in"
          " rounds (ABAB/ABBA), medians shown (over runs, for the percentile rows). Through the"
          f" REST API (raw HTTP, keep-alive). {runs[0].upper() + runs[1:]}"
          f"{' (--quick)' if meta.get('quick') else ''}"
          + (f"; host load average (1 min) {fmt(min(loads), 1)}–{fmt(max(loads), 1)} at the"
             " starts and ends" if loads else "") + ".")
    short = []

    def cr_p50(im, lf, w=1):
        return img_med(img_pick("create", image=im, layers=lf, workers=w), "create_p50")
    h, h3 = cr_p50("host", "erofs"), cr_p50("host+3", "erofs")
    if not math.isnan(h) and not math.isnan(h3):
        hd, h3d = cr_p50("host", "dir"), cr_p50("host+3", "dir")
        short.append(f"3 layers stacked on `host` cost {fmt(h3 - h, 1)} ms of serial create p50"
                     f" ({fmt(h3, 1)} vs {fmt(h, 1)} ms on the EROFS edge; {fmt(h3d, 1)} vs"
                     f" {fmt(hd, 1)} on the dir edge).")
    bd, be = cr_p50("busybox-3", "dir"), cr_p50("busybox-3", "erofs")
    if not math.isnan(bd) and not math.isnan(be):
        short.append(f"Dir vs EROFS lowers (the busybox stack): serial create p50 {fmt(bd, 1)} vs"
                     f" {fmt(be, 1)} ms, 4 workers {fmt(cr_p50('busybox-3', 'dir', 4), 1)} vs"
                     f" {fmt(cr_p50('busybox-3', 'erofs', 4), 1)} ms.")
    sd, se = img_pick("snapshot", layers="dir"), img_pick("snapshot", layers="erofs")
    if sd and se:
        short.append(f"Snapshot of 100 MiB: {fmt(img_med(sd, 'snapshot_ms'), 0)} ms as a dir"
                     f" layer, {fmt(img_med(se, 'snapshot_ms'), 0)} ms as EROFS (mkfs.erofs);"
                     f" but the dir layer's first create on `host` makes its EROFS copy"
                     f" ({fmt(img_med(sd, 'create_first_ms'), 0)} ms, and"
                     f" {mib(img_med(sd, 'layer_disk_bytes_after_create'))} MiB on disk for"
                     f" {mib(img_med(sd, 'layer_bytes'))} MiB of files).")
    f100 = img_pick("fork", source="100 MiB written")
    base = img_pick("fork", source="create count (host)")
    if f100 and base:
        short.append(f"Fork of 16 from a 100 MiB sandbox: {fmt(img_med(f100, 'call_ms'), 0)} ms"
                     f" (all 16 answered `true` after {fmt(img_med(f100, 'ready_max_ms'), 0)} ms);"
                     f" 16 fresh sandboxes with `count`: {fmt(img_med(base, 'call_ms'), 0)} ms.")
    pd, pe = img_pick("pagecache", layers="dir"), img_pick("pagecache", layers="erofs")
    if pd and pe:
        n, d = pd[0]["sandboxes"], pd[0]["data_mib"]
        short.append(f"{n} sandboxes reading the same {d} MiB share one copy in the page cache"
                     f" with dir layers ({fmt(img_med(pd, 'cached_kb') / 1024, 0)} MiB of"
                     f" Cached growth, as for one reader); with EROFS layers the loop device"
                     f" caches the image file as well: {fmt(img_med(pe, 'cached_kb') / 1024, 0)}"
                     f" MiB ({fmt(img_med(pe, 'files_kb') / 1024, 0)} of files +"
                     f" {fmt(img_med(pe, 'loop_file_kb') / 1024, 0)} of the image file"
                     + (", which is not charged to the sandboxes' cgroups)."
                        if img_med(pe, "cg_file_kb") < img_med(pe, "files_kb")
                        + img_med(pe, "loop_file_kb") / 2 else ")."))
    if short:
        print("\nIn short (computed from the data below):\n")
        for x in short:
            print(f"- {x}")
    cr = images.get("create", [])
    if cr:
        print("\n### Create latency: 3-layer images vs `host`\n")
        print("**create** = `POST /v1/sandboxes` until it returns a running sandbox; **cycle** ="
              " create → exec `true` → delete. Layers l1..l3, bl1, bl2: 64 files of 4 KiB each;"
              " busybox = /bin/busybox (busybox-static) and applet links. **first** = the first"
              " create of that stack on that edge (it makes the loop mounts, and on the dir edge"
              " the EROFS copies of host-stacked layers), not in the percentiles. Layers stacked"
              " on `host` are EROFS-mounted on both edges (the store gives a dir layer an EROFS"
              " copy there: overlayfs refuses a lower on the host root's filesystem), so only"
              " the busybox stack compares dir with EROFS lowers.\n")
        print("| image | layers | workers | cycles | create p50 | create p99 | cycle p50 |"
              " cycle p99 | cycles/s | first create |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        keys = sorted({(x["workers"], x["image"], x["layers"]) for x in cr},
                      key=lambda k: (k[0], list(IMAGE_NAMES).index(k[1])
                                     if k[1] in IMAGE_NAMES else 9, k[2]))
        for w, im, lf in keys:
            g = img_pick("create", workers=w, image=im, layers=lf)
            print(f"| {IMAGE_NAMES.get(im, im)} | {lf} | {w} | {sum(x['cycles'] for x in g)} |"
                  f" {fmt(img_med(g, 'create_p50'), 1)} | {fmt(img_med(g, 'create_p99'), 1)} |"
                  f" {fmt(img_med(g, 'cycle_p50'), 1)} | {fmt(img_med(g, 'cycle_p99'), 1)} |"
                  f" {fmt(img_med(g, 'rate'), 0)} | {fmt(img_med(g, 'first_create_ms'), 0)} |")
        errs = sum(x.get("errors", 0) for x in cr)
        if errs:
            print(f"\n**{errs} failed cycles**: {cr[0].get('first_errors')}")
    sn = images.get("snapshot", [])
    if sn:
        print("\n### Snapshot (pack_diff) of a 100 MiB writable layer\n")
        print("A `host` sandbox (memory_mb 128, disk_mb 256) writes 4 × 25 MiB from"
              " /dev/urandom; `POST /v1/sandboxes/{id}/snapshot` makes the image; then two"
              " sandboxes are created from it (the first one makes the EROFS copy or loop"
              " mount). Layer size as the API reports it and as stored on disk (after the"
              " snapshot, and after the first create from it).\n")
        print("| layers | n | write 100 MiB | snapshot | layer size | on disk | on disk after"
              " a create | first create from it | later create |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for lf in sorted({x["layers"] for x in sn}):
            g = img_pick("snapshot", layers=lf)
            print(f"| {lf} | {len(g)} | {fmt(img_med(g, 'write_s'))} s |"
                  f" {fmt(img_med(g, 'snapshot_ms'), 0)} ms |"
                  f" {mib(img_med(g, 'layer_bytes'))} MiB ({g[0].get('layer_format')}) |"
                  f" {mib(img_med(g, 'layer_disk_bytes'))} MiB |"
                  f" {mib(img_med(g, 'layer_disk_bytes_after_create'))} MiB |"
                  f" {fmt(img_med(g, 'create_first_ms'), 0)} ms |"
                  f" {fmt(img_med(g, 'create_later_ms'), 0)} ms |")
    fk = images.get("fork", [])
    if fk:
        n = fk[0].get("count", 16)
        print(f"\n### Fork N={n}\n")
        print(f"One `POST /v1/sandboxes/{{id}}/fork {{\"count\": {n}}}` (it returns when all"
              f" {n} run); **ready** = from the request until each new sandbox answered `true`"
              f" ({n} execs in parallel right after the call). Baseline: `POST /v1/sandboxes"
              f" {{\"image\": \"host\", \"count\": {n}}}`.\n")
        print("| from | layers | n | call | per sandbox | ready p50 | ready max (all) |"
              " first exec p50 |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for src in ("100 MiB written", "1 MiB written", "create count (host)"):
            for lf in sorted({x["layers"] for x in fk}):
                g = img_pick("fork", source=src, layers=lf)
                if not g:
                    continue
                label = (f"fork of a sandbox with {src}" if "written" in src
                         else f"create count={n} from `host`")
                print(f"| {label} | {lf} | {len(g)} | {fmt(img_med(g, 'call_ms'), 0)} ms |"
                      f" {fmt(img_med(g, 'per_sandbox_ms'), 1)} ms |"
                      f" {fmt(img_med(g, 'ready_p50_ms'), 0)} ms |"
                      f" {fmt(img_med(g, 'ready_max_ms'), 0)} ms |"
                      f" {fmt(img_med(g, 'exec_p50_ms'), 1)} ms |")
    pcs = images.get("pagecache", [])
    if pcs:
        p0 = pcs[0]
        print(f"\n### EROFS vs dir layers: host page cache with {p0['sandboxes']} sandboxes on"
              " one image\n")
        print(f"Image `[busybox, data]`, data = {p0['data_mib']} MiB in 4 MiB files (random, so"
              f" incompressible). {p0['sandboxes']} sandboxes (memory_mb {p0['memory_mb']},"
              " disk_mb 16; the page cache a sandbox reads is charged to its cgroup, so the"
              " limit must hold it), then `sync; echo 3 > /proc/sys/vm/drop_caches`, one"
              " sandbox reads all of /data (`dd if=FILE of=/dev/null bs=1M` per file), then the"
              " others (4 at a time)."
              " **Cached** = growth of Cached in /proc/meminfo (host-wide, so it includes other"
              " work: **drift** is the growth over a control interval of"
              f" {fmt(p0.get('drift_s', NAN), 0)} s with no reader); **files** = /data's pages"
              " in the page cache (mincore through a sandbox's root); **loop file** = pages of"
              " the EROFS image file itself in the page cache (read by the loop device: a"
              " second copy); **cgroup file** = file cache charged to the edge's sandbox"
              " cgroups; **memory per sandbox** = growth of the memory charged to the edge's"
              " sandbox cgroups when the sandboxes were created, per sandbox (the host-wide"
              " figure is in the raw data; on a shared host it is noise). Medians over rounds;"
              " MiB unless marked.\n")
        print("| layers | rounds | Cached growth, 1st reader / all | files | loop file | cgroup"
              " file | Buffers | drift | 1st read (cold) | other reads | memory per sandbox |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for lf in sorted({x["layers"] for x in pcs}):
            g = img_pick("pagecache", layers=lf)

            def m(k):
                return fmt(img_med(g, k) / 1024, 0)
            print(f"| {lf} | {len(g)} | {m('first_cached_kb')} / {m('cached_kb')} |"
                  f" {m('files_kb')} | {m('loop_file_kb')} | {m('cg_file_kb')} |"
                  f" {fmt(img_med(g, 'buffers_kb') / 1024, 1)} | {m('drift_cached_kb')} |"
                  f" {fmt(img_med(g, 'first_read_s'))} s |"
                  f" {fmt(img_med(g, 'rest_read_s'))} s ({fmt(img_med(g, 'read_mib_s'), 0)}"
                  f" MiB/s) | {fmt(img_med(g, 'cgroup_kb_per_sb'), 0)} kB |")
    imp = images.get("import", [])
    if imp:
        print("\nImport (`POST /v1/images/import`, rootfs tar) time, ms: " + "; ".join(
            f"{name} ({fmt(img_pick('import', image=name)[0]['mib'], 1)} MiB)"
            + "".join(f" {lf} {fmt(img_med(img_pick('import', image=name, layers=lf), 'ms'), 0)}"
                      for lf in ("dir", "erofs"))
            for name in dict.fromkeys(x["image"] for x in imp)) + ".")
    stray = [f"{x['layers']}: {x['stray_layers']}" for x in images.get("store", [])
             if x.get("stray_layers")]
    print(f"\nLeft behind after the stage: {'; '.join(meta.get('residue') or []) or 'nothing'}"
          " (edges stopped and checked: processes, cgroups, mounts, loop devices, temp dirs);"
          f" unreferenced layers in the stores: {'; '.join(stray) or 'none'}; warning/error"
          f" lines in the edges' logs: {sum(m.get('edge_warnings', 0) for m in metas)}"
          + (f" (logs checked in {sum('edge_warnings' in m for m in metas)} of {len(metas)} runs)"
             if not all("edge_warnings" in m for m in metas) else "")
          + "".join(f"; `{w}`" for m in metas for w in m.get("first_edge_warnings", [])[:3])
          + ".")

if microvm:
    print("\n## MicroVMs (issue 16)\n")
    print("bench/microvm_bench.py: one edge of its own, a busybox image, 128 MiB + 32 MiB disk per"
          " sandbox, every call through the REST API; the container kind of the same image"
          " beside it. Medians over the samples of the run.\n")
    print("| what | n | p50 | p99 | unit |")
    print("|---|---:|---:|---:|---|")
    for r in microvm:
        print(f"| {r['case'].strip()} | {r['n']} | {fmt(r['p50'], 1)} | {fmt(r['p99'], 1)} |"
              f" {r['unit']} |")
    boot = lat(("lifecycle", "qemu-microvm", 1), 50)
    if not math.isnan(boot):
        print(f"| peer: QEMU cold boot of the same kernel to a static /init (lifecycle stage) |"
              f" | {fmt(boot, 1)} | {fmt(lat(('lifecycle', 'qemu-microvm', 1), 99), 1)} | ms |")

if rows or density:
    accel = notes.get("qemu-microvm", {}).get("accel", "")
    print(f"""
## What each system does per cycle

- **dsec**: cgroups (memory+disk, pids, cpu quota) in every v1 hierarchy plus cgroup2
  tracking, user namespace with an idmapped host root, new mount/pid/uts/ipc/cgroup namespaces
  and a pooled loopback-only network namespace, one overlay root (in-memory mask layer that
  hides secrets and non-allowlisted paths, over the host /) with a size-limited tmpfs upper,
  masked /proc, minimal /dev, seccomp, agent start and handshake, exec through the agent, then
  full teardown. **dsec-edge** (API rows) adds the REST API, the state DB and the SDK client.
- **bwrap** `--unshare-all --ro-bind / / --dev /dev --proc /proc /bin/true`: new namespaces
  (including a fresh network namespace), bind mounts; no cgroups, no writable layer, no agent.
- **crun**: OCI bundle with the host / read-only, memory/pids/cpu cgroup limits, default
  namespaces and mounts, run via `crun run` (create, start, wait, delete).
- **runsc** (gVisor): the same OCI bundle and limits via `runsc run` on the ptrace platform
  with no network: a user-space kernel (Sentry) and a gofer per container, cgroups, teardown.
- **sfl** (SandboxFusion "lite", bench/peers/sandboxfusion_lite.sh): v1 memory/pids/cpu cgroups
  with limits, a tmpfs + overlayfs of the host /, /proc, /sys and /dev mounted in, `unshare
  --mount --pid --net --uts --ipc --fork` + chroot, then unmount and remove it all — a shell
  script spawning a dozen tools per run, as SandboxFusion does.
- **fork+exec**: `/bin/true` with no isolation (the floor).
- **cold-python**: `/usr/bin/python3 -c pass` with no isolation (the floor for python work).
- **qemu-microvm**: `qemu-system-x86_64 -M microvm` booting Debian's cloud kernel (PVH entry,
  no firmware, no PCI) with an initramfs whose static /init prints a marker and powers off:
  boot to init and back, a new VM per cycle{(' — ' + accel) if accel else ''}.
""")
