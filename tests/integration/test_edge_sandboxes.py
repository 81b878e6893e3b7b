"""Sandbox lifecycle on a live edge: create/get/list/patch/delete, count, ?wait=0, labels and
pagination, stats, jobs, TTL and idle TTL, pause/resume; and every kind of bad input."""

import glob
import json
import os
import time
import uuid

import pytest

from edge_harness import KIND, wait_until

SB_KEYS = {"id", "kind", "state", "node", "image", "created_at", "expires_at", "ttl_s",
           "idle_ttl_s", "last_used_at", "limits", "user", "workdir", "network", "labels",
           "project",
           "reason"}


def uniq(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def listed(client, **query):
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    return client.get(f"/v1/sandboxes?{qs}", expect=200).json


# ---- create / get / delete ----------------------------------------------------------------

def test_create_get_delete_full_record(client):
    body = {"kind": "container", "image": "host", "cpu": 0.5, "memory_mb": 256, "pids": 128,
            "disk_mb": 64, "ttl_s": 300, "idle_ttl_s": 0, "user": "sandbox",
            "workdir": "/workspace", "env": {"GREETING": "hi"}, "labels": {"job": uniq("j")},
            "network": {"mode": "none"}, "pool": None}
    t0 = int(time.time() * 1000)
    sb = client.create(body)
    try:
        assert set(sb) == SB_KEYS
        assert sb["id"].startswith("sb-it-")
        assert sb["state"] == "running" and sb["node"] == "it" and sb["kind"] == "container"
        assert sb["limits"] == {"cpu": 0.5, "memory_mb": 256, "pids": 128, "disk_mb": 64}
        assert sb["labels"] == body["labels"] and sb["network"] == {"mode": "none"}
        assert sb["reason"] is None and sb["user"] == "sandbox"
        assert t0 - 5000 <= sb["created_at"] <= t0 + 60000
        assert sb["expires_at"] == sb["created_at"] + 300 * 1000
        got = client.get(f"/v1/sandboxes/{sb['id']}", expect=200).json
        assert got["id"] == sb["id"] and got["state"] == "running"
        # env and workdir reach the command; the user is the sandbox user.
        r = client.exec(sb["id"], 'echo "$GREETING $(pwd) $(id -u)"')
        assert r["stdout"] == "hi /workspace 1000\n"
    finally:
        client.delete(f"/v1/sandboxes/{sb['id']}", expect=204)
    client.get(f"/v1/sandboxes/{sb['id']}", expect=404)
    r = client.delete(f"/v1/sandboxes/{sb['id']}", expect=404)
    assert r.json["error"]["code"] == "not_found"
    client.post(f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["true"]}, expect=404)


def test_defaults_and_empty_body(client):
    r = client.post("/v1/sandboxes", None, expect=201)
    sb = r.json
    try:
        assert sb["limits"] == {"cpu": 1.0, "memory_mb": 512, "pids": 256, "disk_mb": 256}
        assert sb["ttl_s"] == 3600 and sb["idle_ttl_s"] == 0 and sb["workdir"] == "/workspace"
    finally:
        client.remove(sb["id"])


def test_root_user_and_uid_gid(client):
    sb = client.create({"user": "root"})
    sb2 = client.create({"user": "1234:2345"})
    try:
        assert client.sh(sb["id"], "id -u") == "0\n"
        assert client.sh(sb2["id"], "echo $(id -u):$(id -g)") == "1234:2345\n"
    finally:
        client.remove(sb["id"])
        client.remove(sb2["id"])


def test_count_creates_many(client):
    job = uniq("cnt")
    r = client.post("/v1/sandboxes", {"count": 3, "memory_mb": 64, "labels": {"job": job}},
                    expect=201).json
    ids = [s["id"] for s in r["sandboxes"]]
    try:
        assert len(set(ids)) == 3
        assert all(s["state"] == "running" for s in r["sandboxes"])
        for sid in ids:
            assert client.sh(sid, "echo ok") == "ok\n"
    finally:
        assert client.delete(f"/v1/jobs/{job}", expect=200).json == {"affected": 3}
    for sid in ids:  # removed with their job: gone, and why
        assert client.get(f"/v1/sandboxes/{sid}", expect=410).json["error"]["reason"] == "job"
    # count: 1 still answers with a list.
    r = client.post("/v1/sandboxes", {"count": 1, "memory_mb": 64}, expect=201).json
    assert len(r["sandboxes"]) == 1
    client.remove(r["sandboxes"][0]["id"])


def test_wait_0_then_calls_wait_for_readiness(client):
    r = client.post("/v1/sandboxes?wait=0", {"memory_mb": 64}, expect=201).json
    try:
        assert r["state"] in ("creating", "running")
        # Any call on a sandbox being created waits until it is ready.
        assert client.sh(r["id"], "echo ready") == "ready\n"
        assert client.get(f"/v1/sandboxes/{r['id']}", expect=200).json["state"] == "running"
    finally:
        client.remove(r["id"])
    # Deleting one that is still being created is fine too.
    r = client.post("/v1/sandboxes?wait=0", {"memory_mb": 64}, expect=201).json
    client.delete(f"/v1/sandboxes/{r['id']}", expect=204)
    client.get(f"/v1/sandboxes/{r['id']}", expect=404)


# ---- list, labels, pagination, patch ------------------------------------------------------

def test_list_filters_and_pagination(client):
    job = uniq("page")
    r = client.create({"count": 5, "memory_mb": 64, "labels": {"job": job, "team": "a"}})
    ids = {s["id"] for s in r["sandboxes"]}
    other = client.create({"memory_mb": 64, "labels": {"job": job, "team": "b"}})
    try:
        all_ = listed(client, label=f"job={job}", limit=1000)
        assert {s["id"] for s in all_["sandboxes"]} == ids | {other["id"]}
        assert all_["next_cursor"] is None
        # Labels are ANDed.
        both = client.get(f"/v1/sandboxes?label=job={job}&label=team=a", expect=200).json
        assert {s["id"] for s in both["sandboxes"]} == ids
        # "unavailable" (an apiserver's state for a lost node's sandboxes) is none on an edge.
        assert listed(client, label=f"job={job}", state="unavailable") == {
            "sandboxes": [], "next_cursor": None}
        # Pages of 2: 3 pages, no duplicates, cursor null at the end.
        seen, cursor, pages = [], None, 0
        while True:
            q = f"/v1/sandboxes?label=job={job}&label=team=a&limit=2"
            if cursor:
                q += f"&cursor={cursor}"
            page = client.get(q, expect=200).json
            pages += 1
            assert len(page["sandboxes"]) <= 2
            seen += [s["id"] for s in page["sandboxes"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and len(seen) == 5 and set(seen) == ids
        # State and kind filters.
        assert len(listed(client, label=f"job={job}", state="running")["sandboxes"]) == 6
        assert listed(client, label=f"job={job}", state="paused")["sandboxes"] == []
        kind, other_kind = (KIND, "container") if KIND else ("container", "microvm")
        assert len(listed(client, label=f"job={job}", kind=kind)["sandboxes"]) == 6
        assert listed(client, label=f"job={job}", kind=other_kind)["sandboxes"] == []
        assert listed(client, label=f"nolabel={job}")["sandboxes"] == []
    finally:
        client.delete(f"/v1/jobs/{job}", expect=200)
    assert listed(client, label=f"job={job}")["sandboxes"] == []


@pytest.mark.parametrize("query", ["limit=0", "limit=-1", "limit=1001", "limit=abc",
                                   "limit=99999999999999999999", "state=bogus", "label=novalue",
                                   "label==x", "cursor=garbage"])
def test_list_bad_query(client, query):
    r = client.get(f"/v1/sandboxes?{query}", expect=400, validate=False)
    assert r.json["error"]["code"] == "bad_request"


def test_patch(client):
    sb = client.create({"labels": {"a": "1", "b": "2"}, "ttl_s": 60})
    sid = sb["id"]
    try:
        before = int(time.time() * 1000)
        r = client.patch(f"/v1/sandboxes/{sid}", {"ttl_s": 7200, "labels": {"a": None, "c": "3"},
                                                  "idle_ttl_s": 900,
                                                  "network": {"mode": "none"}},
                         expect=200).json
        assert r["labels"] == {"b": "2", "c": "3"}
        assert r["idle_ttl_s"] == 900 and r["ttl_s"] == 7200  # the record shows the new TTL
        assert before + 7200 * 1000 - 5000 <= r["expires_at"] <= before + 7200 * 1000 + 60000
        assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["labels"] == r["labels"]
        # ttl_s 0 is no TTL: expires_at null, never reaped for time; a TTL can come back.
        r = client.patch(f"/v1/sandboxes/{sid}", {"ttl_s": 0}, expect=200).json
        assert r["ttl_s"] == 0 and r["expires_at"] is None
        assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["expires_at"] is None
        r = client.patch(f"/v1/sandboxes/{sid}", {"ttl_s": 7200}, expect=200).json
        assert before + 7200 * 1000 - 5000 <= r["expires_at"] <= before + 7200 * 1000 + 60000
        for bad in ({"ttl_s": -1}, {"ttl_s": "5"}, {"labels": {"k": 5}}, {"labels": []},
                    {"nope": 1}, {"network": {"mode": "wide"}}, {"labels": {"bad key": "v"}},
                    {"labels": {"k" * 64: "v"}}, {"labels": {"k": "v" * 257}}):
            r = client.patch(f"/v1/sandboxes/{sid}", bad, expect=400)
            assert r.json["error"]["code"] == "bad_request", bad
        # This edge runs with network: false (edge_harness): no mode but none.
        r = client.patch(f"/v1/sandboxes/{sid}", {"network": {"mode": "allowlist", "rules": []}},
                         expect=422)
        assert "network: false" in r.json["error"]["message"]
        client.patch("/v1/sandboxes/sb-it-doesnotexist", {"ttl_s": 5}, expect=404)
    finally:
        client.remove(sid)


# ---- bad input on create ------------------------------------------------------------------

BAD_CREATE = [
    ("{", 400), ("[1,2]", 400), ('"x"', 400), ("null", 400), ('{"memory_mb": 256,}', 400),
    ({"bogus": 1}, 400), ({"memory_mb": "512"}, 400), ({"memory_mb": 512.5}, 400),
    ({"memory_mb": True}, 400), ({"memory_mb": -1}, 400), ({"memory_mb": 15}, 400),
    ({"memory_mb": 10**30}, 400), ({"memory_mb": 2**64}, 400), ({"memory_mb": -2**63}, 400),
    ({"cpu": 0}, 400), ({"cpu": -1}, 400), ({"cpu": 65}, 400), ({"cpu": "1"}, 400),
    ({"pids": 7}, 400), ({"disk_mb": 0}, 400), ({"ttl_s": -1}, 400), ({"ttl_s": 2592001}, 400),
    ({"idle_ttl_s": -1}, 400), ({"count": 0}, 400), ({"count": 257}, 400),
    ({"count": "2"}, 400), ({"workdir": "relative/dir"}, 400), ({"workdir": ""}, 400),
    ({"workdir": "/a\u0000b"}, 400), ({"env": {"A=B": "x"}}, 400), ({"env": {"A": 1}}, 400),
    ({"env": ["A"]}, 400), ({"env": {"A": "x\u0000y"}}, 400), ({"labels": {"": "x"}}, 400),
    ({"labels": {"bad key": "x"}}, 400), ({"labels": {"k": "v" * 257}}, 400),
    ({"labels": {f"k{i}": "v" for i in range(65)}}, 400), ({"user": "nosuchuser!"}, 400),
    ({"user": 1000}, 400), ({"kind": "vm"}, 400), ({"kind": "microvm", "image": "host"}, 422),
    ({"image": "nosuch:image"}, 404), ({"network": {"mode": "allowlist"}}, 422),
    ({"network": {"mode": "wide-open"}}, 400), ({"network": "none"}, 400),
    ({"network": {"mode": "none", "extra": 1}}, 400), ({"pool": "warm"}, 404),
    ({"request_id": 5}, 400), ({"request_id": "x" * 129}, 400), ({"request_id": "a\tb"}, 400),
]


@pytest.mark.parametrize("body,status", BAD_CREATE, ids=[str(i) for i in range(len(BAD_CREATE))])
def test_create_rejects_bad_input(client, body, status):
    before = len(listed(client, limit=1000)["sandboxes"])
    raw = body if isinstance(body, str) else json.dumps(body)
    r = client.post("/v1/sandboxes", raw, headers={"Content-Type": "application/json"},
                    validate=False)
    assert r.status == status, (body, r)
    client.check(r)  # the error is a JSON body whose code fits the status, per the spec
    assert len(listed(client, limit=1000)["sandboxes"]) == before  # nothing was created


@pytest.mark.parametrize("path,status", [
    ("/v1/sandboxes/sb%2Fx", 400), ("/v1/sandboxes/..", 400), ("/v1/sandboxes/a..b", 400),
    ("/v1/sandboxes/%2E%2E", 400), ("/v1/sandboxes/sb%00x", 400), ("/v1/sandboxes/sb%0Ax", 400),
    ("/v1/sandboxes/sb%20x", 400), ("/v1/sandboxes/" + "a" * 129, 400),
    ("/v1/sandboxes/sb%zz", 400), ("/v1/sandboxes/sb-it-unknown", 404),
    ("/v1/sandboxes/sb-it-unknown/stats", 404), ("/v1/sandboxes/..%2F..%2Fetc/stats", 400),
])
def test_bad_and_unknown_ids(client, path, status):
    for method in ("GET", "DELETE"):
        p = path if method == "GET" or path.count("/") == 3 else path.rsplit("/", 1)[0]
        r = client.request(method, p, validate=False)
        assert r.status == status, (method, p, r)
        client.check(r, validate=False)


def test_ids_in_other_routes(client, sandbox):
    for p in [f"/v1/sandboxes/{sandbox}/execs/..", f"/v1/sandboxes/{sandbox}/execs/a%2Fb",
              f"/v1/sandboxes/{sandbox}/execs/ex%00x"]:
        assert client.get(p, validate=False).status == 400
    client.get(f"/v1/sandboxes/{sandbox}/execs/ex-unknown", expect=404)
    client.post(f"/v1/sandboxes/{sandbox}/shells/a..b/run", {"command": "true"}, expect=400,
                validate=False)
    client.post(f"/v1/sandboxes/{sandbox}/shells/sh-unknown/run", {"command": "true"},
                expect=404)
    client.delete(f"/v1/sandboxes/{sandbox}/shells/sh-unknown", expect=404)


# ---- stats --------------------------------------------------------------------------------

def test_stats(client, sandbox):
    s0 = client.get(f"/v1/sandboxes/{sandbox}/stats", expect=200).json
    client.sh(sandbox, "head -c 3000000 /dev/zero > /workspace/blob")
    s1 = client.get(f"/v1/sandboxes/{sandbox}/stats", expect=200).json
    assert s1["exec_count"] >= s0["exec_count"] + 1
    assert s1["disk_used"] >= 3000000
    assert s1["memory_limit"] >= 256 << 20
    assert s1["disk_limit"] == 256 << 20
    assert s1["pids"] >= 1 and s1["oom_kills"] == 0
    assert s1["memory_peak"] >= s1["memory_current"] > 0


# ---- jobs ---------------------------------------------------------------------------------

def test_jobs_pause_resume_delete(client):
    job = uniq("job")
    ids = [s["id"] for s in client.post("/v1/sandboxes", {"count": 3, "memory_mb": 64,
                                                          "labels": {"job": job}},
                                        expect=201).json["sandboxes"]]
    keep = client.create({"memory_mb": 64, "labels": {"job": job + "-other"}})
    try:
        assert client.post(f"/v1/jobs/{job}/pause", expect=200).json == {"affected": 3}
        assert {s["state"] for s in listed(client, label=f"job={job}")["sandboxes"]} == {"paused"}
        assert client.post(f"/v1/jobs/{job}/resume", expect=200).json == {"affected": 3}
        assert {s["state"] for s in listed(client, label=f"job={job}")["sandboxes"]} == {
            "running"}
        assert client.delete(f"/v1/jobs/{job}", expect=200).json == {"affected": 3}
        for sid in ids:  # gone with their job: 410 and why
            assert client.get(f"/v1/sandboxes/{sid}", expect=410).json["error"]["reason"] == "job"
        assert client.get(f"/v1/sandboxes/{keep['id']}", expect=200).json["state"] == "running"
        assert client.delete(f"/v1/jobs/{job}", expect=200).json == {"affected": 0}
        client.delete("/v1/jobs/" + "j" * 300, expect=400, validate=False)
    finally:
        client.remove(keep["id"])


# ---- TTL and idle TTL ---------------------------------------------------------------------

def test_ttl_expiry_deletes(client, edge):
    forever = client.create({"ttl_s": 0, "memory_mb": 64})  # no TTL
    assert forever["expires_at"] is None and forever["ttl_s"] == 0
    sb = client.create({"ttl_s": 1, "memory_mb": 64, "labels": {"ttl": "1"}})
    sid = sb["id"]
    assert sb["expires_at"] - sb["created_at"] == 1000
    cg = edge.sandbox_cgroup_dirs(sid)
    assert cg, "the sandbox has cgroups while it runs"
    wait_until(lambda: client.get(f"/v1/sandboxes/{sid}").status == 410, 15,
               interval=0.1, what="ttl expiry")
    assert client.get(f"/v1/sandboxes/{forever['id']}", expect=200).json["state"] == "running"
    client.remove(forever["id"])
    wait_until(lambda: not edge.sandbox_cgroup_dirs(sid), 10, what="cgroups removed")
    # An expired sandbox is not one that never existed: 410 gone, with the reason and time.
    before = int(time.time() * 1000)
    err = client.get(f"/v1/sandboxes/{sid}", expect=410).json["error"]
    assert err["code"] == "gone" and err["reason"] == "ttl", err
    assert sb["expires_at"] <= err["at"] <= before, (sb, err)
    assert "ttl" in err["message"], err
    r = client.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, expect=410)
    assert r.json["error"]["reason"] == "ttl"
    client.get(f"/v1/sandboxes/{sid}/files?path=/etc/hostname", expect=410)
    # An explicit delete of it is still 404 (a retried delete is done), and stays so.
    client.delete(f"/v1/sandboxes/{sid}", expect=404)
    client.get(f"/v1/sandboxes/{sid}", expect=410)
    assert sid not in {s["id"] for s in listed(client, limit=1000)["sandboxes"]}


def test_idle_ttl(client):
    sb = client.create({"idle_ttl_s": 2, "memory_mb": 64})
    sid = sb["id"]
    try:
        # Calls keep it alive: 3.5 s of activity, more than the idle TTL.
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            client.sh(sid, "true")
            time.sleep(0.2)
        assert client.get(f"/v1/sandboxes/{sid}").status == 200
        # Then quiet: listing does not count as use, so it goes.
        wait_until(lambda: sid not in {s["id"] for s in listed(client, limit=1000)["sandboxes"]},
                   15, interval=0.2, what="idle expiry")
        err = client.get(f"/v1/sandboxes/{sid}", expect=410).json["error"]
        assert err["reason"] == "idle", err
    finally:
        client.remove(sid)


# ---- pause / resume -----------------------------------------------------------------------

def vcpu_ticks(edge, sid):
    """The CPU time (clock ticks) of a microVM's vCPU threads ("CPU 0/KVM", "ALL CPUs/TCG"):
    it stands still while the VM is stopped, and a guest running a loop moves it."""
    total = None
    for pid in edge.sandbox_pids(sid):
        for task in glob.glob(f"/proc/{pid}/task/*"):
            try:
                with open(f"{task}/comm") as f:
                    if "CPUs/" not in (comm := f.read()) and not comm.startswith("CPU "):
                        continue
                with open(f"{task}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total = (total or 0) + int(fields[11]) + int(fields[12])  # utime + stime
    return total


def read_counter(edge, sid):
    """Reads /workspace/counter from the host through a sandbox process's root: it works on
    a frozen sandbox without going through the API (which would resume it). A microVM's files
    are in its guest: there, its vCPUs' CPU time stands for the counter."""
    if KIND == "microvm":
        return vcpu_ticks(edge, sid)
    for pid in edge.sandbox_pids(sid):
        try:
            with open(f"/proc/{pid}/root/workspace/counter") as f:
                text = f.read().strip()
            return int(text) if text else 0
        except (OSError, ValueError):
            continue
    return None


def test_pause_freezes_and_resume_continues(client, edge, sandbox):
    sid = sandbox
    client.post(f"/v1/sandboxes/{sid}/exec", {
        "shell": "i=0; while :; do i=$((i+1)); echo $i > /workspace/counter.tmp; "
                 "mv /workspace/counter.tmp /workspace/counter; sleep 0.02; done",
        "background": True}, expect=202)
    if KIND == "microvm":  # (read through the guest while it runs)
        wait_until(lambda: int(client.exec(sid, "cat /workspace/counter || echo 0")["stdout"]
                               or 0) > 3, 30, interval=0.5, what="counter running")
    wait_until(lambda: (read_counter(edge, sid) or 0) > 3, 10, what="counter running")
    r = client.post(f"/v1/sandboxes/{sid}/pause", expect=200).json
    assert r["state"] == "paused"
    assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "paused"
    # GET and list do not resume it.
    assert listed(client, state="paused", limit=1000)["sandboxes"]
    frozen = read_counter(edge, sid)
    # Frozen: the value stays put over many observations (longer than 20 loop turns).
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert read_counter(edge, sid) == frozen
        time.sleep(0.05)
    assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "paused"
    # Pausing again is harmless.
    assert client.post(f"/v1/sandboxes/{sid}/pause", expect=200).json["state"] == "paused"
    r = client.post(f"/v1/sandboxes/{sid}/resume", expect=200).json
    assert r["state"] == "running"
    wait_until(lambda: (read_counter(edge, sid) or 0) > frozen + 3, 10, what="counter advancing")
    # Transparent resume: an exec on a paused sandbox resumes it first.
    client.post(f"/v1/sandboxes/{sid}/pause", expect=200)
    frozen = read_counter(edge, sid)
    out = client.sh(sid, "cat /workspace/counter")
    assert int(out) >= (0 if KIND == "microvm" else frozen)
    assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "running"
    wait_until(lambda: (read_counter(edge, sid) or 0) > frozen + 3, 10, what="counter after exec")
    # Files and shells resume it too.
    client.post(f"/v1/sandboxes/{sid}/pause", expect=200)
    client.get(f"/v1/sandboxes/{sid}/files?path=/workspace/counter", expect=200)
    assert client.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "running"
    client.post(f"/v1/sandboxes/{sid}/resume", expect=200)  # resume of a running one: fine
    client.post(f"/v1/sandboxes/{sid}/pause", {"bogus": 1}, expect=400)
    client.post("/v1/sandboxes/sb-it-unknown/pause", expect=404)
    client.post(f"/v1/sandboxes/{sid}/signal", {"signal": "KILL"}, expect=200)


def test_delete_paused_sandbox(client, edge):
    sb = client.create({"memory_mb": 64})
    client.post(f"/v1/sandboxes/{sb['id']}/pause", expect=200)
    client.delete(f"/v1/sandboxes/{sb['id']}", expect=204)
    wait_until(lambda: not edge.sandbox_cgroup_dirs(sb["id"]), 10, what="cgroups removed")


def test_unknown_state_dir_entries_untouched(edge):
    # The edge keeps its state in its state dir: the sqlite db is there.
    names = os.listdir(edge.state_dir)
    assert "state.db" in names and "edge.lock" in names


def test_agent_death_marks_failed(client, edge):
    sb = client.create({"memory_mb": 64})
    sid = sb["id"]
    # A microVM's agent runs in its guest: its whole machine (QEMU) dies instead.
    process = b"qemu-system" if KIND == "microvm" else b"dsec-agent"
    agents = [p for p in edge.sandbox_pids(sid)
              if process in open(f"/proc/{p}/cmdline", "rb").read()]
    assert agents, edge.sandbox_pids(sid)
    os.kill(agents[0], 9)
    rec = wait_until(lambda: (lambda r: r if r["state"] == "failed" else None)(
        client.get(f"/v1/sandboxes/{sid}", expect=200).json), 20, interval=0.1,
        what="state failed")
    assert rec["reason"], rec
    assert listed(client, state="failed", limit=1000)["sandboxes"]
    r = client.post(f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}, expect=409)
    assert r.json["error"]["code"] == "conflict"
    wait_until(lambda: not edge.sandbox_pids(sid), 10, what="failed sandbox torn down")
    client.delete(f"/v1/sandboxes/{sid}", expect=204)
    client.get(f"/v1/sandboxes/{sid}", expect=404)
    wait_until(lambda: not edge.sandbox_cgroup_dirs(sid), 10, what="cgroups removed")


JSON_ENDPOINTS = [
    ("POST", "/v1/sandboxes"), ("PATCH", "/v1/sandboxes/{id}"),
    ("POST", "/v1/sandboxes/{id}/exec"), ("POST", "/v1/sandboxes/{id}/signal"),
    ("POST", "/v1/sandboxes/{id}/shells"), ("POST", "/v1/sandboxes/{id}/pause"),
    ("POST", "/v1/sandboxes/{id}/resume"), ("POST", "/v1/jobs/somejob/pause"),
    ("POST", "/v1/jobs/somejob/resume"),
]


@pytest.mark.parametrize("method,template", JSON_ENDPOINTS)
def test_json_bodies_are_strict_everywhere(client, sandbox, method, template):
    path = template.format(id=sandbox)
    for raw in ('{"a":', "[]", "7", '"str"', '{"unknown_field_x": 1}', "\xff\xfe",
                '{"request_id": 12}'):
        r = client.request(method, path, raw.encode("utf-8", "surrogateescape")
                           if isinstance(raw, str) else raw,
                           headers={"Content-Type": "application/json"}, validate=False)
        assert r.status == 400, (method, path, raw, r)
        client.check(r)
    # Deep nesting does not crash the parser.
    r = client.request(method, path, "[" * 100000 + "]" * 100000,
                       headers={"Content-Type": "application/json"}, validate=False)
    assert r.status in (400, 413), r
    assert client.get("/v1/health", expect=200)


@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/images/import?name=x:1"), ("POST", "/v1/images/build"),
    ("DELETE", "/v1/images/x:1"), ("GET", "/v1/nodes"),
    ("POST", "/v1/sandboxes/sb-it-x/snapshot"), ("POST", "/v1/sandboxes/sb-it-x/fork"),
])
def test_not_served_here_is_a_json_error(client, method, path):
    r = client.request(method, path, {} if method in ("POST", "PUT") else None,
                       validate=False)
    assert 400 <= r.status < 500, r
    client.check(r, validate=False)


SCANDIR_VS_STAT = r"""
import os
checked, bad = 0, []
for d in ["/", "/etc", "/usr", "/usr/lib", "/workspace", "/tmp"]:
    dev = os.stat(d).st_dev
    for e in os.scandir(d):
        try:
            st = os.stat(e.path, follow_symlinks=False)
        except OSError:
            continue
        if st.st_dev != dev:  # a mount point: its readdir entry is the covered directory's
            continue
        checked += 1
        if e.inode() != st.st_ino:
            bad.append((e.path, e.inode(), st.st_ino))
print(checked, len(bad), bad[:5])
"""


def test_readdir_inode_numbers_match_stat(client):
    """The overlay root behaves like one filesystem (issue 41, item 11): os.scandir's inode
    numbers (readdir's d_ino) equal stat's st_ino for every entry that is not a mount point,
    in merged directories of the image and in the sandbox's own."""
    sb = client.create({})
    try:
        client.sh(sb["id"], "mkdir -p /workspace/d && touch /workspace/f /etc/new-file", user="root")
        r = client.exec(sb["id"], cmd=["python3", "-c", SCANDIR_VS_STAT])
        assert r["exit_code"] == 0, r
        out = r["stdout"]
        checked, bad = out.split(" ", 2)[:2]
        assert int(checked) > 50 and bad == "0", out
    finally:
        client.remove(sb["id"])


CPU_VIEW = ("import os, subprocess; "
            "print(os.cpu_count(), len(os.sched_getaffinity(0)), "
            "subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip(), "
            "sorted(os.sched_getaffinity(0)))")


def test_a_sandbox_sees_its_cpu_cap_as_its_cpus(make_edge):
    """Issue 41 item 10: a sandbox capped at `cpu` runs on (and is shown) ceil(cpu) CPUs —
    os.cpu_count() (glibc reads /sys/devices/system/cpu/online), sched_getaffinity and nproc
    agree — and sandboxes of one CPU are spread over the node's cores; a cap of every usable
    CPU shows them all."""
    node_cpus = len(os.sched_getaffinity(0))
    if node_cpus < 2:
        pytest.skip("a single-CPU host shows every sandbox its one CPU")
    client = make_edge().client()  # its own edge: no other sandbox is pinned anywhere
    ids = []
    try:
        seen = set()
        for _ in range(node_cpus):
            sb = client.create({"cpu": 0.5})
            ids.append(sb["id"])
            r = client.exec(sb["id"], cmd=["python3", "-c", CPU_VIEW])
            assert r["exit_code"] == 0, r
            count, aff, nproc, cpus = r["stdout"].split(" ", 3)
            assert (count, aff, nproc) == ("1", "1", "1"), r["stdout"]
            seen.add(cpus.strip())
        # One sandbox per CPU, each on another: they spread. (A guest numbers its own vCPUs
        # from 0; its QEMU is not pinned: the host's scheduler places its threads.)
        assert len(seen) == (1 if KIND == "microvm" else node_cpus), seen
        whole = client.create({"cpu": node_cpus})
        ids.append(whole["id"])
        r = client.exec(whole["id"], cmd=["python3", "-c", CPU_VIEW])
        count, aff, nproc, _ = r["stdout"].split(" ", 3)
        assert (count, aff, nproc) == (str(node_cpus),) * 3, r["stdout"]
    finally:
        for sid in ids:
            client.remove(sid)
