"""The port proxy (issue 17): /v1/sandboxes/{id}/ports/{port}/{path...} reaches a server on the
sandbox's 127.0.0.1:port with the API's token, in network mode none (the edge connects from
inside the sandbox's namespace): a python3 -m http.server's files, a streamed upload echoed
back, a WebSocket echo through an upgrade, and clear errors (no token, nothing listening, a bad
port, an unknown sandbox)."""

import http.client
import time

import pytest

from edge_harness import UnixHTTPConnection, WebSocket

# A WebSocket echo server on the standard library: one connection at a time, text frames.
WS_ECHO = r"""
import base64, hashlib, socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 8765)); l.listen(4)
while True:
    c, _ = l.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        data += c.recv(4096)
    key = [h.split(b":", 1)[1].strip() for h in data.split(b"\r\n")
           if h.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    f = c.makefile("rb")
    while True:
        h = f.read(2)
        if len(h) < 2 or h[0] & 0xf == 8:
            break
        n = h[1] & 0x7f
        if n == 126:
            n = int.from_bytes(f.read(2), "big")
        mask = f.read(4)
        p = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        c.sendall(bytes([0x81, len(p)]) + p)
    c.close()
"""

# Echoes a POST body back, read as it arrives (chunked or not).
POST_ECHO = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                n = int(self.rfile.readline(), 16)
                body += self.rfile.read(n); self.rfile.readline()
                if n == 0: break
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        out = (self.path + " " + self.headers.get("Host", "") + " " +
               str("Authorization" in self.headers)).encode() + b"\n" + body
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
http.server.HTTPServer(("127.0.0.1", 8001), H).serve_forever()
"""


def raw(edge, method, path, body=None, headers=None):
    """A request through the proxy as any HTTP client sends it: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
    hdrs = {"Authorization": f"Bearer {edge.token}", **(headers or {})}
    conn.request(method, path, body=body, headers=hdrs)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def wait_port(edge, sid, port, deadline_s=15):
    deadline = time.monotonic() + deadline_s
    while True:
        status, _, body = raw(edge, "HEAD", f"/v1/sandboxes/{sid}/ports/{port}/")
        if status != 502:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def test_http_server_in_a_none_sandbox(client, sandbox, edge):
    client.sh(sandbox, "echo hello > /workspace/hi.txt")
    client.exec(sandbox, "cd /workspace && python3 -m http.server 8000 >/dev/null 2>&1 &")
    wait_port(edge, sandbox, 8000)
    status, _, body = raw(edge, "GET", f"/v1/sandboxes/{sandbox}/ports/8000/")
    assert status == 200 and b"hi.txt" in body, body
    status, headers, body = raw(edge, "GET", f"/v1/sandboxes/{sandbox}/ports/8000/hi.txt?x=1")
    assert status == 200 and body == b"hello\n", body
    # Over the root-only unix socket too (no token there).
    conn = UnixHTTPConnection(edge.socket, timeout=30)
    conn.request("GET", f"/v1/sandboxes/{sandbox}/ports/8000/hi.txt")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b"hello\n"
    conn.close()
    # Without the token: 401 from the edge, the sandbox never sees it.
    r = client.get(f"/v1/sandboxes/{sandbox}/ports/8000/hi.txt", token=False, validate=False)
    assert r.status == 401, r


def test_post_bodies_stream_both_ways(client, sandbox, edge):
    client.exec(sandbox, cmd=["sh", "-c", "python3 -c \"$0\" >/dev/null 2>&1 &", POST_ECHO])
    wait_port(edge, sandbox, 8001)
    body = b"x" * (3 << 20)
    status, _, got = raw(edge, "POST", f"/v1/sandboxes/{sandbox}/ports/8001/up/load?q=2", body,
                         {"Content-Type": "application/octet-stream"})
    assert status == 200, got[:200]
    first, rest = got.split(b"\n", 1)
    assert first == b"/up/load?q=2 localhost:8001 False"  # path kept, token not passed on
    assert rest == body
    # A chunked upload, straight through.
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
    conn.putrequest("POST", f"/v1/sandboxes/{sandbox}/ports/8001/c")
    conn.putheader("Authorization", f"Bearer {edge.token}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"abc", b"defg"):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read().endswith(b"\nabcdefg")
    conn.close()


def test_websocket_echo_through_the_proxy(client, sandbox, edge):
    client.exec(sandbox, cmd=["sh", "-c", "python3 -c \"$0\" >/dev/null 2>&1 &", WS_ECHO])
    deadline = time.monotonic() + 15
    while True:
        status, _, ws = WebSocket.connect("127.0.0.1", edge.port,
                                          f"/v1/sandboxes/{sandbox}/ports/8765/ws",
                                          token=edge.token)
        if status == 101:
            break
        assert status == 502 and time.monotonic() < deadline, status
        time.sleep(0.1)
    for msg in ("hello", "world" * 20):
        ws.send_text(msg)
        op, payload = ws.recv()
        assert payload.decode() == msg
    ws.close()


@pytest.mark.parametrize("path,status,says", [
    ("/ports/9/", 502, "nothing listens on port 9"),
    ("/ports/0/", 400, "port must be 1-65535"),
    ("/ports/http/", 400, "port must be 1-65535"),
])
def test_errors_are_clear(client, sandbox, path, status, says):
    r = client.get(f"/v1/sandboxes/{sandbox}{path}", validate=False)
    assert r.status == status and says in r.json["error"]["message"], r
    r = client.get("/v1/sandboxes/sb-nosuch/ports/80/", validate=False)
    assert r.status == 404, r


# Prints the request's path and its X-Forwarded-Prefix (what a server uses for absolute links).
PREFIX_ECHO = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        out = (self.path + " " + self.headers.get("X-Forwarded-Prefix", "-")).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8002), H).serve_forever()
"""


def plain_get(edge, path):
    """A GET with no token at all, as a browser sends it: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    out = (r.status, r.read())
    conn.close()
    return out


def test_signed_port_urls_need_no_token_and_expire(client, sandbox, edge):
    """A signed URL (POST .../port-urls) reaches the port without a token, for that port and
    sandbox only, until it expires; a forged, altered or other-port URL is 403; once the sandbox
    is gone it is 404. The server sees the URL's prefix in X-Forwarded-Prefix."""
    client.exec(sandbox, cmd=["sh", "-c", "python3 -c \"$0\" >/dev/null 2>&1 &", PREFIX_ECHO])
    wait_port(edge, sandbox, 8002)
    r = client.post(f"/v1/sandboxes/{sandbox}/port-urls", {"port": 8002, "ttl_s": 600},
                    expect=201).json
    path = r["path"]
    assert path.startswith(f"/v1/p/{sandbox}.8002.") and path.endswith("/"), r
    assert r["url"] == f"http://127.0.0.1:{edge.port}{path}" and r["port"] == 8002
    assert abs(r["expires_at"] / 1000 - (time.time() + 600)) < 30, r
    status, body = plain_get(edge, path + "a/b?c=1")
    assert status == 200 and body == f"/a/b?c=1 {path.rstrip('/')}".encode(), body
    # Altered: another port, another expiry, another MAC, another sandbox's id.
    sid_, port_, expires_, mac_ = path[len("/v1/p/"):-1].rsplit(".", 3)
    for bad in (f"{sid_}.8000.{expires_}.{mac_}", f"{sid_}.8002.{int(expires_) + 1}.{mac_}",
                f"{sid_}.8002.{expires_}.{'0' * 32}", f"{sid_}.8002.{expires_}.{mac_[:-1]}"):
        status, body = plain_get(edge, f"/v1/p/{bad}/")
        assert status == 403 and b"not valid" in body, (bad, body)
    status, body = plain_get(edge, f"/v1/p/sb-nosuch.8002.{expires_}.{mac_}/")
    assert status == 404, body
    # Expired (a 1 s URL, a moment later).
    short = client.post(f"/v1/sandboxes/{sandbox}/port-urls", {"port": 8002, "ttl_s": 1},
                        expect=201).json["path"]
    time.sleep(2.1)
    status, body = plain_get(edge, short)
    assert status == 403 and b"expired" in body, body
    # Bad requests.
    for body in ({}, {"port": 0}, {"port": 8002, "ttl_s": 0}, {"port": 8002, "nope": 1}):
        client.post(f"/v1/sandboxes/{sandbox}/port-urls", body, expect=400)
    # The sandbox gone: the URL goes with it.
    other = client.create({})
    p2 = client.post(f"/v1/sandboxes/{other['id']}/port-urls", {"port": 8002},
                     expect=201).json["path"]
    client.remove(other["id"])
    assert plain_get(edge, p2)[0] == 404


# Answers every GET with what the server saw: path, Host, X-Forwarded-Host, Cookie; a page with
# an absolute link; and sets a cookie of its own.
HOST_ECHO = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        h = self.headers
        out = " | ".join([self.path, h.get("Host", "-"), h.get("X-Forwarded-Host", "-"),
                          h.get("Cookie", "-"), h.get("Authorization", "-")]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.send_header("Set-Cookie", "app=1; Path=/")
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8003), H).serve_forever()
"""


def host_get(edge, host, path, headers=None):
    """A GET as a browser sends it to a port host (no token): (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
    conn.request("GET", path, headers={"Host": host, **(headers or {})})
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def test_host_based_port_urls_set_a_cookie_of_their_own_origin(make_edge):
    """With port_domain, a signed port URL's host_url is http://<port>-<id>.<domain>:N/ with a
    token in the query: its first visit is a 302 to the same URL without it that sets a host-only
    HttpOnly cookie; from then on any path of that host (absolute links) reaches the port with
    the cookie alone, and the server sees neither the token nor our cookie (its own cookies
    pass). Without a credential it is 401; a cookie of another port or sandbox, a forged or
    expired one is 403; a sandbox's server tossing a bad cookie of the same name does not lock
    the user out (any valid one is taken); the API token works too; the sandbox gone, 404."""
    edge = make_edge(config={"port_domain": "Sbx.Example.test"})
    c = edge.client()
    sid = c.create({})["id"]
    other = c.create({})["id"]
    c.exec(sid, cmd=["sh", "-c", "python3 -c \"$0\" >/dev/null 2>&1 &", HOST_ECHO])
    wait_port(edge, sid, 8003)
    r = c.post(f"/v1/sandboxes/{sid}/port-urls", {"port": 8003, "ttl_s": 600}, expect=201).json
    host = f"8003-{sid}.sbx.example.test"
    prefix = f"http://{host}:{edge.port}/?dsec_port_token="
    assert r["host_url"].startswith(prefix), r
    token = r["host_url"][len(prefix):]

    # First visit: the token traded for a cookie, the other query parameters kept.
    status, hdrs, _ = host_get(edge, host.upper(), f"/deep/x?a=1&dsec_port_token={token}&b=2")
    assert status == 302 and hdrs["location"] == "/deep/x?a=1&b=2", hdrs
    cookie = hdrs["set-cookie"]
    assert cookie.startswith(f"dsec_port={token};"), cookie
    for attr in ("Path=/", "HttpOnly", "SameSite=Lax", "Max-Age="):
        assert attr in cookie, cookie
    assert "Domain" not in cookie, cookie  # host-only: no other sandbox's origin gets it
    # The redirect never leaves the host.
    status, hdrs, _ = host_get(edge, host, f"//evil.test/x?dsec_port_token={token}")
    assert status == 302 and hdrs["location"] == "/evil.test/x", hdrs
    # Then: any absolute path of the host with the cookie; the server sees its own cookie only.
    status, hdrs, body = host_get(edge, f"{host}:{edge.port}", "/static/app.js?v=2",
                                  {"Cookie": f"app=1; dsec_port={token}"})
    assert status == 200, body
    path, h, fwd_host, cookies, auth = body.decode().split(" | ")
    assert (path, h, fwd_host, cookies, auth) == (
        "/static/app.js?v=2", "localhost:8003", f"{host}:{edge.port}", "app=1", "-"), body
    assert hdrs["set-cookie"] == "app=1; Path=/"
    # A tossed cookie of the same name before ours does not lock the user out.
    status, _, _ = host_get(edge, host, "/", {"Cookie": f"dsec_port=1.{'0' * 32}; dsec_port={token}"})
    assert status == 200

    # No credential: 401 saying what to do; forged, expired, other port or sandbox: 403.
    status, _, body = host_get(edge, host, "/")
    assert status == 401 and b"signed port URL" in body, body
    expires, mac = token.split(".")
    for bad_host, bad in ((host, f"{expires}.{'0' * 32}"), (host, f"{int(expires) + 1}.{mac}"),
                          (f"8004-{sid}.sbx.example.test", token),
                          (f"8003-{other}.sbx.example.test", token)):
        status, _, body = host_get(edge, bad_host, "/", {"Cookie": f"dsec_port={bad}"})
        assert status == 403 and b"not valid" in body, (bad_host, bad, body)
        status, _, body = host_get(edge, bad_host, f"/?dsec_port_token={bad}")
        assert status == 403, (bad_host, bad, body)
    short = c.post(f"/v1/sandboxes/{sid}/port-urls", {"port": 8003, "ttl_s": 1},
                   expect=201).json["host_url"]
    time.sleep(2.1)
    status, _, body = host_get(edge, host, "/" + short.split("/", 3)[3])
    assert status == 403 and b"expired" in body, body
    # The API token works on a port host too, and is not passed on.
    status, _, body = host_get(edge, host, "/t", {"Authorization": f"Bearer {edge.token}"})
    assert status == 200 and body.decode().split(" | ")[4] == "-", body
    # Hosts that are not port hosts stay the API's.
    assert host_get(edge, f"x-{sid}.sbx.example.test", "/v1/health")[0] == 200
    assert host_get(edge, "sbx.example.test", "/v1/health")[0] == 200
    # The sandbox gone: its host goes with it.
    c.remove(sid)
    assert host_get(edge, host, "/", {"Cookie": f"dsec_port={token}"})[0] == 404
    c.remove(other)


def test_host_urls_are_null_without_a_port_domain(client, sandbox):
    r = client.post(f"/v1/sandboxes/{sandbox}/port-urls", {"port": 8003}, expect=201).json
    assert r["host_url"] is None, r


# A CGI for busybox httpd: the sha256 of the POST body it was given (CRLF: the edge's parser
# takes no bare LF in a response head, and httpd passes the CGI's head on as it is).
SUM_CGI = b"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
head -c "$CONTENT_LENGTH" | sha256sum
"""


def test_microvm_ports_are_relayed_by_its_agent(client, edge):
    """A microVM's servers are reachable the same way, its agent relaying each connection
    (port_connect) with a window each way: a 3 MiB download and a 3 MiB upload cross it
    intact, in a VM without any network device; nothing listening is 502."""
    import hashlib
    import os
    from test_images import busybox_rootfs, import_image, need_busybox
    need_busybox()
    vm = client.get("/v1/node", expect=200).json["features"].get("microvm", {})
    if not vm.get("available"):
        pytest.skip(f"this edge has no microVMs: {vm.get('reason', 'not reported')}")
    big = os.urandom(3 << 20)
    extra = [(f"bin/{a}", "hardlink", "bin/busybox") for a in ("httpd",)]
    extra += [("www", "dir", None), ("www/big", "file", big), ("www/cgi-bin", "dir", None),
              ("www/cgi-bin/sum", "file", SUM_CGI, 0o755)]
    import_image(client, "it-vm-ports:1", busybox_rootfs(extra))
    sid = client.create({"kind": "microvm", "image": "it-vm-ports:1", "memory_mb": 160,
                         "disk_mb": 32})["id"]
    try:
        assert client.sh(sid, "ls /sys/class/net").split() == ["lo"]  # no NIC at all
        client.sh(sid, "httpd -p 127.0.0.1:8080 -h /www")  # (it daemonizes)
        wait_port(edge, sid, 8080)
        status, _, body = raw(edge, "GET", f"/v1/sandboxes/{sid}/ports/8080/big")
        assert status == 200 and body == big, (status, len(body))
        upload = os.urandom(3 << 20)
        status, _, body = raw(edge, "POST", f"/v1/sandboxes/{sid}/ports/8080/cgi-bin/sum",
                              body=upload, headers={"Content-Type": "application/octet-stream"})
        assert status == 200 and hashlib.sha256(upload).hexdigest() in body.decode(), body
        status, _, body = raw(edge, "GET", f"/v1/sandboxes/{sid}/ports/8080/nosuch")
        assert status == 404
        r = client.get(f"/v1/sandboxes/{sid}/ports/9/", validate=False)
        assert r.status == 502 and "nothing listens on port 9" in r.json["error"]["message"], r
        # Several at once, each on its own channel.
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: raw(edge, "GET", f"/v1/sandboxes/{sid}/ports/8080/big"),
                                range(4)))
        assert all(s == 200 and b == big for s, _, b in got)
    finally:
        client.remove(sid)
        client.delete("/v1/images/it-vm-ports:1", expect=(204, 404))
