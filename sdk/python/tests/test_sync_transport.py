"""SDK unit tests (fake server): the blocking transport — retries with one
request id, Retry-After, dropped connections, 404-on-retry deletes, error
mapping, keep-alive reuse, unix sockets, auth and timeouts."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fakeedge import Edge, FakeEdgeServer
from libdsec import (
    ConflictError,
    DSecClient,
    DSecError,
    DSecTimeoutError,
    InternalError,
    NotFoundError,
    OverCapacityError,
    UnauthorizedError,
    UnavailableError,
)


def test_error_body_maps_to_dsec_error(client, edge):
    with pytest.raises(NotFoundError) as ei:
        client.get_sandbox("sb-fake-nope")
    e = ei.value
    assert (e.code, e.status) == ("not_found", 404) and "sb-fake-nope" in e.message
    assert isinstance(e, DSecError)


def test_non_json_error_body_falls_back_on_status(client, edge):
    edge.fault("GET", "/v1/node", "status", status=500, raw_body=b"<h1>boom</h1>")
    with pytest.raises(InternalError) as ei:
        client.node()
    assert (ei.value.code, ei.value.status) == ("internal", 500)
    assert "boom" in ei.value.message
    # A 502 from a proxy is not retried (only 429/503 are) and maps to unavailable.
    edge.fault("GET", "/v1/node", "status", status=502, raw_body=b"bad gateway")
    with pytest.raises(UnavailableError) as ei:
        client.node()
    assert ei.value.status == 502
    assert len(edge.seen("GET", "/v1/node")) == 2


def test_503_then_success_reuses_request_id(client, edge, sandbox):
    edge.fault("POST", f"/v1/sandboxes/{sandbox.id}/exec", "status", status=503)
    r = sandbox.exec(["echo", "hi"])
    assert r.stdout == "hi\n" and r.ok
    posts = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")
    assert len(posts) == 2
    ids = {p.request_id for p in posts}
    assert len(ids) == 1 and None not in ids
    assert edge.exec_count == 1


def test_fresh_request_id_is_said_on_the_first_attempt_only(client, edge, sandbox):
    # A cluster's apiserver skips looking for an earlier attempt of an id the client made for
    # this call; a retry, or an id the caller chose, must not claim that.
    edge.fault("POST", f"/v1/sandboxes/{sandbox.id}/exec", "status", status=503)
    sandbox.exec(["echo", "hi"])
    posts = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")
    assert [p.headers.get("dsec-fresh-request-id") for p in posts] == ["1", None]
    sandbox.exec(["echo", "1"], request_id="mine-1")
    assert edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")[-1].headers.get(
        "dsec-fresh-request-id") is None
    sandbox.write_file("/workspace/b.txt", b"x")
    put = edge.seen("PUT", f"/v1/sandboxes/{sandbox.id}/files")[-1]
    assert put.headers.get("dsec-fresh-request-id") == "1"


def test_503_on_raw_put_reuses_idempotency_key(client, edge, sandbox):
    edge.fault("PUT", f"/v1/sandboxes/{sandbox.id}/files", "status", status=503, times=2)
    sandbox.write_file("/workspace/a.txt", b"data")
    puts = edge.seen("PUT", f"/v1/sandboxes/{sandbox.id}/files")
    assert len(puts) == 3
    keys = {p.headers.get("idempotency-key") for p in puts}
    assert len(keys) == 1 and None not in keys
    assert all(p.body == b"data" for p in puts)


def test_caller_request_id_is_used(client, edge, sandbox):
    sandbox.exec(["echo", "1"], request_id="my-id-1")
    sandbox.exec(["echo", "1"], request_id="my-id-1")  # replayed by the server
    assert edge.exec_count == 1
    assert [p.request_id for p in edge.seen("POST")] == ["my-id-1", "my-id-1"]
    with pytest.raises(ConflictError):
        sandbox.exec(["echo", "2"], request_id="my-id-1")


def test_429_retry_after_is_honoured(client, edge):
    edge.fault("GET", "/v1/node", "status", status=429, retry_after="1")
    t0 = time.monotonic()
    assert client.node()["node"] == "fake"
    assert time.monotonic() - t0 >= 1.0
    assert len(edge.seen("GET", "/v1/node")) == 2


def test_retry_after_is_capped(server, edge):
    with DSecClient(server.url, retries=2, backoff_base=0.01, retry_after_cap=0.2) as c:
        edge.fault("GET", "/v1/node", "status", status=429, retry_after="30")
        t0 = time.monotonic()
        c.node()
        assert time.monotonic() - t0 < 3


def test_retries_exhausted_raise_last_error(server, edge):
    with DSecClient(server.url, retries=2, backoff_base=0.01) as c:
        edge.fault("GET", "/v1/node", "status", status=429, retry_after="0", times=10)
        with pytest.raises(OverCapacityError) as ei:
            c.node()
        assert ei.value.status == 429 and ei.value.retry_after == 0.0
        assert len(edge.seen("GET", "/v1/node")) == 3


def test_retries_zero_disables(server, edge):
    with DSecClient(server.url, retries=0) as c:
        edge.fault("GET", "/v1/node", "status", status=503)
        with pytest.raises(UnavailableError):
            c.node()
        assert len(edge.seen("GET", "/v1/node")) == 1


def test_dropped_connection_after_work_is_replayed_not_rerun(client, edge, sandbox):
    # The server runs the command, then the connection dies before the reply:
    # the retry carries the same request_id and gets the recorded result.
    edge.fault("POST", f"/v1/sandboxes/{sandbox.id}/exec", "drop_after")
    r = sandbox.exec(["echo", "once"])
    assert r.stdout == "once\n"
    posts = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")
    assert len(posts) == 2 and posts[0].request_id == posts[1].request_id
    assert posts[0].conn != posts[1].conn
    assert edge.exec_count == 1


def test_dropped_before_reply_get_is_retried(client, edge):
    edge.fault("GET", "/v1/images", "drop", times=2)
    assert [i["name"] for i in client.images()] == ["host"]
    assert len(edge.seen("GET", "/v1/images")) == 3


def test_connection_refused_raises_unavailable():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with DSecClient(f"http://127.0.0.1:{port}", retries=2, backoff_base=0.01) as c:
        with pytest.raises(UnavailableError) as ei:
            c.health()
    assert ei.value.code == "unavailable" and ei.value.status is None
    assert "3 attempt" in ei.value.message


def test_delete_404_on_retry_is_success(client, edge, sandbox):
    # First attempt deletes, the reply is lost and the server kept no
    # idempotency record: the retry's 404 means "already gone".
    edge.fault("DELETE", f"/v1/sandboxes/{sandbox.id}", "drop_after", forget=True)
    client.delete_sandbox(sandbox.id)
    dels = edge.seen("DELETE", f"/v1/sandboxes/{sandbox.id}")
    assert len(dels) == 2
    assert dels[0].headers["idempotency-key"] == dels[1].headers["idempotency-key"]
    assert sandbox.id not in edge.sandboxes
    # ...but a 404 on the first attempt is a real error.
    with pytest.raises(NotFoundError):
        client.delete_sandbox(sandbox.id)


def test_keep_alive_reuses_one_connection(client, edge, sandbox):
    before = len(edge.conns())
    for i in range(5):
        sandbox.exec(["echo", str(i)])
    client.node()
    sandbox.read_file  # noqa: B018 - attribute access, no request
    conns = {s.conn for s in edge.seen()[-6:]}
    assert len(conns) == 1 and len(edge.conns()) == before


def test_idle_connection_closed_by_server_is_replaced(client, edge):
    edge.fault("GET", "/v1/health", "close_after")
    client.health()
    time.sleep(0.05)
    client.health()
    a, b = edge.seen("GET", "/v1/health")
    assert a.conn != b.conn


def test_stale_connection_resent_even_without_retries(server, edge):
    # The server drops a request that arrives on a reused connection without
    # replying (what an idle timeout racing a new request looks like). The
    # client re-sends once on a new connection, outside the retry budget.
    with DSecClient(server.url, retries=0) as c:
        c.health()
        edge.fault("POST", "/v1/sandboxes", "drop")
        sb = c.run_container()
        posts = edge.seen("POST", "/v1/sandboxes")
        assert len(posts) == 2 and posts[0].request_id == posts[1].request_id
        assert sb.id in edge.sandboxes and len(edge.sandboxes) == 1
        # A new connection that fails is not "stale": no free re-send.
        edge.fault("GET", "/v1/images", "drop")
        c.close()
        with pytest.raises(UnavailableError):
            c.images()


def test_threads_share_a_client_with_one_connection_each(client, edge, sandbox):
    errors = []

    def work(i):
        try:
            for j in range(5):
                assert sandbox.exec(["echo", f"{i}-{j}"]).stdout == f"{i}-{j}\n"
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    execs = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/exec")
    assert len(execs) == 40 and edge.exec_count == 40
    assert len({s.conn for s in execs}) <= 8


def test_timeout_is_not_retried(server, edge):
    edge.slow_s = 1.0
    with DSecClient(server.url, timeout=0.2, retries=3, backoff_base=0.01) as c:
        with pytest.raises(DSecTimeoutError) as ei:
            c.node()
    assert ei.value.code == "timeout"
    assert len(edge.seen("GET", "/v1/node")) == 1


def test_bearer_token(server, edge):
    edge.token = "s3cret"
    with DSecClient(server.url, token="s3cret") as c:
        assert c.node()["node"] == "fake"
    assert edge.seen()[-1].headers["authorization"] == "Bearer s3cret"
    with DSecClient(server.url) as c:
        assert c.health() == {"ok": True}  # health needs no token
        with pytest.raises(UnauthorizedError) as ei:
            c.node()
    assert ei.value.status == 401


def test_env_url_and_token(server, edge, monkeypatch):
    edge.token = "from-env"
    monkeypatch.setenv("DSEC_URL", server.url)
    monkeypatch.setenv("DSEC_TOKEN", "from-env")
    with DSecClient() as c:
        assert c.node()["node"] == "fake"


def test_unix_socket(unix_server):
    edge = unix_server.edge
    with DSecClient(unix_server.url) as c:
        assert c.health() == {"ok": True}
        sb = c.run_container()
        assert sb.exec(["echo", "unix"]).stdout == "unix\n"
        sb.stop()
    assert "authorization" not in edge.seen()[-1].headers
    assert edge.seen()[-1].headers["host"] == "localhost"
    assert len(edge.conns()) == 1
