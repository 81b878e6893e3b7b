"""SDK unit tests (fake server): images — list/get/delete, import from a file,
a file object, bytes or a directory (streamed, the directory packed into a
rootfs tar on the fly), snapshot and fork, and stacked images at create; on
the blocking and the asyncio client."""

from __future__ import annotations

import asyncio
import datetime
import io
import os
import stat
import tarfile
import threading

import pytest

from libdsec import (
    AsyncDSecClient,
    AsyncSandbox,
    BadRequestError,
    ConflictError,
    Image,
    ImageLayer,
    NotFoundError,
    Sandbox,
    SandboxSpec,
    TooLargeError,
    UnavailableError,
)


def rootfs_targz(path, files=None) -> bytes:
    """A small rootfs tar.gz written to ``path``; returns its bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (files or {"etc/os-release": b"ID=fake\n"}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return buf.getvalue()


def make_tree(root) -> None:
    """A root filesystem with what an image must keep: full modes (setuid),
    owners, symlinks (absolute, pointing out), hard links, empty dirs, a
    multi-chunk file, and a FIFO that must be left out."""
    os.makedirs(root / "usr/bin")
    os.makedirs(root / "empty")
    os.makedirs(root / "tmp")
    os.chmod(root / "tmp", 0o1777)
    (root / "usr/bin/su").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "usr/bin/su", 0o4755)
    (root / "etc").mkdir()
    (root / "etc/owned").write_text("x")
    if os.geteuid() == 0:
        os.chown(root / "etc/owned", 1234, 5678)
    os.symlink("/etc/passwd", root / "etc/link")  # outside the tree: must not be followed
    os.link(root / "usr/bin/su", root / "usr/bin/su2")
    (root / "big.bin").write_bytes(bytes(range(256)) * (3 * 4096 + 7))  # > 3 chunks of 1 MiB
    os.mkfifo(root / "fifo")


def received_tar(edge, i=-1):
    q, body, headers = edge.imports[i]
    return q, headers, tarfile.open(fileobj=io.BytesIO(body))


# ---- list / get / delete ----------------------------------------------------------------------


def test_list_get_and_the_builtin_host(client, edge):
    images = client.list_images()
    assert [i.name for i in images] == ["host"]
    host = client.get_image("host")
    assert isinstance(host, Image) and host.builtin and host.source == "builtin"
    assert host.base is None and host.layers == [] and host.size == 0
    assert host.created == datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    assert host.raw["config"]["env"] == []
    with pytest.raises(ConflictError):
        client.delete_image("host")
    with pytest.raises(NotFoundError):
        client.get_image("nope:1")
    with pytest.raises(NotFoundError):
        client.delete_image("nope")
    # The name is one path segment, its ':' kept as is.
    assert edge.seen("GET", "/v1/images/nope:1")
    assert edge.seen("DELETE", "/v1/images/nope")[0].headers["idempotency-key"]


def test_image_model_parses_records():
    img = Image.from_json({
        "name": "proj:abc", "base": "host",
        "layers": [{"digest": "sha256:" + "a" * 64, "size": 10, "format": "erofs"}],
        "config": {"env": ["A=1"], "workdir": "/w", "user": "1000", "entrypoint": ["/e"],
                   "cmd": ["c"]},
        "size": 10, "source": "snapshot", "created_at": "2025-11-30T05:20:00.5+01:00",
        "in_use": 2})
    assert img.layers == [ImageLayer("sha256:" + "a" * 64, 10, "erofs")]
    assert img.config.env == ["A=1"] and img.config.workdir == "/w" and img.config.cmd == ["c"]
    assert img.base == "host" and img.in_use == 2 and not img.builtin
    assert img.created == datetime.datetime(2025, 11, 30, 4, 20, 0, 500000,
                                            tzinfo=datetime.timezone.utc)
    # Tolerated: ms since the epoch, the first version's {"name", "builtin"}.
    assert Image.from_json({"name": "x", "created_at": 1764480000000}).created.year == 2025
    old = Image.from_json({"name": "host", "builtin": True})
    assert old.builtin and old.source == "builtin" and old.created is None


# ---- import -----------------------------------------------------------------------------------


def test_import_file_streams_it_with_its_length(client, edge, tmpdir_clean):
    data = rootfs_targz(tmpdir_clean / "rootfs.tar.gz")
    img = client.import_image("debian:bookworm", tmpdir_clean / "rootfs.tar.gz")
    assert isinstance(img, Image) and img.name == "debian:bookworm"
    assert img.source == "import" and img.base is None and len(img.layers) == 1
    assert img.layers[0].digest.startswith("sha256:") and img.created is not None
    q, body, headers = edge.imports[0]
    assert q == {"name": "debian:bookworm", "format": "auto"}  # None options are left out
    assert body == data
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-length"] == str(len(data))
    assert "transfer-encoding" not in headers and headers["idempotency-key"]
    seen = edge.seen("POST", "/v1/images/import")[0]
    assert ("name", "debian:bookworm") in seen.query
    assert [i.name for i in client.list_images()] == ["host", "debian:bookworm"]
    assert client.get_image("debian:bookworm").layers == img.layers
    client.delete_image("debian:bookworm")
    assert [i.name for i in client.list_images()] == ["host"]


def test_import_options_and_errors(client, edge, tmpdir_clean):
    rootfs_targz(tmpdir_clean / "t.tar.gz")
    img = client.import_image("tk:v2", str(tmpdir_clean / "t.tar.gz"), format="rootfs",
                              layer_format="erofs", base="host")
    assert img.base == "host" and img.layers[0].format == "erofs"
    assert edge.imports[-1][0] == {"name": "tk:v2", "format": "rootfs", "layer_format": "erofs",
                                   "base": "host"}
    with pytest.raises(ConflictError):
        client.import_image("tk:v2", tmpdir_clean / "t.tar.gz")
    (tmpdir_clean / "junk").write_bytes(b"not an archive" * 100)
    with pytest.raises(BadRequestError):
        client.import_image("junk:1", tmpdir_clean / "junk")
    with pytest.raises(BadRequestError):
        client.import_image("Bad Name", tmpdir_clean / "t.tar.gz")
    edge.max_import_bytes = 10
    with pytest.raises(TooLargeError):
        client.import_image("big:1", tmpdir_clean / "t.tar.gz")
    n = len(edge.imports)
    with pytest.raises(ValueError):
        client.import_image("x:1", tmpdir_clean / "t.tar.gz", format="zip")
    with pytest.raises(ValueError):
        client.import_image("x:1", tmpdir_clean, format="oci")  # a directory is a rootfs
    with pytest.raises(FileNotFoundError):
        client.import_image("x:1", tmpdir_clean / "missing.tar")
    with pytest.raises(TypeError):
        client.import_image("x:1", 42)
    assert len(edge.imports) == n  # refused before sending


def test_import_directory_is_a_streamed_rootfs_tar(client, edge, tmpdir_clean):
    root = tmpdir_clean / "rootfs"
    make_tree(root)
    img = client.import_image("mini:1", root)
    assert img.name == "mini:1" and img.source == "import"
    q, headers, tar = received_tar(edge)
    assert q["format"] == "rootfs"
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    m = {t.name: t for t in tar.getmembers()}
    assert sorted(m) == ["big.bin", "empty", "etc", "etc/link", "etc/owned", "tmp", "usr",
                         "usr/bin", "usr/bin/su", "usr/bin/su2"]  # no FIFO, no root entry
    assert m["usr/bin/su"].mode == 0o4755 and m["tmp"].mode == 0o1777
    assert m["etc/link"].issym() and m["etc/link"].linkname == "/etc/passwd"
    assert m["usr/bin/su2"].islnk() and m["usr/bin/su2"].linkname == "usr/bin/su"
    assert all(t.uname == "" and t.gname == "" for t in m.values())  # numeric owners only
    if os.geteuid() == 0:
        assert (m["etc/owned"].uid, m["etc/owned"].gid) == (1234, 5678)
    assert tar.extractfile("big.bin").read() == (root / "big.bin").read_bytes()
    assert tar.extractfile("etc/owned").read() == b"x"


def test_import_fileobj_and_bytes(client, edge, tmpdir_clean):
    data = rootfs_targz(tmpdir_clean / "a.tar.gz")
    f = io.BytesIO(b"skipped prefix" + data)
    f.seek(len(b"skipped prefix"))
    client.import_image("fo:1", f)
    assert edge.imports[-1][1] == data and edge.imports[-1][2]["content-length"] == str(len(data))
    assert not f.closed
    client.import_image("by:1", data)
    assert edge.imports[-1][1] == data
    with open(tmpdir_clean / "a.tar.gz", "rb") as real:
        client.import_image("real:1", real)
    assert edge.imports[-1][1] == data
    with open(tmpdir_clean / "a.tar.gz", "r") as text, pytest.raises(TypeError):
        client.import_image("text:1", text)


class Unseekable(io.RawIOBase):
    """A pipe-like reader: no seek, no length."""

    def __init__(self, data: bytes, fail: bool = False) -> None:
        self._f = io.BytesIO(data)
        self._fail = fail

    def readable(self):
        return True

    def read(self, n=-1):
        if self._fail:
            raise OSError(5, "disk on fire")
        return self._f.read(n)


def test_import_retries_resend_a_replayable_body_only(client, edge, tmpdir_clean):
    data = rootfs_targz(tmpdir_clean / "a.tar.gz")
    edge.fault("POST", "/v1/images/import", "status", status=503)
    client.import_image("retried:1", tmpdir_clean / "a.tar.gz")
    first, second = edge.seen("POST", "/v1/images/import")
    assert first.body == second.body == data
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]

    edge.fault("POST", "/v1/images/import", "status", status=503)
    with pytest.raises(UnavailableError):
        client.import_image("pipe:1", Unseekable(data))
    assert len(edge.seen("POST", "/v1/images/import")) == 3  # no second attempt
    client.import_image("pipe:1", Unseekable(data))
    q, body, headers = edge.imports[-1]
    assert body == data and headers["transfer-encoding"] == "chunked"


def test_import_local_read_error_is_raised_not_retried(client, edge):
    with pytest.raises(OSError, match="disk on fire"):
        client.import_image("bad:1", Unseekable(b"", fail=True))
    assert len(edge.seen("POST", "/v1/images/import")) <= 1


def test_import_from_a_fifo_path(client, edge, tmpdir_clean):
    data = rootfs_targz(tmpdir_clean / "a.tar.gz")
    fifo = tmpdir_clean / "pipe"
    os.mkfifo(fifo)

    def writer():
        with open(fifo, "wb") as w:
            w.write(data)

    t = threading.Thread(target=writer)
    t.start()
    try:
        client.import_image("fifo:1", fifo)
    finally:
        t.join()
    assert edge.imports[-1][1] == data and edge.imports[-1][2]["transfer-encoding"] == "chunked"


# ---- snapshot / fork / stacked create ---------------------------------------------------------


def test_snapshot_and_fork(client, edge, sandbox):
    sandbox.write_file("/workspace/a.py", b"print(1)")
    img = sandbox.snapshot("proj:abc123")
    assert isinstance(img, Image) and img.name == "proj:abc123" and img.source == "snapshot"
    assert img.base == "host" and len(img.layers) == 1 and img.in_use == 0
    body = edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/snapshot")[0].json
    assert body["image"] == "proj:abc123" and body["request_id"]
    assert "keep_setuid" not in body
    sandbox.snapshot("proj:setuid", keep_setuid=True)
    assert edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/snapshot")[-1].json["keep_setuid"]
    with pytest.raises(ConflictError):
        client.snapshot(sandbox.id, "proj:abc123")

    kids = sandbox.fork(3)
    assert len(kids) == 3 and all(isinstance(k, Sandbox) for k in kids)
    assert len({k.id for k in kids} | {sandbox.id}) == 4 and kids[0].state == "running"
    assert kids[0].read_file("/workspace/a.py") == b"print(1)"
    assert edge.seen("POST", f"/v1/sandboxes/{sandbox.id}/fork")[0].json["count"] == 3
    assert len(client.fork(sandbox.id)) == 1
    with pytest.raises(ValueError):
        sandbox.fork(0)
    with pytest.raises(BadRequestError):
        sandbox.fork(65)
    with pytest.raises(NotFoundError):
        client.snapshot("sb-fake-gone", "x:1")


def test_create_with_stacked_images(client, edge, sandbox):
    sandbox.snapshot("proj:1")
    sb = client.run_container(SandboxSpec(image=["host", "proj:1"]))
    body = edge.seen("POST", "/v1/sandboxes")[-1].json
    assert body["image"] == ["host", "proj:1"]
    assert sb.record["image"] == ["host", "proj:1"]
    assert client.get_image("proj:1").in_use == 1
    client.run_containers(SandboxSpec(image=("proj:1",)), 2)
    assert edge.seen("POST", "/v1/sandboxes")[-1].json["image"] == ["proj:1"]
    assert SandboxSpec(image="x").to_body()["image"] == "x"
    assert "node" not in SandboxSpec().to_body()
    assert SandboxSpec(node="n7").to_body()["node"] == "n7"
    with pytest.raises(NotFoundError):
        client.run_container(SandboxSpec(image=["proj:1", "nope:2"]))
    for bad in ([], ["a", ""], [1]):
        with pytest.raises(ValueError):
            SandboxSpec(image=bad).to_body()


# ---- asyncio ----------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def make(server, **kw):
    return AsyncDSecClient(server.url, retries=3, backoff_base=0.01, timeout=10, **kw)


def test_async_images(server, edge, tmpdir_clean):
    data = rootfs_targz(tmpdir_clean / "a.tar.gz")
    root = tmpdir_clean / "rootfs"
    make_tree(root)
    edge.fault("POST", "/v1/images/import", "status", status=503)

    async def main():
        async with make(server) as c:
            assert [i.name for i in await c.list_images()] == ["host"]
            img = await c.import_image("deb:12", tmpdir_clean / "a.tar.gz")  # after one 503
            assert img.name == "deb:12" and (await c.get_image("deb:12")).layers == img.layers
            assert (await c.import_image("dir:1", root, base="host")).base == "host"
            await c.import_image("pipe:1", Unseekable(data))
            with pytest.raises(OSError, match="disk on fire"):
                await c.import_image("bad:1", Unseekable(b"", fail=True))
            with pytest.raises(ConflictError):
                await c.delete_image("host")
            await c.delete_image("deb:12")
            with pytest.raises(NotFoundError):
                await c.get_image("deb:12")

            sb = await c.run_container(SandboxSpec(image=["host", "dir:1"]))
            await sb.write_file("/w/f", b"1")
            snap = await sb.snapshot("snap:1")
            assert snap.source == "snapshot" and snap.in_use == 0
            kids = await sb.fork(2)
            assert len(kids) == 2 and all(isinstance(k, AsyncSandbox) for k in kids)
            assert await kids[1].read_file("/w/f") == b"1"
            assert len(await c.fork(sb.id, 1)) == 1
            return sb.id

    sid = run(main())
    first, second = edge.seen("POST", "/v1/images/import")[:2]
    assert first.body == second.body == data
    assert first.headers["content-length"] == str(len(data))
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    q, headers, tar = received_tar(edge, 1)
    assert q == {"name": "dir:1", "format": "rootfs", "base": "host"}
    assert headers["transfer-encoding"] == "chunked"
    m = {t.name: t for t in tar.getmembers()}
    assert m["usr/bin/su"].mode == 0o4755 and "fifo" not in m
    assert tar.extractfile("big.bin").read() == (root / "big.bin").read_bytes()
    assert edge.imports[2][1] == data and edge.imports[2][2]["transfer-encoding"] == "chunked"
    assert edge.seen("POST", "/v1/sandboxes")[0].json["image"] == ["host", "dir:1"]
    assert edge.seen("POST", f"/v1/sandboxes/{sid}/fork")[0].json["count"] == 2


@pytest.mark.parametrize("refuse_early", [False, True])
def test_over_limit_import_is_too_large(server, edge, client, tmpdir_clean, refuse_early):
    """413 comes back as TooLargeError, also when the server answers before
    reading the body and closes the connection under the client's writes
    (the client must read that answer rather than report the broken pipe)."""
    edge.max_import_bytes = 1
    edge.refuse_imports = refuse_early
    (tmpdir_clean / "big").write_bytes(os.urandom(24 << 20))
    root = tmpdir_clean / "tree"
    root.mkdir()
    (root / "f").write_bytes(os.urandom(24 << 20))

    with pytest.raises(TooLargeError):
        client.import_image("big:1", tmpdir_clean / "big")
    with pytest.raises(TooLargeError):
        client.import_image("big:1", root)

    async def main():
        async with make(server) as c:
            with pytest.raises(TooLargeError):
                await c.import_image("big:1", tmpdir_clean / "big")
            with pytest.raises(TooLargeError):
                await c.import_image("big:1", root)

    run(main())
    assert len(edge.seen("POST", "/v1/images/import")) == (0 if refuse_early else 4)


def test_import_directory_does_not_follow_symlinks(client, edge, tmpdir_clean):
    """A symlink to a directory is stored as a link, its target not walked."""
    root = tmpdir_clean / "r"
    (root / "real").mkdir(parents=True)
    (root / "real/f").write_text("f")
    os.symlink("real", root / "alias")
    os.symlink(str(tmpdir_clean), root / "out")  # would recurse into itself if followed
    client.import_image("links:1", root)
    _, _, tar = received_tar(edge)
    names = sorted(t.name for t in tar.getmembers())
    assert names == ["alias", "out", "real", "real/f"]
    assert stat.S_ISLNK(os.lstat(root / "alias").st_mode)
