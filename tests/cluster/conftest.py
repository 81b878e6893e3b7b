"""Fixtures for the local-cluster tests (cluster_harness.py): a real etcd, dsec-edges and
dsec-apiservers on 127.0.0.1.

- `cluster`: a fresh cluster (3 edges, 2 apiservers) in the test's tmp dir; at the end every
  killed edge is restarted (to destroy what it left), everything is stopped with SIGTERM and
  nothing may remain (edge cgroups, mounts, network tables, processes).
- `make_cluster(edges=..., apiservers=..., edge_args=..., edge_config=...)`: the same with
  other sizes or flags; several per test are fine.

Needs root, etcd (Debian's etcd-server), dsec-edge (DSEC_EDGE_BIN) and dsec-apiserver
(DSEC_APISERVER_BIN); otherwise every test here is skipped with the reason printed.
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "integration"))

import pytest  # noqa: E402

import cluster_harness  # noqa: E402
from cluster_harness import Cluster  # noqa: E402

SKIP_REASON = cluster_harness.why_not_runnable()


def pytest_report_header(config):
    if SKIP_REASON:
        return f"local cluster tests skipped: {SKIP_REASON}"
    return (f"dsec-edge: {cluster_harness.edge_harness.edge_binary()}, dsec-apiserver: "
            f"{cluster_harness.apiserver_binary()}, etcd: {cluster_harness.etcd_binary()}")


def pytest_terminal_summary(terminalreporter):
    if SKIP_REASON:
        # Shown even with -q; ctest's SKIP_REGULAR_EXPRESSION keys on the marker.
        terminalreporter.write_line(f"[  SKIPPED ] local cluster tests: {SKIP_REASON}")


def _skip_if_not_runnable():
    if SKIP_REASON:
        print(f"[  SKIPPED ] {SKIP_REASON}", file=sys.stderr)
        pytest.skip(SKIP_REASON)


def _teardown(c):
    cluster_harness.teardown(c)


@pytest.fixture
def make_cluster(tmp_path):
    _skip_if_not_runnable()
    made = []

    def make(**kw):
        c = Cluster.start(tmp_path / f"cluster{len(made)}", **kw)
        made.append(c)
        return c

    yield make
    errors = []
    for c in made:
        try:
            _teardown(c)
        except AssertionError as err:
            errors.append(str(err))
    assert not errors, "\n".join(errors)


@pytest.fixture
def cluster(make_cluster):
    return make_cluster()
