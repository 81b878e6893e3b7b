"""Fixtures for the libdsec SDK unit tests.

These tests run the SDK's real code against a FAKE edge (tests/fakeedge.py,
an in-process http.server), not against dsec-edge. Every fixture cleans up
after itself, and an autouse check fails a test that leaks a thread or a
file descriptor.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakeedge import Edge, FakeEdgeServer  # noqa: E402
from libdsec import DSecClient  # noqa: E402


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it leaves threads running or sockets open."""
    threads_before = set(threading.enumerate())
    fds_before = _fds()
    yield
    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        extra_threads = [t for t in threading.enumerate()
                         if t not in threads_before and t.is_alive()]
        extra_fds = [fd for fd in _fds() - fds_before
                     if os.path.exists(f"/proc/self/fd/{fd}")]
        if not extra_threads and not extra_fds:
            return
        if time.monotonic() > deadline:
            links = []
            for fd in extra_fds:
                try:
                    links.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass
            pytest.fail(f"leaked threads {extra_threads} / fds {links}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_dsec_env(monkeypatch):
    """The tests choose URL and token explicitly; the caller's env must not leak in."""
    monkeypatch.delenv("DSEC_URL", raising=False)
    monkeypatch.delenv("DSEC_TOKEN", raising=False)


@pytest.fixture
def tmpdir_clean():
    with tempfile.TemporaryDirectory(prefix="libdsec-test-") as d:
        yield Path(d)


@pytest.fixture
def server():
    srv = FakeEdgeServer(Edge())
    try:
        yield srv
    finally:
        srv.close()
    assert not srv.edge.server_errors, "the fake edge itself failed"
    assert not srv.edge.spec_errors, "off api/openapi.yaml:\n" + "\n".join(srv.edge.spec_errors)


@pytest.fixture
def edge(server) -> Edge:
    return server.edge


@pytest.fixture
def unix_server():
    # AF_UNIX paths are limited to ~108 bytes: keep it short, in /tmp.
    with tempfile.TemporaryDirectory(prefix="dsec-", dir="/tmp") as d:
        srv = FakeEdgeServer(Edge(), unix_path=os.path.join(d, "edge.sock"))
        try:
            yield srv
        finally:
            srv.close()
        assert not srv.edge.server_errors, "the fake edge itself failed"
    assert not srv.edge.spec_errors, "off api/openapi.yaml:\n" + "\n".join(srv.edge.spec_errors)


@pytest.fixture
def client(server):
    c = DSecClient(server.url, token=None, retries=3, backoff_base=0.01, timeout=10)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def sandbox(client, edge):
    return client.get_sandbox(edge.add_sandbox({"labels": {"job": "j1"}})["id"])
