"""API abuse (issue 6): a seeded HTTP fuzzer over every route of api/openapi.yaml, request
smuggling framings, oversized bodies, slowloris connections, thousands of parallel requests, and
bad credentials on every authenticated route. The edge answers each with a 4xx JSON error (never
a 5xx, never a hang), stays up, and serves a normal create/exec/delete afterwards.

The fuzzer is deterministic (SEED): the same corpus every run. Every request it sends is invalid
by construction: malformed or non-object JSON, one field of a valid body given a wrong type or
an out-of-range / non-finite / huge number (the spec, api/openapi.yaml, is the oracle: a mutant
the spec accepts is not sent), unknown fields, duplicate keys, 100k-deep nesting, malformed ids
in the path, bad query values, broken framing (Content-Length / Transfer-Encoding), oversized
heads, garbage request lines and invalid UTF-8.
"""

import base64
import collections
import concurrent.futures
import json
import os
import random
import select
import socket
import statistics
import threading
import time

import pytest

import edge_fixtures
import edge_harness
from edge_harness import ERROR_STATUS, Edge, wait_until

SEED = 6
JSON_LIMIT = 1 << 20        # max_json_body_bytes of the module's edge (100k-deep nesting fits)
UPLOAD_LIMIT = 4 << 20      # max_upload_bytes
IDLE_TIMEOUT_S = 3          # a new connection must finish its first request head in this time
MAX_SANDBOXES = 6


# ---- the module's edge ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def aedge():
    """A dedicated edge with small, known limits (torn down with the residue check)."""
    edge_fixtures._skip_if_not_runnable()
    e = Edge.start(config={"max_json_body_bytes": JSON_LIMIT, "max_upload_bytes": UPLOAD_LIMIT,
                           "idle_timeout_s": IDLE_TIMEOUT_S, "max_sandboxes": MAX_SANDBOXES,
                           "fncall_min_idle": 0})
    yield e
    edge_fixtures._teardown(e)


@pytest.fixture
def aclient(aedge):
    c = aedge.client()
    yield c
    c.close()


@pytest.fixture
def asandbox(aclient):
    sid = aclient.create({"memory_mb": 64, "labels": {"suite": "api-abuse"}})["id"]
    yield sid
    aclient.remove(sid)


# ---- raw HTTP ---------------------------------------------------------------------------

class Raw:
    """One parsed response off the wire."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def __repr__(self):
        return f"<{self.status} {self.body[:200]!r}>"


def parse_responses(buf):
    """Splits what the server sent into responses (Content-Length or chunked bodies). Returns
    (responses, leftover bytes)."""
    out = []
    while True:
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            return out, buf
        head = buf[:head_end].decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            return out, buf
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        rest = buf[head_end + 4:]
        if status == 100:
            buf = rest
            continue
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body, pos = b"", 0
            while True:
                eol = rest.find(b"\r\n", pos)
                if eol < 0:
                    return out, buf
                n = int(rest[pos:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + n + 2:
                    return out, buf
                body += rest[eol + 2:eol + 2 + n]
                pos = eol + 2 + n + 2
                if n == 0:
                    break
            out.append(Raw(status, headers, body))
            buf = rest[pos:]
            continue
        n = int(headers.get("content-length", "0"))
        if len(rest) < n:
            return out, buf
        out.append(Raw(status, headers, rest[:n]))
        buf = rest[n:]


def exchange(port, data, timeout=10.0, settle=None):
    """Sends `data` on a new connection and reads until the server closes it (or `timeout`).
    With `settle`, stops reading that many seconds after the first complete response instead
    of waiting for the close. Returns (responses, closed_by_server, hung)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    buf, closed, hung = b"", False, False
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before it read everything we had: read the answer
        deadline = time.monotonic() + timeout
        first_done = None
        while True:
            now = time.monotonic()
            if settle is not None and first_done is not None and now >= first_done + settle:
                break
            if now >= deadline:
                hung = not parse_responses(buf)[0]
                break
            wait = deadline - now
            if settle is not None and first_done is not None:
                wait = min(wait, first_done + settle - now)
            r, _, _ = select.select([s], [], [], max(wait, 0.001))
            if not r:
                continue
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            buf += chunk
            if first_done is None and parse_responses(buf)[0]:
                first_done = time.monotonic()
    finally:
        s.close()
    return parse_responses(buf)[0], closed, hung


def head(method, target, token, *, body=b"", extra=(), length=True, close=True,
         ctype="application/json"):
    """A request as bytes; `extra` are raw header lines; `length` False leaves out
    Content-Length (the caller frames the body)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if body and ctype:
        lines.append(f"Content-Type: {ctype}")
    if length and (body or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    lines.extend(extra)
    text = "\r\n".join(lines) + "\r\n\r\n"
    return text.encode("utf-8", "surrogateescape") + body


def error_problem(r):
    """None if `r` is a well-formed JSON error whose code fits its status, else the reason."""
    if not r.headers.get("content-type", "").startswith("application/json"):
        return "not JSON"
    try:
        err = json.loads(r.body)["error"]
    except (ValueError, KeyError, TypeError):
        return "no {error: ...} body"
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return "malformed error object"
    if ERROR_STATUS.get(err.get("code")) != r.status:
        return f"code {err.get('code')!r} does not fit {r.status}"
    if r.status in (429, 503) and not r.headers.get("retry-after", "").isdigit():
        return "no Retry-After"
    return None


# ---- the fuzz corpus ------------------------------------------------------------------------

# A valid body per JSON route (the fuzzer breaks exactly one thing in it). Placeholders in the
# path: {id} the fuzz sandbox, {sid} one of its shell sessions, {eid} a finished exec, {name} a
# pool name nobody uses, {job} a job label nobody uses.
JSON_ROUTES = [
    ("POST", "/v1/sandboxes", {"memory_mb": 16, "labels": {"fuzz": "created"}}),
    ("PATCH", "/v1/sandboxes/{id}", {"labels": {"fuzz": "patched"}, "ttl_s": 3000}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": ["true"], "timeout_ms": 5000}),
    ("POST", "/v1/sandboxes/{id}/signal", {"signal": "CONT"}),
    ("POST", "/v1/sandboxes/{id}/shells", {"user": "sandbox"}),
    ("POST", "/v1/sandboxes/{id}/shells/{sid}/run", {"command": "true", "timeout_ms": 5000}),
    ("POST", "/v1/fncalls", {"runtime": "bash", "code": "true", "timeout_ms": 5000}),
    ("PUT", "/v1/pools/{name}", {"kind": "fncall", "runtime": "bash", "min_idle": 0, "max": 1}),
    ("POST", "/v1/sandboxes/{id}/pause", {"request_id": "fuzz-pause"}),
    ("POST", "/v1/sandboxes/{id}/resume", {"request_id": "fuzz-resume"}),
    ("POST", "/v1/jobs/{job}/pause", {"request_id": "fuzz-job-pause"}),
]

WRONG_VALUES = ["x", "", 7, -7, 7.5, True, False, [], {}, ["x"], [1], {"k": "v"}, {"k": 1},
                0, 1e308, -1e308, 2 ** 64, 2 ** 63, -(2 ** 63) - 1, 2 ** 31, -1, 1e-300,
                "a" * 5000, ["a"] * 5000]
NONFINITE = ["NaN", "Infinity", "-Infinity", "nan", "inf", "1e400", "-1e400", "0x10", "01",
             ".5", "1.", "+1", "1e", "--1", "True", "None", "undefined"]
MALFORMED_SUFFIXES = ["x", "}", ",", "]", "{}", " 1", "\x00", "/* c */", "// c", "'", "\\"]
BAD_IDS = ["..", "%2e%2e", "a%2Fb", "a%2F..%2Fb", "x%00y", "%00", "a" * 10240, "%C3%A9t%C3%A9",
           "%FF%FE", "sb-x..y", "a%20b", "%0d%0aX-Injected:%201", "a%5Cb", "%E2%80%AE", "*",
           "a;b", "%25", "~root", "a%3Fb%3Dc", "%F0%9F%92%A9"]
QUERY_FAULTS = [
    ("GET", "/v1/sandboxes?limit={v}", ["x", "0", "-1", "1001", "1e308", "18446744073709551616",
                                       "%00"]),
    ("GET", "/v1/sandboxes?state={v}", ["x", "RUNNING", "%00", "running%00"]),
    ("GET", "/v1/sandboxes?label={v}", ["nokey", "=v", "%00"]),
    ("GET", "/v1/sandboxes/{id}/execs/{eid}?wait_ms={v}", ["x", "-1", "600001", "1e9",
                                                          "99999999999999999999"]),
    ("GET", "/v1/sandboxes/{id}/files?path={v}", ["", "%00", "/etc/%00passwd", "/nonexistent-%FF",
                                                 "/nonexistent/" + "a" * 5000]),
    ("GET", "/v1/sandboxes/{id}/files?path=/etc/hostname&max_bytes={v}",
     ["x", "-1", "1e400", "18446744073709551616"]),
    ("GET", "/v1/sandboxes/{id}/files/list?path={v}", ["", "%00", "/nonexistent-dir"]),
    ("GET", "/v1/sandboxes/{id}/files/stat?path={v}", ["", "%00", "/nonexistent-file"]),
    ("DELETE", "/v1/sandboxes/{id}/files?path={v}", ["", "%00"]),
    ("POST", "/v1/sandboxes/{id}/files/mkdir?path={v}", ["", "%00", "/tmp/%00x"]),
    ("PUT", "/v1/sandboxes/{id}/files?path={v}", ["", "%00", "/tmp/a%00b"]),
    ("GET", "/v1/sandboxes/{id}/archive?path={v}", ["", "%00", "/nonexistent-dir"]),
    ("PUT", "/v1/sandboxes/{id}/archive?path={v}", ["", "%00"]),
    ("GET", "/v1/sandboxes/{id}/attach?cmd=true&cols={v}", ["x", "0", "65536", "-1"]),
    ("GET", "/v1/sandboxes/{id}/files?path=%ZZ{v}", [""]),
    ("GET", "/v1/sandboxes/{id}/files?path=/etc/hostname%{v}", ["", "4", "G0"]),
]


def _mutations(value):
    """JSON values a field's valid value can be replaced by."""
    return [v for v in WRONG_VALUES if not (type(v) is type(value) and v == value)]


def _fill(template, ids):
    return template.format(**ids)


# Body-less actions (pause, resume, jobs) take an optional JSON body with only "request_id".
ACTION_BODY = {"type": "object", "additionalProperties": False,
               "properties": {"request_id": {"type": "string", "minLength": 1, "maxLength": 128}}}


def body_schema(sp, op):
    rb = op.get("requestBody")
    if rb is None:
        return ACTION_BODY
    return sp.deref(sp.deref(rb)["content"]["application/json"]["schema"])


def _spec_rejects(sp, method, path, body):
    """True if the spec says this request is invalid (its path parameters or its body)."""
    path = path.split("?")[0]
    route = sp.match(method, path)
    if route is None:
        return True
    op = route[1]
    try:
        if op.get("requestBody") is None:
            sp.validate_request(method, path, None)  # the path parameters
            if body is not None:
                sp.validate(ACTION_BODY, body)
        else:
            sp.validate_request(method, path, body)
    except AssertionError:
        return True
    return False


class Case:
    __slots__ = ("kind", "data", "expect", "closed", "note")

    def __init__(self, kind, data, expect=None, closed=False, note=""):
        self.kind, self.data, self.expect, self.closed, self.note = kind, data, expect, closed, note


def build_corpus(rng, ids, token):
    """The fuzz requests. ids: {id, sid, eid, name, job}."""
    sp = edge_harness.spec()
    cases = []

    def add(kind, data, expect=None, closed=False, note=""):
        cases.append(Case(kind, data, expect, closed, note))

    def send_json(kind, method, path, text, note=""):
        body = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        add(kind, head(method, path, token, body=body), note=note or text[:120])

    for method, template, base in JSON_ROUTES:
        path = _fill(template, ids)
        valid = json.dumps(base)
        # Wrong types and huge / out-of-range numbers in every field the spec declares.
        op = sp.match(method, path)[1]
        schema = body_schema(sp, op)
        for field in sorted(schema.get("properties", {})):
            for v in _mutations(base.get(field)):
                mutant = dict(base, **{field: v})
                if _spec_rejects(sp, method, path, mutant):
                    send_json("wrong type/range", method, path, json.dumps(mutant))
            for lit in NONFINITE:
                send_json("non-finite/invalid literal", method, path,
                          json.dumps(dict(base, **{field: 0})).replace(
                              f'"{field}": 0', f'"{field}": {lit}'))
        # Unknown fields, wrong top-level types.
        for extra in ("bogus", "memroy_mb", "", "__proto__", "cmd\u0000", "\U0001f4a9"):
            send_json("unknown field", method, path, json.dumps(dict(base, **{extra: 1})))
        for top in ("[]", '"x"', "1", "null", "true", "[" + valid + "]", '"' + valid + '"'):
            send_json("non-object body", method, path, top)
        # Malformed JSON: truncations, trailing garbage, broken syntax, bad strings.
        for _ in range(12):
            k = rng.randrange(1, len(valid))
            if valid[:k].strip():
                send_json("malformed JSON", method, path, valid[:k])
        for suffix in MALFORMED_SUFFIXES:
            send_json("malformed JSON", method, path, valid + suffix)
        key = next(iter(base))
        for broken in (valid.replace('"', "'"), valid.replace(f'"{key}"', key, 1),
                       valid[:-1] + ",}", valid.replace(":", "=", 1), "{" + valid,
                       valid.replace(f'"{key}"', f'"{key}\x01"', 1),
                       valid.replace(f'"{key}"', f'"{key}\\q"', 1)):
            send_json("malformed JSON", method, path, broken)
        for bad in (b'"\xff"', b'"\xc3"', b'"\xed\xa0\x80"', b'"\xf8\x88\x80\x80\x80"',
                    b'"\\ud800"', b'"\\udc00x"', b'"\\u12"'):
            send_json("invalid UTF-8", method, path, b'{"' + key.encode() + b'": ' + bad + b"}")
        # Duplicate keys (same and different values), at the top and nested.
        first, rest = valid[1:-1].split(",", 1) if "," in valid else (valid[1:-1], None)
        send_json("duplicate key", method, path, "{" + valid[1:-1] + "," + first + "}")
        send_json("duplicate key", method, path, '{"request_id": "a", ' + valid[1:-1] +
                  ', "request_id": "b"}')
        send_json("duplicate key", method, path,
                  json.dumps(dict(base, labels={})).replace('"labels": {}',
                                                            '"labels": {"a": "1", "a": "2"}'))
        # 100,000 levels of nesting, as the body and inside a field.
        depth = 100_000
        for text in ("[" * depth + "]" * depth,
                     '{"a":' * depth + "1" + "}" * depth,
                     "{" + f'"{key}": ' + "[" * depth + "]" * depth + "}",
                     "{" + f'"{key}": ' + '{"a":' * depth + "1" + "}" * depth + "}",
                     '[{"a":' * (depth // 2) + "1" + "}]" * (depth // 2),
                     "[" * depth):
            send_json("deep nesting", method, path, text, note=f"depth {depth}")
        # Bad ids in each path parameter.
        for param in ("id", "sid", "name", "job"):
            if "{" + param + "}" not in template:
                continue
            for bad in BAD_IDS:
                p = _fill(template, dict(ids, **{param: bad}))
                if _spec_rejects(sp, method, p, base):
                    send_json("bad id", method, p, valid, note=bad[:40])

    # Bad ids on every other route of the spec (GETs, DELETEs, uploads, planned routes).
    for method, template, op in sp.operations():
        if op.get("security") == [] or "{" not in template:
            continue
        if any(m == method and t == template for m, t, _ in JSON_ROUTES):
            continue
        for param in ("id", "eid", "sid", "name", "job"):
            if "{" + param + "}" not in template:
                continue
            for bad in BAD_IDS:
                p = _fill(template, dict(ids, **{param: bad}))
                if "/files" in p or "/archive" in p:
                    p += "?path=/tmp/fuzz-target"
                body = b"x" if method == "PUT" else b""
                if not _spec_rejects(sp, method, p, body or None):
                    continue
                add("bad id", head(method, p, token, body=body, ctype="application/octet-stream"),
                    note=f"{method} {template} {param}={bad[:40]}")
    # Bad query values.
    for method, template, values in QUERY_FAULTS:
        for v in values:
            p = _fill(template.replace("{v}", "\0"), ids).replace("\0", v)
            body = b"x" if method == "PUT" else b""
            add("bad query", head(method, p, token, body=body, ctype="application/octet-stream"),
                note=p[:100])
    # Garbage tar uploads.
    for n in (1, 100, 511, 512, 1024, 4096):
        junk = bytes(rng.randrange(256) for _ in range(n))
        add("garbage tar", head("PUT", _fill("/v1/sandboxes/{id}/archive?path=/tmp/fuzz-tar", ids),
                                token, body=junk, ctype="application/x-tar"), note=f"{n} bytes")

    # Framing: Content-Length / Transfer-Encoding abuse. The connection must close after the
    # one answer (no bytes of the body may be taken as a second request).
    target = _fill("/v1/sandboxes/{id}/exec", ids)
    body = b'{"cmd": ["true"]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for extra, payload in (
            (["Content-Length: 5", "Transfer-Encoding: chunked"], chunked),
            (["Transfer-Encoding: chunked", "Content-Length: 5"], chunked),
            ([f"Content-Length: {len(body)}", "Content-Length: 5"], body),
            (["Content-Length: 5", f"Content-Length: {len(body)}"], body),
            ([f"Content-Length: {len(body)}, 5"], body),
            (["Content-Length: -1"], body), (["Content-Length: +17"], body),
            (["Content-Length: 0x11"], body), (["Content-Length: 1 7"], body),
            (["Content-Length: 17.0"], body), (["Content-Length: "], body),
            (["Content-Length: 99999999999999999999999999"], body),
            (["Content-Length: 18446744073709551616"], body),
            (["Transfer-Encoding: gzip"], body), (["Transfer-Encoding: identity"], body),
            (["Transfer-Encoding: chunked, gzip"], chunked),
            (["Transfer-Encoding: xchunked"], chunked), (["Transfer-Encoding: chunked "], b""),
            (["Transfer-Encoding : chunked"], chunked), (["Transfer-Encoding:\tchunked\x0b"], chunked),
            (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], chunked),
            (["Transfer-Encoding: chunked"], b"fffffffffffffffffffff\r\n"),
            (["Transfer-Encoding: chunked"], b"-1\r\n"),
            (["Transfer-Encoding: chunked"], b"zz\r\n"),
            (["Transfer-Encoding: chunked"], b"11\r\n" + body + b"XX\r\n"),
            (["Transfer-Encoding: chunked"], b"0\r\n" + b"X-Trailer: " + b"a" * 20000 + b"\r\n\r\n"),
            (["Transfer-Encoding: chunked"], b"11\r\n" + body + b"\r\n0\r\nX\x00: 1\r\n\r\n"),
    ):
        if extra == ["Transfer-Encoding: chunked "]:
            continue  # trailing whitespace is trimmed: a valid header, not a fault
        add("framing", head("POST", target, token, body=b"", extra=extra, length=False,
                            close=False) + payload,
            closed=True, note=" | ".join(extra) + " " + repr(payload[:30]))
    # Oversized heads and header floods; oversized bodies (refused on the length alone).
    add("header flood", head("GET", "/v1/node", token, extra=[f"X-{i}: v" for i in range(4000)]),
        expect={413})
    add("header flood", head("GET", "/v1/node", token, extra=["X-Big: " + "a" * 20000]),
        expect={413})
    add("header flood", head("GET", "/v1/node?" + "a=b&" * 5000, token), expect={413})
    add("header flood", head("GET", "/v1/sandboxes/" + "a" * 17000, token), expect={413})
    add("header flood", head("GET", "/v1/node", token, extra=["Cookie: " + "c=d; " * 4000]),
        expect={413})
    for route in ("/v1/sandboxes", _fill("/v1/sandboxes/{id}/exec", ids)):
        add("oversized body", head("POST", route, token, body=b"", length=False,
                                   extra=[f"Content-Length: {JSON_LIMIT + 1}"]), expect={413})
    add("oversized body", head("PUT", _fill("/v1/sandboxes/{id}/files?path=/tmp/big", ids),
                               token, length=False, extra=[f"Content-Length: {UPLOAD_LIMIT + 1}"]),
        expect={413})
    # Request lines: bad methods, versions, targets; garbage; invalid UTF-8 in the head.
    for line in ("get /v1/node HTTP/1.1", "GETT /v1/node HTTP/1.1", "G\x01T /v1/node HTTP/1.1",
                 "GET /v1/node HTTP/2.0", "GET /v1/node HTTP/1.x", "GET /v1/node HTTP/11",
                 "GET /v1/node", "GET  /v1/node HTTP/1.1", "GET /v1/no de HTTP/1.1",
                 "GET /v1/no\x7fde HTTP/1.1", "GET v1/node HTTP/1.1",
                 "GET /v1/sandboxes/\udcff\udcfe HTTP/1.1", "GET /v1/\udcc3 HTTP/1.1",
                 "POST /v1/sandboxes/../../v1/node HTTP/1.1", "PRI * HTTP/2.0",
                 "DELETE /v1/sandboxes HTTP/1.1", "TRACE /v1/node HTTP/1.1",
                 "CONNECT 127.0.0.1:22 HTTP/1.1", " GET /v1/node HTTP/1.1", "\tGET / HTTP/1.1"):
        data = (line + f"\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close"
                       "\r\n\r\n").encode("utf-8", "surrogateescape")
        add("request line", data, note=line[:60])
    for extra in (["X-Bad: a\x00b"], ["X-Bad\x01: 1"], ["X Bad: 1"], [": empty-name"],
                  ["Authorization: Bearer \udcff\udcfe"]):
        data = head("GET", "/v1/node", None if extra[0].startswith("Authorization") else token,
                    extra=extra)
        add("bad header", data, note=repr(extra)[:60])
    for n in (1, 5, 50, 300, 3000):
        junk = bytes(rng.randrange(256) for _ in range(n)).replace(b"\r\n\r\n", b"")
        add("garbage", junk + b"\r\n\r\n", note=f"{n} random bytes")
        printable = "".join(chr(rng.randrange(33, 127)) for _ in range(n))
        add("garbage", (printable + "\r\n\r\n").encode(), note=f"{n} printable")
    tls = bytes.fromhex("160301012c010001280303") + os.urandom(32) + b"\x00" * 40
    add("garbage", tls + b"\r\n\r\n", note="TLS ClientHello")
    return cases


def run_case(port, case):
    """Sends one case; returns (status or None, problem or None)."""
    responses, closed, hung = exchange(port, case.data, timeout=15)
    if hung:
        return None, "no answer within 15 s (hang)"
    if not responses:
        return None, "the connection closed without an answer"
    r = responses[0]
    if len(responses) > 1:
        return r.status, f"{len(responses)} answers to one request: {responses[:3]}"
    if case.expect and r.status not in case.expect:
        return r.status, f"expected {sorted(case.expect)}: {r}"
    if not 400 <= r.status < 500:
        return r.status, f"not a 4xx: {r}"
    problem = error_problem(r)
    if problem:
        return r.status, f"{problem}: {r}"
    if case.closed and not closed:
        return r.status, "the connection stayed open after a framing error"
    return r.status, None


def edge_fds(edge):
    return len(os.listdir(f"/proc/{edge.pid}/fd"))


def assert_serves_normally(edge):
    """A normal create / exec / delete works."""
    c = edge.client()
    try:
        sid = c.create({"memory_mb": 32, "labels": {"suite": "api-abuse-after"}})["id"]
        try:
            assert c.exec(sid, "echo alive")["stdout"] == "alive\n"
        finally:
            c.delete(f"/v1/sandboxes/{sid}", expect=204)
    finally:
        c.close()


# ---- the cases ----------------------------------------------------------------------------

def test_fuzzer_every_answer_is_a_4xx_json_error(aedge, aclient, asandbox, figure):
    """A seeded fuzzer sends thousands of invalid requests over every route (bad JSON, wrong types, huge and non-finite numbers, duplicate keys, 100k-deep nesting, bad ids, broken framing, header floods, invalid UTF-8): each gets a 4xx JSON error, none a 5xx or a hang, and the edge then serves normally."""
    c = aclient
    sid = asandbox
    shell = c.post(f"/v1/sandboxes/{sid}/shells", {}, expect=201).json["shell_id"]
    eid = c.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"], "background": True},
                 expect=202).json["exec_id"]
    c.get(f"/v1/sandboxes/{sid}/execs/{eid}?wait_ms=10000", expect=200)
    pools_before = c.get("/v1/pools", expect=200).json
    # port 0: the port proxy's every answer here is its own 400 (a real port with nothing
    # listening would be the proxy's 502).
    ids = {"id": sid, "sid": shell, "eid": eid, "tid": "fuzz-trajectory-unused", "name": "fuzz-pool-unused",
           "job": "fuzz-job-unused", "port": "0", "project": "fuzz-project"}
    cases = build_corpus(random.Random(SEED), ids, aedge.token)
    assert len(cases) >= 2000, len(cases)

    statuses = collections.Counter()
    kinds = collections.Counter()
    failures = []
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for case, (status, problem) in zip(cases, pool.map(lambda k: run_case(aedge.port, k),
                                                             cases)):
            statuses[status] += 1
            kinds[case.kind] += 1
            if problem:
                failures.append(f"[{case.kind}] {case.note!r}: {problem}")
    elapsed = time.monotonic() - t0
    figure("fuzz requests", len(cases))
    figure("fuzz seconds", round(elapsed, 1))
    figure("status histogram", ", ".join(f"{k}: {v}" for k, v in sorted(
        statuses.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))
    figure("requests by kind", ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    assert aedge.running(), f"the edge died during the fuzz\n{aedge.log_tail()}"
    assert not failures, f"{len(failures)} bad answers, e.g.:\n" + "\n".join(failures[:80])

    # Nothing the fuzzer sent took effect: no new sandbox, pool, file, or patched label.
    listed = c.get("/v1/sandboxes", expect=200).json["sandboxes"]
    assert [s["id"] for s in listed] == [sid], listed
    assert listed[0]["labels"] == {"suite": "api-abuse"}, listed[0]
    assert c.get("/v1/pools", expect=200).json == pools_before
    assert c.sh(sid, "ls -A /tmp") == "", "a fuzzed request wrote into the sandbox"
    assert "handler threw" not in aedge.log_path.read_text(errors="replace")
    assert_serves_normally(aedge)


def test_request_smuggling_framings_do_not_run_a_second_request(aedge, aclient, asandbox):
    """Requests framed with CL+TE, two Content-Lengths, a negative or overflowing length, a non-chunked Transfer-Encoding or an overflowing chunk size, each hiding a second request in the body, get one 400 and a closed connection; the hidden request never runs."""
    tok = aedge.token
    results = []
    for n, (extra, framing) in enumerate((
            (["Content-Length: 4", "Transfer-Encoding: chunked"], "chunked"),
            (["Transfer-Encoding: chunked", "Content-Length: 4"], "chunked"),
            (["Content-Length: 0", "Content-Length: 200"], "raw"),
            (["Content-Length: 200", "Content-Length: 0"], "raw"),
            (["Content-Length: -200"], "raw"),
            (["Content-Length: 18446744073709551616"], "raw"),
            (["Transfer-Encoding: gzip"], "raw"),
            (["Transfer-Encoding: identity"], "raw"),
            (["Transfer-Encoding: xchunked"], "raw"),
            (["Transfer-Encoding: chunked, identity"], "raw"),
            (["Transfer-Encoding: chunked"], "overflow"),
    )):
        hidden = head("POST", f"/v1/sandboxes/{asandbox}/files/mkdir?path=/tmp/smuggled-{n}",
                      tok, close=False)
        if framing == "chunked":
            payload = b"0\r\n\r\n" + hidden
        elif framing == "overflow":
            payload = b"10000000000000000\r\n" + hidden
        else:
            payload = hidden
        data = head("POST", f"/v1/sandboxes/{asandbox}/files/mkdir?path=/tmp/outer-{n}", tok,
                    length=False, close=False, extra=extra) + payload
        responses, closed, hung = exchange(aedge.port, data, timeout=10)
        results.append((extra, [r.status for r in responses], closed, hung))
    bad = [r for r in results if r[1] != [400] or not r[2] or r[3]]
    assert not bad, f"framings not refused with one 400 and a close: {bad}"
    assert aclient.sh(asandbox, "ls -A /tmp") == "", "a smuggled or outer request ran"


def test_oversized_bodies_are_refused_before_the_body_is_read(aedge, asandbox, figure):
    """Announcing a body over the limit (JSON, upload, chunked, with Expect: 100-continue, and without a token) gets 413 (401 without a token) at once, without the edge waiting for the body, and the connection is closed."""
    tok = aedge.token
    json_route = f"/v1/sandboxes/{asandbox}/exec"
    upload = f"/v1/sandboxes/{asandbox}/files?path=/tmp/big"
    cases = [
        ("json +1", head("POST", json_route, tok, length=False,
                         extra=[f"Content-Length: {JSON_LIMIT + 1}"]), 413),
        ("json 1 TB", head("POST", json_route, tok, length=False,
                           extra=["Content-Length: 1099511627776"]), 413),
        ("create", head("POST", "/v1/sandboxes", tok, length=False,
                        extra=[f"Content-Length: {JSON_LIMIT + 1}"]), 413),
        ("upload +1", head("PUT", upload, tok, length=False,
                           extra=[f"Content-Length: {UPLOAD_LIMIT + 1}"]), 413),
        ("archive 1 TB", head("PUT", f"/v1/sandboxes/{asandbox}/archive?path=/tmp", tok,
                              length=False, extra=["Content-Length: 1099511627776"]), 413),
        ("100-continue", head("PUT", upload, tok, length=False,
                              extra=[f"Content-Length: {UPLOAD_LIMIT + 1}",
                                     "Expect: 100-continue"]), 413),
        ("no token", head("PUT", upload, None, length=False,
                          extra=[f"Content-Length: {UPLOAD_LIMIT + 1}"]), 401),
        ("wrong token", head("PUT", upload, "x" * 40, length=False,
                             extra=["Content-Length: 1099511627776"]), 401),
    ]
    worst = 0.0
    for name, data, want in cases:
        t = time.monotonic()
        responses, closed, hung = exchange(aedge.port, data, timeout=5)
        dt = time.monotonic() - t
        worst = max(worst, dt)
        assert not hung, f"{name}: the edge waited for the body"
        assert [r.status for r in responses] == [want], (name, responses)
        assert error_problem(responses[0]) is None, (name, responses[0])
        assert closed, f"{name}: the connection stayed open"
    # A chunked body (no length up front) is cut off at the limit while it is read.
    s = socket.create_connection(("127.0.0.1", aedge.port), timeout=10)
    try:
        s.sendall(head("POST", json_route, tok, length=False,
                       extra=["Transfer-Encoding: chunked"]))
        chunk = b"[" * 65536
        sent = 0
        try:
            while sent < 4 * JSON_LIMIT:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        except ConnectionResetError:
            pass
    finally:
        s.close()
    responses, _ = parse_responses(data)
    assert [r.status for r in responses] in ([413], []), responses
    figure("slowest refusal ms", round(worst * 1000, 1))
    assert aedge.client().get("/v1/health", expect=200)


def test_slowloris_connections_are_timed_out_and_others_served(aedge, figure):
    """Sixty connections sending their request head one byte per second are closed by the edge after its first-request timeout, while a normal client keeps getting fast answers."""
    n = 60
    socks = [socket.create_connection(("127.0.0.1", aedge.port), timeout=5) for _ in range(n)]
    request = head("GET", "/v1/node", aedge.token, close=False)
    closed_at = {}
    latencies = []
    stop = threading.Event()
    c = aedge.client(keep_alive=True)

    def normal():
        while not stop.is_set():
            t = time.monotonic()
            c.get("/v1/node", expect=200)
            latencies.append((time.monotonic() - t) * 1000)
            stop.wait(0.1)

    th = threading.Thread(target=normal, daemon=True)
    t0 = time.monotonic()
    th.start()
    try:
        for i in range(len(request)):
            if len(closed_at) == n or time.monotonic() - t0 > IDLE_TIMEOUT_S + 8:
                break
            for k, s in enumerate(socks):
                if k in closed_at:
                    continue
                try:
                    r, _, _ = select.select([s], [], [], 0)
                    if r and not s.recv(4096):
                        closed_at[k] = time.monotonic() - t0
                        continue
                    s.send(request[i:i + 1])
                except OSError:
                    closed_at[k] = time.monotonic() - t0
            time.sleep(1.0)
    finally:
        stop.set()
        th.join(30)
        for s in socks:
            s.close()
        c.close()
    figure("slow connections", n)
    figure("closed after s (max)", round(max(closed_at.values(), default=float("nan")), 1))
    figure("normal request p50 ms", round(statistics.median(latencies), 1))
    figure("normal request max ms", round(max(latencies), 1))
    assert len(closed_at) == n, f"{n - len(closed_at)} slow connections were never closed"
    assert max(closed_at.values()) < IDLE_TIMEOUT_S + 4, closed_at
    assert len(latencies) >= 10 and max(latencies) < 2000, latencies


def test_thousands_of_parallel_requests(aedge, asandbox, figure):
    """2,000 authenticated GETs over 200 concurrent keep-alive connections are all answered 200 (or 429/503), never another 5xx, and the edge's descriptors return to where they were."""
    fds_before = edge_fds(aedge)
    statuses = collections.Counter()
    errors = []
    lock = threading.Lock()
    paths = ["/v1/node", "/v1/sandboxes", f"/v1/sandboxes/{asandbox}", "/v1/health",
             f"/v1/sandboxes/{asandbox}/stats", "/v1/pools", "/v1/images"]
    barrier = threading.Barrier(200)

    def worker(k):
        c = aedge.client(keep_alive=True, validate=False)
        try:
            barrier.wait(30)
            for i in range(10):
                r = c.get(paths[(k + i) % len(paths)])
                with lock:
                    statuses[r.status] += 1
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            errors.append(repr(e))
        finally:
            c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    elapsed = time.monotonic() - t0
    figure("requests", sum(statuses.values()))
    figure("requests/s", round(sum(statuses.values()) / elapsed))
    figure("statuses", dict(statuses))
    assert not errors, errors[:5]
    assert sum(statuses.values()) == 2000
    assert set(statuses) <= {200, 429, 503}, statuses
    wait_until(lambda: edge_fds(aedge) <= fds_before + 2, 15, what="edge fds back to baseline")


def test_parallel_creates_against_a_small_node(aedge, figure):
    """200 simultaneous creates against a node with room for a few sandboxes get 201 or 429/503 (never another 5xx); no more than the cap are made, and after deleting them nothing is left."""
    c = aedge.client()
    base = c.get("/v1/node", expect=200).json["usage"]["sandboxes"]
    c.close()
    statuses = collections.Counter()
    made, errors = [], []
    lock = threading.Lock()
    barrier = threading.Barrier(200)

    def worker(k):
        cl = aedge.client()
        try:
            barrier.wait(30)
            r = cl.post("/v1/sandboxes", {"memory_mb": 16, "labels": {"burst": "1"}})
            with lock:
                statuses[r.status] += 1
                if r.status == 201:
                    made.append(r.json["id"])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            cl.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    c = aedge.client()
    try:
        figure("statuses", dict(statuses))
        assert not errors, errors[:5]
        assert set(statuses) <= {201, 429, 503}, statuses
        assert 1 <= len(made) <= MAX_SANDBOXES - base, statuses
        listed = {s["id"] for s in c.get("/v1/sandboxes?label=burst=1", expect=200).json[
            "sandboxes"]}
        assert listed == set(made)
    finally:
        for sid in made:
            c.delete(f"/v1/sandboxes/{sid}", expect=204)
    assert c.get("/v1/node", expect=200).json["usage"]["sandboxes"] == base
    for sid in made:
        assert not aedge.sandbox_cgroup_dirs(sid), f"{sid} left cgroups"
    c.close()


def _authenticated_operations():
    sp = edge_harness.spec()
    return [(m, t) for m, t, op in sp.operations() if op.get("security", True) != []]


def test_bad_credentials_are_401_on_every_authenticated_route(aedge, aclient, asandbox, figure):
    """A missing, empty, wrong, truncated, extended, differently-cased, padded, non-Bearer or doubled credential is 401 with WWW-Authenticate on every authenticated route of the spec, and nothing it asked for happens."""
    tok = aedge.token
    variants = {
        "missing": [],
        "empty": ["Authorization: "],
        "scheme only": ["Authorization: Bearer"],
        "empty token": ["Authorization: Bearer "],
        "wrong": ["Authorization: Bearer " + "w" * len(tok)],
        "swapcase": ["Authorization: Bearer " + tok.swapcase()],
        "upper": ["Authorization: Bearer " + tok.upper()] if tok.upper() != tok else None,
        "truncated": ["Authorization: Bearer " + tok[:-1]],
        "extended": ["Authorization: Bearer " + tok + "x"],
        "prefix": ["Authorization: Bearer x" + tok],
        "padded inside": ["Authorization: Bearer  " + tok],
        "tab": ["Authorization: Bearer\t" + tok],
        "no scheme": ["Authorization: " + tok],
        "basic": ["Authorization: Basic " + base64.b64encode(f"x:{tok}".encode()).decode()],
        "token scheme": ["Authorization: Token " + tok],
        "two tokens": ["Authorization: Bearer " + tok + " " + tok],
        "comma list": ["Authorization: Bearer " + tok + ", Bearer " + tok],
        "wrong then right": ["Authorization: Bearer " + "w" * len(tok),
                             "Authorization: Bearer " + tok],
        "right then wrong": ["Authorization: Bearer " + tok,
                             "Authorization: Bearer " + "w" * len(tok)],
        "other header": ["X-Authorization: Bearer " + tok],
        "query": None,
    }
    variants = {k: v for k, v in variants.items() if v is not None}
    ids = {"id": asandbox, "eid": "ex-none", "tid": "t-none", "sid": "sh-none", "name": "python", "job": "j",
           "port": "8000", "node": "n1", "project": "default"}
    ops = _authenticated_operations()
    assert len(ops) >= 40, ops
    bodies = {(m, t): json.dumps(b).encode() for m, t, b in JSON_ROUTES}
    failures = []
    count = 0
    for method, template in ops:
        path = template.format(**ids)
        if "/files" in path or "/archive" in path:
            path += "?path=/tmp/unauth"
        body = bodies.get((method, template), b"x" if method == "PUT" else b"")
        for name, lines in variants.items():
            data = head(method, path, None, body=body, extra=lines)
            responses, closed, hung = exchange(aedge.port, data, timeout=10)
            count += 1
            r = responses[0] if responses else None
            if (not r or r.status != 401 or error_problem(r)
                    or r.headers.get("www-authenticate") != "Bearer"):
                failures.append(f"{method} {template} [{name}]: {r}")
        # The token in the query string is no credential either.
        data = head(method, path + ("&" if "?" in path else "?") + f"access_token={tok}", None,
                    body=body)
        responses, _, _ = exchange(aedge.port, data, timeout=10)
        count += 1
        if not responses or responses[0].status != 401:
            failures.append(f"{method} {template} [query token]: {responses[:1]}")
    figure("unauthenticated requests", count)
    assert not failures, f"{len(failures)} not refused:\n" + "\n".join(failures[:20])
    # Nothing happened: the sandbox is there, unpaused, with its labels; no pool was touched.
    rec = aclient.get(f"/v1/sandboxes/{asandbox}", expect=200).json
    assert rec["state"] == "running" and rec["labels"] == {"suite": "api-abuse"}, rec
    assert aclient.sh(asandbox, "ls -A /tmp") == ""
    assert any(p["name"] == "python" for p in aclient.get("/v1/pools", expect=200).json["pools"])
    # The right token still works (also with the scheme in another case, which RFC 7235 allows).
    r = exchange(aedge.port, head("GET", "/v1/node", None,
                                  extra=["Authorization: bEaReR " + tok]))[0]
    assert [x.status for x in r] == [200]


def test_one_projects_token_cannot_touch_another_projects_sandbox(aedge, aclient):
    """An edge keeps each sandbox's project (an apiserver names its caller's in Dsec-Project;
    tests/cluster/test_access.py covers the cluster): every authenticated route of the spec on
    a sandbox of project A, asked in project B, is 404 "not found" as for an id that does not
    exist, and nothing it asked for happens; B's lists and job operations leave it alone."""
    tok = aedge.token
    r = exchange(aedge.port, head("POST", "/v1/sandboxes", tok,
                                  body=json.dumps({"memory_mb": 64,
                                                   "labels": {"job": "xproj"}}).encode(),
                                  extra=["Dsec-Project: proj-a"]))[0]
    assert r and r[0].status == 201, r
    sid = json.loads(r[0].body)["id"]
    try:
        assert json.loads(r[0].body)["project"] == "proj-a"
        ids = {"id": sid, "eid": "ex-none", "tid": "t-none", "sid": "sh-none", "name": "python", "job": "xproj",
               "port": "8000", "node": "n1", "project": "proj-b"}
        bodies = {(m, t): json.dumps(b).encode() for m, t, b in JSON_ROUTES}
        failures, count = [], 0
        for method, template in _authenticated_operations():
            if not template.startswith("/v1/sandboxes/{id}"):
                continue
            path = template.format(**ids)
            if "/files" in path or "/archive" in path:
                path += "?path=/tmp/xproj"
            body = bodies.get((method, template), b"x" if method == "PUT" else b"")
            resp = exchange(aedge.port, head(method, path, tok, body=body,
                                             extra=["Dsec-Project: proj-b"]), timeout=10)[0]
            count += 1
            r0 = resp[0] if resp else None
            if (not r0 or r0.status != 404 or
                    not json.loads(r0.body)["error"]["message"].startswith(f"sandbox {sid} ")):
                failures.append(f"{method} {template}: {r0}")
        assert count >= 25, count
        assert not failures, f"{len(failures)} reached another project's sandbox:\n" + \
            "\n".join(failures[:20])

        # B's list and job operation leave it alone; A's see it.
        def listed(project):
            r = exchange(aedge.port, head("GET", "/v1/sandboxes?label=job=xproj", tok,
                                          extra=[f"Dsec-Project: {project}"]))[0]
            return [x["id"] for x in json.loads(r[0].body)["sandboxes"]]
        assert listed("proj-b") == [] and listed("proj-a") == [sid]
        r = exchange(aedge.port, head("POST", "/v1/jobs/xproj/pause", tok,
                                      extra=["Dsec-Project: proj-b"]))[0]
        assert json.loads(r[0].body)["affected"] == 0, r
        rec = aclient.get(f"/v1/sandboxes/{sid}", expect=200).json
        assert rec["state"] == "running" and rec["labels"] == {"job": "xproj"}, rec
        assert aclient.sh(sid, "ls -A /tmp") == ""

        # A's snapshot is A's image: a create in B finds no such image; one in A does.
        def post(path, body, project):
            r = exchange(aedge.port, head("POST", path, tok, body=json.dumps(body).encode(),
                                          extra=[f"Dsec-Project: {project}"]))[0]
            return r[0].status, json.loads(r[0].body)
        st, out = post(f"/v1/sandboxes/{sid}/snapshot", {"image": "xproj-snap:1"}, "proj-a")
        assert st == 201, out
        st, out = post("/v1/sandboxes", {"image": "xproj-snap:1", "memory_mb": 64}, "proj-b")
        assert st == 404 and out["error"]["message"] == 'image "xproj-snap:1" not found', out
        st, out = post("/v1/sandboxes", {"image": "xproj-snap:1", "memory_mb": 64}, "proj-a")
        assert st == 201, out
        aclient.remove(out["id"])
    finally:
        aclient.remove(sid)
        aclient.delete("/v1/images/xproj-snap:1", expect=(204, 404))
