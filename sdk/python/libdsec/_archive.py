"""Tar helpers for upload_dir / download_dir, and the streamed rootfs tar of
import_image."""

from __future__ import annotations

import copy
import io
import os
import stat
import tarfile
from typing import Iterator

from .errors import UnsafeArchiveError


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Local uids mean nothing inside the sandbox; the edge makes the files
    # the sandbox user's.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_tar(local_dir: str | os.PathLike[str]) -> bytes:
    """Pack the contents of ``local_dir`` (not the directory itself) into an
    in-memory tar. Modes, mtimes and symlinks are kept as they are (links are
    not followed); hard links stay hard links."""
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name, recursive=True,
                    filter=_anonymous)
    return buf.getvalue()


_BLOCK = 512


def iter_rootfs_tar(local_dir: str | os.PathLike[str],
                    chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """Yield a pax tar of the contents of ``local_dir`` (not the directory
    itself) in pieces of about ``chunk_size`` bytes, reading one file at a
    time: an image's root filesystem, never held in memory whole.

    Unlike :func:`build_tar` it keeps what an image needs: numeric owners
    (uid/gid as they are, no user names) and full modes (setuid, setgid and
    sticky bits too). Symlinks are stored as links, never followed; hard links
    stay hard links; directories on other file systems (mount points) are left
    out, and so are devices, FIFOs and sockets (the edge refuses them in
    image layers). A file that shrinks while it is read is padded with zeros,
    one that grows is cut at the size recorded in its header. Local errors
    (unreadable files) raise OSError.
    """
    root = os.fspath(local_dir)
    root_dev = os.stat(root).st_dev
    # A TarFile in write mode only for gettarinfo(): it maps stat results to
    # TarInfo and remembers inodes, so a second name of a file becomes a link.
    helper = tarfile.TarFile(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT)
    out = bytearray()

    def raise_error(e: OSError) -> None:
        raise e

    for dirpath, dirnames, filenames in os.walk(root, onerror=raise_error):
        keep = []
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != root_dev:
                    continue  # a mount point: not crossed
                keep.append(name)
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue  # device, FIFO, socket
            info = helper.gettarinfo(full, os.path.relpath(full, root))
            if info is None:
                continue
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)  # a float would cost a pax record per entry
            out += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if info.type == tarfile.REGTYPE and info.size:
                yield from _file_blocks(full, info.size, out, chunk_size)
            if len(out) >= chunk_size:
                yield bytes(out)
                out.clear()
        dirnames[:] = [d for d in dirnames if d in keep]
        dirnames.sort()
    out += b"\0" * (2 * _BLOCK)
    yield bytes(out)


def _file_blocks(path: str, size: int, out: bytearray, chunk_size: int) -> Iterator[bytes]:
    """Append one member's content (exactly ``size`` bytes, then padding to a
    block) to ``out``, yielding ``out``'s bytes whenever it is full."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        left = size
        regular = stat.S_ISREG(os.fstat(fd).st_mode)  # not swapped since the lstat
        while left:
            data = os.read(fd, min(left, chunk_size)) if regular else b""
            if not data:
                data = b"\0" * left  # shrank while read: keep the header's size
            out += data
            left -= len(data)
            if len(out) >= chunk_size:
                yield bytes(out)
                out.clear()
    finally:
        os.close(fd)
    out += b"\0" * (-size % _BLOCK)


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _compat_data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter (PEP 706) for Pythons that predate it, e.g.
    Debian's 3.11.2. Same rules: no paths or links leaving ``dest``, no
    absolute links, no devices/fifos; modes lose setuid/setgid/sticky and
    group/other write; ownership is not restored; dirs get default modes."""
    name = member.name.lstrip("/")
    target = os.path.realpath(os.path.join(dest, name))
    if not _inside(target, dest):
        raise UnsafeArchiveError("unsafe_archive", f"{member.name!r} is outside the destination")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise UnsafeArchiveError("unsafe_archive",
                                     f"{member.name!r} links to absolute {member.linkname!r}")
        base = os.path.dirname(os.path.join(dest, name)) if member.issym() else dest
        if not _inside(os.path.realpath(os.path.join(base, member.linkname)), dest):
            raise UnsafeArchiveError("unsafe_archive",
                                     f"{member.name!r} links outside to {member.linkname!r}")
    mode: int | None = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir() or member.issym():
        mode = None
    else:
        raise UnsafeArchiveError("unsafe_archive", f"{member.name!r} is a special file")
    safe = copy.copy(member)
    safe.name = name
    safe.mode = mode  # type: ignore[assignment]
    # Extracting as root chowns to these: make that a no-op.
    safe.uid, safe.gid = os.geteuid(), os.getegid()
    safe.uname = safe.gname = ""
    return safe


def extract_tar(data: bytes, local_dir: str | os.PathLike[str],
                skip_unsafe: bool = False) -> list[str]:
    """Extract a tar into ``local_dir`` (created if missing) with the
    protections of tarfile's ``filter="data"``.

    An unsafe member raises :class:`UnsafeArchiveError`, or is skipped and
    listed in the return value with ``skip_unsafe=True``. Absolute symlinks,
    common in sandboxes (a venv's ``bin/python -> /usr/bin/python3``), count
    as unsafe here because they would point outside ``local_dir``.
    """
    dest = os.path.realpath(os.fspath(local_dir))
    os.makedirs(dest, exist_ok=True)
    skipped: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            def data_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
                try:
                    return tarfile.data_filter(member, path)
                except tarfile.FilterError as e:
                    if skip_unsafe:
                        skipped.append(member.name)
                        return None
                    raise UnsafeArchiveError("unsafe_archive", str(e)) from None

            tar.extractall(dest, filter=data_filter)
            return skipped
        for member in tar:
            try:
                safe = _compat_data_filter(member, dest)
            except UnsafeArchiveError:
                if not skip_unsafe:
                    raise
                skipped.append(member.name)
                continue
            if safe.isdir():
                os.makedirs(os.path.join(dest, safe.name), exist_ok=True)
            else:
                tar.extract(safe, dest, set_attrs=True, numeric_owner=True)
    return skipped
