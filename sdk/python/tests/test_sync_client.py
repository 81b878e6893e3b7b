"""SDK unit tests (fake server): DSecClient / Sandbox / Shell methods —
request shapes, response decoding, streaming, shells, files and archives."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import warnings

import pytest

from libdsec import (
    BadRequestError,
    DSecError,
    DSecTimeoutError,
    ExecResult,
    ExecStatus,
    FnCallResult,
    NotFoundError,
    OverCapacityError,
    Sandbox,
    SandboxSpec,
    TooLargeError,
    UnsafeArchiveError,
)


ROUND_TRIP_FIELDS = dict(memory_mb=256, cpu=2, ttl_s=300, labels={"job": "rollout-7"},
                         network={"mode": "none"}, env={"K": "V"}, workdir="/repo")
ROUND_TRIP_BODY = {"kind": "container", "image": "host", "cpu": 2.0, "memory_mb": 256,
                   "pids": 256, "disk_mb": 256, "ttl_s": 300, "idle_ttl_s": 0,
                   "workdir": "/repo", "env": {"K": "V"}, "labels": {"job": "rollout-7"},
                   "network": {"mode": "none"}}


def created_body(edge) -> dict:
    body = dict(edge.seen("POST", "/v1/sandboxes")[-1].json)
    assert len(body.pop("request_id")) == 32
    return body


def test_run_container_round_trip(client, edge):
    sb = client.run_container(SandboxSpec(**ROUND_TRIP_FIELDS))
    assert created_body(edge) == ROUND_TRIP_BODY
    assert isinstance(sb, Sandbox) and sb.state == "running"
    assert sb.record["limits"]["memory_mb"] == 256 and sb.id.startswith("sb-fake-")
    assert client.get_sandbox(sb.id).record == sb.record
    assert client.sandbox(sb.id).refresh()["labels"] == {"job": "rollout-7"}


def test_create_takes_the_api_names_as_keywords(client, edge, sandbox):
    # The same request as a SandboxSpec with those fields, from every create method.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the API's names: no deprecation on the way
        sb = client.create(**ROUND_TRIP_FIELDS)
        assert created_body(edge) == ROUND_TRIP_BODY
        assert isinstance(sb, Sandbox) and sb.record["limits"]["cpu"] == 2.0
        assert sb.record["network"] == {"mode": "none"} and sb.record["workdir"] == "/repo"
        client.run_container(**ROUND_TRIP_FIELDS)
        assert created_body(edge) == ROUND_TRIP_BODY
        client.create(SandboxSpec(**ROUND_TRIP_FIELDS))
        assert created_body(edge) == ROUND_TRIP_BODY
        # The brief's example, and a microVM.
        client.create(image="host", memory_mb=256, network={"mode": "open"})
        assert created_body(edge) == dict(SandboxSpec(memory_mb=256).to_body(),
                                          network={"mode": "open"})
        sandbox.snapshot("vm:1")
        assert client.create(kind="microvm", image="vm:1").record["kind"] == "microvm"
        assert created_body(edge)["kind"] == "microvm"
        # Keywords with a spec override its fields; the spec stays as it was.
        spec = SandboxSpec(**ROUND_TRIP_FIELDS)
        client.create(spec, labels={"job": "r8"}, memory_mb=128)
        assert created_body(edge) == dict(ROUND_TRIP_BODY, labels={"job": "r8"}, memory_mb=128)
        assert spec == SandboxSpec(**ROUND_TRIP_FIELDS)
        sbs = client.create_many(2, image="host", labels={"job": "many"}, wait=False)
        assert len(sbs) == 2 and all(s["labels"] == {"job": "many"} for s in sbs)
        seen = edge.seen("POST", "/v1/sandboxes")[-1]
        assert seen.json["count"] == 2 and seen.query == [("wait", "0")]
        client.run_containers(None, 2, pids=64)
        assert created_body(edge) == dict(SandboxSpec(pids=64).to_body(), count=2)


def test_create_keywords_old_names_warn_unknown_ones_raise(client, edge):
    with pytest.warns(DeprecationWarning, match="'memory_limit_mb' is deprecated: use "
                                                "'memory_mb'") as caught:
        client.create(memory_limit_mb=256, cpu=2, ttl_s=300, labels={"job": "rollout-7"},
                      network_rules={"mode": "none"}, env={"K": "V"}, workdir="/repo")
    assert created_body(edge) == ROUND_TRIP_BODY
    assert len(caught) == 2 and {w.filename for w in caught} == {__file__}
    posts = len(edge.seen("POST", "/v1/sandboxes"))
    with pytest.raises(TypeError, match=r"create\(\) got an unexpected keyword argument "
                                        r"'memroy_mb'; did you mean 'memory_mb'\?"):
        client.create(image="host", memroy_mb=256)
    with pytest.raises(TypeError, match=r"create_many\(\) got an unexpected keyword argument "
                                        r"'label'; did you mean 'labels'\?"):
        client.create_many(2, label={"job": "x"})
    with pytest.raises(TypeError, match=r"run_container\(\) got an unexpected keyword "
                                        r"argument 'networks'; did you mean 'network'\?"):
        client.run_container(SandboxSpec(), networks={"mode": "open"})
    with pytest.raises(TypeError, match="both 'memory_mb' and its deprecated alias "
                                        "'memory_limit_mb'"):
        client.create(memory_mb=1, memory_limit_mb=2)
    assert len(edge.seen("POST", "/v1/sandboxes")) == posts  # nothing was sent


def test_ttl_s_zero_is_no_ttl(client, edge):
    sb = client.create(ttl_s=0, labels={"job": "forever"})
    assert created_body(edge)["ttl_s"] == 0
    assert sb.record["ttl_s"] == 0 and sb.record["expires_at"] is None
    sb2 = client.create()
    assert sb2.record["expires_at"] is not None
    rec = sb2.update(ttl_s=0)
    assert edge.seen("PATCH")[-1].json["ttl_s"] == 0
    assert rec["ttl_s"] == 0 and rec["expires_at"] is None and sb2.record is rec
    assert sb2.update(ttl_s=60)["expires_at"] is not None


def test_run_containers_count_and_wait_flag(client, edge):
    sbs = client.run_containers(SandboxSpec(), 3, wait=False)
    assert len(sbs) == 3 and len({s.id for s in sbs}) == 3
    seen = edge.seen("POST", "/v1/sandboxes")[0]
    assert seen.json["count"] == 3 and seen.query == [("wait", "0")]


def test_list_sandboxes_follows_cursor_and_filters(client, edge):
    for i in range(5):
        edge.add_sandbox({"labels": {"job": "a", "i": str(i)}})
    edge.add_sandbox({"labels": {"job": "b"}})
    recs = client.list_sandboxes(labels={"job": "a"}, state="running", page_size=2)
    assert sorted(r["labels"]["i"] for r in recs) == ["0", "1", "2", "3", "4"]
    gets = edge.seen("GET", "/v1/sandboxes")
    assert len(gets) == 3
    assert ("label", "job=a") in gets[0].query and ("limit", "2") in gets[0].query
    assert ("cursor", "2") in gets[1].query
    assert len(client.list_sandboxes()) == 6


def test_lifecycle_calls(client, edge, sandbox):
    assert sandbox.pause()["state"] == "paused" and sandbox.state == "paused"
    assert sandbox.resume()["state"] == "running"
    pause = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/pause")[0]
    assert pause.body == b"" and len(pause.headers["idempotency-key"]) == 32
    rec = sandbox.update(ttl_s=60, labels={"job": None, "x": "y"})
    assert rec["labels"] == {"x": "y"} and rec["ttl_s"] == 60
    patch = edge.seen("PATCH")[0].json
    assert patch["labels"] == {"job": None, "x": "y"} and "idle_ttl_s" not in patch
    assert sandbox.stats()["cpu_time_ms"] == 1.5
    assert sandbox.signal("TERM") == 3
    assert edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/signal")[0].json["signal"] == "TERM"


def test_jobs(client, edge):
    for _ in range(3):
        edge.add_sandbox({"labels": {"job": "r/7"}})
    assert client.pause_job("r/7") == 3
    assert all(r["state"] == "paused" for r in edge.sandboxes.values())
    assert client.resume_job("r/7") == 3
    assert client.delete_job("r/7") == 3 and not edge.sandboxes
    assert edge.seen("DELETE")[0].path == "/v1/jobs/r%2F7"


def test_node_images_health(client):
    assert client.health() == {"ok": True}
    assert client.node()["backends"] == ["container"]
    assert [i["name"] for i in client.images()] == ["host"]


def test_exec_variants(client, edge, sandbox):
    r = sandbox.exec(["echo", "a", "b"])
    assert isinstance(r, ExecResult) and r.stdout == "a b\n" and r.ok
    assert (r.duration_ms, r.stdout_bytes) == (2.5, 4)
    body = edge.seen("POST")[-1].json
    assert body["cmd"] == ["echo", "a", "b"] and body["timeout_ms"] == 30000
    assert body["max_output_bytes"] == 1 << 20 and body["encoding"] == "utf-8"
    assert "stdin" not in body and "shell" not in body

    assert sandbox.exec("echo hi | wc -c").stdout == "echo hi | wc -c\n"
    assert edge.seen("POST")[-1].json["shell"] == "echo hi | wc -c"

    assert sandbox.exec(["cat"], stdin="text in").stdout == "text in"
    assert sandbox.exec(["cat"], stdin=b"\xff\x00bin", binary=True).stdout == b"\xff\x00bin"
    assert edge.seen("POST")[-1].json["stdin_encoding"] == "base64"

    r = sandbox.exec(["bytes"], binary=True)
    assert r.stdout == b"\x00\xff\xfe\n" and r.stderr == b"\x80"
    assert sandbox.exec(["false"]).exit_code == 1 and not sandbox.exec(["false"]).ok

    r = sandbox.exec(["env"], env={"A": "1"}, cwd="/tmp", user="root", timeout_ms=0)
    assert r.stdout == '[{"A": "1"}, "/tmp", "root"]'

    # A grader exec says so; it runs as its own user, so a user with it is refused locally.
    sandbox.exec(["true"], grader=True)
    assert edge.seen("POST")[-1].json["grader"] is True
    assert "grader" not in (sandbox.exec(["true"]) and edge.seen("POST")[-1].json)
    with pytest.raises(ValueError):
        sandbox.exec(["true"], grader=True, user="root")


def test_exec_stream_is_incremental(client, edge, sandbox):
    events = sandbox.exec_stream(["stream", "4"])
    first = next(events)
    # The server is parked before sending line 2: we got line 1 on its own.
    assert (first.kind, first.data) == ("stdout", "line0\n")
    assert edge.stream_progress[0] == "send0" and "send1" not in edge.stream_progress
    edge.stream_gate.set()
    rest = list(events)
    assert [e.kind for e in rest] == ["stderr", "stdout", "stderr", "exit"]
    assert edge.stream_progress == ["send0", "waiting", "gate", "send1", "send2", "send3"]
    res = rest[-1].result
    assert res.stdout == "line0\nline2\n" and res.stderr == "line1\nline3\n" and res.ok
    seen = edge.seen("POST")[-1]
    assert seen.query == [("stream", "1")] and seen.request_id
    # The connection survived the stream and is reused.
    client.health()
    assert edge.seen()[-1].conn == seen.conn


def test_exec_stream_binary_and_error_line(client, edge, sandbox):
    edge.stream_gate.set()
    evs = list(sandbox.exec_stream(["stream", "2"], binary=True))
    assert evs[0].data == b"line0\n" and evs[-1].result.stderr == b"line1\n"
    with pytest.raises(DSecError) as ei:
        list(sandbox.exec_stream(["stream-error"]))
    assert (ei.value.code, ei.value.message) == ("internal", "agent died")


def test_exec_stream_early_close_drops_connection(client, edge, sandbox):
    events = sandbox.exec_stream(["stream", "4"])
    next(events)
    events.close()  # caller stops: the connection must go (the edge kills the command)
    edge.stream_gate.set()
    client.health()
    assert edge.seen()[-1].conn != edge.seen("POST")[-1].conn


def test_exec_stream_retries_503_before_start(client, edge, sandbox):
    edge.stream_gate.set()
    edge.fault("POST", f"/v1/sandboxes/{sandbox.id}/exec", "status", status=503)
    evs = list(sandbox.exec_stream(["stream", "2"]))
    assert evs[-1].kind == "exit"
    posts = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")
    assert len(posts) == 2 and posts[0].request_id == posts[1].request_id


def test_background_exec(client, edge, sandbox):
    eid = sandbox.start_background(["sleep", "0.3"])
    assert edge.seen("POST")[-1].json["background"] is True
    st = sandbox.exec_status(eid)
    assert isinstance(st, ExecStatus) and st.exec_id == eid
    assert st.state == "running" and st.running and st.result is None and st.exit_code is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # wait_exec reads the status by its attributes
        r = sandbox.wait_exec(eid, timeout_s=5)
    assert r.stderr == '["sleep", "0.3"]'
    st = sandbox.exec_status(eid)
    assert st.exited and st.result == r and st.exit_code == 0 and st.ok
    assert st.stderr == '["sleep", "0.3"]' and st.stdout == ""
    waits = [int(v) for s in edge.seen("GET") for k, v in s.query if k == "wait_ms"]
    assert waits and all(4000 <= w <= 5000 for w in waits)
    eid_b = sandbox.start_background(["bytes"], binary=True)
    st = sandbox.exec_status(eid_b, wait_ms=1000)
    assert st.stdout == b"\x00\xff\xfe\n" and st.result == sandbox.wait_exec(eid_b)
    eid2 = sandbox.start_background(["sleep", "5"])
    with pytest.raises(DSecTimeoutError):
        sandbox.wait_exec(eid2, timeout_s=0.2)
    killed = sandbox.kill_exec(eid2)  # answers once it is gone, with its result
    assert killed.signal == 9 and edge.seen("POST")[-1].path.endswith(f"/execs/{eid2}/kill")
    assert sandbox.exec_status(eid2).state == "exited"
    with pytest.warns(DeprecationWarning, match="ExecStatus"):
        assert sandbox.exec_status(eid2)["state"] == "exited"  # as a dict: still works
    with pytest.warns(DeprecationWarning):
        assert sandbox.exec_status(eid2)["result"]["signal"] == 9
    sandbox.forget_exec(eid2)
    with pytest.raises(NotFoundError):
        sandbox.exec_status(eid2)
    # A kill the process outlives for a moment: the edge answers `running`, and kill_exec
    # waits for the final state instead of failing on the missing result.
    edge.kill_lag_s = 0.3
    eid3 = sandbox.start_background(["sleep", "5"])
    killed = sandbox.kill_exec(eid3)
    assert killed.signal == 9 and sandbox.exec_status(eid3).state == "exited"
    edge.kill_lag_s = 0.0


def test_run_shell_keeps_one_session(client, edge, sandbox):
    assert sandbox.run_shell("pwd").stdout == "/workspace\n"
    sandbox.run_shell("cd /repo")
    assert sandbox.run_shell("pwd").stdout == "/repo\n"
    assert len(edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/shells")) == 1
    run = edge.seen("POST")[-1].json
    assert run["command"] == "pwd" and run["timeout_ms"] == 60000
    # The shell exits: the error surfaces once, then a new shell is opened.
    sandbox.run_shell("exit")
    with pytest.raises(NotFoundError):
        sandbox.run_shell("pwd")
    assert sandbox.run_shell("pwd").stdout == "/workspace\n"
    assert len(edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/shells")) == 2


def test_open_shell_object(client, edge, sandbox):
    with sandbox.open_shell() as sh:
        sh.run("cd /x")
        assert sh.run("pwd").stdout == "/x\n"
    assert edge.seen()[-1].method == "DELETE" and not edge.shells


def test_files(client, edge, sandbox):
    sandbox.write_file("/workspace/a.py", "print(2)", mode=0o600)
    put = edge.seen("PUT")[0]
    assert dict(put.query) == {"path": "/workspace/a.py", "mode": "0600"}
    assert put.headers["content-type"] == "application/octet-stream"
    assert sandbox.read_file("/workspace/a.py") == b"print(2)"
    with pytest.raises(TooLargeError):
        sandbox.read_file("/workspace/a.py", max_bytes=3)
    sandbox.mkdir("/workspace/d")
    assert dict(edge.seen("POST")[-1].query) == {"path": "/workspace/d", "mode": "0755"}
    entries = sandbox.list_dir("/workspace")
    assert [(e.name, e.type, e.mode) for e in entries] == [("a.py", "file", 0o600),
                                                           ("d", "dir", 0o755)]
    st = sandbox.stat("/workspace/a.py")
    assert st.is_file and st.size == 8
    sandbox.remove("/workspace", recursive=True)
    assert ("recursive", "1") in edge.seen("DELETE")[-1].query
    with pytest.raises(NotFoundError):
        sandbox.stat("/workspace/a.py")


def _make_tree(root):
    (root / "sub").mkdir()
    (root / "empty").mkdir()
    for name, mode, data in [("a.txt", 0o644, b"a"), ("run.sh", 0o755, b"#!/bin/sh\n"),
                             ("secret", 0o600, b"s"), ("sub/b.txt", 0o640, b"b" * 5000)]:
        (root / name).write_bytes(data)
        os.chmod(root / name, mode)
    os.symlink("sub/b.txt", root / "link")
    os.symlink("../a.txt", root / "sub" / "up")


def test_upload_download_round_trip(client, edge, sandbox, tmpdir_clean):
    src, dst = tmpdir_clean / "src", tmpdir_clean / "dst"
    src.mkdir()
    _make_tree(src)
    sandbox.upload_dir(src, "/workspace/proj")
    put = edge.seen("PUT", f"/v1/sandboxes/{sandbox.id}/archive")[0]
    assert dict(put.query) == {"path": "/workspace/proj"}
    assert put.headers["content-type"] == "application/x-tar"
    assert put.headers["idempotency-key"]
    with tarfile.open(fileobj=io.BytesIO(put.body)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["link"].issym() and members["link"].linkname == "sub/b.txt"
    assert members["run.sh"].mode == 0o755 and members["secret"].mode == 0o600
    assert members["sub/b.txt"].uid == 0 and members["empty"].isdir()

    # The fake serves back what it stored for the same path.
    edge.archives[(sandbox.id, "/workspace/out")] = put.body
    assert sandbox.download_dir("/workspace/out", dst) == []
    for name in ("a.txt", "run.sh", "secret", "sub/b.txt"):
        assert (dst / name).read_bytes() == (src / name).read_bytes()
        assert stat.S_IMODE(os.lstat(dst / name).st_mode) == \
            stat.S_IMODE(os.lstat(src / name).st_mode), name
    assert os.readlink(dst / "link") == "sub/b.txt" and os.readlink(dst / "sub/up") == "../a.txt"
    assert (dst / "link").read_bytes() == b"b" * 5000 and (dst / "empty").is_dir()


def _tar(*entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, target in entries:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = len(target)
                tar.addfile(info, io.BytesIO(target))
    return buf.getvalue()


@pytest.mark.parametrize("entries", [
    [("../escape.txt", "file", b"x")],
    [("abs", "sym", "/etc/passwd")],
    [("up", "sym", "../../outside")],
])
def test_download_refuses_unsafe_members(client, edge, sandbox, tmpdir_clean, entries):
    dst = tmpdir_clean / "dst"
    edge.archives[(sandbox.id, "/bad")] = _tar(("ok.txt", "file", b"fine"), *entries)
    with pytest.raises(UnsafeArchiveError) as ei:
        sandbox.download_dir("/bad", dst)
    assert ei.value.code == "unsafe_archive"
    assert not (tmpdir_clean / "escape.txt").exists()
    skipped = sandbox.download_dir("/bad", tmpdir_clean / "dst2", skip_unsafe=True)
    assert skipped == [entries[0][0]]
    assert (tmpdir_clean / "dst2" / "ok.txt").read_bytes() == b"fine"
    assert not (tmpdir_clean / "escape.txt").exists()


def test_sandbox_context_manager_deletes(client, edge):
    with client.run_container() as sb:
        sid = sb.id
        assert sid in edge.sandboxes
    assert sid not in edge.sandboxes
    with client.run_container() as sb:
        client.delete_sandbox(sb.id)  # already gone on exit: not an error


def test_fncall(client, edge):
    with pytest.raises(NotFoundError):  # no such runtime on this edge
        client.run_fncall("python", "print(1)")
    edge.put_pool("python", {"runtime": "python"})
    r = client.run_fncall("python", "print(1)")
    assert isinstance(r, FnCallResult) and isinstance(r, ExecResult) and r.ok
    assert (r.stdout, r.runtime, r.queue_ms) == ("print(1)", "python", 0.5)
    body = edge.seen("POST", "/v1/fncalls")[-1].json
    assert len(body.pop("request_id")) == 32
    assert body == {"runtime": "python", "code": "print(1)"}  # the rest: server defaults

    r = client.run_fncall("python", "exit 3", stdin="in", files={"a/in.txt": "text"},
                          timeout_ms=2000, memory_mb=128, max_output_bytes=100,
                          filename="main.py")
    assert r.exit_code == 3 and not r.ok and r.stderr == "in"
    body = edge.seen("POST", "/v1/fncalls")[-1].json
    assert body["files"] == {"a/in.txt": "text"} and body["filename"] == "main.py"
    assert (body["stdin"], body["timeout_ms"], body["memory_mb"], body["max_output_bytes"]) \
        == ("in", 2000, 128, 100)
    assert "stdin_encoding" not in body and "encoding" not in body

    # bytes travel base64-encoded: stdin, and files as {"base64": ...}
    blob = b"\x00\xff\n"
    r = client.run_fncall("python", "x", stdin=blob, files={"b.bin": blob, "t": "é"},
                          binary=True)
    assert r.stderr == blob and r.stdout == b"x"
    body = edge.seen("POST", "/v1/fncalls")[-1].json
    assert body["stdin_encoding"] == "base64" and body["encoding"] == "base64"
    assert body["files"] == {"b.bin": {"base64": "AP8K"}, "t": "é"}
    assert edge.fncalls[-1][2:] == (blob, {"b.bin": blob, "t": "é".encode()})

    with pytest.raises(TypeError):
        client.run_fncall("python", "x", files={"n": 1})
    with pytest.raises(BadRequestError):  # more than the pool allows
        client.run_fncall("python", "x", memory_mb=4096)


def test_fncall_429_is_retried_with_one_request_id(client, edge):
    edge.put_pool("bash", {"runtime": "bash"})
    edge.fault("POST", "/v1/fncalls", "status", status=429, retry_after="0", times=2)
    assert client.run_fncall("bash", "echo hi").stdout == "echo hi"
    posts = edge.seen("POST", "/v1/fncalls")
    assert len(posts) == 3 and len({p.request_id for p in posts}) == 1
    assert len(edge.fncalls) == 1
    edge.fault("POST", "/v1/fncalls", "status", status=429, retry_after="0", times=10)
    with pytest.raises(OverCapacityError) as ei:  # the client fixture retries 3 times
        client.run_fncall("bash", "echo hi")
    assert ei.value.status == 429 and len(edge.seen("POST", "/v1/fncalls")) == 3 + 4


def test_pools(client, edge):
    assert client.list_pools() == []
    with pytest.raises(NotFoundError):
        client.get_pool("py")
    p = client.put_pool("py", runtime="python", preload=["json", "re"], min_idle=1, max=4,
                        memory_mb=None)
    assert p["name"] == "py" and p["preload"] == ["json", "re"] and p["max"] == 4
    body = edge.seen("PUT", "/v1/pools/py")[-1].json
    assert body.pop("request_id")
    assert body == {"runtime": "python", "preload": ["json", "re"], "min_idle": 1, "max": 4}
    assert client.put_pool("py", max=8)["max"] == 8  # the rest is kept
    assert client.get_pool("py")["preload"] == ["json", "re"]
    web = client.put_pool("web", kind="container", min_idle=2, request_id="pool-web-1")
    assert web["kind"] == "container" and "taken" in web
    assert edge.seen("PUT", "/v1/pools/web")[-1].request_id == "pool-web-1"
    assert [x["name"] for x in client.list_pools()] == ["py", "web"]
    with pytest.raises(BadRequestError):
        client.put_pool("nope", min_idle=1)  # a new fncall pool needs a runtime
    client.delete_pool("py")
    with pytest.raises(NotFoundError):
        client.delete_pool("py")
    assert [x["name"] for x in client.list_pools()] == ["web"]


def test_delete_pool_404_on_retry_is_success(client, edge):
    edge.put_pool("gone", {"runtime": "bash"})
    edge.fault("DELETE", "/v1/pools/gone", "drop_after", forget=True)
    client.delete_pool("gone")
    assert "gone" not in edge.pools and len(edge.seen("DELETE", "/v1/pools/gone")) == 2


def test_request_ids_unique_per_call(client, edge, sandbox):
    # Same command twice: two calls, two ids, two runs (ids are per call).
    sandbox.exec(["echo"])
    sandbox.exec(["echo"])
    ids = {s.request_id for s in edge.seen("POST")}
    assert len(ids) == 2 and edge.exec_count == 2


def test_list_returns_sandboxes_like_get(client, edge):
    edge.add_sandbox({"labels": {"job": "z"}})
    (sb,) = client.list_sandboxes(labels={"job": "z"})
    got = client.get_sandbox(sb.id)
    assert type(sb) is type(got) and sb.record == got.record
    assert sb["labels"] == {"job": "z"} and sb.get("state") == "running" and sb.get("nope") is None


def test_delete_and_its_alias(client, edge, sandbox):
    sandbox.delete()
    assert edge.seen("DELETE", f"/v1/sandboxes/{sandbox.id}")
