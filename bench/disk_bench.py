#!/usr/bin/env python3
"""Writable-layer benchmark (issue 5): a tmpfs layer (disk_mb <= tmpfs_disk_max_mb, charged
to memory) vs an ext4 disk image (bigger disk_mb, see src/isolation/disk_image.h).

Starts a private edge (tests/integration/edge_harness.Edge) with tmpfs_disk_max_mb 256 (the
default, 0, makes every layer an image) and the default disk image pool, and measures,
interleaving the two kinds in rounds:

 create   create -> exec `true` -> delete, serially: disk_mb 256 (tmpfs) and 2048 (image);
          create (POST returns a running sandbox) and delete are timed apart.
 write    in one sandbox of each kind (memory_mb 512), `dd` of 200 MiB from /dev/zero with
          conv=fsync into /workspace, then reading it back after dropping caches; MiB/s, and
          the sandbox's memory charge after the write (the tmpfs holds its data in memory,
          the image does not).

    sudo python3 bench/disk_bench.py [--rounds N] [--json] [--edge PATH]

About a minute on a 2-vCPU host. Leaves nothing behind (the edge is stopped and checked:
processes, cgroups, mounts, loop devices); exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import edge_harness  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from image_bench import pct  # noqa: E402

pc = time.perf_counter
KINDS = {"tmpfs": 256, "image": 2048}


def find_edge(arg):
    for cand in (arg, os.environ.get("DSEC_EDGE"), os.environ.get("DSEC_EDGE_BIN"),
                 os.path.join(os.environ.get("DSEC_BUILD_DIR", os.path.join(REPO, "build/release")),
                              "src/edge/dsec-edge")):
        if cand and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    raise SystemExit("disk_bench: no dsec-edge binary (build it or pass --edge)")


def stop_edge(edge, name):
    """Stops a bench's edge and checks what it left (processes, cgroups, mounts, loop devices);
    returns 1 (and says what) if anything, else 0."""
    residue = edge.shutdown_and_check()
    edge.cleanup()
    if residue:
        print(f"{name}: the edge left residue: {residue}", file=sys.stderr)
        return 1
    return 0


def sh(c, sid, script):
    r = c.exec(sid, cmd=["/bin/sh", "-c", script], timeout_ms=300000)
    if r["exit_code"] != 0:
        raise SystemExit(f"disk_bench: {script!r} failed: {json.dumps(r)[:500]}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=6, help="create cycles per kind per round")
    ap.add_argument("--write-mib", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    opts = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("disk_bench: needs root")
    binary = find_edge(opts.edge)
    os.environ["DSEC_EDGE_BIN"] = binary
    edge = edge_harness.Edge.start(binary=binary, prefix="dsec-diskbench-",
                                   config={"fncall_pools": False,
                                           "tmpfs_disk_max_mb": 256})
    rc = 0
    try:
        c = edge.client(timeout=300)
        create = {k: [] for k in KINDS}
        cycle = {k: [] for k in KINDS}
        delete = {k: [] for k in KINDS}
        for k, mb in KINDS.items():  # warm-up
            c.remove(c.create({"disk_mb": mb})["id"])
        for _ in range(opts.rounds):
            for k, mb in KINDS.items():
                for _ in range(opts.cycles):
                    t0 = pc()
                    sid = c.create({"disk_mb": mb})["id"]
                    t1 = pc()
                    sh(c, sid, "true")
                    t2 = pc()
                    c.remove(sid)
                    t3 = pc()
                    create[k].append((t1 - t0) * 1e3)
                    delete[k].append((t3 - t2) * 1e3)
                    cycle[k].append((t3 - t0) * 1e3)
        rows = []
        for k, mb in KINDS.items():
            sid = c.create({"disk_mb": mb, "memory_mb": 512})["id"]
            try:
                st = c.get(f"/v1/sandboxes/{sid}/stats", expect=200).json
                assert st["disk_kind"] == k, st
                t0 = pc()
                sh(c, sid, f"dd if=/dev/zero of=/workspace/f bs=1M count={opts.write_mib} "
                           "conv=fsync status=none")
                wr = opts.write_mib / (pc() - t0)
                after = c.get(f"/v1/sandboxes/{sid}/stats", expect=200).json
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    os.sync()
                    f.write("3")
                t0 = pc()
                sh(c, sid, "dd if=/workspace/f of=/dev/null bs=1M status=none")
                rd = opts.write_mib / (pc() - t0)
            finally:
                c.remove(sid)
            rows.append({"kind": k, "disk_mb": mb,
                         "create_p50_ms": statistics.median(create[k]),
                         "create_p90_ms": pct(create[k], 90),
                         "delete_p50_ms": statistics.median(delete[k]),
                         "cycle_p50_ms": statistics.median(cycle[k]),
                         "write_mib_s": wr, "read_mib_s": rd,
                         "memory_after_write_mib": after["memory_current"] / (1 << 20),
                         "memory_limit_mib": after["memory_limit"] / (1 << 20),
                         "disk_used_mib": after["disk_used"] / (1 << 20),
                         "n": len(create[k])})
        print(f"{'layer':8} {'disk_mb':>7} {'create p50':>10} {'p90':>7} {'delete p50':>10} "
              f"{'cycle p50':>9} {'write MiB/s':>11} {'read MiB/s':>10} {'mem after write':>15} "
              f"{'mem limit':>9}")
        for r in rows:
            print(f"{r['kind']:8} {r['disk_mb']:>7} {r['create_p50_ms']:>8.1f}ms "
                  f"{r['create_p90_ms']:>5.1f}ms {r['delete_p50_ms']:>8.1f}ms "
                  f"{r['cycle_p50_ms']:>7.1f}ms {r['write_mib_s']:>11.0f} {r['read_mib_s']:>10.0f} "
                  f"{r['memory_after_write_mib']:>11.0f} MiB {r['memory_limit_mib']:>5.0f} MiB")
            if opts.json:
                print("JSON " + json.dumps({"workload": "disk", **{
                    k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}}))
    except SystemExit as e:
        print(e, file=sys.stderr)
        rc = 1
    finally:
        rc |= stop_edge(edge, "disk_bench")
    return rc


if __name__ == "__main__":
    sys.exit(main())
