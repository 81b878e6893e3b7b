"""Disk-backed writable layers (issue 5): a sandbox whose disk_mb is above the node's
tmpfs_disk_max_mb gets an ext4 disk image of exactly disk_mb instead of a tmpfs, not charged to
its memory. The size and the inode count are hard caps for every user inside (root too, with
and without a user namespace); snapshot and fork work from it; a killed edge re-adopts it; and
nothing (loop devices, image files, mounts) outlives the sandbox."""

import os
import subprocess

import pytest

from edge_harness import CONTAINERS_ONLY, KIND, wait_until

pytestmark = pytest.mark.skipif(
    KIND == "microvm",
    reason=CONTAINERS_ONLY + "a microVM's writable layer is a tmpfs in its guest's RAM (disk_mb "
    "is added to the VM's RAM); disk images and their loop devices are containers'")

MB = 1 << 20
# Small enough for tests: anything above 64 MB is a disk image on these edges, made at create
# (no pool of ready images, so the loop devices counted are the sandboxes').
CONFIG = {"tmpfs_disk_max_mb": 64, "disk_pool": 0}


def need_loop():
    if not os.access("/dev/loop-control", os.R_OK | os.W_OK):
        pytest.skip("no /dev/loop-control: disk images need loop devices")


def stats(c, sid):
    return c.get(f"/v1/sandboxes/{sid}/stats", expect=200).json


def py(c, sid, code, user=None, expect_exit=0):
    fields = {"user": user} if user else {}
    r = c.exec(sid, cmd=["python3", "-c", code], timeout_ms=120000, **fields)
    assert r["exit_code"] == expect_exit, r
    return r["stdout"]


FILL = """
import errno, os, sys
path, want = sys.argv[1] if len(sys.argv) > 1 else '/workspace/big', {want}
done, err = 0, 0
chunk = b'x' * (1 << 20)
with open('{path}', 'wb') as f:
    try:
        while done < want:
            done += f.write(chunk)
        f.flush(); os.fsync(f.fileno())
    except OSError as e:
        err = e.errno
print(done >> 20, errno.errorcode.get(err, err))
"""

INODES = """
import errno, os
os.makedirs('/workspace/many', exist_ok=True)
n, err = 0, 0
try:
    while n < 200000:
        open(f'/workspace/many/{n}', 'w').close(); n += 1
except OSError as e:
    err = e.errno
print(n, errno.errorcode.get(err, err))
"""


def agent_pid(edge, sid):
    """The host pid of the sandbox's PID 1 (dsec-agent)."""
    for pid in edge.sandbox_pids(sid):
        try:
            with open(f"/proc/{pid}/status") as f:
                if any(ln.startswith("NSpid:") and ln.split()[-1] == "1" for ln in f):
                    return pid
        except OSError:
            pass
    raise AssertionError(f"no agent process found for {sid}")


def disk_loops(edge):
    return [d for d in edge.loop_devices() if "/disks/" in d]


def no_disk_loops(edge):
    """A deleted sandbox's disk is unmounted off the delete's path: wait for its loop device."""
    wait_until(lambda: disk_loops(edge) == [], 10, what="disk images unmounted")
    return True


def image_files(edge):
    d = edge.state_dir / "disks"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def check_disk_sandbox(c, sid, disk_mb, user=None):
    st = stats(c, sid)
    assert st["disk_kind"] == "image", st
    assert st["disk_limit"] == disk_mb * MB
    # df inside shows the disk's size (the overlay reports its upper filesystem).
    size = int(py(c, sid, "import os; s = os.statvfs('/workspace'); "
                          "print(s.f_blocks * s.f_frsize)"))
    assert disk_mb * MB * 0.85 <= size <= disk_mb * MB, size
    out = py(c, sid, FILL.format(want=2 * disk_mb * MB, path="/workspace/big"), user=user)
    written, err = out.split()
    assert err == "ENOSPC", out
    assert disk_mb * 0.8 <= int(written) <= disk_mb, out
    used = stats(c, sid)["disk_used"]
    assert disk_mb * MB * 0.8 <= used <= disk_mb * MB, used
    py(c, sid, "import os; os.remove('/workspace/big')", user=user)
    wait_until(lambda: stats(c, sid)["disk_used"] < 16 * MB, 10, what="space freed")


def test_big_disk_is_an_image_with_hard_caps_not_charged_to_memory(make_edge):
    """disk_mb=256 on a node with tmpfs_disk_max_mb=64: the writable layer is a 256 MB ext4
    image; writing 512 MB stops with ENOSPC near 256 MB for the sandbox user and for root; inode
    exhaustion stops with ENOSPC near disk_mb * 256; the memory limit is memory_mb alone and
    writing 200 MB through 48 MB of memory does not OOM; a 32 MB disk on the same node is still
    a tmpfs charged to memory. Deleting frees the loop device and leaves no file."""
    need_loop()
    edge = make_edge(config=CONFIG)
    c = edge.client(timeout=180)
    sb = c.create({"disk_mb": 256, "memory_mb": 48})
    sid = sb["id"]
    try:
        assert image_files(edge) == []  # the image has no name once attached
        st = stats(c, sid)
        assert st["disk_kind"] == "image" and st["memory_limit"] == 48 * MB, st
        check_disk_sandbox(c, sid, 256)
        check_disk_sandbox(c, sid, 256, user="root")
        # 200 MB written through a 48 MB memory limit: page cache is reclaimed, no OOM.
        out = py(c, sid, FILL.format(want=200 * MB, path="/workspace/mid"))
        assert out.split() == ["200", "0"], out
        assert stats(c, sid)["oom_kills"] == 0
        py(c, sid, "import os; os.remove('/workspace/mid')")
        n, err = py(c, sid, INODES).split()
        assert err == "ENOSPC", (n, err)
        assert 256 * 256 * 0.9 <= int(n) <= 256 * 256, n
        # Freed inodes are usable again.
        py(c, sid, "import shutil; shutil.rmtree('/workspace/many'); "
                   "open('/workspace/keep', 'w').write('kept')")
        assert py(c, sid, "print(open('/workspace/keep').read())") == "kept\n"

        small = c.create({"disk_mb": 32, "memory_mb": 48})
        try:
            st = stats(c, small["id"])
            assert st["disk_kind"] == "tmpfs" and st["memory_limit"] == 80 * MB, st
        finally:
            c.remove(small["id"])
    finally:
        c.remove(sid)
    assert no_disk_loops(edge)
    assert image_files(edge) == []


def test_without_user_namespace_root_is_capped_too(make_edge):
    """With userns off (root inside is the host's root, with a reduced capability set), the
    disk image still stops root at its size: no reserved blocks, no growth past the device."""
    need_loop()
    edge = make_edge(config={**CONFIG, "userns": False})
    c = edge.client(timeout=180)
    sb = c.create({"disk_mb": 128, "user": "root"})
    try:
        check_disk_sandbox(c, sb["id"], 128, user="root")
    finally:
        c.remove(sb["id"])
    assert no_disk_loops(edge)


def test_snapshot_and_fork_of_a_disk_sandbox(make_edge):
    """A snapshot of a disk-image sandbox captures its files (from the ext4 upper); sandboxes
    made from it (tmpfs or image) and a fork of 2 see them, each on its own disk."""
    need_loop()
    edge = make_edge(config=CONFIG)
    c = edge.client(timeout=180)
    sb = c.create({"disk_mb": 128})
    ids = [sb["id"]]
    try:
        c.sh(sb["id"], "mkdir -p /workspace/d && echo deep > /workspace/d/f && "
                       "head -c 3000000 /dev/urandom > /workspace/blob && "
                       "sha256sum /workspace/blob > /workspace/blob.sum")
        snap = c.post(f"/v1/sandboxes/{sb['id']}/snapshot", {"image": "it-disk-snap:1"},
                      expect=201).json
        assert snap["name"] == "it-disk-snap:1"
        for body in ({"image": "it-disk-snap:1", "disk_mb": 32},
                     {"image": "it-disk-snap:1", "disk_mb": 96}):
            new = c.create(body)
            ids.append(new["id"])
            assert stats(c, new["id"])["disk_kind"] == ("image" if body["disk_mb"] > 64
                                                        else "tmpfs")
            assert c.sh(new["id"], "cat /workspace/d/f; cd /workspace && sha256sum -c blob.sum"
                        ) == "deep\n/workspace/blob: OK\n"
        forks = c.post(f"/v1/sandboxes/{sb['id']}/fork", {"count": 2}, expect=201).json
        for f in forks["sandboxes"]:
            ids.append(f["id"])
            assert stats(c, f["id"])["disk_kind"] == "image"
            assert c.sh(f["id"], "cat /workspace/d/f") == "deep\n"
        # Independent disks: a write in one fork is nowhere else.
        c.sh(ids[-1], "echo mine > /workspace/d/f")
        assert c.sh(ids[-2], "cat /workspace/d/f") == "deep\n"
        assert c.sh(sb["id"], "cat /workspace/d/f") == "deep\n"
        # The original, the 96 MB one and the 2 forks (layers may have loop devices too).
        assert len(disk_loops(edge)) == 4, edge.loop_devices()
    finally:
        for x in ids:
            c.remove(x)
        c.delete("/v1/images/it-disk-snap:1", expect=204)
    assert no_disk_loops(edge)


def test_killed_edge_readopts_disk_sandboxes_and_nothing_leaks(make_edge):
    """kill -9 of the edge: the disk sandbox is adopted with its files, caps and stats; a disk
    sandbox whose agent dies meanwhile takes its loop device with it; an image file left by an
    interrupted create is removed at start."""
    need_loop()
    edge = make_edge(config=CONFIG)
    c = edge.client(timeout=180)
    keep = c.create({"disk_mb": 96, "idle_ttl_s": 0})
    dies = c.create({"disk_mb": 80, "idle_ttl_s": 0})
    c.sh(keep["id"], "echo survived > /workspace/f")
    assert len(disk_loops(edge)) == 2
    agent = agent_pid(edge, dies["id"])
    edge.kill9()
    # The second sandbox ends while no edge runs: its namespace goes, and with it its disk.
    os.kill(agent, 9)
    (edge.state_dir / "disks" / "sb-interrupted.img").write_bytes(b"\0" * 4096)
    wait_until(lambda: len(disk_loops(edge)) == 1, 10, what="the dead sandbox's disk freed")
    edge.launch()
    c = edge.client(timeout=180)
    assert image_files(edge) == []
    assert c.sh(keep["id"], "cat /workspace/f") == "survived\n"
    check_disk_sandbox(c, keep["id"], 96)
    c.remove(keep["id"])
    c.delete(f"/v1/sandboxes/{dies['id']}")
    assert no_disk_loops(edge)


def test_a_node_without_room_refuses_a_disk_image_and_keeps_serving(make_edge, tmp_path):
    """Disk images take their whole size on disk_dir's filesystem at create: on a node whose
    disk_dir holds 160 MB, a 256 MB disk can never fit (422 with the maximum); with one 96 MB
    disk made, a second is 429 over_capacity (no room left now) and the edge keeps serving;
    with disk_preallocate false the 256 MB create succeeds (sparse)."""
    need_loop()
    small = tmp_path / "disks"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,nosuid,nodev", "tmpfs", str(small)],
                   check=True)
    try:
        edge = make_edge(config={**CONFIG, "disk_dir": str(small)})
        c = edge.client(timeout=120)
        r = c.post("/v1/sandboxes", {"disk_mb": 256}, expect=422)
        assert "can never fit" in r.json["error"]["message"], r.json
        assert "at most 160 MiB" in r.json["error"]["message"], r.json
        first = c.create({"disk_mb": 96})["id"]
        r = c.post("/v1/sandboxes", {"disk_mb": 96}, expect=429)
        assert r.json["error"]["code"] == "over_capacity", r.json
        assert "no room" in r.json["error"]["message"], r.json
        assert os.listdir(small) == []  # made images have no name; the refused one left nothing
        sid = c.create({"disk_mb": 32})["id"]  # a tmpfs layer: not from disk_dir
        assert c.sh(sid, "echo ok") == "ok\n"
        c.remove(sid)
        c.remove(first)
        assert os.listdir(small) == []
        edge.stop()
        edge.config["disk_preallocate"] = False
        edge.launch()
        c = edge.client(timeout=120)
        sb = c.create({"disk_mb": 256})
        try:
            assert stats(c, sb["id"])["disk_kind"] == "image"
            assert c.sh(sb["id"], "echo sparse > /workspace/f && cat /workspace/f") == "sparse\n"
        finally:
            c.remove(sb["id"])
        edge.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_full_disk_is_enospc_and_files_have_no_size_limit(make_edge):
    """As on a normal machine (issue 41, item 11): no RLIMIT_FSIZE in a sandbox, so a file
    that fills the disk gets ENOSPC (write(2) fails, `dd` says so and exits 1), never SIGXFSZ
    (which kills a program that does not ignore it) or EFBIG at the disk's size."""
    edge = make_edge(config=CONFIG)
    c = edge.client(timeout=120)
    sb = c.create({"disk_mb": 32, "memory_mb": 128})  # a tmpfs disk on these edges
    sid = sb["id"]
    try:
        assert c.sh(sid, "ulimit -f").strip() == "unlimited"
        assert py(c, sid, "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE))"
                  ).strip() == "(-1, -1)"
        written, err = py(c, sid, FILL.format(want=64 * MB, path="/workspace/big")).split()
        assert err == "ENOSPC" and 24 <= int(written) <= 32, (written, err)
        c.sh(sid, "rm /workspace/big")
        r = c.exec(sid, "dd if=/dev/zero of=/workspace/dd bs=1M count=64")
        assert r["exit_code"] == 1 and "No space left on device" in r["stderr"], r
    finally:
        c.remove(sid)


def test_memory_mb_is_what_the_processes_may_use(make_edge):
    """Issue 41 item 2, on a node with the defaults (every writable layer a disk image, kept
    ready by the pool): memory_mb 64 is the memory limit, so a 150 MiB allocation is OOM-killed
    with an empty disk; the disk is not memory either (writing 200 MB of files through 64 MB
    succeeds, page cache being reclaimed) and a full disk does not take memory from the
    processes; get and stats show the limits as set. Deleting leaves no loop device."""
    need_loop()
    edge = make_edge()
    c = edge.client(timeout=180)
    sb = c.create({"memory_mb": 64, "disk_mb": 256})
    sid = sb["id"]
    try:
        st = stats(c, sid)
        assert st["disk_kind"] == "image" and st["memory_limit"] == 64 * MB, st
        assert st["disk_limit"] == 256 * MB, st
        got = c.get(f"/v1/sandboxes/{sid}", expect=200).json
        assert got["limits"]["memory_mb"] == 64 and got["limits"]["disk_mb"] == 256, got
        r = c.exec(sid, cmd=["python3", "-c", "x = b'x' * (150 << 20); print(len(x))"],
                   timeout_ms=60000)
        assert r["exit_code"] != 0 and r["stdout"] == "", r
        wait_until(lambda: stats(c, sid)["oom_kills"] >= 1, 10, what="the OOM kill counted")
        # 100 MiB fits after the disk took 200 MB: the disk's pages are not the processes'.
        out = py(c, sid, FILL.format(want=200 * MB, path="/workspace/big"))
        assert out.split() == ["200", "0"], out
        assert py(c, sid, "x = b'x' * (40 << 20); print(len(x) >> 20)") == "40\n"
        assert stats(c, sid)["disk_used"] >= 190 * MB
    finally:
        c.remove(sid)
    # The pool's ready images have loop devices while the edge runs; nothing outlives it.
    assert edge.stop() == 0
    wait_until(lambda: disk_loops(edge) == [], 10, what="no disk image left after the edge")
    assert edge.residue() == {}, edge.residue()
