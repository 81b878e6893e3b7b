"""File transfer paths (issue 6): upload, download, list, delete and tar archives through
symlinks to /, `..` components, absolute symlinks to host-only paths, a directory<->symlink swap
race, FIFOs, pseudo-files, a 1 TB sparse file and hostile tar archives.

Every lookup must stay inside the sandbox root and every response must stay bounded. Each case
plants host canaries (a directory of files that exists only on the host, named with a unique
marker) and checks afterwards that they were never read (atime), written, listed or deleted,
and that nothing with the marker appeared on the host. What happened inside the sandbox is
checked with exec.
"""

import hashlib
import io
import os
import pathlib
import shutil
import stat
import tarfile
import threading
import time
import uuid
from urllib.parse import quote

import pytest

TB = 1 << 40
OLD_ATIME = 1_000_000_000  # 2001: older than any mtime, so relatime updates it on a read


# ---- helpers ----------------------------------------------------------------------------------

def url(sid, route, path, **q):
    """The route's URL with `path` percent-encoded (bytes allowed) and extra query fields."""
    p = quote(path, safe="/") if isinstance(path, (str, bytes)) else path
    qs = "&".join([f"path={p}"] + [f"{k}={v}" for k, v in q.items()])
    return f"/v1/sandboxes/{sid}/{route}?{qs}"


def err(r, status, code=None, contains=None):
    """Asserts an error response: the status, a JSON error body (the harness checks its shape)
    and optionally its code and a message fragment; bounded."""
    assert r.status == status, r
    assert r.content_type.startswith("application/json"), r
    e = r.json["error"]
    if code:
        assert e["code"] == code, r
    if contains:
        assert contains in e["message"], r
    assert len(r.body) < 8192, f"unbounded error body ({len(r.body)} bytes)"
    return e


def sh(client, sid, script):
    """Runs a shell script in the sandbox (as the sandbox user); asserts exit 0; stdout."""
    return client.sh(sid, script)


def tar_bytes(entries, fmt=tarfile.PAX_FORMAT):
    """A tar built with tarfile: entries are dicts name, type (tarfile constant), data, mode,
    link, uid/gid, devmajor/devminor."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.mtime = 1_700_000_000
            ti.mode = e.get("mode", 0o644)
            ti.type = e.get("type", tarfile.REGTYPE)
            ti.linkname = e.get("link", "")
            ti.uid, ti.gid = e.get("uid", 0), e.get("gid", 0)
            ti.devmajor, ti.devminor = e.get("devmajor", 0), e.get("devminor", 0)
            data = e.get("data", b"")
            if ti.type == tarfile.REGTYPE:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    return buf.getvalue()


def raw_header(name, size_field, typeflag=b"0", mode=0o644, linkname=b""):
    """One ustar header block built by hand, with a raw 12-byte size field (so sizes tarfile
    refuses to write, base-256 and negative ones, can be declared)."""
    assert len(size_field) == 12
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"0001750\0"
    h[116:124] = b"0001750\0"
    h[124:136] = size_field
    h[136:148] = b"%011o\0" % 1_700_000_000
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[157:157 + len(linkname)] = linkname
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def base256(n):
    """GNU base-256 encoding of n (negative in two's complement) in a 12-byte field."""
    if n >= 0:
        return b"\x80" + n.to_bytes(11, "big")
    return b"\xff" + (n & ((1 << 88) - 1)).to_bytes(11, "big")


def pax_record(key, value):
    body = f" {key}={value}\n"
    n = len(body) + len(str(len(body)))
    n = len(body) + len(str(n))
    return f"{n}{body}".encode()


def pax_header(records):
    data = b"".join(pax_record(k, v) for k, v in records)
    h = raw_header(b"././@PaxHeader", b"%011o\0" % len(data), typeflag=b"x")
    return h + data + b"\0" * ((512 - len(data) % 512) % 512)


END = b"\0" * 1024


class HostCanary:
    """Host-only files under /tmp/<marker>/ (a directory the sandbox cannot see): their
    contents, modes, inodes, mtimes and atimes are snapshotted; check() asserts none changed
    (an atime set far in the past moves on any read or readdir under relatime) and that no
    file with the marker in its name appeared in the usual host directories."""

    SCAN = ("/tmp", "/", "/etc", "/root", "/var/tmp", "/dev/shm", "/usr/bin", "/usr/local/bin")

    def __init__(self):
        self.marker = f"dsec-h3-{uuid.uuid4().hex[:12]}"
        self.dir = pathlib.Path("/tmp") / self.marker
        self.dir.mkdir(mode=0o755)
        self.secret = self.dir / "secret"
        self.secret_data = b"host-only secret " + os.urandom(16).hex().encode()
        self.secret.write_bytes(self.secret_data)
        (self.dir / "sub").mkdir()
        (self.dir / "sub" / "inner").write_bytes(b"inner host file")
        # Does this file system record reads at all (relatime / strictatime)?
        self._age()
        self.secret.read_bytes()
        self.atime_works = os.stat(self.secret).st_atime_ns != OLD_ATIME * 10**9
        self._age()
        self.before = self.snapshot()

    def _age(self):
        for root, dirs, files in os.walk(self.dir):
            for n in [root] + [os.path.join(root, x) for x in dirs + files]:
                st = os.lstat(n)
                os.utime(n, ns=(OLD_ATIME * 10**9, st.st_mtime_ns), follow_symlinks=False)

    def snapshot(self, path=None, out=None):
        """{path: (mode, uid, gid, nlink, ino, size, mtime, atime, sha256)} of the tree. Our
        own reads and readdirs would move the atimes: each is put back afterwards."""
        path = str(path or self.dir)
        out = {} if out is None else out
        st = os.lstat(path)
        digest = None
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        elif stat.S_ISDIR(st.st_mode):
            for name in sorted(os.listdir(path)):
                self.snapshot(os.path.join(path, name), out)
        if digest or stat.S_ISDIR(st.st_mode):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        out[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_nlink, st.st_ino, st.st_size,
                     st.st_mtime_ns, st.st_atime_ns if self.atime_works else None, digest)
        return out

    def strays(self):
        found = []
        for d in self.SCAN:
            try:
                names = os.listdir(d)
            except OSError:
                continue
            found += [os.path.join(d, n) for n in names
                      if self.marker in n and os.path.join(d, n) != str(self.dir)]
        return found

    def check(self):
        """The canaries are exactly as planted and nothing new carries the marker."""
        after = self.snapshot()
        changed = {k: (self.before.get(k), after.get(k)) for k in set(self.before) | set(after)
                   if self.before.get(k) != after.get(k)}
        assert not changed, f"host canaries touched: {changed}"
        assert not self.strays(), f"files with the marker appeared on the host: {self.strays()}"

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        for p in self.strays():
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass


@pytest.fixture
def canary():
    c = HostCanary()
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def big_sandbox(make_edge):
    """(client, id) of a sandbox whose disk may hold a 1 TB sparse file (disk_mb = 1 TiB, the
    API's maximum), on an edge whose disk images are sparse (disk_preallocate false): by
    default a disk image takes its whole size on the node at create, which no test host has."""
    edge = make_edge(config={"disk_preallocate": False})
    c = edge.client()
    sb = c.create({"memory_mb": 128, "disk_mb": 1 << 20, "labels": {"suite": "security"}})
    yield c, sb["id"]
    c.remove(sb["id"])


@pytest.fixture
def small_sandbox(client):
    """A sandbox with a 16 MB disk (4096 inodes) for the tar bombs."""
    sb = client.create({"memory_mb": 128, "disk_mb": 16, "labels": {"suite": "security"}})
    yield sb["id"]
    client.remove(sb["id"])


def timed(fn, *a, **kw):
    t = time.monotonic()
    r = fn(*a, **kw)
    return r, time.monotonic() - t


def names_of(r):
    return {e["name"] for e in r.json["entries"]}


# ---- symlinks and `..` --------------------------------------------------------------------------

def test_symlink_to_root_resolves_to_the_sandbox_root(client, sandbox, canary, figure):
    """Upload, download, list, delete and archive through a sandbox symlink to `/` (and a
    relative one climbing past it) all act on the sandbox's own root, never the host's; the
    host canaries stay untouched."""
    m = canary.marker
    sh(client, sandbox, "ln -s / /workspace/r && ln -s ../../../../../.. /workspace/up")
    hostname = sh(client, sandbox, "cat /etc/hostname")
    r = client.get(url(sandbox, "files", "/workspace/r/etc/hostname"), expect=200)
    assert r.body.decode() == hostname
    assert pathlib.Path("/etc/hostname").read_text() != hostname
    root_names = set(sh(client, sandbox, "ls -A /").split())
    for link in ("/workspace/r", "/workspace/up"):
        listed = names_of(client.get(url(sandbox, "files/list", link), expect=200))
        assert listed == root_names and "workspace" in listed, listed
    client.put(url(sandbox, "files", f"/workspace/r/tmp/{m}-put"), b"via root link", expect=204)
    client.put(url(sandbox, "files", f"/workspace/up/tmp/{m}-up"), b"via up link", expect=204)
    assert sh(client, sandbox, f"cat /tmp/{m}-put; echo; cat /tmp/{m}-up") == \
        "via root link\nvia up link"
    # Into the sandbox root itself the sandbox user may not write: 403, not the host's root.
    err(client.put(url(sandbox, "files", f"/workspace/r/{m}-root"), b"x"), 403, "forbidden")
    tar = tar_bytes([{"name": "a.txt", "data": b"archived"}])
    client.put(url(sandbox, "archive", f"/workspace/r/tmp/{m}-arch"), tar, expect=204)
    assert sh(client, sandbox, f"cat /tmp/{m}-arch/a.txt") == "archived"
    got = client.get(url(sandbox, "archive", f"/workspace/up/tmp/{m}-arch"), expect=200).body
    with tarfile.open(fileobj=io.BytesIO(got)) as tf:
        assert [(x.name, tf.extractfile(x).read()) for x in tf.getmembers()] == \
            [("a.txt", b"archived")]
    client.delete(url(sandbox, "files", f"/workspace/r/tmp/{m}-put"), expect=204)
    client.delete(url(sandbox, "files", f"/workspace/up/tmp/{m}-arch", recursive=1), expect=204)
    # A recursive delete of the link removes the link, not what it points to.
    client.delete(url(sandbox, "files", "/workspace/r", recursive=1), expect=204)
    assert sh(client, sandbox, "test ! -e /workspace/r && test -d /etc && test -d /usr/bin "
                               "&& ls /tmp") == f"{m}-up\n"
    canary.check()
    figure("host canary atime checked", canary.atime_works)


def test_dotdot_components_clamp_at_the_sandbox_root(client, sandbox, canary):
    """Paths with `..` components (plain and percent-encoded) climbing far above / resolve
    inside the sandbox root for read, write, list, delete and archive; a delete ending in `.`
    or `..` is 400 and removes nothing; the host is untouched."""
    m = canary.marker
    hostname = sh(client, sandbox, "cat /etc/hostname")
    for p in ("/../../../../etc/hostname", "/workspace/../../../etc/./hostname"):
        assert client.get(url(sandbox, "files", p), expect=200).body.decode() == hostname
    r = client.get(f"/v1/sandboxes/{sandbox}/files?path=/workspace/%2e%2e/%2e%2e/etc/hostname",
                   expect=200)
    assert r.body.decode() == hostname
    assert names_of(client.get(url(sandbox, "files/list", "/../../.."), expect=200)) == \
        set(sh(client, sandbox, "ls -A /").split())
    client.put(url(sandbox, "files", f"/workspace/../../../../tmp/{m}"), b"up", expect=204)
    assert sh(client, sandbox, f"cat /tmp/{m}") == "up"
    tar = tar_bytes([{"name": "b.txt", "data": b"B"}])
    client.put(url(sandbox, "archive", f"/../../tmp/{m}-a"), tar, expect=204)
    assert sh(client, sandbox, f"cat /tmp/{m}-a/b.txt") == "B"
    client.get(url(sandbox, "archive", f"/../../../tmp/{m}-a"), expect=200)
    client.delete(url(sandbox, "files", f"/../../tmp/{m}"), expect=204)
    client.delete(url(sandbox, "files", f"/../../../tmp/{m}-a", recursive=1), expect=204)
    assert sh(client, sandbox, "ls -A /tmp") == ""
    # A delete naming "." or ".." as its last component is refused outright: it would empty a
    # directory other than the one named (or the whole root, which "/" itself may not be).
    sh(client, sandbox, f"mkdir -p /workspace/a/b && echo k > /workspace/a/b/k && "
                        f"echo t > /tmp/{m}-mine")
    for p in ("/../..", "/workspace/..", "/workspace/a/b/..", "/workspace/a/b/.",
              "/workspace/a/./b/../", "/.."):
        for rec in ({"recursive": 1}, {}):
            err(client.delete(url(sandbox, "files", p, **rec)), 400, "bad_request")
    assert sh(client, sandbox, f"cat /workspace/a/b/k /tmp/{m}-mine && test -d /etc && "
                               f"ls /workspace") == "k\nt\na\n"
    client.delete(url(sandbox, "files", "/workspace/a/../a/b/", recursive=1), expect=204)
    assert sh(client, sandbox, "ls -A /workspace/a") == ""
    canary.check()


def test_absolute_symlinks_to_host_only_paths(client, sandbox, canary, edge):
    """Symlinks planted in the sandbox to paths that exist only on the host (a canary
    directory, the edge's token file and state dir) are 404 for read, write, list, delete and
    archive; once the sandbox creates those paths itself, every operation acts on the
    sandbox's copy only. The host files are never read, written, listed or deleted."""
    c = str(canary.dir)
    links = {"hf": f"{c}/secret", "hd": c, "hrel": f"../../../../../../..{c}",
             "tok": str(edge.token_file), "state": str(edge.state_dir),
             "sock": f"{edge.state_dir}/sandboxes/{sandbox}/agent.sock"}
    sh(client, sandbox, " && ".join(f"ln -s '{t}' /workspace/{n}" for n, t in links.items()))
    for p in ("/workspace/hf", "/workspace/hrel/secret", "/workspace/hd/sub/inner",
              "/workspace/tok", "/workspace/sock", "/workspace/state/state.db"):
        err(client.get(url(sandbox, "files", p)), 404, "not_found")
    for p in ("/workspace/hd", "/workspace/hrel/sub", "/workspace/state",
              "/workspace/state/sandboxes"):
        err(client.get(url(sandbox, "files/list", p)), 404, "not_found")
        err(client.get(url(sandbox, "archive", p)), 404, "not_found")
    for p in ("/workspace/hd/secret", "/workspace/hrel/secret", "/workspace/state/tokens"):
        err(client.delete(url(sandbox, "files", p)), 404, "not_found")
    err(client.delete(url(sandbox, "files", "/workspace/hd/sub", recursive=1)), 404)
    for p in ("/workspace/hf", "/workspace/hd/new", "/workspace/hrel/secret", "/workspace/tok"):
        err(client.put(url(sandbox, "files", p), b"overwrite?"), 404, "not_found")
    err(client.put(url(sandbox, "archive", "/workspace/hd"),
                   tar_bytes([{"name": "secret", "data": b"x"}])), 404, "not_found")
    assert client.get(url(sandbox, "files/stat", "/workspace/hf"), expect=200).json["type"] == \
        "symlink"
    canary.check()

    # The sandbox makes the same path in its own /tmp: the links now lead there, only there.
    sh(client, sandbox, f"mkdir -p {c} && printf sandbox-copy > {c}/secret")
    assert client.get(url(sandbox, "files", "/workspace/hf"), expect=200).body == b"sandbox-copy"
    client.put(url(sandbox, "files", "/workspace/hf"), b"rewritten", expect=204)
    client.put(url(sandbox, "files", "/workspace/hrel/added"), b"new", expect=204)
    assert names_of(client.get(url(sandbox, "files/list", "/workspace/hd"), expect=200)) == \
        {"secret", "added"}
    client.put(url(sandbox, "archive", "/workspace/hd"),
               tar_bytes([{"name": "sub/inner", "data": b"tarred"}]), expect=204)
    assert sh(client, sandbox, f"cat {c}/secret; echo; cat {c}/sub/inner") == "rewritten\ntarred"
    client.delete(url(sandbox, "files", "/workspace/hd/sub", recursive=1), expect=204)
    client.delete(url(sandbox, "files", "/workspace/hd", recursive=1), expect=204)  # the link
    client.delete(url(sandbox, "files", "/workspace/hf"), expect=204)  # the link
    assert sh(client, sandbox, f"ls {c}; ls /workspace") == \
        "added\nsecret\nhrel\nsock\nstate\ntok\n"
    assert edge.token_file.read_text().split()[0] == edge.token
    canary.check()


# ---- FIFOs, pseudo-files, sparse files -----------------------------------------------------------

def test_fifo_transfers_fail_fast_and_never_block_the_agent(client, sandbox, canary, figure):
    """Reading, writing and archiving a FIFO (with and without a reader, directly and through a
    symlink) answers 400 at once and never blocks the agent or writes into the pipe; tar
    replaces a FIFO by a regular file instead of writing into it."""
    sh(client, sandbox, "mkfifo /workspace/p && ln -s p /workspace/pl && ln -s /workspace/p "
                        "/workspace/pa && echo keep > /workspace/f")
    slowest = 0.0
    for p in ("/workspace/p", "/workspace/pl", "/workspace/pa"):
        r, dt = timed(client.get, url(sandbox, "files", p))
        err(r, 400, "bad_request", "not a regular file")
        slowest = max(slowest, dt)
        r, dt = timed(client.put, url(sandbox, "files", p), b"into the pipe")
        err(r, 400, "bad_request", "not a regular file")
        slowest = max(slowest, dt)
    # With a reader blocked on the FIFO the open for writing succeeds: still refused, and the
    # reader sees EOF without data.
    bg = client.post(f"/v1/sandboxes/{sandbox}/exec",
                     {"shell": "cat /workspace/p > /workspace/got; echo done >> /workspace/got",
                      "background": True}, expect=202).json["exec_id"]
    waiting = "grep -l wait_for_partner /proc/[0-9]*/wchan 2>/dev/null | wc -l"
    deadline = time.monotonic() + 10
    while sh(client, sandbox, waiting).strip() != "1":  # the reader is blocked in open()
        assert time.monotonic() < deadline, "the FIFO reader never blocked"
        time.sleep(0.05)
    r, dt = timed(client.put, url(sandbox, "files", "/workspace/p"), b"into the pipe")
    err(r, 400, "bad_request", "not a regular file")
    slowest = max(slowest, dt)
    st = client.get(f"/v1/sandboxes/{sandbox}/execs/{bg}?wait_ms=10000", expect=200).json
    assert st["state"] == "exited", st  # the agent's open released it: EOF, no data
    assert sh(client, sandbox, "cat /workspace/got") == "done\n"
    entries = {e["name"]: e for e in
               client.get(url(sandbox, "files/list", "/workspace"), expect=200).json["entries"]}
    assert entries["p"]["type"] == "fifo" and entries["p"]["size"] == 0
    r, dt = timed(client.get, url(sandbox, "archive", "/workspace"), expect=200)
    slowest = max(slowest, dt)
    with tarfile.open(fileobj=io.BytesIO(r.body)) as tf:
        kinds = {x.name: x.type for x in tf.getmembers()}
    assert "p" not in kinds and kinds["pl"] == tarfile.SYMTYPE and kinds["f"] == tarfile.REGTYPE
    client.put(url(sandbox, "archive", "/workspace"),
               tar_bytes([{"name": "p", "data": b"regular now"}]), expect=204)
    assert sh(client, sandbox, "test -f /workspace/p && cat /workspace/p") == "regular now"
    assert slowest < 3, f"a FIFO operation took {slowest:.1f}s"
    figure("slowest FIFO op ms", round(slowest * 1000, 1))
    assert sh(client, sandbox, "echo alive") == "alive\n"
    canary.check()


PSEUDO_READS = {
    # path: (status, message fragment)
    "/dev/zero": (400, "not a regular file"),
    "/dev/urandom": (400, "not a regular file"),
    "/dev/full": (400, "not a regular file"),
    "/dev/null": (400, "not a regular file"),
    "/proc/self/status": (403, "kernel file system"),
    "/proc/self/maps": (403, "kernel file system"),
    "/proc/self/mem": (403, ""),
    "/proc/self/environ": (403, ""),
    "/proc/1/environ": (403, ""),
    "/proc/1/cmdline": (403, "kernel file system"),
    "/proc/self/fd/0": (400, "ELOOP"),
    "/proc/self/exe": (400, "ELOOP"),
    "/proc/self/root/etc/hostname": (400, "ELOOP"),
    "/proc/1/cwd/etc/hostname": (400, "ELOOP"),
    "/proc/self/cwd": (400, "ELOOP"),
    "/proc/kallsyms": (400, "not a regular file"),  # masked by a /dev/null bind mount
    "/proc/keys": (400, "not a regular file"),
    "/workspace/zero": (400, "not a regular file"),
    "/workspace/status": (403, "kernel file system"),
    "/workspace/fd0": (400, "ELOOP"),
}


def test_pseudo_files_are_refused_with_bounded_responses(client, sandbox, canary, figure):
    """/dev/zero, /dev/urandom, /proc/self/* and /proc/1/* (directly, through magic links and
    through sandbox symlinks) are refused with a small 4xx JSON error at once, for read, write,
    list, delete and archive, whatever max_bytes says."""
    sh(client, sandbox, "ln -s /dev/zero /workspace/zero && ln -s /proc/self/status "
                        "/workspace/status && ln -s /proc/self/fd/0 /workspace/fd0")
    slowest = 0.0
    for p, (status, frag) in PSEUDO_READS.items():
        for q in ({}, {"max_bytes": 268435456}):
            r, dt = timed(client.get, url(sandbox, "files", p, **q))
            e = err(r, status)
            assert frag in e["message"], (p, r)
            slowest = max(slowest, dt)
    for p in ("/proc/self/status", "/proc/self/attr/current", "/proc/sys/kernel/hostname"):
        r, dt = timed(client.put, url(sandbox, "files", p), b"x")
        assert r.status in (403,), (p, r)
        slowest = max(slowest, dt)
    for p, status in (("/dev/zero", 400), ("/dev/null", 400), ("/dev/urandom", 400)):
        err(client.put(url(sandbox, "files", p), b"x"), status)
    for p in ("/proc", "/proc/self", "/proc/1/fd", "/proc/self/task"):
        err(client.get(url(sandbox, "files/list", p)), 403, "forbidden")
        err(client.get(url(sandbox, "archive", p)), 403, "forbidden")
        err(client.delete(url(sandbox, "files", p + "/x", recursive=1)), 403, "forbidden")
    err(client.delete(url(sandbox, "files", "/proc", recursive=1)), 403, "forbidden")
    err(client.delete(url(sandbox, "files", "/dev/zero")), 403, "forbidden")
    err(client.get(url(sandbox, "files/list", "/proc/self/fd/")), 403)
    r, dt = timed(client.get, url(sandbox, "archive", "/dev"), expect=200)
    slowest = max(slowest, dt)
    assert len(r.body) < (1 << 20)
    with tarfile.open(fileobj=io.BytesIO(r.body)) as tf:
        assert not [x.name for x in tf.getmembers() if x.ischr() or x.isblk() or x.isfifo()]
    assert slowest < 3, f"a pseudo-file request took {slowest:.1f}s"
    figure("slowest pseudo-file request ms", round(slowest * 1000, 1))
    assert sh(client, sandbox, "echo alive") == "alive\n"
    canary.check()


def test_huge_sparse_file_is_listed_but_never_streamed(big_sandbox, canary, figure):
    """A 1 TB sparse file: list and stat report its size without reading it; download is 413
    at once (directly and through a symlink); an archive of its directory is refused (413)
    within seconds instead of streaming a terabyte of zeros; the agent keeps serving."""
    client, sid = big_sandbox
    out = sh(client, sid, "truncate -s 1T /workspace/huge && ln -s huge /workspace/hl && "
                          "stat -c '%s %b' /workspace/huge")
    assert out.split() == [str(TB), "0"], out
    r, dt = timed(client.get, url(sid, "files/list", "/workspace"), expect=200)
    assert {e["name"]: e["size"] for e in r.json["entries"]}["huge"] == TB
    assert dt < 2
    assert client.get(url(sid, "files/stat", "/workspace/huge"), expect=200).json["size"] == TB
    for q in ({}, {"max_bytes": 268435456}, {"max_bytes": 0}):
        r, dt = timed(client.get, url(sid, "files", "/workspace/huge", **q))
        err(r, 413, "too_large")
        assert dt < 2, f"download refusal took {dt:.1f}s"
    r, dt = timed(client.get, url(sid, "files", "/workspace/hl", max_bytes=4096))
    err(r, 413, "too_large")
    assert dt < 2
    r, dt = timed(client.get, url(sid, "files", "/workspace/hl", max_bytes=1 << 20))
    err(r, 413, "too_large")
    figure("1 TB sparse download via symlink refused in ms", round(dt * 1000, 1))
    r, dt = timed(client.request, "GET", url(sid, "archive", "/workspace"), timeout=60)
    err(r, 413, "too_large")
    figure("1 TB sparse archive refused in s", round(dt, 2))
    assert dt < 5, f"the archive of a 1 TB sparse file took {dt:.1f}s to refuse"
    r, dt = timed(client.exec, sid, "echo alive")
    assert r["stdout"] == "alive\n" and dt < 5, (r, dt)
    client.delete(url(sid, "files", "/workspace/huge"), expect=204)
    canary.check()


DEEP_TREE = r"""
import os, sys
os.chdir("/workspace")
os.mkdir("deep"); os.chdir("deep")
for i in range(int(sys.argv[1])):
    os.mkdir(sys.argv[2]); os.chdir(sys.argv[2])
print("ok")
"""


def test_planted_deep_tree_cannot_kill_the_agent(client, sandbox, figure):
    """A directory chain planted thousands of levels deep: its archive download answers 200
    with the tree cut at PATH_MAX / 1024 levels instead of OOM-killing the agent, a recursive
    delete refuses with 400 (too deep), and the sandbox keeps running."""
    client.put(url(sandbox, "files", "/workspace/deep.py"), DEEP_TREE.encode(), expect=204)
    # (20,000 levels OOM-killed the agent before the bound; 3,000 are enough to show it.)
    for name, levels in (("d", 3000), ("dddddddd", 1000)):
        sh(client, sandbox, f"rm -rf /workspace/deep; python3 /workspace/deep.py {levels} {name}")
        r, dt = timed(client.request, "GET", url(sandbox, "archive", "/workspace/deep"),
                      timeout=120)
        assert r.status == 200, r
        with tarfile.open(fileobj=io.BytesIO(r.body)) as tf:
            members = tf.getmembers()
        depth = max(m.name.rstrip("/").count("/") + 1 for m in members)
        longest = max(len(m.name) for m in members)
        assert longest <= 4096 and depth <= 1024, (depth, longest)
        assert depth == min(1024, 4097 // (len(name) + 1)), (name, depth)
        figure(f"deep tree ({name}) archive levels", depth)
        figure(f"deep tree ({name}) archive s", round(dt, 2))
        st = client.get(f"/v1/sandboxes/{sandbox}", expect=200).json
        assert st["state"] == "running", st
        assert sh(client, sandbox, "echo alive") == "alive\n"
    err(client.delete(url(sandbox, "files", "/workspace/deep", recursive=1)), 400,
        "bad_request", "nested too deeply")
    assert sh(client, sandbox, "test -d /workspace/deep && echo kept") == "kept\n"


# ---- hostile tar archives ------------------------------------------------------------------------

def put_tar(client, sid, path, data):
    return client.put(url(sid, "archive", path), data,
                      headers={"Content-Type": "application/x-tar"})


def test_tar_dotdot_entries_are_refused(client, sandbox, canary):
    """Tar entries whose names (ustar, pax path, GNU long name) or hard link targets contain
    `..` are refused with 400 and write nothing outside the target."""
    m = canary.marker
    long_dots = "a/" * 60 + "../" * 70 + f"tmp/{m}-long"
    cases = {
        "plain": tar_bytes([{"name": "ok.txt", "data": b"ok"},
                            {"name": f"../../../../tmp/{m}", "data": b"x"}]),
        "inner": tar_bytes([{"name": f"a/../../{m}", "data": b"x"}]),
        "pax": tar_bytes([{"name": long_dots, "data": b"x"}], tarfile.PAX_FORMAT),
        "gnu": tar_bytes([{"name": long_dots, "data": b"x"}], tarfile.GNU_FORMAT),
        "link": tar_bytes([{"name": "h", "type": tarfile.LNKTYPE, "link": f"../../tmp/{m}"}]),
        "dir": tar_bytes([{"name": f"../{m}-dir/", "type": tarfile.DIRTYPE, "mode": 0o755}]),
        "sym": tar_bytes([{"name": f"../{m}-sym", "type": tarfile.SYMTYPE, "link": "/"}]),
    }
    for name, data in cases.items():
        err(put_tar(client, sandbox, f"/workspace/t-{name}", data), 400, "bad_request", "..")
    sh(client, sandbox, f"printf x > /tmp/{m}")  # the hard link's would-be target exists
    err(put_tar(client, sandbox, "/workspace/t-link", cases["link"]), 400, "bad_request", "..")
    found = sh(client, sandbox, f"find / -xdev -name '{m}*' 2>/dev/null | sort")
    assert found == f"/tmp/{m}\n", found
    assert sh(client, sandbox, "cat /workspace/t-plain/ok.txt") == "ok"
    canary.check()


def test_tar_absolute_names_land_under_the_target(client, sandbox, canary):
    """Absolute tar entry names (/tmp/..., /etc/..., a host canary's path) are extracted
    beneath the target directory, not at those paths in the sandbox or on the host."""
    m, c = canary.marker, str(canary.dir)
    data = tar_bytes([{"name": f"/tmp/{m}/abs", "data": b"1"},
                      {"name": f"/etc/{m}", "data": b"2"},
                      {"name": f"{c}/secret", "data": b"overwrite"},
                      {"name": f"//{m}-root", "data": b"3"}])
    assert put_tar(client, sandbox, "/workspace/abs", data).status == 204
    # c is /tmp/<marker>: the canary's path lands next to the first entry.
    out = sh(client, sandbox, f"cd /workspace/abs && cat tmp/{m}/abs etc/{m} "
                              f".{c}/secret {m}-root")
    assert out == "12overwrite3"
    found = sh(client, sandbox, f"find / -xdev -name '{m}*' 2>/dev/null | sort")
    assert found.split() == [f"/workspace/abs/{m}-root", f"/workspace/abs/etc/{m}",
                             f"/workspace/abs/tmp/{m}"], found
    canary.check()


def test_tar_symlink_then_write_through_it_stays_in_the_target(client, sandbox, canary):
    """A tar that first makes a symlink (to /, /etc, a host path, or climbing with ..) and
    then writes through it, or writes over a symlink the sandbox planted, never writes outside
    the target: links resolve clamped to the target and planted links are replaced, not
    followed."""
    m, c = canary.marker, str(canary.dir)
    hostname = sh(client, sandbox, "cat /etc/hostname")
    # Through a fresh symlink to / : lands in target/etc, not the sandbox's /etc.
    data = tar_bytes([{"name": "r", "type": tarfile.SYMTYPE, "link": "/"},
                      {"name": f"r/etc/{m}", "data": b"x"},
                      {"name": "u", "type": tarfile.SYMTYPE, "link": "../../../../.."},
                      {"name": f"u/tmp/{m}", "data": b"y"}])
    assert put_tar(client, sandbox, "/workspace/s1", data).status == 204
    assert sh(client, sandbox, f"cat /workspace/s1/etc/{m} /workspace/s1/tmp/{m}") == "xy"
    # Through a symlink to a directory missing under the target: 404, nothing written.
    data = tar_bytes([{"name": "l", "type": tarfile.SYMTYPE, "link": "/tmp"},
                      {"name": f"l/{m}", "data": b"x"}])
    err(put_tar(client, sandbox, "/workspace/s2", data), 404, "not_found")
    data = tar_bytes([{"name": "h", "type": tarfile.SYMTYPE, "link": c},
                      {"name": "h/secret", "data": b"x"}])
    err(put_tar(client, sandbox, "/workspace/s3", data), 404, "not_found")
    # Symlinks planted by the sandbox at the entries' names are replaced, never written through.
    sh(client, sandbox, "mkdir -p /workspace/s4 && ln -s /etc/hostname /workspace/s4/f && "
                        f"ln -s {c}/secret /workspace/s4/g && ln -s /tmp /workspace/s4/d")
    data = tar_bytes([{"name": "f", "data": b"F"}, {"name": "g", "data": b"G"}])
    assert put_tar(client, sandbox, "/workspace/s4", data).status == 204
    assert sh(client, sandbox, "cd /workspace/s4 && test -f f && test -f g && cat f g "
                               "/etc/hostname") == "FG" + hostname
    err(put_tar(client, sandbox, "/workspace/s4",
                tar_bytes([{"name": f"d/{m}", "data": b"x"}])), 404, "not_found")
    # The target itself a symlink to /: extraction happens in the sandbox root, as its user.
    sh(client, sandbox, "ln -s / /workspace/tl")
    err(put_tar(client, sandbox, "/workspace/tl", tar_bytes([{"name": f"etc/{m}"}])), 403)
    assert put_tar(client, sandbox, "/workspace/tl",
                   tar_bytes([{"name": f"tmp/{m}", "data": b"t"}])).status == 204
    found = sh(client, sandbox, f"find / -xdev -name '{m}*' 2>/dev/null | sort").split()
    assert found == [f"/tmp/{m}", f"/workspace/s1/etc/{m}", f"/workspace/s1/tmp/{m}"], found
    canary.check()


def test_tar_hardlinks_cannot_reach_outside_the_target(client, sandbox, canary):
    """Hard link entries to /etc/passwd, a host canary path, `..`, a planted symlink or through
    a symlink entry are refused (404/400) and never link a file from outside the target;
    /etc/passwd's and the canary's link counts stay the same."""
    c = str(canary.dir)
    nlink = sh(client, sandbox, "stat -c %h /etc/passwd")
    host_nlink = os.stat("/etc/passwd").st_nlink
    cases = [
        ([{"name": "h", "type": tarfile.LNKTYPE, "link": "/etc/passwd"}], 404, "ENOENT"),
        ([{"name": "h", "type": tarfile.LNKTYPE, "link": f"{c}/secret"}], 404, "ENOENT"),
        ([{"name": "h", "type": tarfile.LNKTYPE, "link": "../../etc/passwd"}], 400, ".."),
        ([{"name": "l", "type": tarfile.SYMTYPE, "link": "/etc"},
          {"name": "h", "type": tarfile.LNKTYPE, "link": "l/passwd"}], 404, "ENOENT"),
        ([{"name": "s", "type": tarfile.LNKTYPE, "link": "planted"}], 400, "not a regular file"),
        ([{"name": "x", "type": tarfile.LNKTYPE, "link": "procfd/0"}], 404, ""),
    ]
    for i, (entries, status, frag) in enumerate(cases):
        t = f"/workspace/hl{i}"
        sh(client, sandbox, f"mkdir -p {t} && ln -s /etc/passwd {t}/planted && "
                            f"ln -s /proc/self/fd {t}/procfd")
        err(put_tar(client, sandbox, t, tar_bytes(entries)), status, None, frag)
        assert sh(client, sandbox, f"find {t} -type f | wc -l") == "0\n"
    # A hard link inside the target works (the positive control).
    ok = tar_bytes([{"name": "a", "data": b"A"},
                    {"name": "b", "type": tarfile.LNKTYPE, "link": "a"}])
    assert put_tar(client, sandbox, "/workspace/hlok", ok).status == 204
    assert sh(client, sandbox, "stat -c %h /workspace/hlok/b") == "2\n"
    assert sh(client, sandbox, "stat -c %h /etc/passwd") == nlink
    assert os.stat("/etc/passwd").st_nlink == host_nlink
    canary.check()


def test_tar_device_nodes_and_fifos_are_skipped(client, sandbox, canary):
    """Character/block device and FIFO entries (/dev/null's and a disk's numbers, at names
    like dev/null) are skipped: the extraction succeeds and no node exists afterwards."""
    data = tar_bytes([
        {"name": "dev/null", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3},
        {"name": "mem", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 1},
        {"name": "kvm", "type": tarfile.CHRTYPE, "devmajor": 10, "devminor": 232},
        {"name": "sda", "type": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0},
        {"name": "fifo", "type": tarfile.FIFOTYPE},
        {"name": "plain", "data": b"p"},
    ])
    assert put_tar(client, sandbox, "/workspace/dev", data).status == 204
    out = sh(client, sandbox, "cd /workspace/dev && find . | sort && "
                              "find . \\( -type b -o -type c -o -type p \\) | wc -l")
    assert out.split() == [".", "./plain", "0"], out  # not even dev/ (nothing to put in it)
    canary.check()


def test_tar_and_upload_strip_setuid_setgid_and_owner(client, sandbox, canary):
    """setuid/setgid/sticky bits and root ownership in tar headers, and mode=06755 on upload,
    are stripped: everything belongs to the sandbox user and a 'setuid' binary runs as it."""
    data = tar_bytes([
        {"name": "suid", "data": b"#!/bin/sh\nid -u\n", "mode": 0o6755, "uid": 0, "gid": 0},
        {"name": "sgid", "data": b"x", "mode": 0o2750},
        {"name": "sticky", "type": tarfile.DIRTYPE, "mode": 0o7777},
        {"name": "sticky/in", "data": b"y", "mode": 0o4700},
    ])
    assert put_tar(client, sandbox, "/workspace/modes", data).status == 204
    out = sh(client, sandbox, "cd /workspace/modes && stat -c '%a %u:%g %n' suid sgid sticky "
                              "sticky/in")
    assert out.splitlines() == ["755 1000:1000 suid", "750 1000:1000 sgid",
                                "777 1000:1000 sticky", "700 1000:1000 sticky/in"], out
    assert sh(client, sandbox, "/workspace/modes/suid") == "1000\n"
    client.put(url(sandbox, "files", "/workspace/up-suid", mode="06755"), b"#!/bin/sh\nid -u\n",
               expect=204)
    assert sh(client, sandbox, "stat -c '%a %u' /workspace/up-suid") == "755 1000\n"
    client.post(url(sandbox, "files/mkdir", "/workspace/up-dir", mode="06710"), expect=204)
    client.post(url(sandbox, "files/mkdir", "/workspace/up-dir2/sub", mode="02710"), expect=204)
    assert sh(client, sandbox, "stat -c '%a %u' /workspace/up-dir /workspace/up-dir2/sub") == \
        "710 1000\n710 1000\n"
    canary.check()


def test_tar_huge_declared_sizes_are_refused_before_writing(client, sandbox, canary):
    """Tar headers declaring 8 GiB (octal), 1 TiB (base-256), 10^15 (pax) bytes are refused
    with 413 before any file is created; unparsable and negative sizes are 400."""
    cases = [
        (raw_header(b"big-octal", b"77777777777\0") + b"\0" * 512 + END, 413),
        (raw_header(b"big-b256", base256(TB)) + b"\0" * 512 + END, 413),
        (pax_header([("size", str(10**15))]) + raw_header(b"big-pax", b"%011o\0" % 0) + END,
         413),
        (pax_header([("size", "9" * 20)]) + raw_header(b"bad-pax", b"%011o\0" % 0) + END, 400),
        (raw_header(b"negative", base256(-512)) + END, 400),
        (raw_header(b"garbage", b"12x4\0\0\0\0\0\0\0\0") + END, 400),
    ]
    for i, (data, status) in enumerate(cases):
        r, dt = timed(put_tar, client, sandbox, f"/workspace/sz{i}", data)
        err(r, status)
        assert dt < 3
        # A refused archive leaves no trace: not even the target directory it would have made.
        assert sh(client, sandbox, f"test ! -e /workspace/sz{i} && echo gone") == "gone\n", i
    # The same headers with an honest small size extract fine (the builder is right).
    ok = raw_header(b"small", b"%011o\0" % 5) + b"hello" + b"\0" * 507 + END
    assert put_tar(client, sandbox, "/workspace/szok", ok).status == 204
    assert sh(client, sandbox, "cat /workspace/szok/small") == "hello"
    canary.check()


def test_tar_bombs_are_refused_by_the_limits(client, small_sandbox, canary, figure):
    """On a 16 MB / 4096-inode sandbox: 6,000 empty files run out of inodes (422); 6,000 hard
    links to one file do too on a tmpfs layer (it charges an inode per link) and are 6,000
    directory entries of one inode on a disk image (ext4); a 17 MB archive is refused by the
    edge before its body is read (413: bigger than the disk) and 15 x 1 MB onto 3 MB already there runs out of space (422) — each within
    seconds; the sandbox keeps working and cleans up."""
    sid = small_sandbox
    links = [{"name": "a", "data": b"A"}] + [
        {"name": f"l{i:05d}", "type": tarfile.LNKTYPE, "link": "a"} for i in range(6000)]
    r, dt = timed(put_tar, client, sid, "/workspace/bomb-links",
                  tar_bytes(links, tarfile.GNU_FORMAT))
    if client.get(f"/v1/sandboxes/{sid}/stats", expect=200).json["disk_kind"] == "tmpfs":
        err(r, 422, "unprocessable", "ENOSPC")
        figure("6000 hard-link bomb refused in s", round(dt, 2))
    else:
        assert r.status == 204, r
        assert sh(client, sid, "ls /workspace/bomb-links | wc -l; "
                               "stat -c %h /workspace/bomb-links/a") == "6001\n6001\n"
        figure("6000 hard links (one inode) extracted in s", round(dt, 2))
    client.delete(url(sid, "files", "/workspace/bomb-links", recursive=1), expect=204)
    files = [{"name": f"f{i:05d}"} for i in range(6000)]
    r, dt = timed(put_tar, client, sid, "/workspace/bomb-files",
                  tar_bytes(files, tarfile.GNU_FORMAT))
    err(r, 422, "unprocessable", "ENOSPC")
    figure("6000 empty-file bomb refused in s", round(dt, 2))
    client.delete(url(sid, "files", "/workspace/bomb-files", recursive=1), expect=204)
    # An archive bigger than the whole disk is refused by the edge before its body is read
    # (the agent's own extraction limit behind it is tested by tar_test and oci_import_test).
    r, dt = timed(put_tar, client, sid, "/workspace/bomb-one",
                  tar_bytes([{"name": "big", "data": b"z" * (17 << 20)}]))
    err(r, 413, "too_large", "disk_mb 16")
    assert sh(client, sid, "test ! -e /workspace/bomb-one && echo gone") == "gone\n"
    # An archive that fits the disk but not what is left of it: ENOSPC part-way.
    sh(client, sid, "head -c 3145728 /dev/zero > /workspace/pad")
    blob = b"z" * (1 << 20)
    big = [{"name": f"b{i:02d}", "data": blob} for i in range(15)]
    r, dt = timed(put_tar, client, sid, "/workspace/bomb-bytes",
                  tar_bytes(big, tarfile.GNU_FORMAT))
    e = err(r, r.status)
    assert (r.status, e["code"]) in ((422, "unprocessable"), (413, "too_large")), r
    figure("15 MB bomb on a 16 MB disk holding 3 MB refused in s", round(dt, 2))
    client.delete(url(sid, "files", "/workspace/bomb-bytes", recursive=1), expect=204)
    client.delete(url(sid, "files", "/workspace/pad"), expect=204)
    assert sh(client, sid, "ls -A /workspace; echo alive") == "alive\n"
    canary.check()


# ---- the swap race ----------------------------------------------------------------------------

SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2
os.chdir("/workspace")
def xchg(a, b):
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
# Only atomic exchanges: with a plain rename the path would briefly not exist, and the API
# may then legitimately create a directory there (uploads create parents).
n, deadline = 0, time.monotonic() + 300
open("swapper-ready", "w").close()
while (n < int(sys.argv[1]) or not os.path.exists("stop")) and time.monotonic() < deadline:
    xchg(b"sw", b"rootlink"); xchg(b"sw", b"rootlink")    # dir -> symlink to / -> dir
    xchg(b"sw", b"hostlink"); xchg(b"sw", b"hostlink")    # dir -> symlink to host path -> dir
    n += 4
    if n % 16 == 0:
        time.sleep(0.001)  # leave the agent CPU: some 10k swaps/s is plenty of race
print(n)
"""


def test_dir_symlink_swap_race_during_transfers(edge, client, canary, figure):
    """While the sandbox swaps a directory with a symlink to / and with a symlink to a host-only
    path (renameat2 RENAME_EXCHANGE in a loop, 10,000+ swaps), 10,000 uploads,
    downloads, lists, deletes and archive transfers go through the racing path: every answer is
    2xx or 403/404 (never 5xx or a host file), nothing lands outside the directory or the
    sandbox's /tmp, and the host canaries are untouched."""
    m, c = canary.marker, str(canary.dir)
    sid = client.create({"memory_mb": 256, "cpu": 2, "labels": {"suite": "security"}})["id"]
    try:
        _swap_race(edge, client, sid, m, c, figure, canary)
    finally:
        client.remove(sid)
    canary.check()


def _swap_race(edge, client, sid, m, c, figure, canary):
    total_ops, min_swaps, threads = 10_000, 10_000, 2
    client.put(url(sid, "files", "/workspace/swapper.py"), SWAPPER.encode(), expect=204)
    sh(client, sid, f"mkdir -p /workspace/sw/sub && printf inside-dir > /workspace/sw/f && "
                    f"printf in-sub > /workspace/sw/sub/g && ln -s / /workspace/rootlink && "
                    f"ln -s {c} /workspace/hostlink")
    bg = client.post(f"/v1/sandboxes/{sid}/exec",
                     {"cmd": ["python3", "/workspace/swapper.py", str(min_swaps)],
                      "background": True, "timeout_ms": 300000}, expect=202).json["exec_id"]
    deadline = time.monotonic() + 20
    while client.get(url(sid, "files/stat", "/workspace/swapper-ready")).status != 200:
        assert time.monotonic() < deadline, "the swapper did not start"
        time.sleep(0.05)
    tar = tar_bytes([{"name": f"{m}-t", "data": b"T"}])
    host_secret = canary.secret_data
    statuses, f_results = {}, {}
    bad = []
    lock = threading.Lock()

    def op(cl, i):
        k = i % 20
        if k < 5:
            r = cl.put(url(sid, "files", f"/workspace/sw/{m}-{i % 64}"), b"w%d" % i)
            ok = r.status in (204, 403, 404)
        elif k < 10:
            name = ("f", "secret", "sub/g", "../sw/f", "sub/inner")[k - 5]
            r = cl.get(url(sid, "files", f"/workspace/sw/{name}"))
            ok = r.status in (200, 404) or (r.status == 400 and name == "../sw/f")
            if r.status == 200:
                ok = r.body in (b"inside-dir", b"in-sub") and host_secret not in r.body
        elif k < 15:
            sub = ("", "/sub", "/tmp", "/", "/..")[k - 10]
            r = cl.get(url(sid, "files/list", "/workspace/sw" + sub))
            ok = r.status in (200, 404)
            if r.status == 200:
                names = names_of(r)
                ok = "secret" not in names and "inner" not in names
        elif k < 17:
            r = cl.delete(url(sid, "files", f"/workspace/sw/{m}-{(i * 7) % 64}"))
            ok = r.status in (204, 403, 404)
        elif k < 19:
            r = cl.put(url(sid, "archive", f"/workspace/sw/arch{i % 8}"), tar)
            ok = r.status in (204, 403, 404)
        else:
            r = cl.get(url(sid, "archive", "/workspace/sw/sub"))
            ok = r.status in (200, 404)
            if r.status == 200:
                ok = host_secret not in r.body and len(r.body) < 65536
        with lock:
            route = r.path.split("?")[0].split(f"{sid}/", 1)[1]
            key = f"{r.method} {route} {r.status}"
            statuses[key] = statuses.get(key, 0) + 1
            if k == 5:  # GET sw/f: the directory's file, or nothing behind either link
                f_results[r.status] = f_results.get(r.status, 0) + 1
            if not ok:
                bad.append(repr(r))

    def worker(t):
        cl = edge.client(keep_alive=True, validate=False)
        try:
            for i in range(t, total_ops, threads):
                op(cl, i)
        finally:
            cl.close()

    t0 = time.monotonic()
    ws = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    elapsed = time.monotonic() - t0
    client.put(url(sid, "files", "/workspace/stop"), b"", expect=204)
    st = client.get(f"/v1/sandboxes/{sid}/execs/{bg}?wait_ms=60000", expect=200).json
    assert st["state"] == "exited" and st["result"]["exit_code"] == 0, st["result"]
    swaps = int(st["result"]["stdout"])
    figure("race API ops", total_ops)
    figure("race ops time s", round(elapsed, 1))
    figure("race swaps during ops", swaps)
    figure("race statuses", dict(sorted(statuses.items())))
    assert not bad, f"{len(bad)} bad answers, e.g. {bad[:5]}"
    assert swaps >= min_swaps
    assert sum(statuses.values()) == total_ops
    # Every answer kind happened: the race really alternated what the path meant.
    print(f"race: {total_ops} ops in {elapsed:.1f}s, {swaps} swaps, {statuses}")
    assert f_results.get(200) and f_results.get(404), f_results
    # Inside the sandbox, files with the marker exist only in the directory and /tmp.
    sh(client, sid, "test -d /workspace/sw && test -L /workspace/rootlink && "
                    "test -L /workspace/hostlink")
    found = sh(client, sid, f"find / -xdev -name '{m}*' 2>/dev/null; true").split()
    outside = [p for p in found if not (p.startswith("/workspace/sw/") or p.startswith("/tmp/"))]
    assert not outside, outside
    assert sh(client, sid, "cat /workspace/sw/f /workspace/sw/sub/g") == "inside-dir" + "in-sub"
    assert sh(client, sid, "ls -A /workspace | sort") == \
        "hostlink\nrootlink\nstop\nsw\nswapper-ready\nswapper.py\n"


# ---- edge path parameters ---------------------------------------------------------------------

ROUTES = [("GET", "files"), ("PUT", "files"), ("DELETE", "files"), ("GET", "files/list"),
          ("GET", "files/stat"), ("POST", "files/mkdir"), ("GET", "archive"), ("PUT", "archive")]


@pytest.mark.parametrize("method,route", ROUTES)
def test_bad_path_parameters_are_400(client, sandbox, method, route):
    """NUL bytes, paths over PATH_MAX, a component over NAME_MAX, relative paths and invalid
    percent-encoding in the path parameter are 400 with a JSON error on every file route."""
    base = f"/v1/sandboxes/{sandbox}/{route}"
    body = (END if route == "archive" else b"x") if method == "PUT" else None
    bad = {
        "nul": "?path=/workspace/a%00b", "nul-end": "?path=/workspace/a%00",
        "path-max": "?path=/" + "a/" * 2048,
        "pct-zz": "?path=/workspace/%zz", "pct-cut": "?path=/workspace/%4",
        "pct-end": "?path=/workspace/%", "pct-nul-hex": "?path=/workspace/%0g",
        "relative": "?path=workspace/a", "empty": "?path=",
        "name-max": "?path=/workspace/" + "n" * 256,
    }
    for what, q in bad.items():
        r = client.request(method, base + q, body, validate=False)
        assert r.status == 400, (what, r)
        client.check(r, validate=False)
        assert len(r.body) < 8192, (what, len(r.body))
    # A request line of 70 KB is refused before routing (413, request headers too large).
    r = client.request(method, base + "?path=/" + "b" * 70000, body, validate=False)
    assert r.status == 413, r
    client.check(r, validate=False)
    # A 4095-byte path of 2,042 real components is an ordinary path: created by PUT and mkdir,
    # 404 for the rest (nothing is there), not a crash or a hang.
    # It used to cost the (single-threaded) agent seconds: every prefix was resolved anew.
    deep = "/workspace" + "/d" * ((4095 - len("/workspace")) // 2)
    r, dt = timed(client.request, method, base + "?path=" + deep, body, validate=False)
    assert r.status == (204 if method in ("PUT", "POST") else 404), r
    client.check(r, validate=False)
    assert dt < 1.5, f"a 2,042-component path took {dt:.1f}s"
    assert client.exec(sandbox, "true")["exit_code"] == 0


def test_non_utf8_names_list_and_delete(client, sandbox, canary):
    """File names that are not UTF-8 (and a symlink target with quotes, backslash and newline)
    list as valid JSON, archive byte-exact, and a recursive delete removes them."""
    script = (b"import os\nos.makedirs('/workspace/u')\n"
              b"open(b'/workspace/u/\\xff\\xfe-bad', 'w').write('x')\n"
              b"os.symlink(b'/\\xff\"\\\\\\n', b'/workspace/u/l\\xfe')\n"
              b"os.mkdir(b'/workspace/u/d\\xc3\\x28')\n")
    client.put(url(sandbox, "files", "/workspace/mk.py"), script, expect=204)
    assert client.exec(sandbox, cmd=["python3", "/workspace/mk.py"])["exit_code"] == 0
    r = client.get(url(sandbox, "files/list", "/workspace/u"), expect=200)
    assert len(r.json["entries"]) == 3
    got = client.get(url(sandbox, "archive", "/workspace/u"), expect=200).body
    with tarfile.open(fileobj=io.BytesIO(got), encoding="utf-8", errors="surrogateescape") as tf:
        names = {os.fsencode(x.name.rstrip("/")): x for x in tf.getmembers()}
    assert set(names) == {b"\xff\xfe-bad", b"l\xfe", b"d\xc3\x28"}
    assert os.fsencode(names[b"l\xfe"].linkname) == b'/\xff"\\\n'
    client.delete(url(sandbox, "files", "/workspace/u", recursive=1), expect=204)
    assert sh(client, sandbox, "ls -A /workspace") == "mk.py\n"
    canary.check()
