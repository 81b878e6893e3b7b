#!/usr/bin/env python3
"""Writes the qemu-microvm peer's initramfs: a gzip'd newc cpio holding /init (a static
binary) and /dev/console. Written here because Debian's cpio is not installed by default.
Usage: mkinitramfs.py INIT_BINARY OUT.cpio.gz"""
import gzip
import stat
import sys


def entry(name: str, mode: int, data: bytes = b"", rdev: tuple = (0, 0), ino: int = 1) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    hdr = b"070701" + b"".join(b"%08X" % f for f in fields)
    out = hdr + name.encode() + b"\0"
    out += b"\0" * (-len(out) % 4) + data
    return out + b"\0" * (-len(out) % 4)


init, out = sys.argv[1], sys.argv[2]
blob = (entry("dev", stat.S_IFDIR | 0o755, ino=1)
        + entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1), ino=2)
        + entry("init", stat.S_IFREG | 0o755, open(init, "rb").read(), ino=3)
        + entry("TRAILER!!!", 0, ino=0))
with gzip.open(out, "wb", compresslevel=1) as f:
    f.write(blob)
