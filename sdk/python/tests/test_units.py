"""SDK unit tests of the pure pieces (no server): argument mapping, result
decoding, the NDJSON decoder, URL parsing, retry delays, error mapping."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from libdsec import (
    DSecContainerRunArgs,
    DSecError,
    ExecResult,
    FileEntry,
    FnCallResult,
    NotFoundError,
    OverCapacityError,
)
from libdsec import _http, _ops
from libdsec.errors import GoneError, InternalError, UnavailableError, error_from_response


def test_run_args_map_to_wire_names_and_omit_none():
    body = DSecContainerRunArgs(
        container_image="py:3.11", cpu_cores_limit=2, memory_limit_mb=1024, pids_limit=64,
        disk_limit_mb=128, ttl_running_stop=300, idle_ttl_s=30, user="root",
        env={"A": "1"}, labels={"job": "r7"}, network_rules={"mode": "none"},
    ).to_body()
    assert body == {
        "kind": "container", "image": "py:3.11", "cpu": 2.0, "memory_mb": 1024, "pids": 64,
        "disk_mb": 128, "ttl_s": 300, "idle_ttl_s": 30, "user": "root", "env": {"A": "1"},
        "labels": {"job": "r7"}, "network": {"mode": "none"},
    }
    assert isinstance(body["cpu"], float)
    defaults = DSecContainerRunArgs().to_body()
    assert "user" not in defaults and "workdir" not in defaults and "network" not in defaults
    assert defaults["ttl_s"] == 3600 and defaults["disk_mb"] == 256


def test_exec_result_decodes_base64_and_ok():
    d = {"exit_code": 0, "stdout": base64.b64encode(b"\x00\xff").decode(), "stderr": "",
         "encoding": "base64", "duration_ms": 3, "stdout_bytes": 2, "queue_ms": 1}
    r = ExecResult.from_json(d)
    assert r.stdout == b"\x00\xff" and r.stderr == b"" and r.ok
    assert r.raw["queue_ms"] == 1
    assert ExecResult.from_json({"exit_code": 0, "timed_out": True}).ok is False
    assert ExecResult.from_json({"exit_code": 0, "stdout": "hi"}, binary=True).stdout == b"hi"
    assert ExecResult.from_json({"exit_code": 137, "signal": 9}).signal == 9


def test_file_entry():
    e = FileEntry.from_json({"name": "a", "type": "dir", "size": 3, "mode": 0o755, "mtime": 9})
    assert e.is_dir and not e.is_file and e.mode == 0o755


def test_exec_body_shell_vs_cmd_and_stdin_encoding():
    b = _ops.exec_body("echo hi", "", None, None, None, 1000, 10, False)
    assert b["shell"] == "echo hi" and "cmd" not in b and "stdin" not in b
    b = _ops.exec_body(["cat"], b"\xff\x00", {"K": "V"}, "/w", "root", 0, 10, True)
    assert b["cmd"] == ["cat"] and b["stdin_encoding"] == "base64"
    assert base64.b64decode(b["stdin"]) == b"\xff\x00"
    assert b["encoding"] == "base64" and b["env"] == {"K": "V"} and b["timeout_ms"] == 0
    b = _ops.exec_body(["cat"], "h\u00e9".encode(), None, None, None, 1, 1, False)
    assert b["stdin"] == "h\u00e9" and "stdin_encoding" not in b
    with pytest.raises(ValueError):
        _ops.exec_body([], "", None, None, None, 1, 1, False)


def test_request_id_placement():
    r = _http.json_request("POST", "/v1/sandboxes", {"a": 1})
    rid = json.loads(r.body)["request_id"]
    assert len(rid) == 32 and r.request_id == rid and "Idempotency-Key" not in r.headers
    r = _http.json_request("DELETE", "/v1/sandboxes/x", request_id="mine")
    assert r.headers["Idempotency-Key"] == "mine" and r.body is None
    r = _http.json_request("GET", "/v1/node", mutating=False)
    assert r.request_id is None and "Idempotency-Key" not in r.headers
    r = _http.raw_request("PUT", "/f", b"x", "application/octet-stream")
    assert r.headers["Idempotency-Key"] == r.request_id


def test_query_encoding_keeps_contract_shape():
    req = _ops.list_page(_ops.list_query({"job": "rollout-7"}, "running", None, 50, None))
    ep = _http.parse_url("http://h:1/base/")
    assert req.target(ep) == "/base/v1/sandboxes?label=job=rollout-7&state=running&limit=50"
    req = _ops.file_read("sb-1", "/w/a b&c.py", None)
    assert req.target(ep).endswith("files?path=/w/a%20b%26c.py")


def test_parse_url():
    ep = _http.parse_url("unix:///run/dsec/edge.sock")
    assert ep.unix_path == "/run/dsec/edge.sock" and ep.host_header == "localhost"
    ep = _http.parse_url("http://10.0.0.1:7070")
    assert (ep.host, ep.port, ep.unix_path, ep.host_header) == ("10.0.0.1", 7070, None,
                                                                "10.0.0.1:7070")
    assert _http.parse_url("https://api.example").port == 443
    with pytest.raises(ValueError):
        _http.parse_url("ftp://x")


def test_env_defaults(monkeypatch):
    ep, tok = _http.resolve_config(None, None)
    assert (ep.host, ep.port, tok) == ("127.0.0.1", 7070, None)
    monkeypatch.setenv("DSEC_URL", "unix:///tmp/e.sock")
    monkeypatch.setenv("DSEC_TOKEN", "t0k")
    ep, tok = _http.resolve_config(None, None)
    assert ep.unix_path == "/tmp/e.sock" and tok == "t0k"
    ep, tok = _http.resolve_config("http://x:1", "explicit")
    assert ep.host == "x" and tok == "explicit"


def test_retry_policy_backoff_bounds():
    p = _http.RetryPolicy(retries=6, backoff_base=0.1, backoff_cap=5.0, retry_after_cap=2.0)
    for attempt, (lo, hi) in enumerate([(0.05, 0.1), (0.1, 0.2), (0.2, 0.4), (0.4, 0.8)]):
        for _ in range(50):
            assert lo <= p.delay(attempt) <= hi
    assert all(2.5 <= p.delay(20) <= 5.0 for _ in range(50))
    assert 1.0 <= p.delay(0, retry_after=1.0) <= 1.1
    assert p.delay(0, retry_after=60) <= 2.1  # capped
    assert _http.parse_retry_after("3") == 3.0
    assert _http.parse_retry_after("garbage") is None
    assert 0 <= _http.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") <= 0.0


def test_error_mapping_and_pickling():
    e = error_from_response(404, b'{"error":{"code":"not_found","message":"sandbox x"}}')
    assert isinstance(e, NotFoundError) and (e.code, e.message, e.status) == (
        "not_found", "sandbox x", 404)
    e = error_from_response(429, b'{"error":{"code":"over_capacity","message":"full"}}', 2.0)
    assert isinstance(e, OverCapacityError) and e.retry_after == 2.0
    e = error_from_response(500, b"<html>oops</html>")
    assert isinstance(e, InternalError) and e.code == "internal" and "oops" in e.message
    e = error_from_response(502, b"")
    assert isinstance(e, UnavailableError) and e.code == "unavailable"
    e = error_from_response(418, b'{"error":{"code":"teapot","message":"m"}}')
    assert type(e) is DSecError and e.code == "teapot"
    back = pickle.loads(pickle.dumps(NotFoundError("not_found", "gone", 404)))
    assert isinstance(back, NotFoundError) and back.status == 404 and str(back) == \
        "not_found: gone (HTTP 404)"
    # 410 gone: a NotFoundError too, with the tombstone's reason and time; picklable.
    e = error_from_response(
        410, b'{"error":{"code":"gone","message":"expired","reason":"ttl","at":1765000000000}}')
    assert isinstance(e, GoneError) and isinstance(e, NotFoundError)
    assert (e.code, e.status, e.reason, e.at) == ("gone", 410, "ttl", 1765000000000)
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, GoneError) and (back.reason, back.at) == ("ttl", 1765000000000)
    e = error_from_response(410, b"")
    assert isinstance(e, GoneError) and e.reason is None and e.code == "gone"


def _ndjson(*objs) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def test_stream_decoder_reassembles_split_lines():
    dec = _ops.ExecStreamDecoder(binary=False)
    data = _ndjson({"stdout": "a\n"}, {"stderr": "e"}, {"stdout": "b"},
                   {"exit": {"exit_code": 3, "duration_ms": 1}})
    events = []
    for i in range(0, len(data), 3):
        events += dec.feed(data[i:i + 3])
    events += dec.close()
    assert [e.kind for e in events] == ["stdout", "stderr", "stdout", "exit"]
    assert events[-1].result.stdout == "a\nb" and events[-1].result.stderr == "e"
    assert events[-1].result.exit_code == 3


def test_stream_decoder_binary_error_and_truncation():
    dec = _ops.ExecStreamDecoder(binary=True)
    ev = dec.feed(_ndjson({"stdout": base64.b64encode(b"\xff").decode()}))
    assert ev[0].data == b"\xff"
    with pytest.raises(DSecError) as ei:
        dec.feed(_ndjson({"error": {"code": "internal", "message": "agent died"}}))
    assert ei.value.code == "internal" and ei.value.message == "agent died"
    dec = _ops.ExecStreamDecoder(binary=False)
    dec.feed(_ndjson({"stdout": "x"}))
    with pytest.raises(DSecError) as ei:
        dec.close()
    assert ei.value.code == "unavailable"


def test_fncall_body_omits_defaults_and_encodes_bytes():
    assert _ops.fncall_body("python", "x", None, None, None, None, None, None, False) == \
        {"runtime": "python", "code": "x"}
    body = _ops.fncall_body("bash", "cat", b"\xff", {"a": "t", "b": bytearray(b"\x00")},
                            1000, 64, 10, "s.sh", True)
    assert body == {"runtime": "bash", "code": "cat", "filename": "s.sh",
                    "stdin": "/w==", "stdin_encoding": "base64",
                    "files": {"a": "t", "b": {"base64": "AA=="}},
                    "timeout_ms": 1000, "memory_mb": 64, "max_output_bytes": 10,
                    "encoding": "base64"}
    with pytest.raises(TypeError):
        _ops.fncall_body("bash", "x", None, {"a": None}, None, None, None, None, False)


def test_fncall_result():
    r = FnCallResult.from_json({"exit_code": 0, "stdout": "aGk=", "encoding": "base64",
                                "runtime": "python", "queue_ms": 2})
    assert isinstance(r, ExecResult) and r.ok
    assert (r.stdout, r.runtime, r.queue_ms) == (b"hi", "python", 2.0)


def test_port_url():
    ep = _http.parse_url("http://edge:7070/prefix/")
    assert (_http.port_url(ep, "sb-1", 8000, "/index.html") ==
            "http://edge:7070/prefix/v1/sandboxes/sb-1/ports/8000/index.html")
    assert _http.port_url(_http.parse_url("unix:///run/e.sock"), "sb-1", 80) == \
        "unix:///run/e.sock:/v1/sandboxes/sb-1/ports/80/"
    for bad in (0, 70000, "80"):
        with pytest.raises(ValueError):
            _http.port_url(ep, "sb-1", bad)
