"""Resource exhaustion (issue 6): bombs run inside a sandbox with small limits. Each must stay
inside the sandbox (its pids, memory, disk and cpu limits hold), be reported (the exec result
and GET /v1/sandboxes/{id}/stats), and be fully cleaned on delete (no process of it left on the
host, its cgroups gone), while a neighbour sandbox keeps serving execs."""

import json
import os
import time

import pytest

from edge_harness import pids as host_pids
from edge_harness import wait_until
from sec_util import Neighbour

MB = 1 << 20

# Small limits so every attack hits its wall within a second or two.
SMALL = {"memory_mb": 64, "pids": 32, "disk_mb": 16, "cpu": 0.5}


# ---- helpers -------------------------------------------------------------------------------

def _starttime(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _pidns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def edge_rss_kb(edge):
    for line in _read(f"/proc/{edge.pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Hostile:
    """One sandbox that an attack runs in; delete_and_check() proves nothing of it survives."""

    def __init__(self, edge, **limits):
        self.edge = edge
        self.c = edge.client()
        body = dict(SMALL, labels={"suite": "security-exhaustion"})
        body.update(limits)
        self.created = self.c.create(body)
        self.sid = self.created["id"]
        self.deleted = False

    def exec(self, shell=None, **kw):
        return self.c.exec(self.sid, shell, **kw)

    def py(self, code, *args, **kw):
        """Runs python3 code inside the sandbox."""
        return self.c.exec(self.sid, cmd=["python3", "-c", code, *map(str, args)], **kw)

    def background(self, shell):
        r = self.c.post(f"/v1/sandboxes/{self.sid}/exec", {"shell": shell, "background": True},
                        expect=202)
        return r.json["exec_id"]

    def stats(self):
        return self.c.get(f"/v1/sandboxes/{self.sid}/stats", expect=200).json

    def signal(self, sig):
        return self.c.post(f"/v1/sandboxes/{self.sid}/signal", {"signal": sig}, expect=200).json

    def wait_user_processes_gone(self, timeout=10):
        """After a KILL: only the agent is left (pids == 1)."""
        return wait_until(lambda: self.stats()["pids"] <= 1, timeout, interval=0.1,
                          what="the sandbox's user processes gone")

    def cgroup_file(self, controller, name):
        for d in self.edge.sandbox_cgroup_dirs(self.sid):
            if f"/{controller}/" in d:
                return _read(os.path.join(d, name))
        return ""

    def delete_and_check(self, figure):
        """DELETE; then no process of the sandbox is alive on the host (by pid + start time,
        by cgroup and by pid namespace) and its cgroups are gone in every hierarchy."""
        procs = {p: _starttime(p) for p in self.edge.sandbox_pids(self.sid)}
        namespaces = {_pidns(p) for p in procs} - {None}
        assert procs, "the sandbox had no process before delete (not even its agent)"
        t = time.monotonic()
        assert self.c.remove(self.sid) == 204
        self.deleted = True
        figure("delete ms", round((time.monotonic() - t) * 1000, 1))
        figure("processes killed on delete", len(procs))
        wait_until(lambda: not self.edge.sandbox_cgroup_dirs(self.sid), 10,
                   what=f"cgroups of {self.sid} removed")
        survivors = [p for p, st in procs.items() if st is not None and _starttime(p) == st]
        assert not survivors, f"processes of {self.sid} outlived its delete: {survivors}"
        stray = [p for p in host_pids()
                 if self.sid in _read(f"/proc/{p}/cgroup") or _pidns(p) in namespaces]
        assert not stray, f"host processes still in {self.sid}'s cgroups or pid ns: {stray}"

    def close(self):
        try:
            if not self.deleted:
                self.c.remove(self.sid)
        finally:
            self.c.close()


@pytest.fixture
def hostile(edge):
    made = []

    def make(**limits):
        h = Hostile(edge, **limits)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def _last_json(r):
    lines = [ln for ln in r["stdout"].splitlines() if ln.startswith("{")]
    assert lines, f"the attack printed no result: {r}"
    return json.loads(lines[-1])


# ---- pids ----------------------------------------------------------------------------------

FORK_COUNT = r"""
import errno, json, os, signal, time
n, err = 0, None
while True:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    n += 1
print(json.dumps({"forked": n, "errno": errno.errorcode.get(err, err)}), flush=True)
"""


def test_fork_bomb_stops_at_pids_max(edge, hostile, figure):
    """A fork loop whose children stay alive gets EAGAIN at the sandbox's pids limit; stats
    report that many pids, KILL through the API clears them and delete leaves nothing."""
    h = hostile(pids=32)
    with Neighbour(edge) as n:
        r = h.py(FORK_COUNT, timeout_ms=20000)
        n.check(figure)
    res = _last_json(r)
    figure("processes forked", res["forked"])
    assert res["errno"] == "EAGAIN", r
    # The agent and the python parent count too; the children are still there.
    assert 32 - 8 <= res["forked"] <= 32 - 2, res
    st = h.stats()
    figure("stats pids", st["pids"])
    assert res["forked"] < st["pids"] <= 32, st
    assert h.signal("KILL")["signaled"] >= res["forked"]
    h.wait_user_processes_gone()
    assert h.exec("echo alive")["stdout"] == "alive\n"
    h.delete_and_check(figure)


def test_shell_fork_bomb_is_contained_and_killed(edge, hostile, figure):
    """The classic bash `:(){ :|:& };:` fork bomb outlives its exec but never exceeds pids.max;
    POST /signal KILL ends it and the sandbox serves again."""
    h = hostile(pids=32, cpu=0.5)
    if h.exec("test -x /bin/bash")["exit_code"] != 0:
        pytest.skip("no /bin/bash in the host image")
    with Neighbour(edge) as n:
        # bash retries a failed fork (with back-off), so the bomb keeps pressing on pids.max
        # instead of dying out as a /bin/sh one may.
        r = h.exec(cmd=["/bin/bash", "-c", ":(){ :|:& };:"], timeout_ms=10000)
        assert not r["timed_out"], r
        seen = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            seen = max(seen, h.stats()["pids"])
            time.sleep(0.05)
        peak = int(h.cgroup_file("pids", "pids.peak").strip() or 0) or seen
        figure("pids reached", peak)
        figure("pids seen by stats", seen)
        assert 16 <= peak <= 32 and seen <= 32, f"the bomb reached {peak} pids (limit 32)"
        assert int(h.cgroup_file("pids", "pids.max").strip() or 0) == 32
        failed = int(h.cgroup_file("pids", "pids.events").split()[-1] or 0)
        figure("forks refused (pids.events max)", failed)
        assert failed > 0, "pids.max was never hit"
        assert seen > 1, "the bomb died out by itself"
        n.check(figure)
    # The bomb keeps re-forking: KILL until only the agent is left.
    deadline = time.monotonic() + 10
    while h.stats()["pids"] > 1:
        assert time.monotonic() < deadline, "the fork bomb survived KILL for 10 s"
        h.signal("KILL")
        time.sleep(0.1)
    assert h.exec("echo alive")["stdout"] == "alive\n"
    h.delete_and_check(figure)


THREADS = r"""
import json, threading, time
ev = threading.Event()
n, err = 0, None
try:
    while True:
        threading.Thread(target=ev.wait, daemon=True).start()
        n += 1
except RuntimeError as e:
    err = str(e)
print(json.dumps({"threads": n, "error": err}), flush=True)
ev.set()
"""


def test_thread_bomb_stops_at_pids_max(edge, hostile, figure):
    """Starting threads in a loop fails ("can't start new thread") at the pids limit, since
    threads count as pids; the sandbox serves again once the process exits."""
    h = hostile(pids=32)
    with Neighbour(edge) as n:
        r = h.py(THREADS, timeout_ms=20000)
        n.check(figure)
    res = _last_json(r)
    figure("threads started", res["threads"])
    assert res["error"] and "thread" in res["error"], res
    assert 32 - 8 <= res["threads"] <= 32 - 2, res
    assert h.exec("echo alive")["stdout"] == "alive\n"
    h.delete_and_check(figure)


# ---- memory --------------------------------------------------------------------------------

ANON = r"""
import sys
hold = []
while True:
    hold.append(b"x" * (1 << 20))  # touched pages, not a lazy zero mapping
    if len(hold) % 8 == 0:
        print(len(hold), flush=True)
"""


def test_anonymous_memory_bomb_is_oom_killed(edge, hostile, figure):
    """Allocating memory without bound is OOM-killed at the sandbox's memory limit: the exec
    result says oom_killed, stats count the kill and a peak within the limit, the agent lives."""
    h = hostile(memory_mb=64, disk_mb=16)
    limit = h.stats()["memory_limit"]
    assert limit == 64 * MB  # the disk is an image, not memory (issue 41 item 2)
    with Neighbour(edge) as n:
        r = h.py(ANON, timeout_ms=30000)
        n.check(figure)
    assert r["oom_killed"] is True and r["signal"] == 9 and not r["timed_out"], r
    got = int(r["stdout"].split()[-1]) if r["stdout"].split() else 0
    figure("MB allocated before the kill", got)
    assert got * MB <= limit
    st = h.stats()
    figure("memory peak MB", round(st["memory_peak"] / MB, 1))
    figure("oom kills", st["oom_kills"])
    assert st["oom_kills"] >= 1, st
    assert st["memory_peak"] <= limit, st
    assert h.exec("echo alive")["stdout"] == "alive\n"
    h.delete_and_check(figure)


MEMFD = r"""
import errno, json, os
# Many memfds of 8 MB each (one memfd alone stops at RLIMIT_FSIZE = disk_mb): shmem pages that
# no size-limited tmpfs bounds, only the memory cgroup.
chunk = b"m" * (1 << 20)
fds, written, err = [], 0, None
try:
    while written < (1 << 30):
        fd = os.memfd_create("bomb")
        fds.append(fd)
        for _ in range(8):
            written += os.write(fd, chunk)
        print(written, flush=True)
except OSError as e:
    err = errno.errorcode.get(e.errno, e.errno)
print(json.dumps({"written": written, "memfds": len(fds), "errno": err}), flush=True)
"""


def test_memfd_bomb_is_bounded_by_the_memory_limit(edge, hostile, figure):
    """Filling a memfd (shmem outside any size-limited tmpfs) is stopped at the memory limit
    (OOM kill or ENOMEM), never past it; stats report the peak within the limit."""
    h = hostile(memory_mb=64, disk_mb=16)
    limit = h.stats()["memory_limit"]
    with Neighbour(edge) as n:
        r = h.py(MEMFD, timeout_ms=30000)
        n.check(figure)
    nums = [ln for ln in r["stdout"].split() if ln.isdigit()]
    if r["oom_killed"]:
        written = int(nums[-1]) if nums else 0
        figure("outcome", "oom_killed")
    else:
        res = _last_json(r)
        written = res["written"]
        figure("outcome", res["errno"])
        assert res["errno"] in ("ENOMEM", "ENOSPC"), r
    figure("MB written to the memfd", written >> 20)
    assert written < limit, r
    st = h.stats()
    figure("memory peak MB", round(st["memory_peak"] / MB, 1))
    assert st["memory_peak"] <= limit, st
    assert h.exec("echo alive")["stdout"] == "alive\n"
    h.delete_and_check(figure)


FILL = r"""
d=$1
i=0
while err=$(head -c 4194304 /dev/zero 2>&1 > "$d/fill$i"); do i=$((i+1)); done
echo "$err" >&2
echo "files $i"
"""


def test_tmpfs_fill_of_dev_shm_and_tmp_gives_enospc(edge, hostile, figure):
    """Filling /dev/shm (the sandbox's size-limited writable layer, as is /tmp) ends in ENOSPC
    at disk_mb, not an OOM kill, even with less memory than disk: the layer is a disk image
    whose page cache is reclaimed (issue 41 item 2), so memory stays within memory_mb; rm
    frees the space."""
    h = hostile(memory_mb=32, disk_mb=48)
    with Neighbour(edge) as n:
        r = h.exec(FILL.replace("$1", "/dev/shm"), timeout_ms=30000)
        n.check(figure)
    assert not r["oom_killed"] and r["signal"] is None, r
    assert "No space left on device" in r["stderr"], r
    st = h.stats()
    figure("disk used MB", round(st["disk_used"] / MB, 1))
    figure("memory current MB", round(st["memory_current"] / MB, 1))
    assert st["disk_limit"] == 48 * MB
    assert 40 * MB <= st["disk_used"] <= st["disk_limit"], st
    assert st["oom_kills"] == 0, st
    assert st["disk_kind"] == "image" and st["memory_limit"] == 32 * MB, st
    assert st["memory_peak"] <= st["memory_limit"], st
    # /tmp is the same layer: full too.
    r2 = h.exec("head -c 65536 /dev/zero > /tmp/more")
    assert r2["exit_code"] != 0 and "No space left on device" in r2["stderr"], r2
    h.exec("rm -f /dev/shm/fill* /tmp/more")
    assert h.stats()["disk_used"] < 4 * MB
    assert h.exec("head -c 1048576 /dev/zero > /tmp/ok && echo ok")["stdout"] == "ok\n"
    h.delete_and_check(figure)


def test_disk_fill_of_the_writable_layer_gives_enospc_not_oom(edge, hostile, figure):
    """Filling /workspace and then fallocating past disk_mb gives ENOSPC, not an OOM kill,
    with memory still free for processes; the sandbox keeps working."""
    h = hostile(memory_mb=64, disk_mb=16)
    with Neighbour(edge) as n:
        r = h.exec(FILL.replace("$1", "/workspace"), timeout_ms=30000)
        r2 = h.exec("fallocate -l 8M /workspace/big")
        n.check(figure)
    assert not r["oom_killed"] and "No space left on device" in r["stderr"], r
    assert r2["exit_code"] != 0 and "No space left on device" in r2["stderr"], r2
    st = h.stats()
    figure("disk used MB", round(st["disk_used"] / MB, 1))
    assert 12 * MB <= st["disk_used"] <= st["disk_limit"] == 16 * MB, st
    assert st["oom_kills"] == 0, st
    # A 32 MB process still fits: the full disk did not eat the memory limit.
    r3 = h.py("b = b'x' * (32 << 20); print(len(b) >> 20)")
    assert r3["stdout"] == "32\n" and not r3["oom_killed"], r3
    h.delete_and_check(figure)


INODES = r"""
import errno, json, os
os.makedirs("/workspace/i", exist_ok=True)
n, err = 0, None
try:
    while n < 10_000_000:
        os.close(os.open(f"/workspace/i/{n}", os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
except OSError as e:
    err = errno.errorcode.get(e.errno, e.errno)
print(json.dumps({"files": n, "errno": err}), flush=True)
"""


def test_inode_fill_gives_enospc(edge, hostile, figure):
    """Creating empty files without bound ends in ENOSPC at the writable layer's inode limit,
    not an OOM kill and not host memory."""
    h = hostile(memory_mb=64, disk_mb=16)
    with Neighbour(edge) as n:
        r = h.py(INODES, timeout_ms=60000)
        n.check(figure)
    assert not r["oom_killed"], r
    res = _last_json(r)
    figure("files created", res["files"])
    assert res["errno"] == "ENOSPC", res
    assert res["files"] <= 16 * 256 + 4096, res
    st = h.stats()
    assert st["oom_kills"] == 0 and st["memory_peak"] <= st["memory_limit"], st
    h.delete_and_check(figure)


# ---- file descriptors and sockets -----------------------------------------------------------

FDS = r"""
import errno, json, os, sys
procs = int(sys.argv[1])
rd, wr = os.pipe()
kids = []
for _ in range(procs):
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        n, err = 0, None
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError as e:
            err = errno.errorcode.get(e.errno, e.errno)
        os.write(wr, (json.dumps({"fds": n, "errno": err}) + "\n").encode())
        os._exit(0)
    kids.append(pid)
os.close(wr)
out = b""
while True:
    b = os.read(rd, 65536)
    if not b:
        break
    out += b
status = [os.waitpid(k, 0)[1] for k in kids]
res = [json.loads(x) for x in out.decode().splitlines()]
print(json.dumps({"children": res, "killed": sum(1 for s in status if os.WIFSIGNALED(s)),
                  "nofile": __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[0]}))
"""


def _file_nr():
    return int(_read("/proc/sys/fs/file-nr").split()[0])


def test_fd_bomb_stops_at_the_per_process_limit(edge, hostile, figure):
    """Several processes opening files without bound each stop at EMFILE (or ENOMEM / OOM at
    the memory limit), never ENFILE: the host's file table is not exhausted."""
    h = hostile(memory_mb=64, pids=16, cpu=1)
    before = _file_nr()
    with Neighbour(edge) as n:
        r = h.py(FDS, 4, timeout_ms=60000)
        n.check(figure)
    res = _last_json(r)
    total = sum(c["fds"] for c in res["children"])
    figure("fds opened (all processes)", total)
    figure("RLIMIT_NOFILE", res["nofile"])
    figure("host fs.file-max", int(_read("/proc/sys/fs/file-max").split()[0]))
    for c in res["children"]:
        assert c["errno"] in ("EMFILE", "ENOMEM"), res
        assert c["fds"] <= res["nofile"], res
    assert len(res["children"]) + res["killed"] >= 4, res
    st = h.stats()
    assert st["memory_peak"] <= st["memory_limit"], st
    # The children exited: their files are closed again on the host.
    figure("host file-nr growth", _file_nr() - before)
    # (80,000 files were open: a leak would show; other activity on the host stays far below.)
    assert _file_nr() - before < 20000
    h.delete_and_check(figure)


SOCKETS = r"""
import errno, json, socket, struct, sys, time
kind, want = sys.argv[1], int(sys.argv[2])
SO_MEMINFO = 55
held, sent, err = [], 0, None
chunk = b"s" * 65536
def meminfo(s):
    v = struct.unpack("9I", s.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 36))
    return v[0] + v[5]   # rmem_alloc + wmem_queued
try:
    if kind == "tcp":
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(4096)
    for i in range(want):
        if kind == "tcp":
            a = socket.create_connection(ls.getsockname())
            b, _ = ls.accept()
        elif kind == "udp":
            b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            b.bind(("127.0.0.1", 0))
            a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            a.connect(b.getsockname())
        else:
            a, b = socket.socketpair()
        held.append((a, b))
        a.setblocking(False)
        for _ in range(64):
            try:
                sent += a.send(chunk[:60000] if kind == "udp" else chunk)
            except (BlockingIOError, ConnectionRefusedError):
                break
except OSError as e:
    err = errno.errorcode.get(e.errno, e.errno)
queued = sum(meminfo(a) + meminfo(b) for a, b in held)
with open("/tmp/sockets.json", "w") as f:
    f.write(json.dumps({"sockets": 2 * len(held), "sent": sent, "queued": queued, "errno": err}))
time.sleep(600)  # hold the sockets (and their buffers) until killed
"""


PAIRS = 600


def _sockstat_pages(proto):
    for line in _read("/proc/net/sockstat").splitlines():
        if line.startswith(proto + ":"):
            f = line.split()
            return int(f[f.index("mem") + 1]) if "mem" in f else 0
    return 0


@pytest.mark.parametrize("kind", ["tcp", "udp", "unix"])
def test_socket_bomb_buffers_are_bounded_by_the_memory_limit(edge, hostile, figure, kind):
    """600 loopback socket pairs with full, never-read buffers hold no more host memory than
    the sandbox's memory limit (TCP: plus the kernel's one forced segment per connection)."""
    h = hostile(memory_mb=64, disk_mb=16, pids=16, cpu=1)
    limit = h.stats()["memory_limit"]
    proto = {"tcp": "TCP", "udp": "UDP", "unix": None}[kind]
    before = _sockstat_pages(proto) if proto else 0
    with Neighbour(edge) as n:
        eid = h.c.post(f"/v1/sandboxes/{h.sid}/exec",
                       {"cmd": ["python3", "-c", SOCKETS, kind, str(PAIRS)], "background": True},
                       expect=202).json["exec_id"]
        res_r = None

        def filled():
            nonlocal res_r
            st = h.c.get(f"/v1/sandboxes/{h.sid}/execs/{eid}", expect=200).json
            if st["state"] != "running":
                res_r = st.get("result") or st
                return True
            return h.exec("cat /tmp/sockets.json 2>/dev/null")["stdout"]

        out = wait_until(filled, 60, interval=0.2, what="the socket bomb to fill its buffers")
        grew = (_sockstat_pages(proto) - before) * 4096 if proto else 0
        st = h.stats()
        n.check(figure)
    # The kernel lets a TCP socket whose receive queue is empty take one segment even past its
    # memory cgroup's limit (tcp_data_queue's forced charge; cgroup v2 alike): measured ~70 KB
    # per loopback connection here. Anything beyond limit + that is memory not charged at all
    # (before the v1 tcp accounting was switched on: 2 GB for these 600 connections).
    allowance = limit + (PAIRS * 96 * 1024 if kind == "tcp" else 0)
    if res_r is None:
        res = json.loads(out)
        figure("sockets", res["sockets"])
        figure("bytes queued in socket buffers MB", round(res["queued"] / MB, 1))
        # SO_MEMINFO counts a loopback TCP segment at both ends (the sender keeps it until
        # acked): up to twice what is held.
        assert res["queued"] <= 2 * allowance, res
    else:
        # It ended by itself: only an OOM kill of the bomb is acceptable.
        assert res_r["oom_killed"], res_r
        figure("outcome", "oom_killed")
    if proto:
        figure("host socket memory growth MB", round(grew / MB, 1))
    figure("sandbox memory peak MB", round(st["memory_peak"] / MB, 1))
    # sockstat's "mem" is the kernel's own count of pages held by TCP / UDP sockets host-wide.
    assert grew <= allowance, f"{kind} buffers took {grew >> 20} MB of host memory; the " \
                              f"sandbox's limit is {limit >> 20} MB"
    assert st["memory_peak"] <= limit, st
    h.signal("KILL")
    h.wait_user_processes_gone()
    h.delete_and_check(figure)


# ---- cpu -----------------------------------------------------------------------------------

def test_busy_loops_get_no_more_than_the_cpu_quota(edge, hostile, figure):
    """Four busy loops in a sandbox with cpu 0.25 get about 0.25 cores over 3 s (stats
    cpu_time against wall time), are throttled by the CFS quota, and the neighbour stays fast."""
    h = hostile(cpu=0.25, pids=16)
    with Neighbour(edge) as n:
        h.background("for i in 1 2 3 4; do (while :; do :; done) & done; wait")
        time.sleep(0.5)
        t0, c0 = time.monotonic(), h.stats()["cpu_time_ms"]
        thr0 = h.cgroup_file("cpu", "cpu.stat")
        time.sleep(3)
        t1, c1 = time.monotonic(), h.stats()["cpu_time_ms"]
        thr1 = h.cgroup_file("cpu", "cpu.stat")
        n.check(figure)
    cores = (c1 - c0) / ((t1 - t0) * 1000)
    figure("cores used (cap 0.25)", round(cores, 3))

    def throttled(text):
        for line in text.splitlines():
            if line.startswith("nr_throttled"):
                return int(line.split()[1])
        return 0

    figure("periods throttled", throttled(thr1) - throttled(thr0))
    assert 0.05 <= cores <= 0.25 * 1.2 + 0.02, f"busy loops got {cores:.2f} cores (cap 0.25)"
    assert throttled(thr1) > throttled(thr0)
    assert h.signal("KILL")["signaled"] >= 4
    h.wait_user_processes_gone()
    h.delete_and_check(figure)


# ---- signals and escapees ------------------------------------------------------------------

def test_process_ignoring_sigterm_is_killed_at_its_timeout(edge, hostile, figure):
    """A command that ignores SIGTERM still ends at its timeout_ms (timed_out, killed) with no
    process left; a background one survives /signal TERM but not KILL."""
    h = hostile()
    t = time.monotonic()
    r = h.exec("trap '' TERM INT HUP; while :; do sleep 0.05; done", timeout_ms=1000)
    took = time.monotonic() - t
    figure("exec returned after s (timeout 1 s)", round(took, 2))
    assert r["timed_out"] is True and r["signal"] == 9, r
    assert took < 10, r
    assert h.stats()["pids"] == 1, "the SIGTERM-ignoring command outlived its timeout"
    code = "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n" \
           "    signal.signal(s, signal.SIG_IGN)\nopen('/tmp/ignoring', 'w').close()\n" \
           "while True: time.sleep(1)\n"
    h.c.post(f"/v1/sandboxes/{h.sid}/exec", {"cmd": ["python3", "-c", code], "background": True},
             expect=202)
    wait_until(lambda: h.exec("test -e /tmp/ignoring && echo y")["stdout"], 10,
               what="the background ignorer running")
    assert h.signal("TERM")["signaled"] >= 1
    time.sleep(0.3)
    assert h.stats()["pids"] >= 2, "the SIGTERM-ignoring process died of TERM?"
    h.signal("KILL")
    h.wait_user_processes_gone()
    h.delete_and_check(figure)


def test_kill_right_after_a_background_exec_leaves_nothing(edge, hostile, figure):
    """POST /signal KILL sent right after a background exec was accepted (202) kills that
    command too: in 40 tries no process survives (none slips by while joining its cgroup)."""
    h = hostile()
    survived = []
    for i in range(40):
        h.c.post(f"/v1/sandboxes/{h.sid}/exec", {"cmd": ["sleep", "100"], "background": True},
                 expect=202)
        h.signal("KILL")
        try:
            wait_until(lambda: h.stats()["pids"] <= 1, 1.0, interval=0.05)
        except AssertionError:
            survived.append(i)
            h.signal("KILL")
            h.wait_user_processes_gone()
    figure("tries survived by the command", f"{len(survived)}/40")
    assert not survived, f"a KILL right after the exec missed it in tries {survived}"
    h.delete_and_check(figure)


ESCAPE = r"""
setsid sh -c 'trap "" HUP TERM; exec sleep 1001' </dev/null >/dev/null 2>&1 &
( sh -c 'sleep 1002 & echo $! > /tmp/grandchild' & )
python3 - <<'EOF'
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        os.execvp("sleep", ["sleep", "1003"])
    os._exit(0)
EOF
sleep 1004 &
echo launched
"""


def test_double_fork_and_setsid_escapees_stay_inside_and_die_on_delete(edge, hostile, figure):
    """Background processes that double-fork, setsid and ignore SIGTERM/SIGHUP (one still
    holding the exec's stdout) let the exec return, stay in the sandbox's cgroups and pid
    namespace, and are all gone after delete."""
    h = hostile(pids=32)
    t = time.monotonic()
    r = h.exec(ESCAPE, timeout_ms=20000)
    figure("exec returned after ms", round((time.monotonic() - t) * 1000))
    assert r["exit_code"] == 0 and "launched" in r["stdout"] and not r["timed_out"], r
    inside = h.exec("ps -eo args")["stdout"]
    for n in ("1001", "1002", "1003", "1004"):
        assert f"sleep {n}" in inside, f"escapee sleep {n} not running: {inside}"
    agent_ns = {_pidns(p) for p in h.edge.sandbox_pids(h.sid)}
    found = [p for p in h.edge.sandbox_pids(h.sid)
             if b"sleep\x00100" in _read_bytes(f"/proc/{p}/cmdline")]
    figure("escapees found", len(found))
    assert len(found) == 4, found
    assert len(agent_ns) == 1, f"sandbox processes in several pid namespaces: {agent_ns}"
    # Every process in the host's process table that runs these commands is in the sandbox.
    outside = [p for p in host_pids()
               if b"sleep\x00100" in _read_bytes(f"/proc/{p}/cmdline") and p not in found
               and _pidns(p) in agent_ns]
    assert not outside, outside
    assert h.stats()["pids"] >= 5
    h.delete_and_check(figure)


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


# ---- output floods -------------------------------------------------------------------------

@pytest.mark.parametrize("flood", [
    pytest.param("yes", id="lines"),
    pytest.param("yes | tr -d '\\n'", id="no-newlines"),
    pytest.param("yes >&2", id="stderr"),
])
def test_output_flood_is_truncated_at_max_output_bytes(edge, hostile, figure, flood):
    """A `yes` flood (lines, one endless line, or on stderr) returns at most max_output_bytes,
    marked truncated, and the edge's memory stays bounded."""
    h = hostile(cpu=1)
    cap = 1 << 20
    rss0 = edge_rss_kb(edge)
    with Neighbour(edge) as n:
        t = time.monotonic()
        r = h.exec(flood, timeout_ms=1500, max_output_bytes=cap)
        took = time.monotonic() - t
        n.check(figure)
    stream = "stderr" if ">&2" in flood else "stdout"
    other = "stdout" if stream == "stderr" else "stderr"
    got = len(r[stream].encode())
    figure("bytes returned", got)
    figure("exec s", round(took, 2))
    figure("edge RSS growth MB", round((edge_rss_kb(edge) - rss0) / 1024, 1))
    assert r[f"{stream}_truncated"] is True, {k: v for k, v in r.items() if k != stream}
    assert cap // 2 <= got <= cap, got
    assert set(r[stream][:1000]) <= set("y\n"), r[stream][:100]
    assert not r[f"{other}_truncated"]
    assert took < 15
    assert edge_rss_kb(edge) - rss0 < 64 * 1024, "the edge's memory grew with the flood"
    assert h.stats()["pids"] == 1, "the flooding command outlived its exec"


def test_a_timed_out_exec_returns_only_once_its_processes_are_gone(edge, hostile, figure):
    """A command killed at its timeout while the sandbox is CPU-throttled (half a CPU, a `yes`
    flood under `sh`) is gone, reaped and uncounted when its exec returns, every time: a
    throttled process acts on its SIGKILL only in the next quota period, so the agent waits for
    the exec's cgroup to empty before it answers."""
    h = hostile(cpu=0.5)
    left = []
    for i in range(15):
        r = h.exec("yes", timeout_ms=300, max_output_bytes=1 << 20)
        assert r["timed_out"], r
        pids = h.stats()["pids"]
        if pids != 1:
            left.append((i, pids))
    figure("execs", 15)
    figure("execs that left a process behind", len(left))
    assert not left, f"(run, pids) right after a timed-out exec returned: {left}"
    h.delete_and_check(figure)
