"""Node-wide budgets (issue 20): one sandbox, at default limits, must not be able to use up
anything the whole node shares — the host's file table, the per-user counts the kernel keeps
for a user namespace's owner (pending signals, message queues, inotify instances), the node's
pseudo-terminals, process ids and AIO events, socket memory, host uids — so that a neighbour's
commands and creates, and the host's own root, keep working while it tries. Every case runs
the attack for real inside a sandbox and measures a neighbour during it."""

import json
import os
import subprocess
import sys
import time

import pytest

from edge_harness import wait_until
from sec_util import Neighbour, tty_attach_output

MB = 1 << 20


def _last_json(r):
    lines = [ln for ln in r["stdout"].splitlines() if ln.startswith("{")]
    assert lines, f"the attack printed no result: {r}"
    return json.loads(lines[-1])


def _read(path):
    with open(path) as f:
        return f.read()


def _file_nr():
    return int(_read("/proc/sys/fs/file-nr").split()[0])


def _budgets(client):
    return client.get("/v1/node", expect=200).json["capacity"]["budgets"]


# ---- 1. the host's open-file table ---------------------------------------------------------

FILES = r"""
import errno, json, os, sys, time
procs, per = int(sys.argv[1]), int(sys.argv[2])
r, w = os.pipe()
kids = []
for i in range(procs):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        n, err = 0, "none"
        try:
            while n < per:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError as e:
            err = errno.errorcode.get(e.errno, str(e.errno))
        os.write(w, (json.dumps({"fds": n, "errno": err}) + "\n").encode())
        time.sleep(float(sys.argv[3]))
        os._exit(0)
    kids.append(pid)
os.close(w)
res = [json.loads(l) for l in os.fdopen(r).read().splitlines() if l]
killed = 0
for p in kids:
    _, st = os.waitpid(p, 0)
    killed += os.WIFSIGNALED(st)
print(json.dumps({"children": res, "killed": killed}))
"""


def test_open_file_table_is_bounded_by_memory_not_a_node_count(edge, client, figure):
    """A sandbox opening /dev/null in 128 processes (2.56 M files, more than a stock host's
    fs.file-max) is stopped only by its own limits (EMFILE, ENOMEM or an OOM kill within its
    memory limit), never ENFILE: the edge raised fs.file-max so that the memory cgroup (which
    the kernel charges each file to) is the bound, and a neighbour's execs and a new create
    succeed while the files are held."""
    b = _budgets(client)
    figure("node fs.file-max", b["file_max"])
    assert b["file_max"] >= 1 << 40, b
    sb = client.create({"memory_mb": 1024, "pids": 160, "labels": {"suite": "budgets"}})["id"]
    try:
        before = _file_nr()
        with Neighbour(edge) as n:
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", FILES, "128", "20000", "6"],
                              "background": True, "timeout_ms": 120000}, expect=202)
            eid = bg.json["exec_id"]
            peak = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                peak = max(peak, _file_nr() - before)
                st = client.get(f"/v1/sandboxes/{sb}/execs/{eid}", expect=200).json
                if st.get("state") != "running" or peak > 2_000_000:
                    break
                time.sleep(0.2)
            # While the files are held: a create and the neighbour's execs still work.
            other = client.create({"labels": {"suite": "budgets"}})["id"]
            assert client.exec(other, shell="echo ok")["stdout"] == "ok\n"
            client.remove(other)
            done = client.get(f"/v1/sandboxes/{sb}/execs/{eid}?wait_ms=60000", expect=200).json
            n.check(figure)
        res = _last_json(done["result"])
        opened = sum(c["fds"] for c in res["children"])
        figure("files opened in the sandbox", opened)
        figure("host file-nr peak growth", peak)
        for c in res["children"]:
            assert c["errno"] in ("none", "EMFILE", "ENOMEM"), res
        st = client.get(f"/v1/sandboxes/{sb}/stats", expect=200).json
        assert st["memory_peak"] <= st["memory_limit"], st
        figure("sandbox memory peak MB", round(st["memory_peak"] / MB, 1))
        # The attack got past a stock host's table size (or was stopped by memory first).
        assert opened >= 2_000_000 or res["killed"] or any(
            c["errno"] == "ENOMEM" for c in res["children"]), res
    finally:
        client.remove(sb)


# ---- 2. budgets charged to the owner of the sandbox's user namespace -----------------------

OWNER_BUDGETS = r"""
import ctypes, errno, json, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class sigval(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
class mq_attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
def err():
    return errno.errorcode.get(ctypes.get_errno(), "?")
res = {}
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n = 0
while n < 1000000:
    if libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)) != 0:
        res["sigqueue"] = err(); break
    n += 1
res["signals"] = n
timers = 0
class sigevent(ctypes.Structure):
    _fields_ = [("value", sigval), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_int * 12)]
ev = sigevent(sigval(0), signal.SIGRTMIN + 1, 0)
tid = ctypes.c_void_p()
while timers < 100000 and libc.timer_create(1, ctypes.byref(ev), ctypes.byref(tid)) == 0:
    timers += 1
res["timers"] = timers
q = 0
while q < 10000:
    a = mq_attr(0, 10, 8192, 0)
    if libc.mq_open(b"/q%d" % q, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
        res["mq_open"] = err(); break
    q += 1
res["mqueues"] = q
i = 0
while i < 100000:
    if libc.inotify_init() < 0:
        res["inotify_init"] = err(); break
    i += 1
res["inotify"] = i
print(json.dumps(res), flush=True)
# Hold it, and take back at once whatever other processes of this sandbox free (a probe that
# exits gives back its signal and timer): the sandbox stays exhausted while the test looks.
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    while libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)) == 0:
        pass
    while libc.timer_create(1, ctypes.byref(ev), ctypes.byref(tid)) == 0:
        pass
    while libc.mq_open(b"/q%d" % q, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) >= 0:
        q += 1
    while libc.inotify_init() >= 0:
        pass
    time.sleep(0.02)
"""

CHECK_BUDGETS = r"""
import ctypes, errno, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
class sigval(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
def err():
    return errno.errorcode.get(ctypes.get_errno(), "?")
r = {}
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
r["sigqueue"] = "ok" if libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)) == 0 else err()
tid = ctypes.c_void_p()
r["timer_create"] = "ok" if libc.timer_create(1, None, ctypes.byref(tid)) == 0 else err()
name = b"/dsec-check-%d" % os.getpid()
r["mq_open"] = "ok" if libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0 else err()
libc.mq_unlink(name)
r["inotify_init"] = "ok" if libc.inotify_init() >= 0 else err()
print(json.dumps(r))
"""


@pytest.mark.parametrize("user", ["sandbox", "root"])
def test_owner_charged_budgets_are_per_sandbox(edge, client, figure, user):
    """Pending signals, POSIX timers, message queues and inotify instances, used up from
    inside a sandbox until the kernel refuses (EAGAIN/EMFILE), stay that sandbox's own: a
    neighbour sandbox and host root (the edge's uid) can still sigqueue, timer_create,
    mq_open and inotify_init, because each sandbox's user namespace has an owner of its own
    (a uid of its own range, not root) that the kernel charges these budgets to."""
    sb = client.create({"labels": {"suite": "budgets"}})["id"]
    try:
        with Neighbour(edge) as n:
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", OWNER_BUDGETS, "60"], "user": user,
                              "background": True, "timeout_ms": 120000}, expect=202)
            eid = bg.json["exec_id"]
            # The attack holds everything it got until its exec ends; probe its own sandbox
            # until the kernel refuses there.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                probe = client.exec(sb, cmd=["python3", "-c", CHECK_BUDGETS], user=user)
                if probe["stdout"] and '"ok"' not in probe["stdout"]:
                    break
                time.sleep(0.5)
            # The attacker's own sandbox is exhausted (the attack worked) ...
            own = json.loads(probe["stdout"])
            assert own["sigqueue"] == "EAGAIN" and own["timer_create"] == "EAGAIN", own
            assert own["mq_open"] in ("EMFILE", "ENOSPC") and own["inotify_init"] == "EMFILE", own
            # ... its neighbour and the host are not.
            neighbour = json.loads(
                n.client.exec(n.sid, cmd=["python3", "-c", CHECK_BUDGETS], user=user)["stdout"])
            host = json.loads(subprocess.run([sys.executable, "-c", CHECK_BUDGETS],
                                             capture_output=True, text=True,
                                             check=True).stdout)
            n.check(figure)
        figure("attacker's own budgets", own)
        assert neighbour == {k: "ok" for k in neighbour}, neighbour
        assert host == {k: "ok" for k in host}, host
        client.delete(f"/v1/sandboxes/{sb}/execs/{eid}", expect=204)
    finally:
        client.remove(sb)


SECUREBITS = "import ctypes; print(ctypes.CDLL(None).prctl(27, 0, 0, 0, 0))"  # PR_GET_SECUREBITS


@pytest.mark.parametrize("user", ["sandbox", "root"])
def test_no_securebits_reach_the_sandbox(client, sandbox, user):
    """The launcher clones a sandbox with the namespace owner's uid and SECBIT_NO_SETUID_FIXUP
    on its own thread; none of that reaches the agent or user code (securebits 0), so a uid or
    fsuid change inside drops capabilities as usual."""
    r = client.exec(sandbox, cmd=["python3", "-c", SECUREBITS], user=user)
    assert r["stdout"] == "0\n", r


# ---- 3. pseudo-terminals -------------------------------------------------------------------

PTYS = r"""
import errno, json, os, sys, time
fds, err = [], None
try:
    for i in range(int(sys.argv[1])):
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({"ptys": len(fds), "errno": err}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_ptys_are_bounded_per_sandbox(edge, client, figure):
    """Opening /dev/ptmx 5,000 times inside a sandbox stops at its own devpts maximum
    (ENOSPC), far below the node's kernel.pty.max; while it holds them, a neighbour's tty
    attach (a real pty through the WebSocket) and one on the host still get a terminal."""
    b = _budgets(client)
    figure("node kernel.pty.max", b["pty_max"])
    figure("pty per sandbox", b["pty_per_sandbox"])
    assert b["pty_max"] - int(_read("/proc/sys/kernel/pty/reserve")) >= \
        b["pty_per_sandbox"] * 4096, b
    sb = client.create({"labels": {"suite": "budgets"}})["id"]
    try:
        with Neighbour(edge) as n:
            nr = int(_read("/proc/sys/kernel/pty/nr"))
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", PTYS, "5000", "8"],
                              "background": True, "timeout_ms": 60000}, expect=202)
            eid = bg.json["exec_id"]
            wait_until(lambda: int(_read("/proc/sys/kernel/pty/nr")) >= nr + 200, 30,
                       what="the sandbox to hold its ptys")
            # While it holds them: the neighbour's tty attach and the host get a pty.
            assert "/dev/pts/" in tty_attach_output(edge, n.sid)
            os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
            held = int(_read("/proc/sys/kernel/pty/nr")) - nr
            n.check(figure)
        done = client.get(f"/v1/sandboxes/{sb}/execs/{eid}?wait_ms=30000", expect=200).json
        res = _last_json(done["result"])
        figure("ptys the attacker got", res["ptys"])
        figure("node ptys in use during the attack (growth)", held)
        assert res["ptys"] <= b["pty_per_sandbox"] and res["errno"] == "ENOSPC", res
    finally:
        client.remove(sb)


# ---- 4. process ids ------------------------------------------------------------------------

FORKS = r"""
import json, os, sys, time
n = 0
try:
    while n < int(sys.argv[1]):
        if os.fork() == 0:
            time.sleep(float(sys.argv[2]))
            os._exit(0)
        n += 1
except OSError as e:
    pass
print(json.dumps({"forked": n}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_all_sandboxes_together_stay_inside_the_pids_budget(make_edge, figure):
    """The parent cgroup of all sandboxes has a pids limit that leaves a reserve of pid_max and
    threads-max to the host (here, an edge whose budget is made small: 300 processes): three
    sandboxes at their own limit of 256 fork without bound, together never pass 300, the host
    can still fork, and a pids limit above the whole budget is 422 at create."""
    threads_max = int(_read("/proc/sys/kernel/threads-max"))
    pid_max = int(_read("/proc/sys/kernel/pid_max"))
    e = make_edge(config={"reserve_pids": min(threads_max, max(pid_max, 4 << 20)) - 300})
    c = e.client()
    b = _budgets(c)
    assert b["sandbox_pids"] == 300 or b["sandbox_pids"] <= 300, b
    figure("sandbox pids budget", b["sandbox_pids"])
    r = c.post("/v1/sandboxes", {"pids": b["sandbox_pids"] + 1}, expect=422)
    assert "pids" in r.json["error"]["message"], r.json
    sbs = [c.create({"pids": 256, "memory_mb": 256})["id"] for _ in range(3)]
    n = Neighbour(e).__enter__()
    try:
        for sb in sbs:
            c.post(f"/v1/sandboxes/{sb}/exec", {"cmd": ["python3", "-c", FORKS, "400", "20"],
                                                "background": True, "timeout_ms": 60000},
                   expect=202)
        parent = [d for d in e.cgroup_dirs() if d.endswith(f"dsec-{e.instance}")
                  and ("/pids/" in d or "unified" not in d)]
        total = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            total = max(total, sum(c.get(f"/v1/sandboxes/{sb}/stats", expect=200).json["pids"]
                                   for sb in sbs))
            time.sleep(0.5)
        figure("processes of all sandboxes (peak)", total)
        # The neighbour's execs fork too: within the budget they may fail (EAGAIN) while the
        # attackers hold it all; what is recorded is that the edge kept answering them.
        n.__exit__(None, None, None)
        figure("neighbour exec p50 ms", round(n.p50, 1))
        figure("neighbour exec errors (its forks share the budget)", len(n.errors))
        assert total <= b["sandbox_pids"], total
        assert total >= b["sandbox_pids"] - 30, f"the attack did not reach the budget: {total}"
        # The host forks fine meanwhile.
        assert subprocess.run(["true"]).returncode == 0
        figure("parent cgroup", parent[0] if parent else "?")
    finally:
        n.__exit__(None, None, None)
        for sb in sbs:
            c.remove(sb)
        c.close()


# ---- 8. two edges on one host ---------------------------------------------------------------

PIPES = r"""
import fcntl, json, os, sys, time
F_GETPIPE_SZ = 1032
held = []
for i in range(int(sys.argv[1])):
    held.append(os.pipe())
r, w = os.pipe()
print(json.dumps({"pipes": len(held), "new_pipe_size": fcntl.fcntl(w, F_GETPIPE_SZ)}), flush=True)
time.sleep(float(sys.argv[2]))
"""


def _host_uid(edge, sid):
    pid = max(edge.sandbox_pids(sid))
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_two_edges_never_share_host_uids(make_edge, figure):
    """Two edges on one host lease user-namespace uid ranges from one host-wide lock file, so
    their sandboxes never get the same host uids: the sandbox user of one edge's sandbox using
    up the per-user pipe-buffer budget (1,100 pipes, past pipe-user-pages-soft) leaves the
    other edge's sandbox user with full-size (64 KiB) pipes."""
    # Two fresh edges: each one's first sandbox (the same first range, before leases).
    edge, other = make_edge(), make_edge()
    a_client, b_client = edge.client(), other.client()
    a = a_client.create({"labels": {"suite": "budgets"}})["id"]
    b = b_client.create({"labels": {"suite": "budgets"}})["id"]
    try:
        ids = set()
        for e, cl, sid in ((edge, a_client, a), (other, b_client, b)):
            cl.exec(sid, shell="sleep 30 &")
            ids.add(_host_uid(e, sid))
        figure("host uids of the two sandbox users", sorted(ids))
        assert len(ids) == 2, ids
        with Neighbour(other) as n:
            a_client.post(f"/v1/sandboxes/{a}/exec",
                          {"cmd": ["python3", "-c", PIPES, "1100", "30"], "background": True,
                           "timeout_ms": 60000}, expect=202)
            # The attack holds its 1,100 pipes until its exec ends; wait until it has them.
            wait_until(lambda: _last_json(a_client.exec(
                a, cmd=["python3", "-c", PIPES, "0", "0"]))["new_pipe_size"] < 65536, 20,
                what="the attacker's pipes")
            own = _last_json(a_client.exec(a, cmd=["python3", "-c", PIPES, "0", "0"]))
            theirs = _last_json(b_client.exec(b, cmd=["python3", "-c", PIPES, "0", "0"]))
            n.check(figure, "other edge's neighbour exec")
        figure("new pipe size in the attacker's sandbox", own["new_pipe_size"])
        figure("new pipe size in the other edge's sandbox", theirs["new_pipe_size"])
        assert own["new_pipe_size"] < 65536, own  # the attack did use up its own budget
        assert theirs["new_pipe_size"] == 65536, theirs
    finally:
        a_client.remove(a)
        b_client.remove(b)
        a_client.close()
        b_client.close()


# ---- 5. socket buffer memory ---------------------------------------------------------------

TCP_FLOOD = r"""
import errno, json, socket, sys, time
want, hold = int(sys.argv[1]), float(sys.argv[2])
listeners = []
for _ in range(2):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4096)
    listeners.append(ls)
held, sent, err = [], 0, None
chunk = b"s" * (1 << 20)
try:
    for i in range(want):
        ls = listeners[i % 2]
        a = socket.create_connection(ls.getsockname())
        held.append(a)
        if i % 2:  # half are accepted (and never read), half wait in the accept queue
            held.append(ls.accept()[0])
        a.setblocking(False)
        while True:
            try:
                sent += a.send(chunk)
            except BlockingIOError:
                break
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({"connections": len(held), "sent_mb": sent >> 20, "errno": err}), flush=True)
time.sleep(hold)
"""


def _tcp_mem_pages():
    for line in _read("/proc/net/sockstat").splitlines():
        if line.startswith("TCP:"):
            f = line.split()
            return int(f[f.index("mem") + 1])
    return 0


def _download_s(client, sid, size):
    t = time.monotonic()
    r = client.get(f"/v1/sandboxes/{sid}/files?path=/workspace/blob", expect=200)
    assert len(r.body) == size
    return time.monotonic() - t


def test_socket_memory_is_bounded_and_the_hosts_tcp_is_not_pressured(edge, client, figure):
    """Tens of thousands of never-read loopback TCP connections (half never accepted), each
    filled until it blocks, in a sandbox with a 768 MB limit: socket() is refused (EPERM) at
    the sandbox's socket budget, the host's TCP memory (/proc/net/sockstat) stays below the
    kernel's pressure threshold (net.ipv4.tcp_mem[1]), and a neighbour's 20 MB download
    through the API is not slowed down."""
    feats = client.get("/v1/node", expect=200).json["features"]
    if not feats.get("socket_budget"):
        pytest.skip(f"no socket budget on this node: {feats.get('socket_budget_reason')}")
    pressure = int(_read("/proc/sys/net/ipv4/tcp_mem").split()[1])
    size = 20 * MB
    nb = client.create({"labels": {"suite": "budgets"}})["id"]
    sb = client.create({"memory_mb": 512, "disk_mb": 256, "labels": {"suite": "budgets"}})["id"]
    try:
        client.sh(nb, f"head -c {size} /dev/urandom > /workspace/blob")
        base = sorted(_download_s(client, nb, size) for _ in range(3))[1]
        before = _tcp_mem_pages()
        with Neighbour(edge) as n:
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", TCP_FLOOD, "20000", "6"],
                              "background": True, "timeout_ms": 120000}, expect=202)
            eid = bg.json["exec_id"]
            peak, during = 0, []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                peak = max(peak, _tcp_mem_pages())
                st = client.get(f"/v1/sandboxes/{sb}/execs/{eid}", expect=200).json
                if st["state"] != "running":
                    break
                if peak - before > 1000:
                    during.append(_download_s(client, nb, size))
                time.sleep(0.2)
            n.check(figure)
        res = _last_json(st["result"])
        figure("attacker connections held", res["connections"])
        figure("attacker MB queued", res["sent_mb"])
        figure("host TCP memory peak MB", round(peak * 4096 / MB, 1))
        figure("host TCP pressure threshold MB", round(pressure * 4096 / MB, 1))
        figure("neighbour 20 MB download s (before)", round(base, 3))
        if during:
            figure("neighbour 20 MB download s (during, median)",
                   round(sorted(during)[len(during) // 2], 3))
        assert res["errno"] == "EPERM", res
        assert peak < pressure, f"host TCP reached pressure: {peak} >= {pressure} pages"
        if during:
            assert sorted(during)[len(during) // 2] < max(3 * base, base + 1.0), (base, during)
    finally:
        client.remove(sb)
        client.remove(nb)


# ---- 6. the host image's secrets, whenever they appeared -----------------------------------

READ_ALL = r"""
import errno, json, sys
out = {}
for p in sys.argv[1:]:
    try:
        with open(p, "rb") as f:
            out[p] = "read " + f.read().decode(errors="replace")
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def test_host_files_made_private_later_stay_private(edge, client, figure, tmp_path):
    """Files of the host image's allowlisted dirs that become private after the edge built its
    mask — a 0600 file created in a subdirectory of /opt and of /usr/local/share, an existing
    file chmod-ed to 0600, a 0644 file in a directory chmod-ed to 0700 — are unreadable (EACCES)
    by root inside and by the sandbox user, in a sandbox that was running when they changed
    and in one created afterwards. The host's own files have owners the sandbox's user
    namespace does not map, so root inside reads only what any unprivileged host user can."""
    import secrets as _secrets  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    tag = "dsec-t-" + _secrets.token_hex(4)
    roots = [f"/opt/{tag}", f"/usr/local/share/{tag}"]
    for r in roots:
        os.makedirs(f"{r}/sub", mode=0o755)
        with open(f"{r}/public.txt", "w") as f:
            f.write("public")
        os.chmod(f"{r}/public.txt", 0o644)
    sb = client.create({"labels": {"suite": "budgets"}})["id"]
    try:
        paths = []
        running = client.exec(sb, cmd=["python3", "-c", READ_ALL, f"{roots[0]}/public.txt"],
                              user="root")
        assert "read public" in running["stdout"], running  # visible before the change
        for r in roots:
            with open(f"{r}/sub/secret.txt", "w") as f:
                f.write("SECRET")
            os.chmod(f"{r}/sub/secret.txt", 0o600)
            os.chmod(f"{r}/public.txt", 0o600)
            os.makedirs(f"{r}/private", mode=0o755)
            with open(f"{r}/private/in-dir.txt", "w") as f:
                f.write("SECRET")
            os.chmod(f"{r}/private/in-dir.txt", 0o644)
            os.chmod(f"{r}/private", 0o700)
            paths += [f"{r}/sub/secret.txt", f"{r}/public.txt", f"{r}/private/in-dir.txt"]
        fresh = client.create({"labels": {"suite": "budgets"}})["id"]
        try:
            with Neighbour(edge) as n:
                for sid, when in ((sb, "running"), (fresh, "new")):
                    for user in ("root", "sandbox"):
                        got = json.loads(client.exec(sid, cmd=["python3", "-c", READ_ALL,
                                                               *paths], user=user)["stdout"])
                        leaked = {p: v for p, v in got.items() if v.startswith("read")}
                        assert not leaked, f"{when} sandbox, {user}: {leaked}"
                        assert set(got.values()) <= {"EACCES", "ENOENT"}, got
                n.check(figure)
            figure("private host files tried", len(paths))
        finally:
            client.remove(fresh)
    finally:
        client.remove(sb)
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)


# ---- 7. snapshots and forks of sparse files; setuid files made inside ----------------------

def _du_bytes(path):
    out = subprocess.run(["du", "-sb", "--apparent-size", path], capture_output=True, text=True)
    used = subprocess.run(["du", "-sB1", path], capture_output=True, text=True)
    return int(out.stdout.split()[0]), int(used.stdout.split()[0])


def test_snapshot_and_forks_of_sparse_files_keep_holes(edge, client, make_edge, figure):
    """A sandbox holding 600 MB of sparse files (a few bytes of data) and a setuid-root file
    made by root inside is snapshotted and forked twice: the capture reads only the data (the
    sandbox is frozen for well under a second, not the seconds that gigabytes of zeros took),
    the image store grows by megabytes, not gigabytes, a sandbox made from the snapshot sees
    the same files with the same sizes and bytes, and the setuid bit did not reach the layer.
    A capture whose files add up to more than image_max_layer_bytes counting holes (what an
    EROFS copy of the layer has to read) is refused at once (413)."""
    # A 1 GiB writable layer (a tmpfs: only data is charged), files up to its size.
    sb = client.create({"memory_mb": 256, "disk_mb": 1024, "labels": {"suite": "budgets"}})["id"]
    made = []
    store = os.path.join(edge.state_dir, "images")
    tag = "sparse-" + os.urandom(3).hex()
    try:
        client.sh(sb, "cd /workspace && truncate -s 200M a b c && printf middle | "
                      "dd of=b bs=1 seek=150000000 conv=notrunc status=none && "
                      "cp /bin/true suid && chmod 4755 suid", user="root")
        _, used_before = _du_bytes(store)
        with Neighbour(edge) as n:
            t = time.monotonic()
            client.post(f"/v1/sandboxes/{sb}/snapshot", {"image": f"{tag}:1"}, expect=201)
            snap_s = time.monotonic() - t
            forks = client.post(f"/v1/sandboxes/{sb}/fork", {"count": 2}, expect=201).json
            made += [f["id"] for f in forks["sandboxes"]]
            n.check(figure)
        apparent, used_after = _du_bytes(store)
        figure("snapshot s (600 MB sparse)", round(snap_s, 2))
        figure("image store growth (snapshot + 2 forks) KB",
               round((used_after - used_before) / 1024, 1))
        assert used_after - used_before < 64 * MB, (used_before, used_after)
        assert snap_s < 5, snap_s
        new = client.create({"image": f"{tag}:1", "disk_mb": 1024,
                             "labels": {"suite": "budgets"}})["id"]
        made.append(new)
        for sid in (new, made[0]):
            out = client.sh(sid, "cd /workspace && stat -c '%n %s %a' a b c suid && "
                                 "dd if=b bs=1 skip=150000000 count=6 status=none; echo")
            lines = out.split("\n")
            assert lines[:3] == [f"{x} {200 << 20} 644" for x in "abc"], out
            assert lines[3] == "suid " + lines[3].split()[1] + " 755", out  # no setuid bit
            assert lines[4] == "middle", out
        # Asked for, the bit is kept.
        client.post(f"/v1/sandboxes/{sb}/snapshot", {"image": f"{tag}:2", "keep_setuid": True},
                    expect=201)
        kept = client.create({"image": f"{tag}:2", "disk_mb": 1024,
                              "labels": {"suite": "budgets"}})["id"]
        made.append(kept)
        assert client.sh(kept, "stat -c %a /workspace/suid").strip() == "4755"
    finally:
        for sid in made + [sb]:
            client.remove(sid)
        for t in ("1", "2"):
            client.delete(f"/v1/images/{tag}:{t}", expect=(204, 404))
    small = make_edge(config={"image_max_layer_bytes": 1 << 30})
    c = small.client()
    sb = c.create({"memory_mb": 256, "disk_mb": 1024})["id"]
    try:
        c.sh(sb, "truncate -s 700M /workspace/x /workspace/y")
        t = time.monotonic()
        r = c.post(f"/v1/sandboxes/{sb}/snapshot", {"image": "toobig:1"}, expect=413)
        figure("oversized capture refused in s", round(time.monotonic() - t, 3))
        assert "holes" in r.json["error"]["message"], r.json
        assert c.sh(sb, "echo alive") == "alive\n"
    finally:
        c.remove(sb)
        c.close()


# ---- 9. edge memory from buffered output ---------------------------------------------------

def _rss_mb(pid, key="VmRSS:"):
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return 0.0


def test_background_output_floods_are_bounded_and_memory_returns(make_edge, figure):
    """48 background execs in 4 sandboxes each flood 8 MiB of output (their per-exec cap). A
    background exec's output is kept by the sandbox's agent, in the sandbox's own memory (all of
    a sandbox's background execs together up to a quarter of its memory, at most 64 MiB), never
    in the edge: each 256 MiB sandbox keeps 64 MiB, what did not fit is marked truncated, the
    edge's memory grows only by what its reads pass through, and once the sandboxes are deleted
    the edge's RSS falls back near where it started."""
    e = make_edge(config={"output_memory_mb": 128})
    c = e.client()
    sbs = [c.create({"memory_mb": 256})["id"] for _ in range(4)]
    base = _rss_mb(e.pid)
    peak = base
    try:
        with Neighbour(e) as n:
            eids = []
            for sb in sbs:
                for _ in range(12):
                    eids.append((sb, c.post(f"/v1/sandboxes/{sb}/exec",
                                            {"shell": "yes | head -c 9000000",
                                             "max_output_bytes": 8 << 20, "background": True,
                                             "timeout_ms": 60000}, expect=202).json["exec_id"]))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                peak = max(peak, _rss_mb(e.pid))
                # (404: the agent forgot it, a finished job past 3/4 of the bound, oldest first,
                # when a later one started: jobs finish before the last starts on a slow host)
                states = [r.json["state"] if r.status == 200 else "exited"
                          for r in (c.get(f"/v1/sandboxes/{sb}/execs/{x}", expect=(200, 404))
                                    for sb, x in eids[::6])]
                if all(s == "exited" for s in states):
                    break
                time.sleep(0.2)
            peak = max(peak, _rss_mb(e.pid, "VmHWM:"))
            n.check(figure)
        figure("edge RSS MB before", round(base, 1))
        figure("edge RSS MB peak", round(peak, 1))
        kept, cut, forgotten = 0, 0, 0
        for sb, x in eids:
            got = c.get(f"/v1/sandboxes/{sb}/execs/{x}?wait_ms=60000", expect=(200, 404))
            if got.status == 404:  # dropped by the same bound (see above)
                forgotten += 1
                continue
            r = got.json["result"]
            kept += len(r["stdout"])
            # Cut below its own 8 MiB cap: the budget's doing (and then marked truncated).
            if len(r["stdout"]) < 8 << 20:
                cut += 1
                assert r["stdout_truncated"], {k: v for k, v in r.items() if k != "stdout"}
        figure("output kept MB (48 x 8 MiB asked)", round(kept / MB, 1))
        figure("results cut by the budget", cut)
        figure("results forgotten by the budget", forgotten)
        assert kept <= 4 * 64 * MB, kept
        assert cut + forgotten >= 16, (cut, forgotten)
        assert peak - base < 160, (base, peak)
    finally:
        for sb in sbs:
            c.remove(sb)
    wait_until(lambda: _rss_mb(e.pid) < base + 64, 20, what="the edge's memory back")
    figure("edge RSS MB after delete", round(_rss_mb(e.pid), 1))
    c.close()


# ---- graders -------------------------------------------------------------------------------

TAMPERER = r"""
import os, signal, time
me = os.getpid()
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
            if b"GRADE-ME" not in cmd:
                continue
            with open(f"/proc/{p}/mem", "r+b"):
                pass
            with open("/tmp/tampered", "a") as f:
                f.write(f"opened /proc/{p}/mem\n")
            os.kill(int(p), signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.01)
"""

GRADE = "import os, sys, time; time.sleep(1); print('GRADED', os.getuid(), " \
        "'AGENT_VAR' in os.environ, sys.argv[1])"


def test_grader_exec_runs_clear_of_what_the_agent_left(client, figure):
    """An agent leaves a process behind (as the sandbox user) that opens /proc/PID/mem of
    every new process of its uid and kills it: a normal exec of the grading command is found
    and killed. With "grader": true every process in the sandbox is killed first and the
    command runs as uid 65533 with a clean environment (none of the sandbox's env): it runs
    to its end untouched, and the agent's background exec and shell session are gone."""
    sb = client.create({"env": {"AGENT_VAR": "1"}, "labels": {"suite": "budgets"}})["id"]
    try:
        client.post(f"/v1/sandboxes/{sb}/exec", {"cmd": ["python3", "-c", TAMPERER],
                                                 "background": True, "timeout_ms": 0},
                    expect=202)
        shell = client.post(f"/v1/sandboxes/{sb}/shells", {}, expect=201).json["shell_id"]
        client.post(f"/v1/sandboxes/{sb}/shells/{shell}/run",
                    {"command": "sleep 600 &", "timeout_ms": 5000}, expect=200)
        time.sleep(0.5)
        plain = client.exec(sb, cmd=["python3", "-c", GRADE, "GRADE-ME"], timeout_ms=20000)
        figure("plain exec of the grader", f"exit {plain['exit_code']} signal {plain['signal']}")
        assert plain["signal"] == 9, plain  # the tamperer got it
        r = client.exec(sb, cmd=["python3", "-c", GRADE, "GRADE-ME"], grader=True,
                        timeout_ms=20000)
        assert r["exit_code"] == 0, r
        assert r["stdout"] == "GRADED 65533 False GRADE-ME\n", r
        tampered = client.exec(sb, shell="cat /tmp/tampered")["stdout"]
        figure("tamper attempts logged", tampered.count("opened"))
        assert tampered.count("opened") == 1, tampered  # only the plain exec's
        ps = client.exec(sb, shell="ps -eo user:12,args | grep -v 'ps -eo' | sed 1d")["stdout"]
        assert "TAMPER" not in ps and "sleep 600" not in ps and "python3" not in ps, ps
        assert client.post(f"/v1/sandboxes/{sb}/exec", {"cmd": ["true"], "grader": True,
                                                        "user": "root"}, expect=400)
    finally:
        client.remove(sb)


# ---- 11. smaller ---------------------------------------------------------------------------

SHM = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
ids = []
for _ in range(int(sys.argv[1])):
    i = libc.shmget(IPC_PRIVATE, 8 << 20, IPC_CREAT | 0o600)
    addr = libc.shmat(i, None, 0)
    ctypes.memset(addr, 1, 8 << 20)  # pages charged now
    ids.append(i)
print(json.dumps({"segments": ids}))
"""


def test_sysv_shm_goes_with_its_last_user(edge, client, figure):
    """Eight 8 MiB SysV shared memory segments, attached, filled and left by a process that
    exits: they do not outlive it (kernel.shm_rmid_forced is on in the sandbox's ipc
    namespace), so the sandbox's memory comes back at once instead of at delete."""
    sb = client.create({"labels": {"suite": "budgets"}})["id"]
    try:
        before = client.get(f"/v1/sandboxes/{sb}/stats", expect=200).json["memory_current"]
        with Neighbour(edge) as n:
            r = client.exec(sb, cmd=["python3", "-c", SHM, "8"])
            n.check(figure)
        assert r["exit_code"] == 0, r
        left = client.exec(sb, shell="cat /proc/sysvipc/shm | sed 1d | wc -l")["stdout"].strip()
        after = client.get(f"/v1/sandboxes/{sb}/stats", expect=200).json["memory_current"]
        figure("segments left after exit", int(left))
        figure("memory growth MB", round((after - before) / MB, 1))
        assert left == "0"
        assert after - before < 32 * MB, (before, after)
    finally:
        client.remove(sb)


HASH = "print(hash('dsec-hash-probe'))"


def test_fncall_workers_share_a_hash_secret_only_for_a_bounded_number_of_calls(make_edge,
                                                                                 figure):
    """Calls forked from one warm fncall worker share its interpreter's hash secret (str hashes
    and set order repeat); with fncall_worker_max_calls 3 a worker is replaced after its third
    call, so a fourth call sees a new secret. Pool workers also count toward the node's
    admission, and idle ones give way to explicit creates: a node with max_sandboxes 4 whose
    pools hold workers admits 4 creates (the pools shrink) and refuses the fifth; the node
    never holds more than 4 sandboxes, pools included."""
    e = make_edge(config={"fncall_worker_max_calls": 3, "fncall_min_idle": 1, "fncall_max": 1,
                          "max_sandboxes": 4})
    c = e.client()
    try:
        seen = []
        for _ in range(7):
            r = c.post("/v1/fncalls", {"runtime": "python", "code": HASH}, expect=200).json
            seen.append((r["stdout"].strip(), r.get("worker", "")))
        hashes = [h for h, _ in seen]
        figure("hashes of 7 calls", hashes)
        assert len(set(hashes[:3])) == 1 and hashes[3] != hashes[0], hashes
        assert hashes[3:6] == [hashes[3]] * 3 and hashes[6] != hashes[3], hashes
        pooled = sum(p["workers"]["idle"] + p["workers"]["busy"] + p["workers"]["starting"]
                     for p in c.get("/v1/pools", expect=200).json["pools"]
                     if p.get("kind", "fncall") == "fncall")
        figure("fncall workers alive", pooled)
        made = []
        try:
            while True:
                r = c.post("/v1/sandboxes", {"memory_mb": 64})
                if r.status != 201:
                    break
                made.append(r.json["id"])
            assert r.status == 429, r
            assert "pools" in r.json["error"]["message"], r.json
            figure("creates admitted beside the pools", len(made))
            # (a refill asking for admission counts as "starting" until refused: not a sandbox)
            pooled_now = sum(p["workers"]["idle"] + p["workers"]["busy"]
                             for p in c.get("/v1/pools", expect=200).json["pools"]
                             if p.get("kind", "fncall") == "fncall")
            figure("fncall workers alive beside them", pooled_now)
            assert len(made) == 4 and len(made) + pooled_now <= 4, (made, pooled, pooled_now)
        finally:
            for sid in made:
                c.remove(sid)
    finally:
        c.close()


# ---- 10. the edge's own descriptors --------------------------------------------------------

def test_edge_admits_only_what_its_open_file_limit_holds(make_edge, figure, tmp_path):
    """An edge whose RLIMIT_NOFILE is only 1,000 (hard, so it cannot raise it) computes how many
    sandboxes that holds at 4 descriptors each and answers the create past it with 429
    over_capacity naming the limit, never an EMFILE in the middle of a create (503); every
    admitted sandbox works and the edge keeps serving."""
    import edge_harness  # noqa: PLC0415
    wrapper = tmp_path / "edge-nofile-1000"
    wrapper.write_text(f"#!/bin/sh\nexec prlimit --nofile=1000:1000 "
                       f"{edge_harness.edge_binary()} \"$@\"\n")
    wrapper.chmod(0o755)
    e = make_edge(config={"fncall_pools": False})
    e.stop()
    e.binary = wrapper
    e.launch()
    c = e.client()
    made = []
    n = Neighbour(e).__enter__()  # one of the admitted sandboxes
    try:
        cap = c.get("/v1/node", expect=200).json["capacity"]
        figure("edge RLIMIT_NOFILE", cap["edge_nofile"])
        figure("sandboxes it admits", cap["edge_max_sandboxes"])
        assert cap["edge_nofile"] == 1000 and 0 < cap["edge_max_sandboxes"] < 200, cap
        while len(made) < 400:
            r = c.post("/v1/sandboxes", {"memory_mb": 32, "disk_mb": 16})
            if r.status != 201:
                break
            made.append(r.json["id"])
        assert r.status == 429, r
        assert "open-file" in r.json["error"]["message"], r.json
        assert len(made) + 1 == cap["edge_max_sandboxes"], (len(made), cap)
        for sid in made[:: max(1, len(made) // 10)]:
            assert c.sh(sid, "echo ok") == "ok\n"
        assert "EMFILE" not in e.log_tail(400) and "Too many open files" not in e.log_tail(400)
        n.__exit__(None, None, None)
        n.check(figure)
    finally:
        n.__exit__(None, None, None)  # (again after a failure: a second exit is harmless)
        for sid in made:
            c.remove(sid)
        c.close()


# ---- 11. host-wide kernel counters (issue 35 item 4) ---------------------------------------
#
# Counters the kernel keeps for the whole host, or per user, that code in a sandbox could run
# up. Each sandbox runs as host uids of its own (uid leases) and, with a user namespace, has an
# owner uid of its own, so per-user counters are per sandbox; the danger is a global count.
#  - fs.aio-max-nr (AIO events, io_setup): GLOBAL, reachable (io_setup is allowed: libaio
#    users need it). The kernel charges a context's ring and objects to the caller's memory
#    cgroup (65,536 events cost 4 MB), so the edge raises the count to its maximum (node_sysctls)
#    and memory is the bound. test_aio_events_are_bounded_by_memory_not_a_node_count.
#  - kernel.keys.maxkeys/maxbytes/root_maxkeys: per user (key_user by host uid); and add_key,
#    request_key and keyctl are refused (EPERM), so a sandbox cannot make a key at all.
#    test_keys_and_namespaces_are_out_of_a_sandboxs_reach.
#  - user.max_*_namespaces: per user namespace and uid, charged up the chain to each user
#    namespace's owner (the sandbox's own uid in the initial one); and unshare, setns and clone
#    with namespace flags are refused (EPERM), clone3 is ENOSYS. The namespaces the edge makes
#    for a sandbox are charged to its owner uid. Same test.
#  - fs.inotify.max_user_instances / max_user_watches: per user (ucounts, charged to the
#    sandbox's owner in the initial namespace). Instances:
#    test_owner_charged_budgets_are_per_sandbox; watches:
#    test_inotify_and_epoll_watches_are_per_sandbox.
#  - fs.epoll.max_user_watches: per host uid (user_struct); each watch (208 bytes) is charged
#    to the memory cgroup. test_inotify_and_epoll_watches_are_per_sandbox.
#  - kernel.threads-max (and pid_max): GLOBAL; the parent cgroup of all sandboxes has a pids
#    limit that keeps a reserve of both for the host.
#    test_all_sandboxes_together_stay_inside_the_pids_budget.
#  - vm.max_map_count: per process (each mm's own count of mappings), not shared with anyone:
#    a process that reaches it gets ENOMEM for itself only. Nothing to test across sandboxes.

AIO = r"""
import ctypes, errno, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
held, events = [], 0
def take(limit, phase):
    # Contexts of 4096 events, then halves when the node's count runs out: all it can get.
    global events
    nr, err = 4096, "none"
    while events < limit:
        n = min(nr, limit - events)
        ctx = ctypes.c_ulong(0)
        if libc.syscall(206, ctypes.c_uint(n), ctypes.byref(ctx)) == 0:  # io_setup
            held.append(ctx.value)
            events += n
            if len(held) % 16 == 0:
                print(json.dumps({"phase": phase, "events": events, "errno": err}), flush=True)
            continue
        err = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
        if err != "EAGAIN" or nr == 1:
            break
        nr //= 2
    return {"phase": phase, "events": events, "contexts": len(held), "errno": err}
r = take(int(sys.argv[1]), 1)
with open("/tmp/aio-held.tmp", "w") as f:
    json.dump(r, f)
os.rename("/tmp/aio-held.tmp", "/tmp/aio-held")
print(json.dumps(r), flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while not os.path.exists("/tmp/aio-go") and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps(take(1 << 40, 2)), flush=True)
"""

CHECK_AIO = r"""
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ctx = ctypes.c_ulong(0)
if libc.syscall(206, ctypes.c_uint(int(sys.argv[1])), ctypes.byref(ctx)) != 0:
    print(errno.errorcode.get(ctypes.get_errno(), "?"))
else:
    libc.syscall(207, ctx)  # io_destroy
    print("ok")
"""

STOCK_AIO_MAX_NR = 65536  # the kernel's default fs.aio-max-nr


def _aio_nr():
    return int(_read("/proc/sys/fs/aio-nr"))


def _x86_64_only():
    import platform  # noqa: PLC0415
    if platform.machine() != "x86_64":
        pytest.skip(f"the attack uses x86-64 syscall numbers; this is {platform.machine()}")


def test_aio_events_are_bounded_by_memory_not_a_node_count(edge, client, figure):
    """A sandbox doing io_setup in a loop (contexts of 4,096 events, halving when refused) gets
    four times the kernel's stock fs.aio-max-nr and holds it, while host root (this process)
    and a neighbour sandbox can still io_setup a 1,024-event context; let go on, it is stopped
    by its own memory limit (ENOMEM or an OOM kill: the kernel charges each context's ring to
    the caller's memory cgroup), never by EAGAIN, because the edge raised fs.aio-max-nr so that
    memory is the bound rather than one count for the whole node (issue 35 item 4)."""
    _x86_64_only()
    aio_max = int(_read("/proc/sys/fs/aio-max-nr"))
    figure("node fs.aio-max-nr", aio_max)
    want = 4 * STOCK_AIO_MAX_NR
    sb = client.create({"memory_mb": 256, "labels": {"suite": "budgets"}})["id"]
    try:
        base = _aio_nr()
        with Neighbour(edge) as n:
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", AIO, str(want), "120"],
                              "background": True, "timeout_ms": 180000}, expect=202)
            eid = bg.json["exec_id"]
            held = json.loads(wait_until(
                lambda: client.exec(sb, shell="cat /tmp/aio-held 2>/dev/null")["stdout"], 60,
                interval=0.5, what="the sandbox to hold its AIO contexts"))
            node_used = _aio_nr() - base
            # While it holds them: host root and the neighbour still get a context.
            host = {nr: subprocess.run([sys.executable, "-c", CHECK_AIO, str(nr)],
                                       capture_output=True, text=True,
                                       check=True).stdout.strip() for nr in (1, 1024)}
            neighbour = n.client.exec(n.sid, cmd=["python3", "-c", CHECK_AIO, "1024"])
            client.exec(sb, shell="touch /tmp/aio-go")
            done = client.get(f"/v1/sandboxes/{sb}/execs/{eid}?wait_ms=150000",
                              expect=200).json
            n.check(figure)
        figure("AIO events the sandbox held", held["events"])
        figure("node aio-nr growth while held", node_used)
        figure("host root io_setup while held", host)
        figure("neighbour io_setup(1024) while held", neighbour["stdout"].strip())
        assert host == {1: "ok", 1024: "ok"}, (host, held)
        assert neighbour["stdout"] == "ok\n", (neighbour, held)
        assert held["events"] == want and held["errno"] == "none", held
        # Let go on: its own memory limit stops it, far past the stock count.
        res = done["result"]
        last = _last_json(res)
        figure("AIO events when its memory ran out", last["events"])
        figure("how it stopped", "OOM kill" if res["oom_killed"] else last["errno"])
        assert last["phase"] == 2 and last["events"] > want, (last, res["exit_code"])
        assert res["oom_killed"] or last["errno"] == "ENOMEM", (last, res["oom_killed"])
        st = client.get(f"/v1/sandboxes/{sb}/stats", expect=200).json
        figure("sandbox memory peak MB", round(st["memory_peak"] / MB, 1))
        assert st["memory_peak"] <= st["memory_limit"], st
        assert _budgets(client)["aio_max_nr"] == aio_max >= 1 << 40
    finally:
        client.remove(sb)


KEYS_AND_NAMESPACES = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return "allowed" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
res = {
    "add_key": call(248, b"user", b"dsec", b"x", ctypes.c_size_t(1), ctypes.c_int(-2)),
    "request_key": call(249, b"user", b"dsec", None, ctypes.c_int(0)),
    "keyctl_join_session": call(250, ctypes.c_int(1), None),  # KEYCTL_JOIN_SESSION_KEYRING
    "clone3": call(435, None, ctypes.c_size_t(0)),
}
for name, flag in [("user", 0x10000000), ("net", 0x40000000), ("mnt", 0x00020000),
                   ("pid", 0x20000000), ("ipc", 0x08000000), ("uts", 0x04000000),
                   ("cgroup", 0x02000000), ("time", 0x00000080)]:
    res["unshare_" + name] = call(272, ctypes.c_ulong(flag))  # unshare
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
res["setns"] = call(308, fd, 0)
print(json.dumps(res))
"""


@pytest.mark.parametrize("user", ["sandbox", "root"])
def test_keys_and_namespaces_are_out_of_a_sandboxs_reach(client, sandbox, figure, user):
    """The kernel's key quotas (kernel.keys.*) and namespace counts (user.max_*_namespaces)
    cannot be run up from a sandbox at all: add_key, request_key and keyctl, unshare of every
    namespace kind and setns are refused (EPERM) and clone3 is ENOSYS, for root inside too
    (issue 35 item 4)."""
    _x86_64_only()
    r = client.exec(sandbox, cmd=["python3", "-c", KEYS_AND_NAMESPACES], user=user)
    res = json.loads(r["stdout"])
    figure("verdicts", res)
    want = {k: "EPERM" for k in res}
    want["clone3"] = "ENOSYS"
    assert res == want, res


WATCHES = r"""
import ctypes, errno, json, os, select, sys, time
libc = ctypes.CDLL(None, use_errno=True)
kind, want = sys.argv[1], int(sys.argv[2])
n, err = 0, "none"
keep = []
try:
    if kind == "inotify":
        # 64 instances, each watching its own share of files (a watch is per inode and instance).
        per = want // 64 + 1
        os.makedirs("/tmp/w", exist_ok=True)
        for i in range(per):
            open(f"/tmp/w/{i}", "w").close()
        for _ in range(64):
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1")
            keep.append(fd)
            for i in range(per):
                if libc.inotify_add_watch(fd, f"/tmp/w/{i}".encode(), 0x2) < 0:  # IN_MODIFY
                    raise OSError(ctypes.get_errno(), "inotify_add_watch")
                n += 1
    else:
        # 1,024 pipe ends, each watched by as many epoll instances as it takes.
        fds = [fd for _ in range(512) for fd in os.pipe()]
        while n < want:
            ep = select.epoll()
            keep.append(ep)
            for fd in fds:
                ep.register(fd, select.EPOLLIN)
                n += 1
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({"watches": n, "errno": err}), flush=True)
with open("/tmp/held.tmp", "w") as f:
    json.dump({"watches": n, "errno": err}, f)
os.rename("/tmp/held.tmp", "/tmp/held")
time.sleep(float(sys.argv[3]))
"""

CHECK_WATCHES = r"""
import ctypes, errno, json, os, select
libc = ctypes.CDLL(None, use_errno=True)
r = {}
fd = libc.inotify_init1(os.O_CLOEXEC)
r["inotify_add_watch"] = ("ok" if fd >= 0 and libc.inotify_add_watch(fd, b"/", 0x2) >= 0
                          else errno.errorcode.get(ctypes.get_errno(), "?"))
a, b = os.pipe()
try:
    select.epoll().register(a, select.EPOLLIN)
    r["epoll_ctl_add"] = "ok"
except OSError as e:
    r["epoll_ctl_add"] = errno.errorcode.get(e.errno, "?")
print(json.dumps(r))
"""


@pytest.mark.parametrize("kind", ["inotify", "epoll"])
def test_inotify_and_epoll_watches_are_per_sandbox(edge, client, figure, kind):
    """A sandbox adds inotify watches (fs.inotify.max_user_watches) or epoll watches
    (fs.epoll.max_user_watches) until the kernel refuses (ENOSPC): the count is its own host
    uid's, so while it holds them a neighbour sandbox and host root can still add a watch of
    each kind (issue 35 item 4)."""
    limit = int(_read(f"/proc/sys/fs/{kind}/max_user_watches"))
    figure(f"fs.{kind}.max_user_watches", limit)
    # Every watch is charged to the sandbox's memory (epoll: 208 bytes measured): give it room
    # to reach the count, so that the count, not memory, is what stops it.
    memory_mb = 256 + limit * 400 // MB
    if memory_mb > 4096:
        pytest.skip(f"max_user_watches {limit} needs a {memory_mb} MB sandbox to reach")
    sb = client.create({"memory_mb": memory_mb, "labels": {"suite": "budgets"}})["id"]
    try:
        with Neighbour(edge) as n:
            bg = client.post(f"/v1/sandboxes/{sb}/exec",
                             {"cmd": ["python3", "-c", WATCHES, kind, str(limit + 4096), "60"],
                              "background": True, "timeout_ms": 120000}, expect=202)
            eid = bg.json["exec_id"]
            held = json.loads(wait_until(
                lambda: client.exec(sb, shell="cat /tmp/held 2>/dev/null")["stdout"], 90,
                interval=0.5, what="the sandbox to hold its watches"))
            own = json.loads(client.exec(sb, cmd=["python3", "-c", CHECK_WATCHES])["stdout"])
            neighbour = json.loads(
                n.client.exec(n.sid, cmd=["python3", "-c", CHECK_WATCHES])["stdout"])
            host = json.loads(subprocess.run([sys.executable, "-c", CHECK_WATCHES],
                                             capture_output=True, text=True,
                                             check=True).stdout)
            n.check(figure)
        figure("watches the sandbox got", held["watches"])
        figure("the sandbox's own check while held", own)
        assert held["errno"] == "ENOSPC" and held["watches"] >= limit * 9 // 10, held
        key = "inotify_add_watch" if kind == "inotify" else "epoll_ctl_add"
        assert own[key] == "ENOSPC", own
        assert neighbour == {"inotify_add_watch": "ok", "epoll_ctl_add": "ok"}, neighbour
        assert host == {"inotify_add_watch": "ok", "epoll_ctl_add": "ok"}, host
        client.delete(f"/v1/sandboxes/{sb}/execs/{eid}", expect=204)
    finally:
        client.remove(sb)
