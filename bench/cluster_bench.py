#!/usr/bin/env python3
"""Cluster benchmark (issue 36): create -> exec `true` -> delete through 2 dsec-apiservers over
3 dsec-edges, against the same edges driven directly, side by side in one run.

It starts a local cluster (tests/cluster/cluster_harness.py: a real etcd, 3 edges, 2
apiservers on 127.0.0.1), then for each concurrency level runs rounds of the two modes
interleaved (direct first):

  direct     N clients (asyncio tasks, the Python SDK's AsyncDSecClient, keep-alive), client k
             on edge k mod 3 with the node token
  apiserver  the same clients, client k on apiserver k mod 2 with the cluster token
  probed     the same, but every create carries a request id the client chose (as a trainer
             that resumes would), so the apiserver first asks the other candidate nodes whether
             an earlier attempt reached them (the SDK's own ids skip that on a first attempt)
  quota      `apiserver` with a project member's token under roomy limits on every dimension
             (sandboxes, memory_mb, cpu, creates_per_s) at its project's and its token's levels:
             every create is admitted from a quota hold (issue 37); the other modes' project
             (default) has no limits, so `apiserver` is the same path without quotas

and reports cycles/s, the cycle's and each call's p50/p99, the apiservers' CPU (user+system,
from /proc) per cycle, and etcd's revision growth per create (every write to etcd is one
revision: the edges' load updates count in both modes; the apiserver adds none).

    sudo python3 bench/cluster_bench.py [--concurrency 1,8] [--cycles 200] [--rounds 2]
                                        [--modes direct,apiserver,probed,quota]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import tempfile
import time
import urllib.request
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "sdk" / "python"))
import cluster_harness  # noqa: E402
from libdsec import AsyncDSecClient, DSecContainerRunArgs  # noqa: E402


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def etcd_revision(url):
    req = urllib.request.Request(url + "/v3/kv/range", data=json.dumps(
        {"key": "AA==", "limit": "1"}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(json.load(r)["header"]["revision"])


async def run_level(urls, token, clients, cycles, memory_mb, own_ids=False):
    per = max(1, cycles // clients)
    sdks = [AsyncDSecClient(urls[k % len(urls)], token=token) for k in range(clients)]
    lat = {"cycle": [], "create": [], "exec": [], "delete": []}
    args = DSecContainerRunArgs(memory_mb=memory_mb, labels={"bench": "cluster"})

    async def one(c):
        for _ in range(per):
            t0 = time.perf_counter()
            sb = await c.run_container(args, request_id=uuid.uuid4().hex if own_ids else None)
            t1 = time.perf_counter()
            r = await sb.exec(["true"])
            assert r.exit_code == 0
            t2 = time.perf_counter()
            await c.delete_sandbox(sb.id)
            t3 = time.perf_counter()
            lat["create"].append((t1 - t0) * 1e3)
            lat["exec"].append((t2 - t1) * 1e3)
            lat["delete"].append((t3 - t2) * 1e3)
            lat["cycle"].append((t3 - t0) * 1e3)

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in sdks))
    wall = time.perf_counter() - t
    for c in sdks:
        await c.close()
    return lat, per * clients, wall


def setup_quota(c):
    """A project with a member token, and roomy limits on every dimension at its project and
    token levels (not the org's: that would put every mode under quotas): the member's creates
    are admitted from quota holds."""
    def call(method, path, body, token=None):
        req = urllib.request.Request(c.urls[0] + path, data=json.dumps(body).encode(),
                                     method=method, headers={
                                         "Authorization": f"Bearer {token or c.token}",
                                         "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    call("POST", "/v1/projects", {"name": "bench"})
    member = call("POST", "/v1/projects/bench/tokens", {"name": "member"})["token"]
    roomy = {"sandboxes": 100000, "memory_mb": 1 << 30, "cpu": 100000, "creates_per_s": 100000}
    for path in ("/v1/projects/bench/quota", "/v1/projects/bench/tokens/member/quota"):
        call("PATCH", path, roomy)
    time.sleep(1)  # (both apiservers' views)
    return member


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--cycles", type=int, default=200, help="cycles per level, mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--memory-mb", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--modes", default="direct,apiserver,probed,quota",
                    help="of direct, apiserver, probed, quota (direct is the baseline)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("cluster_bench: needs root (it starts edges)", file=sys.stderr)
        return 1
    reason = cluster_harness.why_not_runnable()
    if reason:
        print(f"cluster_bench: {reason}", file=sys.stderr)
        return 1
    modes = [m for m in ("direct", "apiserver", "probed", "quota") if m in a.modes.split(",")]
    c = cluster_harness.Cluster.start(tempfile.mkdtemp(prefix="dsec-cb-"))
    rows = []
    try:
        edge_urls = [c.edge_url(n) for n in sorted(c.edges)]
        member = setup_quota(c) if "quota" in modes else None
        api_pids = [p.pid for p in c.apiserver_procs]
        for n in [int(x) for x in a.concurrency.split(",")]:
            acc = {m: {"lat": {k: [] for k in ("cycle", "create", "exec", "delete")},
                       "cycles": 0, "wall": 0.0, "cpu": 0.0, "revs": 0}
                   for m in modes}
            for _ in range(a.rounds):
                for mode in modes:
                    urls, token = {"direct": (edge_urls, c.node_token),
                                   "quota": (c.urls, member)}.get(mode, (c.urls, c.token))
                    own = mode == "probed"
                    asyncio.run(run_level(urls, token, n, min(20, a.cycles), a.memory_mb, own))
                    cpu0 = sum(cpu_s(p) for p in api_pids)
                    rev0 = etcd_revision(c.etcd_url)
                    lat, cycles, wall = asyncio.run(run_level(urls, token, n, a.cycles, a.memory_mb,
                                                              own))
                    s = acc[mode]
                    s["cpu"] += sum(cpu_s(p) for p in api_pids) - cpu0
                    s["revs"] += etcd_revision(c.etcd_url) - rev0
                    for k in lat:
                        s["lat"][k] += lat[k]
                    s["cycles"] += cycles
                    s["wall"] += wall
            for mode, s in acc.items():
                row = {"mode": mode, "clients": n, "cycles": s["cycles"],
                       "cycles_per_s": s["cycles"] / s["wall"],
                       "api_cpu_ms_per_cycle": s["cpu"] * 1e3 / s["cycles"],
                       "etcd_revs_per_create": s["revs"] / s["cycles"],
                       "etcd_revs_per_s": s["revs"] / s["wall"]}
                for k, xs in s["lat"].items():
                    row[f"{k}_p50"] = pct(xs, 50)
                    row[f"{k}_p99"] = pct(xs, 99)
                rows.append(row)
    finally:
        residue = c.shutdown_and_check()
        c.cleanup()
    print("| mode | clients | cycles | cycles/s | cycle p50 / p99 ms | create p50 | exec p50 | "
          "delete p50 | apiserver CPU ms/cycle | etcd revisions/create (/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['clients']} | {r['cycles']} | {r['cycles_per_s']:.1f} | "
              f"{r['cycle_p50']:.2f} / {r['cycle_p99']:.2f} | {r['create_p50']:.2f} | "
              f"{r['exec_p50']:.2f} | {r['delete_p50']:.2f} | {r['api_cpu_ms_per_cycle']:.3f} | "
              f"{r['etcd_revs_per_create']:.3f} ({r['etcd_revs_per_s']:.1f}) |")
    by = {(r["mode"], r["clients"]): r for r in rows}
    for n in sorted({r["clients"] for r in rows}):
        d = by.get(("direct", n))
        for mode in modes:
            if mode == "direct" or d is None:
                continue
            p = by[(mode, n)]
            print(f"{n} clients, {mode}: throughput {p['cycles_per_s'] / d['cycles_per_s']:.2f}x "
                  f"direct; added at p50: cycle {p['cycle_p50'] - d['cycle_p50']:+.2f} ms, create "
                  f"{p['create_p50'] - d['create_p50']:+.2f}, exec "
                  f"{p['exec_p50'] - d['exec_p50']:+.2f}, delete "
                  f"{p['delete_p50'] - d['delete_p50']:+.2f}")
    if a.json:
        for r in rows:
            print("JSON " + json.dumps(r))
    if residue:
        print(f"cluster_bench: residue: {residue}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
