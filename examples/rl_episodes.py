#!/usr/bin/env python3
"""A batch of agent episodes, the way an RL trainer drives DSec (the main job of scripts/demo).

Each episode is what a coding agent's rollout does with its sandbox, through AsyncDSecClient:

  1. create a sandbox (host image, loopback-only network, memory/pids/disk limits, a TTL)
  2. write a small Python project: a module with a bug, its unit test, a README
  3. run the tests: `python3 -B -m pytest -q` if the image has pytest, else
     `python3 -B -m unittest` -> they must fail, and the output must name the failing test
  4. apply a fix (rewrite the module)
  5. rerun the tests -> they must pass
  6. score the run: a grader function on the edge's warm `python` runtime (POST /v1/fncalls,
     no sandbox of its own) reads the test output and returns the reward -> it must be 1.0
  7. read the module back -> it must be the fixed text
  8. delete the sandbox

200 episodes by default, 32 at a time, with a live progress line on stderr and a summary
table at the end. With no --url it starts its own dsec-edge (examples/edgeproc.py: temp state
dir, token and socket, a free loopback port), stops it afterwards and checks that no sandbox,
cgroup, process, mount or state entry is left. Exit code 0 only if every episode passed and
the cleanup is clean.

    sudo python3 examples/rl_episodes.py [--episodes 200] [--concurrency 32]
    python3 examples/rl_episodes.py --url http://127.0.0.1:7070 --token ...   # existing edge
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import edgeproc  # noqa: E402

edgeproc.use_sdk()
from libdsec import AsyncDSecClient, DSecError, SandboxSpec  # noqa: E402

PROJECT = "/workspace/project"
# Generous: 32 pytest runs at once on 2 cores take ~10 s each; a hung test still ends.
EXEC_TIMEOUT_MS = 180_000

# Small bug-fixing tasks: (module, buggy source, fixed source, test source, failing test).
# The tests are unittest.TestCase classes so that pytest and unittest both run them.
TASKS = [
    ("calc",
     "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
     "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
     "import unittest\n\nfrom calc import add, mul\n\n\n"
     "class TestCalc(unittest.TestCase):\n"
     "    def test_add(self):\n        self.assertEqual(add(2, {n}), {n2})\n\n"
     "    def test_mul(self):\n        self.assertEqual(mul(3, {n}), {n3})\n",
     "test_add"),
    ("text",
     "import re\n\n\ndef slugify(s):\n    return re.sub(r\"[^a-z0-9]+\", \"-\", s).strip(\"-\")\n",
     "import re\n\n\ndef slugify(s):\n"
     "    return re.sub(r\"[^a-z0-9]+\", \"-\", s.lower()).strip(\"-\")\n",
     "import unittest\n\nfrom text import slugify\n\n\n"
     "class TestSlugify(unittest.TestCase):\n"
     "    def test_lowercase(self):\n"
     "        self.assertEqual(slugify(\"Episode {n} Done\"), \"episode-{n}-done\")\n\n"
     "    def test_plain(self):\n        self.assertEqual(slugify(\"a b\"), \"a-b\")\n",
     "test_lowercase"),
    ("stats",
     "def mean(xs):\n    return sum(xs) / len(xs)\n",
     "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n",
     "import unittest\n\nfrom stats import mean\n\n\n"
     "class TestMean(unittest.TestCase):\n"
     "    def test_values(self):\n        self.assertEqual(mean([{n}, {n}]), {n})\n\n"
     "    def test_empty(self):\n        self.assertEqual(mean([]), 0.0)\n",
     "test_empty"),
    ("seq",
     "def fib(n):\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n"
     "    return a\n",
     "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
     "    return a\n",
     "import unittest\n\nfrom seq import fib\n\n\n"
     "class TestFib(unittest.TestCase):\n"
     "    def test_fib(self):\n"
     "        self.assertEqual([fib(i) for i in range(8)], [0, 1, 1, 2, 3, 5, 8, 13])\n",
     "test_fib"),
]


class EpisodeFailure(Exception):
    pass


# The reward: 1.0 when the test output says everything passed (pytest or unittest), else the
# fraction that passed.
GRADER = r'''
import re, sys
out = sys.stdin.read()
passed = sum(int(n) for n in re.findall(r"(\d+) passed", out))
failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", out))
m = re.search(r"Ran (\d+) tests?", out)
if m and not passed and not failed:
    total = int(m.group(1))
    bad = re.search(r"FAILED \((?:failures|errors)=(\d+)", out)
    failed = int(bad.group(1)) if bad else 0
    passed = total - failed
print(round(passed / (passed + failed), 3) if passed + failed else 0.0)
'''


class Stats:
    def __init__(self) -> None:
        self.lat: dict[str, list[float]] = {k: [] for k in
                                            ("create", "write", "exec", "score", "read",
                                             "delete", "episode")}
        self.ok = 0
        self.failed = 0
        self.running = 0
        self.errors: list[tuple[int, str, str]] = []

    def add(self, op: str, seconds: float) -> None:
        self.lat[op].append(seconds * 1000.0)


async def timed(stats: Stats, op: str, coro):
    t = time.perf_counter()
    result = await coro
    stats.add(op, time.perf_counter() - t)
    return result


def tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


async def episode(client: AsyncDSecClient, i: int, runner: list[str], job: str,
                  stats: Stats) -> None:
    module, buggy, fixed, test_src, failing = TASKS[i % len(TASKS)]
    n = i % 97 + 2
    test_src = test_src.format(n=n, n2=2 + n, n3=3 * n)
    spec = SandboxSpec(image="host", cpu=1.0, memory_mb=256, pids=128, disk_mb=64, ttl_s=600,
                       network={"mode": "none"}, labels={"job": job, "episode": str(i)})
    step = "create"
    sb = None
    deleted = False
    try:
        sb = await timed(stats, "create", client.create(spec))
        step = "write project"
        await timed(stats, "write", sb.write_file(f"{PROJECT}/{module}.py", buggy))
        await timed(stats, "write", sb.write_file(f"{PROJECT}/test_{module}.py", test_src))
        await timed(stats, "write", sb.write_file(
            f"{PROJECT}/README.md", f"# episode {i}\n\nMake `{runner[-1]}` pass.\n"))
        step = "first test run"
        r = await timed(stats, "exec", sb.exec(runner, cwd=PROJECT, timeout_ms=EXEC_TIMEOUT_MS))
        out = r.stdout + r.stderr
        if r.exit_code == 0 or failing not in out:
            raise EpisodeFailure(f"tests should fail naming {failing}: exit {r.exit_code}"
                                 f"\n{tail(out)}")
        step = "apply fix"
        await timed(stats, "write", sb.write_file(f"{PROJECT}/{module}.py", fixed))
        step = "second test run"
        r = await timed(stats, "exec", sb.exec(runner, cwd=PROJECT, timeout_ms=EXEC_TIMEOUT_MS))
        if not r.ok:
            raise EpisodeFailure(f"tests should pass: exit {r.exit_code}"
                                 f"{' (timed out)' if r.timed_out else ''}\n"
                                 f"{tail(r.stdout + r.stderr)}")
        step = "score"
        g = await timed(stats, "score", client.run_fncall(
            "python", GRADER, stdin=r.stdout + r.stderr, timeout_ms=EXEC_TIMEOUT_MS))
        if g.exit_code != 0 or g.stdout.strip() != "1.0":
            raise EpisodeFailure(f"grader gave {g.stdout.strip()!r} (exit {g.exit_code})"
                                 f"\n{tail(g.stderr)}")
        step = "read back"
        data = await timed(stats, "read", sb.read_file(f"{PROJECT}/{module}.py"))
        if data != fixed.encode():
            raise EpisodeFailure(f"read back {len(data)} bytes that differ from the fix")
        step = "delete"
        await timed(stats, "delete", sb.stop())
        deleted = True
        stats.ok += 1
    except asyncio.CancelledError:
        deleted = True  # interrupted: the edge's shutdown destroys it
        raise
    except Exception as e:  # DSecError, a failed check, or anything unexpected
        stats.failed += 1
        kind = type(e).__name__ if not isinstance(e, EpisodeFailure) else "check"
        stats.errors.append((i, step, f"{kind}: {e}"))
    finally:
        if sb is not None and not deleted:
            try:
                await sb.stop()
            except Exception:
                pass


async def choose_runner(client: AsyncDSecClient, forced: str, job: str) -> tuple[list[str], str]:
    """pytest if the host image has it (one probe sandbox), else unittest."""
    # -B: no bytecode cache. The fix has the buggy file's size and often lands in the same
    # second, and .pyc files are checked by (mtime seconds, size): a cached .pyc from the
    # failing run would then be reused and the fixed code never run.
    pytest_cmd = ["python3", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    unittest_cmd = ["python3", "-B", "-m", "unittest"]
    if forced == "pytest":
        return pytest_cmd, "pytest"
    if forced == "unittest":
        return unittest_cmd, "unittest"
    async with await client.create(memory_mb=256, disk_mb=16, ttl_s=120,
                                   labels={"job": job, "probe": "1"}) as sb:
        r = await sb.exec(["python3", "-c", "import pytest; print(pytest.__version__)"])
    if r.exit_code == 0:
        return pytest_cmd, f"pytest {r.stdout.strip()}"
    return unittest_cmd, "unittest (no pytest on the host image)"


async def progress(stats: Stats, total: int, start: float, tty: bool) -> None:
    last_plain = 0.0
    while True:
        done = stats.ok + stats.failed
        el = time.monotonic() - start
        line = (f"  [{done:>{len(str(total))}}/{total}] ok {stats.ok}  failed {stats.failed}"
                f"  running {stats.running}  {done / el if el > 0 else 0:.1f} episodes/s"
                f"  {el:.0f}s")
        if tty:
            sys.stderr.write("\r" + line + "\x1b[K")
            sys.stderr.flush()
        elif el - last_plain >= 5.0 or done == total:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            last_plain = el
        if done >= total:
            if tty:
                sys.stderr.write("\n")
            return
        await asyncio.sleep(0.2)


async def run(args, url: str, token: str | None, stats: Stats, info: dict) -> None:
    job = info["job"]
    async with AsyncDSecClient(url, token=token, max_connections=args.concurrency + 8,
                               timeout=120.0) as client:
        node = await client.node()
        info["node"] = node
        runner, runner_name = await choose_runner(client, args.runner, job)
        info["runner"] = runner_name
        info["runner_cmd"] = " ".join(runner)
        print(f"test runner: {runner_name} ({' '.join(runner)})", file=sys.stderr)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.episodes):
            queue.put_nowait(i)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                stats.running += 1
                t = time.perf_counter()
                try:
                    await episode(client, i, runner, job, stats)
                finally:
                    stats.running -= 1
                stats.add("episode", time.perf_counter() - t)

        start = time.monotonic()
        tty = sys.stderr.isatty()
        prog = asyncio.create_task(progress(stats, args.episodes, start, tty))
        try:
            await asyncio.gather(*(worker() for _ in range(min(args.concurrency,
                                                               args.episodes))))
            info["wall"] = time.monotonic() - start
            await prog  # returns by itself once every episode is counted
        finally:
            info.setdefault("wall", time.monotonic() - start)
            if not prog.done():
                prog.cancel()
                try:
                    await prog
                except asyncio.CancelledError:
                    pass
                if tty:
                    sys.stderr.write("\n")
        left = await client.list_sandboxes(labels={"job": job})
        info["left"] = len(left)
        info["node_after"] = await client.node()


def fmt_ms(x: float) -> str:
    return "-" if x != x else (f"{x:.1f}" if x < 1000 else f"{x:,.0f}")


def summary(args, stats: Stats, info: dict, edge: edgeproc.EdgeProcess | None,
            cleanup: list[str] | None) -> str:
    p = edgeproc.percentile
    wall = info.get("wall", 0.0)
    done = stats.ok + stats.failed
    calls = sum(len(stats.lat[k]) for k in ("create", "write", "exec", "score", "read", "delete"))
    lines = ["", "== summary",
             f"{'episodes':<22}{done} of {args.episodes}  (ok {stats.ok}, failed {stats.failed})",
             f"{'concurrency':<22}{args.concurrency}",
             f"{'test runner':<22}{info.get('runner', '?')}",
             f"{'wall time':<22}{wall:.1f} s",
             f"{'episodes/s':<22}{done / wall if wall else 0:.2f}",
             f"{'API calls':<22}{calls}  ({calls / wall if wall else 0:.1f}/s)",
             "",
             f"{'latency (ms)':<22}{'count':>7}{'p50':>10}{'p99':>10}{'max':>10}"]
    names = {"create": "create sandbox", "write": "write file", "exec": "exec (test run)",
             "score": "score (fncall)", "read": "read file", "delete": "delete sandbox",
             "episode": "whole episode"}
    for k, label in names.items():
        xs = stats.lat[k]
        lines.append(f"{label:<22}{len(xs):>7}{fmt_ms(p(xs, 50)):>10}{fmt_ms(p(xs, 99)):>10}"
                     f"{fmt_ms(max(xs) if xs else float('nan')):>10}")
    lines.append("")
    if "left" in info:
        lines.append(f"{'sandboxes left':<22}{info['left']} (job={info['job']}, via the API)")
    if edge is not None:
        lines.append(summary_cleanup(edge, cleanup))
    return "\n".join(lines)


def summary_cleanup(edge: edgeproc.EdgeProcess, cleanup: list[str] | None) -> str:
    if cleanup is None:
        return f"{'edge shutdown':<22}not done"
    if not cleanup:
        return (f"{'edge shutdown':<22}SIGTERM -> exited {edge.exit_code} in "
                f"{edge.stop_seconds:.2f} s; no sandbox, cgroup, process, mount or "
                "state entry left; temp dir removed")
    return "\n".join([f"{'edge shutdown':<22}LEFT BEHIND:"] + ["  " + c for c in cleanup])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200, help="episodes to run (default 200)")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="episodes at a time (default 32)")
    ap.add_argument("--runner", choices=["auto", "pytest", "unittest"], default="auto",
                    help="test runner in the sandbox (auto: pytest if the image has it)")
    ap.add_argument("--url", default=None, help="use a running edge instead of starting one")
    ap.add_argument("--token", default=os.environ.get("DSEC_TOKEN"), help="its token")
    ap.add_argument("--edge", default=None, help="dsec-edge binary to start "
                    "(default build/release/src/edge/dsec-edge)")
    ap.add_argument("--workdir", default=None,
                    help="where the edge's temp dir goes (default $TMPDIR)")
    args = ap.parse_args()
    if args.episodes < 1 or args.concurrency < 1:
        ap.error("--episodes and --concurrency must be at least 1")

    edgeproc.raise_on_sigterm()
    edge = None
    stats = Stats()
    info: dict = {"job": f"demo-{os.getpid()}"}
    cleanup: list[str] | None = None
    rc = 0
    try:
        if args.url:
            url, token = args.url, args.token
        else:
            # Room for the concurrent episodes; admission counts memory_mb x overcommit.
            edge = edgeproc.EdgeProcess(args.edge, workdir=args.workdir, prefix="dsec-demo-",
                                        max_sandboxes=max(4096, args.concurrency + 8))
            t = time.monotonic()
            edge.start()
            print(f"{edge.ready_line}  ({(time.monotonic() - t) * 1000:.0f} ms, pid {edge.pid})",
                  file=sys.stderr)
            url, token = edge.url, edge.token
        print(f"running {args.episodes} episodes, {args.concurrency} at a time: create -> "
              "write project -> tests fail -> fix -> tests pass -> read back -> delete",
              file=sys.stderr)
        asyncio.run(run(args, url, token, stats, info))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the edge (it destroys every sandbox)", file=sys.stderr)
        rc = 130
    except (DSecError, edgeproc.EdgeError, OSError) as e:
        print(f"\nrl_episodes: {e}", file=sys.stderr)
        rc = 1
    finally:
        if edge is not None:
            cleanup = edge.stop()
    if "wall" in info:
        print(summary(args, stats, info, edge, cleanup))
    elif edge is not None:
        print(summary_cleanup(edge, cleanup))
    if stats.errors:
        print(f"\nFAILED: {stats.failed} episode(s); the first ones:")
        for i, step, msg in sorted(stats.errors)[:5]:
            print(f"  episode {i}, {step}: {msg}".replace("\n", "\n      "))
    if stats.errors or info.get("left") or cleanup or stats.ok < args.episodes:
        rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
