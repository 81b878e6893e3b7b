"""libdsec (sdk/python) against a live edge: run_container, exec, run_shell, files,
upload_dir/download_dir, background execs, errors, retries (429 and a restarting edge) with
request ids, and the asyncio client."""

import asyncio
import os
import pathlib
import tempfile
import time
import threading

import pytest

libdsec = pytest.importorskip("libdsec")
from libdsec import (  # noqa: E402
    AsyncDSecClient, DSecClient, DSecContainerRunArgs, DSecError, GoneError, NotFoundError)

from edge_harness import wait_until  # noqa: E402


@pytest.fixture
def sdk(edge):
    c = DSecClient(edge.url, token=edge.token)
    yield c
    c.close()


def test_run_container_exec_shell_files(sdk):
    args = DSecContainerRunArgs(container_image="host", memory_limit_mb=128, cpu_cores_limit=1,
                                ttl_running_stop=300, network_rules={"mode": "none"},
                                labels={"via": "sdk"})
    with sdk.run_container(args) as sb:
        assert sb.state == "running" and sb.id.startswith("sb-it-")
        r = sb.exec(["python3", "-c", "print(1)"])
        assert r.exit_code == 0 and r.stdout == "1\n" and r.ok
        r = sb.exec("echo err >&2; exit 2")
        assert r.exit_code == 2 and r.stderr == "err\n" and not r.ok
        assert sb.run_shell("cd /tmp && export Z=1").exit_code == 0
        assert sb.run_shell('pwd; echo "$Z"').stdout == "/tmp\n1\n"
        sb.write_file("/workspace/pkg/a.py", b"print(2)")
        assert sb.read_file("/workspace/pkg/a.py") == b"print(2)"
        assert [e.name for e in sb.list_dir("/workspace/pkg")] == ["a.py"]
        assert sb.stat("/workspace/pkg/a.py").size == 8
        events = list(sb.exec_stream("echo a; echo b >&2"))
        assert events[-1].kind == "exit" and events[-1].result.exit_code == 0
        # Callbacks beside the iterator: output as it arrives, the whole result at the end.
        seen = []
        r = sb.exec("echo one; sleep 0.2; echo two >&2; echo three",
                    on_stdout=lambda d: seen.append(("out", d)),
                    on_stderr=lambda d: seen.append(("err", d)))
        assert r.exit_code == 0 and r.stdout == "one\nthree\n" and r.stderr == "two\n"
        assert "".join(d for k, d in seen if k == "out") == "one\nthree\n"
        assert ("err", "two\n") in seen and seen[0] == ("out", "one\n")
        # After update(ttl_s=...) the record shows it; list_sandboxes gives Sandbox objects.
        assert sb.update(ttl_s=900)["ttl_s"] == 900 and sb.record["ttl_s"] == 900
        (listed,) = [s for s in sdk.list_sandboxes(labels={"via": "sdk"}) if s.id == sb.id]
        assert type(listed) is type(sb) and listed["ttl_s"] == 900
        eid = sb.start_background(["sleep", "300"])
        # Killed once it runs (test_edge_exec.py::test_kill_right_after_start: agent race).
        wait_until(lambda: "sleep 300" in sb.exec("ps -eo args").stdout, 10, what="running")
        sb.kill_exec(eid)
        assert sb.wait_exec(eid, timeout_s=30).signal == 9
        assert sb.stats()["exec_count"] >= 4
        sb.pause()
        assert sb.refresh()["state"] == "paused"
        sb.resume()
        sid = sb.id
    with pytest.raises(DSecError) as ei:
        sdk.get_sandbox(sid)
    assert ei.value.code == "not_found" and ei.value.status == 404


def test_sdk_expired_sandbox_is_gone(edge):
    sdk = DSecClient(edge.url, edge.token)
    sb = sdk.run_container(DSecContainerRunArgs(memory_limit_mb=64, ttl_running_stop=1))
    sid, rec = sb.id, sb.record
    wait_until(lambda: edge.client().get(f"/v1/sandboxes/{sid}").status == 410, 15,
               interval=0.1, what="ttl expiry")
    with pytest.raises(GoneError) as ei:
        sdk.get_sandbox(sid)
    assert isinstance(ei.value, NotFoundError)  # what code written before 410 catches
    assert (ei.value.code, ei.value.status, ei.value.reason) == ("gone", 410, "ttl")
    assert ei.value.at >= rec["expires_at"]


@pytest.fixture
def tmp_path():
    """A temp dir removed afterwards (pytest's own keeps its last runs under /tmp)."""
    with tempfile.TemporaryDirectory(prefix="dsec-it-sdk-") as d:
        yield pathlib.Path(d)


def test_upload_and_download_dir(sdk, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "pkg" / "run.sh", 0o755)
    (src / "pkg" / "data.bin").write_bytes(bytes(range(256)))
    os.chmod(src / "pkg" / "data.bin", 0o600)
    os.symlink("run.sh", src / "pkg" / "link")
    with sdk.run_container(DSecContainerRunArgs(memory_limit_mb=128)) as sb:
        sb.upload_dir(src, "/workspace/up")
        assert sb.exec("/workspace/up/pkg/link").stdout == "hi\n"
        sb.exec("echo new > /workspace/up/pkg/made-inside")
        out = tmp_path / "out"
        sb.download_dir("/workspace/up", out)
    p = pathlib.Path(out) / "pkg"
    assert (p / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert os.stat(p / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(p / "data.bin").st_mode & 0o777 == 0o600
    assert (p / "data.bin").read_bytes() == bytes(range(256))
    assert os.readlink(p / "link") == "run.sh"
    assert (p / "made-inside").read_text() == "new\n"


def test_exec_request_id_never_runs_twice(sdk):
    with sdk.run_container(DSecContainerRunArgs(memory_limit_mb=64)) as sb:
        a = sb.exec("echo x >> /workspace/n; wc -l < /workspace/n", request_id="sdk-once")
        b = sb.exec("echo x >> /workspace/n; wc -l < /workspace/n", request_id="sdk-once")
        assert a.stdout == b.stdout == "1\n"
        with pytest.raises(DSecError) as ei:
            sb.exec("echo other", request_id="sdk-once")
        assert ei.value.code == "conflict"


def test_retry_on_429_until_room(make_edge):
    edge = make_edge(extra_args=["--max-sandboxes", "1"])
    c = DSecClient(edge.url, token=edge.token, retries=12, backoff_base=0.05, backoff_cap=0.5,
                   retry_after_cap=0.5)
    try:
        first = c.run_container(DSecContainerRunArgs(memory_limit_mb=32))
        no_retry = DSecClient(edge.url, token=edge.token, retries=0)
        with pytest.raises(DSecError) as ei:
            no_retry.run_container(DSecContainerRunArgs(memory_limit_mb=32))
        assert ei.value.code == "over_capacity" and ei.value.status == 429
        no_retry.close()
        # Free the slot once the SDK has been refused at least once more.
        raw = edge.client()

        def free():
            wait_until(lambda: 'reason="max_sandboxes"} 2' in raw.get("/metrics").body.decode()
                       or 'reason="max_sandboxes"} 3' in raw.get("/metrics").body.decode(),
                       30, what="a refused retry")
            first.stop()

        t = threading.Thread(target=free)
        t.start()
        second = c.run_container(DSecContainerRunArgs(memory_limit_mb=32))
        t.join(60)
        assert second.exec("echo ok").stdout == "ok\n"
        second.stop()
    finally:
        c.close()


def test_retry_across_edge_restart_runs_once(make_edge):
    edge = make_edge()
    c = DSecClient(edge.url, token=edge.token, retries=30, backoff_base=0.05, backoff_cap=0.5)
    try:
        sb = c.run_container(DSecContainerRunArgs(memory_limit_mb=64))
        edge.kill9()
        results = []
        # Connection refused until the edge is back; the SDK retries with one request id.
        t = threading.Thread(target=lambda: results.append(
            sb.exec("echo run >> /workspace/r.log; wc -l < /workspace/r.log")))
        t.start()
        edge.launch()  # from the main thread (the edge dies with the thread that started it)
        t.join(60)
        assert results and results[0].stdout == "1\n"
        assert sb.exec("wc -l < /workspace/r.log").stdout == "1\n"
        sb.stop()
    finally:
        c.close()


def test_async_client(edge):
    async def episode(client, i):
        async with await client.run_container(
                DSecContainerRunArgs(memory_limit_mb=64, labels={"job": "async-it"})) as sb:
            await sb.write_file("/workspace/i.txt", str(i).encode())
            r = await sb.run_shell("cat /workspace/i.txt")
            got = []

            async def on_out(d):
                got.append(d)

            e = await sb.exec("cat /workspace/i.txt", on_stdout=on_out)
            assert "".join(got) == e.stdout == r.stdout
            return r.stdout

    async def main():
        async with AsyncDSecClient(edge.url, token=edge.token, max_connections=8) as client:
            outs = await asyncio.gather(*(episode(client, i) for i in range(6)))
            assert sorted(outs) == [str(i) for i in range(6)]
            assert (await client.health())["ok"] is True

    asyncio.run(main())
    assert edge.client().get("/v1/sandboxes?label=job=async-it",
                             expect=200).json["sandboxes"] == []


def test_signed_port_urls_from_both_clients(edge):
    """Sandbox.signed_port_url (sync and async) asks POST .../port-urls: a URL that needs no
    token, for that port and sandbox (host_url is null on a node without a port_domain)."""
    import http.client
    import urllib.parse

    with DSecClient(edge.url, token=edge.token) as c:
        with c.run_container(DSecContainerRunArgs(memory_mb=64)) as sb:
            sb.run_shell("echo served > /tmp/s.txt; cd /tmp; "
                         "(python3 -m http.server 8000 >/dev/null 2>&1 &)")
            u = sb.signed_port_url(8000, ttl_s=60)
            assert u["port"] == 8000 and u["host_url"] is None, u
            assert u["path"].startswith(f"/v1/p/{sb.id}.8000."), u
            assert abs(u["expires_at"] / 1000 - (time.time() + 60)) < 30, u
            parsed = urllib.parse.urlparse(u["url"])
            deadline = time.monotonic() + 15
            while True:
                conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
                conn.request("GET", u["path"] + "s.txt")  # no token
                r = conn.getresponse()
                body = r.read()
                conn.close()
                if r.status != 502 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert (r.status, body) == (200, b"served\n")

            async def from_async():
                async with AsyncDSecClient(edge.url, token=edge.token) as ac:
                    return await (await ac.get_sandbox(sb.id)).signed_port_url(8000)
            a = asyncio.run(from_async())
            assert a["path"].startswith(f"/v1/p/{sb.id}.8000.") and a["path"] != u["path"], a
