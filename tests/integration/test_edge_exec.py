"""Commands on a live edge: buffered exec, ?stream=1 NDJSON, background execs, signal-all,
shell sessions and the WebSocket attach."""

import base64
import json
import threading
import time

import pytest

import edge_harness
from edge_harness import WebSocket, ndjson_lines, wait_until


def run(client, sid, expect=200, **body):
    return client.post(f"/v1/sandboxes/{sid}/exec", body, expect=expect).json


# ---- buffered exec ------------------------------------------------------------------------

def test_exec_basics(client, sandbox):
    r = run(client, sandbox, cmd=["python3", "-c", "print(1)"])
    assert r["exit_code"] == 0 and r["stdout"] == "1\n" and r["stderr"] == ""
    assert r["signal"] is None and not r["timed_out"] and not r["oom_killed"]
    assert r["stdout_bytes"] == 2 and r["encoding"] == "utf-8" and r["duration_ms"] >= 0
    r = run(client, sandbox, shell="echo out; echo err >&2; exit 3")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n")
    r = run(client, sandbox, cmd=["sh", "-c", "exit 255"])
    assert r["exit_code"] == 255
    # A string cmd (as E2B-style REST users send it) runs as sh -c, like "shell".
    r = run(client, sandbox, cmd="echo out; echo err >&2; exit 4")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (4, "out\n", "err\n")
    r = run(client, sandbox, shell="kill -9 $$")
    assert r["signal"] == 9 and r["exit_code"] == 137
    r = run(client, sandbox, cmd=["/no/such/binary"])
    assert r["exit_code"] != 0
    # env, cwd, user
    r = run(client, sandbox, shell='echo "$A $B $(pwd) $(id -u)"', env={"A": "1", "B": "two"},
            cwd="/tmp", user="root")
    assert r["stdout"] == "1 two /tmp 0\n"


def test_exec_stdin(client, sandbox):
    r = run(client, sandbox, cmd=["cat"], stdin="hello\nworld")
    assert r["stdout"] == "hello\nworld"
    data = bytes(range(256))
    r = run(client, sandbox, cmd=["sha256sum"], stdin=base64.b64encode(data).decode(),
            stdin_encoding="base64")
    import hashlib
    assert r["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    r = run(client, sandbox, cmd=["wc", "-c"], stdin="x" * 500000)
    assert r["stdout"].strip() == "500000"
    r = run(client, sandbox, cmd=["cat"])  # no stdin: EOF at once
    assert r["stdout"] == "" and r["exit_code"] == 0


def test_exec_binary_output_and_invalid_utf8(client, sandbox):
    r = run(client, sandbox, shell=r"printf '\377\000\001'", encoding="base64")
    assert base64.b64decode(r["stdout"]) == b"\xff\x00\x01" and r["encoding"] == "base64"
    r = run(client, sandbox, shell=r"printf 'a\377b'")
    assert r["stdout"] == "a\ufffdb"
    r = run(client, sandbox, shell="printf 'h\\303\\251llo'")
    assert r["stdout"] == "héllo"


def test_exec_timeout(client, sandbox):
    t0 = time.monotonic()
    r = run(client, sandbox, cmd=["sleep", "60"], timeout_ms=300)
    assert r["timed_out"] is True and r["exit_code"] != 0
    assert time.monotonic() - t0 < 30
    r = run(client, sandbox, shell="sleep 0.1; echo done", timeout_ms=0)  # 0 = no timeout
    assert r["stdout"] == "done\n" and not r["timed_out"]


def test_exec_output_caps(client, sandbox):
    r = run(client, sandbox, shell="head -c 100000 /dev/zero | tr '\\0' a; "
                                   "head -c 50 /dev/zero | tr '\\0' b >&2",
            max_output_bytes=1000)
    assert r["stdout"] == "a" * 1000 and r["stdout_truncated"] is True
    assert r["stdout_bytes"] >= 1000
    assert r["stderr"] == "b" * 50 and r["stderr_truncated"] is False
    r = run(client, sandbox, shell="echo hi", max_output_bytes=0)
    assert r["stdout"] == "" and r["stdout_truncated"] is True
    # A big output under the default cap arrives whole.
    r = run(client, sandbox, shell="head -c 800000 /dev/zero | tr '\\0' z")
    assert len(r["stdout"]) == 800000 and not r["stdout_truncated"]


def test_exec_leaves_background_children(client, sandbox):
    # The exec ends when its process exits; a child left behind keeps running.
    r = run(client, sandbox, shell="(sleep 0.3; echo late > /workspace/late) >/dev/null 2>&1 &"
                                   " echo parent")
    assert r["stdout"] == "parent\n"
    wait_until(lambda: run(client, sandbox, shell="cat /workspace/late 2>/dev/null")["stdout"]
               == "late\n", 10, what="background child output")


BAD_EXEC = [
    "{", "[]", {}, {"cmd": []}, {"cmd": [""]}, {"cmd": ""}, {"cmd": "ls", "shell": "ls"},
    {"cmd": 5}, {"cmd": [1]},
    {"cmd": ["ls"], "shell": "ls"}, {"shell": 5}, {"cmd": ["ls"], "bogus": True},
    {"cmd": ["ls"], "timeout_ms": -1}, {"cmd": ["ls"], "timeout_ms": 86400001},
    {"cmd": ["ls"], "timeout_ms": 1e300}, {"cmd": ["ls"], "timeout_ms": "10"},
    {"cmd": ["ls"], "max_output_bytes": -5}, {"cmd": ["ls"], "max_output_bytes": 2**40},
    {"cmd": ["ls"], "encoding": "latin-1"}, {"cmd": ["ls"], "stdin_encoding": "rot13",
                                             "stdin": "x"},
    {"cmd": ["ls"], "stdin": "!!notbase64", "stdin_encoding": "base64"},
    {"cmd": ["ls"], "env": {"A": 1}}, {"cmd": ["ls"], "background": "yes"},
    {"cmd": ["ls"], "stdin": 5}, {"cmd": ["ls"], "request_id": ["x"]},
]


@pytest.mark.parametrize("body", BAD_EXEC, ids=[str(i) for i in range(len(BAD_EXEC))])
def test_exec_rejects_bad_input(client, sandbox, body):
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.post(f"/v1/sandboxes/{sandbox}/exec", raw,
                    headers={"Content-Type": "application/json"}, validate=False)
    assert r.status == 400, (body, r)
    client.check(r)


def test_exec_bad_cwd_and_user(client, sandbox):
    r = client.post(f"/v1/sandboxes/{sandbox}/exec", {"cmd": ["pwd"], "cwd": "/no/such/dir"},
                    validate=False)
    assert r.status in (200, 400, 404), r
    if r.status == 200:
        assert r.json["exit_code"] != 0
    r = client.post(f"/v1/sandboxes/{sandbox}/exec", {"cmd": ["id"], "user": "no such user"},
                    validate=False)
    assert 400 <= r.status < 500, r
    client.check(r)


# ---- streaming ----------------------------------------------------------------------------

def test_exec_stream_incremental(client, sandbox):
    body = {"shell": "echo first; echo oops >&2; "
                     "while [ ! -e /workspace/go ]; do sleep 0.02; done; echo second; exit 4"}
    conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1", body)
    try:
        assert resp.status == 200
        assert resp.getheader("Content-Type").startswith("application/x-ndjson")
        assert resp.getheader("Transfer-Encoding") == "chunked"
        lines = ndjson_lines(resp)
        got = [next(lines), next(lines)]
        # The command is still blocked: these lines arrived while it runs.
        assert {"stdout": "first\n"} in got and {"stderr": "oops\n"} in got
        client.put(f"/v1/sandboxes/{sandbox}/files?path=/workspace/go", b"", expect=204)
        rest = list(lines)
    finally:
        conn.close()
    assert rest[0] == {"stdout": "second\n"}
    final = rest[-1]["exit"]
    assert final["exit_code"] == 4 and "stdout" not in final
    edge_harness.spec().validate_response(
        "POST", f"/v1/sandboxes/{sandbox}/exec?stream=1", 200, got + rest,
        content_type="application/x-ndjson")


def test_exec_stream_base64_and_fast_command(client, sandbox):
    conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1",
                               {"shell": r"printf '\377\376'", "encoding": "base64"})
    try:
        lines = list(ndjson_lines(resp))
    finally:
        conn.close()
    out = b"".join(base64.b64decode(x["stdout"]) for x in lines if "stdout" in x)
    assert out == b"\xff\xfe"
    assert lines[-1]["exit"]["exit_code"] == 0 and lines[-1]["exit"]["encoding"] == "base64"


def test_exec_stream_many_lines_in_order(client, sandbox):
    conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1",
                               {"shell": "seq 1 20000"})
    try:
        lines = list(ndjson_lines(resp))
    finally:
        conn.close()
    text = "".join(x.get("stdout", "") for x in lines)
    assert text == "".join(f"{i}\n" for i in range(1, 20001))
    assert "exit" in lines[-1]


def test_exec_stream_disconnect_kills(client, sandbox):
    conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1",
                               {"shell": "echo started; exec sleep 299.5"})
    lines = ndjson_lines(resp)
    assert next(lines) == {"stdout": "started\n"}
    conn.sock.shutdown(2)
    conn.close()
    wait_until(lambda: "299.5" not in client.sh(sandbox, "ps -eo args"), 15,
               what="streamed command killed on disconnect")


def test_exec_stream_error_status_before_stream(client):
    r = client.post("/v1/sandboxes/sb-it-unknown/exec?stream=1", {"cmd": ["true"]}, expect=404)
    assert r.json["error"]["code"] == "not_found"


# ---- background execs ---------------------------------------------------------------------

def test_background_status_wait_list(client, sandbox):
    r = client.post(f"/v1/sandboxes/{sandbox}/exec",
                    {"shell": "while [ ! -e /workspace/bg-go ]; do sleep 0.02; done; echo done",
                     "background": True}, expect=202).json
    eid = r["exec_id"]
    assert eid.startswith("ex-")
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=200).json
    assert st["state"] == "running" and st["result"] is None and st["exec_id"] == eid
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?wait_ms=100", expect=200).json
    assert st["state"] == "running"  # the wait ended first
    listing = client.get(f"/v1/sandboxes/{sandbox}/execs", expect=200).json
    assert eid in [e["exec_id"] for e in listing["execs"]]
    # A waiter blocked on the exec gets the result as soon as it ends.
    results = []
    t = threading.Thread(target=lambda: results.append(
        client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?wait_ms=60000").json))
    t.start()
    client.put(f"/v1/sandboxes/{sandbox}/files?path=/workspace/bg-go", b"", expect=204)
    t.join(60)
    assert results and results[0]["state"] == "exited"
    assert results[0]["result"]["stdout"] == "done\n" and results[0]["result"]["exit_code"] == 0
    for q in ("wait_ms=-1", "wait_ms=600001", "wait_ms=x"):
        client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?{q}", expect=400, validate=False)


def test_background_kill(client, sandbox):
    eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                      {"cmd": ["sleep", "300"], "background": True}, expect=202).json["exec_id"]
    # (Killed only once it runs: see test_kill_right_after_start for the race before that.)
    wait_until(lambda: "sleep 300" in client.sh(sandbox, "ps -eo args"), 10, what="running")
    # The kill answers once the exec is gone: its state is final at once (issue 21 item 5).
    st = client.post(f"/v1/sandboxes/{sandbox}/execs/{eid}/kill", None, expect=200).json
    assert st["state"] == "exited" and st["result"]["signal"] == 9, st
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=200).json
    assert st["state"] == "exited" and st["result"]["signal"] == 9
    assert "sleep 300" not in client.sh(sandbox, "ps -eo args")
    # Killing what already ended answers its result again.
    again = client.post(f"/v1/sandboxes/{sandbox}/execs/{eid}/kill", None, expect=200).json
    assert again["result"]["signal"] == 9
    # DELETE forgets it: gone from GET and the list.
    client.delete(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=204)
    client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=404)
    client.post(f"/v1/sandboxes/{sandbox}/execs/{eid}/kill", None, expect=404)
    listing = client.get(f"/v1/sandboxes/{sandbox}/execs", expect=200).json["execs"]
    assert eid not in [e["exec_id"] for e in listing]
    client.delete(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=404)
    client.delete(f"/v1/sandboxes/{sandbox}/execs/ex-nope", expect=404)
    client.post(f"/v1/sandboxes/{sandbox}/execs/ex-nope/kill", None, expect=404)
    # DELETE of a running exec kills it too.
    eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                      {"shell": "exec sleep 301", "background": True}, expect=202).json["exec_id"]
    wait_until(lambda: "sleep 301" in client.sh(sandbox, "ps -eo args"), 10, what="running")
    client.delete(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=204)
    client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}", expect=404)
    wait_until(lambda: "sleep 301" not in client.sh(sandbox, "ps -eo args"), 10,
               what="the deleted exec's process gone")


def test_background_live_output_from_offsets(client, sandbox):
    """A running background exec's output so far, read from offsets, waiting for more."""
    script = ("import sys, os, time\n"
              "print('one', flush=True)\n"
              "sys.stderr.write('warn\\n'); sys.stderr.flush()\n"
              "while not os.path.exists('/workspace/live-go'): time.sleep(0.02)\n"
              "sys.stdout.buffer.write('caf\\u00e9'.encode()[:4]); sys.stdout.flush()\n"
              "while not os.path.exists('/workspace/live-go2'): time.sleep(0.02)\n"
              "sys.stdout.buffer.write('caf\\u00e9'.encode()[4:] + b' end\\n')\n")
    eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                      {"cmd": ["python3", "-c", script], "background": True},
                      expect=202).json["exec_id"]
    base = f"/v1/sandboxes/{sandbox}/execs/{eid}"
    wait_until(lambda: client.get(f"{base}?stdout_offset=0", expect=200).json["stdout"]
               == "one\n", 20, what="first line while running")
    st = client.get(f"{base}?stdout_offset=0&stderr_offset=0", expect=200).json
    assert st["state"] == "running" and st["result"] is None
    assert (st["stdout"], st["stdout_offset"]) == ("one\n", 4)
    assert (st["stderr"], st["stderr_offset"]) == ("warn\n", 5)
    assert st["encoding"] == "utf-8"
    # From an offset: only what came after. A wait returns as soon as new output arrives.
    st = client.get(f"{base}?stdout_offset=4&stderr_offset=5&wait_ms=100", expect=200).json
    assert (st["stdout"], st["stdout_offset"], st["stderr"]) == ("", 4, "")
    got = []
    t = threading.Thread(target=lambda: got.append(
        client.get(f"{base}?stdout_offset=4&wait_ms=60000").json))
    t.start()
    time.sleep(0.3)
    client.put(f"/v1/sandboxes/{sandbox}/files?path=/workspace/live-go", b"", expect=204)
    t.join(60)
    # 'café' is split inside the é: the text stops before it; the offset says where.
    assert got and got[0]["stdout"] == "caf" and got[0]["stdout_offset"] == 7, got
    # The next read, after the rest of it arrived, completes the character.
    client.put(f"/v1/sandboxes/{sandbox}/files?path=/workspace/live-go2", b"", expect=204)
    done = client.get(f"{base}?wait_ms=30000", expect=200).json
    assert done["state"] == "exited" and done["result"]["stdout"] == "one\ncaf\u00e9 end\n"
    st = client.get(f"{base}?stdout_offset=7", expect=200).json
    total = len("one\ncaf\u00e9 end\n".encode())
    assert st["stdout"] == "\u00e9 end\n" and st["stdout_offset"] == total
    assert st["state"] == "exited" and st["result"]["exit_code"] == 0
    # max_bytes bounds a read; past the end is empty.
    st = client.get(f"{base}?stdout_offset=0&max_bytes=2", expect=200).json
    assert (st["stdout"], st["stdout_offset"]) == ("on", 2)
    st = client.get(f"{base}?stdout_offset=1000", expect=200).json  # past the end: the end
    assert st["stdout"] == "" and st["stdout_offset"] == total
    # A list shows states, never the output.
    listing = client.get(f"/v1/sandboxes/{sandbox}/execs", expect=200).json["execs"]
    mine = [e for e in listing if e["exec_id"] == eid][0]
    assert "stdout" not in (mine["result"] or {})
    for q in ("stdout_offset=-1", "stdout_offset=x", "stderr_offset=1.5", "max_bytes=-1",
              f"max_bytes={(64 << 20) + 1}", "stdout_offset=0&wait_ms=600001"):
        client.get(f"{base}?{q}", expect=400, validate=False)
    # A base64 exec's live reads are the raw bytes, offsets count bytes.
    eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                      {"shell": "printf 'ab\\377\\376'", "background": True,
                       "encoding": "base64"}, expect=202).json["exec_id"]
    client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?wait_ms=30000", expect=200)
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?stdout_offset=1", expect=200).json
    assert st["encoding"] == "base64" and base64.b64decode(st["stdout"]) == b"b\xff\xfe"
    assert st["stdout_offset"] == 4


def test_kill_right_after_start(client, sandbox):
    survivors = []
    for _ in range(25):
        eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                          {"cmd": ["sleep", "300"], "background": True},
                          expect=202).json["exec_id"]
        st = client.post(f"/v1/sandboxes/{sandbox}/execs/{eid}/kill", None, expect=200).json
        if st["state"] != "exited":
            survivors.append(eid)
    client.post(f"/v1/sandboxes/{sandbox}/signal", {"signal": "KILL"}, expect=200)
    assert not survivors, f"{len(survivors)} of 25 killed execs kept running"


def test_signal_all(client, sandbox):
    eid = client.post(f"/v1/sandboxes/{sandbox}/exec",
                      {"shell": "sleep 300 & sleep 300 & wait", "background": True},
                      expect=202).json["exec_id"]
    wait_until(lambda: client.sh(sandbox, "ps -eo args").count("sleep 300") >= 2, 10,
               what="sleeps started")
    r = client.post(f"/v1/sandboxes/{sandbox}/signal", {"signal": "SIGKILL"}, expect=200).json
    assert r["signaled"] >= 3
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{eid}?wait_ms=30000", expect=200).json
    assert st["state"] == "exited"
    # The agent survived: the sandbox still works.
    assert client.sh(sandbox, "echo alive") == "alive\n"
    assert "sleep 300" not in client.sh(sandbox, "ps -eo args")
    for sig in ("TERM", 15, "HUP", "SIGUSR1"):
        client.post(f"/v1/sandboxes/{sandbox}/signal", {"signal": sig}, expect=200)
    assert client.sh(sandbox, "echo still") == "still\n"
    for bad in ({"signal": "NOPE"}, {"signal": 0}, {"signal": 65}, {"signal": None}, {},
                {"signal": 9.5}, {"signal": "KILL", "x": 1}):
        client.post(f"/v1/sandboxes/{sandbox}/signal", bad, expect=400, validate=False)


def test_fork_bomb_outlives_exec_and_signal_ends_it(client):
    sb = client.create({"pids": 64, "memory_mb": 128})
    sid = sb["id"]
    try:
        r = run(client, sid, shell="b() { b | b & }; b", timeout_ms=2000)
        assert r is not None
        client.post(f"/v1/sandboxes/{sid}/signal", {"signal": "KILL"}, expect=200)
        wait_until(lambda: client.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo ok"})
                   .json.get("stdout") == "ok\n", 30, interval=0.2, what="sandbox usable again")
    finally:
        client.remove(sid)


# ---- shells -------------------------------------------------------------------------------

def test_shell_keeps_cwd_and_env(client, sandbox):
    sh = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    assert sh.startswith("sh-")
    assert sh in client.get(f"/v1/sandboxes/{sandbox}/shells", expect=200).json["shells"]
    url = f"/v1/sandboxes/{sandbox}/shells/{sh}/run"
    r = client.post(url, {"command": "mkdir -p /tmp/deep/er && cd /tmp/deep/er && "
                                     "export FOO=bar; x=local"}, expect=200).json
    assert r["exit_code"] == 0
    r = client.post(url, {"command": 'pwd; echo "$FOO $x"'}, expect=200).json
    assert r["stdout"] == "/tmp/deep/er\nbar local\n"
    r = client.post(url, {"command": "false"}, expect=200).json
    assert r["exit_code"] == 1
    r = client.post(url, {"command": "echo err >&2; (exit 7)"}, expect=200).json
    assert r["stderr"] == "err\n" and r["exit_code"] == 7
    r = client.post(url, {"command": "sleep 30", "timeout_ms": 300}, expect=200).json
    assert r["timed_out"] is True
    # Background jobs carry over too; and the shell still works after a timeout.
    r = client.post(url, {"command": "sleep 100 & echo $! > /tmp/bgpid; pwd"}, expect=200).json
    assert r["stdout"] == "/tmp/deep/er\n"
    r = client.post(url, {"command": "jobs | wc -l"}, expect=200).json
    assert r["stdout"].strip() != "0"
    r = client.post(url, {"command": "head -c 5000 /dev/zero | tr '\\0' q",
                          "max_output_bytes": 10}, expect=200).json
    assert r["stdout"] == "q" * 10 and r["stdout_truncated"]
    r = client.post(url, {"command": r"printf '\377'", "encoding": "base64"}, expect=200).json
    assert base64.b64decode(r["stdout"]) == b"\xff"
    for bad in ({}, {"command": 5}, {"command": "x", "bogus": 1}, {"command": "x",
                                                                  "timeout_ms": -1}):
        client.post(url, bad, expect=400, validate=False)
    # Two shells are independent.
    sh2 = client.post(f"/v1/sandboxes/{sandbox}/shells", None, expect=201).json["shell_id"]
    r = client.post(f"/v1/sandboxes/{sandbox}/shells/{sh2}/run", {"command": "pwd"},
                    expect=200).json
    assert r["stdout"] == "/workspace\n"
    client.delete(f"/v1/sandboxes/{sandbox}/shells/{sh}", expect=204)
    client.post(url, {"command": "pwd"}, expect=404)
    client.delete(f"/v1/sandboxes/{sandbox}/shells/{sh}", expect=404)
    assert sh not in client.get(f"/v1/sandboxes/{sandbox}/shells", expect=200).json["shells"]
    client.delete(f"/v1/sandboxes/{sandbox}/shells/{sh2}", expect=204)


def test_shell_timeout_kills_only_the_timed_out_command(client, sandbox):
    """A timeout kills the command's own processes (its pipeline, what it started in the
    background, its orphans) and leaves what earlier commands left running (issue 21 item 2)."""
    sh = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    url = f"/v1/sandboxes/{sandbox}/shells/{sh}/run"
    r = client.post(url, {"command": "cd /tmp && python3 -m http.server 8123 >/dev/null 2>&1 & "
                                     "echo $! > /tmp/server.pid; (sleep 300 &) ; sleep 0.5"},
                    expect=200).json
    assert r["exit_code"] == 0, r
    r = client.post(url, {"command": "sleep 30 & echo $! > /tmp/mine.pid; (sleep 301 &); "
                                     "sleep 5", "timeout_ms": 500}, expect=200).json
    assert r["timed_out"] is True, r
    alive = client.post(url, {"command": "for f in server mine; do "
                                         "kill -0 $(cat /tmp/$f.pid) 2>/dev/null && echo $f; done; "
                                         "pgrep -f 'sleep 300$' >/dev/null && echo orphan-before; "
                                         "pgrep -f 'sleep 301$' >/dev/null && echo orphan-mine; "
                                         "true"}, expect=200).json
    assert alive["stdout"].split() == ["server", "orphan-before"], alive
    r = client.post(url, {"command": "python3 -c \"import urllib.request; print(urllib.request."
                                     "urlopen('http://127.0.0.1:8123/').status)\""},
                    expect=200).json
    assert r["stdout"] == "200\n", r
    client.delete(f"/v1/sandboxes/{sandbox}/shells/{sh}", expect=204)


def test_shell_exit_in_command(client, sandbox):
    sh = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    url = f"/v1/sandboxes/{sandbox}/shells/{sh}/run"
    r = client.post(url, {"command": "exit 5"}, validate=False)
    # The shell is gone (or reports the exit); either way later calls fail cleanly.
    assert r.status in (200, 404, 409, 410, 500) or r.status < 500, r
    r2 = client.post(url, {"command": "echo x"}, validate=False)
    assert r2.status in (200, 404, 409), r2
    client.check(r2)
    client.request("DELETE", f"/v1/sandboxes/{sandbox}/shells/{sh}", validate=False)


def test_shell_as_root_user(client, sandbox):
    sh = client.post(f"/v1/sandboxes/{sandbox}/shells", {"user": "root"},
                     expect=201).json["shell_id"]
    r = client.post(f"/v1/sandboxes/{sandbox}/shells/{sh}/run", {"command": "id -u"},
                    expect=200).json
    assert r["stdout"] == "0\n"
    client.post(f"/v1/sandboxes/{sandbox}/shells", {"user": 5}, expect=400, validate=False)


# ---- WebSocket attach ---------------------------------------------------------------------

def attach(edge, sid, query, token=True):
    tok = edge.token if token is True else token
    path = f"/v1/sandboxes/{sid}/attach?{query}"
    status, headers, rest = WebSocket.connect("127.0.0.1", edge.port, path, token=tok)
    if status != 101:
        ct = headers.get("content-type", "")
        assert ct.startswith("application/json"), (status, headers, rest)
        edge_harness.spec().validate_response("GET", path, status, json.loads(rest),
                                              content_type=ct)
    else:
        edge_harness.spec().validate_request("GET", path)
    return status, headers, rest


def collect_until_exit(ws, limit=10000):
    out, errs = b"", b""
    for _ in range(limit):
        op, payload = ws.recv()
        if op == 0x2:
            out += payload
        elif op == 0x1:
            msg = json.loads(payload)
            edge_harness.spec().validate("AttachServerMessage", msg, "attach text frame")
            if "exit" in msg:
                return out, errs, msg["exit"]
            if "stderr" in msg:
                errs += base64.b64decode(msg["stderr"])
            elif "error" in msg:
                raise AssertionError(f"attach error: {msg}")
        elif op == 0x8:
            raise AssertionError(f"closed before exit; output so far {out!r}")
    raise AssertionError("no exit frame")


def test_attach_pipe_stdin(edge, sandbox):
    status, headers, ws = attach(edge, sandbox, "cmd=cat")
    assert status == 101
    try:
        ws.send_binary(b"hello over websocket\n")
        got = b""
        while b"\n" not in got:  # echoed while stdin is still open: it is interactive
            op, payload = ws.recv()
            assert op == 0x2, (op, payload)
            got += payload
        assert got == b"hello over websocket\n"
        ws.send_json({"eof": True})
        out, errs, result = collect_until_exit(ws)
        assert result["exit_code"] == 0
        op, _ = ws.recv()
        assert op == 0x8  # the server closes after the exit frame
    finally:
        ws.close()


def test_attach_stderr_frames_and_args(edge, sandbox):
    q = "cmd=sh&cmd=-c&cmd=echo%20out;%20echo%20err%20%3E%262;%20exit%206"
    status, _, ws = attach(edge, sandbox, q)
    assert status == 101
    try:
        out, errs, result = collect_until_exit(ws)
    finally:
        ws.close()
    assert out == b"out\n" and errs == b"err\n" and result["exit_code"] == 6


def test_attach_tty(edge, sandbox):
    script = ('stty size; test -t 0 && test -t 1 && echo is-a-tty; echo err >&2; '
              'while [ "$(stty size)" != "40 120" ]; do sleep 0.02; done; echo resized; exit 3')
    from urllib.parse import quote
    status, _, ws = attach(edge, sandbox, f"cmd=sh&cmd=-c&cmd={quote(script)}&tty=1"
                                          "&cols=100&rows=30")
    assert status == 101
    try:
        got = b""
        while b"is-a-tty" not in got or b"err" not in got:
            op, payload = ws.recv()
            assert op == 0x2, (op, payload)  # stdout and stderr merged on a tty
            got += payload
        assert b"30 100" in got
        ws.send_json({"resize": [120, 40]})
        out, errs, result = collect_until_exit(ws)
    finally:
        ws.close()
    assert b"resized" in out and errs == b""
    assert result["exit_code"] == 3


def test_attach_tty_stdin(edge, sandbox):
    status, _, ws = attach(edge, sandbox, "cmd=/bin/sh&tty=1")
    assert status == 101
    ws.sock.settimeout(5)
    try:
        ws.send_binary(b"echo $((6*7)); exit 3\n")
        out, _, result = collect_until_exit(ws)
    finally:
        ws.close()
    assert b"42" in out and result["exit_code"] == 3


def test_attach_signal_and_disconnect(edge, client, sandbox):
    status, _, ws = attach(edge, sandbox, "cmd=sleep&cmd=299.25")
    assert status == 101
    try:
        wait_until(lambda: "299.25" in client.sh(sandbox, "ps -eo args"), 10,
                   what="attached command running")
        ws.send_json({"signal": "KILL"})
        _, _, result = collect_until_exit(ws)
        assert result["signal"] == 9
    finally:
        ws.close()
    # Going away kills the attached command.
    status, _, ws = attach(edge, sandbox, "cmd=sleep&cmd=299.75")
    assert status == 101
    wait_until(lambda: "299.75" in client.sh(sandbox, "ps -eo args"), 10, what="running")
    ws.sock.close()
    wait_until(lambda: "299.75" not in client.sh(sandbox, "ps -eo args"), 15,
               what="attached command killed on disconnect")


def test_attach_errors(edge, client, sandbox):
    status, _, body = attach(edge, sandbox, "cmd=cat", token=None)
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
    status, _, body = attach(edge, "sb-it-unknown", "cmd=cat")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, _, body = attach(edge, sandbox, "cmd=cat&cols=0")
    assert status == 400
    status, _, body = attach(edge, sandbox, "cmd=cat&shell=ls")
    assert status == 400
    # Not an upgrade request.
    r = client.get(f"/v1/sandboxes/{sandbox}/attach?cmd=cat", validate=False)
    assert r.status == 400 and r.json["error"]["code"] == "bad_request"


def test_clients_hanging_up_mid_output(edge, client, sandbox):
    """Regression: a client that hung up while a chunk was being written crashed the edge
    (the in-flight chunk was freed; use-after-free in the HTTP and WebSocket sessions)."""
    for i in range(40):
        conn, resp = client.stream("POST", f"/v1/sandboxes/{sandbox}/exec?stream=1",
                                   {"shell": "yes | head -c 20000000"})
        resp.read(1000 + i * 97)
        conn.sock.shutdown(2)
        conn.close()
        status, _, ws = attach(edge, sandbox, "cmd=yes")
        assert status == 101
        ws.recv()
        ws.sock.close()
        assert edge.running(), f"the edge died after {i} hang-ups:\n{edge.log_tail()}"
    wait_until(lambda: "yes" not in client.sh(sandbox, "ps -eo comm").split(), 15,
               what="the hung-up commands killed")
