#!/usr/bin/env python3
"""E2B compatibility layer: `commands.run('true')` through the unmodified E2B JS SDK (npm `e2b`,
pinned by tests/e2b/package-lock.json) against a native v1 exec of the same command
(`/bin/bash -l -c true`) from the same Node process, one sandbox, serial, interleaved rounds.
Goal (issue 19): E2B p50 <= 1.3x native. Then `@e2b/code-interpreter`'s runCode('1 + 1') (a
persistent kernel) against a native exec of `python3 -c 'print(1 + 1)'` (no goal: what a
persistent kernel saves per call).

    sudo python3 bench/e2b_bench.py [--calls 200] [--rounds 3] [--edge build/release/src/edge/dsec-edge]

Starts its own edge (examples/edgeproc.py) with --e2b-listen, `npm ci`s the SDK into
build/e2b-test (Node >= 20 and npm needed), prints the rows and the ratios; --json prints the
rows as JSON lines too. Checks that the edge left nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
import edgeproc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--edge", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        print("e2b_bench: node and npm are needed", file=sys.stderr)
        return 2
    work = REPO / "build" / "e2b-test"
    work.mkdir(parents=True, exist_ok=True)
    for f in ("package.json", "package-lock.json", "e2b_bench.mjs"):
        shutil.copy(REPO / "tests" / "e2b" / f, work / f)
    if not (work / "node_modules" / "@e2b" / "code-interpreter").exists():
        subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=work,
                       check=True, capture_output=True)
    edge = edgeproc.EdgeProcess(args.edge, extra_args=["--e2b-listen", "127.0.0.1:0"]).start()
    rc = 0
    try:
        fields = dict(f.split("=", 1) for f in edge.ready_line.split()[2:] if "=" in f)
        e2b_url = fields["e2b"]
        env = dict(os.environ, E2B_API_URL=e2b_url, E2B_SANDBOX_URL=e2b_url,
                   E2B_API_KEY=edge.token, E2B_DOMAIN="dsec.invalid", DSEC_URL=edge.url,
                   CALLS=str(args.calls), ROUNDS=str(args.rounds))
        r = subprocess.run([node, "e2b_bench.mjs"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=3600)
        if r.returncode != 0:
            print(f"e2b_bench: {r.stdout}\n{r.stderr}", file=sys.stderr)
            return 1
        rows = {j["system"]: j for j in map(json.loads, r.stdout.split("\n")[:-1])}
        for j in rows.values():
            print(f"{j['workload']:<16} {j['system']:<13} n={j['n']:<5} p50 {j['p50_ms']:7.2f} ms"
                  f"  p90 {j['p90_ms']:7.2f} ms  p99 {j['p99_ms']:7.2f} ms", file=sys.stderr)
            if args.json:
                print("JSON " + json.dumps(j), flush=True)
        ratio = rows["e2b"]["p50_ms"] / rows["native"]["p50_ms"]
        print(f"e2b/native p50: {ratio:.2f}x (goal <= 1.3x)", file=sys.stderr)
        print(f"runCode/native python3 -c p50: "
              f"{rows['runcode']['p50_ms'] / rows['native-python']['p50_ms']:.2f}x", file=sys.stderr)
    finally:
        left = edge.stop()
        if left:
            print(f"e2b_bench: the edge left {left}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
