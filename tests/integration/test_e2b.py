"""The E2B-compatible listener (--e2b-listen) driven by the unmodified E2B JS SDKs (npm `e2b`
and `@e2b/code-interpreter`, pinned by tests/e2b/package-lock.json and installed with `npm ci`
into the build tree), plus the protocol's edges from plain HTTP: bad envelopes, unknown RPCs and
paths, a wrong access token, wrong content types and huge bodies, answered in the protocol's own
error shapes while the edge keeps serving. No request leaves the machine: both E2B URLs point at the edge."""

import base64
import http.client
import json
import os
import pathlib
import shutil
import socket
import subprocess
import urllib.parse

import pytest

import edge_harness
from edge_fixtures import _skip_if_not_runnable, _teardown

REPO = pathlib.Path(__file__).resolve().parents[2]
SRC = REPO / "tests" / "e2b"


@pytest.fixture(scope="module")
def e2b_edge():
    _skip_if_not_runnable()
    e = edge_harness.Edge.start(config={"e2b_listen": "127.0.0.1:0"})
    try:
        assert e.e2b_url, e.ready_line
        yield e
    finally:
        _teardown(e)


def install_e2b_sdk():
    """`npm ci` of the pinned SDKs into build/e2b-test (made in this run, never cached): the
    directory, or (None, why) when this machine cannot run them."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "node and npm are needed for the E2B SDK test (Node >= 20)"
    major = int(subprocess.run([node, "-p", "process.versions.node.split('.')[0]"],
                               capture_output=True, text=True, check=True).stdout)
    if major < 20:
        return None, f"the E2B SDK needs Node >= 20 (this is {major})"
    work = REPO / "build" / "e2b-test"
    work.mkdir(parents=True, exist_ok=True)
    for f in ("package.json", "package-lock.json", "e2b_test.mjs"):
        shutil.copy(SRC / f, work / f)
    if not (work / "node_modules" / "@e2b" / "code-interpreter").exists():
        r = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=work,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"npm ci failed:\n{r.stdout}\n{r.stderr}")
    return work, None


@pytest.fixture(scope="module")
def node_modules():
    work, why = install_e2b_sdk()
    if work is None:
        print(f"[  SKIPPED ] {why}")
        pytest.skip(why)
    return work


def test_the_e2b_js_sdk(e2b_edge, node_modules):
    env = dict(os.environ, E2B_API_URL=e2b_edge.e2b_url, E2B_SANDBOX_URL=e2b_edge.e2b_url,
               E2B_API_KEY=e2b_edge.token, E2B_DOMAIN="dsec.invalid")
    env.pop("E2B_DEBUG", None)
    r = subprocess.run(["node", "e2b_test.mjs"], cwd=node_modules, env=env, capture_output=True,
                       text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\nedge log:\n{e2b_edge.log_tail(60)}"
    assert r.stdout.count("ok ") == 15, r.stdout
    # Nothing left: every sandbox the SDK made was killed.
    c = e2b_edge.client()
    left = c.get("/v1/sandboxes?label=dsec.compat=e2b", expect=200).json["sandboxes"]
    assert left == [], left


def call(e, method, path, body=None, headers=None):
    u = urllib.parse.urlsplit(e.e2b_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw), dict(r.getheaders())
        except ValueError:
            return r.status, raw, dict(r.getheaders())
    finally:
        conn.close()


def new_sandbox(e, template="base"):
    """A sandbox made through the control plane: (the API key's headers, its create answer)."""
    key = {"X-API-KEY": e.token, "Content-Type": "application/json"}
    st, sb, _ = call(e, "POST", "/v2/sandboxes", {"templateID": template}, key)
    assert st == 201, sb
    return key, sb


def envelope(obj):
    """One Connect envelope (flags 0) of a JSON message."""
    m = json.dumps(obj).encode()
    return b"\x00" + len(m).to_bytes(4, "big") + m


def frames(raw):
    """A Connect stream's envelopes: [(flags, message)]."""
    out, i = [], 0
    while i < len(raw):
        n = int.from_bytes(raw[i + 1:i + 5], "big")
        out.append((raw[i], json.loads(raw[i + 5:i + 5 + n])))
        i += 5 + n
    return out


def run_sh(e, envd, script):
    """What `sh -c script` prints in the sandbox of `envd` (its headers), through Start."""
    st, raw, _ = call(e, "POST", "/process.Process/Start",
                      envelope({"process": {"cmd": "/bin/sh", "args": ["-c", script]},
                                "stdin": False}),
                      dict(envd, **{"Content-Type": "application/connect+json"}))
    assert st == 200, raw
    return b"".join(base64.b64decode(f.get("event", {}).get("data", {}).get("stdout", ""))
                    for _, f in frames(raw))


def test_protocol_errors_in_their_own_shapes(e2b_edge):
    e = e2b_edge
    key = {"X-API-KEY": e.token, "Content-Type": "application/json"}
    # Control plane: {"code": <status>, "message"}.
    st, body, _ = call(e, "POST", "/v2/sandboxes", {"templateID": "base"}, {})
    assert st == 401 and body["code"] == 401, body
    st, body, _ = call(e, "GET", "/sandboxes/sb-nope-000000000000", None, key)
    assert st == 404 and body == {"code": 404, "message": body["message"]}, body
    st, body, _ = call(e, "DELETE", "/sandboxes/sb-nope-000000000000", None, key)
    assert st == 404 and body["code"] == 404
    st, body, _ = call(e, "POST", "/v2/sandboxes", "{not json", key)
    assert st == 400 and body["code"] == 400
    st, body, _ = call(e, "POST", "/v2/sandboxes", {"templateID": "no-such-image:1"}, key)
    assert st == 404 and body["code"] == 404, body
    st, body, _ = call(e, "POST", "/v2/sandboxes", {"metadata": {"a b": "c"}}, key)
    assert st == 400 and "metadata" in body["message"], body
    st, body, _ = call(e, "GET", "/v2/nothing", None, key)
    assert st == 404 and body["code"] == 404

    st, sb, _ = call(e, "POST", "/v2/sandboxes", {"templateID": "base", "timeout": 60}, key)
    assert st == 201 and sb["envdVersion"] == "0.6.13" and sb["envdAccessToken"], sb
    sid, token = sb["sandboxID"], sb["envdAccessToken"]
    envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token,
            "Connect-Protocol-Version": "1", "Content-Type": "application/json"}
    try:
        # A wrong or missing access token: 401, whatever the sandbox.
        st, body, _ = call(e, "POST", "/filesystem.Filesystem/Stat", {"path": "/"},
                           dict(envd, **{"X-Access-Token": "wrong"}))
        assert st == 401, body
        bad = dict(envd, **{"E2b-Sandbox-Id": "sb-nope-000000000000"})
        st, body, _ = call(e, "POST", "/filesystem.Filesystem/Stat", {"path": "/"}, bad)
        assert st == 401, body
        # Unary errors: {"code": "<connect code>", "message"} with connect-go's statuses.
        st, body, h = call(e, "POST", "/filesystem.Filesystem/Stat", {"path": "/nope"}, envd)
        assert st == 404 and body["code"] == "not_found", body
        assert h["Content-Type"].startswith("application/json")
        st, body, _ = call(e, "POST", "/filesystem.Filesystem/Stat", "[1]", envd)
        assert st == 400 and body["code"] == "invalid_argument", body
        st, body, _ = call(e, "POST", "/process.Process/Nope", {}, envd)
        assert st == 501 and body["code"] == "unimplemented", body
        st, body, _ = call(e, "POST", "/process.Process/SendSignal",
                           {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}, envd)
        assert st == 404 and body["code"] == "not_found", body
        # Streaming errors: HTTP 200 and an end-of-stream envelope with the error.
        stream = dict(envd, **{"Content-Type": "application/connect+json"})
        st, raw, _ = call(e, "POST", "/process.Process/Start", b"\x00\x00\x00\x00\x05{}", stream)
        assert st == 200 and raw[0] == 2, raw
        assert json.loads(raw[5:])["error"]["code"] == "invalid_argument", raw
        msg = json.dumps({"process": {"cmd": "/bin/true"}}).encode()
        st, raw, _ = call(e, "POST", "/process.Process/Start", b"\x01" + len(msg).to_bytes(4, "big")
                          + msg, stream)
        assert st == 200 and json.loads(raw[5:])["error"]["code"] == "invalid_argument", raw
        msg = json.dumps({"process": {"cmd": "/bin/true", "cwd": "/no/such/dir"}}).encode()
        st, raw, _ = call(e, "POST", "/process.Process/Start",
                          b"\x00" + len(msg).to_bytes(4, "big") + msg, stream)
        assert json.loads(raw[5:])["error"]["message"] == "cwd '/no/such/dir' does not exist"
        # REST: /files errors in the control plane's shape; /health.
        st, body, _ = call(e, "GET", "/files?path=/no/such/file", None, envd)
        assert st == 404 and body["code"] == 404, body
        st, body, _ = call(e, "POST", "/files", b"x", dict(envd, **{
            "Content-Type": "multipart/form-data; boundary=zz"}))
        assert st == 400 and body["code"] == 400, body
        st, body, _ = call(e, "GET", "/health", None, envd)
        assert st == 204
        no_token = {k: v for k, v in envd.items() if k != "X-Access-Token"}
        st, body, _ = call(e, "GET", "/health", None, no_token)
        assert st == 401, body
        st, body, _ = call(e, "GET", "/nope", None, envd)
        assert st == 404, body
        # A port the listener does not serve: said so.
        st, body, _ = call(e, "POST", "/execute", {"code": "1"}, dict(envd, **{
            "E2b-Sandbox-Port": "50005"}))
        assert st == 501 and "49999" in body["message"], body
        # A huge body is refused from its head (Content-Length past the limit, nothing sent).
        u = urllib.parse.urlsplit(e.e2b_url)
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            head = "".join(f"{k}: {v}\r\n" for k, v in envd.items())
            s.sendall(f"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: x\r\n{head}"
                      f"Content-Length: {2 << 20}\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 413")
        # And the edge still serves: a command through a plain Start call.
        st, raw, _ = call(e, "POST", "/process.Process/Start",
                          envelope({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi"]},
                                    "stdin": False}), stream)
        got = frames(raw)
        assert got[0][1]["event"]["start"]["pid"] > 0, got
        out = b"".join(base64.b64decode(f["event"]["data"]["stdout"]) for _, f in got
                       if "data" in f.get("event", {}))
        assert out == b"hi\n", got
        assert got[-2][1]["event"]["end"] == {"exited": True, "status": "exit status 0"}
        assert got[-1] == (2, {}), got
    finally:
        call(e, "DELETE", f"/sandboxes/{sid}", None, key)


def ndjson(raw):
    """An /execute answer's lines, each checked to be a JSON object with a type."""
    out = []
    for line in raw.decode().splitlines():
        j = json.loads(line)
        assert isinstance(j, dict) and isinstance(j.get("type"), str), line
        out.append(j)
    return out


def test_code_interpreter_protocol_edges(e2b_edge):
    """Port 49999 from plain HTTP: its auth, bad requests, an abandoned execution, a kernel
    that ignores the interrupt, one that floods or forges its protocol, the context cap, and a
    sandbox deleted under a running execution — the edge keeps serving throughout."""
    e = e2b_edge
    key, sb = new_sandbox(e, "code-interpreter-v1")
    assert sb["trafficAccessToken"] and sb["envdAccessToken"], sb
    sid = sb["sandboxID"]
    base = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999",
            "Content-Type": "application/json"}
    run_h = dict(base, **{"X-Access-Token": sb["envdAccessToken"]})
    ctx_h = dict(base, **{"E2B-Traffic-Access-Token": sb["trafficAccessToken"]})

    def execute(body, headers=run_h, path="/execute"):
        st, raw, _ = call(e, "POST", path, body, headers)
        return st, (ndjson(raw) if st == 200 else raw)

    def result(lines):
        return [x.get("text") for x in lines if x["type"] == "result"]

    try:
        # Auth: /execute takes either token; /contexts (no envd token from the SDK) the traffic
        # token; neither, or another sandbox's, is 401.
        assert call(e, "GET", "/contexts", None, base)[0] == 401
        assert call(e, "GET", "/contexts", None, dict(
            base, **{"E2B-Traffic-Access-Token": sb["envdAccessToken"]}))[0] == 401
        st, body, _ = call(e, "GET", "/contexts", None, ctx_h)
        assert st == 200 and body == [], body
        st, lines = execute({"code": "1 + 1"}, ctx_h)
        assert st == 200 and result(lines) == ["2"], lines
        st, lines = execute({"code": "x = 5\nx"}, path="//execute")  # a trailing '/' in the URL
        assert st == 200 and result(lines) == ["5"], lines
        assert [x["type"] for x in lines] == ["number_of_executions", "result", "end_of_execution"]

        # Bad requests, in plain text as the real server's.
        for body in ("{not json", {"code": 5}, {"code": "1", "context_id": "a", "language": "python"},
                     {"code": "1", "language": "r"}, {"code": "1", "env_vars": {"A": 1}},
                     {"code": "1", "env_vars": ["A"]}):
            st, raw = execute(body)
            assert st == 400, (body, raw)
        st, raw = execute({"code": "1", "context_id": "nope"})
        assert st == 404 and raw == b"Context nope not found", raw
        assert call(e, "GET", "/execute", None, run_h)[0] == 405
        assert call(e, "DELETE", "/contexts/nope", None, ctx_h)[0] == 404
        assert call(e, "POST", "/contexts", {"cwd": "/no/such/dir"}, ctx_h)[0] == 400
        assert call(e, "POST", "/contexts", {"language": "r"}, ctx_h)[0] == 400

        # A client that goes away mid-execution interrupts it; the kernel and x stay.
        u = urllib.parse.urlsplit(e.e2b_url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/execute", json.dumps({"code": "import time\ntime.sleep(60)"}),
                     run_h)
        r = conn.getresponse()
        assert json.loads(r.readline())["type"] == "number_of_executions"
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        st, lines = execute({"code": "x"})
        assert result(lines) == ["5"], lines

        # A kernel that ignores SIGINT is killed 5 s after its client left; what was queued
        # behind it says so, and the context's next execution gets a fresh kernel.
        # (The client leaves only once the kernel says it ignores SIGINT: an interrupt that came
        # before would stop it as any other.)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/execute", json.dumps({
            "code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "print('ignoring', flush=True)\ntime.sleep(120)"}), run_h)
        r = conn.getresponse()
        assert json.loads(r.readline())["type"] == "number_of_executions"
        while True:
            line = json.loads(r.readline())
            if line["type"] == "stdout" and "ignoring" in line.get("text", ""):
                break
            assert line["type"] not in ("error", "end_of_execution"), line
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        st, lines = execute({"code": "x"})
        assert [x.get("name") for x in lines if x["type"] == "error"] == ["DeadKernelError"], lines
        st, lines = execute({"code": "'x' in dir()"})
        assert result(lines) == ["False"], lines

        # What user code writes to the protocol's descriptors cannot break the stream: junk
        # lines are dropped, a line over 16 MiB becomes an error, and the execution ends.
        st, lines = execute({"code": "import os\nfor fd in range(3, 16):\n    try:\n"
                                     "        os.write(fd, b'junk\\n{\"type\": 5}\\n[1]\\n')\n"
                                     "    except OSError:\n        pass\n1 + 1"})
        assert st == 200 and result(lines) == ["2"], lines
        st, lines = execute({"code": "'y' * (17 << 20)"})
        assert [x.get("name") for x in lines if x["type"] == "error"] == ["OutputTooLarge"]
        assert lines[-1]["type"] == "end_of_execution"
        st, lines = execute({"code": "len('y' * (1 << 20))"})
        assert result(lines) == [str(1 << 20)], lines

        # At most 8 contexts a sandbox (the default one included); removing one ends its kernel.
        made = []
        for _ in range(7):
            st, ctx, _ = call(e, "POST", "/contexts", {}, ctx_h)
            assert st == 200 and ctx["cwd"] == "/home/user", ctx
            made.append(ctx["id"])
        st, raw, _ = call(e, "POST", "/contexts", {}, ctx_h)
        assert st == 429, raw
        envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sb["envdAccessToken"]}

        def kernels():
            return int(run_sh(e, envd, "grep -l [d]sec-kernel /proc/[0-9]*/cmdline | wc -l"))

        assert kernels() == 8
        for cid in made:
            assert call(e, "DELETE", f"/contexts/{cid}", None, ctx_h)[0] == 204
        assert edge_harness.wait_until(lambda: kernels() == 1, timeout=10), kernels()

        # The sandbox deleted under a running execution: it ends with an error, and the edge
        # keeps serving.
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("POST", "/execute", json.dumps({"code": "import time\ntime.sleep(60)"}),
                     run_h)
        r = conn.getresponse()
        assert json.loads(r.readline())["type"] == "number_of_executions"
        assert call(e, "DELETE", f"/sandboxes/{sid}", None, key)[0] == 204
        rest = ndjson(r.read())
        conn.close()
        assert rest[-1]["type"] == "end_of_execution", rest
        assert [x.get("name") for x in rest if x["type"] == "error"] == ["DeadKernelError"], rest
        assert e.client().get("/v1/node", expect=200)
    finally:
        call(e, "DELETE", f"/sandboxes/{sid}", None, key)


def test_watch_dir_edges(e2b_edge):
    """WatchDir from plain HTTP: Connect-Timeout-Ms ends it with deadline_exceeded (as envd), a
    removed directory ends it with not_found, a directory the user may not read is refused,
    and a sandbox holds at most 16 watches at once."""
    e = e2b_edge
    key, sb = new_sandbox(e)
    sid = sb["sandboxID"]
    envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sb["envdAccessToken"], "Content-Type": "application/connect+json"}
    u = urllib.parse.urlsplit(e.e2b_url)

    def watch(path, headers=None):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/filesystem.Filesystem/WatchDir", envelope({"path": path}),
                     dict(envd, **(headers or {})))
        return conn, conn.getresponse()

    try:
        assert call(e, "POST", "/filesystem.Filesystem/MakeDir", {"path": "/home/user/gone"},
                    dict(envd, **{"Content-Type": "application/json"}))[0] == 200
        conn, r = watch("/home/user", {"Connect-Timeout-Ms": "1500"})
        got = frames(r.read())
        conn.close()
        assert got[0] == (0, {"start": {}}), got
        assert got[-1][0] == 2 and got[-1][1]["error"]["code"] == "deadline_exceeded", got

        conn, r = watch("/home/user/gone")
        first = r.read(5)
        body = r.read(int.from_bytes(first[1:5], "big"))
        assert json.loads(body) == {"start": {}}
        run_sh(e, envd, "rmdir /home/user/gone")
        got = frames(r.read())
        conn.close()
        assert got[-1][0] == 2 and got[-1][1]["error"]["code"] == "not_found", got

        st, raw, _ = call(e, "POST", "/filesystem.Filesystem/WatchDir", envelope({"path": "/root"}),
                          envd)
        got = frames(raw)
        assert got[-1][1]["error"]["code"] == "permission_denied", got

        held = [watch("/home/user") for _ in range(16)]
        try:
            for conn, r in held:
                first = r.read(5)
                assert json.loads(r.read(int.from_bytes(first[1:5], "big"))) == {"start": {}}
            st, raw, _ = call(e, "POST", "/filesystem.Filesystem/WatchDir",
                              envelope({"path": "/home/user"}), envd)
            got = frames(raw)
            assert got[-1][1]["error"]["code"] == "resource_exhausted", got
        finally:
            for conn, _ in held:
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
        # Their clients gone, the watches end in the agent: a new one is taken again.
        def one_more():
            c, r = watch("/home/user", {"Connect-Timeout-Ms": "300"})
            got = frames(r.read())
            c.close()
            return got[0] == (0, {"start": {}})
        assert edge_harness.wait_until(one_more, timeout=10)
    finally:
        call(e, "DELETE", f"/sandboxes/{sid}", None, key)


def test_files_larger_than_64_mib(e2b_edge):
    """/files takes what the sandbox's disk holds, octet-stream and multipart alike (a spooled
    multipart body is parsed where it lies and sent from the spool file), and refuses more
    from the request's head."""
    e = e2b_edge
    key, sb = new_sandbox(e)
    sid = sb["sandboxID"]
    envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sb["envdAccessToken"]}
    disk_mb = e.client().get(f"/v1/sandboxes/{sid}", expect=200).json["limits"]["disk_mb"]
    assert disk_mb >= 200, disk_mb
    blob = bytes(range(256)) * (80 << 12)  # 80 MiB
    digest = __import__("hashlib").sha256(blob).hexdigest()

    def sha(path):
        return run_sh(e, envd, f"sha256sum {path}").split()[0].decode()

    try:
        st, body, _ = call(e, "POST", "/files?path=/home/user/big.bin", blob,
                           dict(envd, **{"Content-Type": "application/octet-stream"}))
        assert st == 200, body
        assert sha("/home/user/big.bin") == digest
        call(e, "POST", "/filesystem.Filesystem/Remove", {"path": "/home/user/big.bin"},
             dict(envd, **{"Content-Type": "application/json"}))
        b = "dsecboundary42"
        mp = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/m.bin\""
              f"\r\nContent-Type: application/octet-stream\r\n\r\n").encode() + blob + \
            f"\r\n--{b}--\r\n".encode()
        st, body, _ = call(e, "POST", "/files", mp,
                           dict(envd, **{"Content-Type": f"multipart/form-data; boundary={b}"}))
        assert st == 200 and body[0]["path"] == "/tmp/m.bin", body
        assert sha("/tmp/m.bin") == digest
        # More than the disk: refused from the head, nothing read.
        u = urllib.parse.urlsplit(e.e2b_url)
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            head = "".join(f"{k}: {v}\r\n" for k, v in envd.items())
            s.sendall(f"POST /files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n{head}"
                      f"Content-Type: application/octet-stream\r\n"
                      f"Content-Length: {(disk_mb + 2) << 20}\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 413")
    finally:
        call(e, "DELETE", f"/sandboxes/{sid}", None, key)
