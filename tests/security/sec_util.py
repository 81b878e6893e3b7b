"""Helpers for the adversarial cases: the probe program, a neighbour whose exec latency is
measured while an attack runs, and small waits."""

import json
import os
import pathlib
import statistics
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def probe_binary():
    """The static dsec-probe (tests/testdata/probe.cc): DSEC_PROBE_BIN, else next to the edge
    binary's build tree."""
    p = os.environ.get("DSEC_PROBE_BIN")
    if p:
        return pathlib.Path(p)
    edge = os.environ.get("DSEC_EDGE_BIN", str(REPO / "build/release/src/edge/dsec-edge"))
    return pathlib.Path(edge).resolve().parents[2] / "tests" / "dsec-probe"


def int80_signal_on_host():
    """The signal that ends the probe's int 0x80 getpid on the host, with no filter at all:
    None where the i386 entry works, SIGSEGV where the kernel (ia32 emulation off, or a
    hypervisor's) faults on int 0x80 before any seccomp filter could run."""
    import subprocess  # noqa: PLC0415
    r = subprocess.run([str(probe_binary()), "getpid", "int80"], capture_output=True,
                       timeout=30, check=False)
    return -r.returncode if r.returncode < 0 else None


def agent_host_pid(edge, sid):
    """The host pid of the sandbox's PID 1 (dsec-agent)."""
    for pid in edge.sandbox_pids(sid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:") and line.split()[-1] == "1":
                        return pid
        except OSError:
            pass
    raise AssertionError(f"no agent process found for {sid}")


def install_probe(client, sid, path="/tmp/dsec-probe"):
    """Uploads dsec-probe into the sandbox (mode 0755) and returns its path there."""
    data = probe_binary().read_bytes()
    client.put(f"/v1/sandboxes/{sid}/files?path={path}&mode=0755", data,
               headers={"Content-Type": "application/octet-stream"}, expect=204)
    return path


def probe(client, sid, *attempts, path="/tmp/dsec-probe", **fields):
    """Runs the probe's named attempts; returns {name: "allowed" | "blocked ERRNO"}."""
    r = client.exec(sid, cmd=[path, *attempts], **fields)
    out = {}
    for line in r["stdout"].splitlines():
        name, _, verdict = line.partition(" ")
        out[name] = verdict
    missing = set(attempts) - set(out)
    assert not missing, f"probe gave no verdict for {missing}: {r}"
    return out


class Neighbour:
    """A second sandbox that runs `true` in a loop while an attack runs elsewhere; the latency
    of each exec is kept. Use as a context manager; `p50`/`max` after it exits."""

    def __init__(self, edge, interval=0.05):
        self.client = edge.client()
        self.interval = interval
        self.latencies = []
        self.errors = []
        self._stop = threading.Event()
        self.sid = self.client.create({"labels": {"suite": "security-neighbour"}})["id"]
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        c = self.client
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                r = c.exec(self.sid, cmd=["true"], timeout_ms=30000)
                if r["exit_code"] != 0:
                    self.errors.append(r)
            except Exception as e:  # noqa: BLE001 - any failure is a finding
                self.errors.append(repr(e))
            self.latencies.append((time.monotonic() - t) * 1000)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)
        try:
            self.client.remove(self.sid)
        finally:
            self.client.close()
        return False

    @property
    def p50(self):
        return statistics.median(self.latencies) if self.latencies else float("nan")

    @property
    def max(self):
        return max(self.latencies) if self.latencies else float("nan")

    def check(self, figure, name="neighbour exec", limit_ms=5000):
        """Records the neighbour's latency figures and asserts it kept serving."""
        assert self.latencies, "the neighbour ran no exec during the attack"
        figure(f"{name} errors", len(self.errors))
        assert not self.errors, f"the neighbour's execs failed: {self.errors[:3]}"
        figure(f"{name} p50 ms", round(self.p50, 1))
        figure(f"{name} max ms", round(self.max, 1))
        assert self.max < limit_ms, f"the neighbour stalled: max exec {self.max:.0f} ms"


def tty_attach_output(edge, sid, cmd="tty"):
    """Runs `cmd` through a tty attach (a real pty from the sandbox's devpts); its output."""
    import edge_harness  # noqa: PLC0415
    status, _, ws = edge_harness.WebSocket.connect(
        "127.0.0.1", edge.port, f"/v1/sandboxes/{sid}/attach?cmd={cmd}&tty=1", token=edge.token)
    assert status == 101, ws
    out = b""
    try:
        ws.sock.settimeout(20)
        while True:
            op, payload = ws.recv()
            if op == 0x2:
                out += payload
            elif op != 0x1 or "exit" in json.loads(payload) or "error" in json.loads(payload):
                break
    finally:
        ws.close()
    return out.decode(errors="replace")
