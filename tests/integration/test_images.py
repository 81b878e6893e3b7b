"""Images on a live edge (issue 5): import (rootfs tar, .tar.gz, .tar.zst, an OCI layout made by
umoci, EROFS layers), stacked images at create, snapshot (pack_diff) and fork, garbage
collection, an edge restart (and kill -9 mid-import), malicious archives, and the API's errors.

Images here are tiny root filesystems around /bin/busybox (busybox-static), so every test runs
real programs from the image it made, not from the host."""

import gzip
import io
import os
import pathlib
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time

import pytest

from edge_harness import CONTAINERS_ONLY, KIND, wait_until

BUSYBOX = "/bin/busybox"
APPLETS = ["sh", "cat", "ls", "id", "rm", "echo", "mkdir", "touch", "stat", "sha256sum", "dd",
           "sleep", "ps", "hostname", "wc", "find", "readlink", "head"]
OCTET = {"Content-Type": "application/octet-stream"}


def need_busybox():
    if not os.access(BUSYBOX, os.X_OK):
        pytest.skip(f"{BUSYBOX} is missing (Debian's busybox-static; scripts/install-deps)")


def make_tar(entries, compress=None):
    """entries: (name, kind, data[, mode]); kinds dir, file, symlink, hardlink, busybox, chr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            name, kind, data = e[:3]
            mode = e[3] if len(e) > 3 else None
            if kind == "busybox":
                t.add(BUSYBOX, name)
                continue
            i = tarfile.TarInfo(name)
            i.mtime = 1700000000
            if kind == "dir":
                i.type, i.mode = tarfile.DIRTYPE, mode or 0o755
                t.addfile(i)
            elif kind == "file":
                i.size, i.mode = len(data), mode or 0o644
                t.addfile(i, io.BytesIO(data))
            elif kind == "symlink":
                i.type, i.linkname = tarfile.SYMTYPE, data
                t.addfile(i)
            elif kind == "hardlink":
                i.type, i.linkname = tarfile.LNKTYPE, data
                t.addfile(i)
            elif kind == "chr":
                i.type, i.devmajor, i.devminor, i.mode = tarfile.CHRTYPE, 1, 3, 0o666
                t.addfile(i)
            else:
                raise ValueError(kind)
    raw = buf.getvalue()
    if compress == "gz":
        return gzip.compress(raw)
    if compress == "zst":
        return zstd(raw)
    return raw


def zstd(raw):
    return subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE,
                          check=True).stdout


def busybox_rootfs(extra=()):
    entries = [("bin", "dir", None), ("etc", "dir", None), ("bin/busybox", "busybox", None)]
    entries += [(f"bin/{a}", "hardlink", "bin/busybox") for a in APPLETS]
    entries += [("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n"),
                ("etc/group", "file", b"root:x:0:\n"),
                ("etc/motd", "file", b"from-image\n")]
    return make_tar(entries + list(extra))


def import_image(c, name, body, expect=201, **query):
    q = "&".join(f"{k}={v}" for k, v in query.items())
    r = c.post(f"/v1/images/import?name={name}" + (f"&{q}" if q else ""), body, headers=OCTET,
               expect=expect)
    return r.json


def sh(c, sid, script, expect_exit=0):
    r = c.exec(sid, cmd=["/bin/sh", "-c", script])
    assert r["exit_code"] == expect_exit, (
        f"{script!r}: exit {r['exit_code']}, stdout {r['stdout']!r}, stderr {r['stderr']!r}")
    return r["stdout"]


def image_names(c):
    return {i["name"] for i in c.get("/v1/images", expect=200).json["images"]}


def layer_paths(edge, digest):
    hexd = digest.split(":", 1)[1]
    base = edge.state_dir / "images" / "layers"
    return [p for p in (base / hexd, base / f"{hexd}.erofs") if p.exists()]


def tmp_entries(edge):
    d = edge.state_dir / "images" / "tmp"
    return sorted(os.listdir(d)) if d.exists() else []


def test_import_tar_gz_zst_store_one_layer_and_run(edge, client):
    """A rootfs tar, the same as .tar.gz and .tar.zst, import to one stored layer (content
    addressed by the uncompressed tar); sandboxes run the image's own busybox."""
    need_busybox()
    c = client
    raw = busybox_rootfs()
    imgs = []
    try:
        for name, body in (("it-bb:tar", raw), ("it-bb:gz", gzip.compress(raw)),
                           ("it-bb:zst", zstd(raw))):
            img = import_image(c, name, body)
            imgs.append(img)
            assert img["name"] == name and img["base"] is None and img["source"] == "import"
            assert len(img["layers"]) == 1 and img["in_use"] == 0
        assert len({i["layers"][0]["digest"] for i in imgs}) == 1
        assert len(layer_paths(edge, imgs[0]["layers"][0]["digest"])) == 1
        listed = {i["name"]: i for i in c.get("/v1/images", expect=200).json["images"]}
        assert {"host", "it-bb:tar", "it-bb:gz", "it-bb:zst"} <= set(listed)
        assert c.get("/v1/images/it-bb:gz", expect=200).json == listed["it-bb:gz"]

        sb = c.create({"image": "it-bb:zst"})
        try:
            assert sb["image"] == "it-bb:zst"
            assert c.get("/v1/images/it-bb:zst", expect=200).json["in_use"] == 1
            out = sh(c, sb["id"], "cat /etc/motd; id -u; ls /usr 2>&1; true")
            lines = out.splitlines()
            assert lines[0] == "from-image" and lines[1] == "1000"
            # No host tree below: /usr does not exist in this image.
            assert "No such file" in lines[-1], out
        finally:
            c.remove(sb["id"])
        # The same name again is a conflict; the stored image is unchanged.
        import_image(c, "it-bb:tar", raw, expect=409)
    finally:
        for i in imgs:
            c.delete(f"/v1/images/{i['name']}", expect=204)
    wait_until(lambda: not layer_paths(edge, imgs[0]["layers"][0]["digest"]), 10,
               what="layer collected")


def test_stacked_images_in_order_with_whiteouts(edge, client):
    """A stack ["base", "proj", "tool"] shows each layer over the ones below it, an OCI
    whiteout in a later image hides a file, and "host" may start a stack."""
    need_busybox()
    c = client
    import_image(c, "it-stack-base:1", busybox_rootfs([("etc/layer", "file", b"base\n")]))
    import_image(c, "it-stack-proj:1", make_tar([
        ("etc", "dir", None), ("etc/layer", "file", b"proj\n"), ("etc/.wh.motd", "file", b""),
        ("srv", "dir", None), ("srv/proj.txt", "file", b"project\n")]))
    import_image(c, "it-stack-tool:1", make_tar([
        ("opt", "dir", None), ("opt/tool", "file", b"#!/bin/sh\necho tool-ran\n", 0o755)]))
    ids = []
    try:
        sb = c.create({"image": ["it-stack-base:1", "it-stack-proj:1", "it-stack-tool:1"]})
        ids.append(sb["id"])
        assert sb["image"] == ["it-stack-base:1", "it-stack-proj:1", "it-stack-tool:1"]
        out = sh(c, sb["id"], "cat /etc/layer /srv/proj.txt; /opt/tool; "
                              "test -e /etc/motd && echo motd || echo no-motd")
        assert out == "proj\nproject\ntool-ran\nno-motd\n"
        # The order matters: proj below base shows base's file.
        sb2 = c.create({"image": ["it-stack-proj:1", "it-stack-base:1"]})
        ids.append(sb2["id"])
        assert sh(c, sb2["id"], "cat /etc/layer /etc/motd") == "base\nfrom-image\n"
        # On the host image: the host's programs plus the layers' files.
        sb3 = c.create({"image": ["host", "it-stack-proj:1", "it-stack-tool:1"]})
        ids.append(sb3["id"])
        out = sh(c, sb3["id"], "cat /srv/proj.txt; /opt/tool; python3 -c 'print(6*7)'")
        assert out == "project\ntool-ran\n42\n"
        c.post("/v1/sandboxes", {"image": ["it-stack-proj:1", "host"]}, expect=400)
        c.post("/v1/sandboxes", {"image": ["it-stack-proj:1", "it-no-such:1"]}, expect=404)
        c.post("/v1/sandboxes", {"image": []}, expect=400)
    finally:
        for sid in ids:
            c.remove(sid)
        for n in ("it-stack-base:1", "it-stack-proj:1", "it-stack-tool:1"):
            c.delete(f"/v1/images/{n}", expect=204)


def test_snapshot_then_new_sandbox_sees_files(edge, client):
    """Snapshot keeps files, deletions and modes, leaves out the per-sandbox files, and the
    sandbox keeps running; a sandbox made from the snapshot sees exactly that state."""
    need_busybox()
    c = client
    import_image(c, "it-snap-base:1", busybox_rootfs([
        ("srv", "dir", None, 0o777), ("srv/gone.txt", "file", b"x\n", 0o666)]))
    ids, snaps = [], []
    try:
        sb = c.create({"image": "it-snap-base:1"})
        ids.append(sb["id"])
        sid = sb["id"]
        sh(c, sid, "echo kept > /workspace/kept.txt; mkdir -p /workspace/d/e; "
                   "echo deep > /workspace/d/e/f; chmod 0750 /workspace/d; rm /srv/gone.txt; "
                   "ln -s kept.txt /workspace/link; ln /workspace/kept.txt /workspace/hard; "
                   "sleep 1000 >/dev/null 2>&1 &")
        before = sh(c, sid, "ps | grep -c '[s]leep 1000' || true")
        snap = c.post(f"/v1/sandboxes/{sid}/snapshot", {"image": "it-snap:1"}, expect=201).json
        snaps.append("it-snap:1")
        assert snap["name"] == "it-snap:1" and snap["source"] == "snapshot"
        assert len(snap["layers"]) == 2 and snap["in_use"] >= 1
        # The sandbox was thawed, its processes kept running.
        assert c.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "running"
        assert sh(c, sid, "ps | grep -c '[s]leep 1000' || true") == before
        sh(c, sid, "echo after > /workspace/after.txt")

        new = c.create({"image": "it-snap:1"})
        ids.append(new["id"])
        out = sh(c, new["id"], "cat /workspace/kept.txt /workspace/d/e/f /workspace/link; "
                               "stat -c '%a %U' /workspace/d; stat -c %h /workspace/hard; "
                               "test -e /srv/gone.txt && echo gone-back || echo gone; "
                               "test -e /workspace/after.txt && echo after || echo before; "
                               "cat /etc/hostname; cat /etc/motd; ps | grep -c '[s]leep 1000' || true")
        assert out == ("kept\ndeep\nkept\n750 sandbox\n2\ngone\nbefore\n"
                       f"{new['id']}\nfrom-image\n0\n"), out
        # Changes in the new sandbox do not reach the old one, nor the image.
        sh(c, new["id"], "echo changed > /workspace/kept.txt")
        assert sh(c, sid, "cat /workspace/kept.txt") == "kept\n"
        third = c.create({"image": "it-snap:1"})
        ids.append(third["id"])
        assert sh(c, third["id"], "cat /workspace/kept.txt") == "kept\n"
        # A snapshot of a snapshot stacks one more layer.
        s2 = c.post(f"/v1/sandboxes/{new['id']}/snapshot", {"image": "it-snap:2"},
                    expect=201).json
        snaps.append("it-snap:2")
        assert len(s2["layers"]) == 3 and s2["layers"][:2] == snap["layers"]
        # The name is taken now.
        c.post(f"/v1/sandboxes/{sid}/snapshot", {"image": "it-snap:1"}, expect=409)
    finally:
        for x in ids:
            c.remove(x)
        for n in snaps + ["it-snap-base:1"]:
            c.delete(f"/v1/images/{n}", expect=204)


def test_snapshot_of_a_host_sandbox_and_paused_sandbox(edge, client):
    """A sandbox on the host image snapshots to an image based on "host"; a paused sandbox
    snapshots and stays paused."""
    if KIND == "microvm":
        pytest.skip(CONTAINERS_ONLY + "a paused microVM cannot be snapshotted (its agent reads "
                    "its disk: 409, test_microvm), and host-based images are containers'")
    c = client
    ids = []
    try:
        sb = c.create({})
        ids.append(sb["id"])
        sh(c, sb["id"], "echo on-host > /workspace/h.txt; mkdir -p /tmp/t; echo t > /tmp/t/x")
        c.post(f"/v1/sandboxes/{sb['id']}/pause", expect=200)
        snap = c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": "it-hostsnap:1"},
                      expect=201).json
        assert snap["base"] == "host" and len(snap["layers"]) == 1
        assert c.get(f"/v1/sandboxes/{sb['id']}", expect=200).json["state"] == "paused"
        new = c.create({"image": "it-hostsnap:1"})
        ids.append(new["id"])
        out = sh(c, new["id"], "cat /workspace/h.txt /tmp/t/x; python3 -c 'print(1)'")
        assert out == "on-host\nt\n1\n"
    finally:
        for x in ids:
            c.remove(x)
        c.delete("/v1/images/it-hostsnap:1", expect=(204, 404))


def test_fork_16_independent_copies(edge, client):
    """fork count=16 makes 16 sandboxes with the parent's files (not its processes); each
    changes its copy without touching the others or the parent."""
    need_busybox()
    c = client
    import_image(c, "it-fork-base:1", busybox_rootfs())
    ids = []
    try:
        parent = c.create({"image": "it-fork-base:1", "memory_mb": 64})
        ids.append(parent["id"])
        sh(c, parent["id"], "echo parent > /workspace/who; sleep 1000 >/dev/null 2>&1 &")
        r = c.post(f"/v1/sandboxes/{parent['id']}/fork", {"count": 16}, expect=201).json
        forks = [s["id"] for s in r["sandboxes"]]
        ids += forks
        assert len(set(forks)) == 16 and parent["id"] not in forks
        for s in r["sandboxes"]:
            assert s["state"] == "running"
            assert s["limits"]["memory_mb"] == 64
        errors = []

        def work(fid):
            try:
                out = sh(c.__class__(c.url, c.token), fid,
                         f"cat /workspace/who; echo {fid} > /workspace/who; "
                         "ps | grep -c '[s]leep 1000' || true")
                assert out == "parent\n0\n", out
            except BaseException as e:  # noqa: BLE001 -- reported below
                errors.append(f"{fid}: {e}")

        threads = [threading.Thread(target=work, args=(f,)) for f in forks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for f in forks:
            assert sh(c, f, "cat /workspace/who") == f"{f}\n"
        assert sh(c, parent["id"], "cat /workspace/who") == "parent\n"
        c.post(f"/v1/sandboxes/{parent['id']}/fork", {"count": 0}, expect=400)
        c.post(f"/v1/sandboxes/{parent['id']}/fork", {"count": 65}, expect=400)
        c.post(f"/v1/sandboxes/{parent['id']}/fork", {"count": "2"}, expect=400)
        c.post("/v1/sandboxes/sb-it-nosuch/fork", {"count": 1}, expect=404)
    finally:
        for x in ids:
            c.remove(x)
        c.delete("/v1/images/it-fork-base:1", expect=204)


def test_gc_removes_only_unreferenced_layers(edge, client):
    """Deleting an image keeps the layers a sandbox or another image still uses; they go when
    the last user does."""
    need_busybox()
    c = client
    a = import_image(c, "it-gc-a:1", busybox_rootfs([("etc/a", "file", b"a\n")]))
    b = import_image(c, "it-gc-b:1", make_tar([("etc", "dir", None),
                                                ("etc/b", "file", b"b\n")]))
    c2 = import_image(c, "it-gc-c:1", busybox_rootfs([("etc/a", "file", b"a\n")]))
    la, lb = a["layers"][0]["digest"], b["layers"][0]["digest"]
    assert c2["layers"][0]["digest"] == la
    sb = c.create({"image": ["it-gc-a:1", "it-gc-b:1"]})
    try:
        c.delete("/v1/images/it-gc-b:1", expect=204)
        assert "it-gc-b:1" not in image_names(c)
        c.get("/v1/images/it-gc-b:1", expect=404)
        assert layer_paths(edge, lb), "a layer in use was removed"
        c.delete("/v1/images/it-gc-a:1", expect=204)
        assert layer_paths(edge, la)  # used by the sandbox and by it-gc-c
        assert sh(c, sb["id"], "cat /etc/a /etc/b") == "a\nb\n"
        c.post("/v1/sandboxes", {"image": "it-gc-b:1"}, expect=404)
    finally:
        c.remove(sb["id"])
    wait_until(lambda: not layer_paths(edge, lb), 10, what="layer b collected")
    assert layer_paths(edge, la), "a layer another image uses was removed"
    c.delete("/v1/images/it-gc-c:1", expect=204)
    wait_until(lambda: not layer_paths(edge, la), 10, what="layer a collected")
    c.delete("/v1/images/it-gc-c:1", expect=404)


def test_erofs_layers(edge, client):
    """layer_format=erofs stores the layer as an EROFS file mounted read-only through a loop
    device; sandboxes read it, and nothing inside can write to it."""
    need_busybox()
    if not shutil.which("mkfs.erofs"):
        pytest.skip("mkfs.erofs is missing (Debian's erofs-utils)")
    c = client
    img = import_image(c, "it-erofs:1", busybox_rootfs([("etc/e", "file", b"erofs\n", 0o666)]),
                       layer_format="erofs")
    digest = img["layers"][0]["digest"]
    assert img["layers"][0]["format"] == "erofs"
    assert [p.name for p in layer_paths(edge, digest)] == [digest.split(":")[1] + ".erofs"]
    ids = []
    try:
        for _ in range(2):
            sb = c.create({"image": "it-erofs:1"})
            ids.append(sb["id"])
            assert sh(c, sb["id"], "cat /etc/e; echo w > /etc/e; cat /etc/e") == "erofs\nw\n"
        assert sh(c, ids[0], "cat /etc/e") == "w\n" and sh(c, ids[1], "cat /etc/e") == "w\n"
        assert edge.loop_devices(), "no loop device behind the EROFS layer"
        fresh = c.create({"image": "it-erofs:1"})
        ids.append(fresh["id"])
        assert sh(c, fresh["id"], "cat /etc/e") == "erofs\n"
    finally:
        for x in ids:
            c.remove(x)
        c.delete("/v1/images/it-erofs:1", expect=204)


def test_oci_layout_from_umoci(edge, client, tmp_path):
    """An OCI image layout made by umoci (two layers, the second deleting a file) imports
    through the API and runs."""
    need_busybox()
    if not shutil.which("umoci"):
        pytest.skip("umoci is missing (Debian's umoci)")
    c = client
    layout, bundle = tmp_path / "layout", tmp_path / "bundle"

    def run(*args):
        subprocess.run(["umoci", *args], check=True, capture_output=True)

    run("init", "--layout", str(layout))
    run("new", "--image", f"{layout}:t")
    run("config", "--image", f"{layout}:t", "--config.env", "FROM_OCI=yes",
        "--config.workingdir", "/srv")
    run("unpack", "--image", f"{layout}:t", str(bundle))
    rootfs = bundle / "rootfs"
    for d in ("bin", "etc", "srv"):
        (rootfs / d).mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin/busybox")
    for a in APPLETS:
        os.link(rootfs / "bin/busybox", rootfs / "bin" / a)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "srv/old.txt").write_text("old\n")
    run("repack", "--refresh-bundle", "--image", f"{layout}:t", str(bundle))
    (rootfs / "srv/old.txt").unlink()
    (rootfs / "srv/new.txt").write_text("new\n")
    run("repack", "--image", f"{layout}:t", str(bundle))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(str(layout), ".")
    img = import_image(c, "it-oci:t", buf.getvalue())
    try:
        assert len(img["layers"]) >= 2
        assert "FROM_OCI=yes" in img["config"]["env"] and img["config"]["workdir"] == "/srv"
        sb = c.create({"image": "it-oci:t"})
        try:
            out = sh(c, sb["id"], "ls /srv; echo $FROM_OCI")
            assert out == "new.txt\nyes\n", out
        finally:
            c.remove(sb["id"])
    finally:
        c.delete("/v1/images/it-oci:t", expect=204)


MALICIOUS = {
    "dotdot": [("../../../../tmp/{canary}/evil", "file", b"pwned\n")],
    "absolute": [("/tmp/{canary}/evil", "file", b"pwned\n")],
    "symlink_then_write": [("x", "symlink", "/tmp/{canary}"), ("x/evil", "file", b"pwned\n")],
    "symlink_dotdot_then_write": [("y", "symlink", "../../../../../tmp/{canary}"),
                                  ("y/evil", "file", b"pwned\n")],
    "device_node": [("dev", "dir", None), ("dev/null2", "chr", None)],
    "hardlink_out_absolute": [("h", "hardlink", "/etc/passwd")],
    "hardlink_out_dotdot": [("h", "hardlink", "../../../../../etc/passwd")],
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_refused(edge, client, case):
    """A malicious rootfs archive is refused with 400; nothing is written outside the store,
    no image or layer appears and the store's tmp dir is empty afterwards."""
    c = client
    canary = pathlib.Path(tempfile.mkdtemp(prefix="dsec-it-canary-"))
    try:
        entries = [(n.format(canary=canary.name), k,
                    d.format(canary=canary.name) if isinstance(d, str) else d)
                   for n, k, d in MALICIOUS[case]]
        layers_before = sorted(os.listdir(edge.state_dir / "images" / "layers"))
        names_before = image_names(c)
        r = c.post("/v1/images/import?name=it-evil:1", make_tar(entries), headers=OCTET,
                   expect=400)
        assert r.json["error"]["message"]
        assert image_names(c) == names_before
        assert sorted(os.listdir(edge.state_dir / "images" / "layers")) == layers_before
        assert tmp_entries(edge) == []
        assert os.listdir(canary) == []
        assert not (edge.state_dir / "evil").exists() and not (edge.root / "evil").exists()
    finally:
        shutil.rmtree(canary)


def test_huge_and_bomb_archives_refused(make_edge):
    """A header claiming a terabyte, a truncated archive, a gzip bomb and a layer over the
    node's limit are refused (400/413) and leave nothing behind."""
    edge = make_edge(config={"max_import_bytes": 16 << 20, "image_max_layer_bytes": 4 << 20})
    c = edge.client()
    # A header claiming 1 TiB of content, then the end of the archive.
    h = tarfile.TarInfo("huge")
    h.size = 1 << 40
    huge = h.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024
    r = c.post("/v1/images/import?name=it-huge:1", huge, headers=OCTET, expect=(400, 413))
    # Cut in the middle of a file.
    whole = make_tar([("a", "file", b"x" * 100000)])
    c.post("/v1/images/import?name=it-cut:1", whole[:50000], headers=OCTET, expect=400)
    # 64 MiB of zeros in a 64 KiB gzip: over max_import_bytes once decompressed.
    bomb = gzip.compress(make_tar([("zeros", "file", b"\0" * (64 << 20))]), 9)
    assert len(bomb) < 200 << 10
    r = c.post("/v1/images/import?name=it-bomb:1", bomb, headers=OCTET, expect=413)
    # 8 MiB of file content: within the archive limit, over the layer limit.
    big = make_tar([("big", "file", os.urandom(8 << 20))])
    r = c.post("/v1/images/import?name=it-big:1", big, headers=OCTET, expect=413)
    assert "larger" in r.json["error"]["message"] or "limit" in r.json["error"]["message"]
    # Not even a tar.
    c.post("/v1/images/import?name=it-junk:1", os.urandom(4096), headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-empty:1", b"", headers=OCTET, expect=400)
    assert image_names(c) == {"host"}
    assert os.listdir(edge.state_dir / "images" / "layers") == []
    assert tmp_entries(edge) == []
    # The edge still serves.
    need_busybox()
    import_image(c, "it-ok:1", busybox_rootfs())
    sb = c.create({"image": "it-ok:1"})
    assert sh(c, sb["id"], "cat /etc/motd") == "from-image\n"
    c.remove(sb["id"])


def test_restart_keeps_store_consistent(make_edge):
    """kill -9 of the edge (once mid-import): after the restart the images, the layers in use
    by re-adopted sandboxes and snapshots are all there, the half-made import is not, and the
    store's tmp dir is empty."""
    need_busybox()
    edge = make_edge()
    c = edge.client()
    base = import_image(c, "it-rs-base:1", busybox_rootfs())
    sb = c.create({"image": "it-rs-base:1", "idle_ttl_s": 0})
    sh(c, sb["id"], "echo before-restart > /workspace/f")
    snap = c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": "it-rs-snap:1"},
                  expect=201).json
    child = c.create({"image": "it-rs-snap:1", "idle_ttl_s": 0})
    # The snapshot image goes; its layer stays for the sandbox made from it.
    c.delete("/v1/images/it-rs-snap:1", expect=204)
    top = snap["layers"][-1]["digest"]
    assert layer_paths(edge, top)

    # An import in flight when the edge dies.
    big = busybox_rootfs([("srv", "dir", None), ("srv/blob", "file", os.urandom(96 << 20))])
    done = threading.Event()

    def send():
        try:
            edge.client(timeout=30).post("/v1/images/import?name=it-rs-half:1", big,
                                         headers=OCTET, validate=False)
        except Exception:  # noqa: BLE001 -- the edge is killed under it
            pass
        done.set()

    t = threading.Thread(target=send)
    t.start()
    # The body has arrived and the import is unpacking it into the store's tmp dir.
    wait_until(lambda: tmp_entries(edge), 30, interval=0.01, what="import in progress")
    edge.kill9()
    t.join(60)
    assert done.is_set()

    edge.launch()
    assert edge.adopted == 2, edge.ready_line
    c = edge.client()
    names = image_names(c)
    assert "it-rs-base:1" in names and "it-rs-half:1" not in names
    assert "it-rs-snap:1" not in names
    assert tmp_entries(edge) == []
    assert layer_paths(edge, top), "a layer held by an adopted sandbox was collected"
    assert sh(c, child["id"], "cat /workspace/f") == "before-restart\n"
    assert sh(c, sb["id"], "cat /workspace/f") == "before-restart\n"
    # Snapshot and fork still work on adopted sandboxes.
    again = c.post(f"/v1/sandboxes/{child['id']}/snapshot", {"image": "it-rs-snap:2"},
                   expect=201).json
    assert again["layers"][:2] == snap["layers"]
    forks = c.post(f"/v1/sandboxes/{sb['id']}/fork", {"count": 2}, expect=201).json
    for f in forks["sandboxes"]:
        assert sh(c, f["id"], "cat /workspace/f") == "before-restart\n"
        c.remove(f["id"])
    c.remove(child["id"])
    c.delete("/v1/images/it-rs-snap:2", expect=204)
    wait_until(lambda: not layer_paths(edge, top), 10, what="snapshot layer collected")
    # A clean restart with nothing in use keeps exactly the named images' layers.
    c.remove(sb["id"])
    edge.stop()
    edge.launch()
    c = edge.client()
    assert image_names(c) == {"host", "it-rs-base:1"}
    # (a layer's sidecar files, <hex>.dirs and <hex>.erofs, go with it)
    on_disk = {n.split(".")[0] for n in os.listdir(edge.state_dir / "images" / "layers")}
    assert on_disk == {base["layers"][0]["digest"].split(":")[1]}


def test_image_api_errors(edge, client):
    """Bad names, unknown images and sandboxes, the built-in host image and bad import options
    get clear 4xx errors."""
    c = client
    host = c.get("/v1/images/host", expect=200).json
    assert host["builtin"] is True and host["name"] == "host"
    c.delete("/v1/images/host", expect=409)
    c.get("/v1/images/it-none:1", expect=404)
    c.delete("/v1/images/it-none:1", expect=404)
    c.get("/v1/images/Bad%20Name", expect=400)
    tar = make_tar([("etc", "dir", None), ("etc/x", "file", b"x")])
    c.post("/v1/images/import", tar, headers=OCTET, expect=400)  # no name
    c.post("/v1/images/import?name=host", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=UPPER:1", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-x:1&format=zip", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-x:1&layer_format=ext4", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-x:1&base=debian", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-x:1&format=oci", tar, headers=OCTET, expect=400)
    c.post("/v1/images/import?name=it-x:1&format=docker", tar, headers=OCTET, expect=400)
    assert "it-x:1" not in image_names(c)
    c.post("/v1/sandboxes/sb-it-nosuch/snapshot", {"image": "it-y:1"}, expect=404)
    sb = c.create({})
    try:
        c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {}, expect=400)
        c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": "host"}, expect=400)
        c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": 7}, expect=400)
        c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": "it-y:1", "x": 1}, expect=400)
    finally:
        c.remove(sb["id"])
    assert tmp_entries(edge) == []


# ---- builds (POST /v1/images/build) ----------------------------------------------------------

def wait_build(c, bid, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        rec = c.get(f"/v1/images/builds/{bid}", expect=200).json
        if rec["state"] not in ("queued", "running", "canceling"):
            return rec
        assert time.monotonic() < deadline, f"build {bid} still {rec['state']}: {rec}"
        time.sleep(0.2)


def build_log(c, bid):
    text, offset = "", 0
    while True:
        r = c.get(f"/v1/images/builds/{bid}/log?offset={offset}", expect=200).json
        text += r["text"]
        if r["next_offset"] == offset:
            return text
        offset = r["next_offset"]


def build_sandboxes(c):
    return [s["id"] for s in c.get("/v1/sandboxes", expect=200).json["sandboxes"]
            if "dsec.build" in s["labels"]]


def test_build_from_an_image_with_run_steps(edge, client):
    """A build from an image runs its steps as root in a sandbox, in order, with env and
    workdir; the result is one new layer on top, the log has every step's output, and the
    build sandbox is gone."""
    need_busybox()
    c = client
    base = import_image(c, "it-bld-base:1", busybox_rootfs())
    try:
        r = c.post("/v1/images/build", {
            "name": "it-bld:1", "from": "it-bld-base:1", "env": {"APP_MODE": "built"},
            "workdir": "/opt/app",
            "run": ["id -u; echo \"$APP_MODE\" > mode; pwd", "cat /opt/app/mode; echo done"]},
            expect=202).json
        assert r["state"] in ("queued", "running") and r["name"] == "it-bld:1"
        assert [s["name"] for s in r["steps"]][-1] == "save image it-bld:1"
        rec = wait_build(c, r["id"])
        assert rec["state"] == "succeeded", rec
        assert rec["image"] == "it-bld:1" and rec["progress"] == 1 and rec["error"] is None
        assert all(s["state"] == "done" for s in rec["steps"])
        log = build_log(c, r["id"])
        assert "\n0\n/opt/app\n" in log and "built\ndone\n" in log, log
        # The capture says how far it is (a line every 5 s for a big layer), then that it stores.
        assert "[dsec] layer read (0 MiB), storing it\n" in log, log
        img = c.get("/v1/images/it-bld:1", expect=200).json
        assert img["source"] == "build" and img["layers"][0] == base["layers"][0]
        assert len(img["layers"]) == 2
        assert "APP_MODE=built" in img["config"]["env"] and img["config"]["workdir"] == "/opt/app"
        assert build_sandboxes(c) == [] and rec["sandbox"] is None
        # The image's workdir is the sandbox's (its own, the user's); elsewhere the build's
        # files are as its root steps left them.
        sb = c.create({"image": "it-bld:1"})
        try:
            assert sb["workdir"] == "/opt/app"
            out = sh(c, sb["id"], "pwd; cat mode; echo $APP_MODE; touch mine")
            assert out == "/opt/app\nbuilt\nbuilt\n", out
        finally:
            c.remove(sb["id"])
        sb = c.create({"image": "it-bld:1", "workdir": "/workspace"})
        try:
            out = sh(c, sb["id"], "pwd; stat -c %U /opt/app")
            assert out == "/workspace\nroot\n", out
        finally:
            c.remove(sb["id"])
        # The name is taken now; a build for it is refused at once.
        c.post("/v1/images/build", {"name": "it-bld:1", "from": "it-bld-base:1",
                                    "run": ["true"]}, expect=409)
    finally:
        c.delete("/v1/images/it-bld:1", expect=(204, 404))
        c.delete("/v1/images/it-bld-base:1", expect=204)


def test_build_failure_and_cancel_leave_nothing(edge, client):
    """A failing step fails the build with its exit status; a canceled build stops at once;
    neither leaves an image, a sandbox or a layer."""
    need_busybox()
    c = client
    import_image(c, "it-bldf-base:1", busybox_rootfs())
    layers = sorted(os.listdir(edge.state_dir / "images" / "layers"))
    try:
        r = c.post("/v1/images/build", {"name": "it-bldf:1", "from": ["it-bldf-base:1"],
                                        "run": ["echo writes > /big", "echo oops; exit 3",
                                                "echo never"]}, expect=202).json
        rec = wait_build(c, r["id"])
        assert rec["state"] == "failed" and "exited with status 3" in rec["error"], rec
        assert rec["sandbox"] is None, rec
        assert [s["state"] for s in rec["steps"]][:3] == ["done", "done", "failed"]
        log = build_log(c, r["id"])
        assert "oops" in log and "never" not in log.replace("$ echo never", "")
        c.get("/v1/images/it-bldf:1", expect=404)

        r = c.post("/v1/images/build", {"name": "it-bldc:1", "from": "it-bldf-base:1",
                                        "run": ["sleep 300"]}, expect=202).json
        wait_until(lambda: c.get(f"/v1/images/builds/{r['id']}", expect=200).json["step"] == 1,
                   30, what="the sleep step running")
        t0 = time.monotonic()
        assert c.delete(f"/v1/images/builds/{r['id']}", expect=200).json["state"] == "canceling"
        rec = wait_build(c, r["id"], timeout=30)
        assert rec["state"] == "canceled" and time.monotonic() - t0 < 15, rec
        assert rec["sandbox"] is None and rec["step"] is None
        # Canceling a finished build returns it as it is.
        assert c.delete(f"/v1/images/builds/{r['id']}", expect=200).json["state"] == "canceled"
        c.get("/v1/images/it-bldc:1", expect=404)
        assert build_sandboxes(c) == []
        wait_until(lambda: sorted(os.listdir(edge.state_dir / "images" / "layers")) == layers,
                   10, what="the failed builds' layers collected")
    finally:
        c.delete("/v1/images/it-bldf-base:1", expect=204)


def test_build_request_errors(edge, client):
    """Bad build requests are 4xx at once, and unknown builds 404."""
    need_busybox()
    c = client
    import_image(c, "it-blde-base:1", busybox_rootfs())
    try:
        for body in ({}, {"name": "it-blde:1"},
                     {"name": "it-blde:1", "base": "debian:bookworm", "from": "it-blde-base:1"},
                     {"name": "it-blde:1", "base": "ubuntu:jammy"},
                     {"name": "it-blde:1", "base": "debian:Bookworm"},
                     {"name": "it-blde:1", "base": "debian:bookworm", "packages": ["-oops"]},
                     {"name": "it-blde:1", "base": "debian:bookworm", "packages": ["a b"]},
                     {"name": "it-blde:1", "base": "debian:bookworm", "variant": "fat"},
                     {"name": "it-blde:1", "from": "it-blde-base:1"},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": []},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": [""]},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": ["true"],
                      "packages": ["git"]},
                     {"name": "it-blde:1", "from": ["it-blde-base:1", "host"], "run": ["true"]},
                     {"name": "it-blde:1", "from": [], "run": ["true"]},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": ["true"],
                      "workdir": "rel"},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": ["true"],
                      "timeout_s": 0},
                     {"name": "Bad Name", "from": "it-blde-base:1", "run": ["true"]},
                     {"name": "it-blde:1", "from": "it-blde-base:1", "run": ["true"],
                      "extra": 1}):
            c.post("/v1/images/build", body, expect=400, validate=False)
        c.post("/v1/images/build", {"name": "it-blde:1", "from": "it-none:1", "run": ["true"]},
               expect=404)
        c.post("/v1/images/build", {"name": "it-blde-base:1", "base": "debian:bookworm"},
               expect=409)
        c.get("/v1/images/builds/bld-0000000000000000", expect=404)
        c.delete("/v1/images/builds/bld-0000000000000000", expect=404)
        c.get("/v1/images/builds/bld-0000000000000000/log", expect=404)
        r = c.post("/v1/images/build", {"name": "it-blde:2", "from": "it-blde-base:1",
                                        "run": ["true"]}, expect=202).json
        c.get(f"/v1/images/builds/{r['id']}/log?offset=-1", expect=400)
        c.get(f"/v1/images/builds/{r['id']}/log?max_bytes=0", expect=400)
        assert wait_build(c, r["id"])["state"] == "succeeded"
        c.delete("/v1/images/it-blde:2", expect=204)
    finally:
        c.delete("/v1/images/it-blde-base:1", expect=204)


def test_build_sandbox_of_a_killed_edge_is_removed(make_edge):
    """kill -9 of the edge during a build: the next edge deletes the build's sandbox; the
    build itself is gone (404) and no image was made."""
    need_busybox()
    edge = make_edge()
    c = edge.client()
    import_image(c, "it-bldk-base:1", busybox_rootfs())
    r = c.post("/v1/images/build", {"name": "it-bldk:1", "from": "it-bldk-base:1",
                                    "run": ["sleep 300"]}, expect=202).json
    wait_until(lambda: c.get(f"/v1/images/builds/{r['id']}", expect=200).json["step"] == 1,
               30, what="the sleep step running")
    assert len(build_sandboxes(c)) == 1
    edge.kill9()
    edge.launch()
    c = edge.client()
    assert build_sandboxes(c) == []
    c.get(f"/v1/images/builds/{r['id']}", expect=404)
    c.get("/v1/images/it-bldk:1", expect=404)


def debian_mirror_reachable():
    import urllib.request
    try:
        with urllib.request.urlopen("http://deb.debian.org/debian/dists/bookworm/InRelease",
                                    timeout=10) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_shell_session_in_an_image_without_bash(edge, client):
    """Issue 41 item 16: an image with only a POSIX sh (busybox) gets shell sessions too (and so
    a piped `dsec shell`): cwd, variables and exit codes carry over; multi-line commands,
    quotes, backslashes, trailing newlines and non-ASCII bytes arrive exactly."""
    need_busybox()
    import_image(client, "it-nobash:1", busybox_rootfs())
    sb = client.create({"image": "it-nobash:1"})
    try:
        sh_id = client.post(f"/v1/sandboxes/{sb['id']}/shells", {}, expect=201).json["shell_id"]
        url = f"/v1/sandboxes/{sb['id']}/shells/{sh_id}/run"

        def run(cmd):
            return client.post(url, {"command": cmd}, expect=200).json

        assert run("mkdir -p /tmp/d && cd /tmp/d && X='a b'")["exit_code"] == 0
        r = run('pwd; echo "$X"')
        assert r["stdout"] == "/tmp/d\na b\n", r
        assert run("(exit 5)")["exit_code"] == 5
        tricky = "printf '%s|' 'q\"uo\\\\te' \"$X\" 'ünï' \\\n  && echo\ncat <<'EOF'\nline $X\nEOF\n\n"
        r = run(tricky)
        assert r["stdout"] == 'q"uo\\\\te|a b|ünï|\nline $X\n', r
        assert r["exit_code"] == 0
        client.delete(f"/v1/sandboxes/{sb['id']}/shells/{sh_id}", expect=204)
    finally:
        client.remove(sb["id"])
        client.delete("/v1/images/it-nobash:1", expect=204)
