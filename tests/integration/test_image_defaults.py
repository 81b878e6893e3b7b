"""Image configs as sandbox defaults (also for container pools of an image), and image build
jobs' edges (issue 5).

An image's config (workdir, user, env) fills in what a create leaves out; for a stacked image
list, the topmost image that sets each wins; forks keep what their source got. Build jobs:
a name conflict is 409 even when the queue is full, a cancel answers what GET then shows, a
finished build names no sandbox, and the log's tail starts at a line and is read in whole
UTF-8 characters however small max_bytes is."""

import io
import os
import subprocess
import shutil
import tarfile
import time

import pytest

from edge_harness import wait_until
from test_images import (APPLETS, BUSYBOX, build_sandboxes, busybox_rootfs, import_image,
                         need_busybox, sh, wait_build)


def build(c, body, timeout=120):
    r = c.post("/v1/images/build", body, expect=202).json
    rec = wait_build(c, r["id"], timeout=timeout)
    assert rec["state"] == "succeeded", rec
    return rec


def test_image_workdir_and_env_are_sandbox_defaults(edge, client):
    """No workdir in the create: the image's (for a stack, the topmost that sets one), made if
    the image lacks it; env the image's under the caller's; a fork keeps both; the host image
    and an explicit workdir are unchanged."""
    need_busybox()
    c = client
    made = []
    sbs = []
    try:
        import_image(c, "it-wd-base:1", busybox_rootfs())
        made.append("it-wd-base:1")
        build(c, {"name": "it-wd-a:1", "from": "it-wd-base:1", "workdir": "/opt/a",
                  "env": {"A": "a", "BOTH": "from-a"}, "run": ["echo a > marker"]})
        made.append("it-wd-a:1")
        # B's workdir is not in its files: the sandbox must still have it.
        build(c, {"name": "it-wd-b:1", "from": "it-wd-base:1", "workdir": "/data/b",
                  "env": {"BOTH": "from-b"}, "run": ["cd / && rmdir /data/b"]})
        made.append("it-wd-b:1")
        assert c.get("/v1/images/it-wd-b:1", expect=200).json["config"]["workdir"] == "/data/b"

        def make(body):
            sb = c.create(body)
            sbs.append(sb["id"])
            return sb

        plain = make({"image": "it-wd-base:1"})  # no workdir in its config
        assert plain["workdir"] == "/workspace" and sh(c, plain["id"], "pwd") == "/workspace\n"

        a = make({"image": "it-wd-a:1"})
        assert a["workdir"] == "/opt/a" and a["user"] == "sandbox"
        out = sh(c, a["id"], "pwd; cat marker; echo $A $BOTH; touch mine && echo writable")
        assert out == "/opt/a\na\na from-a\nwritable\n", out

        ab = make({"image": ["it-wd-a:1", "it-wd-b:1"]})
        assert ab["workdir"] == "/data/b"
        assert sh(c, ab["id"], "pwd; echo $A $BOTH") == "/data/b\na from-b\n"
        ba = make({"image": ["it-wd-b:1", "it-wd-a:1"]})
        assert ba["workdir"] == "/opt/a"
        assert sh(c, ba["id"], "pwd; echo $BOTH") == "/opt/a\nfrom-a\n"
        # An image without a workdir on top leaves the one below.
        a_base = make({"image": ["it-wd-a:1", "it-wd-base:1"]})
        assert a_base["workdir"] == "/opt/a"

        mine = make({"image": "it-wd-a:1", "workdir": "/workspace", "env": {"BOTH": "caller"}})
        assert mine["workdir"] == "/workspace"
        assert sh(c, mine["id"], "pwd; echo $A $BOTH") == "/workspace\na caller\n"
        assert c.exec(mine["id"], cmd=["/bin/sh", "-c", "pwd"], cwd="/opt/a")["stdout"] == (
            "/opt/a\n")

        # A fork starts from layer digests (no config): it keeps what its source got.
        forks = c.post(f"/v1/sandboxes/{a['id']}/fork", {"count": 1}, expect=201).json
        f = forks["sandboxes"][0]
        sbs.append(f["id"])
        assert f["workdir"] == "/opt/a"
        assert sh(c, f["id"], "pwd; ls mine; echo $A $BOTH") == "/opt/a\nmine\na from-a\n"
        # A snapshot of the fork carries the config of what the fork's source was made from.
        snap = c.post(f"/v1/sandboxes/{f['id']}/snapshot", {"image": "it-wd-fsnap:1"},
                      expect=201).json
        made.append("it-wd-fsnap:1")
        assert snap["config"]["workdir"] == "/opt/a" and "A=a" in snap["config"]["env"], snap
        again = make({"image": "it-wd-fsnap:1"})
        assert again["workdir"] == "/opt/a"
        assert sh(c, again["id"], "pwd; ls mine; echo $A") == "/opt/a\nmine\na\n"

        host = make({})
        assert host["workdir"] == "/workspace"
        assert sh(c, host["id"], "pwd") == "/workspace\n"
    finally:
        for sid in sbs:
            c.remove(sid)
        for n in reversed(made):
            c.delete(f"/v1/images/{n}", expect=204)


def oci_image(tmp_path, name, **config):
    """An OCI layout tar of a busybox root filesystem, with umoci's --config.KEY=VALUE."""
    if not shutil.which("umoci"):
        pytest.skip("umoci is missing (Debian's umoci)")
    layout, bundle = tmp_path / f"{name}-layout", tmp_path / f"{name}-bundle"

    def run(*args):
        subprocess.run(["umoci", *args], check=True, capture_output=True)

    run("init", "--layout", str(layout))
    run("new", "--image", f"{layout}:t")
    run("unpack", "--image", f"{layout}:t", str(bundle))
    rootfs = bundle / "rootfs"
    for d in ("bin", "etc"):
        (rootfs / d).mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin/busybox")
    for a in APPLETS:
        os.link(rootfs / "bin/busybox", rootfs / "bin" / a)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    run("repack", "--image", f"{layout}:t", str(bundle))
    # After the unpack: umoci unpack would look the user up in the (then empty) rootfs.
    run("config", "--image", f"{layout}:t", *[f"--config.{k}={v}" for k, v in config.items()])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(layout), ".")
    return buf.getvalue()


def test_image_user_is_a_sandbox_default(edge, client, tmp_path):
    """An image's user (uid[:gid], root or sandbox) is the default; a name the node cannot
    resolve leaves "sandbox"; the caller's user wins. An OCI workdir missing from the image's
    files is made."""
    need_busybox()
    c = client
    made = []
    sbs = []
    try:
        import_image(c, "it-usr-num:1", oci_image(tmp_path, "num", user="1234:1234",
                                                   workingdir="/srv/missing"))
        made.append("it-usr-num:1")
        import_image(c, "it-usr-name:1", oci_image(tmp_path, "name", user="node"))
        made.append("it-usr-name:1")

        sb = c.create({"image": "it-usr-num:1"})
        sbs.append(sb["id"])
        assert sb["user"] == "1234:1234" and sb["workdir"] == "/srv/missing"
        assert sh(c, sb["id"], "id -u; id -g; pwd") == "1234\n1234\n/srv/missing\n"

        sb = c.create({"image": "it-usr-num:1", "user": "root"})
        sbs.append(sb["id"])
        assert sb["user"] == "root" and sh(c, sb["id"], "id -u") == "0\n"

        sb = c.create({"image": "it-usr-name:1"})
        sbs.append(sb["id"])
        assert sb["user"] == "sandbox" and sh(c, sb["id"], "id -u") == "1000\n"
    finally:
        for sid in sbs:
            c.remove(sid)
        for n in made:
            c.delete(f"/v1/images/{n}", expect=204)


def wait_pool_idle(c, name, n, timeout=60):
    def check():
        w = c.get(f"/v1/pools/{name}", expect=200).json["workers"]
        return (w["idle"], w["starting"]) == (n, 0)
    wait_until(check, timeout, interval=0.05, what=f"pool {name}: {n} idle")


def test_container_pool_of_an_image_starts_with_its_config(edge, client, tmp_path):
    """A container pool may use an image of the store: its ready sandboxes have the image's
    files and its config's user, workdir and env, and their records say so; a pooled create may
    repeat those but not change them. The image cannot be deleted while a pool uses it; an
    unknown image is 404, and a stored pool comes back with its image after a restart."""
    need_busybox()
    c = client
    pool = "it-img-pool"
    sbs = []
    import_image(c, "it-pool-img:1", oci_image(tmp_path, "pool", user="1234:1234",
                                                workingdir="/srv/app", env="APP=pooled"))
    try:
        info = c.put(f"/v1/pools/{pool}", {"kind": "container", "image": "it-pool-img:1",
                                           "min_idle": 1, "max": 2, "memory_mb": 128},
                     expect=201).json
        assert info["image"] == "it-pool-img:1", info
        wait_pool_idle(c, pool, 1)
        sb = c.post("/v1/sandboxes", {"pool": pool}, expect=201).json
        sbs.append(sb["id"])
        assert (sb["pool"], sb["user"], sb["workdir"]) == (pool, "1234:1234", "/srv/app"), sb
        assert c.get(f"/v1/pools/{pool}", expect=200).json["taken"] == 1
        out = sh(c, sb["id"], "id -u; pwd; echo $APP; ls /bin/busybox")
        assert out == "1234\n/srv/app\npooled\n/bin/busybox\n", out
        rec = c.get(f"/v1/sandboxes/{sb['id']}", expect=200).json
        assert (rec["user"], rec["workdir"], rec["image"]) == ("1234:1234", "/srv/app",
                                                              "it-pool-img:1"), rec
        same = c.post("/v1/sandboxes", {"pool": pool, "workdir": "/srv/app", "env": {}},
                      expect=201).json
        sbs.append(same["id"])
        assert sh(c, same["id"], "echo $APP") == "pooled\n"
        c.post("/v1/sandboxes", {"pool": pool, "workdir": "/tmp"}, expect=400)
        r = c.delete("/v1/images/it-pool-img:1", expect=409)
        assert pool in r.json["error"]["message"]
        r = c.put("/v1/pools/it-img-pool-bad", {"kind": "container", "image": "it-nosuch:1"},
                  expect=404)
        assert r.json["error"]["code"] == "not_found"
        c.get("/v1/pools/it-img-pool-bad", expect=404)
    finally:
        for sid in sbs:
            c.remove(sid)
        c.delete(f"/v1/pools/{pool}")
        c.delete("/v1/images/it-pool-img:1", expect=204)


def test_stored_image_pool_comes_back_after_a_restart(make_edge, tmp_path):
    """A container pool of an image is kept in the state DB: after a restart it is running
    again with its image's config."""
    need_busybox()
    edge = make_edge()
    c = edge.client()
    import_image(c, "it-pool-keep:1", oci_image(tmp_path, "keep", workingdir="/srv/keep"))
    c.put("/v1/pools/it-keep", {"kind": "container", "image": "it-pool-keep:1", "min_idle": 1,
                                "max": 1, "memory_mb": 96}, expect=201)
    wait_pool_idle(c, "it-keep", 1)
    edge.stop()
    edge.launch()
    c = edge.client()
    wait_pool_idle(c, "it-keep", 1)
    sb = c.post("/v1/sandboxes", {"pool": "it-keep"}, expect=201).json
    try:
        assert sb["workdir"] == "/srv/keep" and sh(c, sb["id"], "pwd") == "/srv/keep\n"
    finally:
        c.remove(sb["id"])
    c.delete("/v1/pools/it-keep", expect=204)
    c.delete("/v1/images/it-pool-keep:1", expect=204)


def states_until_done(c, bid, timeout=30):
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        rec = c.get(f"/v1/images/builds/{bid}", expect=200).json
        if not seen or seen[-1] != rec["state"]:
            seen.append(rec["state"])
        if rec["finished_at"] is not None:
            return seen, rec
        assert time.monotonic() < deadline, (seen, rec)
        time.sleep(0.05)


def test_build_conflict_before_full_queue_and_cancel_states(make_edge):
    """With the one build worker busy and the queue full, a name being built is 409 (not
    429) and a new one 429. A queued build cancels at once; a running one answers
    "canceling", GET shows that until it is "canceled", and neither names a sandbox then."""
    need_busybox()
    edge = make_edge(config={"max_builds": 1})
    c = edge.client()
    import_image(c, "it-q-base:1", busybox_rootfs())
    run = c.post("/v1/images/build", {"name": "it-q-run:1", "from": "it-q-base:1",
                                      "run": ["sleep 300"]}, expect=202).json
    rec = wait_until(lambda: (lambda r: r if r["step"] == 1 else None)(
        c.get(f"/v1/images/builds/{run['id']}", expect=200).json), 30, what="the sleep step")
    assert rec["state"] == "running" and rec["sandbox"] in build_sandboxes(c)
    queued = []
    while True:
        r = c.post("/v1/images/build", {"name": f"it-q-{len(queued)}:1", "from": "it-q-base:1",
                                        "run": ["true"]})
        if r.status == 429:
            break
        assert r.status == 202 and r.json["state"] == "queued", r
        queued.append(r.json["id"])
        assert len(queued) <= 64
    assert len(queued) == 16
    for name in ("it-q-3:1", "it-q-run:1", "it-q-base:1"):
        c.post("/v1/images/build", {"name": name, "from": "it-q-base:1", "run": ["true"]},
               expect=409)
    c.post("/v1/images/build", {"name": "it-q-new:1", "from": "it-q-base:1", "run": ["true"]},
           expect=429)
    # Listed, newest first, and by state.
    listed = c.get("/v1/images/builds", expect=200).json["builds"]
    assert [b["id"] for b in listed] == list(reversed(queued)) + [run["id"]], listed
    assert [b["id"] for b in c.get("/v1/images/builds?state=running",
                                   expect=200).json["builds"]] == [run["id"]]
    c.get("/v1/images/builds?state=bogus", expect=400)

    for bid in queued:
        got = c.delete(f"/v1/images/builds/{bid}", expect=200).json
        assert got["state"] == "canceled" and got["sandbox"] is None, got
        assert c.get(f"/v1/images/builds/{bid}", expect=200).json == got

    got = c.delete(f"/v1/images/builds/{run['id']}", expect=200).json
    assert got["state"] == "canceling" and got["finished_at"] is None, got
    seen, rec = states_until_done(c, run["id"])
    assert set(seen) <= {"canceling", "canceled"} and seen[-1] == "canceled", seen
    assert rec["sandbox"] is None and rec["error"] == "canceled", rec
    assert build_sandboxes(c) == []
    c.get(f"/v1/sandboxes/{got['sandbox']}", expect=404)
    c.delete("/v1/images/it-q-base:1", expect=204)


UTF8_LINE = "x\u00e9\u20ac\U0001F600 end"  # 1-, 2-, 3- and 4-byte characters


def test_build_log_tail_starts_at_a_line_and_small_reads_progress(edge, client):
    """A build writes more than the 4 MiB the edge keeps: the kept tail starts with a whole
    line. Reading the log with max_bytes 1, 2 or 3 returns whole characters and always makes
    progress to the end."""
    need_busybox()
    c = client
    import_image(c, "it-log-base:1", busybox_rootfs(extra=[("bin/yes", "hardlink",
                                                              "bin/busybox")]))
    try:
        r = c.post("/v1/images/build", {
            "name": "it-log:1", "from": "it-log-base:1",
            "run": ["yes 0123456789abcdef | head -c 5000000; echo",
                    f"printf '{UTF8_LINE}\\n'"]}, expect=202).json
        rec = wait_build(c, r["id"], timeout=300)
        assert rec["state"] == "succeeded" and rec["sandbox"] is None, rec
        assert rec["log_bytes"] > 5000000
        whole = c.get(f"/v1/images/builds/{r['id']}/log?offset=0&max_bytes=4194304",
                      expect=200).json
        assert whole["offset"] > 0 and whole["done"], {k: whole[k] for k in ("offset", "done")}
        assert whole["text"].split("\n", 1)[0] == "0123456789abcdef", whole["text"][:100]
        raw = whole["text"].encode()
        assert whole["next_offset"] == whole["offset"] + len(raw) == rec["log_bytes"]
        start = whole["offset"] + raw.rindex(UTF8_LINE.encode())
        tail = raw[raw.rindex(UTF8_LINE.encode()):].decode()
        for max_bytes in (1, 2, 3):
            text, offset = "", start
            for _ in range(1000):
                got = c.get(f"/v1/images/builds/{r['id']}/log?offset={offset}"
                            f"&max_bytes={max_bytes}", expect=200).json
                if got["next_offset"] == offset:
                    break
                assert got["text"] and "\ufffd" not in got["text"], got
                assert len(got["text"].encode()) <= max(max_bytes, 4)
                text += got["text"]
                offset = got["next_offset"]
            assert got["done"] and text == tail, (max_bytes, text, tail)
    finally:
        c.delete("/v1/images/it-log:1", expect=(204, 404))
        c.delete("/v1/images/it-log-base:1", expect=204)
