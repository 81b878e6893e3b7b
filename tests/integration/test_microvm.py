"""MicroVM sandboxes on a live edge (issue 16, first step: cold boot): kind "microvm" boots the
image's layers in a QEMU microvm machine whose init and agent is dsec-agent, and serves the
same API as a container: exec, files, stats, pause/resume, delete. On this host's TCG a cold
boot takes ~2 s, so the suite makes few VMs. Skipped, with the node's reason, where the edge
has no microVMs (no QEMU or no guest kernel: scripts/install-deps fetches both)."""

import os
import platform

import pytest

from test_images import busybox_rootfs, import_image, need_busybox, sh


def microvms(client):
    f = client.get("/v1/node", expect=200).json["features"].get("microvm", {})
    if not f.get("available"):
        pytest.skip(f"this edge has no microVMs: {f.get('reason', 'not reported')}")
    return f


@pytest.fixture(scope="module")
def vm_image(edge):
    need_busybox()
    c = edge.client()
    import_image(c, "it-vm:1", busybox_rootfs([("etc/motd", "file", b"from-vm-image\n")]))
    yield "it-vm:1"
    c.delete("/v1/images/it-vm:1", expect=(204, 404))


def qemu_processes(sid):
    """QEMU processes in the sandbox's cgroup (their command lines name no paths: every file
    QEMU uses is a descriptor)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            cgroups = open(f"/proc/{pid}/cgroup").read()
        except OSError:
            continue
        if comm.startswith("qemu-system") and f"-vm/{sid}\n" in cgroups:
            found.append(int(pid))
    return found


def test_node_reports_microvms(client):
    f = microvms(client)
    n = client.get("/v1/node", expect=200).json
    assert n["backends"] == ["container", "microvm"]
    assert f["accel"] in ("tcg", "kvm") and f["kernel"]
    if not os.path.exists("/dev/kvm"):
        assert f["accel"] == "tcg"


def test_microvm_runs_the_image_with_its_own_kernel(edge, client, vm_image):
    microvms(client)
    c = client
    sb = c.create({"kind": "microvm", "image": vm_image, "memory_mb": 192, "disk_mb": 64})
    sid = sb["id"]
    try:
        assert sb["kind"] == "microvm" and sb["state"] == "running"
        out = sh(c, sid, "uname -r; hostname; id -u; cat /etc/motd; pwd").splitlines()
        assert out[0] != platform.release(), "the guest runs the host's kernel?"
        assert out[1:] == [sid, "1000", "from-vm-image", "/workspace"], out
        r = c.exec(sid, "echo oops >&2; exit 7")
        assert r["exit_code"] == 7 and r["stderr"] == "oops\n"

        # Files through the agent, on the guest's writable layer.
        c.put(f"/v1/sandboxes/{sid}/files?path=/workspace/a.txt&mode=0644", b"vm file\n",
              headers={"Content-Type": "application/octet-stream"}, expect=204)
        assert c.get(f"/v1/sandboxes/{sid}/files?path=/workspace/a.txt",
                     expect=200).body == b"vm file\n"
        names = {e["name"] for e in
                 c.get(f"/v1/sandboxes/{sid}/files/list?path=/workspace", expect=200)
                 .json["entries"]}
        assert "a.txt" in names
        assert sh(c, sid, "cat /workspace/a.txt") == "vm file\n"

        st = c.get(f"/v1/sandboxes/{sid}/stats", expect=200).json
        assert st["memory_current"] > 16 << 20 and st["memory_limit"] == (192 + 64) << 20, st

        # Pause stops the VM (QMP stop); resume continues it with its processes.
        sh(c, sid, "sleep 1000 >/dev/null 2>&1 & echo started")
        assert c.post(f"/v1/sandboxes/{sid}/pause", expect=200).json["state"] == "paused"
        assert c.post(f"/v1/sandboxes/{sid}/resume", expect=200).json["state"] == "running"
        assert "sleep 1000" in sh(c, sid, "ps")
        assert len(qemu_processes(sid)) == 1
    finally:
        c.remove(sid)
    assert not (edge.state_dir / "microvms" / sid).exists()
    assert qemu_processes(sid) == []


def test_what_a_microvm_cannot_boot_is_422(client):
    microvms(client)
    r = client.post("/v1/sandboxes", {"kind": "microvm"}, expect=422)
    assert "host" in r.json["error"]["message"]
    client.post("/v1/sandboxes", {"kind": "microvm", "image": "it-no-such:1"}, expect=404)


def test_kill9_then_restart_readopts_the_vm(make_edge):
    """An edge killed with -9 leaves its VMs running; the next edge re-adopts them (QMP and an
    authenticated reconnect to the agent's port) with their files and processes, paused ones
    staying paused; SIGTERM then destroys them and leaves nothing on the host."""
    need_busybox()
    edge = make_edge()
    c = edge.client()
    microvms(c)
    import_image(c, "it-vm-restart:1", busybox_rootfs())
    sid = c.create({"kind": "microvm", "image": "it-vm-restart:1", "memory_mb": 128,
                    "disk_mb": 32})["id"]
    pid_ = c.create({"kind": "microvm", "image": "it-vm-restart:1", "memory_mb": 128,
                     "disk_mb": 32})["id"]
    cid = c.create({"image": "it-vm-restart:1"})["id"]
    sh(c, sid, "echo survives > /workspace/kept.txt; sleep 1000 >/dev/null 2>&1 &")
    c.post(f"/v1/sandboxes/{pid_}/pause", expect=200)
    qemu = qemu_processes(sid)
    assert len(qemu) == 1
    edge.kill9()
    assert qemu_processes(sid) == qemu, "the VM outlives the edge"
    edge.launch()
    assert edge.adopted == 3, edge.ready_line
    c = edge.client()
    assert c.get(f"/v1/sandboxes/{sid}", expect=200).json["state"] == "running"
    assert c.get(f"/v1/sandboxes/{pid_}", expect=200).json["state"] == "paused"
    assert c.get(f"/v1/sandboxes/{cid}", expect=200).json["state"] == "running"
    assert sh(c, sid, "cat /workspace/kept.txt") == "survives\n"
    assert "sleep 1000" in sh(c, sid, "ps")
    assert qemu_processes(sid) == qemu
    c.post(f"/v1/sandboxes/{pid_}/resume", expect=200)
    assert sh(c, pid_, "echo resumed") == "resumed\n"
    # The adopted VMs and the container go with the edge's SIGTERM (the fixture checks that
    # nothing is left); the image goes once nothing uses it.
    c.remove(sid)
    assert qemu_processes(sid) == []
    assert not (edge.state_dir / "microvms" / sid).exists()
    assert not edge.sandbox_cgroup_dirs(sid)
