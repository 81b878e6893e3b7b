"""Escape attempts (issue 6): code inside a container sandbox, as the default `sandbox` user and
as root inside, tries to reach the host through /proc, fds, the agent's binary, symlinked mount
targets, masked /proc entries, new procfs/sysfs/cgroupfs mounts, cgroup release_agent, device
nodes, TIOCSTI, new namespaces and the syscalls the profile refuses, setuid binaries and file
capabilities. Every attempt runs inside a live sandbox; the host side is checked afterwards."""

import hashlib
import json
import os
import pathlib
import secrets
import textwrap

import pytest

from sec_util import install_probe, int80_signal_on_host, probe, tty_attach_output

USERS = [None, "root"]  # the sandbox's default user (uid 1000) and root inside
USER_IDS = ["sandbox", "root"]


def run_py(client, sid, code, user=None, **fields):
    """Runs python3 code inside the sandbox; it must print one JSON document, returned here."""
    f = dict(fields)
    if user:
        f["user"] = user
    r = client.exec(sid, cmd=["python3", "-c", textwrap.dedent(code)], timeout_ms=60000, **f)
    assert r["exit_code"] == 0, r
    return json.loads(r["stdout"])


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def agent_binary():
    """The dsec-agent the edge seals into its memfd (DefaultHelperPath's first candidates)."""
    env = os.environ.get("DSEC_AGENT_PATH")
    if env:
        return pathlib.Path(env)
    import edge_harness  # noqa: PLC0415
    edge_dir = edge_harness.edge_binary().resolve().parent
    for cand in (edge_dir / "dsec-agent", edge_dir.parent / "agent" / "dsec-agent"):
        if cand.is_file():
            return cand
    pytest.skip(f"dsec-agent not found next to {edge_dir}")


# ---- the seccomp profile --------------------------------------------------------------------

# Every attempt refused by the profile (or the kernel right behind it), with the exact answer.
REFUSED = {
    # new namespaces: unshare, clone flags, clone3 (ENOSYS: seccomp cannot see its flags)
    "unshare_user": "blocked EPERM", "unshare_net": "blocked EPERM",
    "unshare_mnt": "blocked EPERM", "unshare_pid": "blocked EPERM",
    "unshare_cgroup": "blocked EPERM", "clone_newuser": "blocked EPERM",
    "clone_newns": "blocked EPERM", "clone3": "blocked ENOSYS", "setns_self": "blocked EPERM",
    # mounts: a new procfs/sysfs/cgroupfs (v1 and v2), tmpfs, binds, remounts, unmasking
    "mount_proc": "blocked EPERM", "mount_sysfs": "blocked EPERM",
    "mount_cgroup": "blocked EPERM", "mount_cgroup_v1": "blocked EPERM",
    "mount_tmpfs": "blocked EPERM", "mount_bind_root": "blocked EPERM",
    "remount_root_suid": "blocked EPERM", "umount_proc": "blocked EPERM",
    "umount_proc_mask": "blocked EPERM", "fsopen_proc": "blocked EPERM",
    "fsopen_cgroup": "blocked EPERM", "open_tree_root": "blocked EPERM",
    "pivot_root": "blocked EPERM", "chroot": "blocked EPERM",
    # kernel attack surface
    "bpf": "blocked EPERM", "userfaultfd": "blocked EPERM", "io_uring": "blocked EPERM",
    "io_uring_enter": "blocked EPERM", "io_uring_register": "blocked EPERM",
    "perf_event_open": "blocked EPERM", "keyctl": "blocked EPERM", "add_key": "blocked EPERM",
    "request_key": "blocked EPERM", "open_by_handle_at": "blocked EPERM",
    "memfd_secret": "blocked EPERM", "kexec_load": "blocked EPERM",
    "init_module": "blocked EPERM", "finit_module": "blocked EPERM", "iopl": "blocked EPERM",
    "ioperm": "blocked EPERM", "syslog": "blocked EPERM", "reboot": "blocked EPERM",
    "swapon": "blocked EPERM", "acct": "blocked EPERM", "settimeofday": "blocked EPERM",
    "fanotify_init": "blocked EPERM", "personality_no_aslr": "blocked ENOSYS",
    "sethostname": "blocked EPERM",
    # terminal injection, including the 64-bit cmd that libseccomp's own rule would let by
    "tiocsti": "blocked EPERM", "tioclinux": "blocked EPERM",
    # device nodes
    "mknod_dev": "blocked EPERM", "mknod_char_mem": "blocked EPERM",
    "mknodat_char_kvm": "blocked EPERM",
    # socket families a tool call does not need
    "packet_socket": "blocked ENOSYS", "vsock_socket": "blocked ENOSYS",
    "alg_socket": "blocked ENOSYS", "uevent_socket": "blocked ENOSYS",
    "raw_socket": "blocked EPERM",
}
# Controls: ordinary calls the profile lets through, so a broken probe cannot pass.
CONTROLS = {"getpid": "allowed", "clone_plain": "allowed", "unix_socket": "allowed"}


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_profile_refuses_namespaces_mounts_and_kernel_surface(client, sandbox, user, figure):
    """New user/mount/pid/net namespaces (syscalls and the unshare/nsenter tools),
    procfs/sysfs/cgroupfs mounts, bpf, userfaultfd,
    io_uring, perf_event_open, keyctl, open_by_handle_at, x32/int80, TIOCSTI/TIOCLINUX, device
    mknod and raw sockets from inside (sandbox user and root) are all refused with the exact
    errno (or SIGSYS), while ordinary calls still work."""
    install_probe(client, sandbox)
    got = probe(client, sandbox, *REFUSED, *CONTROLS, user=user)
    want = {**REFUSED, **CONTROLS}
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"(got, want) per attempt: {wrong}"
    # The real tools too: unshare -U (as root: mapped to root) and a user-namespace nsenter.
    f = {"user": user} if user else {}
    for cmd in ("unshare -U -r id -u", "unshare -m -p -f --mount-proc id -u",
                "nsenter -t 1 -m id -u"):
        r = client.exec(sandbox, cmd, **f)
        assert r["exit_code"] != 0 and r["stdout"] == "", (cmd, r)
        assert "Operation not permitted" in r["stderr"] or "Permission denied" in r["stderr"], \
            (cmd, r)
    # Foreign ABIs (x32 syscall numbers, int 0x80) kill the process outright with SIGSYS;
    # where the host's kernel itself faults on int 0x80, the fault (SIGSEGV) comes first.
    int80 = int80_signal_on_host()
    if int80 is not None:
        print(f"note: int 0x80 ends with signal {int80} on this host without any filter")
    for name, sig in (("x32", 31), ("int80", int80 or 31)):
        r = client.exec(sandbox, cmd=["/tmp/dsec-probe", "getpid", name],
                        **({"user": user} if user else {}))
        assert r["signal"] == sig and r["stdout"] == "getpid allowed\n", (name, r)
    figure("attempts refused", len(REFUSED) + 2)


IDMAP_CODE = r"""
import errno, json, os
out = {}
for name, value in (("projid_map", "0 0 4294967295"), ("uid_map", "0 0 1"),
                    ("gid_map", "0 0 1"), ("setgroups", "deny")):
    for pid in ("self", "1"):
        p = f"/proc/{pid}/{name}"
        try:
            with open(p, "w") as f:
                f.write(value)
            out[p] = "written"
        except OSError as e:
            out[p] = errno.errorcode[e.errno]
with open("/proc/self/projid_map") as f:
    out["projid_map"] = f.read().split()
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_user_namespace_maps_are_sealed(client, sandbox, user):
    """Writing the sandbox user namespace's uid_map, gid_map, setgroups and projid_map (which the
    kernel lets anyone in the namespace write once, with no capability) through /proc/self and
    /proc/1 fails for the sandbox user and root: every map was written before user code ran."""
    r = run_py(client, sandbox, IDMAP_CODE, user=user)
    maps = r.pop("projid_map")
    written = {p: v for p, v in r.items() if v == "written"}
    assert not written, r
    # Ours, or the initial namespace's identity map on an edge running without user namespaces.
    assert maps in (["0", "0", "1"], ["0", "0", "4294967295"]), maps


# ---- capabilities, no_new_privs, seccomp on every thread ------------------------------------

THREADS_CODE = r"""
import glob, json, os, threading, time
stop = threading.Event()
ts = [threading.Thread(target=stop.wait) for _ in range(8)]
for t in ts: t.start()
time.sleep(0.05)
def fields(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Seccomp", "NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd",
                         "CapAmb", "Uid", "Name"):
                    out[k] = v.strip()
    except OSError:
        return None
    return out
mine = {p: fields(p) for p in glob.glob("/proc/self/task/*/status")}
every = {p: fields(p) for p in glob.glob("/proc/[0-9]*/task/*/status")}
stop.set()
for t in ts: t.join()
print(json.dumps({"mine": mine, "every": {k: v for k, v in every.items() if v}}))
"""

ROOT_CAPS = 0x5fb  # chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service
DANGEROUS_CAPS = {"sys_admin": 21, "sys_ptrace": 19, "sys_module": 16, "net_admin": 12,
                  "net_raw": 13, "sys_rawio": 17, "mknod": 27, "sys_resource": 24,
                  "dac_read_search": 2, "sys_chroot": 18, "audit_control": 30, "bpf": 39,
                  "perfmon": 38, "sys_boot": 22, "sys_time": 25, "syslog": 34}


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_every_thread_is_filtered_and_capabilityless(client, sandbox, user, figure):
    """Every thread of every process in the sandbox (a 9-thread python, a background process,
    a shell session and the agent) shows Seccomp 2 and NoNewPrivs 1; user code has empty
    capability sets (root inside: at most Docker's reduced set, never sys_admin/ptrace/...)."""
    # Something long-lived from an earlier exec and a shell session, to be counted too.
    client.exec(sandbox, "sleep 60 >/dev/null 2>&1 &", timeout_ms=10000)
    shell = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    try:
        r = run_py(client, sandbox, THREADS_CODE, user=user)
    finally:
        client.delete(f"/v1/sandboxes/{sandbox}/shells/{shell}", expect=(204, 404))
    mine, every = r["mine"], r["every"]
    assert len(mine) >= 9, mine  # the main thread and 8 more
    for path, f in mine.items():
        assert f["Seccomp"] == "2" and f["NoNewPrivs"] == "1", (path, f)
        assert int(f["CapInh"], 16) == 0 and int(f["CapAmb"], 16) == 0, (path, f)
        if user is None:
            for k in ("CapPrm", "CapEff", "CapBnd"):
                assert int(f[k], 16) == 0, (path, f)
        else:
            for k in ("CapPrm", "CapEff", "CapBnd"):
                assert int(f[k], 16) & ~ROOT_CAPS == 0, (path, f)
    names = set()
    for path, f in every.items():
        names.add(f.get("Name"))
        assert f["Seccomp"] == "2" and f["NoNewPrivs"] == "1", (path, f)
        caps = int(f["CapEff"], 16) | int(f["CapPrm"], 16) | int(f["CapBnd"], 16)
        held = [n for n, bit in DANGEROUS_CAPS.items() if caps >> bit & 1]
        # The agent alone keeps dac_read_search (it serves file reads for root-owned files).
        if f.get("Name") == "dsec-agent":
            held.remove("dac_read_search") if "dac_read_search" in held else None
        assert not held, (path, f, held)
    assert {"dsec-agent", "sleep", "bash"} <= names, names
    figure("threads checked", len(every))


def test_tiocsti_refused_on_a_real_terminal(edge, client, sandbox):
    """On a real pty (a tty attach), TIOCSTI (also with a 64-bit cmd) and TIOCLINUX into the
    session's own terminal are refused EPERM."""
    import edge_harness  # noqa: PLC0415
    install_probe(client, sandbox)
    path = f"/v1/sandboxes/{sandbox}/attach?cmd=/tmp/dsec-probe&cmd=tiocsti&cmd=tioclinux&tty=1"
    status, _, ws = edge_harness.WebSocket.connect("127.0.0.1", edge.port, path,
                                                   token=edge.token)
    assert status == 101, ws
    out, result = b"", None
    try:
        ws.sock.settimeout(30)
        while result is None:
            op, payload = ws.recv()
            if op == 0x2:
                out += payload
            elif op == 0x1 and "exit" in json.loads(payload):
                result = json.loads(payload)["exit"]
            elif op == 0x8:
                break
    finally:
        ws.close()
    lines = out.decode().replace("\r", "").split("\n")
    assert "tiocsti blocked EPERM" in lines and "tioclinux blocked EPERM" in lines, out
    assert result and result["exit_code"] == 0, result


def test_hijacked_dev_ptmx_fails_cleanly(edge, client, sandbox):
    """Root inside replaces /dev/ptmx with a FIFO, /dev/null and links to the agent's own fds
    (/proc/1/fd/N): each tty attach is refused with a JSON error at once (the agent opens nothing
    of its own through it) and the sandbox keeps serving."""
    import edge_harness  # noqa: PLC0415
    for target in ("fifo", "/dev/null", "/proc/1/fd/3", "/proc/1/fd/4", "/proc/1/fd/5"):
        make = "mkfifo /dev/ptmx" if target == "fifo" else f"ln -s {target} /dev/ptmx"
        client.sh(sandbox, f"rm -f /dev/ptmx && {make}", user="root")
        path = f"/v1/sandboxes/{sandbox}/attach?cmd=true&tty=1"
        status, _, ws = edge_harness.WebSocket.connect("127.0.0.1", edge.port, path,
                                                       token=edge.token)
        if status != 101:
            assert 400 <= status < 600, status
            continue
        try:
            ws.sock.settimeout(20)
            op, payload = ws.recv()
        finally:
            ws.close()
        assert op == 0x1 and "error" in json.loads(payload), (target, op, payload)
        assert client.sh(sandbox, "echo ok") == "ok\n"
    # Put it back: a tty works again.
    client.sh(sandbox, "rm -f /dev/ptmx && ln -s pts/ptmx /dev/ptmx", user="root")
    out = tty_attach_output(edge, sandbox)
    assert "/dev/pts/" in out, out


# ---- setuid binaries and file capabilities --------------------------------------------------

SETUID_CODE = r"""
import json, os, stat
out = {}
for name in ("su", "sudo", "passwd", "mount", "newgrp", "chsh", "gpasswd", "umount"):
    for d in ("/usr/bin", "/bin", "/usr/sbin"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            out.setdefault("setuid_on_image", {})[name] = bool(os.stat(p).st_mode & stat.S_ISUID)
            break
print(json.dumps(out))
"""


def test_setuid_and_file_capabilities_gain_nothing(client, sandbox, figure):
    """A setuid-root python and cat made by root inside and the image's own setuid
    su/sudo/passwd/mount run with the sandbox user's uid 1000 and get nothing; file capabilities
    (cap_sys_admin+ep) cannot even be set by root inside (or, if set, give nothing)."""
    # root inside makes the binaries; the sandbox user runs them.
    client.sh(sandbox, "cp /usr/bin/python3 /workspace/pysuid && chmod 4755 /workspace/pysuid && "
              "cp /bin/cat /workspace/catsuid && chmod 4755 /workspace/catsuid && "
              "cp /usr/bin/python3 /workspace/pycap && stat -c '%a %u' /workspace/pysuid",
              user="root")
    # security.capability v2: effective flag, permitted = cap_sys_admin | cap_dac_override.
    caps = (0x02000001).to_bytes(4, "little") + ((1 << 21) | (1 << 1)).to_bytes(4, "little") + \
        bytes(12)
    setcap = client.exec(sandbox, cmd=["python3", "-c", (
        "import os,sys; os.setxattr('/workspace/pycap', 'security.capability', "
        f"bytes.fromhex('{caps.hex()}')); print('set')")], user="root")
    file_caps = setcap["exit_code"] == 0 and setcap["stdout"] == "set\n"
    if not file_caps:  # root inside has no CAP_SETFCAP: refused outright
        assert "Operation not permitted" in setcap["stderr"], setcap
    mode = client.sh(sandbox, "stat -c '%a %u' /workspace/pysuid /workspace/catsuid")
    assert mode.split("\n")[:2] == ["4755 0", "4755 0"], mode
    r = json.loads(client.sh(sandbox, "/workspace/pysuid -c 'import os,json; "
                             "print(json.dumps([os.getresuid(), os.getresgid()]))'"))
    assert r == [[1000, 1000, 1000], [1000, 1000, 1000]], r
    status = client.sh(sandbox, "/workspace/catsuid /proc/self/status")
    uid_line = [ln for ln in status.splitlines() if ln.startswith("Uid:")][0]
    assert uid_line.split()[1:] == ["1000"] * 4, uid_line
    if file_caps:
        status = client.sh(sandbox, "/workspace/pycap -c \"print(open('/proc/self/status').read())\"")
        for k in ("CapPrm", "CapEff"):
            line = [ln for ln in status.splitlines() if ln.startswith(k + ":")][0]
            assert int(line.split()[1], 16) == 0, line
    # The image's setuid tools: their setuid bit is there and gives nothing.
    info = run_py(client, sandbox, SETUID_CODE)
    suid = {k for k, v in info.get("setuid_on_image", {}).items() if v}
    if not suid:
        pytest.skip("the host image has no setuid-root tools to try")
    checks = {
        "sudo": "sudo -n id -u",
        "su": "su -c 'id -u' root </dev/null",
        "mount": "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m && echo mounted",
        "umount": "umount /proc && echo unmounted",
        "passwd": "passwd -d root && echo changed",
        "newgrp": "newgrp root </dev/null && id -g",
        "chsh": "chsh -s /bin/sh root </dev/null && echo changed",
        "gpasswd": "gpasswd -a sandbox root && echo changed",
    }
    figure("setuid tools of the image tried", ", ".join(sorted(suid & set(checks))))
    for name in sorted(suid & set(checks)):
        r = client.exec(sandbox, checks[name], timeout_ms=20000)
        assert r["stdout"].strip() not in ("0", "mounted", "unmounted", "changed"), (name, r)


# ---- /proc, fds and the agent's root, cwd and binary -----------------------------------------

FD_WALK_CODE = r"""
import json, os, stat
root = os.stat("/")
out = {"own_fds": {}, "outside": [], "dirs": [], "pids": 0, "roots_checked": 0}
for fd in os.listdir("/proc/self/fd"):
    try:
        out["own_fds"][fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        out["own_fds"][fd] = f"err {e.errno}"
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    out["pids"] += 1
    for link in ("root", "cwd"):
        try:
            st = os.stat(f"/proc/{pid}/{link}")
        except OSError:
            continue
        target = os.readlink(f"/proc/{pid}/{link}")
        inside = os.stat(target) if os.path.exists(target) else None
        if link == "root":
            out["roots_checked"] += 1
            if (st.st_dev, st.st_ino) != (root.st_dev, root.st_ino):
                out["outside"].append([pid, link, target])
        elif inside is None or (st.st_dev, st.st_ino) != (inside.st_dev, inside.st_ino):
            out["outside"].append([pid, link, target])
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        p = f"/proc/{pid}/fd/{fd}"
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            target = os.readlink(p)
            out["dirs"].append([pid, fd, target])
            try:
                os.chdir(p)
                os.chdir("../../../../../../..")
                up = os.stat(".")
                if (up.st_dev, up.st_ino) != (root.st_dev, root.st_ino):
                    out["outside"].append([pid, fd, target, "dotdot"])
            except OSError:
                pass
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_proc_fd_root_and_cwd_links_stay_inside(client, sandbox, user):
    """Walking /proc/*/root, /proc/*/cwd and every /proc/*/fd/N (chdir into each directory fd,
    then "..") from inside never reaches anything but the sandbox's own root; an exec inherits
    only fds 0-2 (no socket, no directory)."""
    client.exec(sandbox, "cd /tmp && sleep 60 >/dev/null 2>&1 &", timeout_ms=10000,
                **({"user": user} if user else {}))
    r = run_py(client, sandbox, FD_WALK_CODE, user=user)
    assert not r["outside"], r
    assert r["roots_checked"] >= 2, r  # at least our own and the sleep's
    # Our own fds: 0-2 (plus the one listdir() held, closed by the time it was read).
    extra = {fd: t for fd, t in r["own_fds"].items()
             if fd not in ("0", "1", "2") and not t.startswith("err ")}
    assert not extra, r["own_fds"]
    assert r["own_fds"]["0"] == "/dev/null", r["own_fds"]
    for fd in ("1", "2"):
        assert r["own_fds"][fd].startswith("pipe:"), r["own_fds"]


CWD_CODE = r"""
import json, os
root = os.stat("/")
for _ in range(40):
    os.chdir("..")
top = os.stat(".")
print(json.dumps({"escaped": (top.st_dev, top.st_ino) != (root.st_dev, root.st_ino),
                  "top": sorted(os.listdir("."))[:12]}))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_exec_cwd_and_path_through_agent_fds_stay_inside(edge, client, sandbox, user):
    """An exec whose cwd is /proc/self/fd/N (N = 3..24: the fds the agent held when it forked
    the command), or a symlink to it, or whose program path runs through /proc/self/fd/N/../..,
    never starts outside the sandbox: walking ".." from its cwd ends at the sandbox's own root,
    and a script that exists only on the host is never run."""
    f = {"user": user} if user else {}
    host_script = edge.root / f"h1-host-only-{secrets.token_hex(4)}.sh"
    host_script.write_text("#!/bin/sh\necho RAN-ON-HOST-FILE\n")
    host_script.chmod(0o755)
    escaped, started = [], 0
    client.sh(sandbox, "for n in $(seq 3 24); do ln -sfn /proc/self/fd/$n /workspace/fd$n; done")
    for n in range(3, 25):
        for cwd in (f"/proc/self/fd/{n}", f"/workspace/fd{n}", f"/proc/self/fd/{n}/.."):
            r = client.exec(sandbox, cmd=["python3", "-c", CWD_CODE], cwd=cwd, **f)
            if r["exit_code"] == 0:
                started += 1
                if json.loads(r["stdout"])["escaped"]:
                    escaped.append((cwd, r["stdout"]))
            else:
                assert r["exit_code"] in (126, 127) and "dsec: chdir" in r["stderr"], (cwd, r)
        prog = f"/proc/self/fd/{n}/" + "../" * 16 + str(host_script).lstrip("/")
        r = client.exec(sandbox, cmd=[prog], cwd="/", **f)
        if "RAN-ON-HOST-FILE" in r["stdout"]:
            escaped.append((prog, r["stdout"]))
    assert not escaped, f"started outside the sandbox: {escaped[:4]}"


def test_shell_session_inherits_no_control_fds(client, sandbox):
    """A command in a shell session sees only its stdio and its own shell's pipes: no socket,
    no directory, nothing of the agent's."""
    shell = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json["shell_id"]
    try:
        r = client.post(f"/v1/sandboxes/{sandbox}/shells/{shell}/run",
                        {"command": "for f in /proc/$$/fd/*; do echo \"$f $(readlink $f)\"; "
                                    "done", "timeout_ms": 20000},
                        expect=200).json
    finally:
        client.delete(f"/v1/sandboxes/{sandbox}/shells/{shell}", expect=(204, 404))
    assert r["exit_code"] == 0, r
    targets = [ln.split(" ", 1)[1] for ln in r["stdout"].splitlines() if " " in ln]
    assert targets, r
    for t in targets:
        assert t.startswith(("pipe:", "/dev/null", "/proc/")), (t, r["stdout"])


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_agent_root_cwd_exe_and_namespaces_are_closed(client, sandbox, user):
    """Opening, chdir-ing into or exec-ing the agent's /proc/1/root, /proc/1/cwd and
    /proc/1/exe, writing /proc/1/exe, and setns into its namespaces are refused (EACCES/EPERM)
    for the sandbox user and for root inside."""
    install_probe(client, sandbox)
    want = {"open_pid1_root": "blocked EACCES", "chdir_pid1_root": "blocked EACCES",
            "chdir_pid1_cwd": "blocked EACCES", "open_pid1_exe": "blocked EACCES",
            "exec_pid1_exe": "blocked EACCES", "write_pid1_exe": "blocked EACCES",
            "setns_pid1_mnt": "blocked EACCES", "setns_pid1_user": "blocked EACCES"}
    got = probe(client, sandbox, *want, user=user)
    assert got == want


def test_agent_binary_cannot_be_found_or_rewritten(edge, client, sandbox, figure):
    """Root inside looks for the agent's binary (/proc/1/exe cannot be opened for writing; any
    copy found in the sandbox's tree is overwritten, or refused) and overwrites /bin/bash and a
    running shell's /proc/self/exe: the host's dsec-agent and bash are unchanged and a new
    sandbox gets pristine ones."""
    agent = agent_binary()
    before = {agent: sha256(agent), pathlib.Path("/usr/bin/bash"): sha256("/usr/bin/bash")}
    size = agent.stat().st_size
    # Any copy of the agent in the sandbox's tree (a file of its size and content, or named like
    # it), e.g. the host's install under the image's /usr: root inside overwrites each one.
    found = client.sh(sandbox, f"find / -xdev -name 'dsec-agent*' -print 2>/dev/null; "
                      f"find / -xdev -type f -size {size}c -exec sha256sum {{}} + 2>/dev/null | "
                      f"grep {before[agent]} | cut -d' ' -f3-; true", user="root",
                      timeout_ms=60000).split()
    for path in sorted(set(found)):
        client.exec(sandbox, cmd=["cp", "/bin/true", path], user="root")
    figure("copies of the agent found inside", len(set(found)))
    r = client.exec(sandbox, "exec 3>/proc/1/exe", user="root")
    assert r["exit_code"] != 0 and "Permission denied" in r["stderr"], r
    # Overwrite bash, then the running shell's exe. In the host image root inside is a
    # stranger to the host's files (they are not idmapped): refused. (In an image of the store
    # it would be a copy-up in the sandbox's own writable layer.)
    r = client.exec(sandbox, "printf '#!/bin/sh\\necho pwned\\n' > /usr/bin/bash && "
                    "chmod 755 /usr/bin/bash && /usr/bin/bash", user="root")
    assert r["stdout"] == "pwned\n" or "Permission denied" in r["stderr"], r
    # (ETXTBSY, or a write into the sandbox's copy-up: either way not the host's file.)
    client.exec(sandbox, "exec 3>/proc/$$/exe && echo x >&3", user="root")
    after = {p: sha256(p) for p in before}
    assert after == before, "a host binary changed"
    other = client.create({"labels": {"suite": "security"}})["id"]
    try:
        out = client.sh(other, "/usr/bin/bash -c 'echo fine'")
        assert out == "fine\n"
    finally:
        client.remove(other)


# ---- masked /proc, /sys and cgroups --------------------------------------------------------

MASKED_CODE = r"""
import errno, json, os
paths = ["/proc/kallsyms", "/proc/kcore", "/proc/sysrq-trigger", "/proc/timer_list",
         "/proc/sched_debug", "/proc/keys", "/proc/key-users", "/proc/kpagecount",
         "/proc/kpageflags", "/proc/kpagecgroup", "/proc/timer_stats", "/proc/latency_stats",
         "/proc/acpi", "/proc/scsi", "/proc/asound"]
out = {}
for p in paths:
    r = {}
    try:
        if os.path.isdir(p):
            r["read"] = len(os.listdir(p))
        else:
            with open(p, "rb") as f:
                r["read"] = len(f.read(4096))
    except OSError as e:
        r["read"] = errno.errorcode[e.errno]
    try:
        fd = os.open(p, os.O_WRONLY)
        try:
            os.write(fd, b"c" if p.endswith("sysrq-trigger") else b"x")
            r["write"] = "ok"
        except OSError as e:
            r["write"] = errno.errorcode[e.errno]
        os.close(fd)
    except OSError as e:
        r["write"] = errno.errorcode[e.errno]
    out[p] = r
for p in ["/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern",
          "/proc/sys/vm/drop_caches", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger",
          "/proc/sys/kernel/sysrq"]:
    try:
        with open(p, "w") as f:
            f.write("|/tmp/x" if "pattern" in p or "modprobe" in p else "1")
        out[p] = {"write": "ok"}
    except OSError as e:
        out[p] = {"write": errno.errorcode[e.errno]}
for p in ["/sys/firmware", "/sys/kernel", "/sys/fs/cgroup", "/sys/class", "/sys/devices"]:
    try:
        out[p] = {"list": len(os.listdir(p))}
    except OSError as e:
        out[p] = {"list": errno.errorcode[e.errno]}
out["/sys"] = {"list": os.listdir("/sys")}
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_masked_proc_and_sys_give_nothing(client, sandbox, user, figure):
    """Reading or writing /proc/kallsyms, kcore, sysrq-trigger, timer_list, sched_debug, keys,
    kpage*, writing /proc/sys (core_pattern, modprobe, drop_caches) and listing /sys/firmware,
    /sys/kernel or /sys/fs/cgroup from inside yields nothing: absent, empty or refused."""
    r = run_py(client, sandbox, MASKED_CODE, user=user)
    readable = []
    for p, v in r.items():
        if p == "/sys":
            # No host /sys at all: only the sandbox's own CPU list (devices/system/cpu/online,
            # possible, present), checked below.
            assert v["list"] in ([], ["devices"]), v
            continue
        if "read" in v:
            # absent, unreadable, or a mask: an empty file or an empty directory
            assert v["read"] in (0, "ENOENT", "EACCES", "EPERM"), (p, v)
            if v["read"] == 0:
                readable.append(p)
        if "write" in v:
            assert v["write"] != "ok" or p in readable, (p, v)  # only into a /dev/null mask
            assert v["write"] in ("ENOENT", "EACCES", "EPERM", "EROFS", "EISDIR", "ok"), (p, v)
            if p.startswith("/proc/sys/"):
                assert v["write"] in ("EROFS", "EACCES", "ENOENT"), (p, v)
        if "list" in v:
            # /sys/devices holds "system" alone: the sandbox's CPU list, checked below.
            assert v["list"] in ("ENOENT", 0) or (p == "/sys/devices" and v["list"] == 1), (p, v)
    own = client.exec(sandbox, "find /sys -mindepth 1 ! -type d | sort")["stdout"].split()
    assert own in ([], [f"/sys/devices/system/cpu/{f}" for f in ("online", "possible",
                                                                  "present")]), own
    # The masks hide something real: on the host kallsyms has content.
    with open("/proc/kallsyms", "rb") as f:
        assert f.read(64), "the host has no kallsyms to compare with"
    figure("masked entries present (read as empty)", len(readable))


def cgroup_v1_roots():
    roots = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] == "cgroup":
                roots[parts[4]] = parts[sep + 3]
    return roots


def test_cgroup_release_agent_is_unreachable(client, sandbox):
    """Root inside tries the release_agent escape: no cgroupfs is visible (/sys/fs/cgroup absent,
    no release_agent or notify_on_release file anywhere), mounting cgroup v1 or v2 is refused
    EPERM, and every host hierarchy's release_agent is unchanged afterwards."""
    roots = cgroup_v1_roots()
    host_before = {}
    for root in roots:
        p = os.path.join(root, "release_agent")
        if os.path.exists(p):
            host_before[p] = pathlib.Path(p).read_text()
    install_probe(client, sandbox)
    got = probe(client, sandbox, "mount_cgroup_v1", "mount_cgroup", "fsopen_cgroup",
                "sys_fs_cgroup", user="root")
    assert got == {"mount_cgroup_v1": "blocked EPERM", "mount_cgroup": "blocked EPERM",
                   "fsopen_cgroup": "blocked EPERM", "sys_fs_cgroup": "blocked ENOENT"}
    script = ("for m in memory cpu pids freezer rdma; do mkdir -p /tmp/cg-$m; "
              "mount -t cgroup -o $m cgroup /tmp/cg-$m 2>/dev/null && echo mounted $m; done; "
              "find / -xdev \\( -name release_agent -o -name notify_on_release \\) -print "
              "2>/dev/null; grep -E 'dsec|sb-|[.][.]' /proc/self/cgroup; true")
    out = client.sh(sandbox, script, user="root", timeout_ms=60000)
    # Nothing mounted, nothing found, and the cgroup paths are relative to the sandbox's own
    # cgroup namespace (nothing names the host's hierarchy).
    assert out.strip() == "", out
    host_after = {p: pathlib.Path(p).read_text() for p in host_before}
    assert host_after == host_before


# ---- devices ----------------------------------------------------------------------------------

@pytest.mark.parametrize("user", USERS, ids=USER_IDS)
def test_device_nodes_cannot_be_made_or_reached(client, sandbox, user):
    """mknod of block/char devices (sda, /dev/mem, /dev/kvm) is EPERM, /dev/mem, /dev/kvm,
    /dev/kmsg, /dev/port and /dev/sda are absent, /dev/null cannot be chmod-ed, and /dev holds
    only the minimal set."""
    install_probe(client, sandbox)
    want = {"mknod_dev": "blocked EPERM", "mknod_char_mem": "blocked EPERM",
            "mknodat_char_kvm": "blocked EPERM", "dev_mem": "blocked ENOENT",
            "dev_kvm": "blocked ENOENT", "dev_kmsg": "blocked ENOENT",
            "dev_port": "blocked ENOENT", "dev_sda": "blocked ENOENT",
            "chmod_dev_null": "blocked EROFS"}
    got = probe(client, sandbox, *want, user=user)
    assert got == want
    listing = sorted(client.sh(sandbox, "ls -A /dev").split())
    assert listing == sorted(["fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr",
                              "stdin", "stdout", "tty", "urandom", "zero"]), listing


# ---- symlinked /proc, /dev and mount targets -------------------------------------------------

def test_symlinked_mount_targets_do_not_lead_out(edge, client, sandbox):
    """Root inside tries to move /proc, /dev, /dev/pts and /dev/null away (EBUSY: all are mount
    points), replaces /dev/shm, /tmp, /run, /var and /workspace with symlinks to / and
    /proc/1/root, uploads a tar of proc/dev/sys symlinks to /: new execs and shells still get the
    real /proc and /dev, uploads land inside the sandbox, and nothing appears on the host."""
    marker = f"dsec-h1-{secrets.token_hex(6)}"
    moves = {"mv /proc /proc.old": "busy", "mv /dev /dev.old": "busy", "rmdir /proc": "busy",
             "mv /dev/pts /dev/pts.old": "busy", "mv /dev/null /dev/null.old": "busy",
             "rm -f /dev/null": "busy", "mv /sys /sys.old && ln -s / /sys": "ok"}
    for cmd, want in moves.items():
        r = client.exec(sandbox, cmd, user="root", cwd="/")
        if want == "busy":
            assert r["exit_code"] != 0 and "busy" in r["stderr"].lower(), (cmd, r)
        else:
            assert r["exit_code"] == 0, (cmd, r)
    client.sh(sandbox, "rm -rf /dev/shm && ln -s / /dev/shm && "
              "rm -rf /tmp && ln -s /proc/1/root /tmp && rm -rf /run && ln -s / /run && "
              "rm -rf /var && ln -s /proc/self/root /var && "
              "rm -rf /workspace && ln -s /proc/1/cwd /workspace", user="root", cwd="/")
    # Uploads through the swapped names land inside (or are refused), never on the host.
    landed = {}
    for d in ("/dev/shm", "/tmp", "/run", "/var", "/workspace", "/sys"):
        r = client.put(f"/v1/sandboxes/{sandbox}/files?path={d}/{marker}", b"x",
                       headers={"Content-Type": "application/octet-stream"})
        landed[d] = r.status
        assert r.status in (204, 400, 403, 404), r
    # A tar whose entries are named like mount targets (proc, dev, sys) and point at /.
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in ("proc", "dev", "sys", f"{marker}-link"):
            ti = tarfile.TarInfo(name)
            ti.type = tarfile.SYMTYPE
            ti.linkname = "/"
            tf.addfile(ti)
        ti = tarfile.TarInfo(f"{marker}-link/{marker}-via-tar")
        ti.size = 1
        tf.addfile(ti, io.BytesIO(b"y"))
    r = client.put(f"/v1/sandboxes/{sandbox}/archive?path=/", buf.getvalue(),
                   headers={"Content-Type": "application/x-tar"})
    assert r.status in (204, 400, 403, 409, 422), r
    print(f"[ NOTE ] uploads through swapped names: {landed}; tar of mount-named links: {r}")
    # New execs (sandbox user and root) and a new shell still work, with the real /proc and
    # /dev, and still cannot reach the agent's root.
    for user in USERS:
        f = {"user": user} if user else {}
        out = client.sh(sandbox, "cat /proc/self/comm; test -c /dev/null && echo dev-ok; "
                        "stat -c %t:%T /dev/null; stat -f -c %T /proc; "
                        "ls /proc/1/root 2>&1 >/dev/null | head -1", cwd="/", **f)
        lines = out.splitlines()
        assert lines[:4] == ["cat", "dev-ok", "1:3", "proc"], out
        assert "Permission denied" in lines[4], out
    # (The default workdir, now a link to /proc/1/cwd, is unusable: give the shell a real one.)
    client.sh(sandbox, "rm /workspace && mkdir /workspace && chown 1000:1000 /workspace",
              user="root", cwd="/")
    shell = client.post(f"/v1/sandboxes/{sandbox}/shells", {}, expect=201).json
    r = client.post(f"/v1/sandboxes/{sandbox}/shells/{shell['shell_id']}/run",
                    {"command": "echo shell-ok", "timeout_ms": 20000}, expect=200).json
    client.delete(f"/v1/sandboxes/{sandbox}/shells/{shell['shell_id']}", expect=(204, 404))
    assert r["stdout"] == "shell-ok\n", r
    # Nothing on the host's root or in the edge's state dir.
    leaked = [p for p in (pathlib.Path("/") / marker,
                          pathlib.Path("/") / f"{marker}-via-tar",
                          pathlib.Path("/dev/shm") / marker,
                          pathlib.Path("/tmp") / marker,
                          pathlib.Path("/run") / marker) if p.exists()]
    leaked += [p for p in edge.root.rglob(f"{marker}*")]
    for p in leaked:
        try:
            os.unlink(p)
        except OSError:
            pass
    assert not leaked, leaked
    # Inside, whatever was accepted landed in the sandbox's own root.
    inside = client.sh(sandbox, f"ls -A / | grep {marker} || true", cwd="/")
    if any(st == 204 for st in landed.values()):
        assert marker in inside, (landed, inside)
