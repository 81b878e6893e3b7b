#!/usr/bin/env python3
"""API lifecycle benchmark: create -> exec `true` -> delete through dsec-edge's REST API.

Clients are asyncio tasks sharing one AsyncDSecClient (the Python SDK, keep-alive connections,
one per client), each running cycles back to back: POST /v1/sandboxes (returns when the sandbox
is running), POST .../exec {"cmd": ["true"]}, DELETE. For each concurrency level it reports
the cycle latency p50/p90/p99, each call's p50/p99, and cycles/s. The client's own CPU use is
reported too (a client near 100% of a core would be the bottleneck, not the edge).

With no --url it starts its own edge (examples/edgeproc.py: temp state dir, token, socket and
a free loopback port) and checks after SIGTERM that nothing was left behind.

    sudo python3 bench/api_bench.py [--concurrency 1,8,64] [--cycles 300] [--json]

--pool-burst N (default 64, 0 = off) then runs, for 1 and 8 clients, a burst of N cycles whose
sandboxes come from a warm container pool (PUT /v1/pools/NAME {"kind": "container",
"min_idle": N}, filled before each burst; POST /v1/sandboxes {"pool": NAME}); the pool refills
in the background during the burst, as it would in use. Those rows are system "dsec-edge-pool".

--json adds one `JSON {...}` line per level for bench/report.py, with "cdf": the cycle latency's
p0..p100 percentiles (101 values, ms) for bench/plots.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import edgeproc  # noqa: E402

edgeproc.use_sdk()
from libdsec import AsyncDSecClient, DSecContainerRunArgs, DSecError  # noqa: E402

pct = edgeproc.percentile


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class PoolArgs(DSecContainerRunArgs):
    """POST /v1/sandboxes {"pool": NAME}: the pool fixes image and limits."""

    def __init__(self, pool: str, labels: dict[str, str]) -> None:
        super().__init__(labels=labels, ttl_running_stop=600)
        self.pool = pool

    def to_body(self) -> dict:
        return {"pool": self.pool, "labels": dict(self.labels or {}),
                "ttl_s": self.ttl_running_stop}


async def level(client: AsyncDSecClient, conc: int, cycles: int, warmup: int, job: str,
                args: DSecContainerRunArgs, system: str = "dsec-edge") -> dict:
    lat: dict[str, list[float]] = {"cycle": [], "create": [], "exec": [], "delete": []}
    errors: list[str] = []
    left = {"n": cycles, "warm": warmup}

    async def one(record: bool) -> None:
        t0 = time.perf_counter()
        sb = await client.run_container(args)
        t1 = time.perf_counter()
        try:
            r = await sb.exec(["true"])
        finally:
            t2 = time.perf_counter()
            await sb.stop()
        t3 = time.perf_counter()
        if r.exit_code != 0:
            raise DSecError("bench", f"true exited {r.exit_code}: {r.stderr[:200]}", None)
        if record:
            lat["create"].append((t1 - t0) * 1e3)
            lat["exec"].append((t2 - t1) * 1e3)
            lat["delete"].append((t3 - t2) * 1e3)
            lat["cycle"].append((t3 - t0) * 1e3)

    async def worker(warm: bool) -> None:
        key = "warm" if warm else "n"
        while left[key] > 0:
            left[key] -= 1
            try:
                await one(not warm)
            except (DSecError, OSError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                if len(errors) > 20:
                    raise

    await asyncio.gather(*(worker(True) for _ in range(min(conc, max(warmup, 1)))))
    c0, w0 = cpu_seconds(), time.monotonic()
    await asyncio.gather(*(worker(False) for _ in range(conc)))
    wall = time.monotonic() - w0
    cpu = cpu_seconds() - c0
    n = len(lat["cycle"])
    row = {"workload": "api", "system": system, "concurrency": conc, "cycles": n,
           "errors": len(errors), "wall_s": round(wall, 3), "rate": n / wall if wall else 0.0,
           "client_cpu": round(cpu / wall, 3) if wall else 0.0,
           "p50": pct(lat["cycle"], 50), "p90": pct(lat["cycle"], 90),
           "p99": pct(lat["cycle"], 99), "max": max(lat["cycle"], default=0.0),
           "cdf": [round(pct(lat["cycle"], p), 3) for p in range(101)] if n else []}
    for op in ("create", "exec", "delete"):
        for p in (50, 90, 99):
            row[f"{op}_p{p}"] = pct(lat[op], p)
    row["first_errors"] = errors[:3]
    return row


async def run(opts, url: str, token: str | None) -> list[dict]:
    job = f"api-bench-{os.getpid()}"
    args = DSecContainerRunArgs(container_image="host", cpu_cores_limit=1.0,
                                memory_limit_mb=opts.memory_mb, disk_limit_mb=opts.disk_mb,
                                pids_limit=64, ttl_running_stop=600, labels={"job": job})
    rows = []
    async with AsyncDSecClient(url, token=token, max_connections=max(opts.concurrency) + 4,
                               timeout=300.0) as client:
        for conc in opts.concurrency:
            cycles = max(opts.cycles, conc * opts.min_per_client)
            print(f"api_bench: {conc} client(s), {cycles} cycles ...", file=sys.stderr)
            row = await level(client, conc, cycles, opts.warmup, job, args)
            rows.append(row)
            if opts.json:
                print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                            for k, v in row.items()}), flush=True)
        if opts.pool_burst > 0:
            rows += await pool_bursts(client, opts, job)
        left = await client.list_sandboxes(labels={"job": job})
        if left:
            raise SystemExit(f"api_bench: {len(left)} sandboxes left after the run")
    return rows


async def pool_bursts(client: AsyncDSecClient, opts, job: str) -> list[dict]:
    name, n = f"api-bench-{os.getpid()}", opts.pool_burst
    await client.put_pool(name, kind="container", image="host", min_idle=n, max=n + 8,
                          memory_mb=opts.memory_mb, disk_mb=opts.disk_mb)
    rows = []
    try:
        for conc in (1, 8):
            deadline = time.monotonic() + 120
            while (await client.get_pool(name)).get("workers", {}).get("idle", 0) < n:
                if time.monotonic() > deadline:
                    raise DSecError("bench", f"pool {name} did not fill to {n} in 120 s", None)
                await asyncio.sleep(0.05)
            print(f"api_bench: {conc} client(s), a burst of {n} cycles from a warm pool ...",
                  file=sys.stderr)
            row = await level(client, conc, n, 0, job, PoolArgs(name, {"job": job}),
                              system="dsec-edge-pool")
            row["burst"] = n
            rows.append(row)
            if opts.json:
                print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                            for k, v in row.items()}), flush=True)
    finally:
        await client.delete_pool(name)
    return rows


def table(rows: list[dict]) -> str:
    out = ["", "API create -> exec `true` -> delete (ms; rate = cycles/s)",
           f"{'system':>14} {'clients':>7} {'cycles':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'rate':>7}  "
           f"{'create p50/p99':>15} {'exec p50/p99':>15} {'delete p50/p99':>15} "
           f"{'client cpu':>10} {'errors':>6}"]
    for r in rows:
        def pair(op):
            return f"{r[op + '_p50']:.1f}/{r[op + '_p99']:.1f}"
        out.append(f"{r['system']:>14} {r['concurrency']:>7} {r['cycles']:>6} {r['p50']:>7.1f} {r['p90']:>7.1f} "
                   f"{r['p99']:>7.1f} {r['rate']:>7.1f}  {pair('create'):>15} "
                   f"{pair('exec'):>15} {pair('delete'):>15} {r['client_cpu'] * 100:>9.0f}% "
                   f"{r['errors']:>6}")
        for e in r["first_errors"]:
            out.append(f"        error: {e}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8,64",
                    help="comma-separated client counts (default 1,8,64)")
    ap.add_argument("--cycles", type=int, default=300, help="cycles per level (default 300)")
    ap.add_argument("--min-per-client", type=int, default=5,
                    help="at least this many cycles per client (default 5)")
    ap.add_argument("--warmup", type=int, default=10, help="unrecorded cycles per level")
    ap.add_argument("--pool-burst", type=int, default=64,
                    help="cycles per warm-pool burst at 1 and 8 clients (0 = none)")
    ap.add_argument("--memory-mb", type=int, default=128)
    ap.add_argument("--disk-mb", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="also print JSON lines (bench/report.py)")
    ap.add_argument("--url", default=None, help="use a running edge instead of starting one")
    ap.add_argument("--token", default=os.environ.get("DSEC_TOKEN"))
    ap.add_argument("--edge", default=None, help="dsec-edge binary to start (default: $DSEC_EDGE"
                    " or build/release's)")
    opts = ap.parse_args()
    opts.concurrency = [int(x) for x in opts.concurrency.split(",") if x.strip()]
    if not opts.concurrency or min(opts.concurrency) < 1 or opts.cycles < 1:
        ap.error("bad --concurrency or --cycles")

    edgeproc.raise_on_sigterm()
    edge = None
    rows: list[dict] = []
    rc = 0
    try:
        if opts.url:
            url, token = opts.url, opts.token
        else:
            edge = edgeproc.EdgeProcess(opts.edge, prefix="dsec-apibench-",
                                        max_sandboxes=max(4096, 2 * max(opts.concurrency)))
            edge.start()
            url, token = edge.url, edge.token
        rows = asyncio.run(run(opts, url, token))
    except KeyboardInterrupt:
        print("\napi_bench: interrupted", file=sys.stderr)
        rc = 130
    except (DSecError, edgeproc.EdgeError, OSError) as e:
        print(f"api_bench: {e}", file=sys.stderr)
        rc = 1
    finally:
        if edge is not None:
            left = edge.stop()
            if left:
                print("api_bench: edge LEFT BEHIND:\n" + "\n".join("  " + x for x in left),
                      file=sys.stderr)
                rc = rc or 1
    if rows:
        print(table(rows))
        if any(r["errors"] for r in rows):
            rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
