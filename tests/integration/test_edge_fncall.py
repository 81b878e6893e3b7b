"""Function calls and warm pools on a live edge: POST /v1/fncalls on the built-in python and
bash runtimes and on pools made with PUT /v1/pools/{name}; what one call can leave for the next
(nothing); runaway calls (time, memory, processes, output, disk) contained to the call; queue
bounds and timeouts (429 with Retry-After); growth to max and shrinking after idle_timeout_s;
workers killed from the host; container pools behind POST /v1/sandboxes {"pool"}; bad input;
pools kept across edge restarts.

Pools made here have names starting with "it-" plus a random suffix and are deleted when the
test ends (the `pools` fixture), even when it fails. Tests that kill processes run on an edge of
their own (make_edge).
"""

import base64
import hashlib
import json
import os
import pathlib
import signal
import threading
import time
import uuid

import pytest

import edge_harness
from edge_harness import wait_until


# ---- helpers ------------------------------------------------------------------------------

def fncall(c, runtime, code, expect=200, **fields):
    body = {"runtime": runtime, "code": code}
    body.update(fields)
    return c.post("/v1/fncalls", body, expect=expect).json


def py(c, code, **fields):
    return fncall(c, "python", code, **fields)


def ok(r, stdout=None):
    """A call that exited 0 (with that stdout, when given)."""
    assert r["exit_code"] == 0 and not r["timed_out"] and not r["oom_killed"], r
    if stdout is not None:
        assert r["stdout"] == stdout, r
    return r


def pool_info(c, name):
    return c.get(f"/v1/pools/{name}", expect=200).json


def workers_total(info):
    w = info["workers"]
    return w["idle"] + w["busy"] + w["starting"]


def wait_idle(c, name, n, timeout=60):
    """Waits until the pool has exactly n idle workers and none starting."""
    def check():
        info = pool_info(c, name)
        w = info["workers"]
        return info if (w["idle"], w["starting"]) == (n, 0) else None
    return wait_until(check, timeout, interval=0.05, what=f"pool {name}: {n} idle workers")


def unique(prefix="it"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pools(client):
    """put(name=None, c=client, wait=True, **config) -> the pool's record; every pool put is
    deleted at the end (404 is fine: the test deleted it itself)."""
    made = []

    def put(name=None, c=None, wait=True, **config):
        c = c or client
        name = name or unique()
        made.append((c, name))
        r = c.put(f"/v1/pools/{name}", config, expect=(200, 201))
        if wait:
            wait_idle(c, name, config.get("min_idle", r.json["min_idle"]))
        return r.json

    yield put
    for c, name in made:
        try:
            r = c.delete(f"/v1/pools/{name}")
            assert r.status in (204, 404), r
        except Exception as e:  # noqa: BLE001 -- an edge a test killed: its teardown cleans up
            print(f"pool {name} not deleted: {e}")


def run_concurrently(fns, timeout=60):
    """Runs the callables at once from threads (released together); returns their results
    (an exception is returned in place of a result)."""
    results = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def runner(i, fn):
        try:
            barrier.wait(timeout)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=runner, args=(i, fn), daemon=True)
               for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "calls did not finish"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def timed_call(edge, body):
    """One POST /v1/fncalls on its own connection -> (Response, seconds)."""
    c = edge.client()
    t0 = time.monotonic()
    r = c.post("/v1/fncalls", body)
    return r, time.monotonic() - t0


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def ppid_of(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root):
    """Host pids below `root` in the process tree."""
    children = {}
    for p in edge_harness.pids():
        pp = ppid_of(p)
        if pp is not None:
            children.setdefault(pp, []).append(p)
    out, todo = [], [root]
    while todo:
        for ch in children.get(todo.pop(), []):
            out.append(ch)
            todo.append(ch)
    return out


ZYGOTE_PREFIX = b"/proc/self/fd/4\0--runtime="


def zygotes(edge, marker=None):
    """The zygote processes of this edge's fncall workers (pid -> its parent, the worker's
    agent), among the edge's descendants; with `marker`, only those whose command line holds
    it (e.g. b"--preload=json,wave"). The call inits and pre-forked call processes below a
    zygote share its command line; the zygote is the one whose parent is not one of them."""
    procs = set(descendants(edge.pid))
    out = {}
    for p in procs:
        cl = cmdline(p)
        if not cl.startswith(ZYGOTE_PREFIX) or (marker and marker not in cl):
            continue
        parent = ppid_of(p)
        if parent is not None and not cmdline(parent).startswith(ZYGOTE_PREFIX):
            out[p] = parent
    return out


def host_pids_with(needle):
    return [p for p in edge_harness.pids() if needle in cmdline(p)]


# ---- 1. results ---------------------------------------------------------------------------

def test_builtin_runtimes_and_defaults(client):
    names = {p["name"]: p for p in client.get("/v1/pools", expect=200).json["pools"]}
    assert {"python", "bash"} <= set(names)
    want_max = max(8, 4 * os.cpu_count())
    for n in ("python", "bash"):
        p = names[n]
        assert p["kind"] == "fncall" and p["runtime"] == n, p
        assert (p["min_idle"], p["max"], p["max_queue"], p["queue_timeout_ms"]) == \
            (2, want_max, 256, 10000), p
        one = pool_info(client, n)
        for k in ("name", "kind", "runtime", "min_idle", "max", "max_queue", "memory_mb"):
            assert one[k] == p[k], (k, one, p)
    assert names["python"]["memory_mb"] == 512 and "json" in names["python"]["preload"]
    # The node record lists the same pools.
    node_pools = {p["name"] for p in client.get("/v1/node", expect=200).json["pools"]}
    assert {"python", "bash"} <= node_pools


def test_python_results(client):
    r = ok(py(client, "print(sum(range(10)))"), "45\n")
    assert r["stderr"] == "" and r["runtime"] == "python" and r["queue_ms"] >= 0
    assert r["signal"] is None and r["stdout_truncated"] is False and r["duration_ms"] >= 0
    r = py(client, "import sys\nprint('bye')\nsys.exit(3)")
    assert (r["exit_code"], r["stdout"], r["timed_out"]) == (3, "bye\n", False), r
    r = py(client, "print('before')\nx = 1\ny = x // 0\n")
    assert r["exit_code"] == 1 and r["stdout"] == "before\n", r
    assert "Traceback (most recent call last)" in r["stderr"], r
    assert "ZeroDivisionError" in r["stderr"] and "line 3" in r["stderr"], r
    r = py(client, "raise SystemExit('fatal words')")
    assert r["exit_code"] == 1 and r["stderr"] == "fatal words\n", r
    # stdin
    ok(py(client, "import sys; print(sys.stdin.read().upper(), end='')", stdin="abc\ndéf\n"),
       "ABC\nDÉF\n")
    ok(py(client, "import sys; print(repr(sys.stdin.read()))"), "''\n")
    data = bytes(range(256)) * 3
    ok(py(client, "import sys, hashlib; print(hashlib.sha256(sys.stdin.buffer.read())"
                  ".hexdigest())", stdin=base64.b64encode(data).decode(),
          stdin_encoding="base64"), hashlib.sha256(data).hexdigest() + "\n")
    # files: text, a nested path, base64 content; relative to the call's /workspace
    blob = bytes(range(256))
    code = ("import os, hashlib\n"
            "print(os.getcwd())\n"
            "print(open('in.txt').read())\n"
            "print(open('/workspace/sub/dir/data.bin', 'rb').read().hex() == %r)\n"
            "print(sorted(os.listdir('.')), sorted(os.listdir('sub/dir')))\n" % blob.hex())
    ok(py(client, code, files={"in.txt": "hello file", "sub/dir/data.bin":
                                {"base64": base64.b64encode(blob).decode()}}),
       "/workspace\nhello file\nTrue\n['in.txt', 'sub'] ['data.bin']\n")
    # binary output
    r = ok(py(client, "import sys; sys.stdout.buffer.write(b'\\xff\\x00\\x01')",
              encoding="base64"))
    assert base64.b64decode(r["stdout"]) == b"\xff\x00\x01" and r["encoding"] == "base64", r
    r = ok(py(client, "import sys; sys.stdout.buffer.write(b'a\\xffb')"))
    assert r["stdout"] == "a\ufffdb", r


def test_bash_results(client):
    r = ok(fncall(client, "bash", "echo hello $((6*7))"), "hello 42\n")
    assert r["runtime"] == "bash" and r["stderr"] == ""
    r = fncall(client, "bash", "echo out; echo err >&2; exit 7")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (7, "out\n", "err\n"), r
    r = fncall(client, "bash", "kill -9 $$")
    assert r["signal"] == 9 and r["exit_code"] == 137, r
    ok(fncall(client, "bash", 'read a; read b; echo "[$b|$a]"', stdin="one\ntwo\n"),
       "[two|one]\n")
    ok(fncall(client, "bash", "cat a.txt d/e/f.txt | tr a-z A-Z; pwd",
              files={"a.txt": "abc\n", "d/e/f.txt": {"base64": base64.b64encode(b"xyz\n")
                                                     .decode()}}),
       "ABC\nXYZ\n/workspace\n")
    r = fncall(client, "bash", "no_such_command_xyz")
    assert r["exit_code"] == 127 and "not found" in r["stderr"], r


def test_call_environment(client):
    """uid 1000 in /workspace; own pid namespace and /proc; no capabilities; seccomp filter
    mode and no_new_privs; the tree read-only except fresh tmpfs on /workspace, /tmp, /dev/shm."""
    code = r"""
import os
status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines()
              if ':\t' in l)
print('ids', os.getuid(), os.geteuid(), os.getgid(), os.getcwd())
print('pid', os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print('caps', status['CapInh'].strip(), status['CapPrm'].strip(), status['CapEff'].strip(),
      status['CapAmb'].strip())
print('seccomp', status['Seccomp'].strip(), status['NoNewPrivs'].strip())
for path in ('/', '/etc', '/usr', '/workspace', '/tmp', '/dev/shm'):
    print(path, 'ro' if os.statvfs(path).f_flag & os.ST_RDONLY else 'rw')
fstype = {}
for line in open('/proc/self/mounts'):
    f = line.split()
    fstype[f[1]] = f[2]
print('fs', *(fstype.get(p) for p in ('/workspace', '/tmp', '/dev/shm', '/proc')))
for path in ('/etc/dsec-probe', '/usr/dsec-probe', '/dsec-probe'):
    try:
        open(path, 'w')
        print('wrote', path)
    except OSError as e:
        print('denied', path, e.errno in (13, 30))
try:
    os.setuid(0)
    print('setuid worked')
except PermissionError:
    print('setuid denied')
for path in ('/workspace/w', '/tmp/t', '/dev/shm/s'):
    open(path, 'w').write('x')
print('tmpfs writable')
"""
    r = ok(py(client, code))
    lines = r["stdout"].splitlines()
    assert lines[0] == "ids 1000 1000 1000 /workspace", r
    assert lines[1] == "pid 2 [1, 2]", r
    zero = "0000000000000000"
    assert lines[2] == f"caps {zero} {zero} {zero} {zero}", r
    assert lines[3] == "seccomp 2 1", r
    assert lines[4:10] == ["/ ro", "/etc ro", "/usr ro", "/workspace rw", "/tmp rw",
                           "/dev/shm rw"], r
    assert lines[10] == "fs tmpfs tmpfs tmpfs proc", r
    assert lines[11:14] == [f"denied {p} True" for p in ("/etc/dsec-probe", "/usr/dsec-probe",
                                                         "/dsec-probe")], r
    assert lines[14:] == ["setuid denied", "tmpfs writable"], r
    # The same for the exec runtime: bash is PID 2, its children follow.
    r = ok(fncall(client, "bash", "echo $$ $(id -u) $(pwd); "
                                  "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status"))
    assert r["stdout"] == ("2 1000 /workspace\nCapEff:\t0000000000000000\n"
                           "NoNewPrivs:\t1\nSeccomp:\t2\n"), r


# ---- 2. nothing carries over from one call to the next ------------------------------------

LEAVE_PY = r"""
import os, sys, json, subprocess
for p in ('/workspace/left.txt', '/tmp/left.txt', '/dev/shm/left.txt'):
    open(p, 'w').write('left behind')
os.makedirs('/workspace/dir/sub')
os.environ['DSEC_LEFT'] = '1'
os.putenv('DSEC_LEFT2', '1')
json.dsec_left = 'module state'
sys.modules['dsec_left_module'] = json
sys.path.append('/workspace/dsec_left_path')
import builtins; builtins.dsec_left = 1
os.chdir('/tmp')
subprocess.Popen(['setsid', 'nohup', 'sleep', '%(tag)s'], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', '%(tag)s'])
    os._exit(0)
os.wait()
import time; time.sleep(0.2)
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and
             b'%(tag)s' in open('/proc/%%s/cmdline' %% p, 'rb').read()).__len__())
"""

CHECK_PY = r"""
import os, sys, json, builtins
print([p for p in ('/workspace/left.txt', '/tmp/left.txt', '/dev/shm/left.txt', '/workspace/dir')
       if os.path.exists(p)])
print(os.listdir('/workspace'), os.listdir('/tmp'), os.listdir('/dev/shm'))
print(os.getcwd(), 'DSEC_LEFT' in os.environ, 'DSEC_LEFT2' in os.environ)
print(hasattr(json, 'dsec_left'), 'dsec_left_module' in sys.modules,
      '/workspace/dsec_left_path' in sys.path, hasattr(builtins, 'dsec_left'))
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
print(procs, [p for p in procs if b'sleep' in open('/proc/%s/cmdline' % p, 'rb').read()])
"""

CHECK_OUT = ("[]\n[] [] []\n/workspace False False\nFalse False False False\n[1, 2] []\n")


def test_no_state_carries_over_between_calls(client, edge, pools):
    """One worker (min_idle 1, max 1), so every call here runs on the same worker: files,
    processes, env, cwd and module state of one call are gone for the next."""
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256, preload=["json"])["name"]
    for i in range(3):
        tag = f"61{i}.{os.getpid() % 1000}"
        r = ok(fncall(client, name, LEAVE_PY % {"tag": tag}))
        assert r["stdout"] == "2\n", r  # both sleeps were running when the call ended
        # Gone from the host too: the call's pid namespace ended with the call.
        wait_until(lambda: not host_pids_with(tag.encode()), 10,
                   what=f"sleep {tag} gone from the host")
        ok(fncall(client, name, CHECK_PY), CHECK_OUT)
    info = pool_info(client, name)
    assert info["calls"] == 6 and info["replaced"] == 0, info
    assert workers_total(info) == 1, info


def test_bash_state_does_not_carry_over(client, pools):
    name = pools(runtime="bash", min_idle=1, max=1, memory_mb=128)["name"]
    ok(fncall(client, name, "echo x > /workspace/f; echo y > /tmp/g; echo z > /dev/shm/h; "
                            "export DSEC_LEFT=1; cd /tmp; "
                            "(setsid nohup sleep 633 >/dev/null 2>&1 &)"))
    r = ok(fncall(client, name, 'echo "files:$(ls -A /workspace /tmp /dev/shm | tr -d "\\n")"; '
                                'echo "env:[$DSEC_LEFT]"; echo "cwd:$(pwd)"; '
                                "echo sleeps:$(cat /proc/[0-9]*/comm | grep -cx sleep)"))
    assert r["stdout"] == ("files:/dev/shm:/tmp:/workspace:\nenv:[]\ncwd:/workspace\n"
                           "sleeps:0\n"), r
    info = pool_info(client, name)
    assert info["replaced"] == 0 and info["calls"] == 2, info


# ---- 3. runaway calls are contained to the call -------------------------------------------

def test_timeout(client, pools):
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256)["name"]
    t0 = time.monotonic()
    r = fncall(client, name, "import time\nprint('started', flush=True)\ntime.sleep(60)",
               timeout_ms=500)
    took = time.monotonic() - t0
    assert r["timed_out"] is True and r["exit_code"] != 0, r
    assert r["stdout"] == "started\n", r
    assert took < 5, f"a 500 ms timeout took {took:.1f}s"
    # A busy loop and a process that ignores SIGTERM end the same way.
    r = fncall(client, name, "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             "while True: pass", timeout_ms=300)
    assert r["timed_out"] is True, r
    r = fncall(client, "bash", "trap '' TERM; sleep 30 & sleep 30", timeout_ms=300)
    assert r["timed_out"] is True, r
    ok(fncall(client, name, "print('next')"), "next\n")
    assert pool_info(client, name)["replaced"] == 0


def test_memory_bomb(client, pools):
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256)["name"]
    t0 = time.monotonic()
    r = fncall(client, name, "x = 'a' * (512 << 20)\nprint(len(x))", memory_mb=64,
               timeout_ms=20000)
    assert time.monotonic() - t0 < 15
    assert r["exit_code"] != 0 and r["stdout"] == "", r
    assert r["oom_killed"] or "MemoryError" in r["stderr"], r
    assert not r["timed_out"], r
    # Within the call's limit it works.
    ok(fncall(client, name, "x = 'a' * (24 << 20)\nprint(len(x) >> 20)", memory_mb=64), "24\n")
    # A bomb in a subprocess (the call's children share its limit).
    r = fncall(client, name, "import subprocess\n"
                             "subprocess.run(['python3', '-c',\n"
                             "                'x = bytearray(b\"a\") * (400 << 20)'], check=True)",
               memory_mb=64, timeout_ms=20000)
    assert r["exit_code"] == 1 and "SIGKILL" in r["stderr"] and not r["timed_out"], r
    # The per-call limit does not stick to the worker: the pool's 256 MB apply again.
    ok(fncall(client, name, "x = 'a' * (160 << 20)\nprint(len(x) >> 20)\ndel x"), "160\n")
    ok(fncall(client, name, "print('next')"), "next\n")
    info = pool_info(client, name)
    assert info["replaced"] == 0 and workers_total(info) == 1, info
    assert info["last_error"] is None, info


def test_smaller_memory_limit_right_after_a_big_call(client, pools):
    """A call with a lower memory_mb right after one that used more than that must not cost
    the worker (the pool's worker replacement is for dead workers)."""
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256)["name"]
    outcomes = []
    for i in range(3):
        ok(fncall(client, name, "x = 'a' * (160 << 20)\nprint(len(x) >> 20)"), "160\n")
        r = ok(fncall(client, name, f"print({i})", memory_mb=64), f"{i}\n")
        info = pool_info(client, name)
        outcomes.append((info["replaced"], round(r["queue_ms"]), info["last_error"]))
    assert [o[0] for o in outcomes] == [0, 0, 0], outcomes


def test_fork_bomb(client, pools):
    name = pools(runtime="bash", min_idle=1, max=1, memory_mb=256)["name"]
    t0 = time.monotonic()
    r = fncall(client, name, "b() { b | b & }; b; sleep 30", timeout_ms=2000)
    assert r["timed_out"] is True and time.monotonic() - t0 < 15, r
    # Counted without forking: only this call's bash is left (PID 2), none of the bomb's.
    r = ok(fncall(client, name, "n=0; for f in /proc/[0-9]*/comm; do read c < $f; "
                                '[ "$c" = bash ] && n=$((n+1)); done; echo survived $$ $n',
                  timeout_ms=30000))
    assert r["stdout"] == "survived 2 1\n", r
    pyname = pools(runtime="python", min_idle=1, max=1, memory_mb=256)["name"]
    r = fncall(client, pyname, "import os\nwhile True:\n    try:\n        os.fork()\n"
                               "    except OSError:\n        pass", timeout_ms=2000)
    assert r["timed_out"] is True, r
    # (The bomb's teardown can take seconds on a loaded host: this call gets time for it.)
    ok(fncall(client, pyname, "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
                              "print(os.getpid(), pid, os.waitpid(pid, 0)[1] >> 8)",
              timeout_ms=30000), "2 3 7\n")
    for n in (name, pyname):
        info = pool_info(client, n)
        assert info["replaced"] == 0, info


def test_output_flood(client, pools):
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256)["name"]
    r = fncall(client, name, "import sys\nsys.stdout.write('x' * (50 << 20))\n"
                             "sys.stderr.write('e' * (50 << 20))", max_output_bytes=1000)
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "x" * 1000 and r["stdout_truncated"] is True, r
    assert r["stderr"] == "e" * 1000 and r["stderr_truncated"] is True, r
    # `yes` until the timeout: bounded by the default cap (64 KiB).
    r = fncall(client, "bash", "yes", timeout_ms=1000)
    assert r["timed_out"] is True and r["stdout_truncated"] is True, r
    assert 0 < len(r["stdout"]) <= 65536 and set(r["stdout"]) == {"y", "\n"}, r
    r = fncall(client, name, "print('z' * 100)", max_output_bytes=0)
    assert r["stdout"] == "" and r["stdout_truncated"] is True, r
    ok(fncall(client, name, "print('next')"), "next\n")
    assert pool_info(client, name)["replaced"] == 0


def test_disk_fill(client, pools):
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256, disk_mb=16)["name"]
    code = r"""
import errno, os
for d in ('/workspace', '/tmp', '/dev/shm'):
    n = 0
    try:
        while n < 64:
            with open('%s/fill%d' % (d, n), 'wb') as f:
                f.write(b'x' * (1 << 20))
            n += 1
        print(d, 'fit', n)
    except OSError as e:
        print(d, errno.errorcode[e.errno], 12 <= n <= 16)
"""
    t0 = time.monotonic()
    r = ok(fncall(client, name, code, timeout_ms=20000))
    assert r["stdout"] == "/workspace ENOSPC True\n/tmp ENOSPC True\n/dev/shm ENOSPC True\n", r
    assert time.monotonic() - t0 < 15
    r = fncall(client, "bash", "for i in $(seq 100); do head -c 1048576 /dev/zero > f$i || exit; "
                               "done", timeout_ms=20000)
    assert r["exit_code"] != 0 and "No space left on device" in r["stderr"], r
    # Inodes are bounded too.
    r = ok(fncall(client, name, "import os\nn = 0\ntry:\n    while True:\n"
                                "        open('f%d' % n, 'w').close(); n += 1\n"
                                "except OSError as e:\n    print(e.errno == 28, n < 10**6)",
                  timeout_ms=30000))
    assert r["stdout"] == "True True\n", r
    ok(fncall(client, name, "import os; print(os.listdir('.'), os.statvfs('.').f_bfree > 0)"),
       "[] True\n")
    assert pool_info(client, name)["replaced"] == 0


def test_call_disk_mb_holds_big_files(client, pools):
    """A call's disk is the pool's disk_mb (default 64): one file may use most of it."""
    name = pools(runtime="python", min_idle=1, max=1, memory_mb=256, disk_mb=64)["name"]
    code = ("with open('/workspace/big', 'wb') as f:\n"
            "    for _ in range(40):\n"
            "        f.write(b'x' * (1 << 20))\n"
            "import os; print(os.path.getsize('/workspace/big') >> 20)")
    ok(fncall(client, name, code, timeout_ms=20000), "40\n")
    ok(fncall(client, "bash", "head -c 41943040 /dev/zero > /tmp/big && stat -c %s /tmp/big"),
       "41943040\n")


# ---- 4. queueing, capacity, growth and shrinking ------------------------------------------

def test_queue_bound_429_with_retry_after(edge, client, pools):
    name = pools(runtime="python", min_idle=2, max=2, max_queue=4, queue_timeout_ms=30000,
                 memory_mb=128)["name"]
    body = {"runtime": name, "code": "import time; time.sleep(1.5); print('done')"}
    results = run_concurrently([lambda: timed_call(edge, body) for _ in range(12)])
    codes = sorted(r.status for r, _ in results)
    assert codes == [200] * 6 + [429] * 6, [r for r, _ in results]
    for r, took in results:
        if r.status == 429:
            assert r.json["error"]["code"] == "over_capacity", r
            assert int(r.headers["retry-after"]) >= 1, r.headers
            assert took < 1.0, f"a rejected call should be answered at once, took {took:.2f}s"
        else:
            assert r.json["stdout"] == "done\n", r
    queue_ms = sorted(r.json["queue_ms"] for r, _ in results if r.status == 200)
    assert queue_ms[:2] == [pytest.approx(0, abs=200)] * 2, queue_ms
    assert all(q >= 1200 for q in queue_ms[2:]), queue_ms  # 4 waited for a worker
    info = pool_info(client, name)
    assert info["rejected"] == 6 and info["calls"] == 6, info  # calls: the accepted ones
    assert workers_total(info) == 2 and info["queued"] == 0, info


def test_queue_timeout_429(edge, client, pools):
    name = pools(runtime="python", min_idle=1, max=1, max_queue=4, queue_timeout_ms=300,
                 memory_mb=128)["name"]
    long = {"runtime": name, "code": "import time; time.sleep(2.5); print('long')"}
    short = {"runtime": name, "code": "print('short')"}
    out = {}

    def first():
        out["long"] = timed_call(edge, long)

    t = threading.Thread(target=first, daemon=True)
    t.start()
    wait_until(lambda: pool_info(client, name)["workers"]["busy"] == 1, 10,
               what="the long call running")
    r, took = timed_call(edge, short)
    assert r.status == 429 and r.json["error"]["code"] == "over_capacity", r
    assert r.headers.get("retry-after", "").isdigit(), r.headers
    assert 0.25 <= took < 1.5, f"queued call answered after {took:.2f}s (timeout 300 ms)"
    t.join(30)
    lr, _ = out["long"]
    assert lr.status == 200 and lr.json["stdout"] == "long\n", lr
    ok(fncall(client, name, "print('short')"), "short\n")
    info = pool_info(client, name)
    assert info["rejected"] == 1 and info["replaced"] == 0, info


def test_pool_grows_to_max_and_shrinks_after_idle_timeout(edge, client, pools):
    name = pools(runtime="python", min_idle=1, max=3, idle_timeout_s=2, memory_mb=128)["name"]
    seen = []
    stop = threading.Event()

    def watch():
        c = edge.client()
        while not stop.is_set():
            seen.append(pool_info(c, name)["workers"])
            time.sleep(0.05)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    body = {"runtime": name, "code": "import time; time.sleep(1.5); print('ok')",
            "timeout_ms": 30000}
    try:
        results = run_concurrently([lambda: timed_call(edge, body) for _ in range(6)])
    finally:
        stop.set()
        w.join(10)
    assert [r.status for r, _ in results] == [200] * 6, results
    totals = [x["idle"] + x["busy"] + x["starting"] for x in seen]
    assert max(totals) == 3, seen  # grew to max, never beyond
    assert max(x["busy"] for x in seen) >= 2, seen
    # Right after the burst the workers are still there (idle for less than 2 s) ...
    info = pool_info(client, name)
    assert workers_total(info) == 3 and info["workers"]["busy"] == 0, info
    t0 = time.monotonic()
    # ... and go back to min_idle once idle for idle_timeout_s.
    wait_idle(client, name, 1, timeout=15)
    took = time.monotonic() - t0
    assert took >= 0.5, f"shrank after {took:.2f}s, before idle_timeout_s"
    time.sleep(0.6)
    info = pool_info(client, name)
    assert info["workers"] == {"idle": 1, "busy": 0, "starting": 0}, info
    assert info["replaced"] == 0, info


def test_put_changes_limits_of_a_live_pool(client, pools):
    name = pools(runtime="bash", min_idle=1, max=2, memory_mb=128)["name"]
    r = client.put(f"/v1/pools/{name}", {"min_idle": 3, "max": 4}, expect=200).json
    assert (r["min_idle"], r["max"], r["runtime"]) == (3, 4, "bash"), r
    wait_idle(client, name, 3)
    r = client.put(f"/v1/pools/{name}", {"min_idle": 0, "max": 1, "idle_timeout_s": 1},
                   expect=200).json
    assert (r["min_idle"], r["max"]) == (0, 1), r
    wait_until(lambda: workers_total(pool_info(client, name)) <= 1, 15,
               what="pool trimmed to max 1")
    ok(fncall(client, name, "echo still"), "still\n")


def test_delete_pool_fails_its_running_and_queued_calls(edge, client, pools):
    name = pools(runtime="python", min_idle=1, max=1, queue_timeout_ms=30000,
                 memory_mb=128)["name"]
    out = {}

    def run(key, code):
        out[key] = timed_call(edge, {"runtime": name, "code": code, "timeout_ms": 20000})

    long = threading.Thread(target=run, args=("long", "import time; time.sleep(5)"),
                            daemon=True)
    long.start()
    wait_until(lambda: pool_info(client, name)["workers"]["busy"] == 1, 10, what="busy")
    queued = threading.Thread(target=run, args=("queued", "print(1)"), daemon=True)
    queued.start()
    wait_until(lambda: pool_info(client, name)["queued"] == 1, 10, what="a queued call")
    client.delete(f"/v1/pools/{name}", expect=204)
    client.get(f"/v1/pools/{name}", expect=404)
    long.join(30)
    queued.join(30)
    for key in ("long", "queued"):
        r, took = out[key]
        assert r.status == 503 and r.json["error"]["code"] == "unavailable", (key, r)
        assert took < 4, (key, took)  # not after the 5 s sleep: the worker went at once
    client.post("/v1/fncalls", {"runtime": name, "code": "print(1)"}, expect=404)


def test_fncall_request_id_runs_once(client):
    body = {"runtime": "python", "code": "import os; print(os.urandom(8).hex())",
            "request_id": unique("rid")}
    first = client.post("/v1/fncalls", body, expect=200).json
    again = client.post("/v1/fncalls", body, expect=200).json
    assert first == again and len(first["stdout"]) == 17, (first, again)
    other = client.post("/v1/fncalls", {**body, "code": "print(2)"}, expect=409)
    assert other.json["error"]["code"] == "conflict"
    fresh = client.post("/v1/fncalls", {**body, "request_id": unique("rid")}, expect=200).json
    assert fresh["stdout"] != first["stdout"], (first, fresh)


def test_config_keys_shape_the_builtin_runtimes(make_edge):
    edge = make_edge(config={"fncall_min_idle": 1, "fncall_max": 3, "fncall_max_queue": 5,
                             "fncall_queue_timeout_ms": 700, "fncall_memory_mb": 128,
                             "fncall_python_preload": "json, colorsys"})
    c = edge.client()
    got = {p["name"]: p for p in c.get("/v1/pools", expect=200).json["pools"]}
    assert set(got) == {"python", "bash"}, got
    for n in ("python", "bash"):
        p = got[n]
        assert (p["min_idle"], p["max"], p["max_queue"], p["queue_timeout_ms"],
                p["memory_mb"]) == (1, 3, 5, 700, 128), p
        assert p["workers"]["idle"] == 1, p  # warm when the edge says it is ready
    assert got["python"]["preload"] == ["json", "colorsys"], got["python"]
    ok(py(c, "import sys; print('colorsys' in sys.modules)"), "True\n")
    r = c.post("/v1/fncalls", {"runtime": "python", "code": "1", "memory_mb": 129}, expect=400)
    assert "128" in r.json["error"]["message"], r
    ok(py(c, "x = 'a' * (64 << 20); print(len(x) >> 20)", memory_mb=128), "64\n")


def test_idle_pool_workers_give_way_to_creates(make_edge):
    # --max-sandboxes 4 with the built-in runtimes' 2 + 2 idle workers: all 4 creates fit (the
    # least recently used idle workers go), the 5th is refused, and the pools fill again once
    # the sandboxes are gone.
    edge = make_edge(extra_args=["--max-sandboxes", "4"])
    c = edge.client()
    pools = {p["name"]: p for p in c.get("/v1/pools", expect=200).json["pools"]}
    assert sum(p["workers"]["idle"] for p in pools.values()) == 4, pools
    ids = []
    try:
        for _ in range(4):
            ids.append(c.create({"memory_mb": 64})["id"])
        r = c.post("/v1/sandboxes", {"memory_mb": 64}, expect=429)
        assert "4 of 4" in r.json["error"]["message"], r
        pools = {p["name"]: p for p in c.get("/v1/pools", expect=200).json["pools"]}
        assert sum(p["yielded"] for p in pools.values()) == 4, pools
        assert sum(p["workers"]["idle"] + p["workers"]["starting"]
                   for p in pools.values()) == 0, pools
    finally:
        for sid in ids:
            c.remove(sid)
    wait_until(lambda: sum(p["workers"]["idle"] for p in c.get("/v1/pools").json["pools"]) == 4,
               60, interval=0.2, what="pools refilled")
    ok(py(c, "print(6 * 7)"), "42\n")


@pytest.mark.parametrize("bad", [{"fncall_max": -1}, {"fncall_min_idle": "2"},
                                 {"fncall_pools": "yes"}, {"fncall_memory_mb": 8},
                                 {"fncall_queue_timeout_ms": 600001}])
def test_bad_fncall_config_refused(bad):
    import subprocess
    import tempfile
    if edge_harness.why_not_runnable():
        pytest.skip(edge_harness.why_not_runnable())
    with tempfile.TemporaryDirectory(prefix="dsec-it-cfg-") as tmp:
        cfg = pathlib.Path(tmp) / "config.json"
        cfg.write_text(json.dumps(bad))
        proc = subprocess.Popen([str(edge_harness.edge_binary()), "--listen", "127.0.0.1:0",
                                 "--socket", "", "--state-dir", f"{tmp}/state",
                                 "--token-file", f"{tmp}/tokens", "--config", str(cfg)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()  # it started after all: a clean shutdown
            proc.communicate(timeout=60)
            raise AssertionError(f"dsec-edge started with config {bad}")
    assert proc.returncode != 0 and next(iter(bad)) in err, (proc.returncode, err)


# ---- 5. workers killed from the host ------------------------------------------------------

def test_killed_worker_processes_are_replaced(make_edge):
    """kill -9 of a worker's zygote or of its agent (PID 1 of the worker sandbox), right before
    a call or while idle: the calls that follow all succeed (a call that finds its worker dead
    never started, so it can go to a fresh worker) and the pool counts the replacement."""
    edge = make_edge(config={"fncall_pools": False})
    c = edge.client()
    assert c.get("/v1/pools", expect=200).json["pools"] == []
    r = c.post("/v1/fncalls", {"runtime": "python", "code": "print(1)"}, expect=404)
    assert r.json["error"]["code"] == "not_found"
    name = "it-victim"
    marker = b"--preload=json,wave"
    c.put(f"/v1/pools/{name}", {"runtime": "python", "min_idle": 1, "max": 1,
                                 "preload": ["json", "wave"], "memory_mb": 128},
          expect=201)
    try:
        wait_idle(c, name, 1)
        ok(fncall(c, name, "import sys; print('wave' in sys.modules)"), "True\n")
        outcomes = []
        for victim, pause in (("zygote", 0), ("agent", 0), ("zygote", 1.0), ("agent", 1.0)):
            # One worker: until the pool has destroyed the sandbox of a worker killed before, a
            # pre-forked call process of its dead zygote (reparented to that sandbox's agent)
            # looks like a second zygote for a moment.
            z = wait_until(lambda: (lambda z: z if len(z) == 1 else None)(zygotes(edge, marker)),
                           15, what="the worker's zygote, alone")
            assert len(z) == 1, z
            (zpid, agent), = z.items()
            assert cmdline(agent) == b"dsec-agent\0", (agent, cmdline(agent))
            before = pool_info(c, name)["replaced"]
            os.kill(zpid if victim == "zygote" else agent, signal.SIGKILL)
            time.sleep(pause)
            got = []
            for i in range(3):
                r = c.post("/v1/fncalls", {"runtime": name, "code": f"print({i})",
                                           "timeout_ms": 20000})
                got.append(r.status if r.status != 200 else r.json["stdout"])
            info = pool_info(c, name)
            outcomes.append((victim, pause, got, info["replaced"] - before))
            wait_idle(c, name, 1)
            assert zpid not in zygotes(edge, marker)
        want = [(v, p, ["0\n", "1\n", "2\n"], 1) for v, p, _, _ in outcomes]
        assert outcomes == want, f"{outcomes}\nedge log:\n{edge.log_tail(15)}"
        assert c.get("/v1/health", expect=200).json == {"ok": True}
    finally:
        c.delete(f"/v1/pools/{name}", expect=(204, 404))


# ---- 6. container pools -------------------------------------------------------------------

def test_container_pool(client, pools):
    name = unique("it-ct")
    info = pools(name, kind="container", image="host", min_idle=2, max=4, memory_mb=128,
                 disk_mb=64)
    assert (info["kind"], info["image"], info["memory_mb"], info["min_idle"]) == \
        ("container", "host", 128, 2), info
    made = []
    try:
        t0 = time.monotonic()
        sb = client.post("/v1/sandboxes", {"pool": name, "labels": {"suite": "it-pool"}},
                         expect=201).json
        took = time.monotonic() - t0
        made.append(sb["id"])
        assert sb["state"] == "running" and sb["labels"] == {"suite": "it-pool"}, sb
        assert sb["limits"]["memory_mb"] == 128 and sb["limits"]["disk_mb"] == 64, sb
        info = pool_info(client, name)
        assert (info["taken"], info["missed"]) == (1, 0), info
        assert took < 2, f"a pooled create took {took:.2f}s"
        assert client.sh(sb["id"], "echo hi; id -u") == "hi\n1000\n"
        rec = client.get(f"/v1/sandboxes/{sb['id']}", expect=200).json
        assert rec["state"] == "running" and rec["limits"] == sb["limits"], rec
        # Refilled to min_idle.
        wait_idle(client, name, 2)
        # More than are idle: two from the pool, one created fresh.
        many = client.post("/v1/sandboxes", {"pool": name, "count": 3}, expect=201).json
        ids = [s["id"] for s in many["sandboxes"]]
        made += ids
        assert len(set(ids)) == 3 and sb["id"] not in ids, many
        for s in many["sandboxes"]:
            assert s["state"] == "running" and s["limits"]["memory_mb"] == 128, s
            assert client.sh(s["id"], "echo $((1+1))") == "2\n"
        info = pool_info(client, name)
        assert (info["taken"], info["missed"]) == (3, 1), info
        # Fields the pool fixes: equal is fine, different is 400.
        same = client.post("/v1/sandboxes", {"pool": name, "memory_mb": 128, "image": "host"},
                           expect=201).json
        made.append(same["id"])
        for bad in ({"memory_mb": 256}, {"disk_mb": 32}, {"cpu": 2}, {"pids": 100},
                    {"image": "other"}, {"env": {"A": "1"}}):
            r = client.post("/v1/sandboxes", {"pool": name, **bad}, expect=400)
            assert r.json["error"]["code"] == "bad_request", (bad, r)
        client.post("/v1/sandboxes", {"pool": "it-no-such-pool"}, expect=404)
        client.post("/v1/sandboxes", {"pool": 5}, expect=400)
        client.post("/v1/sandboxes", {"pool": "python"}, expect=400)  # a runtime, not a pool
        # A container pool is no runtime.
        client.post("/v1/fncalls", {"runtime": name, "code": "echo"}, expect=404)
        # Deleting the pool leaves the sandboxes taken from it to their owners.
        client.delete(f"/v1/pools/{name}", expect=204)
        client.get(f"/v1/pools/{name}", expect=404)
        assert client.sh(sb["id"], "echo alive") == "alive\n"
    finally:
        for sid in made:
            client.remove(sid)
    for sid in made:
        client.get(f"/v1/sandboxes/{sid}", expect=404)


def test_pooled_sandbox_record_names_its_pool(client, pools):
    name = pools(unique("it-ct"), kind="container", image="host", min_idle=1, max=1,
                 memory_mb=96)["name"]
    sb = client.post("/v1/sandboxes", {"pool": name}, expect=201).json
    try:
        assert pool_info(client, name)["taken"] == 1
        rec = client.get(f"/v1/sandboxes/{sb['id']}", expect=200).json
        listed = [s for s in client.get("/v1/sandboxes", expect=200).json["sandboxes"]
                  if s["id"] == sb["id"]]
        assert [sb.get("pool"), rec.get("pool"), listed[0].get("pool")] == [name] * 3, rec
    finally:
        client.remove(sb["id"])


# ---- 7. bad input -------------------------------------------------------------------------

BAD_CALLS = [
    "{", "[]", "null", {}, {"code": "print(1)"}, {"runtime": "python"},
    {"runtime": "", "code": "x"}, {"runtime": 5, "code": "x"}, {"runtime": "python", "code": 5},
    {"runtime": "python", "code": None}, {"runtime": ["python"], "code": "x"},
    {"runtime": "python", "code": "x", "bogus": 1},
    {"runtime": "python", "code": "x", "timeout_ms": "10"},
    {"runtime": "python", "code": "x", "timeout_ms": 0},
    {"runtime": "python", "code": "x", "timeout_ms": -1},
    {"runtime": "python", "code": "x", "timeout_ms": 600001},
    {"runtime": "python", "code": "x", "timeout_ms": 86400000},
    {"runtime": "python", "code": "x", "timeout_ms": 1e300},
    {"runtime": "python", "code": "x", "timeout_ms": 1.5},
    {"runtime": "python", "code": "x", "memory_mb": 8},
    {"runtime": "python", "code": "x", "memory_mb": 1 << 19},  # above the runtime's 512
    {"runtime": "python", "code": "x", "max_output_bytes": -1},
    {"runtime": "python", "code": "x", "max_output_bytes": 1 << 40},
    {"runtime": "python", "code": "x", "encoding": "latin-1"},
    {"runtime": "python", "code": "x", "stdin": 5},
    {"runtime": "python", "code": "x", "stdin": "!!", "stdin_encoding": "base64"},
    {"runtime": "python", "code": "x", "stdin": "x", "stdin_encoding": "rot13"},
    {"runtime": "python", "code": "x", "files": []},
    {"runtime": "python", "code": "x", "files": "a.txt"},
    {"runtime": "python", "code": "x", "files": {"a": 5}},
    {"runtime": "python", "code": "x", "files": {"a": None}},
    {"runtime": "python", "code": "x", "files": {"../x": "x"}},
    {"runtime": "python", "code": "x", "files": {"/abs": "x"}},
    {"runtime": "python", "code": "x", "files": {"a/../../b": "x"}},
    {"runtime": "python", "code": "x", "files": {"a/./b": "x"}},
    {"runtime": "python", "code": "x", "files": {"..": "x"}},
    {"runtime": "python", "code": "x", "files": {"": "x"}},
    {"runtime": "python", "code": "x", "files": {"a//b": "x"}},
    {"runtime": "python", "code": "x", "files": {"a/": "x"}},
    {"runtime": "python", "code": "x", "files": {"a\u0000b": "x"}},
    {"runtime": "python", "code": "x", "files": {"a": {"base64": "!!!"}}},
    {"runtime": "python", "code": "x", "files": {"a": {"base64": "YQ==", "mode": 7}}},
    {"runtime": "python", "code": "x", "files": {"a": {"text": "x"}}},
    {"runtime": "python", "code": "x", "files": {f"f{i}": "" for i in range(257)}},
    {"runtime": "python", "code": "x", "request_id": 5},
]


@pytest.mark.parametrize("body", BAD_CALLS, ids=[str(i) for i in range(len(BAD_CALLS))])
def test_fncall_rejects_bad_input(client, body):
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.post("/v1/fncalls", raw, headers={"Content-Type": "application/json"})
    assert r.status == 400, (body, r)
    assert r.json["error"]["code"] == "bad_request", r


def test_fncall_unknown_runtime_and_edge_stays_up(client):
    r = client.post("/v1/fncalls", {"runtime": "no-such-runtime", "code": "x"}, expect=404)
    assert r.json["error"]["code"] == "not_found"
    r = client.post("/v1/fncalls", {"runtime": "../python", "code": "x"})
    assert r.status in (400, 404), r
    client.get("/v1/pools/no-such-pool", expect=404)
    client.delete("/v1/pools/no-such-pool", expect=404)
    client.post("/v1/fncalls", {"runtime": "python", "code": "x"}, token="wrong", expect=401)
    assert client.get("/v1/health", expect=200).json == {"ok": True}
    ok(py(client, "print('fine')"), "fine\n")


def test_fncall_too_large_for_the_agent_is_413_and_edge_stays_up(client):
    """A body under the JSON limit whose files grow past one agent frame once base64-encoded
    is refused with 413 (it used to abort the edge)."""
    big = "x" * (900 * 1024)
    r = client.post("/v1/fncalls", {"runtime": "python", "code": "print(1)",
                                    "files": {"big.txt": big}})
    assert r.status == 413 and r.json["error"]["code"] == "too_large", r
    r = client.post("/v1/sandboxes/none/exec", {"cmd": ["true"]})  # the edge is still up
    assert r.status in (400, 404), r
    ok(py(client, "print(len(open('small.txt').read()))", files={"small.txt": "x" * 200000}),
       "200000\n")


BAD_POOLS = [
    {"runtime": "python", "bogus": 1},
    {"kind": "vm", "runtime": "python"},
    {"kind": 5, "runtime": "python"},
    {"kind": "fncall"},  # no runtime
    {},
    {"runtime": "ruby"},
    {"runtime": 5},
    {"runtime": "exec"},  # exec needs a command
    {"runtime": "exec", "command": "ls"},
    {"runtime": "exec", "command": [1]},
    {"runtime": "python", "min_idle": 5, "max": 2},
    {"runtime": "python", "max": 0},
    {"runtime": "python", "max": 5000},
    {"runtime": "python", "min_idle": -1},
    {"runtime": "python", "min_idle": "1"},
    {"runtime": "python", "min_idle": 1.5},
    {"runtime": "python", "memory_mb": 8},
    {"runtime": "python", "disk_mb": 0},
    {"runtime": "python", "pids": 4},
    {"runtime": "python", "cpu": 0},
    {"runtime": "python", "cpu": "1"},
    {"runtime": "python", "max_queue": -1},
    {"runtime": "python", "queue_timeout_ms": -1},
    {"runtime": "python", "queue_timeout_ms": 600001},
    {"runtime": "python", "idle_timeout_s": 0},
    {"runtime": "python", "preload": "json"},
    {"runtime": "python", "preload": ["os; import shutil"]},
    {"runtime": "python", "preload": ["../x"]},
    {"runtime": "python", "preload": [5]},
    {"runtime": "python", "name": "something-else"},
    {"kind": "container", "memory_mb": 1 << 21},
    {"kind": "container", "cpu": 5000},
    {"kind": "container", "min_idle": 3, "max": 1},
    {"kind": "container", "bogus": True},
    "[]", "{", "\"python\"",
]


@pytest.mark.parametrize("body", BAD_POOLS, ids=[str(i) for i in range(len(BAD_POOLS))])
def test_put_pool_rejects_bad_input(client, body):
    name = unique("it-bad")
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.put(f"/v1/pools/{name}", raw, headers={"Content-Type": "application/json"})
    try:
        assert r.status == 400, (body, r)
        assert r.json["error"]["code"] == "bad_request", r
        client.get(f"/v1/pools/{name}", expect=404)
    finally:
        if r.status < 300:
            client.delete(f"/v1/pools/{name}")


def test_put_pool_bad_names_and_images(client, pools):
    for bad in ("a..b", "..", "a%20b", "a%2Fb", "-" * 129):
        r = client.put(f"/v1/pools/{bad}", {"runtime": "python"})
        assert r.status == 400 and r.json["error"]["code"] == "bad_request", (bad, r)
    img = unique("it-img")
    for body, status, code in (({"kind": "container", "image": "nosuch:1"}, 404, "not_found"),
                               ({"runtime": "python", "image": "nosuch:1"}, 422, "unprocessable"),
                               ({"runtime": "bash", "image": "other:1"}, 422, "unprocessable")):
        r = client.put(f"/v1/pools/{img}", body)
        if r.status < 300:
            client.delete(f"/v1/pools/{img}")
        assert r.status == status and r.json["error"]["code"] == code, r
    r = client.put(f"/v1/pools/{img}", {"kind": "container", "image": "Bad Name!"})
    assert r.status == 400 and r.json["error"]["code"] == "bad_request", r
    client.get(f"/v1/pools/{img}", expect=404)
    # A bad PUT on an existing pool leaves it as it was.
    name = pools(runtime="bash", min_idle=1, max=2, memory_mb=128)["name"]
    before = pool_info(client, name)
    client.put(f"/v1/pools/{name}", {"max": 0}, expect=400)
    client.put(f"/v1/pools/{name}", {"min_idle": 3}, expect=400)  # above max 2
    client.put(f"/v1/pools/{name}", {"bogus": 1}, expect=400)
    after = pool_info(client, name)
    for k in ("runtime", "min_idle", "max", "memory_mb", "max_queue", "queue_timeout_ms"):
        assert before[k] == after[k], (k, before, after)
    ok(fncall(client, name, "echo fine"), "fine\n")
    assert client.get("/v1/health", expect=200).json == {"ok": True}


# ---- 8. pools are kept across edge restarts -----------------------------------------------

def test_pools_persist_across_restarts(make_edge):
    edge = make_edge(config={"fncall_pools": False})
    c = edge.client()
    py_cfg = {"kind": "fncall", "runtime": "python", "min_idle": 1, "max": 2,
              "preload": ["json", "colorsys"], "memory_mb": 128, "max_queue": 7,
              "queue_timeout_ms": 1234, "idle_timeout_s": 9}
    c.put("/v1/pools/it-keep", py_cfg, expect=201)
    c.put("/v1/pools/it-keep", {"max": 3}, expect=200)  # a change is kept too
    c.put("/v1/pools/it-sh", {"runtime": "exec", "command": ["/bin/sh", "-c"], "min_idle": 1,
                              "max": 1, "memory_mb": 64}, expect=201)
    c.put("/v1/pools/it-ct", {"kind": "container", "image": "host", "min_idle": 1, "max": 2,
                              "memory_mb": 96}, expect=201)
    want = {**py_cfg, "max": 3, "name": "it-keep"}

    def check(c, names):
        got = {p["name"]: p for p in c.get("/v1/pools", expect=200).json["pools"]}
        assert set(got) == names, got
        if "it-keep" in names:
            k = got["it-keep"]
            assert {f: k[f] for f in want} == want, k
            wait_idle(c, "it-keep", 1)
            ok(fncall(c, "it-keep", "import sys; print('colorsys' in sys.modules)"), "True\n")
        if "it-sh" in names:
            assert got["it-sh"]["command"] == ["/bin/sh", "-c"], got["it-sh"]
            ok(fncall(c, "it-sh", "echo sh $((2+3))"), "sh 5\n")
        if "it-ct" in names:
            assert (got["it-ct"]["kind"], got["it-ct"]["memory_mb"]) == ("container", 96)
            wait_idle(c, "it-ct", 1)

    check(c, {"it-keep", "it-sh", "it-ct"})
    assert edge.stop() == 0
    edge.launch()
    c = edge.client()
    check(c, {"it-keep", "it-sh", "it-ct"})
    c.delete("/v1/pools/it-ct", expect=204)
    c.delete("/v1/pools/it-sh", expect=204)
    # A crash: the pools come back; the old workers are cleaned up (the teardown checks).
    edge.kill9()
    edge.launch()
    assert edge.adopted == 0
    c = edge.client()
    check(c, {"it-keep"})
    c.delete("/v1/pools/it-keep", expect=204)
    assert edge.stop() == 0
    edge.launch()
    assert edge.client().get("/v1/pools", expect=200).json["pools"] == []
