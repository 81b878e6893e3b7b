"""Crash and fault (issue 6): kill -9 of the edge while a create, an exec, an upload and a delete
are in flight; kill -9 of a sandbox's agent; a full state disk; the edge out of descriptors.

After each restart (edge.kill9(), edge.launch(), as tests/integration/test_edge_lifecycle.py
does for an idle edge) the state must be consistent -- every listed sandbox is running and
works, every sandbox that was being made or deleted is either fully there or fully gone (no
cgroups, processes or state-DB row of it), the state DB lists exactly what the API lists -- and
the edge serves a normal create / exec / delete.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time

import pytest

import edge_fixtures
import edge_harness
from edge_harness import Edge, wait_until
from sec_util import agent_host_pid

NO_POOLS = {"fncall_pools": False}


# ---- helpers ------------------------------------------------------------------------------

def read_to_close(s):
    """Everything the peer sends until it closes (or the socket times out or fails)."""
    reply = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            reply += d
    except OSError:
        pass
    return reply


def cgroup_ids(edge):
    """Sandbox ids that have a cgroup of this edge in any hierarchy."""
    out = set()
    for d in edge.cgroup_dirs():
        rel = edge.cgroup_rel(d)
        if rel:
            out.add(rel.split("/")[0])
    return out


def db_ids(edge):
    """Sandbox ids in the edge's state DB (read-only; WAL allows a reader beside the edge)."""
    db = sqlite3.connect(f"file:{edge.state_dir}/state.db?mode=ro", uri=True, timeout=10)
    try:
        return {row[0] for row in db.execute("SELECT id FROM sandboxes")}
    finally:
        db.close()


def listed(client):
    return {s["id"]: s for s in client.get("/v1/sandboxes?limit=1000", expect=200).json[
        "sandboxes"]}


def check_consistent(edge, known=()):
    """After a restart: every listed sandbox runs and works; each id in `known` that is not
    listed left nothing; every process and cgroup of this edge belongs to a listed sandbox; the
    state DB holds exactly the listed ids. Returns the listed ids."""
    c = edge.client()
    try:
        now = listed(c)
        for sid, rec in now.items():
            assert rec["state"] == "running", rec
            assert c.exec(sid, "echo ok")["stdout"] == "ok\n", sid
        for sid in set(known) - set(now):
            wait_until(lambda: not edge.sandbox_cgroup_dirs(sid) and not edge.sandbox_pids(sid),
                       15, what=f"{sid} (not listed) fully gone")
        tag = f"/dsec-{edge.instance}/"

        def strays():
            out = []
            for pid in edge.processes():
                try:
                    cg = pathlib.Path(f"/proc/{pid}/cgroup").read_text()
                    status = pathlib.Path(f"/proc/{pid}/status").read_text().split("\n")[:3]
                except OSError:
                    continue
                if not any(f"{tag}{sid}/" in cg or cg.rstrip().endswith(f"{tag}{sid}")
                           for sid in now):
                    out.append((pid, status, cg.strip().splitlines()[-1]))
            return out

        # A process of a torn-down sandbox may take a moment to be reaped.
        deadline = time.monotonic() + 15
        while strays() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not strays(), f"processes of no listed sandbox: {strays()}"
        for d in edge.cgroup_dirs():
            rel = edge.cgroup_rel(d)
            if rel:
                assert rel.split("/")[0] in now, f"a cgroup of no listed sandbox: {d}"
        assert edge.mounts() == [], edge.mounts()
        assert db_ids(edge) == set(now), (db_ids(edge), set(now))
        return set(now)
    finally:
        c.close()


def serves_normally(edge):
    c = edge.client()
    try:
        sid = c.create({"memory_mb": 32, "labels": {"suite": "crash-after"}})["id"]
        assert c.exec(sid, "echo alive")["stdout"] == "alive\n"
        c.delete(f"/v1/sandboxes/{sid}", expect=204)
        wait_until(lambda: not edge.sandbox_cgroup_dirs(sid), 10, what="deleted sandbox gone")
    finally:
        c.close()


# ---- kill -9 of the edge with work in flight --------------------------------------------

def test_kill9_mid_create_leaves_no_half_made_sandbox(make_edge, figure):
    """kill -9 of the edge while a create of 8 sandboxes is in flight (and while 6 more created with wait=0 are still being made): after the restart each is either running and working or entirely gone, with no cgroup, process or state-DB row left of it."""
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    result = {}

    def create():
        try:
            result["r"] = edge.client(timeout=120).post(
                "/v1/sandboxes", {"count": 8, "memory_mb": 32, "labels": {"batch": "a"}})
        except Exception as e:  # noqa: BLE001 - the edge dies under it
            result["e"] = repr(e)

    t = threading.Thread(target=create)
    t.start()
    # Kill once the first sandboxes of the batch are being set up in the kernel.
    wait_until(lambda: cgroup_ids(edge), 60, interval=0.002, what="the batch's first cgroups")
    seen = cgroup_ids(edge)
    edge.kill9()
    t.join(60)
    assert "r" not in result or result["r"].status != 201, "the batch finished before the kill"
    edge.launch()
    c = edge.client()
    ids = seen
    kept = check_consistent(edge, ids)
    figure("in-flight sandboxes seen", len(ids))
    figure("adopted after restart", edge.adopted)

    # The same with wait=0: the API answered "creating" for ids still being made.
    r = c.post("/v1/sandboxes?wait=0", {"count": 6, "memory_mb": 32, "labels": {"batch": "b"}},
               expect=201).json["sandboxes"]
    ids_b = {s["id"] for s in r}
    edge.kill9()
    edge.launch()
    kept_b = check_consistent(edge, ids_b | ids) - kept
    figure("wait=0 batch: kept / gone", f"{len(kept_b & ids_b)} / {len(ids_b - kept_b)}")
    serves_normally(edge)


def test_restart_removes_a_partly_made_cgroup_set(make_edge):
    """The states a kill -9 between the per-hierarchy cgroup mkdirs of a create (a sandbox cgroup in the memory hierarchy only) or between the rmdirs of a delete (in the pids and cpu hierarchies only) leaves, with no directory and no DB row, are removed when the edge restarts."""
    edge = make_edge(config=NO_POOLS)
    tops = {d.split("/")[-2]: d for d in edge.cgroup_dirs()
            if d.endswith(f"/dsec-{edge.instance}")}
    if not {"memory", "pids", "cpu"} <= set(tops):
        pytest.skip("no cgroup v1 memory/pids/cpu hierarchies here: no partial set to make")
    edge.kill9()
    made = [os.path.join(tops["memory"], "sb-it-partial0cg"),   # a create cut short
            os.path.join(tops["pids"], "sb-it-partial1cg"),     # a delete cut short
            os.path.join(tops["cpu"], "sb-it-partial1cg")]
    for d in made:
        os.mkdir(d)
    edge.launch()
    wait_until(lambda: not any(os.path.isdir(d) for d in made), 15,
               what="the partial cgroup sets removed")
    check_consistent(edge, {"sb-it-partial0cg", "sb-it-partial1cg"})


def test_kill9_mid_exec_kills_the_exec_and_keeps_the_sandbox(make_edge):
    """kill -9 of the edge while a long exec runs: after the restart the sandbox is adopted and works, the orphaned command is gone (no process of it anywhere), and an exec with the same request_id does not replay a half result."""
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    sid = c.create({"memory_mb": 64})["id"]
    out = {}

    def long_exec():
        try:
            out["r"] = edge.client(timeout=120).post(
                f"/v1/sandboxes/{sid}/exec",
                {"shell": "echo started > /tmp/marker; exec sleep 300", "timeout_ms": 600000,
                 "request_id": "long-1"})
        except Exception as e:  # noqa: BLE001
            out["e"] = repr(e)

    t = threading.Thread(target=long_exec)
    t.start()
    agent = agent_host_pid(edge, sid)
    wait_until(lambda: os.path.exists(f"/proc/{agent}/root/tmp/marker") and
               len(edge.sandbox_pids(sid)) >= 2, 30, interval=0.02, what="the long exec running")
    edge.kill9()
    t.join(30)
    assert "r" not in out, f"the exec answered before the kill: {out}"
    edge.launch()
    c = edge.client()
    assert edge.adopted == 1
    check_consistent(edge, {sid})
    ps = c.sh(sid, "ps -eo args")
    assert "sleep 300" not in ps, f"the orphaned exec still runs:\n{ps}"
    assert c.sh(sid, "cat /tmp/marker") == "started\n"
    # The unanswered request was never recorded: running it again runs it (not a replay).
    r = c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo again", "request_id": "long-1"})
    assert r.status in (200, 409), r
    if r.status == 200:
        assert r.json["stdout"] == "again\n", r
    serves_normally(edge)


def test_kill9_mid_upload_writes_nothing_partial(make_edge):
    """kill -9 of the edge with a 16 MiB upload half sent: after the restart the target file does not exist (no partial file, no temp file beside it), the sandbox works, and the same upload then succeeds."""
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    sid = c.create({"memory_mb": 128, "disk_mb": 256})["id"]
    c.post(f"/v1/sandboxes/{sid}/files/mkdir?path=/workspace/up", expect=(200, 201, 204))
    size = 16 << 20
    s = socket.create_connection(("127.0.0.1", edge.port), timeout=30)
    try:
        s.sendall((f"PUT /v1/sandboxes/{sid}/files?path=/workspace/up/big HTTP/1.1\r\n"
                   f"Host: x\r\nAuthorization: Bearer {edge.token}\r\n"
                   f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
                   ).encode())
        s.sendall(b"z" * (size // 2))
        time.sleep(0.2)
        edge.kill9()
    finally:
        s.close()
    edge.launch()
    c = edge.client()
    check_consistent(edge, {sid})
    assert c.sh(sid, "ls -A /workspace/up") == "", "a partial or temp file was left"
    c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/up/big", b"z" * size, expect=204)
    assert c.sh(sid, "stat -c %s /workspace/up/big") == f"{size}\n"
    serves_normally(edge)


def test_kill9_mid_delete_leaves_each_sandbox_whole_or_gone(make_edge, figure):
    """kill -9 of the edge while a job delete of 6 busy sandboxes is in flight: after the restart each is either running and working or entirely gone (no cgroup, process or state-DB row), and deleting the rest leaves nothing."""
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    made = c.post("/v1/sandboxes", {"count": 6, "memory_mb": 32, "labels": {"job": "doomed"}},
                  expect=201).json["sandboxes"]
    ids = {s["id"] for s in made}
    for sid in ids:  # something to tear down in each
        c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "for i in $(seq 40); do sleep 300 & done",
                                             "timeout_ms": 10000}, expect=200)
    done = {}

    def delete():
        try:
            done["r"] = edge.client(timeout=60).delete("/v1/jobs/doomed")
        except Exception as e:  # noqa: BLE001
            done["e"] = repr(e)

    t = threading.Thread(target=delete)
    t.start()
    # Kill as the deletes start: the first state-DB row goes before any teardown.
    wait_until(lambda: len(db_ids(edge) & ids) < len(ids), 30, interval=0.0005,
               what="the delete under way")
    edge.kill9()
    t.join(30)
    edge.launch()
    kept = check_consistent(edge, ids)
    figure("kept / gone after the kill", f"{len(kept & ids)} / {len(ids - kept)}")
    c = edge.client()
    for sid in kept & ids:
        c.delete(f"/v1/sandboxes/{sid}", expect=204)
    check_consistent(edge, ids)
    serves_normally(edge)


# ---- an agent killed ----------------------------------------------------------------------

def test_kill9_of_an_agent_fails_that_sandbox_only(make_edge):
    """kill -9 of one sandbox's agent (its PID 1) while the edge runs: that sandbox is reported failed with a reason, its calls get a 4xx, its memory is released and its delete leaves nothing; a neighbour sandbox is untouched."""
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    victim = c.create({"memory_mb": 64})["id"]
    other = c.create({"memory_mb": 64})["id"]
    pid = agent_host_pid(edge, victim)
    mem = c.get("/v1/node", expect=200).json["usage"]["memory_mb"]
    os.kill(pid, signal.SIGKILL)
    rec = wait_until(lambda: (lambda r: r if r["state"] == "failed" else None)(
        c.get(f"/v1/sandboxes/{victim}", expect=200).json), 15, what="the sandbox marked failed")
    assert rec["reason"], rec
    r = c.post(f"/v1/sandboxes/{victim}/exec", {"cmd": ["true"]})
    assert 400 <= r.status < 500, r
    wait_until(lambda: c.get("/v1/node", expect=200).json["usage"]["memory_mb"] == mem - 64,
               10, what="the failed sandbox's memory released")
    assert not edge.sandbox_pids(victim)
    assert c.exec(other, "echo fine")["stdout"] == "fine\n"
    c.delete(f"/v1/sandboxes/{victim}", expect=204)
    wait_until(lambda: not edge.sandbox_cgroup_dirs(victim), 10, what="victim cgroups gone")
    assert db_ids(edge) == {other}
    # And across a restart of the edge nothing of it comes back.
    edge.kill9()
    edge.launch()
    assert check_consistent(edge, {victim, other}) == {other}


# ---- a full state disk --------------------------------------------------------------------

class TmpfsEdge(Edge):
    """An edge whose state dir is a small tmpfs mounted by the test (not residue)."""

    def mounts(self):
        return [m for m in super().mounts() if m != str(self.state_dir)]


def fill(path):
    """Fills the filesystem of `path` with a file; returns its path."""
    f = os.path.join(path, "filler")
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return f


def test_full_state_disk_gives_errors_and_recovers(figure):
    """With the edge's state disk (a 24 MiB tmpfs) full: it stays up; a create or a patch it cannot record is refused with 503 and changes nothing; a retried request_id is answered from its record, not run again; once space returns it serves normally and a restart re-adopts exactly what it reported, with the kept records."""
    edge_fixtures._skip_if_not_runnable()
    root = tempfile.mkdtemp(prefix="dsec-sec-disk-")
    os.chmod(root, 0o755)
    state = os.path.join(root, "state")
    os.mkdir(state)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", state],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    edge = None
    try:
        # Sandbox disks stay tmpfs layers: this is about the edge's own records, and disk
        # images would be made on the tiny state filesystem.
        edge = TmpfsEdge(edge_harness.edge_binary(), root, [],
                         dict(NO_POOLS, orphan_timeout_s=600, tmpfs_disk_max_mb=1024))
        edge.launch()
        c = edge.client()
        a = c.create({"memory_mb": 64, "labels": {"disk": "before"}})["id"]
        filler = fill(state)
        statuses = {}
        made = []
        for i in range(3):
            r = c.post("/v1/sandboxes", {"memory_mb": 32, "labels": {"disk": "full"}})
            statuses.setdefault("create", []).append(r.status)
            if r.status == 201:
                made.append(r.json["id"])
        once = {"shell": "echo run >> /workspace/once; wc -l < /workspace/once",
                "request_id": "full-1"}
        for name, (method, path, body) in {
                "exec": ("POST", f"/v1/sandboxes/{a}/exec", {"shell": "echo x"}),
                "exec with request_id": ("POST", f"/v1/sandboxes/{a}/exec", once),
                "its retry": ("POST", f"/v1/sandboxes/{a}/exec", once),
                "patch": ("PATCH", f"/v1/sandboxes/{a}", {"labels": {"p": "1"}}),
                "get": ("GET", f"/v1/sandboxes/{a}", None),
                "list": ("GET", "/v1/sandboxes", None),
                "node": ("GET", "/v1/node", None),
                "upload": ("PUT", f"/v1/sandboxes/{a}/files?path=/tmp/f", b"data"),
        }.items():
            r = c.request(method, path, body)
            statuses[name] = r.status
            if name == "its retry":
                replayed = r.headers.get("idempotent-replay") == "true"
                assert r.json["stdout"] == "1\n", f"a retried request_id ran again: {r}"
        figure("answers with the disk full", statuses)
        assert edge.running(), f"the edge died on a full disk\n{edge.log_tail()}"
        # A create the state DB cannot record is refused (a restart would lose it).
        assert statuses["create"] == [503] * 3, statuses
        assert not made
        # A patch that cannot be recorded is refused and changes nothing.
        assert statuses["patch"] == 503, statuses
        assert c.get(f"/v1/sandboxes/{a}", expect=200).json["labels"] == {"disk": "before"}
        assert replayed, "the retry was not answered from the idempotency record"
        for name, st in statuses.items():
            if name != "create":
                assert st < 500 or st == 503, (name, st)
        assert db_ids(edge) == {a}
        # Space returns: it serves normally again, and the kept record reaches the state DB.
        os.unlink(filler)
        serves_normally(edge)
        assert c.exec(a, "echo back", request_id="after-1")["stdout"] == "back\n"
        c.patch(f"/v1/sandboxes/{a}", {"labels": {"p": "2"}}, expect=200)
        known = {a, *made}
        edge.kill9()
        edge.launch()
        kept = check_consistent(edge, known)
        assert kept == known, f"reported sandboxes lost across the restart: {known - kept}"
        c = edge.client()
        assert c.get(f"/v1/sandboxes/{a}", expect=200).json["labels"] == {"disk": "before",
                                                                           "p": "2"}
        r = c.post(f"/v1/sandboxes/{a}/exec", once, expect=200)
        assert r.json["stdout"] == "1\n" and r.headers.get("idempotent-replay") == "true", r
        for sid in kept:
            c.delete(f"/v1/sandboxes/{sid}", expect=204)
    finally:
        residue = {}
        if edge is not None:
            try:
                residue = edge.shutdown_and_check()
            finally:
                log = edge.log_tail(60)
                if edge.residue():
                    edge.force_clean()
        subprocess.run(["umount", "-l", state], check=False)
        shutil.rmtree(root, ignore_errors=True)
    assert not residue, f"residue: {residue}\n{log}"


# ---- out of descriptors -------------------------------------------------------------------

def edge_fds(edge):
    return len(os.listdir(f"/proc/{edge.pid}/fd"))


def nofile(pid):
    """(soft, hard) RLIMIT_NOFILE of a process, as prlimit spells them."""
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    return line.split()[3], line.split()[4]


def set_nofile(pid, soft, hard):
    # Only the soft limit moves: raising a hard limit back needs CAP_SYS_RESOURCE.
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True)


def test_out_of_descriptors_refuses_and_recovers(make_edge, figure):
    """With the edge's RLIMIT_NOFILE lowered to 40 above what it uses and 300 connections held open against it: it stays up, answers what it accepts with a success or a 503 (never another 5xx, never a half-made sandbox), refuses a new client at once with a 503 instead of leaving it in the backlog, and once the connections go it serves a normal create / exec / delete under the same limit."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    edge = make_edge(config=NO_POOLS)
    c = edge.client()
    a = c.create({"memory_mb": 64})["id"]
    c.close()
    base = edge_fds(edge)
    old_soft, hard = nofile(edge.pid)
    limit = base + 40
    set_nofile(edge.pid, limit, hard)
    socks, answers = [], {}
    try:
        req = (f"GET /v1/node HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {edge.token}\r\n"
               "\r\n").encode()
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", edge.port), timeout=10)
            s.sendall(req)
            socks.append(s)
        # Every one is answered: served (200) or refused (503), none left hanging in the backlog.
        served, refused, silent = [], 0, 0
        deadline = time.monotonic() + 5
        for s in socks:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                head = s.recv(65536)
            except (socket.timeout, OSError):
                head = b""
            if head.startswith(b"HTTP/1.1 200"):
                served.append(s)
            elif head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head:
                refused += 1
            else:
                silent += 1
        figure("connections served / refused / unanswered", f"{len(served)} / {refused} / {silent}")
        assert served, "no connection was served at all"
        assert silent == 0, f"{silent} connections got no answer (left in the listen backlog)"
        # On connections it holds: a create and an exec, with no descriptors to spare.
        for name, body, path in (("create", {"memory_mb": 32, "labels": {"fd": "1"}},
                                  "/v1/sandboxes"),
                                 ("exec", {"shell": "echo hi"}, f"/v1/sandboxes/{a}/exec")):
            data = json.dumps(body).encode()
            s = served.pop()
            s.settimeout(30)
            s.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {edge.token}"
                       f"\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                       "Connection: close\r\n\r\n").encode() + data)
            reply = read_to_close(s)
            status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None
            answers[name] = status
        # A new client is refused at once (503), not left hanging in the listen backlog.
        t = time.monotonic()
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=10)
        socks.append(s)
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = read_to_close(s)
        answers["new client"] = reply.split(b"\r\n", 1)[0].decode(errors="replace")
        answers["new client s"] = round(time.monotonic() - t, 2)
        figure("answers while out of fds", answers)
        assert edge.running(), f"the edge died out of fds\n{edge.log_tail()}"
        assert reply.startswith((b"HTTP/1.1 503", b"HTTP/1.1 200")), answers
        if reply.startswith(b"HTTP/1.1 503"):
            assert b"Retry-After: 1" in reply and b'"unavailable"' in reply, reply
        assert answers["create"] in (201, 503), answers
        assert answers["exec"] in (200, 503), answers
    finally:
        for s in socks:
            s.close()
    # Recovers under the same limit once the connections are gone.
    wait_until(lambda: edge_fds(edge) <= base + 5, 30, what="descriptors released")
    serves_normally(edge)
    c = edge.client()
    ids = set(listed(c))
    c.close()
    assert a in ids and db_ids(edge) == ids
    for sid in ids - {a}:
        assert edge.sandbox_pids(sid), f"{sid} listed but not running"
    set_nofile(edge.pid, old_soft, hard)
