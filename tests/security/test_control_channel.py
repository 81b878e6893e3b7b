"""The agent's control channel (issue 6): from inside a sandbox, find the agent's channel and
talk to it, forge frames on whatever is reachable, read the agent's memory, fds or environment,
and kill or signal PID 1 -- as the sandbox user, as root inside and as any other uid root can
become. None of it works, and afterwards the sandbox keeps serving the edge with the same agent."""

import glob
import json
import os
import socket
import sqlite3
import struct

import pytest

from sec_util import agent_host_pid, install_probe, probe
from test_escape import USER_IDS, USERS, run_py

# ---- frames, as src/protocol/frame.h encodes them --------------------------------------------

HELLO, AUTH, SETUP, READY, REQUEST, DATA, CONTROL, EVENT, RESPONSE, LOG, ERROR = range(1, 12)


def frame(ftype, payload, channel=0, flags=0):
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return struct.pack("<HBBII", 0x5344, ftype, flags, channel, len(payload)) + payload


def read_frame(sock):
    head = b""
    while len(head) < 12:
        chunk = sock.recv(12 - len(head))
        if not chunk:
            return None
        head += chunk
    magic, ftype, flags, channel, n = struct.unpack("<HBBII", head)
    assert magic == 0x5344, head
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            break
        body += chunk
    return ftype, channel, body


# A forged "the command succeeded" as the agent would send it, and more of the protocol.
def forged_frames():
    ok = {"exit_code": 0, "signal": None, "stdout_truncated": False, "stderr_truncated": False,
          "timed_out": False, "oom_killed": False, "duration_ms": 1.0}
    return b"".join([
        frame(DATA, "forged-output", channel=1, flags=1),
        frame(RESPONSE, ok, channel=1),
        frame(RESPONSE, ok, channel=2),
        frame(READY, {"pid": 1}),
        frame(HELLO, {"version": 1, "pid": 1, "shells": []}),
        frame(ERROR, {"error": {"code": "internal", "message": "forged"}}),
        frame(REQUEST, {"op": "signal_all", "signal": 9}, channel=77),
        frame(AUTH, {"secret": "0" * 64}),
    ])


def still_serving(client, sid, edge=None, agent_pid=None):
    """The sandbox answers an exec and a file round trip, with the same agent process."""
    assert client.sh(sid, "echo alive") == "alive\n"
    client.put(f"/v1/sandboxes/{sid}/files?path=/tmp/alive.txt", b"still here",
               headers={"Content-Type": "application/octet-stream"}, expect=204)
    got = client.get(f"/v1/sandboxes/{sid}/files?path=/tmp/alive.txt", expect=200).body
    assert got == b"still here"
    assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "running"
    if edge is not None and agent_pid is not None:
        assert agent_host_pid(edge, sid) == agent_pid, "the agent was replaced"
        with open(f"/proc/{agent_pid}/status") as f:
            state = [ln for ln in f if ln.startswith("State:")][0]
        assert state.split()[1] in ("S", "R"), state


# ---- finding the channel -----------------------------------------------------------------------

DISCOVER_CODE = r"""
import errno, json, os, socket, stat, struct
out = {"unix": [], "sockets_on_fs": [], "listening_tcp": [], "connects": {}, "own_fds": {}}
with open("/proc/net/unix") as f:
    for line in f.readlines()[1:]:
        parts = line.split()
        out["unix"].append(parts[7] if len(parts) > 7 else "(unnamed)")
for d in ("/", "/run", "/tmp", "/var", "/dev", "/dev/shm", "/workspace", "/root", "/home", "/etc",
          "/mnt"):
    for dirpath, dirnames, files in os.walk(d):
        if dirpath.startswith(("/proc", "/sys", "/usr")):
            dirnames[:] = []
            continue
        for name in files + dirnames:
            p = os.path.join(dirpath, name)
            try:
                if stat.S_ISSOCK(os.lstat(p).st_mode):
                    out["sockets_on_fs"].append(p)
            except OSError:
                pass
        if dirpath == "/":
            dirnames[:] = [n for n in dirnames if n not in ("proc", "sys", "usr")]
for name in ("tcp", "tcp6"):
    with open(f"/proc/net/{name}") as f:
        for line in f.readlines()[1:]:
            if line.split()[3] == "0A":
                out["listening_tcp"].append(line.split()[1])
frame = struct.pack("<HBBII", 0x5344, 2, 0, 0, 2) + b"{}"
names = ["/run/dsec/agent.sock", "/run/agent.sock", "/agent.sock", "/tmp/agent.sock",
         "/var/run/dsec-agent.sock", "\0dsec-agent", "\0dsec", "\0agent", "\0dsec-edge"]
names += [p for p in out["unix"] if p.startswith(("/", "@"))]
names += out["sockets_on_fs"]
for n in names:
    addr = "\0" + n[1:] if n.startswith("@") else n
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr)
        s.sendall(frame)
        out["connects"][n] = "connected: " + repr(s.recv(64))
    except OSError as e:
        out["connects"][n] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
for fd in range(0, 1024):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    kind = "sock" if stat.S_ISSOCK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"
    out["own_fds"][fd] = kind
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_no_control_channel_is_reachable_from_inside(client, sandbox, user):
    """Searching /proc/net/unix, abstract socket names, every socket file on the sandbox's
    filesystem, listening TCP ports and its own fds 0-1023 finds no agent channel: nothing to
    connect to (every guessed name is ENOENT/ECONNREFUSED) and no socket is inherited."""
    r = run_py(client, sandbox, DISCOVER_CODE, user=user)
    assert r["sockets_on_fs"] == [], r
    # /proc/net/unix lists this network namespace's sockets: none is the agent's (the agent's
    # channel and its listening socket were made in the host's namespace).
    assert all(p == "(unnamed)" for p in r["unix"]), r["unix"]
    assert r["listening_tcp"] == [], r
    for name, verdict in r["connects"].items():
        assert verdict in ("ENOENT", "ECONNREFUSED"), (name, verdict)
    assert r["own_fds"] == {"0": "other", "1": "other", "2": "other"}, r["own_fds"]


# ---- forging frames on what is reachable --------------------------------------------------------

def test_forged_frames_in_output_and_input_stay_data(client, sandbox):
    """A command that writes well-formed agent frames (a forged successful response, ready,
    hello, error, a signal_all request, an auth) to stdout, stderr and through stdin, then exits 7:
    the edge returns exactly those bytes as output and the real exit code 7."""
    frames = forged_frames()
    code = ("import sys; d = bytes.fromhex(sys.argv[1]); sys.stdout.buffer.write(d); "
            "sys.stdout.flush(); sys.stderr.buffer.write(d); sys.stderr.flush(); sys.exit(7)")
    r = client.exec(sandbox, cmd=["python3", "-c", code, frames.hex()], encoding="base64")
    import base64
    assert r["exit_code"] == 7, r
    assert base64.b64decode(r["stdout"]) == frames
    assert base64.b64decode(r["stderr"]) == frames
    # Streamed: the final event carries the real exit code too.
    conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1",
                               {"cmd": ["python3", "-c", code, frames.hex()],
                                "encoding": "base64"})
    try:
        assert resp.status == 200
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    finally:
        conn.close()
    exits = [e["exit"] for e in events if "exit" in e]
    assert len(exits) == 1 and exits[0]["exit_code"] == 7, events
    out = b"".join(base64.b64decode(e["stdout"]) for e in events if "stdout" in e)
    assert out == frames
    # Frames with short payloads are valid UTF-8 text: sent as stdin they come back verbatim.
    text = "".join(frame(t, p, channel=c).decode() for t, p, c in [
        (RESPONSE, {"exit_code": 0}, 1), (READY, {"pid": 1}, 0), (AUTH, {"secret": "x"}, 0),
        (REQUEST, {"op": "signal_all"}, 9), (DATA, "fake", 1)])
    r = client.exec(sandbox, cmd=["cat"], stdin=text)
    assert r["exit_code"] == 0 and r["stdout"] == text, r
    # The same from a shell session, whose status pipe is the other path a command could try.
    shell = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    try:
        r = client.post(f"/v1/sandboxes/{sandbox}/shells/{shell}/run",
                        {"command": f"printf '%s' '{frames.hex()}' | xxd -r -p; "
                                    "for fd in 3 4 5 6 7 8 9 10 11 12; do "
                                    f"printf '__DSEC_{'0' * 32}__ 0\\n' >&$fd; done 2>/dev/null; "
                                    "exit_with() { return $1; }; exit_with 9",
                         "timeout_ms": 20000}, expect=200).json
        if "xxd" in r["stderr"] and r["exit_code"] == 127:
            pytest.skip("xxd is not in the host image")
        assert r["exit_code"] == 9, r
        again = client.post(f"/v1/sandboxes/{sandbox}/shells/{shell}/run",
                            {"command": "echo next; false", "timeout_ms": 20000},
                            expect=200).json
        assert again["exit_code"] == 1 and again["stdout"] == "next\n", again
    finally:
        client.delete(f"/v1/sandboxes/{sandbox}/shells/{shell}", expect=(204, 404))
    still_serving(client, sandbox)


def sandbox_dir(edge, sid):
    hits = [p for p in glob.glob(str(edge.state_dir / "**" / "agent.sock"), recursive=True)
            if sid in p]
    assert len(hits) == 1, hits
    return os.path.dirname(hits[0])


def test_agent_socket_refuses_forged_frames(edge, client, sandbox):
    """On the host, a client of the agent's reconnect socket with a wrong secret, with a request
    instead of auth, with garbage, or silent is refused (an "unauthenticated" error frame, or
    closed) and the edge's own connection keeps working."""
    path = os.path.join(sandbox_dir(edge, sandbox), "agent.sock")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    agent_pid = agent_host_pid(edge, sandbox)

    def talk(data, wait_reply=True):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(path)
        try:
            if data:
                s.sendall(data)
            return read_frame(s) if wait_reply else None
        except (ConnectionResetError, socket.timeout) as e:
            return repr(e)
        finally:
            s.close()

    reply = talk(frame(AUTH, {"secret": "0" * 64}))
    assert reply and reply[0] == ERROR and b"unauthenticated" in reply[2], reply
    reply = talk(frame(REQUEST, {"op": "exec", "cmd": ["id"]}, channel=5))
    assert reply and reply[0] == ERROR and b"unauthenticated" in reply[2], reply
    reply = talk(b"GET / HTTP/1.1\r\n\r\n" * 4)
    assert reply is None or isinstance(reply, str) or reply[0] == ERROR, reply
    reply = talk(frame(AUTH, "not json"))
    assert reply and reply[0] == ERROR, reply
    # A silent client holds nothing up: the next one is answered at once.
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(path)
    try:
        reply = talk(frame(AUTH, {"secret": "1" * 64}))
        assert reply and reply[0] == ERROR and b"unauthenticated" in reply[2], reply
    finally:
        silent.close()
    still_serving(client, sandbox, edge, agent_pid)


# ---- reading the agent ----------------------------------------------------------------------

AGENT_ACCESS = {
    "ptrace_pid1": "blocked EPERM", "ptrace_seize_pid1": "blocked EPERM",
    "vm_read_pid1": "blocked EPERM", "pidfd_getfd_pid1": "blocked EPERM",
    "kcmp_pid1": "blocked EPERM", "read_pid1_mem": "blocked EACCES",
    "write_pid1_mem": "blocked EACCES", "read_pid1_task_mem": "blocked EACCES",
    "read_pid1_environ": "blocked EACCES", "read_pid1_maps": "blocked EACCES",
    "read_pid1_auxv": "blocked EACCES", "read_pid1_fdinfo": "blocked EACCES",
    "open_pid1_fd0": "blocked EACCES", "open_pid1_fd3": "blocked EACCES",
    "readlink_pid1_fd": "blocked EACCES", "pid1_map_files": "blocked EACCES",
    "write_pid1_exe": "blocked EACCES",
}


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_agent_memory_fds_and_environment_are_unreadable(client, sandbox, user):
    """ptrace attach/seize, process_vm_readv, pidfd_getfd, kcmp, /proc/1/mem (read and write),
    /proc/1/environ, maps, auxv, fdinfo, fd links and map_files of the agent are all refused, for
    the sandbox user and for root inside."""
    install_probe(client, sandbox)
    want = dict(AGENT_ACCESS)
    # Reading these needs the ptrace check only past the file's mode (0400 root).
    want["read_pid1_syscall"] = "blocked EACCES" if user is None else "blocked EPERM"
    want["read_pid1_stack"] = "blocked EACCES"
    # Root inside may list the fd numbers (the directory is root's) but no more.
    want["list_pid1_fds"] = "blocked EACCES" if user is None else "allowed"
    got = probe(client, sandbox, *want, user=user)
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"(got, want) per attempt: {wrong}"


SCHED_ATTEMPTS = ["prlimit_pid1", "setpriority_pid1", "setpriority_pgrp1", "sched_pid1",
                  "ioprio_pid1", "ioprio_pgrp1", "affinity_pid1"]


def agent_sched(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    with open(f"/proc/{pid}/status") as f:
        allowed = [ln for ln in f if ln.startswith("Cpus_allowed_list")]
    # nice, rt priority and policy (fields 19, 40, 41 of stat, counted from 1)
    return fields[16], fields[37], fields[38], limits, allowed


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_agent_limits_and_scheduling_are_untouchable(edge, client, sandbox, user):
    """prlimit, setpriority (by pid and by its process group), sched_setscheduler, ioprio_set
    (pid and pgrp) and sched_setaffinity aimed at PID 1 are refused EPERM for the sandbox user and
    for root inside (which shares the agent's uid), and the agent's nice, policy, limits and
    affinity are unchanged on the host."""
    agent_pid = agent_host_pid(edge, sandbox)
    before = agent_sched(agent_pid)
    install_probe(client, sandbox)
    got = probe(client, sandbox, *SCHED_ATTEMPTS, user=user)
    assert got == {n: "blocked EPERM" for n in SCHED_ATTEMPTS}, got
    assert agent_sched(agent_pid) == before
    still_serving(client, sandbox, edge, agent_pid)


def agent_secret(edge, sid):
    dbs = [p for p in edge.state_dir.rglob("*") if p.is_file() and p.suffix in (".db", ".sqlite")]
    for db in dbs:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT handle FROM sandboxes WHERE id = ?", (sid,)).fetchone()
        except sqlite3.Error:
            row = None
        finally:
            con.close()
        if row:
            return json.loads(row[0])["secret"]
    raise AssertionError(f"no state DB row for {sid} in {dbs}")


SECRET_SEARCH_CODE = r"""
import json, os, sys
needles = [n.encode() for n in sys.stdin.read().split()]
hits, read = [], 0
def check(path):
    global read
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return
    read += 1
    for n in needles:
        if n in data:
            hits.append([path, needles.index(n)])
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for base in (f"/proc/{pid}", f"/proc/{pid}/task/{pid}"):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if name in ("mem", "pagemap", "clear_refs", "kpageflags"):
                continue
            p = f"{base}/{name}"
            if os.path.isfile(p):
                check(p)
for d in ("/tmp", "/run", "/var", "/root", "/home", "/workspace", "/etc", "/dev/shm", "/mnt"):
    for dirpath, _, files in os.walk(d):
        for name in files:
            check(os.path.join(dirpath, name))
for k, v in os.environ.items():
    for n in needles:
        if n.decode() in k or n.decode() in v:
            hits.append(["environ:" + k, needles.index(n)])
print(json.dumps({"hits": hits, "read": read}))
"""


def test_agent_secret_is_nowhere_inside(edge, client, sandbox, figure):
    """The per-sandbox secret that authenticates the edge to the agent, the edge's token and the
    edge's state dir path appear in nothing root inside can read: no /proc/<pid> file of any
    process (the agent's cmdline, status, mountinfo, ...), no file of the writable layer, no
    environment variable."""
    secret = agent_secret(edge, sandbox)
    assert len(secret) >= 32
    needles = [secret, edge.token, str(edge.state_dir), str(edge.root)]
    # Handed in on stdin: on the command line it would be in our own /proc/<pid>/cmdline.
    r = client.exec(sandbox, cmd=["python3", "-c", SECRET_SEARCH_CODE],
                    stdin="\n".join(needles), user="root", timeout_ms=60000)
    assert r["exit_code"] == 0, r
    found = json.loads(r["stdout"])
    assert found["hits"] == [], found
    assert found["read"] > 50, found  # it really read the agent's /proc files and more
    figure("files searched for the secret", found["read"])
    assert client.sh(sandbox, "cat /proc/1/cmdline | tr '\\0' ' '") == "dsec-agent "


# ---- signals to PID 1 ----------------------------------------------------------------------------

SIGNAL_CODE = r"""
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def state():
    try:
        with open("/proc/1/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError as e:
        return "gone " + str(e.errno)
def call(fn):
    try:
        r = fn()
        if isinstance(r, int) and r < 0:
            return errno.errorcode.get(ctypes.get_errno(), "?")
        return "sent"
    except OSError as e:
        return errno.errorcode.get(e.errno, "?")
out = {"kill": {}, "pidfd": {}, "tgkill": {}, "sigqueue": {}, "states": []}
pidfd = None
try:
    pidfd = os.pidfd_open(1)
except OSError as e:
    out["pidfd_open"] = errno.errorcode[e.errno]
info = (ctypes.c_int * 32)()
info[0] = signal.SIGCHLD  # si_signo
info[2] = -1              # si_code SI_QUEUE
for sig in range(1, 65):
    out["kill"][sig] = call(lambda: os.kill(1, sig))
    out["states"].append(state())
    out["tgkill"][sig] = call(lambda: libc.syscall(234, 1, 1, sig))
    if pidfd is not None:
        out["pidfd"][sig] = call(lambda: signal.pidfd_send_signal(pidfd, sig))
    info[0] = sig
    out["sigqueue"][sig] = call(lambda: libc.syscall(129, 1, sig, ctypes.byref(info)))
    out["states"].append(state())
if os.getuid() == 0:
    # Every uid root can become (any in the namespace): one that is neither root nor the agent's.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        res = {str(s): call(lambda: os.kill(1, s)) for s in (9, 15, 19, 11)}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    out["nobody"] = json.loads(os.read(r, 65536))
    os.waitpid(pid, 0)
    # Everything else in the sandbox, at once.
    out["kill_all"] = call(lambda: os.kill(-1, signal.SIGKILL))
if os.getuid() == 0:
    # SIGIO-driven signals: F_SETOWN pid 1 on a pipe, with the default SIGIO and F_SETSIG
    # SIGKILL/SIGSTOP, then make it readable (the kernel sends these itself).
    import fcntl
    out["sigio"] = {}
    for signum in (0, signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV):
        r, w = os.pipe()
        try:
            fcntl.fcntl(r, fcntl.F_SETOWN, 1)
            fcntl.fcntl(r, 10, signum)  # F_SETSIG
            fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
            os.write(w, b"x")
            out["sigio"][signum] = "armed"
        except OSError as e:
            out["sigio"][signum] = errno.errorcode[e.errno]
        out["states"].append(state())
        os.close(r)
        os.close(w)
out["final_state"] = state()
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_signals_to_pid1_are_refused_or_ignored(edge, client, sandbox, user, figure):
    """Every signal 1-64 sent to PID 1 by kill, tgkill, pidfd_send_signal and rt_sigqueueinfo
    (from the sandbox user: EPERM; from root and uid 65534 inside: ignored by the kernel),
    SIGIO-driven SIGKILL/SIGSTOP (F_SETOWN 1 + F_SETSIG), then kill(-1, SIGKILL): the agent never
    stops or dies, keeps its pid, and the sandbox serves."""
    agent_pid = agent_host_pid(edge, sandbox)
    client.exec(sandbox, "sleep 300 >/dev/null 2>&1 &")
    r = client.exec(sandbox, cmd=["python3", "-c", SIGNAL_CODE], timeout_ms=60000,
                    **({"user": user} if user else {}))
    assert r["exit_code"] == 0, r
    out = json.loads(r["stdout"])
    verdicts = set()
    for how in ("kill", "tgkill", "pidfd", "sigqueue"):
        assert len(out[how]) == 64, (how, out)
        verdicts |= set(out[how].values())
        if user is None:
            assert set(out[how].values()) == {"EPERM"}, (how, out[how])
        else:
            assert set(out[how].values()) <= {"sent", "EPERM"}, (how, out[how])
    assert all(s in ("S", "R") for s in out["states"]), out["states"]
    assert out["final_state"] in ("S", "R"), out
    if user == "root":
        assert set(out["nobody"].values()) == {"EPERM"}, out["nobody"]
        assert out["kill_all"] == "sent", out
        # kill(-1) took the background sleep with it, but not the agent.
        assert "sleep 300" not in client.sh(sandbox, "ps -eo args")
    still_serving(client, sandbox, edge, agent_pid)
    figure("signal attempts", sum(len(out[h]) for h in ("kill", "tgkill", "pidfd", "sigqueue")))


AGENT_PROC_WRITE_CODE = r"""
import errno, json, os
out = {}
for base in ("/proc/1", "/proc/1/task/1"):
    for name in sorted(os.listdir(base)):
        p = f"{base}/{name}"
        if not os.path.isfile(p) or name in ("mem",):
            continue
        value = {"oom_score_adj": b"-1000", "oom_adj": b"-17", "comm": b"pwned",
                 "timerslack_ns": b"1000000000", "loginuid": b"0", "clear_refs": b"1",
                 "autogroup": b"19", "sched": b"0", "coredump_filter": b"0xff",
                 "setgroups": b"deny", "uid_map": b"0 0 1", "gid_map": b"0 0 1",
                 "projid_map": b"0 0 1", "attr/current": b"unconfined"}.get(name, b"0")
        try:
            fd = os.open(p, os.O_WRONLY)
        except OSError as e:
            out[p] = "open " + errno.errorcode[e.errno]
            continue
        try:
            os.write(fd, value)
            out[p] = "written"
        except OSError as e:
            out[p] = "write " + errno.errorcode[e.errno]
        finally:
            os.close(fd)
print(json.dumps(out))
"""


def host_view(pid):
    v = {}
    for name in ("oom_score_adj", "comm", "timerslack_ns", "loginuid", "uid_map", "gid_map",
                 "setgroups", "projid_map", "limits", "cgroup"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                v[name] = f.read()
        except OSError as e:
            v[name] = f"error {e.errno}"
    with open(f"/proc/{pid}/status") as f:
        v["status"] = [ln for ln in f if ln.split(":")[0] in (
            "Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "Seccomp", "NoNewPrivs")]
    return v


def autogroup(pid):
    with open(f"/proc/{pid}/autogroup") as f:
        return f.read().split()  # ["/autogroup-N", "nice", "K"]


def autogroup_members(group):
    members = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if autogroup(p)[0] == group:
                    members.append(int(p))
            except (OSError, IndexError):
                pass
    return members


def test_root_writes_to_agent_proc_files_change_nothing(edge, client, sandbox):
    """Root inside writes hostile values into every writable file of /proc/1 and
    /proc/1/task/1 (oom_score_adj -1000, comm, timerslack_ns, loginuid, uid_map, projid_map,
    autogroup nice 19, ...): seen from the host the agent's oom score, name, timer slack, ids,
    maps, limits, capabilities and cgroup are unchanged, the edge's scheduling (autogroup) is
    untouched, and the sandbox keeps serving."""
    agent_pid = agent_host_pid(edge, sandbox)
    before = host_view(agent_pid)
    edge_group = autogroup(edge.pid)
    r = run_py(client, sandbox, AGENT_PROC_WRITE_CODE, user="root")
    assert r.get("/proc/1/mem") is None and len(r) > 20, r
    # The masks: oom_score_adj/oom_adj writes go to /dev/null; the rest are refused.
    after = host_view(agent_pid)
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    # /proc/1/autogroup takes a nice value for the agent's whole session: that session (and
    # autogroup) must be the agent's alone, never the edge's or another sandbox's.
    assert autogroup(edge.pid) == edge_group, "a sandbox changed the edge's autogroup nice"
    group = autogroup(agent_pid)[0]
    outside = [p for p in autogroup_members(group) if p not in edge.sandbox_pids(sandbox)]
    assert not outside, f"the agent's autogroup {group} also holds host processes {outside}"
    still_serving(client, sandbox, edge, agent_pid)
