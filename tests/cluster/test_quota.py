"""Quota chains (issue 37) on real etcd, two apiservers and real edges: limits at the
organisation, project and token levels on concurrent sandboxes, memory, CPU and the create
rate; exact under concurrent creates through both apiservers; usage that converges after an
apiserver dies holding quota and after an edge is lost and comes back."""

import base64
import json
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import cluster_harness
from cluster_harness import call
from edge_harness import wait_until


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    yield from cluster_harness.module_cluster(tmp_path_factory, "quota", edges=2, apiservers=2)


def new_project(c):
    p = f"q-{uuid.uuid4().hex[:6]}"
    assert call(c, "POST", "/v1/projects", {"name": p})[0] == 201
    for i in (0, 1):
        wait_until(lambda: call(c, "GET", f"/v1/projects/{p}", i=i)[0] == 200, 5,
                   what=f"apiserver {i} seeing {p}")
    return p


def new_token(c, project, name="worker", role="member"):
    s, t = call(c, "POST", f"/v1/projects/{project}/tokens", {"name": name, "role": role})
    assert s == 201, (s, t)
    for i in (0, 1):
        wait_until(lambda: call(c, "GET", "/v1/sandboxes", token=t["token"], i=i)[0] == 200, 5,
                   what=f"apiserver {i} taking the token")
    return t["token"]


def set_quota(c, path, i=0, **limits):
    s, out = call(c, "PATCH", path, limits, i=i)
    assert s == 200, (s, out)
    # Both apiservers hold the limits before a test leans on them.
    for k in (0, 1):
        wait_until(lambda: all(call(c, "GET", path, i=k)[1]["limits"].get(n) == v
                               for n, v in limits.items()), 5, what=f"apiserver {k} limits")
    return out


def etcd_keys(c, prefix):
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(prefix[:-1].encode() +
                                                     bytes([ord(prefix[-1]) + 1])).decode()})
    req = urllib.request.Request(c.etcd_url + "/v3/kv/range", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        kvs = json.loads(r.read()).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
            for kv in kvs}


def create_many(c, n, token, body, project=None):
    """n creates at once, alternating between the two apiservers: [(status, body)]."""
    def one(k):
        return call(c, "POST", "/v1/sandboxes", {"ttl_s": 600, **body}, token=token, i=k % 2,
                    project=project)
    with ThreadPoolExecutor(max_workers=min(n, 48)) as ex:
        return list(ex.map(one, range(n)))


def remove_all(c, project):
    ids = [x["id"] for x in call(c, "GET", "/v1/sandboxes?limit=1000", project=project)[1]
           ["sandboxes"]]
    with ThreadPoolExecutor(max_workers=16) as ex:
        codes = list(ex.map(lambda i: call(c, "DELETE", f"/v1/sandboxes/{i}",
                                           project=project)[0], ids))
    assert all(code == 204 for code in codes), codes


def usage(c, path, i=0):
    return call(c, "GET", path, i=i)[1]


def refusals(results):
    return [b for s, b in results if s == 429]


def test_quota_routes_roles_and_bad_input(cl):
    p = new_project(cl)
    member = new_token(cl, p)
    s, out = call(cl, "GET", f"/v1/projects/{p}/quota")
    assert s == 200 and out["level"] == f"project/{p}", out
    assert out["limits"] == {"sandboxes": None, "memory_mb": None, "cpu": None,
                             "creates_per_s": None, "parent": None}, out
    assert out["usage"] == {"sandboxes": 0, "memory_mb": 0, "cpu": 0}, out
    out = set_quota(cl, f"/v1/projects/{p}/quota", sandboxes=3, cpu=1.5)
    assert out["limits"]["sandboxes"] == 3 and out["limits"]["cpu"] == 1.5, out
    # PATCH keeps what it does not name; null removes a limit.
    out = set_quota(cl, f"/v1/projects/{p}/quota", memory_mb=1024)
    assert out["limits"] == {"sandboxes": 3, "memory_mb": 1024, "cpu": 1.5,
                             "creates_per_s": None, "parent": None}, out
    out = set_quota(cl, f"/v1/projects/{p}/quota", cpu=None)
    assert out["limits"]["cpu"] is None and out["limits"]["sandboxes"] == 3, out
    for bad in ({"sandboxes": -1}, {"sandboxes": "3"}, {"cpu": "x"}, {"nope": 1}, [1],
                {"memory_mb": 1.5}, {"parent": p}, {"parent": "nosuch-proj"}, {"parent": 5}):
        s, e = call(cl, "PATCH", f"/v1/projects/{p}/quota", bad)
        assert s == 400 and e["error"]["code"] == "bad_request", (bad, s, e)
    # The member reads its own project's quota and its token's, changes none; the org's is
    # an admin's to see; another project's is not there.
    assert call(cl, "GET", f"/v1/projects/{p}/quota", token=member)[0] == 200
    assert call(cl, "GET", f"/v1/projects/{p}/tokens/worker/quota", token=member)[0] == 200
    assert call(cl, "PATCH", f"/v1/projects/{p}/quota", {"sandboxes": 9}, token=member)[0] == 403
    assert call(cl, "GET", "/v1/quota", token=member)[0] == 403
    assert call(cl, "GET", "/v1/projects/default/quota", token=member)[0] == 404
    assert call(cl, "GET", f"/v1/projects/{p}/tokens/nosuch/quota")[0] == 404
    assert call(cl, "GET", "/v1/projects/nosuch-proj/quota")[0] == 404
    s, out = call(cl, "GET", "/v1/quota")
    assert s == 200 and out["level"] == "org", out
    # A project removed takes its limits with it.
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
    assert not [k for k in etcd_keys(cl, "/dsec/quotas/") if f"/{p}" in k]


def test_200_creates_over_two_apiservers_against_50_make_exactly_50(cl):
    p = new_project(cl)
    token = new_token(cl, p)
    set_quota(cl, f"/v1/projects/{p}/quota", sandboxes=50)
    results = create_many(cl, 200, token, {"memory_mb": 64})
    made = [b for s, b in results if s == 201]
    refused = refusals(results)
    others = [(s, b) for s, b in results if s not in (201, 429)]
    assert not others, others[:3]
    assert len(made) == 50 and len(refused) == 150, (len(made), len(refused))
    for e in refused:
        assert e["error"]["code"] == "quota_exceeded", e
        assert e["error"]["level"] == f"project/{p}" and e["error"]["quota"] == "sandboxes", e
        assert e["error"]["limit"] == 50, e
    listed = call(cl, "GET", "/v1/sandboxes?limit=1000", token=token)[1]["sandboxes"]
    assert len(listed) == 50
    # Both apiservers see the truth: 50 running, and once the holds are idle nothing held.
    for i in (0, 1):
        wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", i)["usage"]["sandboxes"] == 50,
                   10, what=f"apiserver {i} showing 50")
        wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", i)["held"]["sandboxes"] == 0,
                   10, what=f"apiserver {i} holding nothing")
    # Room again after deletes: one more fits once one goes.
    assert call(cl, "POST", "/v1/sandboxes", {}, token=token)[0] == 429
    assert call(cl, "DELETE", f"/v1/sandboxes/{made[0]['id']}", token=token)[0] == 204
    wait_until(lambda: call(cl, "POST", "/v1/sandboxes", {"memory_mb": 64}, token=token,
                            i=1)[0] == 201, 10, what="a create once one was deleted")
    assert call(cl, "POST", "/v1/sandboxes", {}, token=token)[0] == 429
    remove_all(cl, p)
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota")["usage"]["sandboxes"] == 0, 10,
               what="usage back to 0")
    # Well below one etcd write per create: the holds are blocks.
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_memory_cpu_and_token_levels_each_hold_exactly(cl):
    p = new_project(cl)
    token = new_token(cl, p)
    other = new_token(cl, p, name="other")
    set_quota(cl, f"/v1/projects/{p}/quota", memory_mb=320)
    results = create_many(cl, 20, token, {"memory_mb": 64, "cpu": 0.1})
    assert sum(s == 201 for s, _ in results) == 5, [s for s, _ in results]
    for e in refusals(results):
        assert e["error"]["quota"] == "memory_mb" and e["error"]["limit"] == 320, e
    remove_all(cl, p)
    set_quota(cl, f"/v1/projects/{p}/quota", memory_mb=None, cpu=1.0)
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota")["usage"]["sandboxes"] == 0, 10,
               what="usage back to 0")
    results = create_many(cl, 16, token, {"memory_mb": 32, "cpu": 0.25})
    assert sum(s == 201 for s, _ in results) == 4, [s for s, _ in results]
    for e in refusals(results):
        assert e["error"]["quota"] == "cpu" and e["error"]["limit"] == 1.0, e
    remove_all(cl, p)
    # The token level, under a project with room: the token's own limit decides for it alone.
    set_quota(cl, f"/v1/projects/{p}/quota", cpu=None, sandboxes=10)
    set_quota(cl, f"/v1/projects/{p}/tokens/worker/quota", sandboxes=2)
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota")["usage"]["sandboxes"] == 0, 10,
               what="usage back to 0")
    results = create_many(cl, 8, token, {"memory_mb": 32})
    assert sum(s == 201 for s, _ in results) == 2, [s for s, _ in results]
    for e in refusals(results):
        assert e["error"]["level"] == f"token/{p}/worker", e
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/tokens/worker/quota")["usage"]["sandboxes"]
               == 2, 10, what="the token's usage")
    results = create_many(cl, 10, other, {"memory_mb": 32})
    assert sum(s == 201 for s, _ in results) == 8, [s for s, _ in results]
    for e in refusals(results):
        assert e["error"]["level"] == f"project/{p}", e
    # A count create is all or nothing under the quota.
    s, e = call(cl, "POST", "/v1/sandboxes", {"count": 2, "memory_mb": 32}, token=other)
    assert s == 429 and e["error"]["code"] == "quota_exceeded", (s, e)
    remove_all(cl, p)
    s, out = call(cl, "POST", "/v1/sandboxes", {"count": 3, "memory_mb": 32}, token=other)
    assert s == 201 and len(out["sandboxes"]) == 3, (s, out)
    remove_all(cl, p)
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_a_create_rate_holds_across_both_apiservers(cl):
    p = new_project(cl)
    token = new_token(cl, p)
    set_quota(cl, f"/v1/projects/{p}/quota", creates_per_s=3)
    t0 = time.time()
    results = create_many(cl, 24, token, {"memory_mb": 32})
    t1 = time.time()
    made = sum(s == 201 for s, _ in results)
    windows = int(t1) - int(t0) + 1
    assert 3 <= made <= 3 * windows, (made, windows)
    for e in refusals(results):
        assert e["error"]["quota"] == "creates_per_s" and e["error"]["limit"] == 3, e
    remove_all(cl, p)
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_an_apiserver_killed_holding_quota_gives_it_back_with_its_lease(cl):
    p = new_project(cl)
    token = new_token(cl, p)
    set_quota(cl, f"/v1/projects/{p}/quota", sandboxes=10)
    for _ in range(2):
        assert call(cl, "POST", "/v1/sandboxes", {"memory_mb": 32}, token=token, i=0)[0] == 201
    holds = {k: json.loads(v) for k, v in etcd_keys(cl, "/dsec/quota-holds/").items()
             if f"/{p}/" in k}
    assert len(holds) == 1 and list(holds.values())[0]["sandboxes"] > 2, holds
    cl.apiserver_kill(0)
    try:
        # Until its lease lapses its block stays taken; then the other apiserver has it all.
        wait_until(lambda: not [k for k in etcd_keys(cl, "/dsec/quota-holds/") if f"/{p}/" in k],
                   30, what="the dead apiserver's hold gone with its lease")
        results = [call(cl, "POST", "/v1/sandboxes", {"memory_mb": 32}, token=token, i=1)
                   for _ in range(10)]
        assert sum(s == 201 for s, _ in results) == 8, [s for s, _ in results]
    finally:
        cl.apiserver_start(0)
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", 0)["usage"]["sandboxes"] == 10, 10,
               what="the restarted apiserver counting 10")
    remove_all(cl, p)
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_an_edge_lost_and_back_stays_counted_once(cl):
    p = new_project(cl)
    token = new_token(cl, p)
    set_quota(cl, f"/v1/projects/{p}/quota", sandboxes=6)
    made = []
    for _ in range(4):
        s, out = call(cl, "POST", "/v1/sandboxes", {"memory_mb": 32}, token=token)
        assert s == 201, out
        made.append(out)
    lost = made[0]["node"]
    other = "n2" if lost == "n1" else "n1"
    # (Its nodes have published them: what a node lost since is covered by the hold only.)
    wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota")["usage"]["sandboxes"] == 4, 10,
               what="4 shown")
    cl.edge_kill(lost)
    try:
        cl.wait_nodes(ready=[other], timeout=30)
        # The lost node's sandboxes still count: 2 more, not more.
        u = usage(cl, f"/v1/projects/{p}/quota")
        assert u["usage"]["sandboxes"] == 4, u
        results = [call(cl, "POST", "/v1/sandboxes", {"memory_mb": 32}, token=token, i=1)
                   for _ in range(4)]
        assert sum(s == 201 for s, _ in results) == 2, results
    finally:
        cl.edge_start(lost)
    cl.wait_nodes(ready=["n1", "n2"], timeout=60)
    # Back, it says what it has (its sandboxes re-adopted): still 6, counted once.
    for i in (0, 1):
        wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", i)["usage"]["sandboxes"] == 6,
                   15, what=f"apiserver {i} counting 6")
    assert call(cl, "POST", "/v1/sandboxes", {"memory_mb": 32}, token=token)[0] == 429
    remove_all(cl, p)
    for i in (0, 1):
        wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", i)["usage"]["sandboxes"] == 0,
                   15, what=f"apiserver {i} counting 0")
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_a_parent_project_holds_its_children_together(cl):
    team, a, b = new_project(cl), new_project(cl), new_project(cl)
    ta, tb = new_token(cl, a), new_token(cl, b)
    set_quota(cl, f"/v1/projects/{team}/quota", sandboxes=3)
    # PUT (API.md's form: max_sandboxes, parent) says it all.
    for child in (a, b):
        s, out = call(cl, "PUT", f"/v1/projects/{child}/quota", {"max_sandboxes": 10,
                                                                 "parent": team})
        assert s == 200 and out["limits"]["parent"] == team, out
        assert out["limits"]["sandboxes"] == 10 and out["limits"]["cpu"] is None, out
        for i in (0, 1):
            wait_until(lambda: usage(cl, f"/v1/projects/{child}/quota", i)["limits"]["parent"]
                       == team, 5, what="the parent seen")
    # A cycle is refused.
    s, e = call(cl, "PATCH", f"/v1/projects/{team}/quota", {"parent": a})
    assert s == 400 and "cycle" in e["error"]["message"], e
    results = create_many(cl, 4, ta, {"memory_mb": 32}) + create_many(cl, 4, tb, {"memory_mb": 32})
    assert sum(s == 201 for s, _ in results) == 3, [s for s, _ in results]
    for e in refusals(results):
        assert e["error"]["level"] == f"project/{team}", e
    wait_until(lambda: usage(cl, f"/v1/projects/{team}/quota")["usage"]["sandboxes"] == 3, 10,
               what="the parent counting its children's")
    for p in (a, b):
        remove_all(cl, p)
    for p in (a, b, team):
        assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_the_sdk_reads_and_sets_quotas_and_raises_quota_exceeded_at_once(cl):
    import asyncio
    sys.path.insert(0, str(cluster_harness.REPO / "sdk" / "python"))
    import libdsec
    p = new_project(cl)
    member = new_token(cl, p)
    with libdsec.DSecClient(cl.urls[0], token=cl.token, project=p) as admin:
        q = admin.set_quota(sandboxes=1, cpu=4)
        assert q["level"] == f"project/{p}" and q["limits"]["sandboxes"] == 1, q
        assert admin.set_quota(token="worker", memory_mb=512)["level"] == f"token/{p}/worker"
        assert admin.quota(org=True)["level"] == "org"
        with pytest.raises(ValueError):
            admin.set_quota(nope=1)
    for i in (0, 1):
        wait_until(lambda: usage(cl, f"/v1/projects/{p}/quota", i)["limits"]["sandboxes"] == 1,
                   5, what="the limit on both")
    with libdsec.DSecClient(cl.urls[1], token=member) as c:
        assert c.quota(project=p)["limits"]["cpu"] == 4
        sb = c.run_container(libdsec.DSecContainerRunArgs(memory_mb=64))
        t0 = time.monotonic()
        with pytest.raises(libdsec.QuotaExceededError) as ei:
            c.run_container(libdsec.DSecContainerRunArgs(memory_mb=64))
        # Not retried (a concurrency quota is final): one round trip and the wait for room.
        assert time.monotonic() - t0 < 4, time.monotonic() - t0
        e = ei.value
        assert (e.code, e.level, e.quota, e.limit, e.usage, e.asked) == \
            ("quota_exceeded", f"project/{p}", "sandboxes", 1, 1, 1), repr(e)

        async def from_async():
            async with libdsec.AsyncDSecClient(cl.urls[0], token=member) as ac:
                return (await ac.quota(project=p, token="worker"))["limits"]["memory_mb"]
        assert asyncio.run(from_async()) == 512
        sb.delete()
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
