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

    sudo python3 bench/microvm_bench.py [--creates 8] [--execs 200] [--json]

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
APPLETS = ["sh", "true", "cat", "echo", "sleep", "ls"]
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


def main() -> int:
    global JSON_OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=8)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    opts = ap.parse_args()
    JSON_OUT = opts.json
    if opts.edge:
        os.environ["DSEC_EDGE_BIN"] = opts.edge
    edge = edge_harness.Edge.start(binary=opts.edge, prefix="dsec-vmbench-",
                                   config={"fncall_pools": False})
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
        lines = [f"accelerator {vm['accel']}, guest kernel {vm['kernel']}; 128 MiB + 32 MiB "
                 "disk per sandbox", "",
                 "| what | n | p50 | p90 | p99 | unit |", "|---|---|---|---|---|---|"]
        res: dict[str, list[float]] = {}
        sid, ms = api.create("microvm")  # makes the template
        res["first create (cold boot, template saved)"] = [ms]
        api.delete(sid)
        for kind in ("microvm", "container"):
            ids, lat = [], []
            for _ in range(opts.creates):
                sid, ms = api.create(kind)
                ids.append(sid)
                lat.append(ms)
            res[f"create {kind} (serial{', from the template' if kind == 'microvm' else ''})"] = lat
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
        left = edge.residue()
        edge.cleanup()
        if rc != 0 or left:
            print(f"microvm_bench: edge exit {rc}, left behind: {left}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
