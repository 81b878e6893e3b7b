"""Starts a real dsec-edge and talks to it over plain HTTP; checks what it leaves behind.

Standard library only (plus openapi_check, which needs PyYAML). Shared by the pytest fixtures
in conftest.py and by tests/soak/soak_edge.py:

    edge = Edge.start(extra_args=["--max-sandboxes", "2"])   # temp state dir, token, socket
    c = edge.client()                                        # raw HTTP, validated vs openapi
    r = c.post("/v1/sandboxes", {"memory_mb": 256}, expect=201)
    edge.stop()                          # SIGTERM, wait, then edge.residue() must be empty
    edge.cleanup()                       # removes the temp dirs (and force-cleans leftovers)

Every response that comes through Client.request is checked against api/openapi.yaml, and an
error status must carry a JSON error body whose code fits the status.
"""

import base64
import glob
import hashlib
import http.client
import json
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO / "build" / "release" / "src" / "edge" / "dsec-edge"

ERROR_STATUS = {
    "bad_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409, "gone": 410, "too_large": 413, "unprocessable": 422, "over_capacity": 429,
    "quota_exceeded": 429,
    "unavailable": 503, "bad_gateway": 502, "gateway_timeout": 504, "internal": 500,
}

_spec = None
_spec_lock = threading.Lock()


def spec():
    """The parsed api/openapi.yaml (loaded once)."""
    global _spec
    with _spec_lock:
        if _spec is None:
            import openapi_check  # noqa: PLC0415 (sys.path is set by the importer)
            _spec = openapi_check.Spec.load()
        return _spec


def edge_binary():
    return pathlib.Path(os.environ.get("DSEC_EDGE_BIN") or DEFAULT_BIN)


def why_not_runnable():
    """A reason the live tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the live edge tests need root (sandboxes use namespaces and cgroups)"
    b = edge_binary()
    if not b.is_file() or not os.access(b, os.X_OK):
        return f"dsec-edge binary not found at {b} (build it or set DSEC_EDGE_BIN)"
    return None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Polls pred() until it returns something truthy; returns that, or raises on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


# ---- HTTP ---------------------------------------------------------------------------------

# DSEC_IT_KIND=microvm (scripts/long-tier): Client.create makes microVMs of what the suites
# create on the host image (skips say which cases cannot apply to that kind).
KIND = os.environ.get("DSEC_IT_KIND", "")
CONTAINERS_ONLY = "containers only (DSEC_IT_KIND=microvm): "


class Response:
    def __init__(self, method, path, status, headers, body):
        self.method, self.path, self.status = method, path, status
        self.headers = headers  # lower-case name -> value
        self.body = body

    @property
    def content_type(self):
        return self.headers.get("content-type", "")

    @property
    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<{self.method} {self.path} -> {self.status} {self.body[:300]!r}>"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Client:
    """Raw HTTP to the edge: one request, one checked response. Not thread-safe per instance
    when keep_alive is on; make one per thread."""

    def __init__(self, url=None, token=None, unix_path=None, timeout=60, keep_alive=False,
                 validate=True):
        self.url, self.token, self.unix_path = url, token, unix_path
        self.timeout, self.keep_alive, self.validate = timeout, keep_alive, validate
        self._conn = None
        if url:
            u = urllib.parse.urlsplit(url)
            self.host, self.port = u.hostname, u.port

    def connect(self, timeout=None):
        if self.unix_path:
            return UnixHTTPConnection(self.unix_path, timeout=timeout or self.timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def close(self):
        if self._conn:
            self._conn.close()
            self._conn = None

    def headers_for(self, headers=None, token=True, body=None):
        h = {}
        if token is True and self.token:
            h["Authorization"] = f"Bearer {self.token}"
        elif isinstance(token, str):
            h["Authorization"] = f"Bearer {token}"
        if isinstance(body, (dict, list)) or (isinstance(body, str) and body):
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        return h

    @staticmethod
    def encode(body):
        if body is None:
            return None
        if isinstance(body, (dict, list)):
            return json.dumps(body).encode()
        if isinstance(body, str):
            return body.encode()
        return bytes(body)

    def request(self, method, path, body=None, *, headers=None, token=True, expect=None,
                timeout=None, validate=None):
        data = self.encode(body)
        hdrs = self.headers_for(headers, token, body)
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._conn if reused else self.connect(timeout)
            try:
                if timeout is not None and conn.sock is not None:
                    conn.sock.settimeout(timeout)
                try:
                    conn.request(method, path, body=data, headers=hdrs)
                except (BrokenPipeError, ConnectionResetError):
                    # The server answered (413, 401, ...) and closed before it read the whole
                    # body: its response is still there to read.
                    if data is None:
                        raise
                resp = conn.getresponse()
                raw = resp.read()
                hd = {k.lower(): v for k, v in resp.getheaders()}
                status = resp.status
            except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError):
                conn.close()
                self._conn = None
                if reused and attempt == 0:
                    continue  # a keep-alive connection the server closed meanwhile
                raise
            if self.keep_alive and hd.get("connection", "").lower() != "close":
                self._conn = conn
            else:
                conn.close()
                self._conn = None
            break
        r = Response(method, path, status, hd, raw)
        self.check(r, validate)
        if expect is not None:
            want = expect if isinstance(expect, (tuple, list, set)) else (expect,)
            assert r.status in want, f"expected {expect}: {r!r}"
        return r

    def check(self, r, validate=None):
        """Error bodies are JSON with a fitting code; everything matches the spec."""
        if r.status >= 400:
            assert r.content_type.startswith("application/json"), r
            err = r.json.get("error")
            assert isinstance(err, dict), r
            assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str), r
            assert ERROR_STATUS.get(err["code"]) == r.status, f"code/status mismatch: {r!r}"
            assert "\n" not in err["message"], r
            if r.status in (429, 503):
                assert r.headers.get("retry-after", "").isdigit(), f"no Retry-After: {r!r}"
        if not (self.validate if validate is None else validate):
            return
        sp = spec()
        if sp.match(r.method, r.path) is None:
            assert r.status == 404, f"no spec route for {r.method} {r.path}: {r!r}"
            return
        ct = r.content_type or None
        if ct and ct.split(";")[0].strip() in ("application/json", "application/x-ndjson"):
            body = r.body.decode() if ct.startswith("application/x-ndjson") else r.json
        elif ct:
            body = r.body  # a raw body, possibly empty
        else:
            body = r.body if r.body else None
        sp.validate_response(r.method, r.path, r.status, body, content_type=ct,
                             headers=r.headers)

    # Shorthands.
    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body, **kw)

    def patch(self, path, body=None, **kw):
        return self.request("PATCH", path, body, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    # Sandbox helpers.
    def create(self, body=None, **kw):
        body = dict(body or {})
        body.setdefault("memory_mb", 256)
        if KIND == "microvm" and "kind" not in body and "pool" not in body:
            # The long tier's microVM run of the suites: what they create on the host image
            # boots the node's microVM image (Debian with bash and python3) instead.
            body["kind"] = "microvm"
            if body.get("image", "host") in ("host", "host:latest"):
                body.pop("image", None)
            elif "host" in (body["image"] if isinstance(body["image"], list)
                            else str(body["image"]).split(",")):
                import pytest  # noqa: PLC0415 (the harness runs without pytest too)
                pytest.skip("a stack on the host image: containers only (microVMs boot layers)")
            deadline = time.monotonic() + 900
            while True:  # that image is built at its first use (503 until then)
                r = self.post("/v1/sandboxes", body, expect=(201, 503), **kw)
                if r.status == 201:
                    return r.json
                assert "is being built" in r.json["error"]["message"], r
                assert time.monotonic() < deadline, r
                time.sleep(5)
        r = self.post("/v1/sandboxes", body, expect=201, **kw)
        return r.json

    def remove(self, sid):
        r = self.delete(f"/v1/sandboxes/{sid}")
        assert r.status in (204, 404), r
        return r.status

    def exec(self, sid, shell=None, *, cmd=None, expect=200, **fields):
        body = dict(fields)
        if cmd is not None:
            body["cmd"] = cmd
        if shell is not None:
            body["shell"] = shell
        return self.post(f"/v1/sandboxes/{sid}/exec", body, expect=expect).json

    def sh(self, sid, shell, **fields):
        """Runs a shell command; asserts exit 0; returns stdout."""
        r = self.exec(sid, shell, **fields)
        assert r["exit_code"] == 0, r
        return r["stdout"]

    def stream(self, method, path, body=None, *, headers=None, timeout=60):
        """Opens a streaming request; returns (conn, HTTPResponse) for incremental reads."""
        conn = self.connect(timeout)
        conn.request(method, path, body=self.encode(body),
                     headers=self.headers_for(headers, True, body))
        return conn, conn.getresponse()


def ndjson_lines(resp):
    """Yields decoded NDJSON lines from an http.client response as they arrive."""
    while True:
        line = resp.readline()
        if not line:
            return
        if line.strip():
            yield json.loads(line)


# ---- WebSocket (RFC 6455, client side, just enough) ---------------------------------------

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WebSocket:
    """A minimal blocking WebSocket client: masked frames out, unmasked frames in."""

    def __init__(self, sock, leftover=b""):
        self.sock = sock
        self.buf = leftover

    @classmethod
    def connect(cls, host, port, path, token=None, timeout=30):
        sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
                 "Sec-WebSocket-Version: 13"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"closed during the handshake: {data!r}")
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        headers = {}
        for h in header_lines:
            k, _, v = h.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status != 101:
            # An HTTP error: read the rest of the body for the caller.
            n = int(headers.get("content-length", "0"))
            while len(rest) < n:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                rest += chunk
            sock.close()
            return status, headers, rest
        want = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        assert headers.get("sec-websocket-accept") == want, headers
        assert headers.get("upgrade", "").lower() == "websocket", headers
        return status, headers, cls(sock, rest)

    def send_frame(self, opcode, payload):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            header += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def send_binary(self, data):
        self.send_frame(0x2, data)

    def send_text(self, text):
        self.send_frame(0x1, text.encode() if isinstance(text, str) else text)

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def close(self, code=1000):
        try:
            self.send_frame(0x8, code.to_bytes(2, "big"))
        except OSError:
            pass
        self.sock.close()

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed mid-frame")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """Returns (opcode, payload) of the next complete message; answers pings."""
        message, first_op = b"", None
        while True:
            b0, b1 = self._read(2)
            fin, op = b0 & 0x80, b0 & 0x0F
            assert not b1 & 0x80, "server frames must not be masked"
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            payload = self._read(n)
            if op == 0x9:  # ping
                self.send_frame(0xA, payload)
                continue
            if op == 0xA:
                continue
            if op >= 0x8:
                return op, payload
            if op != 0:
                first_op = op
            message += payload
            if fin:
                return first_op, message


# ---- the edge process ---------------------------------------------------------------------

def cgroup_roots():
    """Mount points of every cgroup hierarchy (v1 and v2) on this host."""
    roots = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] in ("cgroup", "cgroup2"):
                roots.append(parts[4])
    return roots


def mountinfo():
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].replace("\\040", " ") for line in f]


def _proc_cgroups(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return ""


def peak_rss_kb(pid):
    """A process's peak resident set (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


def pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process goes away (a ctest timeout kills
    pytest), so the edge still destroys its sandboxes. Linux ties this to the thread that
    forked: launch edges from the main thread."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Edge:
    """One dsec-edge process with its own temp state dir, token file and unix socket."""

    def __init__(self, binary, root, extra_args, config, netns=None):
        self.netns = netns  # run in this named network namespace (API over the unix socket)
        self.binary = pathlib.Path(binary)
        self.root = pathlib.Path(root)
        self.state_dir = self.root / "state"
        self.token_file = self.root / "tokens"
        self.socket = str(self.root / "edge.sock")
        self.config_file = self.root / "config.json"
        self.log_path = self.root / "edge.log"
        self.extra_args = list(extra_args)
        self.config = dict(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.token = None
        self.instance = None
        self.node = None
        self.ready_line = None
        self.starts = 0

    @classmethod
    def start(cls, extra_args=(), config=None, binary=None, prefix="dsec-it-", netns=None):
        reason = why_not_runnable()
        if reason:
            raise RuntimeError(reason)
        root = tempfile.mkdtemp(prefix=prefix)
        os.chmod(root, 0o755)
        # Orphaned sandboxes of a test run that died hard go away by themselves.
        cfg = {"orphan_timeout_s": 600}
        if not netns:
            # Sandbox networking NATs to the uplink of the edge's namespace: in this one, the
            # machine's real uplink. Only edges in a test's own namespace (netlab.py) have it.
            cfg["network"] = False
        if KIND == "microvm":
            # The suites count sandboxes and image users: no ready VMs of the node's own.
            cfg["microvm_standby"] = 0
        cfg.update(config or {})
        e = cls(binary or edge_binary(), root, extra_args, cfg, netns=netns)
        try:
            e.launch()
        except BaseException:
            e.cleanup()
            raise
        return e

    # -- process control --

    def launch(self, timeout=60):
        """Starts the process on the same state dir/port/socket; waits for the ready line."""
        self.config_file.write_text(json.dumps(self.config))
        args = [str(self.binary), "--listen", f"127.0.0.1:{self.port}", "--socket", self.socket,
                "--state-dir", str(self.state_dir), "--token-file", str(self.token_file),
                "--config", str(self.config_file), "--node", "it"] + self.extra_args
        if self.netns:  # only the network namespace changes (not /sys, as `ip netns exec` would)
            args = ["nsenter", f"--net=/run/netns/{self.netns}", "--"] + args
        log = open(self.log_path, "ab")
        log.write(f"\n==== start {self.starts}: {' '.join(args)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        line = b""
        while b"\n" not in line:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"dsec-edge did not become ready (rc={self.proc.returncode}); "
                                   f"stdout={line!r}\nlog:\n{self.log_tail()}")
            r, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                line += chunk
        self.ready_line = line.decode().strip()
        m = re.match(r"dsec-edge ready node=(\S*) url=(\S*) socket=(\S*) adopted=(\d+)"
                     r" token_file=(\S+)(?: sandbox_fusion=(\S+))?(?: e2b=(\S+))?$",
                     self.ready_line)
        assert m, f"unexpected ready line {self.ready_line!r}"
        self.node = m.group(1)
        assert m.group(2) == self.url, self.ready_line
        assert m.group(3) == self.socket, self.ready_line
        self.adopted = int(m.group(4))
        assert m.group(5) == str(self.token_file), self.ready_line
        self.sandbox_fusion_url = m.group(6)
        self.e2b_url = m.group(7)
        self.token = self.token_file.read_text().split()[0]
        self.instance = self.client().get("/v1/node", expect=200,
                                         validate=False).json["instance"]
        return self

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw):
        if self.netns:  # its TCP listener is on the namespace's loopback
            return Client(unix_path=self.socket, **kw)
        return Client(self.url, self.token, **kw)

    def unix_client(self, **kw):
        return Client(unix_path=self.socket, **kw)

    def log_tail(self, n=60):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout=120):
        """SIGTERM and wait; returns the exit code (SIGKILL after the timeout)."""
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"dsec-edge ignored SIGTERM for {timeout}s\n"
                                     f"{self.log_tail()}")
        self.proc.stdout.close()
        return self.proc.returncode

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()

    # -- what it leaves behind --

    def cgroup_dirs(self):
        """Every cgroup directory this edge instance made, in every hierarchy."""
        out = []
        if not self.instance:
            return out
        for root in cgroup_roots():
            # Containers under dsec-<instance>, microVMs (their QEMU) under dsec-<instance>-vm.
            for top in (f"dsec-{self.instance}", f"dsec-{self.instance}-vm"):
                if os.path.isdir(os.path.join(root, top)):
                    for dirpath, _, _ in os.walk(os.path.join(root, top)):
                        out.append(dirpath)
        return out

    def cgroup_rel(self, d):
        """A cgroup_dirs() entry below its parent ("" for a parent): "<sandbox id>/...".."""
        for top in (f"/dsec-{self.instance}-vm", f"/dsec-{self.instance}"):
            if top + "/" in d + "/":
                return (d + "/").split(top + "/", 1)[1].strip("/")
        return d

    def sandbox_cgroup_dirs(self, sid):
        return [d for d in self.cgroup_dirs() if os.path.basename(d) == sid]

    def sandbox_pids(self, sid):
        """Host pids of the processes in one sandbox (from its cgroup)."""
        found = set()
        for d in self.sandbox_cgroup_dirs(sid):
            for dirpath, _, files in os.walk(d):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(dirpath, "cgroup.procs")) as f:
                            found.update(int(x) for x in f.read().split())
                    except OSError:
                        pass
        return sorted(found)

    def processes(self):
        """Host processes that belong to this edge's sandboxes (by cgroup or root dir)."""
        tags = [f"/dsec-{self.instance}/", f"/dsec-{self.instance}-vm/"] if self.instance else []
        state = str(self.state_dir)
        helper = self.lxcfs_pid() if self.running() else None  # the edge's, not a sandbox's
        out = []
        for pid in pids():
            if pid in (os.getpid(), self.pid, helper):
                continue
            cgroups = _proc_cgroups(pid) if tags else ""
            if any(t in cgroups for t in tags):
                out.append(pid)
                continue
            try:
                if os.readlink(f"/proc/{pid}/root").startswith(state):
                    out.append(pid)
                    continue
                if state.encode() in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(pid)
            except OSError:
                pass
        return out

    def lxcfs_pid(self):
        """The lxcfs serving this edge's sandboxes' /proc views, or None."""
        try:
            pid = int((self.state_dir / "lxcfs" / "lxcfs.pid").read_text().strip())
            if str(self.state_dir).encode() in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except (OSError, ValueError):
            pass
        return None

    def mounts(self):
        state = str(self.state_dir)
        # lxcfs's mount is the running edge's own (its sandboxes' /proc views), not residue.
        own = str(self.state_dir / "lxcfs" / "mnt") if self.running() and self.lxcfs_pid() else None
        return [m for m in mountinfo() if (m == state or m.startswith(state + "/")) and m != own]

    def loop_devices(self):
        """Loop devices backed by files in this edge's state dir (EROFS image layers)."""
        state = str(self.state_dir)
        out = []
        for bf in glob.glob("/sys/block/loop*/loop/backing_file"):
            try:
                with open(bf) as f:
                    back = f.read().strip()
            except OSError:
                continue
            if back == state or back.startswith(state + "/"):
                out.append(f"/dev/{bf.split('/')[3]} -> {back}")
        return out

    def residue(self):
        """What is left of this edge on the host; empty when it cleaned up."""
        out = {}
        if self.running():
            out["edge_running"] = [self.pid]
        procs = self.processes()
        if procs:
            out["processes"] = [
                (p, pathlib.Path(f"/proc/{p}/cmdline").read_bytes()[:80] if os.path.exists(
                    f"/proc/{p}") else b"?") for p in procs]
        cg = self.cgroup_dirs()
        if cg:
            out["cgroups"] = cg
        mnt = self.mounts()
        if mnt:
            out["mounts"] = mnt
        loops = self.loop_devices()
        if loops:
            out["loop_devices"] = loops
        return out

    def force_clean(self):
        """Best effort: kill and remove whatever the edge left (after a failed test)."""
        if self.running():
            self.proc.kill()
            self.proc.wait()
        for d in sorted(self.cgroup_dirs(), key=len, reverse=True):
            for f in ("cgroup.kill",):
                try:
                    with open(os.path.join(d, f), "w") as fh:
                        fh.write("1")
                except OSError:
                    pass
            for f in ("freezer.state",):
                try:
                    with open(os.path.join(d, f), "w") as fh:
                        fh.write("THAWED")
                except OSError:
                    pass
        for _ in range(3):
            for p in self.processes():
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        for m in sorted(self.mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL, check=False)
        for loop in self.loop_devices():
            subprocess.run(["losetup", "-d", loop.split()[0]], stderr=subprocess.DEVNULL,
                           check=False)
        for d in sorted(self.cgroup_dirs(), key=len, reverse=True):
            for _ in range(20):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)

    def shutdown_and_check(self):
        """Stops the edge (restarting it first if a test killed it, so it re-adopts and
        destroys what it left) and returns the residue found afterwards."""
        if self.proc is not None and not self.running() and self.state_dir.exists():
            try:
                self.launch()
            except Exception:  # noqa: BLE001 -- the residue check below reports the rest
                pass
        rc = self.stop()
        # Teardown inside the kernel (cgroup removal after the last task exits) can lag a
        # little behind the edge's exit: poll briefly before calling it residue.
        deadline = time.monotonic() + 10
        res = self.residue()
        while res and time.monotonic() < deadline:
            time.sleep(0.1)
            res = self.residue()
        if rc not in (0, None):
            res["exit_code"] = rc
        return res

    def cleanup(self):
        try:
            if self.residue():
                self.force_clean()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
