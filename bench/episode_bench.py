#!/usr/bin/env python3
"""A realistic episode (issue 7, workload e): write a small python project, run its pytest suite,
read the results, fix the bug, rerun, read a file back -- in a fresh isolated place each time.

One episode, the same on every system:
  1. create an isolated place (a sandbox, or a fresh host temp dir for the per-command peers)
  2. write calc.py (with a bug) and test_calc.py (5 tests; one fails because of the bug)
  3. run `python3 -m pytest -q --junitxml=junit.xml`; it must exit 1 with "1 failed, 4 passed"
  4. read junit.xml back: tests=5 failures=1
  5. write the fixed calc.py
  6. rerun pytest: exit 0, "5 passed"; junit.xml read back says tests=5 failures=0
  7. read calc.py back: it must be the fixed one
  8. destroy the place

Systems:
  dsec        the edge's REST API through the Python SDK: POST /v1/sandboxes (host image), files
              API for writes and reads, exec for pytest, DELETE
  dsec-pool   the same, the sandbox taken from a container pool (PUT /v1/pools/NAME kind
              container, then POST /v1/sandboxes {"pool": NAME})
  bwrap       a fresh host temp dir per episode, pytest under
              `bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp
              --bind DIR /work --chdir /work`, files written and read on the host
  crun        the same temp dir bind-mounted on /work of an OCI container whose root is the
              host's / read-only (own pid/net/ipc/uts/mount namespaces, memory + pids + cpu
              cgroup limits), one `crun run` per pytest run; crun runs inside one private mount
              namespace (held by a sleeping process) where the host's / is bound on the rootfs
              and, on this v1/v2 hybrid host, the empty cgroup2 mount is unmounted
  fork+exec   no isolation at all (the floor): temp dir + subprocess pytest

Each (round, concurrency level) runs the systems one after the other, the order rotated per
round, so drift on a shared host hits all of them. Every episode checks its own results; any
failure makes the exit status non-zero.

    sudo /usr/bin/python3 bench/episode_bench.py [--concurrency 1,8] [--episodes 40] [--rounds 1]
        [--systems dsec,dsec-pool,bwrap,crun,fork+exec] [--quick] [--json]

--json prints one `JSON {...}` line per (system, concurrency, round) for bench/report.py, with
p50/p90/p99/max (ms), rate (episodes/s) and cdf (101 latencies, p0..p100, ms).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import edgeproc  # noqa: E402

edgeproc.use_sdk()
from libdsec import DSecClient, DSecContainerRunArgs, DSecError  # noqa: E402

pct = edgeproc.percentile
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else shutil.which("python3")
TMP_PREFIX = "dsec-episode-"
MADE_DIRS: list[str] = []  # every temp dir this run made (checked to be gone at the end)


def make_tmp(prefix: str = TMP_PREFIX) -> str:
    d = tempfile.mkdtemp(prefix=prefix)
    MADE_DIRS.append(d)
    return d
ALL_SYSTEMS = ("dsec", "dsec-pool", "bwrap", "crun", "fork+exec")

# -- the project -------------------------------------------------------------------------------

CALC_BUGGY = '''\
"""A tiny module under test."""


def add(a, b):
    return a + b


def mean(xs):
    if not xs:
        raise ValueError("mean of nothing")
    return sum(xs) / (len(xs) - 1)  # the bug


def clamp(x, lo, hi):
    return max(lo, min(x, hi))


def words(s):
    return [w for w in s.split() if w]
'''

CALC_FIXED = CALC_BUGGY.replace("(len(xs) - 1)  # the bug", "len(xs)")
assert CALC_FIXED != CALC_BUGGY

TEST_CALC = '''\
import pytest

import calc


def test_add():
    assert calc.add(2, 3) == 5


def test_mean():
    assert calc.mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        calc.mean([])


def test_clamp():
    assert [calc.clamp(x, 0, 10) for x in (-5, 5, 50)] == [0, 5, 10]


def test_words():
    assert calc.words("  a bb  ccc ") == ["a", "bb", "ccc"]
'''

PYTEST_ARGS = ["-m", "pytest", "-q", "--junitxml=junit.xml"]


class EpisodeError(Exception):
    pass


def check_run(which: str, exit_code: int, output: str, junit: bytes, failed: int) -> None:
    """A pytest run's exit code, summary line and junit report must all say `failed` of 5."""
    want_exit = 1 if failed else 0
    want_line = f"{failed} failed, {5 - failed} passed" if failed else "5 passed"
    if exit_code != want_exit:
        raise EpisodeError(f"{which}: pytest exited {exit_code}, expected {want_exit}: "
                           f"{output[-400:]!r}")
    if not re.search(r"\b" + re.escape(want_line) + r"\b", output):
        raise EpisodeError(f"{which}: no {want_line!r} in pytest's output: {output[-400:]!r}")
    try:
        root = ET.fromstring(junit)
    except ET.ParseError as e:
        raise EpisodeError(f"{which}: junit.xml does not parse: {e}: {junit[:200]!r}") from None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise EpisodeError(f"{which}: no testsuite in junit.xml")
    got = (int(suite.get("tests", -1)), int(suite.get("failures", -1)),
           int(suite.get("errors", -1)))
    if got != (5, failed, 0):
        raise EpisodeError(f"{which}: junit.xml says tests/failures/errors {got}, expected "
                           f"(5, {failed}, 0)")


# -- systems ------------------------------------------------------------------------------------

class System:
    name = ""

    def setup(self, opts) -> None:
        pass

    def before_level(self, conc: int) -> None:
        pass

    def episode(self) -> None:
        raise NotImplementedError

    def teardown(self) -> list[str]:
        """Undo setup(); returns what could not be cleaned up."""
        return []


class HostDirSystem(System):
    """The per-command peers: files live in a fresh host temp dir, each pytest run is a command."""

    def argv(self, workdir: str) -> list[str]:
        raise NotImplementedError

    def pytest(self, workdir: str) -> tuple[int, str]:
        p = subprocess.run(self.argv(workdir), cwd=workdir, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        return p.returncode, p.stdout.decode(errors="replace")

    def episode(self) -> None:
        top = make_tmp()
        try:
            work = os.path.join(top, "work")
            os.mkdir(work)
            for name, text in (("calc.py", CALC_BUGGY), ("test_calc.py", TEST_CALC)):
                with open(os.path.join(work, name), "w") as f:
                    f.write(text)
            junit = os.path.join(work, "junit.xml")
            code, out = self.pytest(top)
            with open(junit, "rb") as f:
                check_run("first run", code, out, f.read(), failed=1)
            with open(os.path.join(work, "calc.py"), "w") as f:
                f.write(CALC_FIXED)
            os.unlink(junit)
            code, out = self.pytest(top)
            with open(junit, "rb") as f:
                check_run("second run", code, out, f.read(), failed=0)
            with open(os.path.join(work, "calc.py")) as f:
                if f.read() != CALC_FIXED:
                    raise EpisodeError("calc.py read back is not the fixed one")
        finally:
            shutil.rmtree(top, ignore_errors=True)


class ForkExec(HostDirSystem):
    name = "fork+exec"

    def argv(self, top: str) -> list[str]:
        return [PYTHON, *PYTEST_ARGS]

    def pytest(self, top: str) -> tuple[int, str]:
        p = subprocess.run(self.argv(top), cwd=os.path.join(top, "work"),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        return p.returncode, p.stdout.decode(errors="replace")


class Bwrap(HostDirSystem):
    name = "bwrap"

    def setup(self, opts) -> None:
        self.bwrap = shutil.which("bwrap")
        if not self.bwrap:
            raise EpisodeError("bwrap is not installed")

    def argv(self, top: str) -> list[str]:
        return [self.bwrap, "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev",
                "--proc", "/proc", "--tmpfs", "/tmp", "--bind", os.path.join(top, "work"),
                "/work", "--chdir", "/work", PYTHON, *PYTEST_ARGS]


class Crun(HostDirSystem):
    name = "crun"

    def __init__(self) -> None:
        self.holder: subprocess.Popen | None = None
        self.dir: str | None = None
        self.seq = 0
        self.lock = threading.Lock()
        self.live: set[str] = set()

    def setup(self, opts) -> None:
        self.crun = shutil.which("crun")
        if not self.crun:
            raise EpisodeError("crun is not installed")
        self.dir = make_tmp(TMP_PREFIX + "crun-")
        rootfs = os.path.join(self.dir, "rootfs")
        os.mkdir(rootfs)
        # One private mount namespace for every crun run, held open by a sleeping process:
        # there the host's / is bound on the rootfs, and the empty cgroup2 mount of this hybrid
        # layout is unmounted (crun refuses to start otherwise). Runs enter it with nsenter.
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount --bind / "$0" || exit 1; '
             'if mountpoint -q /sys/fs/cgroup/unified; then '
             'umount /sys/fs/cgroup/unified || exit 1; fi; echo ready; exec sleep infinity',
             rootfs], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
            preexec_fn=lambda: edgeproc._child_setup(None))
        line = self.holder.stdout.readline().strip()
        if line != b"ready":
            raise EpisodeError(f"crun: could not set up the mount namespace ({line!r})")
        subprocess.run([self.crun, "spec"], cwd=self.dir, check=True)
        with open(os.path.join(self.dir, "config.json")) as f:
            spec = json.load(f)
        os.unlink(os.path.join(self.dir, "config.json"))
        spec["root"] = {"path": rootfs, "readonly": True}
        proc = spec["process"]
        proc["args"] = [PYTHON, *PYTEST_ARGS]
        proc["terminal"] = False
        proc["cwd"] = "/work"
        spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                               "options": ["nosuid", "nodev", "mode=1777"]})
        spec["mounts"].append({"destination": "/work", "type": "bind", "source": "WORK",
                               "options": ["rbind", "rw"]})
        spec["linux"]["resources"] = {"memory": {"limit": 512 << 20}, "pids": {"limit": 256},
                                      "cpu": {"quota": 100000, "period": 100000}}
        self.spec = spec
        # Every container's cgroup under one parent (as a DSec edge puts its sandboxes under
        # dsec-INSTANCE): by default crun makes each a top-level cgroup, and on a shared host
        # 8 top-level cgroups get 8 times the CPU weight of everything else.
        self.cg_parent = f"dsec-episode-crun-{os.getpid()}"

    def pytest(self, top: str) -> tuple[int, str]:
        spec = json.loads(json.dumps(self.spec))
        spec["mounts"][-1]["source"] = os.path.join(top, "work")
        with self.lock:
            self.seq += 1
            cid = f"dsec-episode-{os.getpid()}-{self.seq}"
            self.live.add(cid)
        spec["linux"]["cgroupsPath"] = f"/{self.cg_parent}/{cid}"
        with open(os.path.join(top, "config.json"), "w") as f:
            json.dump(spec, f)
        try:
            p = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", self.crun,
                                "--cgroup-manager=cgroupfs", "run", "--bundle", top, cid],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=120)
        finally:
            with self.lock:
                self.live.discard(cid)
        return p.returncode, p.stdout.decode(errors="replace")

    def teardown(self) -> list[str]:
        left: list[str] = []
        if self.holder is not None:
            for cid in list(self.live):  # only after an interrupted run
                subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", self.crun,
                                "delete", "-f", cid], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            if self.holder.poll() is None:
                self.holder.kill()
            self.holder.wait()
        if getattr(self, "cg_parent", None):
            for d in glob.glob(f"/sys/fs/cgroup/*/{self.cg_parent}") + \
                    glob.glob(f"/sys/fs/cgroup/{self.cg_parent}"):
                try:
                    os.rmdir(d)
                except OSError as e:
                    left.append(f"cgroup {d}: {e}")
        if self.dir:
            # The bind mount lived only in the holder's namespace; it went with it.
            rootfs = os.path.join(self.dir, "rootfs")
            with open("/proc/self/mountinfo") as f:
                if any(line.split()[4] == rootfs for line in f):
                    left.append(f"mount {rootfs}")
                    return left
            shutil.rmtree(self.dir, ignore_errors=True)
        return left


class PoolArgs(DSecContainerRunArgs):
    """POST /v1/sandboxes {"pool": NAME}: the pool fixes image and limits."""

    def __init__(self, pool: str, labels: dict[str, str], ttl_s: int) -> None:
        super().__init__(labels=labels, ttl_running_stop=ttl_s)
        self.pool = pool

    def to_body(self) -> dict:
        return {"pool": self.pool, "labels": dict(self.labels or {}),
                "ttl_s": self.ttl_running_stop}


class Dsec(System):
    name = "dsec"
    workdir = "/workspace"

    def __init__(self, client_box: dict) -> None:
        self.box = client_box  # {"client", "job"} filled in once the edge runs

    def setup(self, opts) -> None:
        self.client: DSecClient = self.box["client"]
        self.args = DSecContainerRunArgs(
            container_image="host", cpu_cores_limit=1.0, memory_limit_mb=opts.memory_mb,
            disk_limit_mb=opts.disk_mb, pids_limit=256, ttl_running_stop=900,
            labels={"job": self.box["job"]})

    def pytest(self, sb) -> tuple[int, str]:
        r = sb.exec([PYTHON, *PYTEST_ARGS], cwd=self.workdir, timeout_ms=120_000)
        out = r.stdout if isinstance(r.stdout, str) else r.stdout.decode(errors="replace")
        err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode(errors="replace")
        return r.exit_code, out + err

    def episode(self) -> None:
        sb = self.client.run_container(self.args)
        try:
            w = self.workdir
            sb.write_file(f"{w}/calc.py", CALC_BUGGY)
            sb.write_file(f"{w}/test_calc.py", TEST_CALC)
            code, out = self.pytest(sb)
            check_run("first run", code, out, sb.read_file(f"{w}/junit.xml"), failed=1)
            sb.write_file(f"{w}/calc.py", CALC_FIXED)
            code, out = self.pytest(sb)
            check_run("second run", code, out, sb.read_file(f"{w}/junit.xml"), failed=0)
            if sb.read_file(f"{w}/calc.py") != CALC_FIXED.encode():
                raise EpisodeError("calc.py read back is not the fixed one")
        finally:
            sb.stop()


class DsecPool(Dsec):
    name = "dsec-pool"

    def setup(self, opts) -> None:
        super().setup(opts)
        self.pool = f"episode-{os.getpid()}"
        self.min_idle = max(opts.concurrency) + 2
        self.client.put_pool(self.pool, kind="container", image="host",
                             min_idle=self.min_idle, max=max(64, 4 * self.min_idle),
                             memory_mb=opts.memory_mb, disk_mb=opts.disk_mb)
        self.created = True
        self.args = PoolArgs(self.pool, {"job": self.box["job"]}, 900)
        self.wait_full(self.min_idle, 120)

    def wait_full(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            idle = self.client.get_pool(self.pool).get("workers", {}).get("idle", 0)
            if idle >= n:
                return
            if time.monotonic() > deadline:
                raise EpisodeError(f"container pool {self.pool} has {idle} idle sandboxes "
                                   f"after {timeout:.0f}s (want {n})")
            time.sleep(0.05)

    def before_level(self, conc: int) -> None:
        # Start every level with a full pool (as after a quiet spell between batches).
        self.wait_full(self.min_idle, 60)

    def teardown(self) -> list[str]:
        if getattr(self, "created", False):
            try:
                self.client.delete_pool(self.pool)
            except (DSecError, OSError) as e:
                return [f"pool {self.pool}: {e}"]
        return []


# -- driver -------------------------------------------------------------------------------------

STOP = threading.Event()


def run_level(system: System, conc: int, episodes: int) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    left = [episodes]
    lock = threading.Lock()

    def worker() -> None:
        while not STOP.is_set():
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            t = time.perf_counter()
            try:
                system.episode()
            except (EpisodeError, DSecError, OSError, subprocess.SubprocessError) as e:
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            except BaseException as e:  # noqa: BLE001 - a bug: count it, stop the level
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                STOP.set()
                return
            with lock:
                lat.append((time.perf_counter() - t) * 1e3)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    except KeyboardInterrupt:
        STOP.set()  # the workers finish their episode (and clean it up), then stop
        for th in threads:
            th.join()
        raise
    wall = time.perf_counter() - t0
    lat.sort()
    return {"n": len(lat), "errors": len(errors), "first_errors": errors[:3],
            "wall_s": round(wall, 3), "rate": len(lat) / wall if wall > 0 else 0.0,
            "p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99),
            "max": lat[-1] if lat else math.nan,
            "cdf": [round(pct(lat, p), 2) for p in range(101)] if lat else []}


def fmt_row(r: dict) -> str:
    return (f"{r['system']:<10} {r['concurrency']:>4} {r['round']:>5} {r['n']:>4} "
            f"{r['p50']:>8.1f} {r['p90']:>8.1f} {r['p99']:>8.1f} {r['max']:>8.1f} "
            f"{r['rate']:>8.2f} {r['errors']:>6}")


def summary(rows: list[dict]) -> str:
    out = ["", "Episode: write a project, pytest (1 failure), read junit, fix, pytest (pass), "
               "read back, destroy (ms; rate = episodes/s)",
           f"{'system':<10} {'conc':>4} {'round':>5} {'n':>4} {'p50':>8} {'p90':>8} {'p99':>8} "
           f"{'max':>8} {'rate':>8} {'errors':>6}"]
    out += [fmt_row(r) for r in rows]
    levels = sorted({r["concurrency"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    if len(systems) > 1 and "dsec" in systems:
        out += ["", "Medians over rounds, ratio to dsec (p50: dsec/peer, <1 = dsec faster; "
                    "rate: dsec/peer, >1 = dsec faster)",
                f"{'system':<10} {'conc':>4} {'p50':>8} {'rate':>8} {'p50 ratio':>10} "
                f"{'rate ratio':>10}"]
        med = {}
        for s in systems:
            for c in levels:
                rs = [r for r in rows if r["system"] == s and r["concurrency"] == c and r["n"]]
                if rs:
                    med[s, c] = (pct([r["p50"] for r in rs], 50), pct([r["rate"] for r in rs], 50))
        for c in levels:
            for s in systems:
                if (s, c) not in med:
                    continue
                p, rt = med[s, c]
                d = med.get(("dsec", c))
                ratio = (f"{d[0] / p:>10.2f} {d[1] / rt:>10.2f}" if d and p and rt else
                         f"{'-':>10} {'-':>10}")
                out.append(f"{s:<10} {c:>4} {p:>8.1f} {rt:>8.2f} {ratio}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8", help="comma-separated levels (default 1,8)")
    ap.add_argument("--episodes", type=int, default=40, help="episodes per system, level and "
                    "round (default 40)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1)")
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded episodes per system")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                    help=f"comma-separated subset of {','.join(ALL_SYSTEMS)}")
    ap.add_argument("--quick", action="store_true", help="few episodes (a smoke test)")
    ap.add_argument("--memory-mb", type=int, default=256)
    ap.add_argument("--disk-mb", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="also print JSON lines (bench/report.py)")
    ap.add_argument("--edge", default=None, help="dsec-edge binary to start")
    opts = ap.parse_args()
    opts.concurrency = [int(x) for x in opts.concurrency.split(",") if x.strip()]
    names = [x.strip() for x in opts.systems.split(",") if x.strip()]
    bad = [n for n in names if n not in ALL_SYSTEMS]
    if bad or not names:
        ap.error(f"unknown system(s) {bad}; choose from {ALL_SYSTEMS}")
    if not opts.concurrency or min(opts.concurrency) < 1 or opts.episodes < 1 or opts.rounds < 1:
        ap.error("bad --concurrency, --episodes or --rounds")
    if opts.quick:
        opts.episodes = min(opts.episodes, max(4, max(opts.concurrency)))

    edgeproc.raise_on_sigterm()
    box: dict = {"job": f"episode-{os.getpid()}"}
    makers = {"dsec": lambda: Dsec(box), "dsec-pool": lambda: DsecPool(box),
              "bwrap": Bwrap, "crun": Crun, "fork+exec": ForkExec}
    systems: list[System] = []
    edge = None
    rows: list[dict] = []
    rc = 0
    problems: list[str] = []
    try:
        if any(n.startswith("dsec") for n in names):
            edge = edgeproc.EdgeProcess(opts.edge, prefix="dsec-episode-edge-")
            edge.start()
            box["client"] = DSecClient(edge.url, token=edge.token, timeout=300.0)
        for n in names:
            s = makers[n]()
            systems.append(s)
            s.setup(opts)
            for _ in range(opts.warmup):
                s.episode()
        for rnd in range(1, opts.rounds + 1):
            for conc in opts.concurrency:
                k = (rnd - 1) % len(systems)
                for s in systems[k:] + systems[:k]:
                    print(f"episode_bench: round {rnd}/{opts.rounds}, {s.name}, {conc} at a "
                          f"time, {opts.episodes} episodes ...", file=sys.stderr, flush=True)
                    s.before_level(conc)
                    res = run_level(s, conc, opts.episodes)
                    row = {"workload": "episode", "system": s.name, "concurrency": conc,
                           "round": rnd, **res}
                    rows.append(row)
                    if opts.json:
                        print("JSON " + json.dumps(
                            {k2: (round(v, 3) if isinstance(v, float) else v)
                             for k2, v in row.items() if k2 != "first_errors"}), flush=True)
                    for e in res["first_errors"]:
                        print(f"  {s.name}: episode failed: {e}", file=sys.stderr)
                    if STOP.is_set():
                        raise RuntimeError("stopped after an unexpected error")
    except KeyboardInterrupt:
        print("\nepisode_bench: interrupted", file=sys.stderr)
        rc = 130
    except (EpisodeError, DSecError, edgeproc.EdgeError, OSError, RuntimeError,
            subprocess.SubprocessError) as e:
        print(f"episode_bench: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip cleanup
        STOP.set()
        for s in systems:
            try:
                problems += s.teardown()
            except Exception as e:  # noqa: BLE001
                problems.append(f"{s.name} teardown: {e}")
        if "client" in box:
            try:
                left = box["client"].list_sandboxes(labels={"job": box["job"]})
                if left:
                    problems.append(f"{len(left)} sandboxes of this run still on the edge")
            except (DSecError, OSError) as e:
                problems.append(f"listing sandboxes: {e}")
            box["client"].close()
        if edge is not None:
            problems += edge.stop()
        problems += [f"temp dir {d}" for d in MADE_DIRS if os.path.exists(d)]
    if rows:
        print(summary(rows))
    failed = sum(r["errors"] for r in rows)
    if failed:
        print(f"episode_bench: {failed} episode(s) FAILED", file=sys.stderr)
        rc = rc or 1
    if problems:
        print("episode_bench: LEFT BEHIND:\n" + "\n".join("  " + p for p in problems),
              file=sys.stderr)
        rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
