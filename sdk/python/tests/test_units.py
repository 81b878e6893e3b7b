"""SDK unit tests of the pure pieces (no server): argument mapping, result
decoding, the NDJSON decoder, URL parsing, retry delays, error mapping."""

from __future__ import annotations

import base64
import json
import pickle
import warnings

import pytest

import libdsec
from libdsec import (
    DSecContainerRunArgs,
    DSecError,
    ExecResult,
    ExecStatus,
    FileEntry,
    FnCallResult,
    NotFoundError,
    OverCapacityError,
    SandboxSpec,
)
from libdsec import _http, _ops
from libdsec.errors import GoneError, InternalError, UnavailableError, error_from_response


# The body every spec below must give: to_body() of the same values never changes.
SPEC_BODY = {
    "kind": "container", "image": "py:3.11", "cpu": 2.0, "memory_mb": 1024, "pids": 64,
    "disk_mb": 128, "ttl_s": 300, "idle_ttl_s": 30, "user": "root", "env": {"A": "1"},
    "labels": {"job": "r7"}, "network": {"mode": "none"},
}
OLD_NAMES = {"container_image": "image", "cpu_cores_limit": "cpu", "memory_limit_mb": "memory_mb",
             "pids_limit": "pids", "disk_limit_mb": "disk_mb", "ttl_running_stop": "ttl_s",
             "network_rules": "network"}


def test_run_args_map_to_wire_names_and_omit_none():
    body = SandboxSpec(
        image="py:3.11", cpu=2, memory_mb=1024, pids=64, disk_mb=128, ttl_s=300,
        idle_ttl_s=30, user="root", env={"A": "1"}, labels={"job": "r7"},
        network={"mode": "none"},
    ).to_body()
    assert body == SPEC_BODY
    assert isinstance(body["cpu"], float)
    defaults = SandboxSpec().to_body()
    assert "user" not in defaults and "workdir" not in defaults and "network" not in defaults
    assert defaults == {"kind": "container", "image": "host", "cpu": 1.0, "memory_mb": 512,
                        "pids": 256, "disk_mb": 256, "ttl_s": 3600, "idle_ttl_s": 0}
    # The field order is the one DSecContainerRunArgs had: positional calls mean the same.
    assert SandboxSpec("py:3.11", 2, 1024, 64, 128, 300, 30, "root", None, {"A": "1"},
                       {"job": "r7"}, {"mode": "none"}).to_body() == SPEC_BODY
    assert SandboxSpec(kind="microvm", image="img:1").to_body()["kind"] == "microvm"


def test_old_names_are_deprecated_aliases_with_the_same_body():
    assert DSecContainerRunArgs is SandboxSpec
    assert "SandboxSpec" in libdsec.__all__ and "DSecContainerRunArgs" in libdsec.__all__
    with pytest.warns(DeprecationWarning) as caught:
        old = DSecContainerRunArgs(
            container_image="py:3.11", cpu_cores_limit=2, memory_limit_mb=1024, pids_limit=64,
            disk_limit_mb=128, ttl_running_stop=300, idle_ttl_s=30, user="root",
            env={"A": "1"}, labels={"job": "r7"}, network_rules={"mode": "none"},
        )
    assert old.to_body() == SPEC_BODY
    messages = [str(w.message) for w in caught]
    assert len(messages) == len(OLD_NAMES)
    for (name, new), message in zip(OLD_NAMES.items(), messages):
        assert f"{name!r} is deprecated: use {new!r}" in message
    assert {w.filename for w in caught} == {__file__}  # blamed on the caller's line
    # Attributes by the old names: read and written, each a warning naming the new name.
    for name, new in OLD_NAMES.items():
        with pytest.warns(DeprecationWarning, match=f"use {new!r}") as caught:
            assert getattr(old, name) == getattr(old, new)
        assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="use 'memory_mb'"):
        old.memory_limit_mb = 64
    assert old.memory_mb == 64 and old.to_body()["memory_mb"] == 64
    # Without warnings: the new names only.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SandboxSpec(**{new: getattr(old, new) for new in OLD_NAMES.values()}).image \
            == "py:3.11"


@pytest.mark.parametrize("old,new", sorted(OLD_NAMES.items()))
def test_old_and_new_name_together_is_a_type_error(old, new):
    value = SandboxSpec().to_body().get(new, {"mode": "none"})
    with pytest.raises(TypeError, match=f"both {new!r} and its deprecated alias {old!r}"):
        SandboxSpec(**{new: value, old: value})


def test_unknown_field_is_a_type_error_with_a_suggestion():
    with pytest.raises(TypeError, match=r"SandboxSpec\(\) got an unexpected keyword argument "
                                        r"'memroy_mb'; did you mean 'memory_mb'\?"):
        SandboxSpec(memroy_mb=256)
    with pytest.raises(TypeError, match="'networks'; did you mean 'network'"):
        SandboxSpec(networks={"mode": "open"})
    # Close to an old name: the suggestion is its new name.
    with pytest.raises(TypeError, match="'memory_limit'; did you mean 'memory_mb'"):
        SandboxSpec(memory_limit=256)
    with pytest.raises(TypeError, match="'ttl_runing_stop'; did you mean 'ttl_s'"):
        DSecContainerRunArgs(ttl_runing_stop=5)
    with pytest.raises(TypeError, match=r"'zzz' \(the fields: image, cpu, memory_mb, "):
        SandboxSpec(zzz=1)


def test_ttl_s_zero_means_no_ttl_and_is_sent():
    body = SandboxSpec(ttl_s=0, idle_ttl_s=0).to_body()
    assert body["ttl_s"] == 0 and body["idle_ttl_s"] == 0
    assert "ttl_s" not in SandboxSpec(ttl_s=None).to_body()  # None: the node's default


def test_a_subclass_with_its_own_init_keeps_working():
    # As bench/*.py's PoolArgs: old names through super().__init__ and as attributes.
    class PoolArgs(DSecContainerRunArgs):
        def __init__(self, pool, labels):
            super().__init__(labels=labels, ttl_running_stop=600)
            self.pool = pool

        def to_body(self):
            return {"pool": self.pool, "labels": dict(self.labels or {}),
                    "ttl_s": self.ttl_running_stop}

    with pytest.warns(DeprecationWarning) as caught:
        body = PoolArgs("web", {"job": "j"}).to_body()
    assert body == {"pool": "web", "labels": {"job": "j"}, "ttl_s": 600}
    assert len(caught) == 2 and {w.filename for w in caught} == {__file__}
    with pytest.warns(DeprecationWarning):
        pool_args = PoolArgs("web", {})
    spec = _ops.sandbox_spec(pool_args, {"labels": {"k": "v"}}, "create()")
    assert isinstance(spec, PoolArgs) and spec.pool == "web" and spec.labels == {"k": "v"}


def test_sandbox_spec_from_keywords():
    spec = SandboxSpec(image="a:1", labels={"job": "x"})
    assert _ops.sandbox_spec(None, {}, "create()") == SandboxSpec()
    assert _ops.sandbox_spec(spec, {}, "create()") is spec
    mixed = _ops.sandbox_spec(spec, {"memory_mb": 64, "labels": {"i": "1"}}, "create()")
    assert mixed == SandboxSpec(image="a:1", memory_mb=64, labels={"i": "1"})
    assert spec == SandboxSpec(image="a:1", labels={"job": "x"})  # not changed
    with pytest.raises(TypeError, match=r"create\(\) got an unexpected keyword argument "
                                        r"'imgae'; did you mean 'image'\?"):
        _ops.sandbox_spec(spec, {"imgae": "x"}, "create()")


def test_exec_result_decodes_base64_and_ok():
    d = {"exit_code": 0, "stdout": base64.b64encode(b"\x00\xff").decode(), "stderr": "",
         "encoding": "base64", "duration_ms": 3, "stdout_bytes": 2, "queue_ms": 1}
    r = ExecResult.from_json(d)
    assert r.stdout == b"\x00\xff" and r.stderr == b"" and r.ok
    assert r.raw["queue_ms"] == 1
    assert ExecResult.from_json({"exit_code": 0, "timed_out": True}).ok is False
    assert ExecResult.from_json({"exit_code": 0, "stdout": "hi"}, binary=True).stdout == b"hi"
    assert ExecResult.from_json({"exit_code": 137, "signal": 9}).signal == 9


def test_exec_status_is_typed_like_exec_result():
    running = ExecStatus.from_json({"exec_id": "ex-1", "state": "running", "started_at": 5,
                                    "result": None})
    assert running == ExecStatus("ex-1", "running", 5, None)
    assert running.running and not running.exited and not running.ok
    assert running.exit_code is None and running.stdout is None and running.stderr is None
    d = {"exec_id": "ex-2", "state": "exited", "started_at": 7,
         "result": {"exit_code": 3, "signal": None, "stdout": base64.b64encode(b"\xff").decode(),
                    "stderr": "", "encoding": "base64", "duration_ms": 2.5, "stdout_bytes": 1}}
    st = ExecStatus.from_json(d)
    assert st.exited and not st.running and st.started_at == 7
    assert st.result == ExecResult.from_json(d["result"])  # what exec() would have returned
    assert isinstance(st.result, ExecResult) and st.exit_code == 3 and not st.ok
    assert st.stdout == b"\xff" and st.stderr == b"" and st.raw == d
    assert ExecStatus.from_json(dict(d, result=dict(d["result"], exit_code=0))).ok


def test_exec_status_dict_access_still_works_deprecated():
    d = {"exec_id": "ex-2", "state": "exited", "started_at": 7,
         "result": {"exit_code": 0, "stdout": "hi\n", "stderr": ""}}
    st = ExecStatus.from_json(d)
    with pytest.warns(DeprecationWarning, match=r"exec_status\(\) returns an ExecStatus: "
                                                r"\['state'\] is deprecated") as caught:
        assert st["state"] == "exited"
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning):
        assert st["result"]["stdout"] == "hi\n"  # the JSON, as before
    with pytest.warns(DeprecationWarning):
        assert st.get("result")["exit_code"] == 0
    with pytest.warns(DeprecationWarning):
        assert st.get("nope", 1) == 1
    with pytest.warns(DeprecationWarning):
        assert "result" in st and "nope" not in st
    with pytest.warns(DeprecationWarning):
        assert dict(st) == d
    with pytest.warns(DeprecationWarning):
        assert dict(st.items()) == d and list(st.values()) == list(d.values())
    with pytest.raises(KeyError), pytest.warns(DeprecationWarning):
        st["nope"]


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


def test_quota_exceeded_carries_its_level_and_only_a_rate_is_retried():
    body = (b'{"error":{"code":"quota_exceeded","message":"quota exceeded at project/a",'
            b'"level":"project/a","quota":"cpu","limit":1.5,"usage":1.5,"asked":0.5}}')
    e = error_from_response(429, body)
    assert isinstance(e, libdsec.QuotaExceededError) and e.code == "quota_exceeded"
    assert (e.level, e.quota, e.limit, e.usage, e.asked) == ("project/a", "cpu", 1.5, 1.5, 0.5)
    policy = _http.RetryPolicy(5, 0.01, 0.05, 1.0)
    assert _http.status_retry_delay(policy, 429, {"dsec-quota-exceeded": "sandboxes"}, 0) is None
    assert _http.status_retry_delay(
        policy, 429, {"dsec-quota-exceeded": "creates_per_s", "retry-after": "1"}, 0) >= 1
    assert _http.status_retry_delay(policy, 429, {"retry-after": "1"}, 0) >= 1  # over_capacity
    assert _ops.quota_path("p") == "/v1/projects/p/quota"
    assert _ops.quota_path("p", token="t") == "/v1/projects/p/tokens/t/quota"
    assert _ops.quota_path(None, org=True) == "/v1/quota"
    with pytest.raises(ValueError):
        _ops.quota_path(None)
    with pytest.raises(ValueError):
        _ops.quota_patch("/v1/quota", {"sandbox": 1})
