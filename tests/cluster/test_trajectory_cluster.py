"""The trajectory log through an apiserver (issue 39): a trajectory lives on the edge that
recorded it; the apiserver finds it there for GET/DELETE/resume (and a create that resumes),
makes the resumed sandbox on that node, fans a job's preemption out, and keeps projects apart."""

import uuid

import pytest

import cluster_harness
from cluster_harness import call
from edge_harness import wait_until


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    yield from cluster_harness.module_cluster(tmp_path_factory, "traj", edges=2, apiservers=1)


def project_token(c):
    p = f"t-{uuid.uuid4().hex[:6]}"
    assert call(c, "POST", "/v1/projects", {"name": p})[0] == 201
    s, t = call(c, "POST", f"/v1/projects/{p}/tokens", {"name": "w", "role": "member"})
    assert s == 201, t
    wait_until(lambda: call(c, "GET", "/v1/sandboxes", token=t["token"])[0] == 200, 5,
               what="the token taken")
    return p, t["token"]


def node_of(sid):
    return sid.split("-")[1]


def test_record_preempt_resume_through_the_apiserver(cl):
    _, tok = project_token(cl)
    _, other = project_token(cl)
    t = "ct-" + uuid.uuid4().hex[:10]
    job = "job-" + t
    s, sb = call(cl, "POST", "/v1/sandboxes",
                 {"memory_mb": 128, "labels": {"job": job}, "trajectory": {"id": t}}, token=tok)
    assert s == 201, sb
    sid = sb["id"]
    cmd = {"shell": "echo x >> /workspace/n; head -c 12 /dev/urandom | base64"}
    s, first = call(cl, "POST", f"/v1/sandboxes/{sid}/exec", cmd, token=tok)
    assert s == 200, first
    s, pr = call(cl, "POST", f"/v1/jobs/{job}/preempt", {}, token=tok)
    assert s == 200 and pr["affected"] == 1, pr
    assert pr["checkpointed"][0]["trajectory"] == t, pr
    s, info = call(cl, "GET", f"/v1/trajectories/{t}", token=tok)
    assert s == 200 and info["state"] == "preempted" and len(info["entries"]) == 1, info
    # The id is taken in the project on every node, not only on the one that keeps it.
    for _ in range(4):
        s, out = call(cl, "POST", "/v1/sandboxes", {"trajectory": {"id": t}}, token=tok)
        assert s == 409, out
    assert info["made_as"]["memory_mb"] == 128
    # Another project's caller finds nothing.
    assert call(cl, "GET", f"/v1/trajectories/{t}", token=other)[0] == 404
    assert call(cl, "POST", f"/v1/trajectories/{t}/resume", {}, token=other)[0] == 404
    s, lst = call(cl, "GET", "/v1/trajectories", token=tok)
    assert s == 200 and [x["id"] for x in lst["trajectories"]] == [t], lst
    # Resumed on the node that keeps it; the logged call answered from the log, then live.
    s, rs = call(cl, "POST", f"/v1/trajectories/{t}/resume", {}, token=tok)
    assert s == 201, rs
    rid = rs["id"]
    assert node_of(rid) == node_of(sid)
    s, again = call(cl, "POST", f"/v1/sandboxes/{rid}/exec", cmd, token=tok)
    assert s == 200 and again == first
    s, live = call(cl, "POST", f"/v1/sandboxes/{rid}/exec", {"shell": "wc -l < /workspace/n"},
                   token=tok)
    assert s == 200 and live["stdout"].strip() == "1", live
    # A sandbox follows it: a second resume is 409, a delete too.
    assert call(cl, "POST", "/v1/sandboxes", {"trajectory": {"id": t, "resume": True}},
                token=tok)[0] == 409
    assert call(cl, "DELETE", f"/v1/trajectories/{t}", token=tok)[0] == 409
    assert call(cl, "DELETE", f"/v1/sandboxes/{rid}", token=tok)[0] == 204
    wait_until(lambda: call(cl, "GET", f"/v1/trajectories/{t}", token=tok)[1]["sandbox"] is None,
               15, what="the trajectory let go")
    # A create that resumes it goes to that node too.
    s, rs2 = call(cl, "POST", "/v1/sandboxes", {"trajectory": {"id": t, "resume": True}},
                  token=tok)
    assert s == 201 and node_of(rs2["id"]) == node_of(sid), rs2
    assert call(cl, "DELETE", f"/v1/sandboxes/{rs2['id']}", token=tok)[0] == 204
    wait_until(lambda: call(cl, "DELETE", f"/v1/trajectories/{t}", token=tok)[0] == 204, 15,
               what="the trajectory deleted")
    assert call(cl, "GET", f"/v1/trajectories/{t}", token=tok)[0] == 404
