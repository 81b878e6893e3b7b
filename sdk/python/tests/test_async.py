"""SDK unit tests (fake server): AsyncDSecClient and its own HTTP/1.1 client —
pool bound and reuse, chunked decoding, retries with one request id,
incremental NDJSON streaming, timeouts, unix sockets, archives."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
import time

import pytest

from libdsec import (
    AsyncDSecClient,
    AsyncSandbox,
    DSecTimeoutError,
    ExecResult,
    ExecStatus,
    FnCallResult,
    InternalError,
    NotFoundError,
    SandboxSpec,
    UnavailableError,
)


def run(coro):
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def _aclosing(agen):
    """contextlib.aclosing, which Python 3.9 lacks."""
    try:
        yield agen
    finally:
        await agen.aclose()


def make(server, **kw):
    kw.setdefault("retries", 3)
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("timeout", 10)
    return AsyncDSecClient(server.url, **kw)


@pytest.mark.parametrize("chunked", [False, True])
def test_round_trip(server, edge, chunked):
    edge.chunked_json = chunked  # replies in 7-byte chunks: exercises the decoder

    async def main():
        async with make(server) as c:
            sb = await c.run_container(SandboxSpec(labels={"job": "j"}))
            assert isinstance(sb, AsyncSandbox) and sb.state == "running"
            assert (await c.get_sandbox(sb.id)).record == sb.record
            r = await sb.exec(["echo", "hi"])
            assert isinstance(r, ExecResult) and r.stdout == "hi\n"
            assert (await sb.exec(["bytes"], binary=True)).stdout == b"\x00\xff\xfe\n"
            assert [x["id"] for x in await c.list_sandboxes(labels={"job": "j"},
                                                            page_size=1)] == [sb.id]
            await sb.write_file("/w/a", b"\x00data")
            assert await sb.read_file("/w/a") == b"\x00data"
            assert [e.name for e in await sb.list_dir("/w")] == ["a"]
            await sb.run_shell("cd /r")
            assert (await sb.run_shell("pwd")).stdout == "/r\n"
            assert await sb.signal() == 3
            assert (await sb.pause())["state"] == "paused"
            assert await c.pause_job("j") == 1
            assert [i["name"] for i in await c.images()] == ["host"]
            async with await c.run_container() as sb2:
                assert sb2.id in edge.sandboxes
            assert sb2.id not in edge.sandboxes
            assert await c.delete_job("j") == 1
        return True

    assert run(main())
    assert len(edge.conns()) == 1  # all sequential calls on one keep-alive connection


def test_create_keywords_and_typed_exec_status(server, edge):
    async def main():
        async with make(server) as c:
            sb = await c.create(image="host", memory_mb=256, ttl_s=0, network={"mode": "open"},
                                labels={"job": "kw"})
            body = dict(edge.seen("POST", "/v1/sandboxes")[-1].json)
            body.pop("request_id")
            assert body == dict(SandboxSpec(memory_mb=256, ttl_s=0).to_body(),
                                network={"mode": "open"}, labels={"job": "kw"})
            assert isinstance(sb, AsyncSandbox) and sb.record["expires_at"] is None
            sbs = await c.create_many(2, SandboxSpec(labels={"job": "kw"}), pids=64)
            assert len(sbs) == 2 and edge.seen("POST", "/v1/sandboxes")[-1].json["pids"] == 64
            await c.run_containers(None, 2, disk_mb=64)
            assert edge.seen("POST", "/v1/sandboxes")[-1].json["disk_mb"] == 64
            await c.run_container(cpu=2)
            assert edge.seen("POST", "/v1/sandboxes")[-1].json["cpu"] == 2.0
            with pytest.warns(DeprecationWarning, match="use 'image'") as caught:
                await c.create(container_image="host")
            assert caught[0].filename == __file__
            with pytest.raises(TypeError, match="'memory'; did you mean 'memory_mb'"):
                await c.create(memory=256)
            eid = await sb.start_background(["sleep", "0.2"])
            st = await sb.exec_status(eid)
            assert isinstance(st, ExecStatus) and st.running and st.result is None
            r = await sb.wait_exec(eid, timeout_s=5)
            st = await sb.exec_status(eid)
            assert st.exited and st.result == r and st.exit_code == 0 and st.ok
            with pytest.warns(DeprecationWarning):
                assert st["result"]["exit_code"] == 0
            # A kill the process outlives for a moment: the final state, not a missing result.
            edge.kill_lag_s = 0.3
            eid = await sb.start_background(["sleep", "5"])
            killed = await sb.kill_exec(eid)
            assert killed.signal == 9 and (await sb.exec_status(eid)).exited
            edge.kill_lag_s = 0.0
            assert await c.delete_job("kw") == 3
        return True

    assert run(main())


def test_fncall_and_pools(server, edge):
    edge.fault("POST", "/v1/fncalls", "status", status=429, retry_after="0")

    async def main():
        async with make(server) as c:
            with pytest.raises(NotFoundError):
                await c.get_pool("python")
            created = await c.put_pool("python", runtime="python", min_idle=1)
            assert created["workers"]["idle"] == 1
            r = await c.run_fncall("python", "print(1)", stdin=b"\x00", files={"f": b"\x01"},
                                   timeout_ms=1000, filename="f.py")
            assert isinstance(r, FnCallResult) and r.stdout == "print(1)"
            assert (r.runtime, r.queue_ms, r.stderr) == ("python", 0.5, "\x00")
            assert [p["name"] for p in await c.list_pools()] == ["python"]
            assert (await c.get_pool("python"))["calls"] == 1
            await c.delete_pool("python")
            assert await c.list_pools() == []

    run(main())
    posts = edge.seen("POST", "/v1/fncalls")
    assert len(posts) == 2 and posts[0].request_id == posts[1].request_id  # 429, then retried
    assert posts[1].json["files"] == {"f": {"base64": "AQ=="}}
    assert posts[1].json["stdin_encoding"] == "base64" and posts[1].json["filename"] == "f.py"


def test_error_mapping(server, edge):
    edge.fault("GET", "/v1/node", "status", status=500, raw_body=b"oops")

    async def main():
        async with make(server) as c:
            with pytest.raises(InternalError) as ei:
                await c.node()
            assert (ei.value.code, ei.value.status, ei.value.message) == ("internal", 500, "oops")
            with pytest.raises(NotFoundError) as ei:
                await c.get_sandbox("sb-x")
            assert ei.value.message == "sandbox sb-x not found"

    run(main())


def test_retry_503_same_request_id(server, edge):
    sb = edge.add_sandbox()
    edge.fault("POST", f"/v1/sandboxes/{sb['id']}/exec", "status", status=503, times=2)
    edge.fault("PUT", f"/v1/sandboxes/{sb['id']}/files", "status", status=503)

    async def main():
        async with make(server) as c:
            s = c.sandbox(sb["id"])
            assert (await s.exec(["echo", "x"])).stdout == "x\n"
            await s.write_file("/a", "b")

    run(main())
    posts = edge.seen("POST", f"/v1/sandboxes/{sb['id']}/exec")
    assert len(posts) == 3 and len({p.request_id for p in posts}) == 1 and posts[0].request_id
    assert edge.exec_count == 1
    puts = edge.seen("PUT")
    assert len(puts) == 2 and puts[0].headers["idempotency-key"] == \
        puts[1].headers["idempotency-key"]


def test_retry_after_honoured(server, edge):
    edge.fault("GET", "/v1/images", "status", status=429, retry_after="1")

    async def main():
        async with make(server) as c:
            t0 = time.monotonic()
            await c.images()
            return time.monotonic() - t0

    assert run(main()) >= 1.0
    assert len(edge.seen("GET", "/v1/images")) == 2


def test_dropped_connections(server, edge):
    sb = edge.add_sandbox()
    edge.fault("POST", f"/v1/sandboxes/{sb['id']}/exec", "drop_after")
    edge.fault("GET", "/v1/images", "drop", times=2)
    edge.fault("DELETE", f"/v1/sandboxes/{sb['id']}", "drop_after", forget=True)

    async def main():
        async with make(server) as c:
            s = c.sandbox(sb["id"])
            assert (await s.exec(["echo", "once"])).stdout == "once\n"
            assert await c.images()
            await s.stop()  # 404 on the retry: already deleted
            with pytest.raises(NotFoundError):
                await s.stop()  # 404 on a first attempt is an error

    run(main())
    posts = edge.seen("POST", f"/v1/sandboxes/{sb['id']}/exec")
    assert len(posts) == 2 and posts[0].request_id == posts[1].request_id
    assert edge.exec_count == 1
    assert len(edge.seen("GET", "/v1/images")) == 3
    assert len(edge.seen("DELETE")) == 3


def test_connection_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main():
        async with AsyncDSecClient(f"http://127.0.0.1:{port}", retries=1,
                                   backoff_base=0.01) as c:
            with pytest.raises(UnavailableError) as ei:
                await c.health()
            assert ei.value.status is None and "2 attempt" in ei.value.message

    run(main())


def test_stale_connection_resent_without_retries(server, edge):
    async def main():
        async with make(server, retries=0) as c:
            await c.health()
            edge.fault("POST", "/v1/sandboxes", "drop")
            await c.run_container()
            edge.fault("GET", "/v1/health", "close_after")
            await c.health()
            await asyncio.sleep(0.05)  # let the loop see the server's FIN
            await c.health()

    run(main())
    posts = edge.seen("POST", "/v1/sandboxes")
    assert len(posts) == 2 and posts[0].request_id == posts[1].request_id
    assert len(edge.sandboxes) == 1
    h = edge.seen("GET", "/v1/health")
    assert h[-1].conn != h[-2].conn


def test_stream_is_incremental(server, edge):
    sb = edge.add_sandbox()

    async def main():
        async with make(server) as c:
            s = c.sandbox(sb["id"])
            events = s.exec_stream(["stream", "4"])
            first = await events.__anext__()
            assert (first.kind, first.data) == ("stdout", "line0\n")
            assert edge.stream_progress[0] == "send0" and "send1" not in edge.stream_progress
            edge.stream_gate.set()
            rest = [ev async for ev in events]
            assert [e.kind for e in rest] == ["stderr", "stdout", "stderr", "exit"]
            assert rest[-1].result.stdout == "line0\nline2\n"
            assert rest[-1].result.stderr == "line1\nline3\n"
            await c.health()  # reuses the stream's connection

    run(main())
    assert "gate-timeout" not in edge.stream_progress
    assert len(edge.conns()) == 1


def test_stream_early_close_and_error_line(server, edge):
    sb = edge.add_sandbox()

    async def main():
        async with make(server) as c:
            s = c.sandbox(sb["id"])
            async with _aclosing(s.exec_stream(["stream", "4"])) as events:
                async for ev in events:
                    assert ev.data == "line0\n"
                    break
            edge.stream_gate.set()
            await c.health()
            with pytest.raises(InternalError):
                async for _ in s.exec_stream(["stream-error"]):
                    pass
            evs = [e async for e in s.exec_stream(["stream", "2"], binary=True)]
            assert evs[0].data == b"line0\n" and evs[-1].result.stdout == b"line0\n"

    run(main())
    stream_conn = edge.seen("POST")[0].conn
    assert edge.seen("GET", "/v1/health")[0].conn != stream_conn


def test_pool_bounds_concurrency(server, edge):
    edge.slow_s = 0.1

    async def main():
        async with make(server, max_connections=8) as c:
            results = await asyncio.gather(*(c.node() for _ in range(50)))
            assert all(r["node"] == "fake" for r in results)

    t0 = time.monotonic()
    run(main())
    elapsed = time.monotonic() - t0
    assert len(edge.seen("GET", "/v1/node")) == 50
    assert edge.max_active == 8  # the bound was reached and never exceeded
    assert len(edge.conns()) == 8  # and the connections were reused
    assert elapsed >= 50 / 8 * 0.1 * 0.9


def test_default_pool_serves_50_concurrent_calls(server, edge):
    # Each call is answered only once all 50 are in progress at the edge: under the default
    # bound of 64 they run side by side (a client that serialized them would get 500s).
    edge.node_barrier = threading.Barrier(50, timeout=30)

    async def main():
        async with make(server, retries=0, timeout=40) as c:
            assert c._t.max_connections == 64
            results = await asyncio.gather(*(c.node() for _ in range(50)))
            assert all(r["node"] == "fake" for r in results)

    run(main())
    assert edge.max_active == 50 and len(edge.conns()) == 50


def test_timeout_not_retried(server, edge):
    edge.slow_s = 1.0

    async def main():
        async with make(server, timeout=0.2) as c:
            with pytest.raises(DSecTimeoutError):
                await c.node()

    run(main())
    assert len(edge.seen("GET", "/v1/node")) == 1


def test_unix_socket(unix_server):
    async def main():
        async with AsyncDSecClient(unix_server.url) as c:
            assert await c.health() == {"ok": True}
            sb = await c.run_container()
            assert (await sb.exec("echo u")).stdout == "echo u\n"
            await sb.stop()

    run(main())
    assert len(unix_server.edge.conns()) == 1
    assert unix_server.edge.seen()[-1].headers["host"] == "localhost"


def test_upload_download_round_trip(server, edge, tmpdir_clean):
    src, dst = tmpdir_clean / "src", tmpdir_clean / "dst"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.sh").write_bytes(b"echo\n")
    os.chmod(src / "d" / "x.sh", 0o750)
    os.symlink("d/x.sh", src / "ln")
    sb = edge.add_sandbox()

    async def main():
        async with make(server) as c:
            s = c.sandbox(sb["id"])
            await s.upload_dir(src, "/w")
            edge.archives[(sb["id"], "/back")] = edge.archives[(sb["id"], "/w")]
            assert await s.download_dir("/back", dst) == []

    run(main())
    assert (dst / "d" / "x.sh").read_bytes() == b"echo\n"
    assert stat.S_IMODE(os.stat(dst / "d" / "x.sh").st_mode) == 0o750
    assert os.readlink(dst / "ln") == "d/x.sh"
