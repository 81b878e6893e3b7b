"""Fixtures for the live dsec-edge tests: see edge_fixtures.py (shared with tests/security)."""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "sdk" / "python"))

import edge_fixtures  # noqa: E402
from edge_fixtures import client, edge, make_edge, sandbox  # noqa: E402,F401


def pytest_report_header(config):
    return edge_fixtures.report_header()


def pytest_terminal_summary(terminalreporter):
    edge_fixtures.terminal_summary(terminalreporter)
