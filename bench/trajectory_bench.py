"""Trajectory log benchmark (issue 39): what recording adds to an exec, what an answer from the
log costs, and how long a resumed trajectory takes to go live.

Starts a private edge (tests/integration/edge_harness.Edge) and measures:

 record    exec latency (`true` through POST /v1/sandboxes/{id}/exec, one keep-alive client
           per sandbox) on sandboxes without and with a trajectory, 1 and 8 clients at once,
           the two kinds interleaved per round: p50/p90 and the p50 added by recording.
           (Checkpoints are off here, `checkpoint_every: 0`: the figure is the log's own cost.)
 replay    the same calls on a resumed sandbox, answered from the log: p50/p90.
 resume    a trajectory of 100 mutating calls (each appends to a file and runs a small command)
           with a checkpoint every 20, preempted after call 100: the time from the resume to
           the answer of call 101 (100 calls answered from the log, then the sandbox made from
           the checkpoint of call 100 and call 101 run live), against a fresh sandbox running
           all 100 calls and call 101; and a fork at call 91 (made from the checkpoint of call
           80, calls 81-90 run again, then 91 live).

    sudo python3 bench/trajectory_bench.py [--calls N] [--rounds N] [--no-fsync] [--json]
        [--edge PATH] [--postgres] [--clients 1,8] [--no-resume]

--postgres keeps the log in the cluster's store instead: a private PostgreSQL (Debian's
postgresql-15, tests/cluster/pg_harness.py) on loopback, the edge's trajectory_postgres.

About a minute on a 2-vCPU host. Leaves nothing behind (the edge is stopped and checked);
exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
import edge_harness  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_bench import find_edge, stop_edge  # noqa: E402

pc = time.perf_counter
EXEC = {"cmd": ["true"]}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def tid():
    return "bench-" + uuid.uuid4().hex[:12]


def timed_execs(edge, sid, n, out, body=EXEC, expect_replayed=False):
    c = edge.client(keep_alive=True, validate=False)
    try:
        for _ in range(n):
            t0 = pc()
            r = c.post(f"/v1/sandboxes/{sid}/exec", body)
            dt = (pc() - t0) * 1000
            if r.status != 200:
                raise RuntimeError(f"exec: {r.status} {r.body[:200]}")
            if expect_replayed and r.headers.get("dsec-trajectory-replayed") != "1":
                raise RuntimeError("a call that should come from the log ran")
            out.append(dt)
    finally:
        c.close()


def parallel(edge, sids, n, body=EXEC, expect_replayed=False):
    results = [[] for _ in sids]
    errors = []

    def run(i):
        try:
            timed_execs(edge, sids[i], n, results[i], body, expect_replayed)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(sids))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return [x for r in results for x in r]


def record_and_replay(edge, c, clients, calls, rounds):
    plain_ms, rec_ms, replay_ms = [], [], []
    for _ in range(rounds):
        plain = [c.create({"memory_mb": 64})["id"] for _ in range(clients)]
        ids = [tid() for _ in range(clients)]
        job = "bench-" + uuid.uuid4().hex[:8]
        rec = [c.create({"memory_mb": 64, "labels": {"job": job},
                         "trajectory": {"id": t, "checkpoint_every": 0}},
                        validate=False)["id"] for t in ids]
        for s in plain + rec:  # warm
            parallel(edge, [s], 3)
        for _ in range(2):  # interleaved halves
            plain_ms += parallel(edge, plain, calls // 2)
            rec_ms += parallel(edge, rec, calls // 2)
        for s in plain:
            c.remove(s)
        c.post(f"/v1/jobs/{job}/preempt", {}, expect=200, validate=False)
        resumed = [c.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}},
                          expect=201, validate=False).json["id"] for t in ids]
        replay_ms += parallel(edge, resumed, 3 + calls // 2 * 2, expect_replayed=True)
        for s in resumed:
            c.remove(s)
        for t in ids:
            edge_harness.wait_until(
                lambda t=t: c.delete(f"/v1/trajectories/{t}", validate=False).status == 204, 15)
    return {"clients": clients,
            "plain_p50_ms": pct(plain_ms, 50), "plain_p90_ms": pct(plain_ms, 90),
            "recorded_p50_ms": pct(rec_ms, 50), "recorded_p90_ms": pct(rec_ms, 90),
            "added_p50_ms": pct(rec_ms, 50) - pct(plain_ms, 50),
            "replayed_p50_ms": pct(replay_ms, 50), "replayed_p90_ms": pct(replay_ms, 90),
            "n": len(rec_ms)}


def step(i):
    return {"shell": f"echo {i} >> /workspace/log; python3 -c 'print(sum(range({i} * 1000)))'"}


def resume_to_live(edge, c, ncalls=100, every=20):
    cl = edge.client(keep_alive=True, validate=False)
    t = tid()
    job = "bench-" + uuid.uuid4().hex[:8]
    sid = c.create({"memory_mb": 128, "labels": {"job": job},
                    "trajectory": {"id": t, "checkpoint_every": every}}, validate=False)["id"]
    for i in range(1, ncalls + 1):
        assert cl.post(f"/v1/sandboxes/{sid}/exec", step(i)).status == 200
    c.post(f"/v1/jobs/{job}/preempt", {}, expect=200, validate=False)
    last = {"shell": "wc -l < /workspace/log"}

    # Resumed: calls 1..100 from the log, then 101 live (made from the checkpoint of 100).
    t0 = pc()
    rid = cl.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}}).json["id"]
    for i in range(1, ncalls + 1):
        r = cl.post(f"/v1/sandboxes/{rid}/exec", step(i))
        assert r.headers.get("dsec-trajectory-replayed") == "1"
    r = cl.post(f"/v1/sandboxes/{rid}/exec", last)
    resumed_s = pc() - t0
    assert r.json["stdout"].strip() == str(ncalls), r.body
    c.remove(rid)
    edge_harness.wait_until(lambda: c.get(f"/v1/trajectories/{t}", validate=False).json[
        "sandbox"] is None, 15)

    # Forked at call 91: made from the checkpoint of 80, 81..90 run again, 91 live.
    t0 = pc()
    fid = cl.post(f"/v1/trajectories/{t}/resume", {}).json["id"]
    fork_at = ncalls - 9
    for i in range(1, fork_at):
        cl.post(f"/v1/sandboxes/{fid}/exec", step(i))
    r = cl.post(f"/v1/sandboxes/{fid}/exec", last)
    fork_s = pc() - t0
    assert r.json["stdout"].strip() == str(fork_at - 1), r.body
    c.remove(fid)

    # Without the log: a fresh sandbox runs all of them again.
    t0 = pc()
    nid = cl.post("/v1/sandboxes", {"memory_mb": 128}).json["id"]
    for i in range(1, ncalls + 1):
        cl.post(f"/v1/sandboxes/{nid}/exec", step(i))
    r = cl.post(f"/v1/sandboxes/{nid}/exec", last)
    rerun_s = pc() - t0
    assert r.json["stdout"].strip() == str(ncalls)
    c.remove(nid)
    edge_harness.wait_until(
        lambda: c.delete(f"/v1/trajectories/{t}", validate=False).status == 204, 15)
    cl.close()
    return {"calls": ncalls, "checkpoint_every": every, "resume_to_live_s": resumed_s,
            "fork_at_91_to_live_s": fork_s, "rerun_all_s": rerun_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="execs per client and kind per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--edge", default=None)
    ap.add_argument("--no-fsync", action="store_true",
                    help="trajectory_fsync: false (an entry survives the edge's death, not a "
                         "power loss)")
    ap.add_argument("--clients", default="1,8", help="client counts of the record+replay rows")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume-to-live rows")
    ap.add_argument("--postgres", action="store_true",
                    help="the cluster's store: a private PostgreSQL (trajectory_postgres)")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("trajectory_bench: needs root")
    binary = find_edge(opts.edge)
    os.environ["DSEC_EDGE_BIN"] = binary
    pg = None
    config = {"fncall_pools": False, "trajectory_fsync": not opts.no_fsync}
    if opts.postgres:
        sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
        import pg_harness  # noqa: E402
        pg = pg_harness.Postgres.start()
        config["trajectory_postgres"] = pg.conninfo
    try:
        edge = edge_harness.Edge.start(binary=binary, prefix="dsec-trajbench-", config=config)
    except BaseException:
        if pg:
            pg.cleanup()
        raise
    rows = []
    try:
        c = edge.client(timeout=600, validate=False)
        for clients in (int(x) for x in opts.clients.split(",")):
            rows.append({"workload": "record+replay", "fsync": not opts.no_fsync,
                         **record_and_replay(edge, c, clients, opts.calls, opts.rounds)})
        if not opts.no_resume:
            rows.append({"workload": "resume", **resume_to_live(edge, c)})
    finally:
        rc = stop_edge(edge, "trajectory_bench")
        if pg:
            pg.cleanup()
    store = "postgres" if pg else "sqlite"
    for r in rows:
        r["store"] = store
    for r in rows:
        if opts.json:
            print("JSON " + json.dumps(r))
        else:
            print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in r.items()))
    return rc


if __name__ == "__main__":
    sys.exit(main())
