#!/usr/bin/python3
"""CPython's own test suite on the host and in a DSec sandbox, side by side: a sandbox should look
like a normal machine to real programs, so a test that passes on the host must pass inside.

    tests/long/cpython_side_by_side.py [--tests test_os,test_posix,...] [--all] [--jobs N]
                                       [--as-root] [--json PATH] [--log-dir DIR] [--edge PATH]

Runs `/usr/bin/python3 -m test -v --timeout 600 <modules>` (regrtest; -jN with --jobs N > 1)
twice, one after the other:

  host     as `nobody` (setpriv, no capabilities, a private HOME), with the environment a
           sandbox exec gets (PATH, HOME, USER, LOGNAME, SHELL, LANG=C.UTF-8)
  sandbox  in a sandbox on the built-in `host` image (the host's own /usr, so the same
           interpreter and test files) as its default user `sandbox` (uid 1000); cpu 2,
           memory_mb 2048, disk_mb 8192, pids 4096; started on its own dsec-edge (a private
           temp state dir, unix socket and loopback port, config {"network": false}; binary
           from --edge, $DSEC_EDGE_BIN or build/release/src/edge/dsec-edge)

Both run unprivileged, so tests that behave differently for root (permission checks) compare like
with like; --as-root runs both sides as root instead. The edge is stopped (SIGTERM) and its temp
dirs removed at the end, also on failure or Ctrl-C.

Each run's per-test outcomes are parsed from regrtest's verbose output (`test_x (module.Class.
test_x) ... ok|FAIL|ERROR|skipped '...'|expected failure|unexpected success`, the FAIL:/ERROR:
tracebacks and the per-module summary), and the script prints the counts per outcome on each side
and every test (and module) whose outcome differs, with the sandbox's failure text. Exit 1 if a
test that passes on the host fails in the sandbox (or does not run there: a module that crashed
or timed out), else 0; tests that differ only by a skip, or that fail on the host too, are listed
but do not fail the run. Exit 2 if CPython's tests are not installed (Debian:
`apt-get install -y libpython3.11-testsuite`), 77 (skip) without root or without a dsec-edge.

The default 47 modules exercise the OS surface (files, processes, signals, terminals, sockets,
users, limits): about 5,600 tests, 4.5 minutes per side on 2 cores; --all runs the whole suite
(an hour or more; --jobs 2 helps).
"""

import argparse
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "sdk" / "python"))

import edge_harness  # noqa: E402
from edge_harness import Edge  # noqa: E402
from libdsec import DSecClient  # noqa: E402

SKIP = 77
PYTHON = "/usr/bin/python3"
TESTSUITE_PROBE = "/usr/lib/python3.11/test/test_os.py"
DEFAULT_TESTS = [
    # files and directories
    "test_os", "test_posix", "test_posixpath", "test_genericpath", "test_stat", "test_shutil",
    "test_tempfile", "test_glob", "test_pathlib", "test_fileio", "test_io", "test_largefile",
    "test_mmap", "test_fcntl", "test_tarfile", "test_zipfile", "test_mailbox",
    "test_compileall", "test_import",
    # processes, signals, limits, terminals
    "test_subprocess", "test_signal", "test_threadsignals", "test_wait3", "test_wait4",
    "test_fork1", "test_resource", "test_faulthandler", "test_threading", "test_pty",
    "test_openpty", "test_select", "test_selectors", "test_poll", "test_epoll", "test_time",
    # the machine and its users
    "test_pwd", "test_grp", "test_platform", "test_sysconfig", "test_site", "test_sys",
    "test_getpass", "test_uuid", "test_utf8_mode", "test_cmd_line", "test_logging",
    "test_socket",
]
SANDBOX = {"image": "host", "cpu": 2.0, "memory_mb": 2048, "disk_mb": 8192, "pids": 4096}
HOST_USER = "nobody"

PASS = ("ok", "expected failure")
FAILED = ("FAIL", "ERROR", "unexpected success")
ORDER = ("ok", "FAIL", "ERROR", "skipped", "expected failure", "unexpected success", "unknown")

# `test_x (test.test_m.Class.test_x)` [` ... status`]; a docstring puts `first line ... ` on the
# next line; output a test prints can come between the description and its status.
START = re.compile(r"^(?P<name>\w+) \((?P<id>\w+(?:\.\w+)+)\)(?P<rest>.*)$")
STATUS = re.compile(r"(?:^|\.\.\. )(?P<st>ok|FAIL|ERROR|expected failure|unexpected success"
                    r"|skipped(?: (?P<why>.*))?)$")
# A failing subtest: `  test_x (test.test_m.Class.test_x) (i=1) ... FAIL`.
SUBTEST = re.compile(r"^  (?P<name>\w+) \((?P<id>\w+(?:\.\w+)+)\) \(.*\) \.\.\. "
                     r"(?P<st>FAIL|ERROR)$")
BLOCK = re.compile(r"^(?P<st>FAIL|ERROR|UNEXPECTED SUCCESS): (?P<name>\w+) "
                   r"\((?P<id>\w+(?:\.\w+)+)\)(?P<sub> \(.*\))?$")
# `0:01:02 load avg: 0.52 [ 3/20] test_os` (and `[ 3/20/1]` once a module failed).
PROGRESS = re.compile(r"^\d+:\d\d:\d\d (?:load avg: [\d.]+ )?\[\s*\d+/\d+(?:/\d+)?\] "
                      r"(?P<mod>test_\w+)")
# The summary's lists of modules: `2 tests failed:` then indented names.
SUMMARY = re.compile(r"^\d+ (?P<what>tests? (?:failed|skipped|omitted|run no tests"
                     r"|altered the execution environment)|re-run tests?):$")
SUMMARY_LABELS = (("failed", "failed"), ("skipped", "skipped"), ("omitted", "not run"),
                  ("run no tests", "no tests"), ("altered", "env changed"), ("re-run", "re-run"))


class Interrupted(Exception):
    pass


def test_id(m):
    """The dotted id of a START/BLOCK match (`setUpClass (test.m.Class)` -> test.m.Class.
    setUpClass)."""
    name, tid = m.group("name"), m.group("id")
    return tid if tid.endswith("." + name) else f"{tid}.{name}"


def parse(log):
    """Per-test outcomes, failure texts and per-module outcomes of one regrtest -v log."""
    tests, details, modules = {}, {}, {}
    lines = log.splitlines()
    current = None

    def put(tid, outcome, why=None):
        old = tests.get(tid)
        # A failure seen anywhere (a subtest, the traceback block) wins over a later "ok".
        if old and old["outcome"] in FAILED and outcome not in FAILED:
            return
        tests[tid] = {"outcome": outcome, "reason": why}

    def put_status(tid, s):
        st = s.group("st")
        put(tid, "skipped" if st.startswith("skipped") else st, s.group("why"))

    def unfinished():
        # A test that started and never got a status (its module crashed or timed out).
        if current and current not in tests:
            put(current, "unknown")
        return None

    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        m = PROGRESS.match(line)
        if m:
            current = unfinished()
            modules.setdefault(m.group("mod"), "unknown")
            continue
        m = SUBTEST.match(line)
        if m:
            put(test_id(m), m.group("st"))
            continue
        m = BLOCK.match(line)
        if m and i < len(lines) and lines[i].startswith("-----"):
            tid = test_id(m)
            st = "unexpected success" if m.group("st") == "UNEXPECTED SUCCESS" else m.group("st")
            put(tid, st)
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith(("=====", "-----")):
                body.append(lines[i])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            head = f"{m.group('st')}{m.group('sub') or ''}:"
            details[tid] = (details.get(tid, "") + "\n" if tid in details else "") + "\n".join(
                [head] + body)
            continue
        m = START.match(line)
        if m:
            unfinished()
            current = test_id(m)
            s = STATUS.search(m.group("rest"))
            if s:
                put_status(current, s)
                current = None
            continue
        if current:
            s = STATUS.search(line)
            if s:
                put_status(current, s)
                current = None
    current = unfinished()
    # The summary after "== Tests result: ... ==": which modules failed, were skipped, ...
    start = next((k for k, ln in enumerate(lines) if ln.startswith("== Tests result:")), None)
    if start is not None:
        for mod in modules:
            modules[mod] = "ok"
        k = start + 1
        while k < len(lines):
            m = SUMMARY.match(lines[k])
            k += 1
            if not m:
                continue
            label = next(v for w, v in SUMMARY_LABELS if w in m.group("what"))
            while k < len(lines) and lines[k].startswith("    "):
                for name in lines[k].split():
                    if modules.get(name) != "failed":
                        modules[name] = label
                k += 1
    return {"tests": tests, "details": details, "modules": modules,
            "complete": start is not None}


def counts(parsed):
    c = {k: 0 for k in ORDER}
    for t in parsed["tests"].values():
        c[t["outcome"]] = c.get(t["outcome"], 0) + 1
    return c


def compare(host, sandbox):
    """Every test and module whose outcome differs; `regression` marks the ones that fail
    the run (pass on the host, fail or do not run in the sandbox)."""
    diffs = []
    for tid in sorted(set(host["tests"]) | set(sandbox["tests"])):
        h = host["tests"].get(tid, {"outcome": "not run", "reason": None})
        s = sandbox["tests"].get(tid, {"outcome": "not run", "reason": None})
        if h["outcome"] == s["outcome"]:
            continue
        regression = h["outcome"] in PASS and (s["outcome"] in FAILED
                                               or s["outcome"] in ("not run", "unknown"))
        if regression:
            kind = "regression"
        elif h["outcome"] == "skipped" and s["outcome"] in FAILED:
            kind = "fails in the sandbox, skipped on the host"
        elif h["outcome"] == "skipped" or s["outcome"] == "skipped":
            kind = "skip"
        elif h["outcome"] in FAILED and s["outcome"] in PASS:
            kind = "passes only in the sandbox"
        else:
            kind = "other"
        diffs.append({"test": tid, "kind": kind, "regression": regression,
                      "host": h["outcome"], "host_reason": h["reason"],
                      "sandbox": s["outcome"], "sandbox_reason": s["reason"],
                      "host_detail": host["details"].get(tid),
                      "sandbox_detail": sandbox["details"].get(tid)})
    mods = []
    for mod in sorted(set(host["modules"]) | set(sandbox["modules"])):
        h, s = host["modules"].get(mod, "not run"), sandbox["modules"].get(mod, "not run")
        if h != s:
            # A module that crashed or timed out in the sandbox hides its tests' outcomes.
            mods.append({"module": mod, "host": h, "sandbox": s,
                         "regression": h in ("ok", "env changed") and
                         s in ("failed", "not run", "unknown")})
    return diffs, mods


def excerpt(text, n=14):
    lines = (text or "").splitlines()
    if len(lines) > n:
        lines = [lines[0], "  [...]"] + lines[-(n - 1):]
    return "\n".join("        " + ln for ln in lines)


def regrtest_args(ns):
    args = [PYTHON, "-m", "test", "-v", "--timeout", str(ns.timeout)]
    if ns.jobs > 1:
        args.append(f"-j{ns.jobs}")
    return args + ([] if ns.all else ns.tests)


def exec_env(user, home):
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": home, "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
            "LANG": "C.UTF-8"}


def default_signals():
    """In the host run's child before exec: every signal at its default, none blocked, as a
    sandbox's processes start (a caller's ignored SIGINT, e.g. a background job of a script,
    would otherwise be inherited and fail test_threading's interrupt_main tests)."""
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def run_host(ns, work, log_path):
    home = work / "home"
    home.mkdir()
    if ns.as_root:
        user, prefix = "root", []
    else:
        user = HOST_USER
        pw = pwd.getpwnam(user)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                  "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    argv = prefix + ["env", "-i"] + [f"{k}={v}" for k, v in exec_env(user, str(home)).items()]
    argv += regrtest_args(ns)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=home, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=default_signals)
        try:
            rc = proc.wait(timeout=ns.run_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {"user": user, "rc": rc, "wall_s": time.monotonic() - t0,
            "log": pathlib.Path(log_path).read_text(errors="replace")}


def run_sandbox(ns, edge, log_path):
    client = DSecClient(edge.url, edge.token, timeout=None)
    sb = None
    try:
        t0 = time.monotonic()
        sb = client.create(ttl_s=ns.run_timeout + 900, **SANDBOX)
        user = "root" if ns.as_root else None
        who = sb.exec(["id", "-un"], user=user, timeout_ms=60_000).stdout.strip()
        home = "/root" if ns.as_root else "/workspace"
        check = sb.exec(["test", "-f", TESTSUITE_PROBE], user=user, timeout_ms=60_000)
        if check.exit_code != 0:
            raise RuntimeError(f"{TESTSUITE_PROBE} is not visible in the sandbox")
        # regrtest's output goes to a file in the sandbox, read back whole at the end (an
        # exec's captured output is capped; the whole suite's -v output is megabytes).
        out = "/tmp/cpython-side-by-side.log"
        shell = " ".join(regrtest_args(ns)) + f" > {out} 2>&1"
        t1 = time.monotonic()
        eid = sb.start_background(["/bin/sh", "-c", shell], user=user, cwd=home,
                                  env=exec_env(who, home), timeout_ms=ns.run_timeout * 1000)
        res = sb.wait_exec(eid, timeout_s=ns.run_timeout + 120)
        wall = time.monotonic() - t1
        data = sb.read_file(out, max_bytes=1 << 28)  # the API maximum
        pathlib.Path(log_path).write_bytes(data)
        rc = None if res.timed_out else res.exit_code
        return {"user": who, "rc": rc, "wall_s": wall, "create_s": t1 - t0,
                "oom_killed": res.oom_killed, "sandbox": sb.id,
                "log": data.decode(errors="replace")}
    finally:
        if sb is not None:
            try:
                sb.delete()
            except Exception as e:  # noqa: BLE001 -- the edge's shutdown destroys it anyway
                print(f"cpython: deleting {sb.id}: {e}", file=sys.stderr)
        client.close()


def python_version():
    r = subprocess.run([PYTHON, "-c", "import platform; print(platform.python_version())"],
                       capture_output=True, text=True, check=False)
    return r.stdout.strip() or "?"


def fmt_s(s):
    return f"{s:.0f}s" if s < 120 else f"{int(s // 60)}m{int(s % 60):02d}s"


def report(ns, host, sandbox, hp, sp, diffs, mods):
    print()
    print(f"== CPython {python_version()} test suite, host vs DSec sandbox "
          f"({'all modules' if ns.all else f'{len(ns.tests)} modules'})")
    print(f"   host:    as {host['user']} (setpriv, no capabilities)" if host["user"] != "root"
          else "   host:    as root")
    print(f"   sandbox: as {sandbox['user']} on image host, cpu {SANDBOX['cpu']:g}, "
          f"memory_mb {SANDBOX['memory_mb']}, disk_mb {SANDBOX['disk_mb']}, "
          f"pids {SANDBOX['pids']}, no network")
    print()
    cols = ORDER
    print(f"   {'':9}{'wall':>8}{'rc':>5}{'tests':>7}" + "".join(
        f"{c.replace('expected failure', 'xfail').replace('unexpected success', 'xpass'):>9}"
        for c in cols))
    for name, run, p in (("host", host, hp), ("sandbox", sandbox, sp)):
        c = counts(p)
        rc = "-" if run["rc"] is None else str(run["rc"])
        print(f"   {name:9}{fmt_s(run['wall_s']):>8}{rc:>5}{len(p['tests']):>7}" + "".join(
            f"{c.get(k, 0):>9}" for k in cols))
    for name, p in (("host", hp), ("sandbox", sp)):
        if not p["complete"]:
            print(f"   ! the {name} run has no regrtest summary (killed, timed out or crashed)")
    bad_mods = {n: {k for k, v in p["modules"].items() if v not in ("ok", "skipped")}
                for n, p in (("host", hp), ("sandbox", sp))}
    for n, b in bad_mods.items():
        if b:
            print(f"   modules not ok on the {n}: " + ", ".join(
                f"{m} ({(hp if n == 'host' else sp)['modules'][m]})" for m in sorted(b)))
    print()
    if not diffs and not mods:
        print("   no differences: every test has the same outcome on both sides")
        return
    if mods:
        print(f"   {len(mods)} module(s) with a different outcome:")
        for d in mods:
            flag = "  <- REGRESSION" if d["regression"] else ""
            print(f"     {d['module']}: host {d['host']}, sandbox {d['sandbox']}{flag}")
        print()
    print(f"   {len(diffs)} test(s) with a different outcome "
          f"({sum(d['regression'] for d in diffs)} pass on the host and fail in the sandbox):")
    for d in sorted(diffs, key=lambda d: (not d["regression"], d["kind"], d["test"])):
        def side(o, why):
            return f"{o} {why}" if why else o
        flag = "REGRESSION" if d["regression"] else d["kind"]
        print(f"   [{flag}] {d['test']}")
        print(f"       host:    {side(d['host'], d['host_reason'])}")
        print(f"       sandbox: {side(d['sandbox'], d['sandbox_reason'])}")
        if d["sandbox_detail"]:
            print(excerpt(d["sandbox_detail"]))
        elif d["host_detail"] and d["host"] in FAILED:
            print("       host's failure:")
            print(excerpt(d["host_detail"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", help="comma-separated regrtest modules (default: "
                                    + ",".join(DEFAULT_TESTS[:4]) + ",... see the source)")
    ap.add_argument("--all", action="store_true", help="the whole suite")
    ap.add_argument("--jobs", type=int, default=1, help="regrtest -jN (default 1: serial)")
    ap.add_argument("--timeout", type=int, default=600, help="regrtest's per-test timeout")
    ap.add_argument("--run-timeout", type=int, default=None,
                    help="seconds for one side's whole run (default 3600, --all 6 hours)")
    ap.add_argument("--as-root", action="store_true",
                    help="run both sides as root (default: host as nobody, sandbox as sandbox)")
    ap.add_argument("--json", help="also write the comparison to this JSON file")
    ap.add_argument("--log-dir", help="keep both raw regrtest logs here")
    ap.add_argument("--edge", help="dsec-edge binary (default: $DSEC_EDGE_BIN or "
                                   "build/release/src/edge/dsec-edge)")
    ns = ap.parse_args()
    if ns.all and ns.tests:
        ap.error("--tests and --all exclude each other")
    ns.tests = [t.strip() for t in (ns.tests or ",".join(DEFAULT_TESTS)).split(",") if t.strip()]
    if ns.run_timeout is None:
        ns.run_timeout = 6 * 3600 if ns.all else 3600
    if ns.edge:
        os.environ["DSEC_EDGE_BIN"] = ns.edge
    if not os.path.isfile(TESTSUITE_PROBE):
        print(f"cpython: {TESTSUITE_PROBE} is missing: CPython's test suite is not installed "
              "(apt-get install -y libpython3.11-testsuite)", file=sys.stderr)
        return 2
    reason = edge_harness.why_not_runnable()
    if reason:
        print(f"[  SKIPPED ] cpython side by side: {reason}")
        return SKIP

    def on_term(signum, frame):
        raise Interrupted(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    work = pathlib.Path(tempfile.mkdtemp(prefix="dsec-cpython-"))
    os.chmod(work, 0o755)
    if ns.log_dir:
        os.makedirs(ns.log_dir, exist_ok=True)
    logs = pathlib.Path(ns.log_dir or work)
    edge = None
    try:
        what = "the whole suite" if ns.all else f"{len(ns.tests)} modules"
        print(f"cpython: {what}: {' '.join(regrtest_args(ns)[1:])}", flush=True)
        print(f"cpython: host run as {'root' if ns.as_root else HOST_USER} ...", flush=True)
        host = run_host(ns, work, logs / "host.log")
        print(f"cpython: host done in {fmt_s(host['wall_s'])} (rc {host['rc']})", flush=True)
        edge = Edge.start(prefix="dsec-cpython-edge-", config={"network": False})
        print(f"cpython: edge pid {edge.pid} at {edge.url}; sandbox run ...", flush=True)
        sandbox = run_sandbox(ns, edge, logs / "sandbox.log")
        print(f"cpython: sandbox done in {fmt_s(sandbox['wall_s'])} (rc {sandbox['rc']}, "
              f"create {sandbox['create_s'] * 1000:.0f} ms)", flush=True)
        residue = edge.shutdown_and_check()
        if residue:
            print(f"cpython: the edge left residue: {residue}", file=sys.stderr)
        hp, sp = parse(host["log"]), parse(sandbox["log"])
        diffs, mods = compare(hp, sp)
        report(ns, host, sandbox, hp, sp, diffs, mods)
        failed = (any(d["regression"] for d in diffs) or any(m["regression"] for m in mods)
                  or not sp["complete"] or bool(residue))
        if ns.json:
            out = {
                "python": python_version(),
                "modules": "all" if ns.all else ns.tests,
                "command": regrtest_args(ns),
                "sandbox_spec": SANDBOX,
                "sides": {n: {"user": r["user"], "rc": r["rc"], "wall_s": round(r["wall_s"], 1),
                              "complete": p["complete"], "counts": counts(p),
                              "modules": p["modules"]}
                          for n, r, p in (("host", host, hp), ("sandbox", sandbox, sp))},
                "module_differences": mods,
                "differences": diffs,
                "edge_residue": residue,
                "ok": not failed,
            }
            pathlib.Path(ns.json).write_text(json.dumps(out, indent=2) + "\n")
        print()
        print(f"cpython side by side: {'FAILED' if failed else 'OK'}")
        return 1 if failed else 0
    except (KeyboardInterrupt, Interrupted) as e:
        print(f"\ncpython: interrupted ({e or 'Ctrl-C'}); stopping", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if edge is not None:
            try:
                if edge.running():
                    edge.stop()
            finally:
                edge.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
