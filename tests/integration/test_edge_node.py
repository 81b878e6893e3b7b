"""Node endpoints and the HTTP layer on a live edge: health, node, images, /metrics (strict
Prometheus text parser), auth on TCP and the unix socket, size bounds, unknown routes and
malformed HTTP."""

import json
import math
import os
import re
import socket
import subprocess
import sys

import pytest

from edge_harness import KIND, Client

# ---- a strict Prometheus text format (0.0.4) parser ---------------------------------------

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class PromError(AssertionError):
    pass


def _parse_value(text, lineno):
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise PromError(f"line {lineno}: bad value {text!r}")
    return float(text)


def _parse_labels(s, i, lineno):
    """Parses `{a="b",c="d"}` starting at s[i] == '{'; returns (labels, index after '}')."""
    labels = {}
    i += 1
    while True:
        if s[i] == "}":
            return labels, i + 1
        m = LABEL_NAME.match(s, i)
        if not m:
            raise PromError(f"line {lineno}: bad label name at {s[i:]!r}")
        name = m.group(0)
        i = m.end()
        if s[i:i + 2] != '="':
            raise PromError(f"line {lineno}: expected =\" after {name}")
        i += 2
        val = []
        while True:
            if i >= len(s):
                raise PromError(f"line {lineno}: unterminated label value")
            c = s[i]
            if c == "\\":
                nxt = s[i + 1]
                if nxt not in ('\\', '"', "n"):
                    raise PromError(f"line {lineno}: bad escape \\{nxt}")
                val.append("\n" if nxt == "n" else nxt)
                i += 2
                continue
            if c == '"':
                i += 1
                break
            if c == "\n":
                raise PromError(f"line {lineno}: newline in a label value")
            val.append(c)
            i += 1
        if name in labels:
            raise PromError(f"line {lineno}: label {name} repeated")
        labels[name] = "".join(val)
        if s[i] == ",":
            i += 1
        elif s[i] != "}":
            raise PromError(f"line {lineno}: expected , or }} at {s[i:]!r}")


def parse_prometheus(text):
    """Returns {family: {"type", "help", "samples": [(name, labels, value)]}}; raises on any
    deviation from the text format, a sample without a TYPE before it, a family split in two,
    duplicate series, or a malformed histogram."""
    if not text.endswith("\n"):
        raise PromError("the exposition must end with a newline")
    families, order, current = {}, [], None
    seen_series = set()

    def family_of(name):
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and families.get(base, {}).get("type") in (
                    "histogram", "summary"):
                return base
        return name

    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.fullmatch(name):
                    raise PromError(f"line {lineno}: bad metric name {name!r}")
                fam = families.setdefault(name, {"type": None, "help": None, "samples": []})
                if parts[1] == "TYPE":
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise PromError(f"line {lineno}: bad TYPE line")
                    if fam["type"] is not None or fam["samples"]:
                        raise PromError(f"line {lineno}: TYPE of {name} after its samples "
                                        "or twice")
                    fam["type"] = parts[3]
                else:
                    if fam["help"] is not None:
                        raise PromError(f"line {lineno}: HELP of {name} twice")
                    fam["help"] = parts[3] if len(parts) == 4 else ""
                if name != current:
                    if name in order:
                        raise PromError(f"line {lineno}: family {name} is split")
                    order.append(name)
                    current = name
            continue  # other comments are allowed
        m = METRIC_NAME.match(line)
        if not m:
            raise PromError(f"line {lineno}: bad sample line {line!r}")
        name, i = m.group(0), m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, lineno)
        if i >= len(line) or line[i] != " ":
            raise PromError(f"line {lineno}: expected a space before the value")
        rest = line[i + 1:].split(" ")
        if len(rest) not in (1, 2) or (len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1])):
            raise PromError(f"line {lineno}: bad value/timestamp {line[i + 1:]!r}")
        value = _parse_value(rest[0], lineno)
        fam_name = family_of(name)
        fam = families.get(fam_name)
        if fam is None or fam["type"] is None:
            raise PromError(f"line {lineno}: sample {name} without a TYPE line first")
        if fam_name != current:
            raise PromError(f"line {lineno}: sample of {fam_name} outside its family block")
        key = (name, tuple(sorted(labels.items())))
        if key in seen_series:
            raise PromError(f"line {lineno}: duplicate series {key}")
        seen_series.add(key)
        if fam["type"] == "counter" and (value < 0 or math.isnan(value)):
            raise PromError(f"line {lineno}: negative counter")
        fam["samples"].append((name, labels, value))
    for name, fam in families.items():
        if fam["type"] == "histogram":
            check_histogram(name, fam["samples"])
    return families


def check_histogram(name, samples):
    groups = {}
    for sname, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        g = groups.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if sname == name + "_bucket":
            if "le" not in labels:
                raise PromError(f"{name}: bucket without le")
            g["buckets"].append((_parse_value(labels["le"], 0), value))
        elif sname == name + "_sum":
            g["sum"] = value
        elif sname == name + "_count":
            g["count"] = value
        else:
            raise PromError(f"{name}: unexpected sample {sname}")
    for rest, g in groups.items():
        b = g["buckets"]
        if not b or b[-1][0] != math.inf:
            raise PromError(f"{name}{rest}: the last bucket must be le=+Inf")
        if [le for le, _ in b] != sorted(le for le, _ in b):
            raise PromError(f"{name}{rest}: buckets out of order")
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise PromError(f"{name}{rest}: buckets are not cumulative")
        if g["count"] is None or g["sum"] is None or g["count"] != b[-1][1]:
            raise PromError(f"{name}{rest}: _count must equal the +Inf bucket")


def test_prometheus_parser_rejects_garbage():
    good = "# TYPE a counter\na 1\n"
    assert parse_prometheus(good)["a"]["samples"] == [("a", {}, 1.0)]
    for bad in ["a 1\n", "# TYPE a counter\na 1", "# TYPE a counter\na{b=\"c} 1\n",
                "# TYPE a counter\na{b=c} 1\n", "# TYPE a counter\na 1 2 3\n",
                "# TYPE a counter\na x\n", "# TYPE a wrong\na 1\n",
                "# TYPE a counter\na 1\na 2\n", "# TYPE a counter\na -1\n",
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                "h_sum 1\nh_count 1\n",
                "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
                "# TYPE a counter\na 1\n# TYPE b counter\nb 1\na{x=\"1\"} 1\n"]:
        with pytest.raises(PromError):
            parse_prometheus(bad)


def value_of(fams, family, sample=None, **labels):
    for name, lab, v in fams[family]["samples"]:
        if name == (sample or family) and all(lab.get(k) == val for k, val in labels.items()):
            return v
    return None


def test_metrics(client, sandbox):
    fams0 = parse_prometheus(client.get("/metrics", expect=200).body.decode())
    client.sh(sandbox, "true")
    client.get("/v1/sandboxes/sb-it-missing", expect=404)
    r = client.get("/metrics", expect=200)
    assert r.content_type.startswith("text/plain") and "version=0.0.4" in r.content_type
    fams = parse_prometheus(r.body.decode())
    for family, kind in [("dsec_sandboxes", "gauge"), ("dsec_sandbox_create_seconds", "histogram"),
                         ("dsec_exec_seconds", "histogram"), ("dsec_api_requests_total",
                                                              "counter"),
                         ("dsec_rejects_total", "counter"), ("dsec_errors_total", "counter"),
                         ("dsec_sandboxes_created_total", "counter"),
                         ("dsec_sandboxes_deleted_total", "counter")]:
        assert fams[family]["type"] == kind, family
        assert fams[family]["help"], family
    # Sandboxes by state and kind agree with /v1/node.
    node = client.get("/v1/node", expect=200).json
    for state in ("creating", "running", "paused", "failed"):
        v = value_of(fams, "dsec_sandboxes", state=state, kind=KIND or "container")
        assert v is not None, state
        assert v == node["usage"]["by_state"].get(state, 0), (state, v, node["usage"])
    assert value_of(fams, "dsec_sandboxes", state="running", kind=KIND or "container") >= 1
    assert value_of(fams, "dsec_sandbox_create_seconds", "dsec_sandbox_create_seconds_count") >= 1
    assert (value_of(fams, "dsec_exec_seconds", "dsec_exec_seconds_count")
            > value_of(fams0, "dsec_exec_seconds", "dsec_exec_seconds_count"))
    assert value_of(fams, "dsec_api_requests_total", method="GET", code="404") >= 1
    assert value_of(fams, "dsec_errors_total", code="not_found") >= 1
    assert value_of(fams, "dsec_sandboxes_created_total") >= 1


def test_health_node_images(edge, client):
    r = client.get("/v1/health", token=None, expect=200)
    assert r.json == {"ok": True}
    n = client.get("/v1/node", expect=200).json
    assert n["node"] == "it" and n["instance"] == edge.instance
    # microVMs where the node can run them (test_microvm.py), else the reason.
    vm = n["features"]["microvm"]
    assert n["backends"] == (["container", "microvm"] if vm["available"] else ["container"])
    assert vm["available"] or vm["reason"]
    # The built-in runtimes, warm before the edge said it was ready.
    builtin = {p["name"]: p for p in n["pools"]}
    assert {"python", "bash"} <= set(builtin)
    assert all(builtin[r]["workers"]["idle"] >= builtin[r]["min_idle"] for r in ("python", "bash"))
    assert n["capacity"]["max_sandboxes"] == 4096 and n["capacity"]["overcommit"] == 8
    cap = n["capacity"]
    assert cap["reserve_memory_mb"] == max(1024, cap["memory_mb"] // 10), cap
    assert abs(cap["admit_memory_mb"] - (cap["memory_mb"] - cap["reserve_memory_mb"]) * 8) <= 8
    assert n["usage"]["sandboxes"] == sum(n["usage"]["by_state"].values())
    assert isinstance(n["features"], dict)
    imgs = client.get("/v1/images", expect=200).json
    host = [i for i in imgs["images"] if i["name"] == "host"]
    assert host and host[0]["source"] == "builtin" and host[0]["builtin"] is True


# ---- auth ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/v1/node"),
    ("GET", "/metrics"), ("GET", "/v1/images"), ("DELETE", "/v1/sandboxes/sb-it-x"),
    ("POST", "/v1/sandboxes/sb-it-x/exec"), ("PUT", "/v1/sandboxes/sb-it-x/files?path=/a"),
    ("GET", "/v1/nope"), ("DELETE", "/v1/jobs/j"),
])
def test_auth_required_on_tcp(client, method, path):
    for token in (None, "wrong-token-0123456789abcdef", client.token + "x", client.token[:-1]):
        r = client.request(method, path, {} if method in ("POST",) else None, token=token,
                           validate=False)
        assert r.status == 401, (method, path, token, r)
        assert r.json["error"]["code"] == "unauthorized"
        assert r.headers.get("www-authenticate", "").startswith("Bearer")
    # Other schemes and a bare token are not accepted either.
    for auth in (f"Basic {client.token}", client.token, "Bearer", "Bearer "):
        r = client.request(method, path, token=False, headers={"Authorization": auth},
                           validate=False)
        assert r.status == 401, (auth, r)


def test_token_scheme_case_insensitive(client):
    client.get("/v1/node", token=False, headers={"Authorization": f"bearer {client.token}"},
               expect=200)


def test_unix_socket_root_without_token(edge):
    u = edge.unix_client()
    assert u.get("/v1/node", expect=200).json["instance"] == edge.instance
    sb = u.post("/v1/sandboxes", {"memory_mb": 64}, expect=201).json
    assert u.post(f"/v1/sandboxes/{sb['id']}/exec", {"shell": "echo unix"},
                  expect=200).json["stdout"] == "unix\n"
    u.delete(f"/v1/sandboxes/{sb['id']}", expect=204)
    st = os.stat(edge.socket)
    assert st.st_uid == 0 and (st.st_mode & 0o077) == 0


def test_unix_socket_refuses_non_root(edge):
    # As nobody: the socket file itself is root-only; and a peer that got in would get 403.
    code = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"  s.connect({edge.socket!r})\n"
        "except PermissionError:\n"
        "  print('denied'); sys.exit(0)\n"
        "s.sendall(b'GET /v1/node HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "print(s.recv(100).decode().split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         user=65534, group=65534, timeout=30)
    assert out.stdout.strip() in ("denied", "403"), out


# ---- bounds and malformed requests --------------------------------------------------------

def test_oversize_json_body_is_413(client):
    body = json.dumps({"cmd": ["true"], "stdin": "x" * (2 << 20)})
    r = client.post("/v1/sandboxes", body, headers={"Content-Type": "application/json"},
                    validate=False)
    assert r.status == 413 and r.json["error"]["code"] == "too_large"


def test_oversize_headers_is_413(client):
    r = client.get("/v1/node", headers={"X-Big": "y" * (40 << 10)}, validate=False)
    assert r.status in (413, 431) and r.json["error"]["code"] == "too_large"


def raw_http(edge, data, read_all=True):
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if not read_all and b"\r\n\r\n" in out:
                break
        return out


def parse_raw(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, head.decode("latin-1"), body


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/node HTTP/9.9\r\n\r\n",
    b"GET /v1/node HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
    b"GET /v1/sandboxes/%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /v1/sandboxes?label=%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
])
def test_malformed_http(edge, request_bytes):
    resp = raw_http(edge, request_bytes)
    status, head, body = parse_raw(resp)
    assert 400 <= status < 500, resp
    assert json.loads(body)["error"]["code"] in ("bad_request", "unauthorized")
    # The daemon is still there.
    assert Client(edge.url, edge.token).get("/v1/health", expect=200)


def test_unknown_routes_and_methods(client):
    for method, path in [("GET", "/v1/nope"), ("GET", "/"), ("GET", "/v1/sandboxes/x/y/z/w"),
                         ("GET", "/v2/sandboxes"), ("GET", "/v1/sandboxes//exec")]:
        r = client.request(method, path, validate=False)
        assert r.status == 404, (method, path, r)
        assert r.json["error"]["code"] == "not_found"
    # A path that exists, with a method it does not take: 405 with Allow.
    for method, path, allow in [("POST", "/v1/health", "GET"), ("PUT", "/v1/sandboxes", "GET, POST"),
                                ("PATCH", "/metrics", "GET"),
                                ("POST", "/v1/sandboxes/sb-x-1", "DELETE, GET, PATCH")]:
        r = client.request(method, path, validate=False)
        assert r.status == 405, (method, path, r)
        assert r.json["error"]["code"] == "method_not_allowed", r.json
        assert r.headers["allow"] == allow, (path, r.headers)
        assert method in r.json["error"]["message"] and allow in r.json["error"]["message"]


def test_keep_alive_many_requests_one_connection(edge):
    c = Client(edge.url, edge.token, keep_alive=True)
    try:
        for _ in range(50):
            c.get("/v1/health", expect=200)
        first = c._conn
        c.get("/v1/node", expect=200)
        assert c._conn is first  # the same connection served all of them
    finally:
        c.close()


def test_pipelined_requests(edge):
    req = (f"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
           f"GET /v1/node HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {edge.token}\r\n"
           f"Connection: close\r\n\r\n").encode()
    resp = raw_http(edge, req)
    assert resp.count(b"HTTP/1.1 200") == 2, resp[:500]


def test_audit_log_and_hidden_secrets(edge, client, sandbox):
    marker = "audit-" + os.urandom(6).hex()
    client.sh(sandbox, f"echo {marker}")
    log = edge.state_dir / "audit" / "exec.log"
    lines = [json.loads(x) for x in log.read_text().splitlines() if marker in x or
             f'"{sandbox}"' in x]
    events = [(x.get("event"), x.get("sandbox")) for x in lines]
    assert ("start", sandbox) in events and ("exit", sandbox) in events
    start = next(x for x in lines if x.get("event") == "start" and marker in json.dumps(x))
    assert start["principal"].startswith("token:") and start["user"] == "sandbox"
    # Neither the audit log, the token file, the config nor the socket is visible inside.
    for path in (edge.token_file, log, edge.config_file, edge.socket, edge.state_dir / "state.db"):
        r = client.exec(sandbox, f"cat {path} >/dev/null 2>&1 && echo VISIBLE || echo hidden",
                        user="root")
        assert r["stdout"] == "hidden\n", path
    r = client.exec(sandbox, f"grep -rl {edge.token} /tmp /root /workspace 2>/dev/null | head -1",
                    user="root")
    assert r["stdout"] == ""
