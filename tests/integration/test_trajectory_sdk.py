"""The trajectory log through the SDK: record, preempt, resume answering from the log."""

import uuid

import pytest

libdsec = pytest.importorskip("libdsec")
from libdsec import DSecClient  # noqa: E402


@pytest.fixture
def sdk(edge):
    c = DSecClient(edge.url, token=edge.token)
    yield c
    c.close()


def test_sdk_records_preempts_and_resumes(sdk):
    t = "sdk-" + uuid.uuid4().hex[:10]
    job = "job-" + t
    sb = sdk.create(memory_mb=128, labels={"job": job}, trajectory=t)
    sb.write_file("/workspace/a.txt", b"one\n")
    first = [sb.run_shell("echo x >> /workspace/n; head -c 12 /dev/urandom | base64"),
             sb.run_shell("cat /workspace/a.txt; wc -l < /workspace/n")]
    out = sdk.preempt_job(job)
    assert out["affected"] == 1 and out["checkpointed"][0]["trajectory"] == t
    assert sdk.trajectory(t)["state"] == "preempted"
    assert any(x["id"] == t for x in sdk.list_trajectories())
    again = sdk.resume_trajectory(t, labels={"job": job})
    again.write_file("/workspace/a.txt", b"one\n")
    replayed = [again.run_shell("echo x >> /workspace/n; head -c 12 /dev/urandom | base64"),
                again.run_shell("cat /workspace/a.txt; wc -l < /workspace/n")]
    assert [r.stdout for r in replayed] == [r.stdout for r in first]
    live = again.run_shell("wc -l < /workspace/n")
    assert live.stdout.strip() == "1"  # nothing ran twice
    info = sdk.trajectory(t)
    assert info["state"] == "recording" and len(info["entries"]) == 5
    again.stop()


def test_shells_open_at_the_checkpoint_are_opened_again(edge):
    """A shell open across the checkpoint comes back (fresh) under the id the log knows, even
    when the new sandbox's agent numbers it otherwise."""
    c = edge.client()
    t = "sh-" + uuid.uuid4().hex[:10]
    job = "job-" + t
    sid = c.create({"labels": {"job": job}, "trajectory": {"id": t}}, validate=False)["id"]
    s1 = c.post(f"/v1/sandboxes/{sid}/shells", {}, expect=201, validate=False).json["shell_id"]
    s2 = c.post(f"/v1/sandboxes/{sid}/shells", {}, expect=201, validate=False).json["shell_id"]
    c.delete(f"/v1/sandboxes/{sid}/shells/{s1}", expect=204, validate=False)
    run = {"command": "echo one >> /workspace/log; cat /workspace/log"}
    first = c.post(f"/v1/sandboxes/{sid}/shells/{s2}/run", run, expect=200, validate=False)
    c.post(f"/v1/jobs/{job}/preempt", {}, expect=200, validate=False)
    rid = c.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}}, expect=201,
                 validate=False).json["id"]
    assert c.post(f"/v1/sandboxes/{rid}/shells", {}, validate=False).json["shell_id"] == s1
    assert c.post(f"/v1/sandboxes/{rid}/shells", {}, validate=False).json["shell_id"] == s2
    c.delete(f"/v1/sandboxes/{rid}/shells/{s1}", expect=204, validate=False)
    again = c.post(f"/v1/sandboxes/{rid}/shells/{s2}/run", run, validate=False)
    assert again.body == first.body and again.headers.get("dsec-trajectory-replayed") == "1"
    # Live: the log's shell s2 is the shell the new sandbox opened again.
    live = c.post(f"/v1/sandboxes/{rid}/shells/{s2}/run", {"command": "cat /workspace/log"},
                  expect=200, validate=False)
    assert live.json["stdout"] == "one\n"
    c.delete(f"/v1/sandboxes/{rid}/shells/{s2}", expect=204, validate=False)
    c.remove(rid)
