"""The cluster, step 1 (issue 36): real etcd, real dsec-edges, real dsec-apiservers.

One shared cluster (3 edges, 2 apiservers) serves the tests that leave it as they found it;
the fault tests (an edge killed, an apiserver killed mid-create, etcd stopped) each get a
cluster of their own. Every cluster is stopped at the end and must leave nothing behind.
"""

import base64
import concurrent.futures
import http.client
import json
import os
import signal
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

import pytest

import cluster_harness
import edge_harness
from cluster_harness import Cluster, request
from edge_harness import WebSocket, wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
# The long tier (scripts/long-tier) scales the fault runs up: DSEC_CLUSTER_LONG=1.
LONG = os.environ.get("DSEC_CLUSTER_LONG") == "1"
sys.path.insert(0, str(REPO / "sdk" / "python"))
import libdsec  # noqa: E402


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    reason = cluster_harness.why_not_runnable()
    if reason:
        print(f"[  SKIPPED ] {reason}", file=sys.stderr)
        pytest.skip(reason)
    c = Cluster.start(tmp_path_factory.mktemp("shared"))
    try:
        yield c
    finally:
        cluster_harness.teardown(c)


def api(c, method, path, body=None, i=0, **kw):
    """A call through apiserver i; a JSON answer is checked against api/openapi.yaml (the
    apiserver serves the same contract as an edge)."""
    status, out = request(c.urls[i], method, path, body, token=c.token, **kw)
    if isinstance(out, (dict, list)) and "/ports/" not in path:  # the proxy is the server's
        edge_harness.spec().validate_response(method, path.split("?")[0], status, out,
                                              content_type="application/json")
    return status, out


def raw_get(url, path, host=None, cookie=None, full=False):
    """A GET with no token, as a browser sends it: (status, body) or (status, headers, body)."""
    hostport = url.split("//", 1)[1]
    conn = http.client.HTTPConnection(hostport, timeout=30)
    headers = {"Host": host} if host else {}
    if cookie:
        headers["Cookie"] = cookie
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out if full else (out[0], out[2])


def sdk(c, i=0, **kw):
    return libdsec.DSecClient(c.urls[i], token=c.token, **kw)


def node_of(sandbox_id):
    return sandbox_id[3:-13]


def create(c, i=0, expect=201, **body):
    body.setdefault("memory_mb", 128)
    status, out = api(c, "POST", "/v1/sandboxes", body, i=i)
    assert status == expect, (status, out)
    return out


def delete_all(c, ids):
    for sid in ids:
        status, out = api(c, "DELETE", f"/v1/sandboxes/{sid}")
        assert status in (204, 404), (status, out)


# ---- membership and placement ------------------------------------------------------------

def test_every_apiserver_sees_every_node(shared):
    for i in range(2):
        status, out = api(shared, "GET", "/v1/nodes", i=i)
        assert status == 200, out
        nodes = {n["node"]: n for n in out["nodes"]}
        assert set(nodes) == {"n1", "n2", "n3"}
        for n in nodes.values():
            assert n["state"] == "ready" and n["url"].startswith("http://127.0.0.1:")
            assert "container" in n["backends"] and n["capacity"]["max_sandboxes"] > 0
        status, one = api(shared, "GET", "/v1/nodes/n2", i=i)
        assert status == 200 and one["node"] == "n2"
    status, out = api(shared, "GET", "/v1/nodes/nope")
    assert status == 404 and out["error"]["code"] == "not_found"


def test_auth_is_the_cluster_token(shared):
    assert request(shared.urls[0], "GET", "/v1/nodes")[0] == 401
    assert request(shared.urls[0], "GET", "/v1/nodes", token="x" * 32)[0] == 401
    # The node token is for apiservers toward edges, not for callers of an apiserver.
    assert request(shared.urls[0], "GET", "/v1/nodes", token=shared.node_token)[0] == 401
    # Calls on sandboxes need it too (they are relayed only after the check).
    status, out = request(shared.urls[0], "GET", "/v1/sandboxes/sb-n1-aaaaaaaaaaaa")
    assert status == 401, out


def test_creates_spread_over_nodes_and_route_by_id(shared):
    ids = [create(shared, i=k % 2)["id"] for k in range(30)]
    try:
        per_node = {}
        for sid in ids:
            per_node[node_of(sid)] = per_node.get(node_of(sid), 0) + 1
        assert set(per_node) == {"n1", "n2", "n3"}, per_node
        # Each sandbox answers through either apiserver, from its own node.
        for k, sid in enumerate(ids[:6]):
            sb = sdk(shared, i=(k + 1) % 2).sandbox(sid)
            r = sb.exec(["sh", "-c", "echo $((6*7))"])
            assert r.exit_code == 0 and r.stdout == "42\n"
            status, rec = api(shared, "GET", f"/v1/sandboxes/{sid}", i=k % 2)
            assert status == 200 and rec["node"] == node_of(sid)
    finally:
        delete_all(shared, ids)


def test_count_spreads_all_or_nothing(shared):
    status, out = api(shared, "POST", "/v1/sandboxes",
                      {"count": 6, "memory_mb": 128, "labels": {"t": "count"}})
    assert status == 201, out
    ids = [s["id"] for s in out["sandboxes"]]
    try:
        assert len(ids) == 6 and len(set(ids)) == 6
        assert {node_of(s) for s in ids} == {"n1", "n2", "n3"}
    finally:
        delete_all(shared, ids)
    # One share that can never fit: nothing is left on the nodes that took theirs.
    status, out = api(shared, "POST", "/v1/sandboxes",
                      {"count": 3, "memory_mb": 128, "pids": 1 << 22, "labels": {"t": "aon"}})
    assert status in (422, 400), out
    status, listed = api(shared, "GET", "/v1/sandboxes?label=t=aon")
    assert status == 200 and listed["sandboxes"] == []


def test_placement_errors_say_why(shared):
    status, out = api(shared, "POST", "/v1/sandboxes", {"kind": "teapot"})
    assert status == 422 and "no node of the cluster serves kind \"teapot\"" in \
        out["error"]["message"], out
    status, out = api(shared, "POST", "/v1/sandboxes", {"memory_mb": 1 << 29})
    assert status == 422 and "can never fit any node" in out["error"]["message"], out
    status, out = api(shared, "POST", "/v1/sandboxes", "[1,2]")
    assert status == 400, out
    # A bad field is the node's to refuse, as it would be without the apiserver.
    status, out = api(shared, "POST", "/v1/sandboxes", {"memroy_mb": 1})
    assert status == 400 and "memroy_mb" in out["error"]["message"], out
    status, out = api(shared, "GET", "/v1/sandboxes/sb-n9-aaaaaaaaaaaa")
    assert status == 404 and "no node n9" in out["error"]["message"], out
    status, out = api(shared, "GET", "/v1/sandboxes/not..an-id")
    assert status == 400, out
    status, out = api(shared, "GET", "/v1/pools")
    assert status == 404 and "apiserver" in out["error"]["message"], out


def test_cordon_keeps_creates_away_and_drain_waits(shared):
    status, out = api(shared, "POST", "/v1/nodes/n1/cordon")
    assert status == 200 and out["state"] == "cordoned", out
    ids = []
    try:
        for i in range(12):
            ids.append(create(shared, i=i % 2)["id"])
        assert all(node_of(s) != "n1" for s in ids), ids
        # Both apiservers see the cordon (through etcd).
        wait_until(lambda: api(shared, "GET", "/v1/nodes/n1", i=1)[1]["state"] == "cordoned",
                   timeout=10)
    finally:
        status, out = api(shared, "POST", "/v1/nodes/n1/uncordon")
        assert status == 200 and out["state"] == "ready", out
        delete_all(shared, ids)
    # Drain: nothing new goes there, and it waits for the node's sandboxes to go.
    status, out = api(shared, "POST", "/v1/sandboxes", {"count": 3, "memory_mb": 128})
    assert status == 201
    ids = [s["id"] for s in out["sandboxes"]]
    on_n2 = [s for s in ids if node_of(s) == "n2"]
    assert on_n2
    try:
        status, out = api(shared, "POST", "/v1/nodes/n2/drain?timeout_s=0")
        assert status == 200 and out["state"] == "draining" and out["drained"] is False, out
        extra = create(shared)["id"]
        ids.append(extra)
        assert node_of(extra) != "n2"
        t = threading.Timer(1.0, lambda: delete_all(shared, on_n2))
        t.start()
        status, out = api(shared, "POST", "/v1/nodes/n2/drain?timeout_s=30", timeout=60)
        t.join()
        assert status == 200 and out["drained"] is True, out
    finally:
        api(shared, "POST", "/v1/nodes/n2/uncordon")
        delete_all(shared, ids)
        status, listed = api(shared, "GET", "/v1/sandboxes?limit=1000")
        delete_all(shared, [s["id"] for s in listed["sandboxes"]])


# ---- every endpoint shape through an apiserver -------------------------------------------

@pytest.fixture
def sb(shared):
    sid = create(shared, memory_mb=512, disk_mb=512)["id"]
    yield sdk(shared, i=1).sandbox(sid)
    delete_all(shared, [sid])


def test_exec_buffered_streamed_and_stdin(shared, sb):
    r = sb.exec(["cat"], stdin="from stdin")
    assert r.exit_code == 0 and r.stdout == "from stdin"
    events = list(sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done"]))
    out = "".join(e.data for e in events if e.kind == "stdout")
    assert out == "1\n2\n3\n", events
    assert events[-1].result is not None and events[-1].result.exit_code == 0, events


def test_websocket_attach_through_the_apiserver(shared, sb):
    u = urllib.parse.urlsplit(shared.urls[0])
    status, headers, ws = WebSocket.connect(u.hostname, u.port,
                                            f"/v1/sandboxes/{sb.id}/attach?cmd=cat",
                                            token=shared.token)
    assert status == 101, (status, headers, ws)
    try:
        ws.send_binary(b"over two hops\n")
        got = b""
        while b"\n" not in got:
            op, payload = ws.recv()
            assert op == 0x2, (op, payload)
            got += payload
        assert got == b"over two hops\n"
        ws.send_json({"eof": True})
        while True:
            op, payload = ws.recv()
            if op == 0x1 and "exit" in json.loads(payload):
                assert json.loads(payload)["exit"]["exit_code"] == 0
                break
    finally:
        ws.close()


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_100mib_up_and_down_without_the_apiserver_holding_it(shared, sb):
    pid = shared.apiserver_procs[1].pid
    before = rss_kb(pid)
    size = 100 << 20
    u = urllib.parse.urlsplit(shared.urls[1])
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.putrequest("PUT", f"/v1/sandboxes/{sb.id}/files?path=/tmp/big")
    conn.putheader("Authorization", f"Bearer {shared.token}")
    conn.putheader("Content-Type", "application/octet-stream")
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    block = bytes(range(256)) * 4096  # 1 MiB
    for _ in range(100):
        conn.send(block)
    resp = conn.getresponse()
    assert resp.status in (200, 201, 204), resp.read()[:300]
    resp.read()
    conn.close()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("GET", f"/v1/sandboxes/{sb.id}/files?path=/tmp/big&max_bytes={size}",
                 headers={"Authorization": f"Bearer {shared.token}"})
    resp = conn.getresponse()
    assert resp.status == 200
    got = 0
    while True:
        chunk = resp.read(1 << 20)
        if not chunk:
            break
        # The file is bytes 0..255 over and over: each byte is its offset mod 256.
        start = got % 256
        assert chunk == (block[start:] + block)[:len(chunk)], f"wrong bytes at offset {got}"
        got += len(chunk)
    conn.close()
    assert got == size
    grew = rss_kb(pid) - before
    assert grew < 32 << 10, f"the apiserver grew by {grew} KiB moving 100 MiB each way"


def test_archives_ports_pause_fork_snapshot(shared, sb, tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print('a')\n")
    sb.upload_dir(src, "/workspace/proj")
    assert sb.exec(["python3", "/workspace/proj/pkg/a.py"]).stdout == "a\n"
    out = tmp_path / "back"
    sb.download_dir("/workspace/proj", out)
    assert (out / "pkg" / "a.py").read_text() == "print('a')\n"

    # The port proxy, two hops: apiserver -> edge -> the server inside.
    sb.exec(["sh", "-c", "echo hello > /workspace/hi.txt; cd /workspace && "
             "python3 -m http.server 8000 >/dev/null 2>&1 &"])
    def served():
        s, body = api(shared, "GET", f"/v1/sandboxes/{sb.id}/ports/8000/hi.txt", i=1)
        return s == 200 and body == b"hello\n"
    wait_until(served, timeout=20)

    # Signed port URLs through an apiserver: the answer names the apiserver, and both forms are
    # relayed to the node without a token (the node checks them); without a credential, 401.
    status, u = api(shared, "POST", f"/v1/sandboxes/{sb.id}/port-urls", {"port": 8000}, i=1)
    assert status == 201 and u["url"] == shared.urls[1] + u["path"], u
    port1 = shared.urls[1].rsplit(":", 1)[1]
    host = f"8000-{sb.id}.{cluster_harness.PORT_DOMAIN}"
    assert u["host_url"].startswith(f"http://{host}:{port1}/?dsec_port_token="), u
    for i in (0, 1):
        s, body = raw_get(shared.urls[i], u["path"] + "hi.txt")
        assert (s, body) == (200, b"hello\n"), (s, body)
    token = u["host_url"].split("=", 1)[1]
    s, hdrs, _ = raw_get(shared.urls[0], f"/hi.txt?dsec_port_token={token}", host=host, full=True)
    assert s == 302 and hdrs["location"] == "/hi.txt" and "dsec_port=" in hdrs["set-cookie"], hdrs
    s, body = raw_get(shared.urls[0], "/hi.txt", host=host, cookie=f"dsec_port={token}")
    assert (s, body) == (200, b"hello\n"), (s, body)
    assert raw_get(shared.urls[0], "/hi.txt", host=host)[0] == 401
    assert raw_get(shared.urls[0], "/hi.txt", host=host,
                   cookie=f"dsec_port={token.split('.')[0]}.{'0' * 32}")[0] == 403
    # A port host of a sandbox the cluster does not know, and a forged signed path: 404 / 403.
    assert raw_get(shared.urls[0], "/", host=f"8000-sb-nosuch-aaaaaaaaaaaa."
                   f"{cluster_harness.PORT_DOMAIN}")[0] == 404
    assert raw_get(shared.urls[0], u["path"].rsplit(".", 1)[0] + "." + "0" * 32 + "/")[0] == 403

    assert api(shared, "POST", f"/v1/sandboxes/{sb.id}/pause")[0] == 200
    assert api(shared, "GET", f"/v1/sandboxes/{sb.id}")[1]["state"] == "paused"
    assert api(shared, "POST", f"/v1/sandboxes/{sb.id}/resume")[0] == 200
    assert sb.exec(["true"]).exit_code == 0

    forks = sb.fork(count=2)
    try:
        assert len(forks) == 2 and all(node_of(f.id) == node_of(sb.id) for f in forks)
        assert forks[0].exec(["cat", "/workspace/hi.txt"]).stdout == "hello\n"
    finally:
        delete_all(shared, [f.id for f in forks])
    image = "snap-" + uuid.uuid4().hex[:8]
    status, out = api(shared, "POST", f"/v1/sandboxes/{sb.id}/snapshot", {"image": image})
    assert status in (200, 201), out
    # The image lives on that node (images on every node are step 3): delete it there.
    s, _ = request(shared.edge_url(node_of(sb.id)), "DELETE", f"/v1/images/{image}",
                   token=shared.node_token)
    assert s in (200, 204), s


def test_lists_paginate_across_nodes(shared):
    status, out = api(shared, "POST", "/v1/sandboxes",
                      {"count": 7, "memory_mb": 128, "labels": {"t": "pages"}})
    assert status == 201, out
    ids = {s["id"] for s in out["sandboxes"]}
    try:
        seen, cursor, pages = [], None, 0
        while True:
            q = "/v1/sandboxes?label=t=pages&limit=2" + (f"&cursor={urllib.parse.quote(cursor)}"
                                                         if cursor else "")
            status, page = api(shared, "GET", q, i=pages % 2)  # pages alternate apiservers
            assert status == 200, page
            assert len(page["sandboxes"]) <= 2
            seen += page["sandboxes"]
            pages += 1
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert [s["id"] for s in seen if s["id"] in ids] and {s["id"] for s in seen} == ids
        assert len(seen) == 7
        keys = [(s["created_at"], s["id"]) for s in seen]
        assert keys == sorted(keys)
        status, out = api(shared, "GET", "/v1/sandboxes?cursor=bm9wZQ==")
        assert status == 400
    finally:
        delete_all(shared, ids)


def test_job_operations_fan_out(shared):
    job = "job-" + uuid.uuid4().hex[:6]
    status, out = api(shared, "POST", "/v1/sandboxes",
                      {"count": 4, "memory_mb": 128, "labels": {"job": job}})
    assert status == 201, out
    ids = [s["id"] for s in out["sandboxes"]]
    assert len({node_of(s) for s in ids}) >= 2
    status, out = api(shared, "POST", f"/v1/jobs/{job}/pause", {})
    assert status == 200 and out["affected"] == 4, out
    assert all(api(shared, "GET", f"/v1/sandboxes/{s}")[1]["state"] == "paused" for s in ids)
    status, out = api(shared, "POST", f"/v1/jobs/{job}/resume", {})
    assert status == 200 and out["affected"] == 4, out
    status, out = api(shared, "DELETE", f"/v1/jobs/{job}")
    assert status == 200 and out["affected"] == 4, out
    # Deleted with their job: each node answers 410 gone, reason job, through the apiserver.
    gone = [api(shared, "GET", f"/v1/sandboxes/{s}") for s in ids]
    assert all(st == 410 and out["error"]["reason"] == "job" for st, out in gone), gone


# ---- faults (a cluster each) ---------------------------------------------------------------

def test_lease_expiry_marks_the_node_unavailable_and_its_return_readopts(make_cluster):
    c = make_cluster(edges=2, apiservers=1)
    api(c, "POST", "/v1/nodes/n1/cordon")
    sid = create(c)["id"]
    api(c, "POST", "/v1/nodes/n1/uncordon")
    assert node_of(sid) == "n2"
    sb = sdk(c).sandbox(sid)
    sb.write_file("/workspace/keep.txt", "still here\n")
    c.edge_kill("n2")
    wait_until(lambda: api(c, "GET", "/v1/nodes/n2")[1]["state"] == "unavailable", timeout=20)
    status, out = api(c, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]})
    assert status == 503 and "node n2 is unavailable" in out["error"]["message"], out
    # Its record is the one last seen, with state "unavailable" and why.
    status, rec = api(c, "GET", f"/v1/sandboxes/{sid}")
    assert status == 200 and rec["id"] == sid and rec["state"] == "unavailable", rec
    assert rec["node"] == "n2" and "node n2 is unavailable" in rec["reason"], rec
    # New sandboxes go to the node that is up; the list says which node it could not ask, and
    # shows the records it has of that node's sandboxes as unavailable.
    other = create(c)["id"]
    assert node_of(other) == "n1"
    u = urllib.parse.urlsplit(c.urls[0])

    def listed(query="", unavailable="n2"):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/v1/sandboxes" + query,
                     headers={"Authorization": f"Bearer {c.token}"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 200, body
        assert resp.getheader("Dsec-Unavailable-Nodes") == unavailable, body
        return {s["id"]: s["state"] for s in body["sandboxes"]}, body["next_cursor"]

    states, cursor = listed()
    assert states == {sid: "unavailable", other: "running"} and cursor is None, states
    assert listed("?state=running")[0] == {other: "running"}
    assert listed("?state=unavailable")[0] == {sid: "unavailable"}
    # One per page: the cursor walks both nodes' shares.
    first, cursor = listed("?limit=1")
    # (n2's share was all on the first page: the second asks n1 only)
    second, cursor2 = listed("?limit=1&cursor=" + urllib.parse.quote(cursor), unavailable=None)
    assert {**first, **second} == {sid: "unavailable", other: "running"}, (first, second)
    assert cursor2 is None
    c.edge_start("n2")
    wait_until(lambda: api(c, "GET", "/v1/nodes/n2")[1]["state"] == "ready", timeout=30)
    assert api(c, "GET", f"/v1/sandboxes/{sid}")[1]["state"] == "running"
    assert sb.read_file("/workspace/keep.txt") == b"still here\n"
    assert sb.exec(["true"]).exit_code == 0


def test_a_retry_on_another_apiserver_gets_the_same_sandbox(make_cluster):
    c = make_cluster(edges=3, apiservers=2)
    rids = [f"rid-{uuid.uuid4().hex}" for _ in range(400 if LONG else 50)]
    results = {}
    killed = threading.Event()
    cut = []  # request ids whose attempt on apiserver 0 died with it


    def one(rid):
        body = json.dumps({"memory_mb": 128, "request_id": rid, "labels": {"t": "retry"}})
        for attempt in range(40):
            i = 0 if not killed.is_set() and attempt == 0 else 1
            try:
                status, out = request(c.urls[i], "POST", "/v1/sandboxes", body.encode(),
                                      token=c.token, headers={"Content-Type": "application/json"},
                                      timeout=60)
            except OSError:
                if i == 0:
                    cut.append(rid)
                time.sleep(0.05)
                continue
            if status == 201:
                return out["id"]
            if status in (429, 503):
                time.sleep(0.1)
                continue
            raise AssertionError((rid, status, out))
        raise AssertionError(f"{rid}: no sandbox after 40 attempts")

    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:  # 50 in flight
        futures = {pool.submit(one, rid): rid for rid in rids}
        time.sleep(0.05)
        c.apiserver_kill(0)  # mid-create: some forwarded, some not, some answered
        killed.set()
        for f, rid in futures.items():
            results[rid] = f.result()
    # Every retry of a request id got one and the same sandbox...
    for rid in rids:
        status, out = request(c.urls[1], "POST", "/v1/sandboxes",
                              {"memory_mb": 128, "request_id": rid, "labels": {"t": "retry"}},
                              token=c.token)
        assert status == 201 and out["id"] == results[rid], (rid, status, out)
    print(f"{len(cut)} of {len(rids)} creates were cut by the kill")
    assert cut, "the kill came after every create was answered: nothing was tested"
    # ...and the nodes hold exactly one per request id, no more.
    held = []
    for name in ("n1", "n2", "n3"):
        status, out = request(c.edge_url(name), "GET", "/v1/sandboxes?label=t=retry&limit=1000",
                              token=c.node_token)
        assert status == 200
        held += [s["id"] for s in out["sandboxes"]]
    assert sorted(held) == sorted(results.values()), (len(held), len(results))


@pytest.mark.parametrize("round_", range(3 if LONG else 1))
def test_etcd_outage_keeps_routing_and_fails_creates_fast(make_cluster, round_):
    c = make_cluster(edges=2, apiservers=1)
    sid = create(c)["id"]
    c.etcd_stop()
    try:
        sb = sdk(c, retries=0).sandbox(sid)
        assert sb.exec(["echo", "up"]).stdout == "up\n"
        t = time.monotonic()
        status, out = api(c, "POST", "/v1/sandboxes", {"memory_mb": 128})
        took = time.monotonic() - t
        assert status == 503 and "etcd" in out["error"]["message"], out
        assert took < 2, took
        status, out = api(c, "GET", "/v1/health")
        assert status == 200 and out["etcd"] is False
        time.sleep(3)  # five seconds without etcd in all
        assert sb.exec(["echo", "still"]).stdout == "still\n"
    finally:
        c.etcd_start()
    wait_until(lambda: api(c, "POST", "/v1/sandboxes", {"memory_mb": 128})[0] == 201,
               timeout=30)
    status, out = api(c, "GET", "/v1/nodes")
    assert {n["node"]: n["state"] for n in out["nodes"]} == {"n1": "ready", "n2": "ready"}


def test_scripts_cluster_up_and_down_leave_nothing():
    reason = cluster_harness.why_not_runnable()
    if reason:
        pytest.skip(reason)
    # A short path of its own: the script keeps the edges' unix sockets under DIR.
    base = pathlib.Path(tempfile.mkdtemp(prefix="dsec-cu-"))
    d = base / "c"
    env = dict(os.environ)
    up = subprocess.run([str(REPO / "scripts" / "cluster"), "up", str(d), "--edges", "2",
                         "--apiservers", "1"], capture_output=True, text=True, timeout=300,
                        env=env)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        lines = dict(l.split("=", 1) for l in up.stdout.splitlines() if "=" in l)
        url, token = lines["DSEC_URL"], lines["DSEC_TOKEN"]
        status, out = request(url, "POST", "/v1/sandboxes", {"memory_mb": 128}, token=token)
        assert status == 201, out
        status, out = request(url, "POST", f"/v1/sandboxes/{out['id']}/exec",
                              {"cmd": ["echo", "ok"]}, token=token)
        assert status == 200 and out["stdout"] == "ok\n", out
    finally:
        down = subprocess.run([str(REPO / "scripts" / "cluster"), "down", str(d)],
                              capture_output=True, text=True, timeout=300, env=env)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    assert not d.exists()
    base.rmdir()


def test_fncall_and_the_cluster_as_a_node(shared):
    status, out = api(shared, "POST", "/v1/fncalls", {"runtime": "python", "code": "print(6*7)"})
    assert status == 200 and out["stdout"] == "42\n" and out["exit_code"] == 0, out
    status, out = api(shared, "POST", "/v1/fncalls", {"runtime": "cobol", "code": "1"}, i=1)
    assert status == 422 and "pool \"cobol\"" in out["error"]["message"], out
    status, out = api(shared, "POST", "/v1/fncalls", {"code": "1"})
    assert status == 400, out
    status, node = api(shared, "GET", "/v1/node")
    assert status == 200 and node["node"] == "cluster", node
    status, nodes = api(shared, "GET", "/v1/nodes")
    assert node["capacity"]["max_sandboxes"] == sum(
        n["capacity"]["max_sandboxes"] for n in nodes["nodes"])
    assert node["features"]["cluster"]["nodes_ready"] == 3


def test_paths_that_would_mean_something_else_on_the_node_are_refused(shared):
    sid = "sb-n1-aaaaaaaaaaaa"
    for path in (f"/v1/sandboxes/{sid}/%2E%2E/%2E%2E/images",
                 f"/v1/sandboxes/{sid}/../../images",
                 f"/v1/sandboxes/{sid}%2Ffiles",
                 f"/v1/sandboxes/{sid}/./files?path=/etc/passwd"):
        status, out = request(shared.urls[0], "GET", path, token=shared.token)
        assert status == 400 and out["error"]["code"] == "bad_request", (path, status, out)


def test_relays_are_capped(make_cluster):
    c = make_cluster(edges=1, apiservers=1)
    c.apiserver_extra = ["--max-relays", "2"]
    c.apiserver_kill(0, signal.SIGTERM)
    c.apiserver_start(0)
    sid = create(c)["id"]
    u = urllib.parse.urlsplit(c.urls[0])
    held = []
    try:
        for _ in range(2):  # two long calls: attached shells
            status, _, ws = WebSocket.connect(u.hostname, u.port,
                                              f"/v1/sandboxes/{sid}/attach?cmd=cat", token=c.token)
            assert status == 101
            held.append(ws)
        status, out = api(c, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]})
        assert status == 429 and "max_relays" in out["error"]["message"], out
        # Creates, lists and records are not relays: they go on.
        assert api(c, "GET", "/v1/sandboxes")[0] == 200
        assert api(c, "GET", f"/v1/sandboxes/{sid}")[0] == 200
        held.pop().close()
        wait_until(lambda: api(c, "POST", f"/v1/sandboxes/{sid}/exec",
                               {"cmd": ["true"]})[0] == 200, timeout=10)
    finally:
        for ws in held:
            ws.close()


def test_a_full_node_passes_the_create_on_and_all_full_is_429(make_cluster):
    c = make_cluster(edges=2, apiservers=1,
                     edge_config={"max_sandboxes": 2, "fncall_pools": False})
    # Back to back, before the nodes' published loads catch up: a create that reaches a full
    # node (its 429) is sent on to the other.
    ids = [create(c)["id"] for _ in range(4)]
    assert sorted(node_of(s) for s in ids) == ["n1", "n1", "n2", "n2"], ids
    status, out = api(c, "POST", "/v1/sandboxes", {"memory_mb": 128})
    assert status == 429 and "every node tried is full" in out["error"]["message"], out
    delete_all(c, ids[:1])
    wait_until(lambda: api(c, "POST", "/v1/sandboxes", {"memory_mb": 128})[0] == 201, timeout=10)


def test_a_request_only_big_nodes_can_take_goes_to_them(make_cluster):
    # n1 admits a tenth of the node's memory, n2 eight times it (the default).
    c = make_cluster(edges=2, apiservers=1, edge_config=lambda name: (
        {"memory_overcommit": 0.1} if name == "n1" else {}))
    small = api(c, "GET", "/v1/nodes/n1")[1]["capacity"]["admit_memory_mb"]
    big = api(c, "GET", "/v1/nodes/n2")[1]["capacity"]["admit_memory_mb"]
    assert small < big
    ids = [create(c, memory_mb=small + 64)["id"] for _ in range(6)]
    assert {node_of(s) for s in ids} == {"n2"}, ids
    delete_all(c, ids)
    status, out = api(c, "POST", "/v1/sandboxes", {"memory_mb": big + 1})
    assert status == 422 and "can never fit any node" in out["error"]["message"], out


def test_every_route_of_the_spec_is_401_without_the_cluster_token(shared):
    u = urllib.parse.urlsplit(shared.urls[1])
    ids = {"id": "sb-n1-aaaaaaaaaaaa", "eid": "ex-none", "tid": "t-none", "sid": "sh-none", "name": "python",
           "job": "j", "port": "8000", "node": "n1", "project": "default"}
    ops = [(m, t) for m, t, op in edge_harness.spec().operations() if op.get("security", True) != []]
    assert len(ops) > 40
    for method, template in ops:
        path = template.format(**ids)
        for token in (None, "w" * 32, shared.node_token):
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            conn.request(method, path, body=b"{}" if method in ("POST", "PUT", "PATCH") else None,
                         headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            assert resp.status == 401, (method, path, token, resp.status, body[:200])
            assert resp.getheader("WWW-Authenticate") == "Bearer", (method, path)


def test_calls_on_sandboxes_keep_the_connection_alive(shared, sb):
    """After a relayed exchange the client's connection goes back to the apiserver: the next
    request on it (even one already sent, pipelined) is checked and routed afresh."""
    u = urllib.parse.urlsplit(shared.urls[0])
    auth = {"Authorization": f"Bearer {shared.token}"}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.connect()
    first = conn.sock
    for k in range(3):
        conn.request("POST", f"/v1/sandboxes/{sb.id}/exec",
                     json.dumps({"cmd": ["echo", str(k)]}),
                     {**auth, "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["stdout"] == f"{k}\n"
        assert not resp.will_close
        conn.request("GET", f"/v1/sandboxes/{sb.id}", headers=auth)
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["id"] == sb.id
        # A call the apiserver answers itself, on the same connection.
        conn.request("GET", "/v1/nodes", headers=auth)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read()
    assert conn.sock is first, "the connection was not kept"
    # The next request's token is checked again: a bad one on the kept connection is 401.
    conn.request("GET", f"/v1/sandboxes/{sb.id}", headers={"Authorization": "Bearer nope"})
    resp = conn.getresponse()
    assert resp.status == 401
    resp.read()
    conn.close()
    # Pipelined: two requests in one write, two answers in order.
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    one = (f"GET /v1/sandboxes/{sb.id} HTTP/1.1\r\nHost: x\r\n"
           f"Authorization: Bearer {shared.token}\r\n\r\n").encode()
    s.sendall(one + one.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1))
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    assert got.count(b"HTTP/1.1 200") == 2, got[:400]
    assert got.count(sb.id.encode()) >= 2


def accepted_by(c, node):
    """The TCP connections node's API accepted so far (its /metrics, asked directly)."""
    status, text = request(c.edge_url(node), "GET", "/metrics", token=c.node_token)
    assert status == 200, (status, text)
    for line in text.decode().splitlines():
        if line.startswith("dsec_http_connections_accepted_total "):
            return int(line.split()[1])
    raise AssertionError("no dsec_http_connections_accepted_total in the node's metrics")


def test_relayed_calls_reuse_connections_to_the_node(shared, sb):
    """Relayed calls travel on the apiserver's keep-alive connections to the node: 40 calls, each
    on a new client connection to the apiserver (buffered and streamed exec, a record, a file),
    cost the node a handful of new connections, not 40."""
    node = sb.id.split("-")[1]
    before = accepted_by(shared, node)
    for k in range(10):
        assert api(shared, "POST", f"/v1/sandboxes/{sb.id}/exec",
                   {"cmd": ["echo", str(k)]}, i=1)[1]["stdout"] == f"{k}\n"
        assert api(shared, "GET", f"/v1/sandboxes/{sb.id}", i=1)[1]["id"] == sb.id
        sb.write_file(f"/tmp/f{k}", f"v{k}")
        assert sb.read_file(f"/tmp/f{k}") == f"v{k}".encode()
    after = accepted_by(shared, node)
    # (the metrics calls themselves are two of them)
    assert after - before <= 10, f"{after - before} new connections for 40 relayed calls"
