"""Image archives are spooled to disk by the edge's HTTP layer (an unlinked file in
<state>/spool), never held in its memory: a 256 MB import barely moves the edge's peak RSS;
cut, oversized or chunked uploads leave nothing behind and the edge keeps serving."""

import io
import os
import socket
import tarfile
import time

from edge_harness import peak_rss_kb, wait_until

MB = 1 << 20
OCTET = {"Content-Type": "application/octet-stream"}


def open_fds(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def rootfs_tar(blob_bytes):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        d = tarfile.TarInfo("srv")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        t.addfile(d)
        i = tarfile.TarInfo("srv/blob")
        i.size = blob_bytes
        t.addfile(i, io.BytesIO(os.urandom(blob_bytes)))
    return buf.getvalue()


def spooled(edge):
    """Spool files the edge holds open (deleted O_TMPFILE files under <state>/spool)."""
    spool = str(edge.state_dir / "spool")
    return [p for p in open_fds(edge.pid) if p.startswith(spool)]


def test_big_import_is_spooled_not_buffered(make_edge):
    """A 256 MB archive imports while the edge's peak RSS grows by far less than the body, and
    the spool directory stays empty (the body never had a name)."""
    edge = make_edge()
    c = edge.client(timeout=300)
    body = rootfs_tar(256 * MB)
    before = peak_rss_kb(edge.pid)
    img = c.post("/v1/images/import?name=it-spool:1", body, headers=OCTET, expect=201).json
    grew_mb = (peak_rss_kb(edge.pid) - before) / 1024
    assert grew_mb < 96, f"edge peak RSS grew {grew_mb:.0f} MB for a 256 MB import"
    assert img["name"] == "it-spool:1"
    assert os.listdir(edge.state_dir / "spool") == []
    assert spooled(edge) == []
    sb = c.create({"image": ["host", "it-spool:1"]})
    try:
        assert c.sh(sb["id"], "stat -c %s /srv/blob") == f"{256 * MB}\n"
    finally:
        c.remove(sb["id"])
    c.delete("/v1/images/it-spool:1", expect=204)


def raw_request(edge, head, body_parts, pause=0.0):
    """Sends a raw HTTP request over the edge's TCP port; returns the response bytes (or b''
    if the edge closed without answering)."""
    s = socket.create_connection(("127.0.0.1", edge.port), timeout=30)
    try:
        s.sendall(head)
        for p in body_parts:
            s.sendall(p)
            if pause:
                time.sleep(pause)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    except (BrokenPipeError, ConnectionResetError):
        return b""
    finally:
        s.close()


def start_slow_uploads(edge, head, n):
    """Opens n connections that each send `head` and 1,000 body bytes, then stall; waits until
    the edge is receiving all n into spool files. Returns the sockets (the caller closes them)."""
    slow = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", edge.port), timeout=30)
        s.sendall(head + b"\0" * 1000)
        slow.append(s)
    wait_until(lambda: len(spooled(edge)) == n, 10, what=f"{n} uploads being received")
    return slow


def test_cut_oversized_and_chunked_uploads_leave_nothing(make_edge):
    """An upload cut after 8 MB of a declared 64 MB, a chunked upload past max_import_bytes
    (413 once the limit is crossed) and a chunked upload that fits (imported) all end with no
    spool file held and the edge serving."""
    edge = make_edge(config={"max_import_bytes": 32 * MB})
    c = edge.client(timeout=120)
    auth = f"Authorization: Bearer {c.token}\r\n".encode()
    # Declared 64 MB: over the limit, refused before any body byte is read.
    head = (b"POST /v1/images/import?name=it-cut:1 HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % (64 * MB))
    assert b" 413 " in raw_request(edge, head, [])[:64]
    # Declared 16 MB, 8 MB sent, then the client goes away.
    head = (b"POST /v1/images/import?name=it-cut:1 HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % (16 * MB))
    raw_request(edge, head, [b"\0" * (8 * MB)])
    wait_until(lambda: spooled(edge) == [], 10, what="the cut upload's spool file closed")
    # Chunked, past the limit: 413.
    head = (b"POST /v1/images/import?name=it-big:1 HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % MB + b"\0" * MB + b"\r\n"
    out = raw_request(edge, head, [chunk] * 40 + [b"0\r\n\r\n"])
    assert out == b"" or b" 413 " in out[:64], out[:200]
    wait_until(lambda: spooled(edge) == [], 10, what="the refused upload's spool file closed")
    # Chunked, within the limit: imported.
    tar = rootfs_tar(4 * MB)
    parts = [b"%x\r\n" % len(tar[i:i + 100000]) + tar[i:i + 100000] + b"\r\n"
             for i in range(0, len(tar), 100000)]
    head = (b"POST /v1/images/import?name=it-chunked:1 HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n")
    out = raw_request(edge, head, parts + [b"0\r\n\r\n"])
    assert b" 201 " in out[:64], out[:300]
    names = {i["name"] for i in c.get("/v1/images", expect=200).json["images"]}
    assert "it-chunked:1" in names and "it-cut:1" not in names and "it-big:1" not in names
    assert os.listdir(edge.state_dir / "spool") == []
    assert spooled(edge) == []
    c.delete("/v1/images/it-chunked:1", expect=204)


def test_at_most_four_uploads_are_received_at_once(make_edge):
    """Four slow uploads in progress hold the spool slots: a fifth import is 429 with
    Retry-After before its body is read; once one of them ends, imports are taken again."""
    edge = make_edge()
    c = edge.client(timeout=60)
    auth = f"Authorization: Bearer {c.token}\r\n".encode()
    head = (b"POST /v1/images/import?name=it-slow:1 HTTP/1.1\r\nHost: x\r\n" + auth +
            b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % MB)
    slow = start_slow_uploads(edge, head, 4)
    try:
        r = c.post("/v1/images/import?name=it-fifth:1", rootfs_tar(4096), headers=OCTET,
                   expect=429)
        assert r.json["error"]["code"] == "over_capacity"
        assert r.headers.get("retry-after") == "5"
        slow.pop().close()
        wait_until(lambda: len(spooled(edge)) == 3, 10, what="the closed upload's slot freed")
        c.post("/v1/images/import?name=it-fifth:1", rootfs_tar(4096), headers=OCTET, expect=201)
    finally:
        for s in slow:
            s.close()
    wait_until(lambda: spooled(edge) == [], 10, what="every slot freed")
    c.delete("/v1/images/it-fifth:1", expect=204)
