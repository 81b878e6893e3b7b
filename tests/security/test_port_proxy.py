"""The port proxy under attack from the server inside the sandbox (issue 35, holes 1 and 2).

A server in a sandbox controls the bytes of its responses and when it accepts. It must never
decide what happens to the client's connection to the edge (a reused connection would hand the
client's next API request, with its bearer token, to the sandbox, and take the sandbox's answer
as the edge's), never see more than the one request it was sent, and never hold the edge's
threads, the sandbox's lock or an unbounded share of the node's connections.
"""

import concurrent.futures
import http.client
import socket
import threading
import time

from edge_harness import wait_until
from sec_util import Neighbour

# Answers every request head it sees with a keep-alive response whose body is a forged record,
# on /smuggle followed by a second, unasked response in the same write; logs what it received.
EVIL = r"""
import socket, threading, sys
port = int(sys.argv[1])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(64)
FORGED = b'{"id": "sb-forged", "state": "running", "exit_code": 0, "stdout": "PASS"}'
def serve(c):
    buf = b""
    while True:
        try:
            d = c.recv(65536)
        except OSError:
            break
        if not d:
            break
        with open("/tmp/seen-%d" % port, "ab") as f:
            f.write(d)
        buf += d
        while b"\r\n\r\n" in buf:
            head, buf = buf.split(b"\r\n\r\n", 1)
            extra = b""
            if b" /smuggle" in head.split(b"\r\n")[0]:
                extra = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(FORGED)) + FORGED
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Connection: keep-alive\r\nKeep-Alive: timeout=60, max=100\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(FORGED) + FORGED + extra)
    c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def start_server(client, sid, script, port, *args):
    client.put(f"/v1/sandboxes/{sid}/files?path=/workspace/srv{port}.py", script.encode(),
               expect=204)
    client.exec(sid, f"python3 /workspace/srv{port}.py {port} {' '.join(args)} "
                     f">/tmp/srv{port}.log 2>&1 &")


def wait_listening(client, sid, port):
    probe = ("import socket,sys; s=socket.socket(); s.settimeout(1); "
             f"sys.exit(s.connect_ex(('127.0.0.1', {port})))")
    deadline = time.monotonic() + 20
    while client.exec(sid, cmd=["python3", "-c", probe])["exit_code"] != 0:
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)


def read_all(sock, limit_s=15):
    sock.settimeout(limit_s)
    out = b""
    while True:
        try:
            d = sock.recv(65536)
        except socket.timeout:
            return out, False  # still open
        if not d:
            return out, True
        out += d


def create_and_list_ms(client):
    """How long another user's create and list take now (the sandbox made is removed)."""
    t = time.monotonic()
    made = client.create()["id"]
    client.get("/v1/sandboxes", expect=200)
    ms = (time.monotonic() - t) * 1000
    client.remove(made)
    return ms


def test_a_keep_alive_response_never_gets_the_clients_next_request(edge, client, figure):
    """A server answering keep-alive (with a body shaped like an API record) gets one request per
    connection: a pooling client (http.client) sends its next API call, token and all, to the
    edge; two requests written at once get one proxied answer and a closed connection, and the
    sandbox never sees the second request or the token."""
    sid = client.create()["id"]
    other = client.create()["id"]
    try:
        start_server(client, sid, EVIL, 8100)
        wait_listening(client, sid, 8100)
        auth = {"Authorization": f"Bearer {edge.token}"}
        # A pooling client: one HTTPConnection for a proxied call, then an API call.
        conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=20)
        conn.request("GET", f"/v1/sandboxes/{sid}/ports/8100/first", headers=auth)
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200 and b"sb-forged" in body
        assert r.getheader("connection") == "close", r.getheaders()
        assert r.getheader("keep-alive") is None
        conn.request("GET", f"/v1/sandboxes/{other}", headers=auth)
        r2 = conn.getresponse()
        record = r2.read()
        conn.close()
        assert r2.status == 200 and b"sb-forged" not in record and other.encode() in record
        # Two requests in one write: the second is an API call with the token.
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=20)
        tok = f"Authorization: Bearer {edge.token}\r\n".encode()
        s.sendall(b"GET /v1/sandboxes/" + sid.encode() + b"/ports/8100/second HTTP/1.1\r\n"
                  b"Host: x\r\n" + tok + b"\r\n"
                  b"GET /v1/sandboxes/" + other.encode() + b" HTTP/1.1\r\nHost: x\r\n" + tok +
                  b"\r\n")
        out, closed = read_all(s)
        s.close()
        figure("responses to two pipelined requests", out.count(b"HTTP/1.1 "))
        assert closed, "the edge kept the proxied connection open"
        assert out.count(b"HTTP/1.1 ") == 1, out
        # Two requests with bodies: the first's Content-Length ends what the sandbox gets.
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=20)
        s.sendall(b"POST /v1/sandboxes/" + sid.encode() + b"/ports/8100/third HTTP/1.1\r\n"
                  b"Host: x\r\nContent-Length: 5\r\n" + tok + b"\r\nhello"
                  b"GET /v1/sandboxes/" + other.encode() + b"/fourth HTTP/1.1\r\nHost: x\r\n" +
                  tok + b"\r\n")
        out, closed = read_all(s)
        s.close()
        assert closed and out.count(b"HTTP/1.1 ") == 1, out
        # A chunked body: its last chunk ends it.
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=20)
        s.sendall(b"POST /v1/sandboxes/" + sid.encode() + b"/ports/8100/fifth HTTP/1.1\r\n"
                  b"Host: x\r\nTransfer-Encoding: chunked\r\n" + tok +
                  b"\r\n5\r\nhello\r\n0\r\n\r\n"
                  b"GET /v1/sandboxes/" + other.encode() + b"/sixth HTTP/1.1\r\nHost: x\r\n" +
                  tok + b"\r\n")
        out, closed = read_all(s)
        s.close()
        assert closed and out.count(b"HTTP/1.1 ") == 1, out
        seen = client.get(f"/v1/sandboxes/{sid}/files?path=/tmp/seen-8100", expect=200).body
        figure("requests the sandbox saw (4 proxied)", seen.count(b" HTTP/1.1\r\n"))
        assert edge.token.encode() not in seen and b"authorization" not in seen.lower()
        assert seen.count(b" HTTP/1.1\r\n") == 4, seen
        for leaked in (b"/fourth", b"/sixth", b"GET /v1/"):
            assert leaked not in seen, seen
        assert b"5\r\nhello\r\n0\r\n\r\n" in seen and b"\r\n\r\nhello" in seen
    finally:
        client.remove(sid)
        client.remove(other)


def test_a_second_response_in_the_same_write_is_never_relayed(edge, client, figure):
    """A server that writes a second, unasked response right behind the first (response
    splitting): the client gets exactly the first, framed by its Content-Length, and then the
    end of the connection."""
    sid = client.create()["id"]
    try:
        start_server(client, sid, EVIL, 8101)
        wait_listening(client, sid, 8101)
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=20)
        s.sendall(b"GET /v1/sandboxes/" + sid.encode() + b"/ports/8101/smuggle HTTP/1.1\r\n"
                  b"Host: x\r\nAuthorization: Bearer " + edge.token.encode() + b"\r\n\r\n")
        out, closed = read_all(s)
        s.close()
        head, _, body = out.partition(b"\r\n\r\n")
        figure("bytes past the first response", len(body) - int(
            [h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(
                b"content-length")][0]))
        assert closed and out.count(b"HTTP/1.1 ") == 1, out
        assert body.count(b"sb-forged") == 1
        assert b"connection: close" in head.lower() and b"keep-alive" not in head.lower()
    finally:
        client.remove(sid)


# Listens with a backlog of one and never accepts; a helper fills the backlog first, so every
# later connect's SYN is dropped (the kernel retries it for ~2 minutes).
NEVER_ACCEPTS = r"""
import socket, sys, time
port = int(sys.argv[1])
l = socket.socket(); l.bind(("127.0.0.1", port)); l.listen(0)
held = []
for _ in range(4):
    c = socket.socket(); c.setblocking(False)
    try:
        c.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    held.append(c)
open("/tmp/full", "w").write("full")
time.sleep(3600)
"""


def test_a_server_that_never_accepts_holds_no_worker_and_no_lock(make_edge, figure):
    """A server whose accept queue is full (listen(0), never accept): 48 proxy requests at once
    each get 504 gateway_timeout at the connect deadline, while the same sandbox's stats and
    PATCH, other users' creates and lists and a neighbour's execs answer at once."""
    e = make_edge(config={"port_proxy_connect_timeout_ms": 1500})
    c = e.client()
    sid = c.create()["id"]
    try:
        start_server(c, sid, NEVER_ACCEPTS, 8200)
        deadline = time.monotonic() + 20
        while c.exec(sid, cmd=["cat", "/tmp/full"])["stdout"] != "full":
            assert time.monotonic() < deadline, "the backlog was not filled"
            time.sleep(0.1)

        def proxied(_):
            t = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=60)
            conn.request("GET", f"/v1/sandboxes/{sid}/ports/8200/",
                         headers={"Authorization": f"Bearer {e.token}"})
            r = conn.getresponse()
            body = r.read()
            conn.close()
            return r.status, body, time.monotonic() - t

        other = e.client()
        with Neighbour(e) as n, concurrent.futures.ThreadPoolExecutor(48) as pool:
            futures = [pool.submit(proxied, i) for i in range(48)]
            time.sleep(0.3)  # every proxy request is waiting on its connect now
            t = time.monotonic()
            other.get(f"/v1/sandboxes/{sid}/stats", expect=200)
            other.patch(f"/v1/sandboxes/{sid}", {"labels": {"during": "attack"}}, expect=200)
            locked_ms = (time.monotonic() - t) * 1000
            others_ms = create_and_list_ms(other)
            results = [f.result(timeout=90) for f in futures]
            n.check(figure)
        figure("same sandbox stats+PATCH ms during the attack", round(locked_ms, 1))
        figure("create+list ms during the attack", round(others_ms, 1))
        figure("slowest 504 s", round(max(r[2] for r in results), 2))
        assert all(r[0] == 504 and b"gateway_timeout" in r[1] for r in results), results[:3]
        assert max(r[2] for r in results) < 15, [r[2] for r in results]
        assert locked_ms < 3000 and others_ms < 5000, (locked_ms, others_ms)
        other.close()
    finally:
        c.remove(sid)
        c.close()


# Accepts and never answers (the connections stay open).
NEVER_ANSWERS = r"""
import socket, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(256)
held = []
while True:
    held.append(l.accept()[0])
"""


def test_one_sandbox_holds_a_bounded_share_of_proxied_connections(make_edge, figure):
    """A sandbox whose server accepts and never answers can hold only
    port_proxy_max_conns_per_sandbox proxied connections (then 429 over_capacity at once);
    another sandbox's proxy keeps working, and the slots come back when the clients go."""
    e = make_edge(config={"port_proxy_max_conns_per_sandbox": 8})
    c = e.client()
    sid, good = c.create()["id"], c.create()["id"]
    socks = []
    try:
        start_server(c, sid, NEVER_ANSWERS, 8300)
        start_server(c, good, EVIL, 8301)
        wait_listening(c, sid, 8300)
        wait_listening(c, good, 8301)
        req = (b"GET /v1/sandboxes/" + sid.encode() + b"/ports/8300/ HTTP/1.1\r\nHost: x\r\n"
               b"Authorization: Bearer " + e.token.encode() + b"\r\n\r\n")
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", e.port), timeout=20)
            s.sendall(req)
            socks.append(s)
        time.sleep(0.5)

        def status_of(path):
            conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=20)
            conn.request("GET", path, headers={"Authorization": f"Bearer {e.token}"})
            r = conn.getresponse()
            body = r.read()
            conn.close()
            return r.status, body

        st, body = status_of(f"/v1/sandboxes/{sid}/ports/8300/")
        figure("ninth connection of one sandbox", st)
        assert st == 429 and b"over_capacity" in body, body
        assert status_of(f"/v1/sandboxes/{good}/ports/8301/x")[0] == 200
        for s in socks:
            s.close()
        socks.clear()
        # The relays see their clients go and let the slots go.
        deadline = time.monotonic() + 10
        while True:
            s = socket.create_connection(("127.0.0.1", e.port), timeout=20)
            s.sendall(req)
            s.settimeout(0.5)
            try:
                got = s.recv(100)
            except socket.timeout:
                got = b""  # waiting for the server: it got a slot
            s.close()
            if not got.startswith(b"HTTP/1.1 429"):
                break
            assert time.monotonic() < deadline, "the slots were not given back"
            time.sleep(0.2)
    finally:
        for s in socks:
            s.close()
        c.remove(sid)
        c.remove(good)
        c.close()


def test_a_sandbox_that_starves_its_agent_holds_a_bounded_share_of_workers(make_edge, figure):
    """The same review for the API's other calls into a sandbox: a 0.05-CPU sandbox whose own
    busy processes starve its agent (a file read then takes seconds) gets 64 reads at once;
    at most max_workers_per_sandbox (16) of the edge's 64 workers wait on it, the rest are 429
    at once, and other users' creates and lists and a neighbour's execs answer meanwhile."""
    e = make_edge()
    c = e.client()
    sid = c.create({"cpu": 0.05, "memory_mb": 256})["id"]
    try:
        c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/f", b"x" * 1000, expect=204)
        c.exec(sid, "for i in $(seq 40); do (while :; do :; done) & done")

        def one_read_s():
            t = time.monotonic()
            c.get(f"/v1/sandboxes/{sid}/files?path=/workspace/f", expect=None, validate=False)
            return time.monotonic() - t

        # The premise: its busy loops starve its agent (a read takes a while) before the 64 go.
        wait_until(lambda: one_read_s() > 0.2, 30, interval=0.2, what="the agent starved")

        def read(_):
            cc = e.client()
            t = time.monotonic()
            r = cc.get(f"/v1/sandboxes/{sid}/files?path=/workspace/f", expect=None,
                       validate=False)
            cc.close()
            return r.status, time.monotonic() - t

        other = e.client()
        with Neighbour(e) as n, concurrent.futures.ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(read, i) for i in range(64)]
            time.sleep(0.5)
            others_ms = create_and_list_ms(other)
            results = [f.result(timeout=300) for f in futures]
            n.check(figure)
        refused = sum(1 for s, _ in results if s == 429)
        slowest_ok = max((d for s, d in results if s == 200), default=0)
        figure("reads refused 429 (of 64)", refused)
        figure("slowest answered read s", round(slowest_ok, 2))
        figure("create+list ms meanwhile", round(others_ms, 1))
        assert all(s in (200, 429) for s, _ in results), results
        assert refused >= 64 - 16, results
        assert others_ms < 3000, others_ms
        other.close()
    finally:
        c.post(f"/v1/sandboxes/{sid}/signal", {"signal": "KILL"}, expect=200)
        c.remove(sid)
        c.close()
