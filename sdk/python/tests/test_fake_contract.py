"""The fake edge is held to api/openapi.yaml: these prove the check can fail."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from fakeedge import Edge, FakeEdgeServer, Handler


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, json.loads(r.read())


def test_a_reply_off_the_spec_is_recorded(monkeypatch):
    real_route = Handler.route

    def route(self, edge, s, obj):
        if s.path == "/v1/node":  # "node" must be a non-empty string, and much is missing
            return 200, b'{"node": 1}', "application/json", {}
        return real_route(self, edge, s, obj)

    monkeypatch.setattr(Handler, "route", route)
    srv = FakeEdgeServer(Edge())
    try:
        assert _get(srv.url + "/v1/node") == (200, {"node": 1})
        assert _get(srv.url + "/v1/health")[0] == 200
    finally:
        srv.close()
    assert len(srv.edge.spec_errors) == 1, srv.edge.spec_errors
    assert "GET /v1/node -> 200" in srv.edge.spec_errors[0]


def test_bad_input_refused_is_fine_but_bad_input_accepted_is_recorded(monkeypatch):
    srv = FakeEdgeServer(Edge())
    try:
        # Off the contract (unknown query parameter) and refused: the test's own doing.
        req = urllib.request.Request(srv.url + "/v1/images/builds/bld-nope", method="GET")
        try:
            urllib.request.urlopen(req, timeout=5).close()
            raise AssertionError("expected 4xx")
        except urllib.error.HTTPError as e:
            assert e.code in (400, 404)
            e.close()
        assert srv.edge.spec_errors == []
        # Off the contract and accepted: the fake is laxer than the edge.
        assert _get(srv.url + "/v1/health?verbose=1")[0] == 200
    finally:
        srv.close()
    assert len(srv.edge.spec_errors) == 1, srv.edge.spec_errors
    assert "accepted with 200" in srv.edge.spec_errors[0]
    assert "verbose" in srv.edge.spec_errors[0]
