#!/usr/bin/env python3
"""MicroVM benchmark (issue 16): kind "microvm" against the container kind, through
dsec-edge's REST API, on a busybox image imported into a private edge.

 template the first create of the image: a cold boot of the guest kernel (the guest's init
          building the root from the image's EROFS block devices) saved as a template
 create   POST /v1/sandboxes {"kind": "microvm"} until it returns a running VM restored from
          that template (QEMU started, device state loaded, the agent's setup), serially, and
          with 2 and 8 at once (each create on its own thread); the container kind of the
          same image beside it
 exec     POST .../exec {"cmd": ["true"]} in one running VM and in one container: the agent
          round trip plus a process spawn in the guest (TCG) or the container; and GET
          .../files/stat?path=/, an agent round trip that starts no process
 memory   PSS of each idle VM's QEMU process (/proc/PID/smaps_rollup), after the serial creates
 delete   DELETE of a VM (QMP-less: SIGKILL by cgroup, reaping, removing its directory)
 standby  on a second edge with microvm_standby: 1, serial creates of one shape naming no
          pool: each takes the VM the node keeps ready for that shape (restored after the
          previous create); back to back (create, exec `true`, delete) and with the standby
          refilled between

    sudo python3 bench/microvm_bench.py [--creates 8] [--execs 200] [--json]
    sudo python3 bench/microvm_bench.py --density 200 [--density-memory-mb 64]

--density N instead fills the edge with N idle microVMs (4 creates in flight, all from the
template) and at 25, 50, 100, ... and N alive measures, while they idle: the QEMU processes'
PSS per VM (/proc/PID/smaps_rollup), host memory in use per VM (MemTotal - MemAvailable, from
before the first VM), the CPU all QEMU processes burn while idle (utime+stime over 5 s, in
cores), and exec `true` latency in randomly chosen VMs; then deletes them all.

Leaves nothing behind (the edge's
residue is checked after SIGTERM); exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import io
import json
import os
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(REPO, "examples"))
import edge_harness  # noqa: E402
import edgeproc  # noqa: E402

pct = edgeproc.percentile

BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "true", "cat", "echo", "sleep", "ls", "dd"]
JSON_OUT = False


def emit(rec: dict) -> None:
    rec = {"workload": "microvm", **rec}
    if JSON_OUT:
        print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in rec.items()}), flush=True)


def busybox_tar(applets: list[str] = APPLETS) -> bytes:
    """A root filesystem of busybox and links to `applets` (an image for microVMs)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(BUSYBOX, arcname="bin/busybox")
        for a in applets:
            ti = tarfile.TarInfo("bin/" + a)
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(ti)
    return buf.getvalue()


def qemu_pid(edge: edge_harness.Edge, sid: str) -> int | None:
    for d in edge.sandbox_cgroup_dirs(sid):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        if pids:
            return pids[0]
    return None


def pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


class Api:
    def __init__(self, edge: edge_harness.Edge) -> None:
        self.edge = edge

    def client(self) -> edge_harness.Client:
        return self.edge.client(validate=False, timeout=600)

    def create(self, kind: str) -> tuple[str, float]:
        t0 = time.perf_counter()
        r = self.client().post("/v1/sandboxes", {"kind": kind, "image": "bench-vm:1",
                                                 "memory_mb": 128, "disk_mb": 32})
        ms = (time.perf_counter() - t0) * 1e3
        if r.status != 201:
            raise RuntimeError(f"create {kind}: {r.status} {r.body[:400]!r}")
        return r.json["id"], ms

    def delete(self, sid: str) -> float:
        t0 = time.perf_counter()
        r = self.client().delete(f"/v1/sandboxes/{sid}")
        if r.status != 204:
            raise RuntimeError(f"delete {sid}: {r.status}")
        return (time.perf_counter() - t0) * 1e3


def row(name: str, xs: list[float], unit: str = "ms") -> str:
    return (f"| {name} | {len(xs)} | {pct(xs, 50):.1f} | {pct(xs, 90):.1f} | {pct(xs, 99):.1f} "
            f"| {unit} |")


def mem_used_kb() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            info[k] = int(v.split()[0])
    return info["MemTotal"] - info["MemAvailable"]


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0


def density(edge: edge_harness.Edge, api: "Api", n: int, memory_mb: int, execs: int) -> list[str]:
    import random
    c = api.client()
    spec = {"kind": "microvm", "image": "bench-vm:1", "memory_mb": memory_mb, "disk_mb": 16}
    first = c.post("/v1/sandboxes", spec)  # the template, made before the baseline
    if first.status != 201:
        raise RuntimeError(f"create: {first.status} {first.body[:300]!r}")
    api.delete(first.json["id"])
    time.sleep(2)
    base = mem_used_kb()
    ids: list[str] = []
    lines = [f"{n} idle microVMs, {memory_mb} MiB guest RAM + 16 MiB disk each, 4 creates in "
             "flight", "",
             "| alive | QEMU PSS MiB/VM (p50 / max) | host memory in use MiB/VM | idle CPU "
             "(cores, all VMs) | exec true p50 / p99 ms | create p50 ms |",
             "|---:|---:|---:|---:|---:|---:|"]
    created_ms: list[float] = []

    def make(_):
        t0 = time.perf_counter()
        r = api.client().post("/v1/sandboxes", spec)
        if r.status != 201:
            raise RuntimeError(f"create #{len(ids)}: {r.status} {r.body[:300]!r}")
        return r.json["id"], (time.perf_counter() - t0) * 1e3

    marks = sorted({m for m in (25, 50, 100, 150, 200, 300, 400) if m < n} | {n})
    try:
        with cf.ThreadPoolExecutor(4) as pool:
            for mark in marks:
                for sid, ms in pool.map(make, range(mark - len(ids))):
                    ids.append(sid)
                    created_ms.append(ms)
                time.sleep(5)  # settle
                pids = [p for p in (qemu_pid(edge, s) for s in ids) if p]
                pss = [pss_kb(p) / 1024 for p in pids]
                used = (mem_used_kb() - base) / 1024 / len(ids)
                hz = os.sysconf("SC_CLK_TCK")
                t0 = {p: cpu_ticks(p) for p in pids}
                time.sleep(5)
                idle = sum(cpu_ticks(p) - t0[p] for p in pids) / hz / 5
                lat = []
                for _ in range(execs):
                    sid = random.choice(ids)
                    t = time.perf_counter()
                    x = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, expect=200).json
                    lat.append((time.perf_counter() - t) * 1e3)
                    assert x["exit_code"] == 0, x
                lines.append(f"| {len(ids)} | {pct(pss, 50):.1f} / {max(pss):.1f} | {used:.1f} | "
                             f"{idle:.2f} | {pct(lat, 50):.1f} / {pct(lat, 99):.1f} | "
                             f"{pct(created_ms, 50):.0f} |")
                emit({"case": "density", "alive": len(ids), "pss_mib_p50": pct(pss, 50),
                      "host_mib_per_vm": used, "idle_cores": idle,
                      "exec_p50": pct(lat, 50), "exec_p99": pct(lat, 99)})
                print(lines[-1], flush=True)
    finally:
        with cf.ThreadPoolExecutor(4) as pool:
            list(pool.map(api.delete, ids))
    return lines


def standby_rows(opts, creates: int) -> dict[str, list[float]]:
    """Creates naming no pool on an edge that keeps a standby VM per shape (microvm_standby)."""
    edge = edge_harness.Edge.start(binary=opts.edge, prefix="dsec-vmbench-sb-",
                                   config={"fncall_pools": False, "microvm_standby": 1})
    res: dict[str, list[float]] = {}
    try:
        api = Api(edge)
        c = api.client()
        c.post("/v1/images/import?name=bench-vm:1&format=rootfs", busybox_tar(),
               headers={"Content-Type": "application/octet-stream"}, expect=201)
        sid, _ = api.create("microvm")  # the template, and the shape's standby pool
        api.delete(sid)

        def standby() -> dict:
            return [p for p in c.get("/v1/pools", expect=200).json["pools"]
                    if p["name"].startswith("standby-")][0]

        def standby_idle() -> bool:
            return standby()["workers"]["idle"] >= 1

        for how in ("the standby refilled between", "back to back: create, exec true, delete"):
            lat, first, taken = [], [], -standby()["taken"]
            for _ in range(creates):
                if how.startswith("the standby"):
                    deadline = time.monotonic() + 120
                    while not standby_idle():
                        if time.monotonic() > deadline:
                            raise RuntimeError("the standby VM was not made in 120 s")
                        time.sleep(0.05)
                t0 = time.perf_counter()
                r = api.client().post("/v1/sandboxes", {"kind": "microvm", "image": "bench-vm:1",
                                                        "memory_mb": 128, "disk_mb": 32})
                lat.append((time.perf_counter() - t0) * 1e3)
                if r.status != 201:
                    raise RuntimeError(f"create: {r.status} {r.body[:300]!r}")
                t0 = time.perf_counter()
                x = c.post(f"/v1/sandboxes/{r.json['id']}/exec", {"cmd": ["true"]},
                           expect=200).json
                first.append((time.perf_counter() - t0) * 1e3)
                assert x["exit_code"] == 0, x
                api.delete(r.json["id"])
            taken += standby()["taken"]
            res[f"create microvm naming no pool, node standby on ({how}; {taken} of "
                f"{creates} took the standby)"] = lat
            res[f"  first exec true in it ({how})"] = first
    finally:
        edge.stop()
        left = edge.residue()
        edge.cleanup()
        if left:
            raise RuntimeError(f"the standby edge left behind: {left}")
    return res


def main() -> int:
    global JSON_OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=8)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    ap.add_argument("--density", type=int, default=0, help="fill with N idle VMs instead")
    ap.add_argument("--density-memory-mb", type=int, default=64)
    ap.add_argument("--phases", action="store_true",
                    help="run the edge at log level debug and print where each microVM start's "
                         "time went (its 'started in' lines)")
    opts = ap.parse_args()
    JSON_OUT = opts.json
    if opts.edge:
        os.environ["DSEC_EDGE_BIN"] = opts.edge
    # The template rows measure restores: no standby VMs here (standby_rows has its own edge).
    config = {"fncall_pools": False, "microvm_standby": 0}
    if opts.phases:
        config["log_level"] = "debug"
    if opts.density:
        config["max_sandboxes"] = opts.density + 16
    edge = edge_harness.Edge.start(binary=opts.edge, prefix="dsec-vmbench-", config=config)
    ok = True
    try:
        api = Api(edge)
        c = api.client()
        vm = c.get("/v1/node", expect=200).json["features"].get("microvm", {})
        if not vm.get("available"):
            print(f"microvm_bench: skipped: no microVMs on this edge: {vm.get('reason')}")
            return 0
        c.post("/v1/images/import?name=bench-vm:1&format=rootfs", busybox_tar(),
               headers={"Content-Type": "application/octet-stream"}, expect=201)
        if opts.density:
            print(f"accelerator {vm['accel']}, guest kernel {vm['kernel']}")
            print("\n".join(density(edge, api, opts.density, opts.density_memory_mb, 50)))
        else:
            lines = [f"accelerator {vm['accel']}, guest kernel {vm['kernel']}; 128 MiB + 32 MiB "
                     "disk per sandbox", "",
                     "| what | n | p50 | p90 | p99 | unit |", "|---|---|---|---|---|---|"]
            res: dict[str, list[float]] = {}
            sid, ms = api.create("microvm")  # makes the template
            res["first create (cold boot, template saved)"] = [ms]
            api.delete(sid)
            for kind in ("microvm", "container"):
                ids, lat = [], []
                firsts = []
                for _ in range(opts.creates):
                    sid, ms = api.create(kind)
                    ids.append(sid)
                    lat.append(ms)
                    t0 = time.perf_counter()
                    x = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, expect=200).json
                    firsts.append((time.perf_counter() - t0) * 1e3)
                    assert x["exit_code"] == 0, x
                how = ", from the template" if kind == "microvm" else ""
                res[f"create {kind} (serial{how})"] = lat
                res[f"first exec true in a new {kind}"] = firsts
                execs = []
                for _ in range(opts.execs):
                    t0 = time.perf_counter()
                    x = c.post(f"/v1/sandboxes/{ids[0]}/exec", {"cmd": ["true"]}, expect=200).json
                    execs.append((time.perf_counter() - t0) * 1e3)
                    assert x["exit_code"] == 0, x
                res[f"exec true in a {kind}"] = execs
                stats = []  # an agent round trip with no process: stat of /
                for _ in range(opts.execs):
                    t0 = time.perf_counter()
                    c.get(f"/v1/sandboxes/{ids[0]}/files/stat?path=/", expect=200)
                    stats.append((time.perf_counter() - t0) * 1e3)
                res[f"agent round trip (files/stat /) in a {kind}"] = stats
                if kind == "microvm":
                    pss = [pss_kb(p) / 1024 for p in (qemu_pid(edge, s) for s in ids) if p]
                    res[f"QEMU PSS per idle VM ({len(pss)} alive)"] = pss
                res[f"delete {kind}"] = [api.delete(s) for s in ids]
            # A pool of ready microVMs (restored and set up ahead): a create naming the pool
            # takes one; each take waits for the pool to be refilled first (steady state).
            c.put("/v1/pools/bench-vmpool", {"kind": "microvm", "image": "bench-vm:1",
                                             "memory_mb": 128, "disk_mb": 32, "min_idle": 1,
                                             "max": opts.creates + 2}, expect=201)
            try:
                taken, lat, first = [], [], []
                for _ in range(opts.creates):
                    deadline = time.monotonic() + 120
                    while c.get("/v1/pools/bench-vmpool",
                                expect=200).json["workers"]["idle"] < 1:
                        if time.monotonic() > deadline:
                            raise RuntimeError("the microVM pool did not refill in 120 s")
                        time.sleep(0.05)
                    t0 = time.perf_counter()
                    sb = c.post("/v1/sandboxes", {"pool": "bench-vmpool"}, expect=201).json
                    lat.append((time.perf_counter() - t0) * 1e3)
                    taken.append(sb["id"])
                    t0 = time.perf_counter()
                    x = c.post(f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["true"]},
                               expect=200).json
                    first.append((time.perf_counter() - t0) * 1e3)
                    assert x["exit_code"] == 0, x
                res["create microvm from a pool of ready VMs (serial)"] = lat
                res["first exec true in a VM taken from the pool"] = first
                for sid in taken:
                    api.delete(sid)
            finally:
                c.delete("/v1/pools/bench-vmpool", expect=204)
            # Forks of a running VM holding 16 MiB of tmpfs data: its files only (a captured
            # layer, processes fresh) vs its whole machine (memory: true: saved, then restored).
            src, _ = api.create("microvm")
            try:
                c.post(f"/v1/sandboxes/{src}/exec", {"shell": "dd if=/dev/urandom "
                       "of=/tmp/data bs=1M count=16 2>/dev/null; sleep 1000 >/dev/null 2>&1 &"},
                       expect=200)
                for memory in (False, True):
                    lat, first, made = [], [], []
                    for _ in range(max(2, opts.creates // 2)):
                        t0 = time.perf_counter()
                        r = c.post(f"/v1/sandboxes/{src}/fork", {"memory": memory},
                                   expect=201).json
                        lat.append((time.perf_counter() - t0) * 1e3)
                        fid = r["sandboxes"][0]["id"]
                        made.append(fid)
                        t0 = time.perf_counter()
                        x = c.post(f"/v1/sandboxes/{fid}/exec", {"cmd": ["true"]},
                                   expect=200).json
                        first.append((time.perf_counter() - t0) * 1e3)
                        assert x["exit_code"] == 0, x
                    what = "its machine (memory: true)" if memory else "its files"
                    res[f"fork of a running microVM, {what}"] = lat
                    res[f"first exec true in a fork of {what}"] = first
                    for fid in made:
                        api.delete(fid)
                t0 = time.perf_counter()
                r = c.post(f"/v1/sandboxes/{src}/fork", {"memory": True, "count": 4},
                           expect=201).json
                res["fork of its machine, count 4 (wall)"] = [(time.perf_counter() - t0) * 1e3]
                for f in r["sandboxes"]:
                    api.delete(f["id"])
            finally:
                api.delete(src)
            res.update(standby_rows(opts, opts.creates))
            for conc in (2, 8):
                with cf.ThreadPoolExecutor(conc) as pool:
                    t0 = time.perf_counter()
                    made = list(pool.map(lambda _: api.create("microvm"), range(conc)))
                    wall = (time.perf_counter() - t0) * 1e3
                    res[f"create microvm, {conc} at once"] = [ms for _, ms in made]
                    res[f"  all {conc} running (wall)"] = [wall]
                    list(pool.map(api.delete, [s for s, _ in made]))
            for name, xs in res.items():
                unit = "MiB" if "PSS" in name else "ms"
                lines.append(row(name, xs, unit))
                emit({"case": name, "n": len(xs), "p50": pct(xs, 50), "p99": pct(xs, 99),
                      "unit": unit})
            print("\n".join(lines))
    except Exception as e:  # noqa: BLE001 (reported, then the edge is still cleaned up)
        print(f"microvm_bench: failed: {e}", file=sys.stderr)
        ok = False
    finally:
        rc = edge.stop()
        if opts.phases:
            print("\n".join(ln.split("] ", 2)[-1] for ln in edge.log_path.read_text().splitlines()
                            if "started in" in ln))
        left = edge.residue()
        edge.cleanup()
        if rc != 0 or left:
            print(f"microvm_bench: edge exit {rc}, left behind: {left}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
