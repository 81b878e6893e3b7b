"""Bounds a hostile caller or sandbox must not get past: metric label cardinality, the
connection cap, exec slots held by failed WebSocket upgrades, slow readers of streamed output,
partial PATCHes, failed sandboxes in memory admission."""

import os
import socket
import time

from edge_harness import wait_until


def edge_rss_kb(edge):
    with open(f"/proc/{edge.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def raw(edge, data, timeout=10):
    s = socket.create_connection(("127.0.0.1", edge.port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


def test_invented_methods_do_not_grow_metrics(edge, client):
    for i in range(50):
        reply = raw(edge, f"X{i:04d}METHOD /v1/nodes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 4"), reply[:80]
    text = client.get("/metrics", expect=200).body.decode()
    assert "METHOD" not in text
    assert 'method="other"' in text


def edge_side_connections(edge):
    """TCP connections on the edge's side of its port that the edge has not closed yet (any state
    but LISTEN), from /proc/net/tcp: the harness's own start-up probes count until then."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.split(":")[1], 16) == edge.port and state != "0A":
                n += 1
    return n


def test_connections_over_the_cap_are_refused_at_once(make_edge):
    edge = make_edge(config={"max_connections": 4})
    # Connections the edge has not yet seen close still count against the cap.
    wait_until(lambda: edge_side_connections(edge) == 0, 10, what="start-up connections closed")
    idle = [socket.create_connection(("127.0.0.1", edge.port), timeout=10) for _ in range(4)]
    try:
        for s in idle:
            s.sendall(b"GET /v1/hea")  # half a request line, never finished
        time.sleep(0.2)
        started = time.monotonic()
        reply = raw(edge, b"")  # a fifth connection that sends nothing
        assert reply.startswith(b"HTTP/1.1 503"), reply[:120]
        assert b"Retry-After: 1" in reply
        assert time.monotonic() - started < 5
    finally:
        for s in idle:
            s.close()
    # Once they are gone the edge serves again.
    c = edge.client()
    wait_until(lambda: c.get("/v1/health", token=False).status == 200, 10, what="edge serving")
    c.close()


def test_failed_attach_upgrades_do_not_hold_exec_slots(make_edge):
    edge = make_edge(config={"max_execs_per_sandbox": 3})
    c = edge.client()
    sid = c.create()["id"]
    for _ in range(6):
        # An upgrade request without Sec-WebSocket-Key: the handshake fails.
        req = (f"GET /v1/sandboxes/{sid}/attach?cmd=true HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {edge.token}\r\nConnection: Upgrade\r\n"
               f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
        reply = raw(edge, req, timeout=5)
        assert not reply.startswith(b"HTTP/1.1 101"), reply[:80]
    r = c.exec(sid, "echo still-runs")
    assert r["stdout"] == "still-runs\n"
    c.remove(sid)
    c.close()


def test_slow_stream_reader_is_dropped_and_its_command_killed(edge, client, sandbox):
    before = edge_rss_kb(edge)
    s = socket.create_connection(("127.0.0.1", edge.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = b'{"shell": "exec cat /dev/zero", "timeout_ms": 120000, "max_output_bytes": 268435456}'
    s.sendall((f"POST /v1/sandboxes/{sandbox}/exec?stream=1 HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {edge.token}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    try:
        # Never read: the edge must give up on us (and kill the command) instead of queueing
        # the sandbox's output without bound.
        wait_until(lambda: "cat /dev/zero" not in client.sh(sandbox, "ps -eo args"), 60,
                   interval=0.5, what="the unread stream's command killed")
        assert edge_rss_kb(edge) - before < 200 * 1024, "edge memory grew with the unread output"
    finally:
        s.close()


def test_refused_patch_changes_nothing(client, sandbox):
    before = client.get(f"/v1/sandboxes/{sandbox}", expect=200).json
    labels = {f"k{i}": "v" for i in range(70)}
    client.patch(f"/v1/sandboxes/{sandbox}", {"labels": labels, "ttl_s": 5}, expect=400)
    after = client.get(f"/v1/sandboxes/{sandbox}", expect=200).json
    assert after["labels"] == before["labels"]
    assert after["expires_at"] == before["expires_at"]
