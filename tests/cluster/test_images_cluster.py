"""Images across nodes (issue 38): an image made through an apiserver on one node runs on every
node, its layers fetched from a node that holds them, checked against the digest the cluster's
record names; concurrent creates share one fetch; a holder killed mid-transfer is replaced by
another; a deleted image goes from every node.

Real etcd, edges and apiservers (cluster_harness.py). Each node paces what it serves to other
nodes (cluster_layer_serve_bytes_per_s), so a transfer lasts long enough to be caught in flight.
"""

import base64
import json
import re
import threading
import time
import urllib.request

from cluster_harness import request
from edge_harness import wait_until

# A snapshot's layer is an EROFS image of a few KiB: at 2 KiB/s a transfer takes seconds.
PACE = 2048


def etcd_get(c, key):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(c.etcd_url + "/v3/kv/range", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        kvs = json.loads(r.read()).get("kvs", [])
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def etcd_put(c, key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value.encode()).decode()}).encode()
    req = urllib.request.Request(c.etcd_url + "/v3/kv/put", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def layer_events(c, node):
    """{event: count} of the node's dsec_layer_events_total, and its dsec_layers_serving."""
    status, text = request(c.edge_url(node), "GET", "/metrics", token=c.node_token)
    assert status == 200, status
    out = {}
    for m in re.finditer(r'^dsec_layer_events_total\{event="(\w+)"\} (\d+)$', text.decode(),
                         re.M):
        out[m.group(1)] = int(m.group(2))
    m = re.search(r"^dsec_layers_serving (\d+)$", text.decode(), re.M)
    out["serving"] = int(m.group(1)) if m else 0
    return out


def local_images(c, node):
    status, body = request(c.edge_url(node), "GET", "/v1/images", token=c.node_token)
    assert status == 200, (status, body)
    return {i["name"] for i in body["images"]}


def create(c, node, image, i=0):
    return c.api("POST", "/v1/sandboxes", {"image": image, "node": node, "memory_mb": 128,
                                            "ttl_s": 600}, i=i)


def run(c, sid, cmd):
    status, out = c.api("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": cmd})
    assert status == 200, (status, out)
    return out


def test_an_image_made_on_one_node_runs_on_every_node(make_cluster):
    c = make_cluster(edges=3, edge_config={"cluster_layer_serve_bytes_per_s": PACE})
    c.wait_nodes()
    a, b, n3 = sorted(c.edges)

    # A pin names a node: one that is not in the cluster is 422, and only admins may pin.
    status, out = create(c, "no-such-node", "host")
    assert status == 422, (status, out)

    # Made on a: a sandbox's files, snapshotted through the apiserver.
    status, src = create(c, a, "host")
    assert status == 201 and src["node"] == a, (status, src)
    out = run(c, src["id"], ["sh", "-c", "echo made-on-a > /workspace/hello.txt"])
    assert out["exit_code"] == 0, out
    status, img = c.api("POST", f"/v1/sandboxes/{src['id']}/snapshot", {"image": "tools:v1"})
    assert status == 201, (status, img)
    # A second image of the same name, anywhere in the cluster, is refused.
    status, out = c.api("POST", f"/v1/sandboxes/{src['id']}/snapshot", {"image": "tools:v1"})
    assert status == 409, (status, out)

    # The cluster lists it, made on a and held by a.
    def listed():
        status, body = c.api("GET", "/v1/images/tools:v1", i=1)
        return body if status == 200 and body.get("nodes") == [a] else None
    shown = wait_until(listed, 20, 0.1, "the image held by its origin")
    assert shown["origin"] == a and len(shown["layers"]) == 1, shown
    status, body = c.api("GET", "/v1/images")
    assert status == 200 and "tools:v1" in {i["name"] for i in body["images"]}, body

    # 8 creates at once on a node that lacks it: one fetch, one transfer from a.
    before_a = layer_events(c, a).get("served", 0)
    results = [None] * 8

    def one(k):
        results[k] = create(c, n3, "tools:v1", i=k % 2)
    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for status, out in results:
        assert status == 201 and out["node"] == n3, (status, out)
    assert layer_events(c, n3).get("fetched", 0) == 1, layer_events(c, n3)
    assert layer_events(c, a).get("served", 0) == before_a + 1, layer_events(c, a)
    out = run(c, results[0][1]["id"], ["cat", "/workspace/hello.txt"])
    assert out["stdout"] == "made-on-a\n", out
    wait_until(lambda: c.api("GET", "/v1/images/tools:v1")[1].get("nodes") == sorted([a, n3]),
               20, 0.1, "the copy on the third node listed as a holder")

    # A record whose blob digest is not what the holders serve: refused, and nothing kept.
    key = "/dsec/images/tools:v1"
    good = etcd_get(c, key)
    rec = json.loads(good)
    rec["layers"][0]["blob"] = "sha256:" + "0" * 64
    etcd_put(c, key, json.dumps(rec))
    status, out = create(c, b, "tools:v1")
    assert status == 503 and "sha256" in out["error"]["message"], (status, out)
    assert "tools:v1" not in local_images(c, b)
    assert layer_events(c, b).get("fetched", 0) == 0, layer_events(c, b)
    etcd_put(c, key, good)

    # A holder killed in the middle of the transfer: the node fetches it from the other holder.
    done = {}

    def slow():
        done["r"] = create(c, b, "tools:v1")
    t = threading.Thread(target=slow)
    t.start()
    serving = wait_until(
        lambda: next((n for n in (a, n3) if layer_events(c, n)["serving"] > 0), None),
        30, 0.05, "a holder sending the layer")
    c.edge(serving).kill9()
    t.join(120)
    status, out = done["r"]
    assert status == 201 and out["node"] == b, (status, out)
    events = layer_events(c, b)
    assert events.get("fetched") == 1 and events.get("fetch_failed", 0) >= 1, events
    assert run(c, out["id"], ["cat", "/workspace/hello.txt"])["stdout"] == "made-on-a\n"
    c.edge(serving).launch()
    c.wait_nodes()

    # Deleted through an apiserver: every node drops it; sandboxes made of it keep running.
    status, _ = c.api("DELETE", "/v1/images/tools:v1", i=1)
    assert status == 204, status
    for n in (a, b, n3):
        wait_until(lambda n=n: "tools:v1" not in local_images(c, n), 20, 0.1,
                   f"the image gone from {n}")
    status, out = create(c, b, "tools:v1")
    assert status == 404, (status, out)
    assert run(c, results[1][1]["id"], ["cat", "/workspace/hello.txt"])["exit_code"] == 0


def test_images_are_the_projects(make_cluster):
    c = make_cluster(edges=2)
    c.wait_nodes()
    status, _ = c.api("POST", "/v1/projects", {"name": "other"})
    assert status == 201, status
    status, src = c.api("POST", "/v1/sandboxes", {"memory_mb": 128})
    assert status == 201, (status, src)
    status, img = c.api("POST", f"/v1/sandboxes/{src['id']}/snapshot", {"image": "mine:v1"})
    assert status == 201, (status, img)
    other = {"Dsec-Project": "other"}
    status, body = c.api("GET", "/v1/images", headers=other)
    assert status == 200 and "mine:v1" not in {i["name"] for i in body["images"]}, body
    status, out = c.api("GET", "/v1/images/mine:v1", headers=other)
    assert status == 404, (status, out)
    status, out = c.api("DELETE", "/v1/images/mine:v1", headers=other)
    assert status == 404, (status, out)
    for node in sorted(c.edges):
        status, out = c.api("POST", "/v1/sandboxes", {"image": "mine:v1", "node": node},
                            headers=other)
        assert status == 404, (status, out)
    status, out = c.api("GET", "/v1/images/mine:v1")
    assert status == 200 and out["name"] == "mine:v1", (status, out)


def rootfs_tar(files):
    """A tar of a tiny root filesystem holding `files` ({path: text}), on the host image."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_an_import_through_an_apiserver_runs_everywhere_and_the_cache_is_bounded(make_cluster):
    # Node caches of 0 MiB: a fetched image is kept only while in use (or just used).
    c = make_cluster(edges=2, edge_config={"cluster_layer_cache_mb": 0})
    c.wait_nodes()
    a, b = sorted(c.edges)
    body = rootfs_tar({"opt/kit/VERSION": "kit 1\n"})
    status, img = c.api("POST", f"/v1/images/import?name=kit:1&base=host&node={a}", body,
                        headers={"Content-Type": "application/octet-stream"})
    assert status == 201, (status, img)
    status, img2 = c.api("POST", f"/v1/images/import?name=kit:2&base=host&node={a}",
                         rootfs_tar({"opt/kit/VERSION": "kit 2\n"}),
                         headers={"Content-Type": "application/octet-stream"}, i=1)
    assert status == 201, (status, img2)
    status, again = c.api("POST", "/v1/images/import?name=kit:1&base=host", body,
                          headers={"Content-Type": "application/octet-stream"})
    assert status == 409, (status, again)
    # Without a node named: the least loaded ready node imports it.
    status, img3 = c.api("POST", "/v1/images/import?name=kit:3&base=host",
                         rootfs_tar({"opt/kit/VERSION": "kit 3\n"}),
                         headers={"Content-Type": "application/octet-stream"})
    assert status == 201, (status, img3)
    assert c.api("GET", "/v1/images/kit:3")[1]["origin"] in (a, b)
    # Made on a, run on b: fetched.
    status, sb = create(c, b, "kit:1")
    assert status == 201, (status, sb)
    assert run(c, sb["id"], ["cat", "/opt/kit/VERSION"])["stdout"] == "kit 1\n"
    assert "kit:1" in local_images(c, b)
    status, _ = c.api("DELETE", f"/v1/sandboxes/{sb['id']}")
    assert status == 204, status
    # Over the cache (0 MiB), unused and not used lately: the next fetch evicts it.
    time.sleep(11)
    status, sb2 = create(c, b, "kit:2")
    assert status == 201, (status, sb2)
    wait_until(lambda: "kit:1" not in local_images(c, b), 10, 0.1, "kit:1 evicted from b")
    assert layer_events(c, b).get("evicted", 0) >= 1, layer_events(c, b)
    assert "kit:2" in local_images(c, b)  # (in use)
    assert "kit:1" in local_images(c, a)  # the origin keeps its own
    # Evicted is not gone: b fetches it again.
    status, sb3 = create(c, b, "kit:1")
    assert status == 201, (status, sb3)
    assert run(c, sb3["id"], ["cat", "/opt/kit/VERSION"])["stdout"] == "kit 1\n"
    assert layer_events(c, b).get("fetched", 0) == 3, layer_events(c, b)


def test_a_build_through_an_apiserver_runs_everywhere(make_cluster):
    c = make_cluster(edges=3)
    c.wait_nodes()
    a, b, n3 = sorted(c.edges)
    status, _ = c.api("POST", f"/v1/images/import?name=kit:1&base=host&node={a}",
                      rootfs_tar({"opt/kit/VERSION": "kit 1\n"}),
                      headers={"Content-Type": "application/octet-stream"})
    assert status == 201, status
    # Built on b from an image made on a (fetched there first).
    status, bld = c.api("POST", f"/v1/images/build?node={b}",
                        {"name": "kit-built:1", "from": "kit:1",
                         "run": ["echo built > /opt/kit/BUILT"]})
    assert status == 202 and bld["id"].startswith(f"bld-{b}-"), (status, bld)

    def done():
        status, rec = c.api("GET", f"/v1/images/builds/{bld['id']}", i=1)
        assert status == 200, (status, rec)
        return rec if rec["state"] not in ("queued", "running") else None
    rec = wait_until(done, 120, 0.2, "the build")
    assert rec["state"] == "succeeded", rec
    status, log = c.api("GET", f"/v1/images/builds/{bld['id']}/log")
    assert status == 200 and "save image kit-built:1" in json.dumps(rec), (status, log)
    status, body = c.api("GET", "/v1/images/builds")
    assert status == 200 and bld["id"] in {x["id"] for x in body["builds"]}, body
    # Another project sees neither the build nor its image.
    status, _ = c.api("POST", "/v1/projects", {"name": "other"})
    assert status == 201, status
    other = {"Dsec-Project": "other"}
    assert c.api("GET", f"/v1/images/builds/{bld['id']}", headers=other)[0] == 404
    assert bld["id"] not in {x["id"] for x in
                             c.api("GET", "/v1/images/builds", headers=other)[1]["builds"]}
    assert c.api("GET", "/v1/images/kit-built:1", headers=other)[0] == 404
    # The image is the cluster's: made on b, it runs on the third node.
    status, img = c.api("GET", "/v1/images/kit-built:1")
    assert status == 200 and img["origin"] == b and img["source"] == "build", (status, img)
    status, sb = create(c, n3, "kit-built:1")
    assert status == 201, (status, sb)
    out = run(c, sb["id"], ["cat", "/opt/kit/VERSION", "/opt/kit/BUILT"])
    assert out["stdout"] == "kit 1\nbuilt\n", out
    # Unpinned, creates of it go to the nodes that hold it: what n1 lacks (half the image's
    # bytes or more) costs more than any load here. (Each node's published load is its
    # sandboxes over what it admits; the views must show the holders first.)
    nodes = wait_until(lambda: (lambda n: n if all(n[x]["usage"]["sandboxes"] >= 0 for x in n)
                                else None)(c.nodes()), 10, 0.1, "the nodes")
    wait_until(lambda: all(sorted(c.api("GET", "/v1/images/kit-built:1", i=i)[1]["nodes"])
                           == sorted([b, n3]) for i in (0, 1)), 10, 0.1, "both holders listed")
    cap = min(v["capacity"]["max_sandboxes"] for v in nodes.values())
    assert 5 / cap < 0.1, f"the nodes admit too few sandboxes ({cap}) for loads to stay small"
    for k in range(4):
        status, sb = c.api("POST", "/v1/sandboxes", {"image": "kit-built:1", "memory_mb": 128},
                           i=k % 2)
        assert status == 201 and sb["node"] in (b, n3), (status, sb)
    # An unknown build id is 404; one naming no node of the cluster too.
    assert c.api("GET", "/v1/images/builds/bld-zz-0123456789abcdef")[0] == 404
    assert c.api("GET", "/v1/images/builds/nonsense")[0] == 404
