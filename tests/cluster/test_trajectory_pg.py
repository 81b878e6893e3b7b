"""A cluster's trajectory store (issue 39): every edge keeps its trajectories in one PostgreSQL
(a private one, started here), bodies and checkpoint layers included, so a trajectory outlives
the node that recorded it: preempted on n1, n1 killed, resumed on n2 (answered from the log,
then made from a checkpoint whose layer n2 fetched from the store); a trajectory whose
recording node is lost is taken over by a resume through the apiserver; expiry collects rows,
bodies and layers."""

import json
import uuid

import pytest

import cluster_harness
import pg_harness
from cluster_harness import call
from edge_harness import wait_until


@pytest.fixture(scope="module")
def pg():
    reason = pg_harness.why_not_runnable() or cluster_harness.why_not_runnable()
    if reason:
        print(f"[  SKIPPED ] {reason}")
        pytest.skip(reason)
    p = pg_harness.Postgres.start()
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module")
def cl(tmp_path_factory, pg):
    yield from cluster_harness.module_cluster(
        tmp_path_factory, "trajpg", edges=2, apiservers=1,
        edge_config={"trajectory_postgres": pg.conninfo, "trajectory_collect_grace_s": 0,
                     "trajectory_ttl_by_project": "shortlived=3"})


def new_project(c, name=None):
    p = name or f"t-{uuid.uuid4().hex[:6]}"
    assert call(c, "POST", "/v1/projects", {"name": p})[0] == 201
    return p


def node_of(sid):
    return sid.split("-")[1]


def count(pg, sql):
    return int(pg.psql(sql))


def metric(c, node, name):
    import urllib.request
    req = urllib.request.Request(c.edge_url(node) + "/metrics",
                                 headers={"Authorization": f"Bearer {c.node_token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


CALLS = [
    ("PUT", "files?path=/workspace/a.txt", b"alpha\n"),
    ("POST", "exec", {"shell": "echo one >> /workspace/n; date +%s%N"}),
    ("POST", "exec", {"shell": "mkdir -p /workspace/d && head -c 9 /dev/urandom | base64 | "
                               "tee /workspace/d/r"}),
    ("POST", "exec", {"shell": "echo two >> /workspace/n; cat /workspace/n | wc -l"}),
    ("POST", "exec", {"shell": "echo three >> /workspace/n; date +%s%N"}),
]


def run(c, p, sid, call_):
    import urllib.request
    method, path, body = call_
    if isinstance(body, bytes):
        # (A raw upload, through the apiserver's relay.)
        req = urllib.request.Request(f"{c.urls[0]}/v1/sandboxes/{sid}/{path}", data=body,
                                     method=method,
                                     headers={"Authorization": f"Bearer {c.token}",
                                              "Dsec-Project": p,
                                              "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), r.headers.get("Dsec-Trajectory-Replayed")
    s, out = call(c, method, f"/v1/sandboxes/{sid}/{path}", body, project=p)
    return s, json.dumps(out, sort_keys=True).encode(), None


def test_a_trajectory_outlives_its_node_and_resumes_on_another(cl, pg):
    p = new_project(cl)
    t = "pg-" + uuid.uuid4().hex[:10]
    job = "job-" + t
    s, sb = call(cl, "POST", "/v1/sandboxes",
                 {"node": "n1", "memory_mb": 128, "labels": {"job": job},
                  "trajectory": {"id": t, "checkpoint_every": 2}}, project=p)
    assert s == 201 and node_of(sb["id"]) == "n1", sb
    sid = sb["id"]
    first = [run(cl, p, sid, c) for c in CALLS]
    assert all(r[0] in (200, 204) for r in first), first
    # Every entry and checkpoint is in the database, not on the node.
    tkey = f"{p}/{t}"
    assert count(pg, f"SELECT COUNT(*) FROM dsec_trajectory_entries WHERE tkey = '{tkey}'") == 5
    assert count(pg, f"SELECT COUNT(*) FROM dsec_trajectory_checkpoints WHERE tkey = '{tkey}'") >= 2
    s, pr = call(cl, "POST", f"/v1/jobs/{job}/preempt", {}, project=p)
    assert s == 200 and pr["affected"] == 1, pr
    layers = count(pg, "SELECT COUNT(*) FROM dsec_trajectory_layers")
    assert layers >= 1
    # The node that recorded it is gone for good.
    cl.edge_kill("n1")
    wait_until(lambda: call(cl, "GET", "/v1/nodes/n1")[1]["state"] == "unavailable", 30,
               what="n1 unavailable")
    s, info = call(cl, "GET", f"/v1/trajectories/{t}", project=p)
    assert s == 200 and info["store"] == "cluster" and info["state"] == "preempted", info
    fetched_before = metric(cl, "n2", 'dsec_trajectory_events_total{event="layer_fetched"}')
    s, rs = call(cl, "POST", f"/v1/trajectories/{t}/resume", {}, project=p)
    assert s == 201 and node_of(rs["id"]) == "n2", rs
    rid = rs["id"]
    again = [run(cl, p, rid, c) for c in CALLS]
    # Byte for byte what n1 answered (the nondeterministic ones included), from the log.
    assert [(a[0], a[1]) for a in again] == [(f[0], f[1]) for f in first]
    s, live = call(cl, "POST", f"/v1/sandboxes/{rid}/exec",
                   {"shell": "cat /workspace/a.txt /workspace/n /workspace/d/r"}, project=p)
    assert s == 200, live
    rand = json.loads(first[2][1])["stdout"]
    assert live["stdout"] == "alpha\none\ntwo\nthree\n" + rand, live
    # The checkpoint's layer came from the store.
    assert metric(cl, "n2", 'dsec_trajectory_events_total{event="layer_fetched"}') > fetched_before
    s, info = call(cl, "GET", f"/v1/trajectories/{t}", project=p)
    assert s == 200 and info["sandbox"] == rid and len(info["entries"]) == 6, info
    assert call(cl, "DELETE", f"/v1/sandboxes/{rid}", project=p)[0] == 204
    cl.edge_start("n1")
    cl.wait_nodes(0)


def test_a_trajectory_recording_on_a_lost_node_is_taken_over(cl, pg):
    p = new_project(cl)
    t = "lost-" + uuid.uuid4().hex[:10]
    s, sb = call(cl, "POST", "/v1/sandboxes",
                 {"node": "n1", "trajectory": {"id": t, "checkpoint_every": 1}}, project=p)
    assert s == 201, sb
    sid = sb["id"]
    s, out = call(cl, "POST", f"/v1/sandboxes/{sid}/exec",
                  {"shell": "echo kept > /workspace/k; date +%s%N"}, project=p)
    assert s == 200, out
    # Followed by a live sandbox: no resume.
    assert call(cl, "POST", f"/v1/trajectories/{t}/resume", {}, project=p)[0] == 409
    cl.edge_kill("n1")
    wait_until(lambda: call(cl, "GET", "/v1/nodes/n1")[1]["state"] == "unavailable", 30,
               what="n1 unavailable")
    s, rs = call(cl, "POST", f"/v1/trajectories/{t}/resume", {}, project=p)
    assert s == 201 and node_of(rs["id"]) == "n2", rs
    rid = rs["id"]
    s, again = call(cl, "POST", f"/v1/sandboxes/{rid}/exec",
                    {"shell": "echo kept > /workspace/k; date +%s%N"}, project=p)
    assert s == 200 and again == out
    s, live = call(cl, "POST", f"/v1/sandboxes/{rid}/exec", {"shell": "cat /workspace/k"},
                   project=p)
    assert s == 200 and live["stdout"] == "kept\n", live
    # The lost node comes back: its sandbox is gone and it does not take the trajectory back.
    cl.edge_start("n1")
    cl.wait_nodes(0)
    s, info = call(cl, "GET", f"/v1/trajectories/{t}", project=p)
    assert s == 200 and info["sandbox"] == rid, info
    assert call(cl, "DELETE", f"/v1/sandboxes/{rid}", project=p)[0] == 204
    # (n1 took its old sandbox back at its restart: no longer a trajectory's.)
    assert call(cl, "DELETE", f"/v1/sandboxes/{sid}", project=p)[0] in (204, 404, 410)


def test_expired_trajectories_are_collected_from_the_store(cl, pg):
    p = new_project(cl, "shortlived")
    t = "exp-" + uuid.uuid4().hex[:10]
    s, sb = call(cl, "POST", "/v1/sandboxes", {"trajectory": {"id": t, "checkpoint_every": 1}},
                 project=p)
    assert s == 201, sb
    sid = sb["id"]
    s, out = call(cl, "POST", f"/v1/sandboxes/{sid}/exec",
                  {"shell": "head -c 200000 /dev/urandom > /workspace/big; echo made"}, project=p)
    assert s == 200, out
    tkey = f"{p}/{t}"
    # The checkpoint that call made due is taken before the delete answers.
    assert call(cl, "DELETE", f"/v1/sandboxes/{sid}", project=p)[0] == 204
    assert count(pg, f"SELECT COUNT(*) FROM dsec_trajectory_checkpoints WHERE tkey = '{tkey}'") >= 1
    image = pg.psql(f"SELECT image FROM dsec_trajectory_checkpoints WHERE tkey = '{tkey}' "
                    "ORDER BY seq DESC LIMIT 1")
    digests = [d for d in image.split(",") if d.startswith("sha256:")]
    assert digests, image
    wait_until(lambda: call(cl, "GET", f"/v1/trajectories/{t}", project=p)[0] == 404, 30,
               what="the trajectory expired")
    assert count(pg, f"SELECT COUNT(*) FROM dsec_trajectory_entries WHERE tkey = '{tkey}'") == 0
    # Its checkpoint layers leave the store (the housekeeper's pass after the expiry).
    wait_until(lambda: count(pg, "SELECT COUNT(*) FROM dsec_trajectory_layers WHERE digest IN ("
                             + ",".join(f"'{d}'" for d in digests) + ")") == 0, 30,
               what="its layers collected from the store")
    assert count(pg, "SELECT COUNT(*) FROM dsec_trajectory_layer_parts WHERE digest IN ("
                 + ",".join(f"'{d}'" for d in digests) + ")") == 0


def test_the_store_cases_on_postgres(pg):
    """The trajectory store's unit cases (src/edge/trajectory_store_test.cc) on this PostgreSQL,
    in a database of their own (they empty its tables)."""
    import os
    import pathlib
    import subprocess

    import edge_harness
    binary = pathlib.Path(edge_harness.edge_binary()).parent / "trajectory_store_test"
    if not binary.is_file():
        print(f"[  SKIPPED ] {binary} not built")
        pytest.skip(f"{binary} not built")
    pg.psql("DROP DATABASE IF EXISTS dsec_unit")
    pg.psql("CREATE DATABASE dsec_unit")
    conninfo = pg.conninfo.replace("dbname=dsec", "dbname=dsec_unit")
    r = subprocess.run([str(binary), "--gtest_filter=*/pg"], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, DSEC_TEST_PG_CONNINFO=conninfo))
    out = r.stdout + r.stderr
    assert r.returncode == 0, "\n".join(l for l in out.splitlines() if "NOTICE" not in l)[:6000]
    assert "[  SKIPPED ]" not in out, out[-4000:]
    assert "[  PASSED  ] 8 tests" in out, out[-4000:]
