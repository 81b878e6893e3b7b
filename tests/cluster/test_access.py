"""Cluster step 2 (issue 37): projects, tokens and roles on real etcd, real apiservers and
edges. Tokens are shown once and kept only as keyed hashes; a token works on every apiserver
and a revoke reaches every apiserver within a second; roles limit what a token may do."""

import base64
import json
import signal
import sys
import time
import urllib.request
import uuid

import pytest

import cluster_harness
from cluster_harness import call
from edge_harness import wait_until


@pytest.fixture(scope="module")
def cl(tmp_path_factory):
    yield from cluster_harness.module_cluster(tmp_path_factory, "access", edges=2, apiservers=2)


def new_name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def make_token(c, project, name, role="member", **extra):
    s, t = call(c, "POST", f"/v1/projects/{project}/tokens", {"name": name, "role": role, **extra})
    assert s == 201, (s, t)
    assert t["token"].startswith("dsec_") and t["role"] == role and t["project"] == project, t
    return t["token"]


def etcd_values(c):
    """Every key and value under /dsec/ in etcd, decoded."""
    body = json.dumps({"key": base64.b64encode(b"/dsec/").decode(),
                       "range_end": base64.b64encode(b"/dsec0").decode()}).encode()
    req = urllib.request.Request(c.etcd_url + "/v3/kv/range", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        kvs = json.loads(r.read()).get("kvs", [])
    return [(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")).decode())
            for kv in kvs]


def test_projects_are_made_listed_and_refused_twice(cl):
    p = new_name("team")
    s, out = call(cl, "POST", "/v1/projects", {"name": p})
    assert s == 201 and out["name"] == p and out["created_at"] > 0, out
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 409
    assert call(cl, "POST", "/v1/projects", {"name": "default"})[0] == 409
    for bad in ({"name": "Team"}, {"name": "-x"}, {"name": "a" * 64}, {}, {"name": p, "x": 1}):
        assert call(cl, "POST", "/v1/projects", bad)[0] == 400, bad
    # Both apiservers list it (the second through its etcd watch).
    for i in (0, 1):
        wait_until(lambda: p in [x["name"] for x in call(cl, "GET", "/v1/projects", i=i)[1]
                                 ["projects"]], 5, what=f"apiserver {i} listing {p}")
    assert "default" in [x["name"] for x in call(cl, "GET", "/v1/projects")[1]["projects"]]
    assert call(cl, "GET", "/v1/projects/nosuch-proj/tokens")[0] == 404
    assert call(cl, "DELETE", "/v1/projects/default")[0] == 409
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 404


def test_a_token_is_shown_once_works_everywhere_and_a_revoke_reaches_every_apiserver(cl):
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    token = make_token(cl, p, "alice")
    # Listed without its secret; a second of the same name is refused.
    s, out = call(cl, "GET", f"/v1/projects/{p}/tokens")
    assert s == 200 and [t["name"] for t in out["tokens"]] == ["alice"], out
    assert "token" not in out["tokens"][0] and out["tokens"][0]["expires_at"] is None, out
    s, out = call(cl, "POST", f"/v1/projects/{p}/tokens", {"name": "alice"})
    assert s == 409, out
    for bad in ({"name": "bob", "role": "root"}, {"name": "Bob"}, {"role": "member"},
                {"name": "bob", "ttl_s": 0}):
        assert call(cl, "POST", f"/v1/projects/{p}/tokens", bad)[0] == 400, bad
    # It works on both apiservers (the second within a second of its creation).
    for i in (0, 1):
        wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=token, i=i)[0] == 200, 1,
                   what=f"the new token on apiserver {i}")
    # Its last use is kept, and reaches the other apiserver through etcd (a write a minute at
    # most per token and apiserver): a token used only on apiserver 0.
    only0 = make_token(cl, p, "only0")
    used_at = time.time() * 1000
    for _ in range(5):
        assert call(cl, "GET", "/v1/sandboxes", token=only0, i=0)[0] == 200

    def last_used(i):
        toks = call(cl, "GET", f"/v1/projects/{p}/tokens", i=i)[1]["tokens"]
        return next(t for t in toks if t["name"] == "only0").get("last_used", 0)
    assert last_used(0) >= used_at - 1000
    wait_until(lambda: last_used(1) >= used_at - 1000, 15, what="last_used on apiserver 1")
    used_keys = [k for k, _ in etcd_values(cl) if k.startswith("/dsec/token-used/")]
    assert used_keys, "no use written to etcd"
    assert call(cl, "DELETE", f"/v1/projects/{p}/tokens/only0")[0] == 204
    # Never in etcd, nor in any log, in clear.
    assert not [k for k, v in etcd_values(cl) if token in k or token in v]
    for log in cl.root.glob("*.log"):
        assert token not in log.read_text(errors="replace"), log
    # Revoked: refused on both within a second.
    t0 = time.monotonic()
    assert call(cl, "DELETE", f"/v1/projects/{p}/tokens/alice")[0] == 204
    for i in (0, 1):
        wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=token, i=i)[0] == 401, 1,
                   what=f"the revoke on apiserver {i}")
    assert time.monotonic() - t0 < 2
    assert call(cl, "DELETE", f"/v1/projects/{p}/tokens/alice")[0] == 404
    # An expired token is refused too.
    short = make_token(cl, p, "brief", ttl_s=1)
    assert call(cl, "GET", "/v1/sandboxes", token=short)[0] == 200
    time.sleep(1.2)
    assert call(cl, "GET", "/v1/sandboxes", token=short)[0] == 401
    # Removing the project removes its tokens, whatever their number (one transaction).
    keep = make_token(cl, p, "carol")
    for n in range(50):
        make_token(cl, p, f"bulk-{n}")
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
    wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=keep, i=1)[0] == 401, 2,
               what="the project's tokens gone with it")
    assert not [k for k, _ in etcd_values(cl) if p in k]
    # No token for a project that is gone; one made again does not revive the old tokens.
    assert call(cl, "POST", f"/v1/projects/{p}/tokens", {"name": "late"})[0] == 404
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    for i in (0, 1):
        wait_until(lambda: p in [x["name"] for x in call(cl, "GET", "/v1/projects", i=i)[1]
                                 ["projects"]], 5, what="the project again")
        assert call(cl, "GET", "/v1/sandboxes", token=keep, i=i)[0] == 401
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_roles_limit_what_a_token_may_do(cl):
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    member = make_token(cl, p, "mem")
    viewer = make_token(cl, p, "view", role="viewer")
    admin = make_token(cl, p, "adm", role="admin")
    wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=viewer, i=1)[0] == 200, 2,
               what="the tokens on apiserver 1")
    # A member uses sandboxes of its project; it may not manage projects, tokens or nodes.
    s, sb = call(cl, "POST", "/v1/sandboxes", {"memory_mb": 64}, token=member)
    assert s == 201, sb
    try:
        s, out = call(cl, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["true"]},
                      token=member, i=1)
        assert s == 200 and out["exit_code"] == 0, out
        for method, path, body in (("POST", "/v1/projects", {"name": "x"}),
                                   ("GET", f"/v1/projects/{p}/tokens", None),
                                   ("POST", f"/v1/projects/{p}/tokens", {"name": "x"}),
                                   ("DELETE", f"/v1/projects/{p}/tokens/view", None),
                                   ("POST", "/v1/nodes/n1/cordon", None)):
            s, out = call(cl, method, path, body, token=member)
            assert s == 403 and "needs admin" in out["error"]["message"], (path, out)
        # It sees only its own project in the list of projects, and by name.
        s, out = call(cl, "GET", "/v1/projects", token=member)
        assert s == 200 and [x["name"] for x in out["projects"]] == [p], out
        s, out = call(cl, "GET", f"/v1/projects/{p}", token=viewer)
        assert s == 200 and out["name"] == p, out
        assert call(cl, "GET", "/v1/projects/default", token=member)[0] == 404
        assert call(cl, "GET", "/v1/projects/default")[1]["name"] == "default"
        # Naming another project: 403; an admin naming one that does not exist: 404.
        s, out = call(cl, "GET", "/v1/sandboxes", token=member, project="default")
        assert s == 403 and "belongs to project" in out["error"]["message"], out
        assert call(cl, "GET", "/v1/sandboxes", project="nosuch-proj")[0] == 404
        # A viewer reads, and nothing else.
        assert call(cl, "GET", "/v1/sandboxes", token=viewer)[0] == 200
        assert call(cl, "GET", f"/v1/sandboxes/{sb['id']}/stats", token=viewer)[0] == 200
        for method, path, body in (("POST", "/v1/sandboxes", {"memory_mb": 64}),
                                   ("POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["true"]}),
                                   ("DELETE", f"/v1/sandboxes/{sb['id']}", None),
                                   ("GET", f"/v1/sandboxes/{sb['id']}/ports/80/", None)):
            s, out = call(cl, method, path, body, token=viewer)
            assert s == 403 and "viewer" in out["error"]["message"], (path, out)
        # The cluster's nodes are an admin's to see; a drain counts every project's sandboxes.
        assert call(cl, "GET", "/v1/nodes", token=member)[0] == 403
        node = sb["node"]
        s, out = call(cl, "POST", f"/v1/nodes/{node}/drain?timeout_s=0")
        assert s == 200 and out["drained"] is False, out
        assert call(cl, "POST", f"/v1/nodes/{node}/uncordon")[0] == 200
        # A project's admin token manages projects and tokens like the cluster token.
        other = new_name("team")
        assert call(cl, "POST", "/v1/projects", {"name": other}, token=admin)[0] == 201
        assert call(cl, "DELETE", f"/v1/projects/{other}", token=admin)[0] == 204
        # A wrong token is 401 with nothing said about the project.
        s, out = call(cl, "GET", "/v1/sandboxes", token="dsec_" + "a" * 43)
        assert s == 401 and out["error"]["message"] == "invalid token", out
    finally:
        assert call(cl, "DELETE", f"/v1/sandboxes/{sb['id']}", token=member)[0] in (204, 404)
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_a_project_never_sees_anothers_sandboxes(cl):
    """Every endpoint shape on a sandbox of project A answers a token of project B as for an id
    that does not exist (404); B's lists and job operations leave A's alone; the same request
    id in both makes two sandboxes; an admin reaches any project's sandbox by id and lists
    `default` unless it names a project."""
    a, b = new_name("team"), new_name("team")
    for p in (a, b):
        assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    ta, tb = make_token(cl, a, "alice"), make_token(cl, b, "bob")
    wait_until(lambda: all(call(cl, "GET", "/v1/sandboxes", token=t, i=1)[0] == 200
                           for t in (ta, tb)), 2, what="the tokens on apiserver 1")
    s, sa = call(cl, "POST", "/v1/sandboxes",
                 {"memory_mb": 64, "labels": {"job": "j1"}, "request_id": "same-rid"}, token=ta)
    assert s == 201 and sa["project"] == a, sa
    s, sb = call(cl, "POST", "/v1/sandboxes",
                 {"memory_mb": 64, "labels": {"job": "j1"}, "request_id": "same-rid"}, token=tb)
    assert s == 201 and sb["project"] == b and sb["id"] != sa["id"], (sa, sb)
    sid = sa["id"]
    try:
        shapes = [("GET", f"/v1/sandboxes/{sid}", None),
                  ("PATCH", f"/v1/sandboxes/{sid}", {"labels": {"x": "y"}}),
                  ("GET", f"/v1/sandboxes/{sid}/stats", None),
                  ("POST", f"/v1/sandboxes/{sid}/pause", None),
                  ("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}),
                  ("GET", f"/v1/sandboxes/{sid}/execs", None),
                  ("POST", f"/v1/sandboxes/{sid}/signal", {"signal": "KILL"}),
                  ("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname", None),
                  ("GET", f"/v1/sandboxes/{sid}/files/list?path=/", None),
                  ("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/x", b"data"),
                  ("GET", f"/v1/sandboxes/{sid}/archive?path=/etc", None),
                  ("POST", f"/v1/sandboxes/{sid}/shells", {}),
                  ("GET", f"/v1/sandboxes/{sid}/ports/80/", None),
                  ("POST", f"/v1/sandboxes/{sid}/port-urls", {"port": 80}),
                  ("POST", f"/v1/sandboxes/{sid}/snapshot", {"image": "stolen"}),
                  ("POST", f"/v1/sandboxes/{sid}/fork", {"count": 1}),
                  ("DELETE", f"/v1/sandboxes/{sid}", None)]
        for i in (0, 1):
            for method, path, body in shapes:
                s, out = call(cl, method, path, body, token=tb, i=i)
                assert s == 404 and out["error"]["message"].startswith(f"sandbox {sid} not found"), \
                    (i, method, path, s, out)
        # Lists and jobs: each project sees and acts on its own.
        ids = lambda t, **kw: [x["id"] for x in call(cl, "GET", "/v1/sandboxes", token=t, **kw)[1]
                               ["sandboxes"]]
        assert ids(ta) == [sid] and ids(tb) == [sb["id"]]
        s, out = call(cl, "POST", "/v1/jobs/j1/pause", token=tb)
        assert s == 200 and out["affected"] == 1, out
        assert call(cl, "GET", f"/v1/sandboxes/{sid}", token=ta)[1]["state"] == "running"
        # An admin: any sandbox by id; lists default unless it names a project.
        assert call(cl, "GET", f"/v1/sandboxes/{sid}")[0] == 200
        assert sid not in ids(None)
        assert ids(None, project=a) == [sid]
        # A project with sandboxes cannot be removed.
        s, out = call(cl, "DELETE", f"/v1/projects/{a}")
        assert s == 409 and "still has sandboxes" in out["error"]["message"], out
        # The apiservers' access logs say who asked what of which sandbox (not reads).
        lines = [json.loads(ln) for i in (1, 2) for ln in
                 (cl.root / f"apiserver-{i}.audit.log").read_text().splitlines()]
        mine = [(e["token"], e["project"], e["method"], e["path"], e.get("sandbox"))
                for e in lines if e.get("project") in (a, b)]
        assert ("alice", a, "POST", "/v1/sandboxes", None) in mine, mine
        assert ("bob", b, "DELETE", f"/v1/sandboxes/{sid}", sid) in mine, mine
        assert ("bob", b, "POST", f"/v1/sandboxes/{sid}/exec", sid) in mine, mine
        assert not [e for e in lines if e.get("project") in (a, b) and e["method"] == "GET"]
        assert all(e["time_ms"] > 0 and e["role"] == "member" for e in lines
                   if e.get("project") in (a, b)), lines
    finally:
        for t, x in ((ta, sid), (tb, sb["id"])):
            assert call(cl, "DELETE", f"/v1/sandboxes/{x}", token=t)[0] in (204, 404)
    for p in (a, b):
        assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_the_sdk_acts_in_a_project(cl, monkeypatch):
    """DSecClient(project=...) or DSEC_PROJECT names the project an admin acts in; a project
    token's client acts in its own (the sync and the async client alike)."""
    import asyncio
    sys.path.insert(0, str(cluster_harness.REPO / "sdk" / "python"))
    import libdsec
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    member = make_token(cl, p, "sdk")
    wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=member, i=1)[0] == 200, 2,
               what="the token on apiserver 1")
    with libdsec.DSecClient(cl.urls[1], token=member) as c:
        sb = c.run_container(libdsec.DSecContainerRunArgs(memory_mb=64))
        assert sb["project"] == p, sb.record
    try:
        with libdsec.DSecClient(cl.urls[0], token=cl.token) as admin:
            assert sb.id not in [s.id for s in admin.list_sandboxes()]  # default
        with libdsec.DSecClient(cl.urls[0], token=cl.token, project=p) as admin:
            assert [s.id for s in admin.list_sandboxes()] == [sb.id]
        monkeypatch.setenv("DSEC_PROJECT", p)
        with libdsec.DSecClient(cl.urls[0], token=cl.token) as admin:
            assert admin.project == p and [s.id for s in admin.list_sandboxes()] == [sb.id]

        async def from_async():
            async with libdsec.AsyncDSecClient(cl.urls[1], token=cl.token) as ac:
                return [s.id for s in await ac.list_sandboxes()]
        assert asyncio.run(from_async()) == [sb.id]
        monkeypatch.delenv("DSEC_PROJECT")
    finally:
        assert call(cl, "DELETE", f"/v1/sandboxes/{sb.id}", token=member)[0] in (204, 404)
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_project_tokens_wait_while_the_view_is_out_of_step_with_etcd(make_cluster):
    """An apiserver that has not reached etcd for longer than --access-stale-ms could have
    missed a revoke: project tokens are 503 until etcd is back; the cluster token still works
    (routing and lists go on from the view)."""
    c = make_cluster(edges=1, apiservers=1)
    c.apiserver_extra = ["--access-stale-ms", "1000"]
    c.apiserver_kill(0, signal.SIGTERM)
    c.apiserver_start(0)
    p = new_name("team")
    assert call(c, "POST", "/v1/projects", {"name": p})[0] == 201
    tok = make_token(c, p, "t")
    assert call(c, "GET", "/v1/sandboxes", token=tok)[0] == 200
    c.etcd_stop()
    try:
        wait_until(lambda: call(c, "GET", "/v1/sandboxes", token=tok)[0] == 503, 20,
                   what="project tokens refused once the view is stale")
        s, out = call(c, "GET", "/v1/sandboxes", token=tok)
        assert "has not reached etcd" in out["error"]["message"], out
        assert call(c, "GET", "/v1/sandboxes")[0] == 200  # the cluster token
    finally:
        c.etcd_start()
    wait_until(lambda: call(c, "GET", "/v1/sandboxes", token=tok)[0] == 200, 30,
               what="project tokens taken again once etcd is back")


def test_a_revoke_closes_what_the_token_has_open_on_every_apiserver(cl):
    """Calls a token has in flight through the apiservers (a long exec here; streams, attach and
    the port proxy are relayed alike) end when it is revoked, not when they finish."""
    import threading
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    tok = make_token(cl, p, "runner")
    for i in (0, 1):
        wait_until(lambda: call(cl, "GET", "/v1/sandboxes", token=tok, i=i)[0] == 200, 5,
                   what=f"the token on apiserver {i}")
    s, sb = call(cl, "POST", "/v1/sandboxes", {"memory_mb": 64}, token=tok)
    assert s == 201, sb
    ended = {}

    def long_exec(i):
        t0 = time.monotonic()
        try:
            r = call(cl, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["sleep", "30"]},
                     token=tok, i=i)
            ended[i] = ("answered", r[0], time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - the connection closed under it
            ended[i] = ("closed", type(e).__name__, time.monotonic() - t0)
    threads = [threading.Thread(target=long_exec, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    assert call(cl, "DELETE", f"/v1/projects/{p}/tokens/runner")[0] == 204
    for t in threads:
        t.join(15)
    assert len(ended) == 2, ended
    for i, (how, what, took) in ended.items():
        assert how == "closed" and took < 10, (i, how, what, took)
    assert time.monotonic() - t0 < 5
    assert call(cl, "DELETE", f"/v1/sandboxes/{sb['id']}", project=p)[0] == 204
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204


def test_token_hashes_use_the_key_file_and_a_bad_key_file_is_refused(cl, tmp_path):
    """With --token-hash-key-file, a token's etcd key is its HMAC-SHA256 under a key derived
    from that file (not from the node token: rotating the node token keeps project tokens)."""
    import hashlib
    import hmac
    import subprocess
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    tok = make_token(cl, p, "keyed")
    key = hmac.new(cl.token_hash_key.encode(), b"dsec-project-token-hash", hashlib.sha256).digest()
    want = f"/dsec/tokens/{p}/" + hmac.new(key, tok.encode(), hashlib.sha256).hexdigest()
    assert want in [k for k, _ in etcd_values(cl)]
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
    for text, mode, why in (("short\n", 0o600, "at least 32"),
                            ("k" * 40 + "\n", 0o644, "chmod 600")):
        f = tmp_path / f"key-{mode:o}"
        f.write_text(text)
        f.chmod(mode)
        r = subprocess.run([cl.apiserver_bin, "--listen", "127.0.0.1:0", "--etcd", cl.etcd_url,
                            "--token-file", str(cl.root / "cluster.token"),
                            "--node-token-file", str(cl.root / "node.token"),
                            "--token-hash-key-file", str(f)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and why in r.stderr, (r.returncode, r.stderr)


def test_an_expired_token_keeps_nothing_open(cl):
    import threading
    p = new_name("team")
    assert call(cl, "POST", "/v1/projects", {"name": p})[0] == 201
    tok = make_token(cl, p, "brief", ttl_s=4)
    s, sb = call(cl, "POST", "/v1/sandboxes", {"memory_mb": 64}, token=tok)
    assert s == 201, sb
    ended = {}

    def long_exec():
        t0 = time.monotonic()
        try:
            r = call(cl, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["sleep", "30"]},
                     token=tok)
            ended["r"] = ("answered", r[0], time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - closed under it
            ended["r"] = ("closed", type(e).__name__, time.monotonic() - t0)
    t = threading.Thread(target=long_exec)
    t.start()
    t.join(20)
    assert ended.get("r", ("",))[0] == "closed" and ended["r"][2] < 10, ended
    assert call(cl, "DELETE", f"/v1/sandboxes/{sb['id']}", project=p)[0] == 204
    assert call(cl, "DELETE", f"/v1/projects/{p}")[0] == 204
