#!/usr/bin/env python3
"""Upload benchmark: file uploads and image imports through the edge's HTTP API, with the
edge's memory. Uploads over 1 MiB are spooled to disk and streamed to the agent; smaller ones
stay in memory; an uncompressed import is read from the spooled body in place.

Starts a private edge (tests/integration/edge_harness.Edge) and measures, in one sandbox:

 upload   PUT /v1/sandboxes/{id}/files of random bytes, 512 KiB .. 192 MiB, each size
          --rounds times: MiB/s, and the growth of the edge's peak RSS (VmHWM) over the run
          of that size (sizes go up, so each figure is what that size added).
 import   POST /v1/images/import of a rootfs tar holding --import-mib MiB, uncompressed and
          gzip'd (fast level): seconds per import (the image is deleted after each).

    sudo python3 bench/upload_bench.py [--rounds N] [--json] [--edge PATH]

About a minute on a 2-vCPU host. Leaves nothing behind (the edge is stopped and checked);
exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import statistics
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import edge_harness  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_bench import find_edge, stop_edge  # noqa: E402

pc = time.perf_counter
MB = 1 << 20
OCTET = {"Content-Type": "application/octet-stream"}


def peak_rss_mib(pid):
    return edge_harness.peak_rss_kb(pid) / 1024


def rootfs_tar(nbytes):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        i = tarfile.TarInfo("data/blob")
        i.size = nbytes
        t.addfile(i, io.BytesIO(os.urandom(nbytes)))
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--import-mib", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    opts = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("upload_bench: needs root")
    binary = find_edge(opts.edge)
    os.environ["DSEC_EDGE_BIN"] = binary
    edge = edge_harness.Edge.start(binary=binary, prefix="dsec-uploadbench-",
                                   config={"fncall_pools": False})
    rc = 0
    rows = []
    try:
        c = edge.client(timeout=600)
        sid = c.create({"disk_mb": 1024, "memory_mb": 256})["id"]
        try:
            for size in (MB // 2, 16 * MB, 64 * MB, 192 * MB):
                body = os.urandom(size)
                before = peak_rss_mib(edge.pid)
                rates = []
                for _ in range(opts.rounds):
                    t0 = pc()
                    c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/up.bin", body,
                          headers=OCTET, expect=204)
                    rates.append(size / MB / (pc() - t0))
                rows.append({"workload": "upload", "mib": size / MB,
                             "mib_s_p50": statistics.median(rates),
                             "edge_peak_rss_growth_mib": peak_rss_mib(edge.pid) - before,
                             "n": len(rates)})
        finally:
            c.remove(sid)
        raw = rootfs_tar(opts.import_mib * MB)
        for kind, body in (("tar", raw), ("tar.gz", gzip.compress(raw, compresslevel=1))):
            times = []
            before = peak_rss_mib(edge.pid)
            for i in range(opts.rounds):
                name = f"bench-up-{kind.replace('.', '-')}:{i}"
                t0 = pc()
                c.post(f"/v1/images/import?name={name}", body, headers=OCTET, expect=201)
                times.append(pc() - t0)
                c.delete(f"/v1/images/{name}", expect=204)
            rows.append({"workload": "import", "kind": kind, "mib": len(body) / MB,
                         "s_p50": statistics.median(times),
                         "edge_peak_rss_growth_mib": peak_rss_mib(edge.pid) - before,
                         "n": len(times)})
        print(f"edge: {binary}")
        for r in rows:
            if r["workload"] == "upload":
                print(f"upload {r['mib']:>7.1f} MiB: {r['mib_s_p50']:>7.0f} MiB/s p50, edge peak "
                      f"RSS +{r['edge_peak_rss_growth_mib']:.1f} MiB")
            else:
                print(f"import {r['kind']:<7} {r['mib']:>6.1f} MiB: {r['s_p50']:>6.2f} s p50, edge "
                      f"peak RSS +{r['edge_peak_rss_growth_mib']:.1f} MiB")
            if opts.json:
                print("JSON " + json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                                            for k, v in r.items()}))
    except SystemExit as e:
        print(e, file=sys.stderr)
        rc = 1
    finally:
        rc |= stop_edge(edge, "upload_bench")
    return rc


if __name__ == "__main__":
    sys.exit(main())
