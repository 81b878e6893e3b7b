"""Start a private dsec-edge for a demo or benchmark, and take it down without leaving a trace.

Shared by examples/rl_episodes.py, bench/api_bench.py and bench/density_bench.py::

    with EdgeProcess(max_sandboxes=2000) as edge:      # temp state dir, token, socket, port
        client = AsyncDSecClient(edge.url, token=edge.token)
        ...
    print(edge.cleanup_report)                          # [] when nothing was left behind

The edge listens on 127.0.0.1 with a port the kernel picks (``--listen 127.0.0.1:0``; the ready
line says which). Its state dir, token file, unix socket and log live in one temp dir that is
removed on exit. It runs in its own session (a Ctrl-C on the terminal reaches only the driver,
which then stops the edge in order) and gets SIGTERM if the driver dies (PR_SET_PDEATHSIG).
Stopping it sends SIGTERM (the edge destroys every sandbox and its parent cgroups) and then
checks that no cgroup, process, mount or state entry of this edge is left.

Also here, so the scripts that start edges share one copy: percentiles and the SDK path.
Needs root (the edge does).
"""

from __future__ import annotations

import ctypes
import glob
import json
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDK = os.path.join(REPO, "sdk", "python")
DEFAULT_EDGE = os.path.join(REPO, "build", "release", "src", "edge", "dsec-edge")


def use_sdk() -> None:
    """Make ``import libdsec`` work from the source tree (no pip install needed)."""
    if SDK not in sys.path:
        sys.path.insert(0, SDK)


class EdgeError(RuntimeError):
    pass


def _child_setup(nofile: int | None) -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if nofile:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:  # raising the hard limit needs CAP_SYS_RESOURCE; else stop at it
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, max(hard, nofile)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))


class EdgeProcess:
    """One dsec-edge in a temp dir. Use as a context manager, or start()/stop()."""

    def __init__(self, binary: str | None = None, *, max_sandboxes: int | None = None,
                 memory_overcommit: float | None = None, log_level: str = "warn",
                 extra_args: list[str] | None = None, ready_timeout: float = 60.0,
                 stop_timeout: float = 300.0, prefix: str = "dsec-edge-",
                 workdir: str | None = None, nofile: int | None = None) -> None:
        self.binary = binary or os.environ.get("DSEC_EDGE") or DEFAULT_EDGE
        self.max_sandboxes = max_sandboxes
        self.memory_overcommit = memory_overcommit
        self.log_level = log_level
        self.extra_args = list(extra_args or [])
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.prefix = prefix
        self.given_workdir = workdir
        self.nofile = nofile  # the edge's soft RLIMIT_NOFILE (None: inherit ours)
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.sandbox_fusion_url = ""  # with --sandbox-fusion-listen
        self.token = ""
        self.socket = ""
        self.instance = ""
        self.ready_line = ""
        self.cleanup_report: list[str] | None = None  # set by stop(): what was left behind
        self.stop_seconds = 0.0
        self.exit_code: int | None = None

    # -- paths ---------------------------------------------------------------

    @property
    def state_dir(self) -> str:
        return os.path.join(self.dir or "", "state")

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir or "", "edge.log")

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    # -- start ---------------------------------------------------------------

    def start(self) -> "EdgeProcess":
        if os.geteuid() != 0:
            raise EdgeError("dsec-edge needs root (run with sudo)")
        if not os.access(self.binary, os.X_OK):
            raise EdgeError(f"{self.binary} not found: run scripts/build release first")
        if self.given_workdir:
            os.makedirs(self.given_workdir, mode=0o700, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix=self.prefix, dir=self.given_workdir)
        else:
            self.dir = tempfile.mkdtemp(prefix=self.prefix)
        self.socket = os.path.join(self.dir, "edge.sock")
        token_file = os.path.join(self.dir, "token")
        argv = [self.binary, "--listen", "127.0.0.1:0", "--socket", self.socket,
                "--state-dir", self.state_dir, "--token-file", token_file,
                "--log-level", self.log_level]
        if self.max_sandboxes is not None:
            argv += ["--max-sandboxes", str(self.max_sandboxes)]
        if self.memory_overcommit is not None:
            argv += ["--memory-overcommit", str(self.memory_overcommit)]
        argv += self.extra_args
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, start_new_session=True,
                                         preexec_fn=lambda: _child_setup(self.nofile),
                                         close_fds=True)
        except BaseException:
            log.close()
            self.stop()
            raise
        log.close()
        # For a wrapper script's trap, should this process be killed before it can stop the edge.
        with open(os.path.join(self.dir, "edge.pid"), "w") as f:
            f.write(f"{self.proc.pid}\n")
        try:
            self.ready_line = self._wait_ready()
            fields = dict(f.split("=", 1) for f in self.ready_line.split()[2:] if "=" in f)
            self.url = fields.get("url", "")
            self.sandbox_fusion_url = fields.get("sandbox_fusion", "")
            if not self.url:
                raise EdgeError(f"no url in the ready line: {self.ready_line!r}")
            with open(token_file) as f:
                self.token = next((ln.strip() for ln in f if ln.strip()), "")
            self.instance = str(self.get("/v1/node").get("instance", ""))
        except BaseException:
            self.stop()
            raise
        # Drain stdout so the edge can never block on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _wait_ready(self) -> str:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.ready_timeout
        buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EdgeError(f"dsec-edge not ready after {self.ready_timeout:.0f}s"
                                f"\n{self.log_tail()}")
            r, _, _ = select.select([fd], [], [], min(left, 0.5))
            if r:
                data = os.read(fd, 4096)
                if not data:
                    code = self.proc.wait()
                    raise EdgeError(f"dsec-edge exited with {code} before it was ready"
                                    f"\n{self.log_tail()}")
                buf += data
                for line in buf.split(b"\n")[:-1]:
                    text = line.decode(errors="replace")
                    if text.startswith("dsec-edge ready "):
                        return text
            elif self.proc.poll() is not None:
                raise EdgeError(f"dsec-edge exited with {self.proc.returncode} before it was"
                                f" ready\n{self.log_tail()}")

    def _drain(self) -> None:
        try:
            assert self.proc and self.proc.stdout
            while self.proc.stdout.read(4096):
                pass
        except (OSError, ValueError):
            pass

    # -- while running -------------------------------------------------------

    def get(self, path: str, timeout: float = 30.0):
        """GET a JSON endpoint with the token (plain urllib: no SDK needed)."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def rss_kb(self) -> int:
        """The edge's resident memory (VmRSS, kB)."""
        return proc_status_kb(self.pid, "VmRSS")

    def threads(self) -> int:
        return proc_status_kb(self.pid, "Threads")

    def nofile_limit(self) -> int:
        """The edge's soft RLIMIT_NOFILE as it runs (-1 if unknown)."""
        try:
            with open(f"/proc/{self.pid}/limits") as f:
                for line in f:
                    if line.startswith("Max open files"):
                        v = line.split()[3]
                        return -1 if v == "unlimited" else int(v)
        except (OSError, ValueError, IndexError):
            pass
        return -1

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def cgroup_dirs(self) -> list[str]:
        """This edge's parent cgroups (one per hierarchy; v1 hybrids have several)."""
        if not self.instance:
            return []
        name = "dsec-" + self.instance
        return sorted(set(glob.glob(f"/sys/fs/cgroup/{name}") +
                          glob.glob(f"/sys/fs/cgroup/*/{name}")))

    def cgroup_memory_bytes(self) -> int:
        """Memory charged to all sandboxes (the parent memory cgroup), -1 if unknown."""
        for d in self.cgroup_dirs():
            for f in ("memory.current", "memory.usage_in_bytes"):
                try:
                    with open(os.path.join(d, f)) as fh:
                        return int(fh.read())
                except (OSError, ValueError):
                    continue
        return -1

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no edge log)"
        return "\n".join("  edge: " + ln for ln in text) or "  (edge log is empty)"

    # -- stop ----------------------------------------------------------------

    def stop(self) -> list[str]:
        """SIGTERM the edge, wait, check that nothing is left, remove the temp dir.
        Returns (and keeps in cleanup_report) a list of what was left behind."""
        if self.cleanup_report is not None:
            return self.cleanup_report
        if threading.current_thread() is threading.main_thread():
            # A second Ctrl-C while the edge shuts down must not skip the leftover check.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        problems: list[str] = []
        t0 = time.monotonic()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    problems.append(f"dsec-edge did not stop within {self.stop_timeout:.0f}s"
                                    " of SIGTERM; killed it")
                    self.proc.kill()
                    self.proc.wait()
            self.exit_code = self.proc.returncode
            if self.exit_code not in (0, None):
                problems.append(f"dsec-edge exited with {self.exit_code}")
            if self.proc.stdout:
                self.proc.stdout.close()
        self.stop_seconds = time.monotonic() - t0
        problems += self.leftovers()
        if problems and self.dir:
            problems.append("edge log tail:\n" + self.log_tail())
        if self.dir and not os.environ.get("DSEC_KEEP_EDGE_DIR"):  # keep it for debugging
            if any(p.startswith("mount ") for p in problems):
                problems.append(f"left {self.dir} in place (mounts inside)")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
                if os.path.exists(self.dir):
                    problems.append(f"could not remove {self.dir}")
        self.cleanup_report = problems
        return problems

    def leftovers(self) -> list[str]:
        """Everything of this edge still on the host after it stopped."""
        out: list[str] = []
        vm_parents = []  # the microVM backend's ("dsec-<instance>-vm")
        if self.instance:
            vm = f"dsec-{self.instance}-vm"
            vm_parents = glob.glob(f"/sys/fs/cgroup/{vm}") + glob.glob(f"/sys/fs/cgroup/*/{vm}")
        for d in sorted(set(self.cgroup_dirs() + vm_parents)):
            out.append(f"cgroup {d}")
        if self.instance:
            tag = "dsec-" + self.instance
            for p in glob.glob("/proc/[0-9]*/cgroup"):
                try:
                    with open(p) as f:
                        if tag in f.read():
                            out.append(f"process {p.split('/')[2]} in {tag}")
                except OSError:
                    continue
        if self.dir:
            try:
                with open("/proc/self/mountinfo") as f:
                    for line in f:
                        mp = line.split()[4]
                        if mp == self.dir or mp.startswith(self.dir + "/"):
                            out.append(f"mount {mp}")
            except OSError:
                pass
            sb_dir = os.path.join(self.state_dir, "sandboxes")
            if os.path.isdir(sb_dir) and os.listdir(sb_dir):
                out.append(f"{len(os.listdir(sb_dir))} entries in {sb_dir}")
        return out

    def __enter__(self) -> "EdgeProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def proc_status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def meminfo_kb() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def percentile(values, p: float) -> float:
    """Linear-interpolated percentile (p in 0..100); nan for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def raise_on_sigterm() -> None:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so `with EdgeProcess()` cleans up."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)
