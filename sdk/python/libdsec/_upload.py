"""Request bodies sent in pieces (import_image): a file, a file object, or a
directory packed into a tar as it is sent. The transports call ``open()`` once
per attempt; a body that cannot start again (a pipe) is sent at most once."""

from __future__ import annotations

import io
import os
import stat
from typing import Any, BinaryIO, Iterator

from . import _archive

CHUNK = 1 << 20


class BodyReadError(Exception):
    """Reading the local body failed (``cause``, an OSError or TypeError).

    Not an OSError, so the transports do not take it for a network failure
    and retry; they re-raise ``cause`` to the caller."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _guard(chunks: Iterator[bytes]) -> Iterator[bytes]:
    try:
        for chunk in chunks:
            if chunk:
                yield chunk
    except (OSError, TypeError, ValueError) as e:
        raise BodyReadError(e) from None
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


class BodySource:
    """A body produced in pieces. ``open()`` returns ``(length, chunks)``:
    ``length`` is the Content-Length, or None to send it chunked."""

    replayable = True

    def open(self) -> tuple[int | None, Iterator[bytes]]:
        try:
            length, chunks = self._open()
        except (OSError, TypeError, ValueError) as e:
            raise BodyReadError(e) from None
        return length, _guard(chunks)

    def _open(self) -> tuple[int | None, Iterator[bytes]]:
        raise NotImplementedError


class FileBody(BodySource):
    """A file by path. A regular file goes with its size as Content-Length
    (it must not shrink while it is sent); anything else (a FIFO) chunked,
    and only once."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.replayable = stat.S_ISREG(os.stat(self.path).st_mode)

    def _open(self) -> tuple[int | None, Iterator[bytes]]:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        size = st.st_size if stat.S_ISREG(st.st_mode) else None
        return size, self._read(fd, size)

    def _read(self, fd: int, size: int | None) -> Iterator[bytes]:
        try:
            left = size
            while left is None or left > 0:
                data = os.read(fd, CHUNK if left is None else min(CHUNK, left))
                if not data:
                    if left:
                        raise OSError(f"{self.path}: the file shrank while it was sent")
                    return
                if left is not None:
                    left -= len(data)
                yield data
        finally:
            os.close(fd)


class FileObjBody(BodySource):
    """A binary file object, read with ``read(n)``. Seekable ones start again
    from their current position on a retry and are sent with a
    Content-Length; others are sent chunked, once. Never closed here."""

    def __init__(self, fileobj: BinaryIO | Any) -> None:
        if isinstance(fileobj, io.TextIOBase):
            raise TypeError("import_image needs a binary file object (opened with 'rb')")
        self.fileobj = fileobj
        try:
            self.replayable = bool(fileobj.seekable())
        except (AttributeError, OSError, ValueError):
            self.replayable = False
        self.start = fileobj.tell() if self.replayable else 0

    def _open(self) -> tuple[int | None, Iterator[bytes]]:
        f = self.fileobj
        length = None
        if self.replayable:
            length = f.seek(0, io.SEEK_END) - self.start
            f.seek(self.start)
        return length, self._read(length)

    def _read(self, length: int | None) -> Iterator[bytes]:
        left = length
        while left is None or left > 0:
            data = self.fileobj.read(CHUNK if left is None else min(CHUNK, left))
            if isinstance(data, str):
                raise TypeError("import_image needs a binary file object (opened with 'rb')")
            if not data:
                if left:
                    raise OSError("the file object ended before its size while it was sent")
                return
            if left is not None:
                left -= len(data)
            yield bytes(data)


class DirTarBody(BodySource):
    """A directory, sent as the rootfs tar of _archive.iter_rootfs_tar (chunked)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def _open(self) -> tuple[int | None, Iterator[bytes]]:
        return None, _archive.iter_rootfs_tar(self.path, CHUNK)
