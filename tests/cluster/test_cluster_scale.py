"""bench/cluster_scale's short version (issue 38): a few node stand-ins behind two apiservers
with quotas on, driven for seconds; while nodes join, leave and are cordoned, every create is
answered, none is made twice, and without churn every placed create is on a node.

The long runs (160 nodes, 100,000 and 380,000 creates) are bench/cluster_scale's own command
(bench/RESULTS.md "Cluster scale")."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import cluster_harness

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_dir():
    api = pathlib.Path(cluster_harness.apiserver_binary())
    return api.parents[2]  # <build>/src/apiserver/dsec-apiserver


def run_scale(tmp_path, *args):
    out = tmp_path / "scale.json"
    env = dict(os.environ, DSEC_BUILD_DIR=str(build_dir()))
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "cluster_scale"), *args,
                        "--json", str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1].endswith(" placed creates/s"), p.stdout[-500:]
    return json.loads(out.read_text())


@pytest.fixture
def runnable():
    why = cluster_harness.why_not_runnable()
    if why:
        print(f"[  SKIPPED ] {why}", file=sys.stderr)
        pytest.skip(why)
    if not (build_dir() / "bench" / "dsec-standin").exists():
        pytest.skip(f"bench/dsec-standin is not built in {build_dir()}")


def test_a_short_run_places_every_create_once(runnable, tmp_path):
    r = run_scale(tmp_path, "--nodes", "6", "--total", "4000", "--connections", "32")
    assert r["placed"] >= 4000, r
    assert set(r["by_status"]) == {"201"}, r
    assert r["duplicates"] == 0 and r["load_errors"] == 0 and r["lost"] == 0, r
    # Spread: no node far above the mean (power of two choices).
    assert r["per_node_max"] <= 1.5 * r["per_node_mean"], r


def test_churn_loses_no_request_and_makes_no_duplicate(runnable, tmp_path):
    r = run_scale(tmp_path, "--nodes", "6", "--seconds", "8", "--churn", "--connections", "32",
                  "--max-per-node", "100000")
    assert r["placed"] > 0, r
    assert r["duplicates"] == 0 and r["load_errors"] == 0, r
    # Every create answered: placed, or refused with a status a client retries.
    assert set(r["by_status"]) <= {"201", "429", "503"}, r
