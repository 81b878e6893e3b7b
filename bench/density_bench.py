#!/usr/bin/env python3
"""Idle density: how many idle sandboxes one edge holds, what each costs, and exec latency
while they all idle.

  1. start an edge (examples/edgeproc.py) with admission opened up for the target
     (--max-sandboxes, --memory-overcommit)
  2. create idle sandboxes (small memory_mb/disk_mb) in batches (`count` on create, a few
     batches in flight) up to --target, recording at checkpoints: the edge's RSS (VmRSS), host
     memory in use (MemTotal - MemAvailable, /proc/meminfo) and its kernel parts, the memory
     charged to the sandboxes' parent cgroup, the edge's fds and threads
  3. let them settle, then per sandbox: edge RSS delta / n, host memory delta / n,
     cgroup charge / n
  4. exec `true` in randomly chosen idle sandboxes: p50/p99 (all others keep idling)
  5. check every sandbox is still running, delete them all (DELETE /v1/jobs/{job}), check the
     node is empty, stop the edge and check nothing is left on the host

Scaling curves: when the fill passes 10, 30, 100, 300, 1000, 3000, ... live sandboxes it pauses
and measures, with that many idling: the latency of single creates (--scaling-creates extra
sandboxes, one at a time, each deleted right after), of exec `true` in random idle sandboxes
(--scaling-execs), the edge's RSS and fds, and host memory in use (total and per sandbox). An
edge doing O(1) work per operation shows flat create/exec latencies from 10 to the limit.

The fill stops at --target sandboxes, or earlier at the memory bound: before host memory in
use (MemTotal - MemAvailable) would pass --max-host-mem-mb (default: 75% of MemTotal, i.e.
MemAvailable stays above 25%). `--target max` fills until that bound (the density limit).
Why it stopped is recorded (stop_reason: target, memory bound, or the create error).
If creation fails before the target, it stops there, reports how far it got, the error and
the edge's log tail, and still cleans up.

    sudo python3 bench/density_bench.py [--target 1000|max] [--batch 50] [--memory-mb 32]
        [--max-host-mem-mb MB] [--scaling-creates 30] [--scaling-execs 50]

--json adds a `JSON {...}` line for bench/report.py (workload "density") and one per scaling
checkpoint (workload "scaling").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import edgeproc  # noqa: E402

edgeproc.use_sdk()
from libdsec import AsyncDSecClient, DSecContainerRunArgs, DSecError  # noqa: E402

pct = edgeproc.percentile
KERNEL_KEYS = ("Slab", "SUnreclaim", "KernelStack", "PageTables", "Shmem", "AnonPages",
               "Percpu")


def host_used_kb(mi: dict[str, int]) -> int:
    return mi["MemTotal"] - mi["MemAvailable"]


def checkpoints(target: int) -> list[int]:
    """10, 30, 100, 300, 1000, 3000, ... up to target."""
    out, base = [], 10
    while True:
        for m in (1, 3):
            if base * m > target:
                return out
            out.append(base * m)
        base *= 10


def count_host_pids() -> int:
    return sum(1 for d in os.listdir("/proc") if d.isdigit())


class Sampler:
    def __init__(self, edge: edgeproc.EdgeProcess) -> None:
        self.edge = edge
        self.base = self.sample(0)
        self.rows: list[dict] = []

    def sample(self, n: int) -> dict:
        mi = edgeproc.meminfo_kb()
        return {"n": n, "t": time.monotonic(), "rss_kb": self.edge.rss_kb(),
                "used_kb": host_used_kb(mi), "mem": {k: mi.get(k, 0) for k in KERNEL_KEYS},
                "cg_bytes": self.edge.cgroup_memory_bytes(), "fds": self.edge.fds(),
                "threads": self.edge.threads(), "pids": count_host_pids()}

    def checkpoint(self, n: int, quiet: bool = False) -> dict:
        s = self.sample(n)
        self.rows.append(s)
        if not quiet:
            print(self.line(s), file=sys.stderr, flush=True)
        return s

    def line(self, s: dict) -> str:
        b = self.base
        n = s["n"]
        el = s["t"] - b["t"]
        per = (lambda d: f"{d / n:7.0f}") if n else (lambda d: f"{'-':>7}")
        return (f"{n:>6} {el:>7.1f} {s['rss_kb'] / 1024:>8.1f} "
                f"{per(s['rss_kb'] - b['rss_kb'])} "
                f"{(s['used_kb'] - b['used_kb']) / 1024:>9.0f} {per(s['used_kb'] - b['used_kb'])} "
                f"{(s['cg_bytes'] / 1024 / n) if n and s['cg_bytes'] >= 0 else float('nan'):>8.0f} "
                f"{s['fds']:>6} {s['threads']:>5} {s['pids']:>6}")

    @staticmethod
    def header() -> str:
        return (f"{'n':>6} {'time s':>7} {'edge MB':>8} {'kB/sb':>7} {'host MB':>9} "
                f"{'kB/sb':>7} {'cg kB/sb':>8} {'fds':>6} {'thr':>5} {'pids':>6}\n"
                f"{'':>6} {'':>7} {'(RSS)':>8} {'(edge)':>7} {'(+used)':>9} {'(host)':>7}")


async def scaling_point(client: AsyncDSecClient, args: DSecContainerRunArgs, ids: list[str],
                        edge: edgeproc.EdgeProcess | None, base_used: int, opts) -> dict:
    """With len(ids) sandboxes idling: single create/delete, exec `true` and GET latencies in
    random idle sandboxes, edge RSS and fds, host memory in use."""
    n = len(ids)
    await asyncio.sleep(opts.scaling_settle)
    mi = edgeproc.meminfo_kb()  # before the extra creates
    used = host_used_kb(mi)
    rss = edge.rss_kb() if edge else -1
    fds = edge.fds() if edge else -1
    create, delete, exe, get = [], [], [], []
    for _ in range(opts.scaling_creates):
        t = time.perf_counter()
        sb = await client.run_container(args)
        t1 = time.perf_counter()
        await sb.stop()
        create.append((t1 - t) * 1e3)
        delete.append((time.perf_counter() - t1) * 1e3)
    rng = random.Random(n)
    for _ in range(opts.scaling_execs):
        sb = client.sandbox(rng.choice(ids))
        t = time.perf_counter()
        r = await sb.exec(["true"])
        t1 = time.perf_counter()
        if r.exit_code != 0:
            raise DSecError("bench", f"{sb.id}: true exited {r.exit_code}", None)
        await client.get_sandbox(rng.choice(ids))
        exe.append((t1 - t) * 1e3)
        get.append((time.perf_counter() - t1) * 1e3)
    r2 = lambda v: round(v, 3)  # noqa: E731
    return {"workload": "scaling", "system": "dsec-edge", "live": n,
            "create_p50": r2(pct(create, 50)), "create_p99": r2(pct(create, 99)),
            "delete_p50": r2(pct(delete, 50)), "delete_p99": r2(pct(delete, 99)),
            "exec_p50": r2(pct(exe, 50)), "exec_p99": r2(pct(exe, 99)),
            "get_p50": r2(pct(get, 50)), "get_p99": r2(pct(get, 99)),
            "creates": len(create), "execs": len(exe),
            "edge_rss_kb": rss, "edge_fds": fds, "host_used_kb": used,
            "host_per_sandbox_kb": round((used - base_used) / n, 1) if n else None,
            "mem_available_kb": mi["MemAvailable"]}


def scaling_line(r: dict) -> str:
    return (f"  scaling at {r['live']:>6} live: create p50/p99 {r['create_p50']:.1f}/"
            f"{r['create_p99']:.1f} ms, delete {r['delete_p50']:.1f}/{r['delete_p99']:.1f}, "
            f"exec {r['exec_p50']:.2f}/{r['exec_p99']:.2f}, get {r['get_p50']:.2f}/"
            f"{r['get_p99']:.2f}; edge {r['edge_rss_kb'] / 1024:.1f} MB, {r['edge_fds']} fds; "
            f"host {r['host_per_sandbox_kb']} kB/sandbox")


async def run(opts, edge: edgeproc.EdgeProcess | None, url: str, token: str | None) -> dict:
    job = f"density-{os.getpid()}"
    res: dict = {"workload": "density", "system": "dsec-edge", "target": opts.target,
                 "target_mode": opts.target_mode,
                 "memory_mb": opts.memory_mb, "disk_mb": opts.disk_mb, "job": job}
    args = DSecContainerRunArgs(container_image="host", cpu_cores_limit=opts.cpu,
                                memory_limit_mb=opts.memory_mb, disk_limit_mb=opts.disk_mb,
                                pids_limit=opts.pids, ttl_running_stop=7200,
                                labels={"job": job})
    sampler = Sampler(edge) if edge else None
    ids: list[str] = []
    create_ms: list[float] = []
    async with AsyncDSecClient(url, token=token, max_connections=opts.parallel + 8,
                               timeout=900.0, retries=2) as client:
        if sampler:
            print(Sampler.header(), file=sys.stderr)
            sampler.checkpoint(0)
        # -- fill -------------------------------------------------------------
        t0 = time.monotonic()
        next_cp = opts.checkpoint
        failure: str | None = None
        lock = asyncio.Lock()
        # inflight: sandboxes asked for, not yet created; goal: fill up to this many (the next
        # scaling checkpoint, then the target)
        state = {"inflight": 0, "goal": opts.target, "mem_stop": None}
        mi0 = edgeproc.meminfo_kb()
        base_used = host_used_kb(mi0)
        bound_kb = (opts.max_host_mem_mb * 1024 if opts.max_host_mem_mb is not None
                    else mi0["MemTotal"] * 3 // 4)
        res.update(max_host_mem_mb=round(bound_kb / 1024),
                   host_used_start_mb=round(base_used / 1024))

        nofile = edge.nofile_limit() if edge else -1

        def fitting(want: int) -> int:
            """How many of `want` more sandboxes (besides those in flight) keep host memory in
            use under the bound (per sandbox: what the live ones cost so far, at least 2 MiB)
            and the edge's fds under its limit (~7 per sandbox, 200 spare). 0: stop there."""
            used = host_used_kb(edgeproc.meminfo_kb())
            n = len(ids)
            per = max(2048.0, (used - base_used) / n if n >= 10 else 0.0)
            fit = int((bound_kb - used) / per) - state["inflight"]
            if fit <= 0:
                state["mem_stop"] = (f"memory bound: host memory in use {used // 1024} MB, "
                                     f"{per / 1024:.1f} MB more per sandbox would pass "
                                     f"{bound_kb // 1024} MB")
                return 0
            if nofile > 0:
                fds = edge.fds()
                fd_fit = (nofile - 200 - fds) // 8 - state["inflight"]
                if fd_fit <= 0:
                    state["mem_stop"] = (f"the edge's fd limit: {fds} fds open, soft limit "
                                         f"{nofile} (--edge-nofile to raise it)")
                    return 0
                fit = min(fit, fd_fit)
            return min(want, fit)

        async def filler() -> None:
            nonlocal failure, next_cp
            while failure is None and state["mem_stop"] is None:
                async with lock:
                    want = min(opts.batch, state["goal"] - len(ids) - state["inflight"])
                    if want <= 0:
                        return
                    want = fitting(want)
                    if want <= 0:
                        return
                    state["inflight"] += want
                t = time.perf_counter()
                try:
                    if want == 1:
                        sbs = [await client.run_container(args)]
                    else:
                        sbs = await client.run_containers(args, want)
                except (DSecError, OSError) as e:
                    failure = failure or f"{type(e).__name__}: {e}"
                    return
                finally:
                    state["inflight"] -= want
                create_ms.append((time.perf_counter() - t) * 1e3)
                ids.extend(sb.id for sb in sbs)
                if sampler and len(ids) >= next_cp:
                    sampler.checkpoint(len(ids))
                    while next_cp <= len(ids):
                        next_cp += opts.checkpoint

        scaling: list[dict] = []
        paused = 0.0  # time spent measuring at checkpoints, not filling
        cps = checkpoints(opts.target) if opts.scaling_creates or opts.scaling_execs else []
        for goal in sorted(set(cps + [opts.target])):
            state["goal"] = goal
            await asyncio.gather(*(filler() for _ in range(opts.parallel)))
            full = not (failure or state["mem_stop"] or len(ids) < goal)
            # The checkpoints, and where the fill ended (the target or the memory bound).
            if cps and ids and not failure and (goal in cps or goal == opts.target or not full) \
                    and not (scaling and scaling[-1]["live"] == len(ids)):
                t = time.monotonic()
                try:
                    row = await scaling_point(client, args, ids, edge, base_used, opts)
                except (DSecError, OSError) as e:
                    failure = f"at the {goal} checkpoint: {type(e).__name__}: {e}"
                    break
                finally:
                    paused += time.monotonic() - t
                scaling.append(row)
                print(scaling_line(row), file=sys.stderr, flush=True)
                if opts.json:
                    print("JSON " + json.dumps(row), flush=True)
            if not full:
                break
        fill_s = time.monotonic() - t0 - paused
        res["stop_reason"] = failure and f"error: {failure}" or state["mem_stop"] or "target"
        if scaling:
            res["scaling"] = scaling
        res.update(reached=len(ids), fill_s=round(fill_s, 2), scaling_pause_s=round(paused, 2),
                   create_rate=round(len(ids) / fill_s, 1) if fill_s else 0,
                   batch=opts.batch, parallel=opts.parallel,
                   batch_ms_p50=pct(create_ms, 50), batch_ms_max=max(create_ms, default=0))
        if failure:
            res["failure"] = failure
            print(f"density_bench: creation failed at {len(ids)} sandboxes: {failure}",
                  file=sys.stderr)
            if edge:
                node = await client.node()
                res["node_at_failure"] = node
                print(f"  edge fds {edge.fds()}, threads {edge.threads()}, host pids "
                      f"{count_host_pids()}, MemAvailable "
                      f"{edgeproc.meminfo_kb()['MemAvailable'] // 1024} MB, "
                      f"node usage {node.get('usage')}\n{edge.log_tail(30)}", file=sys.stderr)
        # -- idle -------------------------------------------------------------
        if ids and sampler:
            await asyncio.sleep(opts.settle)
            s = sampler.checkpoint(len(ids))
            b = sampler.base
            n = len(ids)
            res.update(
                edge_rss_mb=round(s["rss_kb"] / 1024, 1),
                edge_rss_base_mb=round(b["rss_kb"] / 1024, 1),
                edge_kb_per_sb=round((s["rss_kb"] - b["rss_kb"]) / n, 1),
                host_kb_per_sb=round((s["used_kb"] - b["used_kb"]) / n, 1),
                host_used_delta_mb=round((s["used_kb"] - b["used_kb"]) / 1024, 1),
                cgroup_kb_per_sb=round(s["cg_bytes"] / 1024 / n, 1) if s["cg_bytes"] >= 0
                else None,
                kernel_kb_per_sb={k: round((s["mem"][k] - b["mem"][k]) / n, 1)
                                  for k in KERNEL_KEYS},
                edge_fds=s["fds"], edge_threads=s["threads"],
                host_pids_per_sb=round((s["pids"] - b["pids"]) / n, 2))
        # -- exec while idle ----------------------------------------------------
        if ids and opts.exec_samples > 0:
            lat: list[float] = []
            errs: list[str] = []
            rng = random.Random(1)
            left = {"n": opts.exec_samples}

            async def execer() -> None:
                while left["n"] > 0:
                    left["n"] -= 1
                    sb = client.sandbox(rng.choice(ids))
                    t = time.perf_counter()
                    try:
                        r = await sb.exec(["true"])
                        if r.exit_code != 0:
                            errs.append(f"{sb.id}: exit {r.exit_code}")
                    except (DSecError, OSError) as e:
                        errs.append(f"{sb.id}: {e}")
                        continue
                    lat.append((time.perf_counter() - t) * 1e3)

            t = time.monotonic()
            await asyncio.gather(*(execer() for _ in range(opts.exec_concurrency)))
            el = time.monotonic() - t
            res.update(exec_samples=len(lat), exec_concurrency=opts.exec_concurrency,
                       exec_p50=pct(lat, 50), exec_p90=pct(lat, 90), exec_p99=pct(lat, 99),
                       exec_max=max(lat, default=math.nan),
                       exec_rate=round(len(lat) / el, 1) if el else 0, exec_errors=len(errs),
                       exec_first_errors=errs[:3])
        # -- states, delete, check ---------------------------------------------
        records = await client.list_sandboxes(labels={"job": job}, page_size=500)
        states: dict[str, int] = {}
        for r in records:
            states[r.get("state", "?")] = states.get(r.get("state", "?"), 0) + 1
        res["states_before_delete"] = states
        bad = [r for r in records if r.get("state") != "running"][:3]
        if bad:
            res["not_running"] = [(r["id"], r.get("state"), r.get("reason")) for r in bad]
        t = time.monotonic()
        affected = await client.delete_job(job)
        res.update(deleted=affected, delete_s=round(time.monotonic() - t, 2))
        after = await client.node()
        res["sandboxes_after_delete"] = after.get("usage", {}).get("sandboxes")
        if sampler:
            await asyncio.sleep(1.0)
            s = sampler.checkpoint(0, quiet=True)
            res["edge_rss_after_delete_mb"] = round(s["rss_kb"] / 1024, 1)
            res["host_used_after_delete_mb"] = round((s["used_kb"] - sampler.base["used_kb"])
                                                     / 1024, 1)
    return res


def fmt(v, unit: str = "", nd: int = 1) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f"{v:,.{nd}f}{unit}" if isinstance(v, float) else f"{v:,}{unit}"


def report(r: dict) -> str:
    n = r.get("reached", 0)
    out = ["", f"Idle density (memory_mb={r['memory_mb']}, disk_mb={r['disk_mb']}, "
               f"target {r['target']})",
           f"  sandboxes created        {n:,} of {r['target']:,} in {r.get('fill_s', 0)} s "
           f"({r.get('create_rate', 0)}/s; batches of {r['batch']}, {r['parallel']} in flight)"]
    out.append(f"  stopped by               {r.get('stop_reason', '?')} (memory bound "
               f"{r.get('max_host_mem_mb', '?')} MB in use)")
    if "failure" in r:
        out.append(f"  FAILED                   {r['failure']}")
    if "edge_rss_mb" in r:
        k = r["kernel_kb_per_sb"]
        out += [f"  edge RSS                 {r['edge_rss_base_mb']} MB -> {r['edge_rss_mb']} MB"
                f"  = {r['edge_kb_per_sb']} kB per sandbox",
                f"  host memory in use       +{r['host_used_delta_mb']} MB"
                f"  = {r['host_kb_per_sb']} kB per sandbox (MemTotal - MemAvailable)",
                "    of which per sandbox   " + ", ".join(f"{key} {val}" for key, val in
                                                         k.items()) + " (kB)",
                f"  sandbox cgroup charge    {fmt(r.get('cgroup_kb_per_sb'))} kB per sandbox",
                f"  host processes           {r['host_pids_per_sb']} per sandbox; edge "
                f"{r['edge_fds']} fds (soft limit {r.get('edge_nofile', '?')}), "
                f"{r['edge_threads']} threads"]
    if "exec_p50" in r:
        out.append(f"  exec `true` while idle   p50 {fmt(r['exec_p50'])} ms, p90 "
                   f"{fmt(r['exec_p90'])} ms, p99 {fmt(r['exec_p99'])} ms, max "
                   f"{fmt(r['exec_max'])} ms ({r['exec_samples']} samples in random "
                   f"sandboxes, {r['exec_concurrency']} at a time; errors {r['exec_errors']})")
        for e in r.get("exec_first_errors", []):
            out.append(f"    error: {e}")
    if r.get("scaling"):
        out += ["  scaling (ms; single create/delete, exec `true` and GET in random idle "
                "sandboxes)",
                f"  {'live':>7} {'create p50':>10} {'p99':>7} {'delete p50':>10} {'p99':>7} "
                f"{'exec p50':>8} {'p99':>7} {'get p50':>7} {'p99':>6} {'edge MB':>8} "
                f"{'fds':>6} {'host kB/sb':>10}"]
        for x in r["scaling"]:
            out.append(f"  {x['live']:>7,} {x['create_p50']:>10.1f} {x['create_p99']:>7.1f} "
                       f"{x['delete_p50']:>10.1f} {x['delete_p99']:>7.1f} {x['exec_p50']:>8.2f} "
                       f"{x['exec_p99']:>7.2f} {x['get_p50']:>7.2f} {x['get_p99']:>6.2f} "
                       f"{x['edge_rss_kb'] / 1024:>8.1f} {x['edge_fds']:>6} "
                       f"{fmt(x['host_per_sandbox_kb']):>10}")
    out.append(f"  states before delete     {r.get('states_before_delete')}")
    for x in r.get("not_running", []):
        out.append(f"    not running: {x}")
    if "deleted" in r:
        out.append(f"  delete all (job)         {r['deleted']:,} in {r['delete_s']} s; "
                   f"sandboxes left {r.get('sandboxes_after_delete')}")
    if "edge_rss_after_delete_mb" in r:
        out.append(f"  after delete             edge RSS {r['edge_rss_after_delete_mb']} MB, "
                   f"host memory in use {r['host_used_after_delete_mb']:+} MB vs. start")
    if "cleanup" in r:
        out.append("  edge shutdown            " + (
            f"SIGTERM -> stopped in {r['stop_s']} s; nothing left on the host"
            if not r["cleanup"] else "LEFT BEHIND: " + "; ".join(r["cleanup"])))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="1000",
                    help="idle sandboxes (default 1000), or `max`: fill until the memory bound")
    ap.add_argument("--max-host-mem-mb", type=int, default=None,
                    help="stop before host memory in use (MemTotal - MemAvailable) would pass "
                    "this (default: 75%% of MemTotal, i.e. keep 25%% available)")
    ap.add_argument("--max-count", type=int, default=65536,
                    help="with --target max: stop at this many at most (default 65536)")
    ap.add_argument("--scaling-creates", type=int, default=30,
                    help="single creates (each deleted after) per scaling checkpoint")
    ap.add_argument("--scaling-execs", type=int, default=50,
                    help="exec `true` samples per scaling checkpoint (0 and 0: no checkpoints)")
    ap.add_argument("--scaling-settle", type=float, default=0.5,
                    help="idle seconds before each checkpoint's measurements")
    ap.add_argument("--batch", type=int, default=50, help="`count` per create (default 50)")
    ap.add_argument("--parallel", type=int, default=2, help="create requests in flight")
    ap.add_argument("--memory-mb", type=int, default=32)
    ap.add_argument("--disk-mb", type=int, default=16)
    ap.add_argument("--pids", type=int, default=32)
    ap.add_argument("--cpu", type=float, default=1.0)
    ap.add_argument("--checkpoint", type=int, default=100, help="sample memory every N")
    ap.add_argument("--settle", type=float, default=5.0, help="idle seconds before measuring")
    ap.add_argument("--exec-samples", type=int, default=500)
    ap.add_argument("--exec-concurrency", type=int, default=1)
    ap.add_argument("--edge-nofile", type=int, default=None,
                    help="start the edge with this soft RLIMIT_NOFILE (default: inherit ours;"
                    " the edge raises only the hard limit itself)")
    ap.add_argument("--json", action="store_true", help="also print a JSON line (bench/report.py)")
    ap.add_argument("--url", default=None,
                    help="use a running edge (no memory figures: they need the edge's pid)")
    ap.add_argument("--token", default=os.environ.get("DSEC_TOKEN"))
    ap.add_argument("--edge", default=None, help="dsec-edge binary to start")
    opts = ap.parse_args()
    opts.target_mode = "max" if opts.target == "max" else "count"
    try:
        opts.target = opts.max_count if opts.target == "max" else int(opts.target)
    except ValueError:
        ap.error("--target must be a number or `max`")
    if opts.target < 1 or opts.batch < 1 or opts.parallel < 1:
        ap.error("--target, --batch and --parallel must be at least 1")

    edgeproc.raise_on_sigterm()
    edge = None
    res: dict = {}
    rc = 0
    try:
        if opts.url:
            url, token = opts.url, opts.token
        else:
            node_mb = edgeproc.meminfo_kb()["MemTotal"] // 1024
            need = opts.target * opts.memory_mb / max(node_mb, 1)
            edge = edgeproc.EdgeProcess(
                opts.edge, prefix="dsec-density-",
                max_sandboxes=max(4096, opts.target + opts.batch * opts.parallel),
                memory_overcommit=min(1000.0, max(8.0, math.ceil(need * 1.25))),
                nofile=opts.edge_nofile or (max(opts.target * 8 + 1024, 65536)
                                            if opts.target_mode == "max" else None))
            edge.start()
            url, token = edge.url, edge.token
            limit = edge.nofile_limit()
            # An idle sandbox holds ~7 edge fds (cgroup dir, owner.lock, pidfd, netns, agent
            # socket, sockstat, sockstat6); each pooled idle netns 3 (up to 256 of them).
            if 0 < limit < opts.target * 7 + 200:
                print(f"density_bench: warning: the edge's soft RLIMIT_NOFILE is {limit}; at ~7 "
                      f"fds per idle sandbox it runs out near {(limit - 200) // 7} sandboxes "
                      "(--edge-nofile N to raise it)", file=sys.stderr)
        res = asyncio.run(run(opts, edge, url, token))
        if edge:
            res["edge_nofile"] = edge.nofile_limit()
    except KeyboardInterrupt:
        print("\ndensity_bench: interrupted", file=sys.stderr)
        rc = 130
    except (DSecError, edgeproc.EdgeError, OSError) as e:
        print(f"density_bench: {e}", file=sys.stderr)
        rc = 1
    finally:
        if edge is not None:
            left = edge.stop()  # before any print: a closed stdout must not skip it
            if res:
                res["cleanup"] = left
                res["stop_s"] = round(edge.stop_seconds, 2)
            if left:
                print("density_bench: edge LEFT BEHIND:\n" + "\n".join("  " + x for x in left),
                      file=sys.stderr)
                rc = rc or 1
    if res:
        print(report(res))
        if opts.json:
            print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                        for k, v in res.items()
                                        if k not in ("node_at_failure", "scaling")}),
                  flush=True)
        if "failure" in res or res.get("exec_errors") or res.get("not_running") or \
                res.get("sandboxes_after_delete"):
            rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
