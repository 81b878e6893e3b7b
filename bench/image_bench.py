#!/usr/bin/env python3
"""Image benchmarks (issue 5): layered images, snapshot (pack_diff), fork, EROFS vs dir layers.

Starts two private edges (tests/integration/edge_harness.Edge: temp state dir, token, socket),
one with "image_layer_format": "dir" and one with "erofs", imports the same archives into both
(the store is content-addressed, so one edge cannot hold the same layer in both formats) and
measures, interleaving the two edges and the images in rounds so drift on a shared host hits
every case alike:

 create     create -> exec `true` -> delete through the REST API, serially and with 4 workers,
            for the `host` image, a 3-layer stack on it (["host", "l1:1", "l2:1", "l3:1"], each
            a small tar of files) and a 3-layer stack that is the whole root (busybox-static as
            the bottom layer + 2 small layers); create (POST returns a running sandbox) and the
            whole cycle are timed apart. The first create of each stack is reported on its own
            (it makes the EROFS copies / loop mounts); 2 more warm-up cycles are not recorded.
            Layers stacked on `host` are always EROFS-mounted: the store gives a dir layer an
            EROFS copy there (overlayfs refuses a lower on the host root's filesystem), so only
            the busybox stack compares true dir layers with EROFS ones.
 snapshot   a `host` sandbox writes 100 MiB (4 x 25 MiB from /dev/urandom) into its writable
            layer; POST /snapshot -> time, layer size (API and on disk); then creates from the
            snapshot image (the first one and a later one).
 fork       POST /fork {"count": 16} of that 100 MiB sandbox, of a sandbox with 1 MiB written,
            and (the baseline) POST /v1/sandboxes {"count": 16} from `host`; readiness = the
            time from the request until each new sandbox answered `true` (16 execs in parallel).
 pagecache  100 sandboxes from [busybox, 64 MiB of file data] on each edge; memory per sandbox
            after creating them; then caches dropped (sync; echo 3 > drop_caches), one sandbox
            reads all the data (dd of each file to /dev/null), then the other 99; Cached/Buffers growth in
            /proc/meminfo after the first reader and after all, and the file cache charged to
            the edge's memory cgroup (immune to other work on the host). A control interval
            with nobody reading measures the drift caused by other work on the host.

    sudo python3 bench/image_bench.py [--quick] [--json] [--edge PATH]

About 2 minutes on a 2-vCPU host (under a minute with --quick: fewer rounds, one repetition).

--json adds `JSON {...}` lines (workload "images") for bench/report.py. Needs root. Leaves
nothing behind: every edge is stopped (it destroys its sandboxes and loop devices) and checked
(processes, cgroups, mounts, loop devices), and its temp dir removed; exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import glob
import io
import json
import math
import os
import signal
import statistics
import sys
import tarfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import edge_harness  # noqa: E402

pc = time.perf_counter
MiB = 1 << 20
BUSYBOX = "/bin/busybox"
APPLETS = ("sh cat dd du head ls mkdir rm cp sync true false echo env id sleep find wc "
           "xargs stat").split()
JSON_OUT = False


class BenchError(RuntimeError):
    pass


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def emit(rec: dict) -> None:
    rec = {"workload": "images", **rec}
    if JSON_OUT:
        print("JSON " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in rec.items()}), flush=True)


def log(msg: str) -> None:
    print(f"image_bench: {msg}", file=sys.stderr, flush=True)


# ---- archives -------------------------------------------------------------------------------

def make_tar(files: dict[str, bytes], busybox: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        if busybox:
            t.add(BUSYBOX, arcname="bin/busybox")
            for a in APPLETS:
                ti = tarfile.TarInfo("bin/" + a)
                ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
                t.addfile(ti)
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def small_layer(tag: str) -> bytes:
    """64 files of 4 KiB under /opt/<tag>/ (a project checkout's worth of small files)."""
    return make_tar({f"opt/{tag}/f{j:02d}.txt": os.urandom(4096) for j in range(64)})


# ---- the edges ------------------------------------------------------------------------------

class Api:
    """One edge: keep-alive HTTP clients, one per thread."""

    def __init__(self, edge: edge_harness.Edge, fmt: str) -> None:
        self.edge, self.fmt = edge, fmt
        self.local = threading.local()
        self.clients: list[edge_harness.Client] = []
        self.lock = threading.Lock()
        self.data_digest = ""

    def client(self) -> edge_harness.Client:
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = self.edge.client(validate=False, keep_alive=True, timeout=600)
            with self.lock:
                self.clients.append(c)
        return c

    def call(self, method: str, path: str, body=None, expect=(200, 201, 204), headers=None):
        try:
            r = self.client().request(method, path, body, headers=headers)
        except (AssertionError, OSError) as e:
            raise BenchError(f"{self.fmt} edge: {method} {path}: {e}") from e
        if r.status not in expect:
            raise BenchError(f"{self.fmt} edge: {method} {path} -> {r.status} {r.body[:600]!r}")
        return r

    def create(self, image, *, memory_mb=128, disk_mb=64, count=None, labels=None) -> dict:
        body = {"image": image, "memory_mb": memory_mb, "disk_mb": disk_mb, "ttl_s": 1800,
                "labels": labels or {"job": JOB}}
        if count:
            body["count"] = count
        return self.call("POST", "/v1/sandboxes", body, expect=(201,)).json

    def sh(self, sid: str, shell: str, timeout_ms: int = 30000) -> dict:
        x = self.call("POST", f"/v1/sandboxes/{sid}/exec",
                      {"shell": shell, "timeout_ms": timeout_ms}).json
        if x.get("exit_code") != 0:
            raise BenchError(f"{self.fmt} edge: `{shell}` in {sid}: {json.dumps(x)[:600]}")
        return x

    def true(self, sid: str) -> None:
        x = self.call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}).json
        if x.get("exit_code") != 0:
            raise BenchError(f"{self.fmt} edge: true in {sid}: {json.dumps(x)[:600]}")

    def delete(self, sid: str) -> None:
        self.call("DELETE", f"/v1/sandboxes/{sid}", expect=(204,))

    def import_tar(self, name: str, data: bytes, base: str = "") -> tuple[dict, float]:
        q = f"name={name}&format=rootfs" + (f"&base={base}" if base else "")
        t0 = pc()
        r = self.call("POST", f"/v1/images/import?{q}", data, expect=(201,),
                      headers={"Content-Type": "application/octet-stream"})
        return r.json, (pc() - t0) * 1e3

    def memory_top(self) -> str | None:
        """The edge's parent memory cgroup (v1 memory hierarchy or cgroup2)."""
        for root in edge_harness.cgroup_roots():
            top = os.path.join(root, f"dsec-{self.edge.instance}")
            if os.path.exists(os.path.join(top, "memory.stat")):
                return top
        return None

    def cgroup_mem(self) -> dict[str, int]:
        """Bytes charged to all of this edge's sandboxes: total and file (page) cache."""
        top = self.memory_top()
        if not top:
            return {}
        stat = {}
        with open(os.path.join(top, "memory.stat")) as f:
            for line in f:
                k, v = line.split()
                stat[k] = int(v)
        usage = 0
        for name in ("memory.usage_in_bytes", "memory.current"):
            try:
                with open(os.path.join(top, name)) as f:
                    usage = int(f.read())
                break
            except OSError:
                continue
        file_ = stat.get("total_cache", stat.get("file", 0)) - stat.get(
            "total_shmem", stat.get("shmem", 0))
        return {"usage": usage, "file": file_}

    def layer_disk_bytes(self, digest: str) -> int:
        """Bytes the layer takes in the store: its dir and its .erofs file (if any)."""
        base = os.path.join(self.edge.state_dir, "images", "layers", digest.split(":", 1)[1])
        total = 0
        if os.path.exists(base + ".erofs"):
            total += os.stat(base + ".erofs").st_blocks * 512
        for dirpath, _, files in os.walk(base):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
                except OSError:
                    pass
        return total

    def close(self) -> None:
        for c in self.clients:
            c.close()


JOB = f"image-bench-{os.getpid()}"


def start_edge(binary: str, fmt: str) -> edge_harness.Edge:
    os.environ["DSEC_EDGE_BIN"] = binary  # edge_harness checks this path before starting
    return edge_harness.Edge.start(
        binary=binary, prefix="dsec-imgbench-",
        config={"image_layer_format": fmt, "fncall_pools": False, "orphan_timeout_s": 600})


def edge_warnings(e: edge_harness.Edge) -> list[str]:
    """Warning and error lines in the edge's log (but the oom_score_adj one: the edge cannot
    set -1000 from inside this nested VM's container)."""
    try:
        text = e.log_path.read_text(errors="replace")
    except OSError:
        return []
    return [line[:300] for line in text.splitlines()
            if (" warning " in line or " error " in line or " critical " in line)
            and "oom_score_adj" not in line]


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def loop_backings() -> set[str]:
    out = set()
    for bf in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(bf) as f:
                out.add(f"/dev/{bf.split('/')[3]} -> {f.read().strip()}")
        except OSError:
            pass
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(path: str) -> int:
    """Bytes of the file in the page cache (mincore on a shared read-only mapping). Through
    overlayfs the mapping is the lower file's, so a sandbox's view gives its layer's cache."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in vec) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    time.sleep(0.3)


def parallel(fn, items, workers):
    with cf.ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        return list(ex.map(fn, items))


# ---- create latency -------------------------------------------------------------------------

def cycles(api: Api, image, n: int, workers: int, lat: dict) -> None:
    left = [n]
    lock = threading.Lock()
    errors: list[str] = []

    def one() -> None:
        t0 = pc()
        sb = api.create(image)
        t1 = pc()
        try:
            api.true(sb["id"])
            t2 = pc()
        finally:
            api.delete(sb["id"])
        t3 = pc()
        with lock:
            lat["create"].append((t1 - t0) * 1e3)
            lat["exec"].append((t2 - t1) * 1e3)
            lat["delete"].append((t3 - t2) * 1e3)
            lat["cycle"].append((t3 - t0) * 1e3)

    def worker(_):
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            try:
                one()
            except BenchError as e:
                errors.append(str(e))
                if len(errors) > 5:
                    raise

    t0 = pc()
    parallel(worker, range(workers), workers)
    lat["wall"] += pc() - t0
    lat["errors"] += errors


def bench_create(apis: dict[str, Api], stacks: dict[str, list | str], opts) -> list[dict]:
    configs = [(fmt, name) for fmt in apis for name in stacks]
    first = {}
    for fmt, name in configs:  # cold: EROFS copies made, loop devices attached, first mount
        api, image = apis[fmt], stacks[name]
        lat = {"create": [], "exec": [], "delete": [], "cycle": [], "wall": 0.0, "errors": []}
        cycles(api, image, 1, 1, lat)
        first[(fmt, name)] = lat["create"][0]
        cycles(api, image, 2, 1, {"create": [], "exec": [], "delete": [], "cycle": [],
                                   "wall": 0.0, "errors": []})
    res = {(c, w): {"create": [], "exec": [], "delete": [], "cycle": [], "wall": 0.0,
                    "errors": []} for c in configs for w in (1, opts.workers)}
    for r in range(opts.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        if r % 2:
            order.reverse()
        log(f"create latency: round {r + 1}/{opts.rounds}")
        for w, n in ((1, opts.serial), (opts.workers, opts.concurrent)):
            for c in order:
                cycles(apis[c[0]], stacks[c[1]], n, w, res[(c, w)])
    out = []
    for (c, w), lat in res.items():
        n = len(lat["cycle"])
        rec = {"kind": "create", "layers": c[0], "image": c[1], "workers": w, "cycles": n,
               "errors": len(lat["errors"]), "first_errors": lat["errors"][:2],
               "rate": n / lat["wall"] if lat["wall"] else 0.0,
               "first_create_ms": first[c]}
        for op in ("create", "exec", "delete", "cycle"):
            for p in (50, 90, 99):
                rec[f"{op}_p{p}"] = pct(lat[op], p)
        out.append(rec)
        emit(rec)
    return out


# ---- snapshot and fork ----------------------------------------------------------------------

def readiness(api: Api, ids: list[str], t0: float) -> tuple[list[float], list[float]]:
    """Runs `true` in every sandbox at once; returns (ms from t0 to each answer, exec ms)."""
    def one(sid):
        s = pc()
        api.true(sid)
        e = pc()
        return (e - t0) * 1e3, (e - s) * 1e3
    got = parallel(one, ids, len(ids))
    return [g[0] for g in got], [g[1] for g in got]


def fork_rec(api: Api, fmt: str, source: str, sid: str | None, count: int, rep: int) -> dict:
    t0 = pc()
    if sid:
        made = api.call("POST", f"/v1/sandboxes/{sid}/fork", {"count": count},
                        expect=(201,)).json["sandboxes"]
    else:
        made = api.create("host", count=count)["sandboxes"]
    call_ms = (pc() - t0) * 1e3
    ids = [m["id"] for m in made]
    try:
        ready, ex = readiness(api, ids, t0)
        if sid and source.startswith("100"):
            # The forks see the parent's files (checked outside the timing).
            du = api.sh(ids[0], "du -sk /workspace/big | cut -f1")["stdout"].strip()
            if int(du) < 100 * 1024:
                raise BenchError(f"fork of the 100 MiB sandbox sees {du} kB in /workspace/big")
    finally:
        parallel(api.delete, ids, 4)
    rec = {"kind": "fork", "layers": fmt, "source": source, "count": len(ids), "rep": rep,
           "call_ms": call_ms, "per_sandbox_ms": call_ms / max(1, len(ids)),
           "ready_p50_ms": pct(ready, 50), "ready_max_ms": max(ready),
           "exec_p50_ms": pct(ex, 50), "exec_max_ms": max(ex)}
    emit(rec)
    return rec


def bench_snapshot(api: Api, rep: int, count: int) -> list[dict]:
    fmt, out = api.fmt, []
    name = f"snap{rep}:1"
    sb = api.create("host", memory_mb=128, disk_mb=256)
    sid = sb["id"]
    try:
        t0 = pc()
        api.sh(sid, "mkdir -p /workspace/big && for i in 1 2 3 4; do dd if=/dev/urandom"
               " of=/workspace/big/f$i bs=1M count=25 status=none; done", timeout_ms=120000)
        write_s = pc() - t0
        t0 = pc()
        img = api.call("POST", f"/v1/sandboxes/{sid}/snapshot", {"image": name},
                       expect=(201,)).json
        snap_ms = (pc() - t0) * 1e3
        layer = img["layers"][-1]
        disk0 = api.layer_disk_bytes(layer["digest"])
        times = []
        for k in range(2):
            t0 = pc()
            s2 = api.create(name)
            t1 = pc()
            try:
                api.true(s2["id"])
                t2 = pc()
                if k == 0:
                    du = api.sh(s2["id"], "du -sk /workspace/big | cut -f1")["stdout"].strip()
                    if int(du) < 100 * 1024:
                        raise BenchError(f"sandbox from {name} sees {du} kB in /workspace/big")
            finally:
                api.delete(s2["id"])
            times.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
        disk1 = api.layer_disk_bytes(layer["digest"])
        rec = {"kind": "snapshot", "layers": fmt, "rep": rep, "write_mib": 100,
               "write_s": write_s, "snapshot_ms": snap_ms, "layer_bytes": layer["size"],
               "layer_format": layer["format"], "layer_disk_bytes": disk0,
               "layer_disk_bytes_after_create": disk1,
               "create_first_ms": times[0][0], "create_later_ms": times[1][0],
               "exec_first_ms": times[0][1]}
        emit(rec)
        out.append(rec)
        out.append(fork_rec(api, fmt, "100 MiB written", sid, count, rep))
    finally:
        api.delete(sid)
    small = api.create("host", memory_mb=128, disk_mb=64)
    try:
        api.sh(small["id"], "dd if=/dev/urandom of=/workspace/small bs=1M count=1 status=none")
        out.append(fork_rec(api, fmt, "1 MiB written", small["id"], count, rep))
    finally:
        api.delete(small["id"])
    out.append(fork_rec(api, fmt, "create count (host)", None, count, rep))
    api.call("DELETE", f"/v1/images/{name}", expect=(204,))
    return out


# ---- page cache with many sandboxes on one image ---------------------------------------------

def snap_mem(api: Api) -> dict[str, int]:
    mi = meminfo()
    cg = api.cgroup_mem()
    # Memory that is not reclaimable cache (tmpfs uppers count: Shmem is part of Cached).
    used = (mi["MemTotal"] - mi["MemFree"] - mi["Buffers"] - mi["Cached"]
            - mi.get("SReclaimable", 0) + mi.get("Shmem", 0))
    return {"cached": mi["Cached"], "buffers": mi["Buffers"], "used": used,
            "cg_usage": cg.get("usage", 0) // 1024, "cg_file": cg.get("file", 0) // 1024}


def delta(a: dict, b: dict, k: str) -> int:
    return b[k] - a[k]


def layer_cache_kb(api: Api, sid: str) -> tuple[int, int]:
    """(KiB of /data cached as the sandbox sees it: the dir layer's files or the EROFS files,
    KiB of the EROFS image file cached below the loop device: the second copy)."""
    pids = api.edge.sandbox_pids(sid)
    if not pids:
        raise BenchError(f"{api.fmt} edge: no process in {sid} to look at /data through")
    root = f"/proc/{pids[0]}/root/data"
    files = sum(resident_bytes(os.path.join(root, f)) for f in sorted(os.listdir(root)))
    backing = os.path.join(api.edge.state_dir, "images", "layers",
                           api.data_digest.split(":", 1)[1] + ".erofs")
    loop = resident_bytes(backing) if os.path.exists(backing) else 0
    return files // 1024, loop // 1024


def read_all(api: Api, sid: str, data_mib: int) -> None:
    # dd copies every byte to user space (busybox cat straight to /dev/null splices: it brings
    # the pages into the cache without touching them; cat | wc is CPU-bound in wc).
    x = api.sh(sid, "for f in /data/*; do dd if=$f of=/dev/null bs=1M; done", timeout_ms=300000)
    got = sum(int(line.split("+")[0]) for line in x["stderr"].splitlines()
              if line.endswith("records in"))
    if got != data_mib:
        raise BenchError(f"{api.fmt} edge: {sid} read {got} MiB of /data, not {data_mib}:"
                         f" {x['stderr'][:300]!r}")


def bench_pagecache(api: Api, image: list, n: int, rnd: int, opts) -> dict:
    fmt = api.fmt
    job = f"{JOB}-pc-{fmt}-{rnd}"
    labels = {"job": job}
    ids: list[str] = []
    try:
        m0 = snap_mem(api)
        t0 = pc()
        batch = 25
        while len(ids) < n:
            k = min(batch, n - len(ids))
            r = api.create(image, memory_mb=opts.pc_memory_mb, disk_mb=16, count=k, labels=labels)
            ids += [s["id"] for s in r["sandboxes"]]
        create_s = pc() - t0
        time.sleep(1.0)
        m1 = snap_mem(api)
        # Drift: what the rest of the host adds to the page cache in the time the reads take.
        drop_caches()
        a = snap_mem(api)
        time.sleep(opts.control_s)
        b = snap_mem(api)
        drop_caches()
        s0 = snap_mem(api)
        t0 = pc()
        read_all(api, ids[0], opts.data_mib)
        first_s = pc() - t0
        s1 = snap_mem(api)
        files1, loop1 = layer_cache_kb(api, ids[0])
        t0 = pc()
        parallel(lambda sid: read_all(api, sid, opts.data_mib), ids[1:], opts.workers)
        rest_s = pc() - t0
        s2 = snap_mem(api)
        files2, loop2 = layer_cache_kb(api, ids[-1])
    finally:
        t0 = pc()
        if ids:
            api.call("DELETE", f"/v1/jobs/{job}", expect=(200,))
        delete_s = pc() - t0
    rec = {"kind": "pagecache", "layers": fmt, "round": rnd, "sandboxes": len(ids),
           "data_mib": opts.data_mib, "memory_mb": opts.pc_memory_mb,
           "create_s": create_s, "delete_s": delete_s,
           "host_kb_per_sb": delta(m0, m1, "used") / n,
           "cgroup_kb_per_sb": delta(m0, m1, "cg_usage") / n,
           "first_read_s": first_s, "rest_read_s": rest_s,
           "read_mib_s": opts.data_mib * (n - 1) / rest_s if rest_s else 0.0,
           "first_cached_kb": delta(s0, s1, "cached"), "first_buffers_kb": delta(s0, s1, "buffers"),
           "cached_kb": delta(s0, s2, "cached"), "buffers_kb": delta(s0, s2, "buffers"),
           "cg_file_kb": delta(s0, s2, "cg_file"), "first_cg_file_kb": delta(s0, s1, "cg_file"),
           "first_files_kb": files1, "first_loop_file_kb": loop1,
           "files_kb": files2, "loop_file_kb": loop2,
           "drift_cached_kb": delta(a, b, "cached") + delta(a, b, "buffers"),
           "drift_s": opts.control_s, "read_s": first_s + rest_s}
    emit(rec)
    return rec


# ---- report ---------------------------------------------------------------------------------

def med(recs, key):
    vals = [r[key] for r in recs if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else math.nan


def table(create, snaps, forks, pcs, imports) -> str:
    out = ["", "Create latency through the API (ms): create = POST /v1/sandboxes until running;"
           " cycle = create -> exec `true` -> delete",
           f"{'image':>10} {'layers':>6} {'workers':>7} {'n':>4} {'create p50':>10} {'p99':>7}"
           f" {'cycle p50':>9} {'p99':>7} {'cycles/s':>8} {'first create':>12}"]
    for r in sorted(create, key=lambda r: (r["workers"], r["image"], r["layers"])):
        out.append(f"{r['image']:>10} {r['layers']:>6} {r['workers']:>7} {r['cycles']:>4}"
                   f" {r['create_p50']:>10.1f} {r['create_p99']:>7.1f} {r['cycle_p50']:>9.1f}"
                   f" {r['cycle_p99']:>7.1f} {r['rate']:>8.1f} {r['first_create_ms']:>12.1f}"
                   + (f"  errors {r['errors']}: {r['first_errors']}" if r["errors"] else ""))
    out.append("\nImports (ms): " + ", ".join(
        f"{i['image']} {i['layers']} {i['ms']:.0f}" for i in imports))
    for fmt in sorted({s["layers"] for s in snaps}):
        s = [x for x in snaps if x["layers"] == fmt]
        out.append(f"\nSnapshot, {fmt} edge (medians of {len(s)}): write 100 MiB"
                   f" {med(s, 'write_s'):.2f} s, snapshot {med(s, 'snapshot_ms'):.0f} ms, layer"
                   f" {med(s, 'layer_bytes') / MiB:.1f} MiB ({s[0]['layer_format']}), on disk"
                   f" {med(s, 'layer_disk_bytes') / MiB:.1f} MiB ->"
                   f" {med(s, 'layer_disk_bytes_after_create') / MiB:.1f} MiB after a create;"
                   f" create from it: first {med(s, 'create_first_ms'):.0f} ms, later"
                   f" {med(s, 'create_later_ms'):.0f} ms")
    out.append(f"\nFork / count create of 16 (medians): {'source':>22} {'layers':>6} {'call ms':>8}"
               f" {'per sb':>7} {'ready p50':>9} {'ready max':>9} {'exec p50':>8}")
    for src in sorted({f["source"] for f in forks}):
        for fmt in sorted({f["layers"] for f in forks}):
            f = [x for x in forks if x["source"] == src and x["layers"] == fmt]
            out.append(f"{'':>36} {src:>22} {fmt:>6} {med(f, 'call_ms'):>8.0f}"
                       f" {med(f, 'per_sandbox_ms'):>7.1f} {med(f, 'ready_p50_ms'):>9.0f}"
                       f" {med(f, 'ready_max_ms'):>9.0f} {med(f, 'exec_p50_ms'):>8.1f}")
    if pcs:
        out.append(f"\nPage cache, {pcs[0]['sandboxes']} sandboxes reading {pcs[0]['data_mib']}"
                   " MiB each (MiB, growth after drop_caches; 1 = after the first reader,"
                   " all = after all; files = /data in the page cache, loop = the EROFS image"
                   " file cached below the loop device; drift = growth with nobody reading)")
        out.append(f"{'layers':>6} {'rnd':>3} {'host kB/sb':>10} {'cg kB/sb':>8}"
                   f" {'Cached 1/all':>13} {'Buffers':>7} {'files 1/all':>11} {'loop 1/all':>11}"
                   f" {'cg file':>7} {'drift':>6} {'1st read s':>10} {'rest s':>6}")
        for p in pcs:
            def two(a, b):
                return f"{p[a] / 1024:.0f}/{p[b] / 1024:.0f}"
            out.append(f"{p['layers']:>6} {p['round']:>3} {p['host_kb_per_sb']:>10.0f}"
                       f" {p['cgroup_kb_per_sb']:>8.0f} {two('first_cached_kb', 'cached_kb'):>13}"
                       f" {p['buffers_kb'] / 1024:>7.1f} {two('first_files_kb', 'files_kb'):>11}"
                       f" {two('first_loop_file_kb', 'loop_file_kb'):>11}"
                       f" {p['cg_file_kb'] / 1024:>7.1f} {p['drift_cached_kb'] / 1024:>6.0f}"
                       f" {p['first_read_s']:>10.2f} {p['rest_read_s']:>6.2f}")
    return "\n".join(out)


# ---- main -----------------------------------------------------------------------------------

def find_edge(arg: str | None) -> str:
    for cand in (arg, os.environ.get("DSEC_EDGE"), os.environ.get("DSEC_EDGE_BIN"),
                 os.environ.get("DSEC_BUILD_DIR") and
                 os.path.join(os.environ["DSEC_BUILD_DIR"], "src", "edge", "dsec-edge"),
                 os.path.join(REPO, "build", "release", "src", "edge", "dsec-edge")):
        if cand:
            return os.path.abspath(cand)
    raise SystemExit("image_bench: no dsec-edge")


def run(opts, apis: dict) -> tuple[list, list, list, list, list]:
    data = make_tar({f"data/f{j:02d}": os.urandom(4 * MiB) for j in range(opts.data_mib // 4)})
    archives = [("l1:1", small_layer("l1"), "host"), ("l2:1", small_layer("l2"), "host"),
                ("l3:1", small_layer("l3"), "host"), ("bb:1", make_tar({}, busybox=True), ""),
                ("bl1:1", small_layer("bl1"), ""), ("bl2:1", small_layer("bl2"), ""),
                ("data:1", data, "")]
    imports = []
    for name, tar_bytes, base in archives:
        for fmt, api in apis.items():
            img, ms = api.import_tar(name, tar_bytes, base)
            if name == "data:1":
                api.data_digest = img["layers"][-1]["digest"]
            got = {layer["format"] for layer in img["layers"]}
            if got != {fmt}:
                raise BenchError(f"{fmt} edge: {name} imported as {got}")
            rec = {"kind": "import", "layers": fmt, "image": name, "mib": len(tar_bytes) / MiB,
                   "ms": ms}
            imports.append(rec)
            emit(rec)
    stacks = {"host": "host", "host+3": ["host", "l1:1", "l2:1", "l3:1"],
              "busybox-3": ["bb:1", "bl1:1", "bl2:1"]}
    log("create latency ...")
    create = bench_create(apis, stacks, opts)
    log("snapshot and fork ...")
    snaps, forks = [], []
    fmts = list(apis)
    for rep in range(opts.snap_reps):
        for fmt in (fmts if rep % 2 == 0 else fmts[::-1]):
            for rec in bench_snapshot(apis[fmt], rep, opts.fork_count):
                (snaps if rec["kind"] == "snapshot" else forks).append(rec)
    pcs = []
    for rnd in range(opts.pc_rounds):
        for fmt in (fmts if rnd % 2 == 0 else fmts[::-1]):
            log(f"page cache: {opts.pc_sandboxes} sandboxes, {fmt} layers, round {rnd + 1}")
            pcs.append(bench_pagecache(apis[fmt], ["bb:1", "data:1"], opts.pc_sandboxes,
                                       rnd, opts))
    for api in apis.values():
        stray = stray_layers(api)
        emit({"kind": "store", "layers": api.fmt, "stray_layers": stray})
        if stray:
            log(f"{api.fmt} edge: layers on disk that no image references: {stray}")
    return create, snaps, forks, pcs, imports


def stray_layers(api: Api) -> list[str]:
    """Layers left in the store that no image references, once every sandbox is gone."""
    deadline = time.monotonic() + 10
    while api.call("GET", "/v1/sandboxes").json.get("sandboxes"):
        if time.monotonic() > deadline:
            return ["sandboxes still listed 10 s after their delete"]
        time.sleep(0.2)
    used = {layer["digest"].split(":", 1)[1] for img in api.call("GET", "/v1/images").json["images"]
            for layer in img["layers"]}
    d = os.path.join(api.edge.state_dir, "images", "layers")
    on_disk = {n.split(".", 1)[0] for n in os.listdir(d)}  # <hex>, <hex>.erofs, <hex>.dirs
    return sorted(x[:12] for x in on_disk - used)


def main() -> int:
    global JSON_OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke (under a minute)")
    ap.add_argument("--json", action="store_true", help="also print JSON lines (bench/report.py)")
    ap.add_argument("--edge", default=None, help="dsec-edge binary (default: $DSEC_EDGE,"
                    " $DSEC_EDGE_BIN, $DSEC_BUILD_DIR/src/edge/dsec-edge, build/release's)")
    ap.add_argument("--rounds", type=int, default=None, help="create-latency rounds (5)")
    ap.add_argument("--serial", type=int, default=None, help="serial cycles per round (20)")
    ap.add_argument("--concurrent", type=int, default=None, help="cycles per round, 4 workers (40)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--snap-reps", type=int, default=None, help="snapshot/fork repetitions (3)")
    ap.add_argument("--fork-count", type=int, default=16)
    ap.add_argument("--pc-rounds", type=int, default=None, help="page-cache rounds per format (3)")
    ap.add_argument("--pc-sandboxes", type=int, default=100)
    ap.add_argument("--pc-memory-mb", type=int, default=192,
                    help="memory_mb of the page-cache sandboxes (the first reader's cgroup is"
                         " charged for the cache: it must hold 2 x the data)")
    ap.add_argument("--data-mib", type=int, default=64, help="MiB of data in the page-cache image")
    ap.add_argument("--control-s", type=float, default=None)
    opts = ap.parse_args()
    q = opts.quick
    for k, full, quick in (("rounds", 5, 2), ("serial", 20, 5), ("concurrent", 40, 8),
                           ("snap_reps", 3, 1), ("pc_rounds", 3, 1), ("control_s", 5.0, 3.0)):
        if getattr(opts, k) is None:
            setattr(opts, k, quick if q else full)
    if opts.data_mib < 4 or opts.data_mib % 4:
        ap.error("--data-mib must be a multiple of 4 (the data is in 4 MiB files)")
    JSON_OUT = opts.json
    if os.geteuid() != 0:
        raise SystemExit("image_bench: needs root (sandboxes, drop_caches)")
    binary = find_edge(opts.edge)
    if not os.access(BUSYBOX, os.X_OK):
        raise SystemExit(f"image_bench: {BUSYBOX} missing (apt-get install busybox-static)")

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    loops0 = loop_backings()
    load0 = os.getloadavg()
    t_start = pc()
    edges: dict[str, edge_harness.Edge] = {}
    apis: dict[str, Api] = {}
    rc, results = 0, None
    try:
        for fmt in ("dir", "erofs"):
            edges[fmt] = start_edge(binary, fmt)
            apis[fmt] = Api(edges[fmt], fmt)
        results = run(opts, apis)
    except KeyboardInterrupt:
        log("interrupted")
        rc = 130
    except BenchError as e:
        log(f"FAILED: {e}")
        for fmt, e2 in edges.items():
            log(f"{fmt} edge log tail:\n{e2.log_tail(25)}")
        rc = 1
    finally:
        residue, warnings = [], []
        for fmt, e in edges.items():
            apis[fmt].close()
            try:
                left = e.shutdown_and_check()
            except AssertionError as err:
                left = {"stop": [str(err)[:300]]}
            if left:
                residue.append(f"{fmt} edge: {left}")
            warnings += [f"{fmt} edge: {line}" for line in edge_warnings(e)]
            e.cleanup()
            if os.path.exists(e.root):
                residue.append(f"{fmt} edge: temp dir {e.root} remains")
        new_loops = sorted(loop_backings() - loops0)
        new_loops = [x for x in new_loops if "dsec-imgbench-" in x]
        residue += [f"loop device {x}" for x in new_loops]
    elapsed = pc() - t_start
    emit({"kind": "meta", "quick": q, "duration_s": elapsed, "load_start": list(load0),
          "load_end": list(os.getloadavg()), "residue": residue, "ok": rc == 0 and not residue,
          "edge_warnings": len(warnings), "first_edge_warnings": warnings[:5]})
    for w in warnings[:20]:
        log(f"edge log: {w}")
    if results:
        print(table(results[0], results[1], results[2], results[3], results[4]))
    print(f"\nimage_bench: {elapsed:.0f} s; load average {load0[0]:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; left behind: {'nothing' if not residue else residue}")
    if residue:
        rc = rc or 1
    if results and any(r["errors"] for r in results[0]):
        rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
