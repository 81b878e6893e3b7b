"""The adversarial suite (issue 6): every case is a real attempt made from inside a sandbox (or
against the edge's API) on a live dsec-edge. The edge fixtures are the integration suite's
(tests/integration/edge_fixtures.py).

Results: with DSEC_SECURITY_RESULTS=path, every case's outcome, its first docstring line and
the figures it recorded (`figure(name, value)`) are written there as JSON when the session ends;
scripts/security-report turns that into tests/security/REPORT.md.
"""

import json
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parents[1] / "sdk" / "python"))

import edge_fixtures  # noqa: E402
from edge_fixtures import client, edge, make_edge, sandbox  # noqa: E402,F401

_RESULTS = {}


def pytest_report_header(config):
    return edge_fixtures.report_header()


def pytest_terminal_summary(terminalreporter):
    edge_fixtures.terminal_summary(terminalreporter)


@pytest.fixture
def figure(request):
    """figure(name, value): a measured figure of this case, shown in REPORT.md."""

    def record(name, value):
        request.node.user_properties.append((name, value))

    return record


def _doc(item):
    fn = getattr(item, "function", None)
    doc = (fn.__doc__ or "").strip() if fn else ""
    return " ".join(doc.split("\n\n")[0].split())


def pytest_runtest_logreport(report):
    entry = _RESULTS.setdefault(report.nodeid, {"outcome": "not run", "detail": ""})
    if entry["outcome"] == "not run":
        entry["outcome"] = "passed"
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
        entry["detail"] = str(report.longrepr).strip().splitlines()[-1][:300]
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        longrepr = report.longrepr
        entry["detail"] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if report.when == "call":
        entry["duration_s"] = round(report.duration, 2)
    entry["figures"] = [[k, v] for k, v in report.user_properties]


def pytest_collection_modifyitems(items):
    for item in items:
        _RESULTS.setdefault(item.nodeid, {"outcome": "not run", "detail": ""})["doc"] = _doc(item)


def pytest_sessionfinish(session):
    path = os.environ.get("DSEC_SECURITY_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(_RESULTS, f, indent=1, sort_keys=True)
