"""The live dsec-edge fixtures, shared by tests/integration and tests/security (each suite's
conftest.py imports them).

- `edge`: one dsec-edge for the whole session (127.0.0.1 on a free port, temp state dir, token
  file and unix socket). Most tests share it; each creates and deletes its own sandboxes.
- `make_edge(extra_args=..., config=...)`: a dedicated edge for tests that need special flags
  or kill/restart it; torn down when the test ends.
- `client`: a raw HTTP client (edge_harness.Client) on the shared edge; every response is
  validated against api/openapi.yaml.
- `sandbox`: a fresh sandbox id on the shared edge, deleted afterwards.

Teardown of every edge: SIGTERM, wait, then nothing may remain: no dsec cgroups of that edge
instance in any hierarchy, no mounts under its state dir, no processes of its sandboxes. The
temp dirs are removed (and leftovers force-cleaned) even when a test fails.

Needs root and the dsec-edge binary (DSEC_EDGE_BIN, default build/release/src/edge/dsec-edge);
otherwise every live test is skipped with the reason printed.
"""

import sys

import pytest

import edge_harness
from edge_harness import Edge

SKIP_REASON = edge_harness.why_not_runnable()


def report_header():
    if SKIP_REASON:
        return f"live dsec-edge tests skipped: {SKIP_REASON}"
    return f"dsec-edge: {edge_harness.edge_binary()}"


def terminal_summary(terminalreporter):
    if SKIP_REASON:
        # Shown even with -q; ctest's SKIP_REGULAR_EXPRESSION keys on the marker.
        terminalreporter.write_line(f"[  SKIPPED ] live dsec-edge tests: {SKIP_REASON}")


def _skip_if_not_runnable():
    if SKIP_REASON:
        print(f"[  SKIPPED ] {SKIP_REASON}", file=sys.stderr)
        pytest.skip(SKIP_REASON)


def _teardown(e):
    try:
        residue = e.shutdown_and_check()
    finally:
        log = e.log_tail(80)
        e.cleanup()
    assert not residue, f"dsec-edge left residue: {residue}\nedge log:\n{log}"


@pytest.fixture(scope="session")
def edge():
    _skip_if_not_runnable()
    e = Edge.start()
    yield e
    _teardown(e)


@pytest.fixture
def make_edge():
    _skip_if_not_runnable()
    made = []

    def make(extra_args=(), config=None):
        e = Edge.start(extra_args=extra_args, config=config)
        made.append(e)
        return e

    yield make
    errors = []
    for e in made:
        try:
            _teardown(e)
        except AssertionError as err:
            errors.append(str(err))
    assert not errors, "\n".join(errors)


@pytest.fixture
def client(edge):
    c = edge.client()
    yield c
    c.close()


@pytest.fixture
def sandbox(client):
    sb = client.create({"labels": {"suite": "it"}})
    yield sb["id"]
    client.remove(sb["id"])
