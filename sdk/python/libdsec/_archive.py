"""Tar helpers for upload_dir / download_dir."""

from __future__ import annotations

import copy
import io
import os
import tarfile

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
