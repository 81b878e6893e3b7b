#!/usr/bin/env python3
"""Images across nodes (issue 38): what a node that lacks an image pays on its first create.

It starts a local cluster (tests/cluster/cluster_harness.py: a real etcd, 3 edges, an
apiserver on 127.0.0.1), imports through the apiserver, on node n1, an image of one layer of
--mb MiB of incompressible files on the host image, then for each other node times a create
pinned there (cold: the layer is fetched from a holder, its blob hashed and stored), then a
second create there (warm), and prints the blob's size, each cold and warm create's seconds,
and the fetch throughput. Nothing is paced (cluster_layer_serve_bytes_per_s: 0).

    sudo python3 bench/layer_bench.py [--mb 256]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
import cluster_harness  # noqa: E402


def layer_tar(mb):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(mb):
            data = os.urandom(1 << 20)
            info = tarfile.TarInfo(f"opt/blob/{i:04d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=256)
    a = p.parse_args()
    why = cluster_harness.why_not_runnable()
    if why:
        raise SystemExit(f"layer_bench: {why}")
    c = cluster_harness.Cluster.start(None, edges=3, apiservers=1)
    try:
        c.wait_nodes()
        n1, n2, n3 = sorted(c.edges)
        body = layer_tar(a.mb)
        t = time.monotonic()
        status, img = c.api("POST", f"/v1/images/import?name=blob:1&base=host&node={n1}", body,
                            headers={"Content-Type": "application/octet-stream"}, timeout=600)
        imported = time.monotonic() - t
        assert status == 201, (status, img)
        time.sleep(1)  # (n1 lists the layer as one it serves)
        rows = []
        for node in (n2, n3):
            times = []
            for _ in range(2):
                t = time.monotonic()
                status, sb = c.api("POST", "/v1/sandboxes", {"image": "blob:1", "node": node,
                                                              "memory_mb": 128}, timeout=600)
                times.append(time.monotonic() - t)
                assert status == 201, (status, sb)
            rows.append((node, times[0], times[1]))
        st, rec = c.api("GET", "/v1/images/blob:1")
        blob = etcd_blob_size(c)
        print(json.dumps({"layer_mb": a.mb, "blob_bytes": blob, "import_s": round(imported, 2),
                          "nodes": [{"node": n, "cold_create_s": round(x, 3),
                                     "warm_create_s": round(y, 3),
                                     "fetch_mb_per_s": round(blob / (1 << 20) / max(x - y, 1e-3),
                                                             1)}
                                    for n, x, y in rows],
                          "holders": rec.get("nodes")}, indent=1))
    finally:
        cluster_harness.teardown(c)


def etcd_blob_size(c):
    import base64
    import urllib.request
    body = json.dumps({"key": base64.b64encode(b"/dsec/images/blob:1").decode()}).encode()
    req = urllib.request.Request(c.etcd_url + "/v3/kv/range", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        kv = json.loads(r.read())["kvs"][0]
    rec = json.loads(base64.b64decode(kv["value"]))
    return sum(layer["blob_size"] for layer in rec["layers"])


if __name__ == "__main__":
    main()
