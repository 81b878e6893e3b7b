#!/usr/bin/env python3
"""Function-call benchmark: `print(1)` as a python function call, side by side.

Systems (each: serial latency p50/p99, then calls/s with N concurrent clients):
- dsec: POST /v1/fncalls {"runtime": "python", "code": "print(1)"} through dsec-edge's REST
  API (keep-alive HTTP/1.1 over loopback with a token; a thread per client). Each call runs in
  fresh pid/mount/ipc namespaces forked from a warm zygote, with fresh tmpfs dirs, no
  capabilities and the full seccomp profile, in a worker sandbox (cgroup, user namespace,
  overlay root, no network).
- sandbox-fusion: the same code through SandboxFusion's POST /run_code on the edge's
  --sandbox-fusion-listen (the request verl sends, all eight fields; it runs on the same fncall
  runtime): the compat layer's cost against dsec's native call.
- cold-python: `python3 -c 'print(1)'` per call (no isolation): what SandboxFusion itself does
  per call with isolation "none" (a python process on a temp file), its SandboxFusion-like row.
- bwrap+python: `bwrap --unshare-all ... python3 -c 'print(1)'` per call (a fresh sandbox).
- fork-server: a bare, unisolated python fork-server on a unix socket (fork per call, exec
  the code with stdout captured): the floor.
and, for container pools, create-from-pool -> delete through the API against a fresh create.

Rounds are interleaved (every system once per round) so drift on a noisy host hits everyone.
With no --url it starts its own edge (examples/edgeproc.py) and checks it leaves nothing.

    sudo python3 bench/fncall_bench.py [--rounds 3] [--calls 300] [--concurrency 8,64] [--json]
                                       [--edge build/release/src/edge/dsec-edge]
                                       [--systems dsec,sandbox-fusion,fork-server,cold-python,
                                                  bwrap+python]

--json lines carry p50/p90/p99/max (ms; p50_ms and p99_ms too, as before), calls/s and "cdf":
the p0..p100 latency percentiles (101 values, ms) for bench/plots.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import edgeproc  # noqa: E402

pct = edgeproc.percentile
CODE = "print(1)"

FORK_SERVER = r'''
import os, socket, sys, json, math, re, collections, itertools, functools, random
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path); srv.listen(256)
os.set_blocking(srv.fileno(), True)
import signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    if os.fork() == 0:  # one process per connection, one fork per call below it
        srv.close()
        f = conn.makefile("rb")
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        while True:
            line = f.readline()
            if not line:
                os._exit(0)
            code = line.decode()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r); os.dup2(w, 1)
                exec(compile(code, "<call>", "exec"), {"__name__": "__main__"})
                sys.stdout.flush(); os._exit(0)
            os.close(w)
            out = b""
            while True:
                b = os.read(r, 65536)
                if not b:
                    break
                out += b
            os.close(r)
            _, st = os.waitpid(pid, 0)
            conn.sendall(json.dumps({"status": st, "stdout": out.decode()}).encode() + b"\n")
    conn.close()
'''


class DsecClient:
    def __init__(self, url: str, token: str):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.body = json.dumps({"runtime": "python", "code": CODE})

    def call(self) -> None:
        self.conn.request("POST", "/v1/fncalls", self.body, self.headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"fncall: HTTP {resp.status}: {data[:200]!r}")
        r = json.loads(data)
        if r["exit_code"] != 0 or r["stdout"] != "1\n":
            raise RuntimeError(f"fncall: unexpected result {r}")


class FusionClient:
    def __init__(self, url: str, token: str):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.path = f"/{token}/run_code"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        self.body = json.dumps({"compile_timeout": 10, "run_timeout": 10, "code": CODE,
                                "stdin": "", "memory_limit_MB": 512, "language": "python",
                                "files": {}, "fetch_files": []})

    def call(self) -> None:
        self.conn.request("POST", self.path, self.body, self.headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"run_code: HTTP {resp.status}: {data[:200]!r}")
        r = json.loads(data)
        if r["status"] != "Success" or r["run_result"]["stdout"] != "1\n":
            raise RuntimeError(f"run_code: unexpected result {r}")


class ForkServerClient:
    def __init__(self, path: str):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile("rb")

    def call(self) -> None:
        self.s.sendall((CODE.replace("\n", ";") + "\n").encode())
        r = json.loads(self.f.readline())
        if r["status"] != 0 or r["stdout"] != "1\n":
            raise RuntimeError(f"fork-server: unexpected result {r}")


class SpawnClient:
    def __init__(self, argv: list[str]):
        self.argv = argv

    def call(self) -> None:
        p = subprocess.run(self.argv, capture_output=True)
        if p.returncode != 0 or p.stdout != b"1\n":
            raise RuntimeError(f"{self.argv[0]}: exit {p.returncode}: {p.stderr[:200]!r}")


def run_level(make_client, conc: int, calls: int) -> dict:
    """`calls` calls spread over `conc` threads; returns latency percentiles and calls/s."""
    clients = [make_client() for _ in range(conc)]
    for c in clients:  # connect and warm each client once
        c.call()
    lat: list[float] = []
    lock = threading.Lock()
    left = {"n": calls}
    errors: list[str] = []

    def worker(c):
        mine = []
        while True:
            with lock:
                if left["n"] <= 0:
                    break
                left["n"] -= 1
            t = time.perf_counter()
            try:
                c.call()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(str(e))
                break
            mine.append((time.perf_counter() - t) * 1000)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return {**stats(lat), "rate": len(lat) / wall, "n": len(lat)}


def stats(lat: list[float]) -> dict:
    """p50/p90/p99/max (ms, also as p50_ms/p99_ms for older reports) and the p0..p100 CDF."""
    return {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "p50": pct(lat, 50),
            "p90": pct(lat, 90), "p99": pct(lat, 99), "max": max(lat),
            "cdf": [round(pct(lat, p), 3) for p in range(101)]}


def pool_create(url: str, token: str, n: int, pool: str | None) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    lat = []
    for i in range(n):
        body = {"pool": pool} if pool else {}
        t = time.perf_counter()
        conn.request("POST", "/v1/sandboxes", json.dumps(body), h)
        r = conn.getresponse()
        data = r.read()
        lat.append((time.perf_counter() - t) * 1000)
        if r.status != 201:
            raise RuntimeError(f"create: HTTP {r.status}: {data[:200]!r}")
        sid = json.loads(data)["id"]
        conn.request("DELETE", f"/v1/sandboxes/{sid}", headers=h)
        conn.getresponse().read()
        if pool:
            time.sleep(0.03)  # let the pool refill, as between episodes
    return {**stats(lat), "rate": 0, "n": n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--sandbox-fusion-url", default="",
                    help="with --url: the edge's --sandbox-fusion-listen URL")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300, help="calls per system and level")
    ap.add_argument("--concurrency", default="8,64")
    ap.add_argument("--cold-calls", type=int, default=100,
                    help="calls for the per-call-process peers (slow)")
    ap.add_argument("--pool-creates", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None, help="dsec-edge binary to start (default: $DSEC_EDGE"
                    " or build/release's)")
    ap.add_argument("--systems",
                    default="dsec,sandbox-fusion,fork-server,cold-python,bwrap+python",
                    help="systems to time (default all; bench/run's A/B of two builds: dsec)")
    args = ap.parse_args()
    wanted = [x for x in args.systems.split(",") if x]
    known = {"dsec", "sandbox-fusion", "fork-server", "cold-python", "bwrap+python"}
    if not wanted or set(wanted) - known:
        ap.error(f"--systems: pick from {','.join(sorted(known))}")
    levels = [1] + [int(x) for x in args.concurrency.split(",") if x]
    # The Debian interpreter (the one the python runtime embeds), not a shim earlier on PATH.
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else shutil.which("python3")
    bwrap = shutil.which("bwrap")

    edge = None
    if not args.url:
        edge = edgeproc.EdgeProcess(
            args.edge, extra_args=["--sandbox-fusion-listen", "127.0.0.1:0"]).start()
        url, token = edge.url, edge.token
        fusion_url = edge.sandbox_fusion_url
    else:
        url, token = args.url, args.token or os.environ.get("DSEC_TOKEN", "")
        fusion_url = args.sandbox_fusion_url
    tmp = tempfile.mkdtemp(prefix="dsec-fnbench-")
    sock_path = os.path.join(tmp, "fork.sock")
    fs = subprocess.Popen([python, "-c", FORK_SERVER, sock_path], stdout=subprocess.PIPE,
                          start_new_session=True)
    rc = 0
    try:
        assert fs.stdout.readline().strip() == b"ready"
        # A container pool for the create-from-pool figure.
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        c.request("PUT", "/v1/pools/bench-ct", json.dumps(
            {"kind": "container", "min_idle": 4, "max": 16, "memory_mb": 256, "disk_mb": 64}), h)
        r = c.getresponse()
        r.read()
        if r.status not in (200, 201):
            raise RuntimeError(f"PUT pool: HTTP {r.status}")
        deadline = time.time() + 60
        while json.loads(edge_get(c, h, "/v1/pools/bench-ct"))["workers"]["idle"] < 4:
            if time.time() > deadline:
                raise RuntimeError("container pool bench-ct did not fill")
            time.sleep(0.1)
        systems = {
            "dsec": lambda: DsecClient(url, token),
            "sandbox-fusion": lambda: FusionClient(fusion_url, token),
            "fork-server": lambda: ForkServerClient(sock_path),
            "cold-python": lambda: SpawnClient([python, "-c", CODE]),
        }
        if bwrap:
            systems["bwrap+python"] = lambda: SpawnClient(
                [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
                 "/proc", "--tmpfs", "/tmp", python, "-c", CODE])
        if not fusion_url:
            systems.pop("sandbox-fusion")
        systems = {k: v for k, v in systems.items() if k in wanted}
        for rnd in range(1, args.rounds + 1):
            print(f"== fncall round {rnd}/{args.rounds}", file=sys.stderr)
            for name, make in systems.items():
                for conc in levels:
                    n = (args.calls if name in ("dsec", "sandbox-fusion", "fork-server")
                         else args.cold_calls)
                    res = run_level(make, conc, max(n, conc * 2))
                    rec = {"workload": "fncall", "system": name, "concurrency": conc, **res}
                    emit(rec, args.json)
            for name, pool in (("pool", "bench-ct"), ("fresh", None)):
                res = pool_create(url, token, args.pool_creates, pool)
                emit({"workload": "pool_create", "system": name, "concurrency": 1, **res},
                     args.json)
        # (a fresh connection: the first may have idled past the edge's idle_timeout_s)
        c = http.client.HTTPConnection(host, int(port), timeout=60)
        c.request("DELETE", "/v1/pools/bench-ct", headers=h)
        c.getresponse().read()
    except Exception as e:  # noqa: BLE001
        print(f"fncall_bench: {e}", file=sys.stderr)
        rc = 1
    finally:
        os.killpg(fs.pid, 9)
        fs.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        if edge:
            left = edge.stop()
            if left:
                print(f"fncall_bench: the edge left {left}", file=sys.stderr)
                rc = 1
    return rc


def edge_get(conn, h, path):
    conn.request("GET", path, headers=h)
    return conn.getresponse().read()


def emit(rec: dict, as_json: bool) -> None:
    line = (f"{rec['workload']:<12} {rec['system']:<13} c={rec['concurrency']:<3} "
            f"p50 {rec['p50_ms']:7.2f} ms  p99 {rec['p99_ms']:7.2f} ms  {rec['rate']:8.0f}/s")
    print(line, file=sys.stderr)
    if as_json:
        print("JSON " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                    for k, v in rec.items()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
