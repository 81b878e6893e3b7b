"""The trajectory log on a live edge (edge/trajectory.h): recording, preempting a job, resuming
(calls answered from the log without running), forking at a differing call, durability across a
kill -9, project scoping, and preemption freeing the node."""

import uuid

from edge_harness import wait_until

# A small Python project whose tests an agent runs.
CALC = b"def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = (b"import unittest\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n"
         b"    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
         b"    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
         b"if __name__ == '__main__':\n    unittest.main()\n")
SUM = "cd /workspace && find . -type f -not -path './www/*' | sort | xargs sha256sum"
PORT = 18731


def tid():
    return "t-" + uuid.uuid4().hex[:12]


def episode():
    """The 40 calls of an episode: (method, path suffix, body) — a mutating call appends to
    /workspace/counter, so running it again would show."""
    count = "echo x >> /workspace/counter; "
    calls = [
        ("POST", "/files/mkdir?path=/workspace/proj", None),
        ("PUT", "/files?path=/workspace/proj/calc.py", CALC),
        ("PUT", "/files?path=/workspace/proj/test_calc.py", TESTS),
        ("POST", "/exec", {"shell": count + "date +%s%N"}),
        ("POST", "/exec", {"shell": count + "head -c 16 /dev/urandom | base64"}),
        ("POST", "/exec", {"shell": count + "cd /workspace/proj && python3 -m unittest -q 2>&1"}),
        ("GET", "/files?path=/workspace/proj/calc.py", None),
        ("POST", "/files/mkdir?path=/workspace/www", None),
        ("PUT", "/files?path=/workspace/www/index.html", b"hello from the server\n"),
        ("POST", "/exec", {"shell": f"cd /workspace/www && exec python3 -m http.server {PORT} "
                                    "--bind 127.0.0.1 >/dev/null 2>&1", "background": True}),
    ]
    for i in range(10, 40):
        n = i + 1
        if n == 20:
            calls.append(("POST", "/exec", {"shell": count + "for i in $(seq 50); do python3 -c "
                                           f"\"import urllib.request as u; print(u.urlopen('http://"
                                           f"127.0.0.1:{PORT}/index.html').read().decode())\" "
                                           "2>/dev/null && break; sleep 0.1; done"}))
        elif n == 25 or n == 26:
            calls.append(("POST", "/exec", {"shell": SUM}))  # the state (reads only)
        elif n == 27:
            calls.append(("POST", "/exec", {"shell": "wc -l < /workspace/counter"}))
        elif n == 30:
            calls.append(("POST", "/exec", {"shell": count + "for i in $(seq 50); do python3 -c "
                                           f"\"import urllib.request as u; print(u.urlopen('http://"
                                           f"127.0.0.1:{PORT}/index.html').read().decode())\" "
                                           "2>/dev/null && break; sleep 0.1; done"}))
        elif n % 3 == 0:
            calls.append(("PUT", f"/files?path=/workspace/f{n}.txt", f"file {n}\n".encode()))
        elif n % 3 == 1:
            calls.append(("POST", "/exec", {"shell": count + f"echo step {n}; date +%s%N"}))
        else:
            calls.append(("POST", "/exec", {"shell": count + "cat /workspace/proj/calc.py | "
                                           "sha256sum; head -c 8 /dev/urandom | od -An -tx1"}))
    assert len(calls) == 40
    return calls


def call(c, sid, method, suffix, body):
    path = f"/v1/sandboxes/{sid}{suffix}"
    if method == "PUT":
        return c.request("PUT", path, body, headers={"Content-Type": "application/octet-stream"})
    if method == "GET":
        return c.request("GET", path)
    return c.request("POST", path, body if body is not None else {})


def test_preempt_resume_replays_then_goes_live(client):
    t = tid()
    job = "job-" + t
    sb = client.create({"memory_mb": 256, "labels": {"job": job},
                        "trajectory": {"id": t, "checkpoint_every": 10}})
    sid = sb["id"]
    calls = episode()
    first = []
    for i, (m, suffix, body) in enumerate(calls[:25]):
        r = call(client, sid, m, suffix, body)
        assert r.status < 300, (i + 1, r.status, r.body)
        first.append(r)
    assert b"hello from the server" in first[19].body
    node_before = client.get("/v1/node").json
    # Preempt after call 25: checkpointed, deleted, its memory freed, its id gone (410).
    pr = client.post(f"/v1/jobs/{job}/preempt", {}, expect=200).json
    assert pr["affected"] == 1, pr
    assert pr["checkpointed"] == [{"sandbox": sid, "trajectory": t, "branch": 0, "seq": 25}], pr
    node_after = client.get("/v1/node").json
    assert (node_after["usage"]["memory_mb"] ==
            node_before["usage"]["memory_mb"] - 256), (node_before["usage"], node_after["usage"])
    client.get(f"/v1/sandboxes/{sid}", expect=410)
    info = client.get(f"/v1/trajectories/{t}", expect=200).json
    assert info["state"] == "preempted" and info["sandbox"] is None
    assert [e["seq"] for e in info["entries"]] == list(range(1, 26))
    # Every 10 mutating calls (a GET is not one), and at the preemption.
    mutating = [i + 1 for i, (m, _, _) in enumerate(calls[:25]) if m != "GET"]
    assert [c["seq"] for c in info["checkpoints"]] == [mutating[9], mutating[19], 25]
    assert info["checkpoints"][-1]["jobs"] == [10]  # the server, running at the checkpoint

    # Resume: a sandbox at once; calls 1-25 answered from the log, byte for byte.
    rs = client.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True},
                                       "labels": {"job": job}})
    assert rs.status == 201, rs.body
    rid = rs.json["id"]
    assert rid != sid
    for i, (m, suffix, body) in enumerate(calls[:25]):
        r = call(client, rid, m, suffix, body)
        assert r.status == first[i].status and r.body == first[i].body, (i + 1, r.body)
        assert r.headers.get("dsec-trajectory-replayed") == "1", i + 1
    # Not made yet: nothing ran.
    assert client.get(f"/v1/sandboxes/{rid}", expect=200).json["state"] == "creating"
    # Call 26 runs live, on the files of call 25; 27 shows no call ran twice; 30 finds the
    # background server started again.
    r26 = call(client, rid, *calls[25])
    assert r26.status == 200 and "dsec-trajectory-replayed" not in r26.headers
    assert r26.json["stdout"] == first[24].json["stdout"]
    r27 = call(client, rid, *calls[26])
    appended = sum(1 for m, _, b in calls[:25] if m == "POST" and b and "counter" in
                   b.get("shell", ""))
    assert r27.json["stdout"].strip() == str(appended)
    for m, suffix, body in calls[27:]:
        r = call(client, rid, m, suffix, body)
        assert r.status < 300, (suffix, r.body)
        shell = body.get("shell", "") if isinstance(body, dict) else ""
        if str(PORT) in shell and "counter" in shell:
            assert "hello from the server" in r.json["stdout"], r.body
    info = client.get(f"/v1/trajectories/{t}", expect=200).json
    assert info["state"] == "recording" and info["sandbox"] == rid
    assert len(info["entries"]) == 40 and len(info["branches"]) == 1

    # Again, differing at call 18: a fork, live from the state of call 17.
    client.remove(rid)
    wait_until(lambda: client.get(f"/v1/trajectories/{t}").json["state"] ==
               "stopped", 15, what="the trajectory stopped")
    rs = client.post(f"/v1/trajectories/{t}/resume", {}, expect=201).json
    fid = rs["id"]
    for i, (m, suffix, body) in enumerate(calls[:17]):
        r = call(client, fid, m, suffix, body)
        assert r.body == first[i].body and r.headers.get("dsec-trajectory-replayed") == "1"
    r18 = call(client, fid, "POST", "/exec", {"shell": "wc -l < /workspace/counter; ls /workspace"})
    assert r18.status == 200 and "dsec-trajectory-replayed" not in r18.headers
    appended17 = sum(1 for m, _, b in calls[:17] if m == "POST" and b and "counter" in
                     b.get("shell", ""))
    lines, files = r18.json["stdout"].split("\n", 1)
    assert lines.strip() == str(appended17), r18.body
    assert "f15.txt" in files and "f18.txt" not in files and "f21.txt" not in files
    info = client.get(f"/v1/trajectories/{t}", expect=200).json
    assert info["head"] == 1 and len(info["branches"]) == 2
    assert info["branches"][1]["parent"] == 0 and info["branches"][1]["fork_seq"] == 18
    assert [e["seq"] for e in info["entries"]] == list(range(1, 19))
    old = client.get(f"/v1/trajectories/{t}?branch=0", expect=200).json
    assert len(old["entries"]) == 40  # the old branch is kept
    metrics = client.get("/metrics").body.decode()
    for event in ("recorded", "replayed", "materialized", "checkpointed"):
        assert f'dsec_trajectory_events_total{{event="{event}"}}' in metrics, event
    client.remove(fid)


def test_a_long_replay_reads_the_log_ahead_in_pieces(client):
    """A resumed sandbox reads the log ahead (at most 32 entries and 64 KiB of bodies at a time,
    or one entry): 45 calls of ~20 KB answers each come back byte for byte across those pieces,
    then the next call runs live on the state of call 45."""
    t = tid()
    job = "job-" + t
    sid = client.create({"memory_mb": 128, "labels": {"job": job},
                         "trajectory": {"id": t, "checkpoint_every": 0}})["id"]
    calls = [{"shell": f"echo {n} >> /workspace/n; head -c 15000 /dev/urandom | base64"}
             for n in range(1, 46)]
    first = [client.post(f"/v1/sandboxes/{sid}/exec", b, expect=200).body for b in calls]
    assert all(len(b) > 20000 for b in first)
    client.post(f"/v1/jobs/{job}/preempt", {}, expect=200)
    rid = client.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}},
                      expect=201).json["id"]
    for i, b in enumerate(calls):
        r = client.post(f"/v1/sandboxes/{rid}/exec", b, expect=200)
        assert r.body == first[i] and r.headers.get("dsec-trajectory-replayed") == "1", i + 1
    r = client.post(f"/v1/sandboxes/{rid}/exec", {"shell": "wc -l < /workspace/n"}, expect=200)
    assert "dsec-trajectory-replayed" not in r.headers and r.json["stdout"].strip() == "45"
    client.remove(rid)


def test_kill9_loses_no_answered_entry(make_edge):
    edge = make_edge()
    c = edge.client()
    t = tid()
    sid = c.create({"trajectory": {"id": t}})["id"]
    outs = []
    for i in range(12):
        r = c.post(f"/v1/sandboxes/{sid}/exec", {"shell": f"echo {i}; date +%s%N"})
        assert r.status == 200
        outs.append(r.body)
    edge.kill9()
    edge.launch()
    c = edge.client()
    info = c.get(f"/v1/trajectories/{t}", expect=200).json
    assert [e["seq"] for e in info["entries"]] == list(range(1, 13))
    # It records on, after the entries it had.
    r = c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo after"})
    assert r.status == 200 and r.headers.get("dsec-trajectory-seq") is None
    info = c.get(f"/v1/trajectories/{t}", expect=200).json
    assert [e["seq"] for e in info["entries"]] == list(range(1, 14))
    c.remove(sid)


def test_trajectories_are_per_project(client):
    t = tid()
    a = {"Dsec-Project": "proj-a"}
    b = {"Dsec-Project": "proj-b"}
    sid = client.create({"trajectory": {"id": t}}, headers=a)["id"]
    client.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo hi"}, headers=a, expect=200)
    client.get(f"/v1/trajectories/{t}", headers=a, expect=200)
    assert client.get(f"/v1/trajectories/{t}", headers=b).status == 404
    assert client.get(f"/v1/trajectories/{t}").status == 404
    r = client.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}}, headers=b)
    assert r.status == 404, r.body
    # The same id is another trajectory in another project.
    other = client.create({"trajectory": {"id": t}}, headers=b)["id"]
    # Taken in its own project: 409.
    r = client.post("/v1/sandboxes", {"trajectory": {"id": t}}, headers=a)
    assert r.status == 409, r.body
    for s, h in ((sid, a), (other, b)):
        client.delete(f"/v1/sandboxes/{s}", headers=h, expect=204)


def test_bad_trajectory_requests(client):
    for body in ({"trajectory": "x"}, {"trajectory": {"id": "a/b"}}, {"trajectory": {}},
                 {"trajectory": {"id": "x", "bogus": 1}},
                 {"trajectory": {"id": "x", "resume": True, "checkpoint_every": 3}},
                 {"trajectory": {"id": "x"}, "count": 2},
                 {"trajectory": {"id": "x", "resume": True}, "image": "host"}):
        r = client.post("/v1/sandboxes", body)
        assert r.status == 400, (body, r.body)
        assert r.json["error"]["code"] == "bad_request"
    assert client.post("/v1/sandboxes", {"trajectory": {"id": tid(), "resume": True}}).status == 404
    assert client.get("/v1/trajectories/" + tid()).status == 404
    assert client.post("/v1/jobs/x/preempt", {"others": "keep"}).status == 400
    # A trajectory followed by a sandbox cannot be resumed or deleted under it.
    t = tid()
    sid = client.create({"trajectory": {"id": t}})["id"]
    assert client.post(f"/v1/trajectories/{t}/resume", {}).status == 409
    assert client.delete(f"/v1/trajectories/{t}").status == 409
    client.remove(sid)
    wait_until(lambda: client.delete(f"/v1/trajectories/{t}").status == 204, 15,
               what="the trajectory deleted")
    assert client.get(f"/v1/trajectories/{t}").status == 404


def test_preempt_others_snapshot_or_delete(client):
    job = "job-" + tid()
    plain = client.create({"labels": {"job": job}})["id"]
    client.put(f"/v1/sandboxes/{plain}/files?path=/workspace/keep.txt", b"kept", expect=204)
    pr = client.post(f"/v1/jobs/{job}/preempt", {"others": "snapshot"}, expect=200).json
    assert pr["affected"] == 1 and pr["snapshots"][0]["sandbox"] == plain, pr
    image = pr["snapshots"][0]["image"]
    client.get(f"/v1/sandboxes/{plain}", expect=410)
    again = client.create({"image": image})["id"]
    assert client.sh(again, "cat /workspace/keep.txt") == "kept"
    client.remove(again)
    client.delete(f"/v1/images/{image}", expect=204)


def test_expired_trajectories_are_collected(make_edge):
    """Retention: a trajectory past its TTL (per project over the node's) goes, with its bodies
    (a large one is a digest-named file) and its checkpoints' layers."""
    import os
    import sqlite3

    edge = make_edge(config={"trajectory_ttl_s": 3600, "trajectory_ttl_by_project": "short=2"})
    c = edge.client()
    short, long_ = {"Dsec-Project": "short"}, {"Dsec-Project": "long"}
    ids = {}
    for name, h in (("short", short), ("long", long_)):
        t = tid()
        sid = c.create({"trajectory": {"id": t, "checkpoint_every": 1}}, headers=h)["id"]
        big = os.urandom(100 << 10)  # over the inline limit: a file of its own
        c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/big.bin", big,
              headers=dict(h, **{"Content-Type": "application/octet-stream"}), expect=204)
        c.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo hi"}, headers=h, expect=200)
        c.delete(f"/v1/sandboxes/{sid}", headers=h, expect=204)
        ids[name] = t
    bodies = edge.state_dir / "trajectory-bodies"
    assert len(os.listdir(bodies)) == 2  # the two uploads (the same size, other bytes)
    layers_before = len(os.listdir(edge.state_dir / "images" / "layers"))
    assert layers_before >= 2  # the checkpoints
    wait_until(lambda: c.get(f"/v1/trajectories/{ids['short']}", headers=short).status == 404,
               20, what="the short-lived trajectory collected")
    c.get(f"/v1/trajectories/{ids['long']}", headers=long_, expect=200)
    # (The record goes first; its bodies and layers right after, on the same housekeeping pass.)
    wait_until(lambda: len(os.listdir(bodies)) == 1, 10, what="the short one's body collected")
    layers = edge.state_dir / "images" / "layers"
    wait_until(lambda: len(os.listdir(layers)) < layers_before, 10,
               what="the short one's checkpoint layers collected")
    db = sqlite3.connect(f"file:{edge.state_dir}/trajectories.db?mode=ro", uri=True)
    try:
        projects = {r[0] for r in db.execute("SELECT project FROM trajectories")}
        assert projects == {"long"}
        assert db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 2
        # Only the long one's bodies are left in the table (the exec's request and answer).
        assert db.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 2
    finally:
        db.close()


def test_a_resumed_sandbox_not_made_yet(client):
    """Until its first live call a resumed sandbox is counted, refuses what needs it made (409,
    not a wait), and expires by its TTL like any other; two resumes at once: one wins."""
    import threading

    t = tid()
    job = "job-" + t
    sid = client.create({"memory_mb": 128, "labels": {"job": job}, "trajectory": {"id": t}})["id"]
    client.post(f"/v1/sandboxes/{sid}/exec", {"shell": "echo one"}, expect=200)
    client.post(f"/v1/jobs/{job}/preempt", {}, expect=200)
    used = client.get("/v1/node").json["usage"]["memory_mb"]
    got = []

    def resume():
        c = type(client)(client.url, client.token)
        got.append(c.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True},
                                            "ttl_s": 2}))

    ts = [threading.Thread(target=resume) for _ in range(2)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    assert sorted(r.status for r in got) == [201, 409], [r.body for r in got]
    rid = next(r for r in got if r.status == 201).json["id"]
    assert client.get("/v1/node").json["usage"]["memory_mb"] == used + 128
    r = client.get(f"/v1/sandboxes/{rid}/stats")
    assert r.status == 409 and "first live call" in r.json["error"]["message"], r.body
    wait_until(lambda: client.get(f"/v1/sandboxes/{rid}").status == 410, 20,
               what="the resumed sandbox reaped by its ttl")
    assert client.get("/v1/node").json["usage"]["memory_mb"] == used
    wait_until(lambda: client.get(f"/v1/trajectories/{t}").json["sandbox"] is None, 15,
               what="the trajectory let go")
    again = client.post("/v1/sandboxes", {"trajectory": {"id": t, "resume": True}}, expect=201)
    client.remove(again.json["id"])
