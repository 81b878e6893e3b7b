"""Checks api/openapi.yaml and the openapi_check validator; needs no running daemon.

The operation list below is the edge's route table as written in the API notes: a route added to
the edge without the spec (or the other way round) fails test_operations_are_exactly_the_contract.
The accept/reject cases prove the validator is not vacuous: each broken body must fail at the
JSON pointer that is broken.
"""

import copy
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import openapi_check  # noqa: E402
from openapi_check import Spec, SpecError  # noqa: E402

SB = "/v1/sandboxes/sb-node1-abc"

# Every route the edge serves (api-ext).
EDGE_OPERATIONS = {
    ("POST", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/{id}"),
    ("PATCH", "/v1/sandboxes/{id}"),
    ("DELETE", "/v1/sandboxes/{id}"),
    ("GET", "/v1/sandboxes/{id}/stats"),
    ("GET", "/v1/sandboxes/{id}/ports/{port}"),  # and every method and path below it
    ("POST", "/v1/sandboxes/{id}/exec"),
    ("GET", "/v1/sandboxes/{id}/execs"),
    ("GET", "/v1/sandboxes/{id}/execs/{eid}"),
    ("DELETE", "/v1/sandboxes/{id}/execs/{eid}"),
    ("POST", "/v1/sandboxes/{id}/execs/{eid}/kill"),
    ("POST", "/v1/sandboxes/{id}/signal"),
    ("GET", "/v1/sandboxes/{id}/attach"),
    ("POST", "/v1/sandboxes/{id}/shells"),
    ("GET", "/v1/sandboxes/{id}/shells"),
    ("POST", "/v1/sandboxes/{id}/shells/{sid}/run"),
    ("DELETE", "/v1/sandboxes/{id}/shells/{sid}"),
    ("PUT", "/v1/sandboxes/{id}/files"),
    ("GET", "/v1/sandboxes/{id}/files"),
    ("DELETE", "/v1/sandboxes/{id}/files"),
    ("GET", "/v1/sandboxes/{id}/files/list"),
    ("GET", "/v1/sandboxes/{id}/files/stat"),
    ("POST", "/v1/sandboxes/{id}/files/mkdir"),
    ("PUT", "/v1/sandboxes/{id}/archive"),
    ("GET", "/v1/sandboxes/{id}/archive"),
    ("POST", "/v1/sandboxes/{id}/pause"),
    ("POST", "/v1/sandboxes/{id}/resume"),
    ("POST", "/v1/jobs/{job}/pause"),
    ("POST", "/v1/jobs/{job}/resume"),
    ("DELETE", "/v1/jobs/{job}"),
    ("GET", "/v1/health"),
    ("GET", "/v1/node"),
    ("GET", "/v1/images"),
    ("GET", "/v1/images/{name}"),
    ("DELETE", "/v1/images/{name}"),
    ("POST", "/v1/images/import"),
    ("POST", "/v1/images/build"),
    ("GET", "/v1/images/builds"),
    ("GET", "/v1/images/builds/{id}"),
    ("DELETE", "/v1/images/builds/{id}"),
    ("GET", "/v1/images/builds/{id}/log"),
    ("POST", "/v1/sandboxes/{id}/snapshot"),
    ("POST", "/v1/sandboxes/{id}/fork"),
    ("POST", "/v1/sandboxes/{id}/port-urls"), ("GET", "/v1/p/{token}"),
    ("GET", "/metrics"),
    ("POST", "/v1/fncalls"),
    ("GET", "/v1/pools"),
    ("GET", "/v1/pools/{name}"),
    ("PUT", "/v1/pools/{name}"),
    ("DELETE", "/v1/pools/{name}"),
    ("POST", "/v1/jobs/{job}/preempt"),
    ("GET", "/v1/trajectories"),
    ("GET", "/v1/trajectories/{tid}"),
    ("POST", "/v1/trajectories/{tid}/resume"),
    ("DELETE", "/v1/trajectories/{tid}"),
}
# Served by dsec-apiserver only (tests/cluster): marked `x-dsec-served-by: apiserver`.
APISERVER_OPERATIONS = {
    ("GET", "/v1/nodes"),
    ("GET", "/v1/nodes/{node}"),
    ("POST", "/v1/nodes/{node}/cordon"),
    ("POST", "/v1/nodes/{node}/uncordon"),
    ("POST", "/v1/nodes/{node}/drain"),
    ("GET", "/v1/projects"),
    ("POST", "/v1/projects"),
    ("GET", "/v1/projects/{project}"),
    ("DELETE", "/v1/projects/{project}"),
    ("GET", "/v1/projects/{project}/tokens"),
    ("POST", "/v1/projects/{project}/tokens"),
    ("DELETE", "/v1/projects/{project}/tokens/{name}"),
    ("GET", "/v1/quota"),
    ("PATCH", "/v1/quota"),
    ("GET", "/v1/projects/{project}/quota"),
    ("PATCH", "/v1/projects/{project}/quota"),
    ("PUT", "/v1/projects/{project}/quota"),
    ("GET", "/v1/projects/{project}/tokens/{name}/quota"),
    ("PATCH", "/v1/projects/{project}/tokens/{name}/quota"),
}
# In shared/API.md but not served yet: marked `x-dsec-status: planned`.
PLANNED_OPERATIONS = set()
NO_ERROR_RESPONSE_NEEDED = {("GET", "/v1/health"), ("GET", "/metrics")}

# ---- example bodies (api-ext.md and shared/API.md) ------------------------------------------

HOST_IMAGE = {"name": "host", "base": None, "layers": [],
              "config": {"env": [], "workdir": "", "user": "", "entrypoint": [], "cmd": []},
              "size": 0, "source": "builtin", "builtin": True, "created_at": 0, "in_use": None}
IMAGE = {"name": "proj:abc", "base": "host",
         "layers": [{"digest": "sha256:" + "ab" * 32, "size": 1024, "format": "erofs"}],
         "config": {"env": ["K=V"], "workdir": "/workspace", "user": "", "entrypoint": [],
                    "cmd": []},
         "size": 1024, "source": "snapshot", "created_at": 1764480000000, "in_use": 3}

RECORD = {
    "id": "sb-node1-abc", "kind": "container", "state": "running", "node": "node1",
    "image": "host", "created_at": 1764480000000, "expires_at": 1764483600000, "ttl_s": 3600,
    "idle_ttl_s": 0, "last_used_at": 1764480000000,
    "limits": {"cpu": 1.0, "memory_mb": 512, "pids": 256, "disk_mb": 256},
    "user": "sandbox", "workdir": "/workspace", "network": {"mode": "none"},
    "labels": {"job": "rollout-7"}, "project": "default", "reason": None,
}
CREATE = {
    "kind": "container", "image": "host", "cpu": 1.0, "memory_mb": 512, "pids": 256,
    "disk_mb": 1024, "ttl_s": 300, "idle_ttl_s": 0, "user": "sandbox", "workdir": "/workspace",
    "env": {"K": "V"}, "labels": {"job": "rollout-7"}, "network": {"mode": "none"},
    "pool": None, "request_id": "...",
}
PATCH = {"ttl_s": 600, "idle_ttl_s": 60, "labels": {"job": "rollout-8", "old": None},
         "network": {"mode": "none"}, "request_id": "patch-1"}
STATS = {"cpu_time_ms": 12.5, "memory_current": 1048576, "memory_peak": 2097152,
         "memory_limit": 805306368, "disk_used": 4096, "disk_limit": 268435456,
         "disk_kind": "tmpfs", "pids": 2,
         "oom_kills": 0, "exec_count": 3}
EXEC_REQUEST = {"cmd": ["python3", "-c", "print(1)"], "shell": None, "stdin": "", "env": {},
                "cwd": None, "user": None, "timeout_ms": 30000, "max_output_bytes": 1048576,
                "encoding": "utf-8"}
EXEC_RESULT = {"exit_code": 0, "signal": None, "stdout": "1\n", "stderr": "",
               "stdout_truncated": False, "stderr_truncated": False, "timed_out": False,
               "oom_killed": False, "duration_ms": 3.1, "stdout_bytes": 2, "stderr_bytes": 0,
               "encoding": "utf-8"}
EXEC_EXIT = {k: v for k, v in EXEC_RESULT.items() if k not in ("stdout", "stderr")}
ENTRY = {"name": "a.py", "type": "file", "size": 8, "mode": 420, "mtime": 1764480000000}
DIGEST = "sha256:" + "cd" * 32
TRAJ_ENTRY = {"seq": 1, "method": "POST", "target": "/exec", "fingerprint": "ef" * 32,
              "mutating": True, "status": 200, "kept": True, "streamed": False,
              "exec_id": None, "request_digest": DIGEST, "response_digest": DIGEST,
              "created_ms": 1764480000000}
TRAJECTORY = {
    "id": "t-1", "project": "default", "state": "recording", "sandbox": "sb-node1-abc",
    "head": 1, "branch": 1, "checkpoint_every": 20, "created_ms": 1764480000000,
    "updated_ms": 1764480000000, "expires_ms": 1765084800000, "store": "node",
    "made_as": {"kind": "container", "image": "host", "memory_mb": 512, "cpu": 1.0},
    "branches": [{"branch": 0, "parent": None, "fork_seq": None, "entries": 40, "last_seq": 40,
                  "created_ms": 1764480000000},
                 {"branch": 1, "parent": 0, "fork_seq": 18, "entries": 18, "last_seq": 18,
                  "created_ms": 1764480000000}],
    "entries": [TRAJ_ENTRY,
                dict(TRAJ_ENTRY, seq=2, method="PUT", target="/files?path=/a", status=204,
                     response_digest=None),
                dict(TRAJ_ENTRY, seq=3, status=202, exec_id="ex-t0123456789abcdef")],
    "checkpoints": [{"seq": 10, "image": "host," + DIGEST, "jobs": [3], "created_ms": 1}],
}
TRAJ_SUMMARY = {"id": "t-1", "state": "preempted", "sandbox": None, "head": 0, "branches": 1,
                "updated_ms": 1764480000000, "expires_ms": 1765084800000}
PREEMPTED = {"affected": 2,
             "checkpointed": [{"sandbox": "sb-node1-abc", "trajectory": "t-1", "branch": 0,
                               "seq": 25}],
             "snapshots": [{"sandbox": "sb-node1-def", "image": "preempted-sb-node1-def:latest"}],
             "failed": []}
NODE = {"node": "node1", "version": "0.1.0", "instance": "i-1", "backends": ["container"],
        "pools": [], "capacity": {"max_sandboxes": 4096, "memory_mb": 65536, "overcommit": 8,
                                  "admit_memory_mb": 524288},
        "usage": {"sandboxes": 1, "memory_mb": 512, "by_state": {"running": 1}},
        "features": {"cgroup_kill": True}}


def error(code, message="x"):
    return {"error": {"code": code, "message": message}}


def changed(body, pointer, value=..., delete=False):
    """A deep copy of body with the field at a JSON pointer replaced (or deleted)."""
    body = copy.deepcopy(body)
    *parents, last = pointer.strip("/").split("/")
    node = body
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        last = int(last)
    if delete:
        del node[last]
    else:
        node[last] = value
    return body


@pytest.fixture(scope="module")
def spec():
    return Spec.load()


def walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + (i,))


def all_schemas(spec):
    """Every schema object in the document, with where it is."""
    roots = [(("components", "schemas", n), s)
             for n, s in spec.doc["components"]["schemas"].items()]
    for path, node in walk(spec.doc):
        if isinstance(node, dict) and "schema" in node and path[:2] != ("components", "schemas"):
            roots.append((path + ("schema",), node["schema"]))
    out = []

    def visit(where, s):
        if not isinstance(s, dict) or "$ref" in s:
            return
        out.append((where, s))
        for k in ("items", "not", "additionalProperties"):
            if isinstance(s.get(k), dict):
                visit(where + (k,), s[k])
        for name, sub in (s.get("properties") or {}).items():
            visit(where + ("properties", name), sub)
        for k in ("allOf", "anyOf", "oneOf"):
            for i, sub in enumerate(s.get(k, [])):
                visit(where + (k, i), sub)

    for where, s in roots:
        visit(where, s)
    return out


# ---- the document ---------------------------------------------------------------------------

def test_loads_and_is_openapi_30(spec):
    assert re.fullmatch(r"3\.0\.\d+", spec.doc["openapi"])
    assert spec.doc["info"]["title"] and spec.doc["info"]["version"]
    assert spec.paths


def test_every_ref_resolves(spec):
    refs = [n["$ref"] for _, n in walk(spec.doc) if isinstance(n, dict) and "$ref" in n]
    assert len(refs) > 100
    for ref in refs:
        assert spec.resolve(ref) is not None, ref


def test_operations_are_exactly_the_contract(spec):
    present = {(m, t) for m, t, _ in spec.operations()}
    assert EDGE_OPERATIONS - present == set(), "served by the edge but missing from the spec"
    assert PLANNED_OPERATIONS - present == set(), "in API.md but missing from the spec"
    assert APISERVER_OPERATIONS - present == set(), "served by the apiserver but not in the spec"
    assert present - EDGE_OPERATIONS - PLANNED_OPERATIONS - APISERVER_OPERATIONS == set(), \
        "add new routes to this test"


def test_apiserver_operations_are_marked(spec):
    for method, template, op in spec.operations():
        served = op.get("x-dsec-served-by") == "apiserver"
        assert served == ((method, template) in APISERVER_OPERATIONS), (method, template)


def test_planned_operations_are_marked_and_served_ones_are_not(spec):
    for method, template, op in spec.operations():
        planned = op.get("x-dsec-status") == "planned"
        assert planned == ((method, template) in PLANNED_OPERATIONS), (method, template)


def test_operations_have_ids_and_summaries(spec):
    ids = [op["operationId"] for _, _, op in spec.operations()]
    assert len(ids) == len(set(ids))
    for method, template, op in spec.operations():
        assert op.get("summary"), (method, template)


def test_path_parameters_are_declared(spec):
    for method, template, op in spec.operations():
        names = set(re.findall(r"\{([^}]+)\}", template))
        declared = spec.parameters(template, op, "path")
        assert set(declared) == names, (method, template)
        assert all(p.get("required") is True for p in declared.values()), (method, template)


def test_security(spec):
    assert spec.doc["security"] == [{"bearer": []}]
    assert spec.doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": spec.doc["components"]["securitySchemes"]["bearer"]["description"]}
    for method, template, op in spec.operations():
        if (method, template) in (("GET", "/v1/health"), ("GET", "/v1/p/{token}")):
            assert op["security"] == []
        else:
            assert "security" not in op, (method, template)


def error_schema_of(spec, response):
    response = spec.deref(response)
    return (response.get("content") or {}).get("application/json", {}).get("schema")


def test_every_operation_has_error_responses(spec):
    error_ref = {"$ref": "#/components/schemas/Error"}
    for method, template, op in spec.operations():
        responses = op["responses"]
        for status, response in responses.items():
            if status == "default" or int(status) >= 400:
                assert error_schema_of(spec, response) == error_ref, (method, template, status)
        four_xx = [s for s in responses if s != "default" and 400 <= int(s) < 500]
        if (method, template) not in NO_ERROR_RESPONSE_NEEDED:
            assert four_xx, f"{method} {template} has no 4xx response"
        assert "default" in responses and "503" in responses, (method, template)


def test_error_codes_map_to_statuses(spec):
    code = spec.doc["components"]["schemas"]["ErrorCode"]
    assert set(code["enum"]) == set(code["x-dsec-http-status"])
    assert code["x-dsec-http-status"]["over_capacity"] == 429
    for name in ("OverCapacity", "Unavailable"):
        headers = spec.doc["components"]["responses"][name]["headers"]
        assert spec.deref(headers["Retry-After"])["required"] is True


def test_json_request_bodies_reject_unknown_fields(spec):
    for method, template, op in spec.operations():
        body = spec.deref(op.get("requestBody"))
        if body and "application/json" in body["content"]:
            schema = spec.deref(body["content"]["application/json"]["schema"])
            assert schema.get("additionalProperties") is False, (method, template)


def test_schemas_use_only_supported_keywords(spec):
    allowed = openapi_check.KEYWORDS | openapi_check.ANNOTATIONS
    schemas = all_schemas(spec)
    assert len(schemas) > 100
    for where, s in schemas:
        unknown = {k for k in s if k not in allowed and not k.startswith("x-")}
        assert not unknown, (where, unknown)
        if "pattern" in s:
            re.compile(s["pattern"])
        if "nullable" in s:  # OpenAPI 3.0.3: nullable only counts beside a type
            assert "type" in s, where


def test_examples_in_the_spec_validate(spec):
    examples = [(w, s) for w, s in all_schemas(spec) if "example" in s]
    assert len(examples) >= 3
    for where, s in examples:
        spec.validate(s, s["example"], "/".join(map(str, where)))


# ---- routing --------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,template", [
    ("GET", SB + "/files/list?path=/workspace", "/v1/sandboxes/{id}/files/list"),
    ("GET", SB + "/files/stat", "/v1/sandboxes/{id}/files/stat"),
    ("GET", SB + "/files?path=/a", "/v1/sandboxes/{id}/files"),
    ("POST", SB + "/files/mkdir", "/v1/sandboxes/{id}/files/mkdir"),
    ("GET", SB + "/execs/ex-1?wait_ms=5", "/v1/sandboxes/{id}/execs/{eid}"),
    ("GET", SB, "/v1/sandboxes/{id}"),
    ("GET", "/v1/sandboxes?limit=3", "/v1/sandboxes"),
    ("POST", "/v1/images/import?name=a:b", "/v1/images/import"),
    ("DELETE", "/v1/images/py:3.11", "/v1/images/{name}"),
    ("DELETE", "/v1/jobs/rollout-7", "/v1/jobs/{job}"),
    ("POST", "/v1/jobs/rollout-7/pause", "/v1/jobs/{job}/pause"),
    ("POST", "/v1/jobs/rollout-7/preempt", "/v1/jobs/{job}/preempt"),
    ("GET", "/v1/trajectories/t-1?branch=0", "/v1/trajectories/{tid}"),
    ("POST", "/v1/trajectories/t-1/resume", "/v1/trajectories/{tid}/resume"),
    ("get", "/metrics", "/metrics"),
])
def test_match(spec, method, path, template):
    found = spec.match(method, path)
    assert found is not None and found[0] == template
    assert found[1] is spec.paths[template][method.lower()]


def test_match_prefers_literal_segments():
    op = {"responses": {}}
    spec = Spec({"paths": {"/a/{x}/{y}": {"get": op}, "/a/{x}/c": {"get": op},
                           "/a/b/{y}": {"get": op}}})
    assert spec.match("GET", "/a/b/c")[0] == "/a/b/{y}"  # the earlier literal wins
    assert spec.match("GET", "/a/z/c")[0] == "/a/{x}/c"
    assert spec.match("GET", "/a/z/d")[0] == "/a/{x}/{y}"
    assert spec.match("POST", "/a/b/c") is None


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/nope"), ("POST", SB + "/files/list"), ("GET", SB + "/"),
    ("PUT", "/v1/sandboxes"), ("GET", "/v1/sandboxes//stats"), ("GET", "/"),
])
def test_match_misses(spec, method, path):
    assert spec.match(method, path) is None


# ---- valid traffic --------------------------------------------------------------------------

VALID_RESPONSES = [
    ("POST", "/v1/sandboxes", 201, RECORD),
    ("POST", "/v1/sandboxes?wait=0", 201, changed(RECORD, "/state", "creating")),
    ("POST", "/v1/sandboxes", 201, {"sandboxes": [RECORD, RECORD]}),
    ("GET", SB, 200, changed(RECORD, "/reason", "agent exited")),
    ("GET", SB, 200, changed(RECORD, "/limits/cpu", 2)),
    ("GET", "/v1/sandboxes?label=job=rollout-7", 200, {"sandboxes": [RECORD], "next_cursor": None}),
    ("GET", "/v1/sandboxes", 200, {"sandboxes": [], "next_cursor": "c2"}),
    ("PATCH", SB, 200, RECORD),
    ("DELETE", SB, 204, None),
    ("GET", SB + "/stats", 200, STATS),
    ("POST", SB + "/exec", 200, EXEC_RESULT),
    ("POST", SB + "/exec", 200, changed(EXEC_RESULT, "/signal", 9)),
    ("POST", SB + "/exec", 202, {"exec_id": "ex-abc"}),
    ("GET", SB + "/execs", 200, {"execs": [
        {"exec_id": "ex-1", "state": "running", "started_at": 1764480000000, "result": None},
        {"exec_id": "ex-2", "state": "exited", "started_at": 1764480000000,
         "result": EXEC_EXIT}]}),
    ("GET", SB + "/execs/ex-1?wait_ms=1000", 200,
     {"exec_id": "ex-1", "state": "exited", "started_at": 1764480000000, "result": EXEC_RESULT}),
    ("GET", SB + "/execs/ex-1?stdout_offset=4&stderr_offset=0&max_bytes=100", 200,
     {"exec_id": "ex-1", "state": "running", "started_at": 1764480000000, "result": None,
      "stdout": "two\n", "stderr": "", "stdout_offset": 8, "stderr_offset": 0,
      "encoding": "utf-8"}),
    ("GET", SB + "/execs/ex-1?stdout_offset=0", 200,
     {"exec_id": "ex-1", "state": "exited", "started_at": 1764480000000, "result": EXEC_EXIT,
      "stdout": "1\n", "stderr": "", "stdout_offset": 2, "stderr_offset": 0,
      "encoding": "utf-8"}),
    ("POST", SB + "/execs/ex-1/kill", 200,
     {"exec_id": "ex-1", "state": "exited", "started_at": 1764480000000,
      "result": changed(EXEC_RESULT, "/signal", 9)}),
    ("DELETE", SB + "/execs/ex-1", 204, None),
    ("POST", SB + "/signal", 200, {"signaled": 3}),
    ("POST", SB + "/shells", 201, {"shell_id": "sh-1"}),
    ("GET", SB + "/shells", 200, {"shells": ["sh-1", "sh-2"]}),
    ("POST", SB + "/shells/sh-1/run", 200, EXEC_RESULT),
    ("DELETE", SB + "/shells/sh-1", 204, None),
    ("PUT", SB + "/files?path=/workspace/a.py&mode=0644", 204, None),
    ("GET", SB + "/files/list?path=/workspace", 200,
     {"entries": [ENTRY, changed(ENTRY, "/type", "dir")]}),
    ("GET", SB + "/files/stat?path=/workspace/a.py", 200, ENTRY),
    ("DELETE", SB + "/files?path=/workspace&recursive=1", 204, None),
    ("POST", SB + "/files/mkdir?path=/w/x&mode=0755", 204, None),
    ("PUT", SB + "/archive?path=/workspace", 204, None),
    ("POST", SB + "/pause", 200, changed(RECORD, "/state", "paused")),
    ("POST", SB + "/resume", 200, RECORD),
    ("POST", "/v1/jobs/rollout-7/pause", 200, {"affected": 2}),
    ("POST", "/v1/jobs/rollout-7/resume", 200, {"affected": 0}),
    ("DELETE", "/v1/jobs/rollout-7", 200, {"affected": 5}),
    ("POST", "/v1/jobs/rollout-7/preempt", 200, PREEMPTED),
    ("POST", "/v1/jobs/rollout-7/preempt", 200,
     {"affected": 0, "checkpointed": [], "snapshots": [], "failed": [
         {"sandbox": "sb-node1-abc", "error": "checkpoint: no snapshot"}]}),
    ("POST", "/v1/jobs/rollout-7/preempt", 409, error("conflict")),
    ("GET", "/v1/trajectories", 200, {"trajectories": [TRAJ_SUMMARY]}),
    ("GET", "/v1/trajectories/t-1", 200, TRAJECTORY),
    ("GET", "/v1/trajectories/t-1?branch=0&from=5&limit=10", 200,
     changed(TRAJECTORY, "/entries", [])),
    ("GET", "/v1/trajectories/t-1", 404, error("not_found")),
    ("POST", "/v1/trajectories/t-1/resume", 201, changed(RECORD, "/state", "creating")),
    ("POST", "/v1/trajectories/t-1/resume", 409, error("conflict")),
    ("DELETE", "/v1/trajectories/t-1", 204, None),
    ("POST", "/v1/sandboxes", 201, changed(RECORD, "/state", "creating")),
    ("GET", SB, 410, changed(error("gone"), "/error/reason", "preempted")),
    ("GET", "/v1/health", 200, {"ok": True}),
    ("GET", "/v1/node", 200, NODE),
    ("GET", "/v1/images", 200, {"images": [HOST_IMAGE, IMAGE]}),
    ("GET", "/v1/images/proj:abc", 200, IMAGE),
    ("DELETE", "/v1/images/proj:abc", 204, None),
    ("POST", "/v1/images/import?name=proj:abc", 201, IMAGE),
    ("POST", SB + "/snapshot", 201, IMAGE),
    ("POST", SB + "/fork", 201, {"sandboxes": [RECORD, RECORD]}),
    ("DELETE", "/v1/images/host", 409, error("conflict")),
    ("GET", SB, 404, error("not_found", "sandbox sb-node1-abc not found")),
    ("GET", "/v1/node", 401, error("unauthorized")),
    ("POST", "/v1/sandboxes", 422, error("unprocessable")),
    ("POST", "/v1/sandboxes", 503, error("unavailable")),
    ("GET", SB + "/files?path=/big", 413, error("too_large")),
    ("GET", "/v1/health", 500, error("internal")),
]


@pytest.mark.parametrize("method,path,status,body", VALID_RESPONSES)
def test_valid_responses_pass(spec, method, path, status, body):
    spec.validate_response(method, path, status, body)


def test_raw_and_stream_responses_pass(spec):
    spec.validate_response("GET", SB + "/files?path=/a", 200, b"\x00\xff",
                           content_type="application/octet-stream")
    spec.validate_response("GET", SB + "/archive?path=/w", 200, b"tar",
                           content_type="application/x-tar")
    spec.validate_response("GET", "/metrics", 200, "dsec_sandboxes_created_total 3\n",
                           content_type="text/plain; version=0.0.4")
    lines = [{"stdout": "1\n"}, {"stderr": "d2Fybg=="}, {"exit": EXEC_EXIT}]
    spec.validate_response("POST", SB + "/exec?stream=1", 200, lines,
                           content_type="application/x-ndjson")
    text = '{"stdout": "a"}\n{"error": {"code": "internal", "message": "agent lost"}}\n'
    spec.validate_response("POST", SB + "/exec?stream=1", 200, text.encode(),
                           content_type="application/x-ndjson")
    spec.validate_response("GET", SB + "/attach?cmd=bash", 101, None)
    spec.validate_response("POST", "/v1/sandboxes", 429, error("over_capacity"),
                           headers={"retry-after": "2"})
    # A cluster's quota: only a rate's refusal says when to come back.
    spec.validate_response("POST", "/v1/sandboxes", 429, error("quota_exceeded"),
                           headers={"Dsec-Quota-Exceeded": "sandboxes"})
    spec.validate_response("POST", "/v1/sandboxes", 429, error("quota_exceeded"),
                           headers={"Dsec-Quota-Exceeded": "creates_per_s", "Retry-After": "1"})
    # Answered from a trajectory's log.
    replayed = {"Dsec-Trajectory-Replayed": "1", "Dsec-Trajectory-Seq": "7"}
    spec.validate_response("POST", SB + "/exec", 200, EXEC_RESULT, headers=replayed)
    spec.validate_response("PUT", SB + "/files?path=/a", 204, None, headers=replayed)
    spec.validate_response("GET", SB + "/archive?path=/w", 200, b"tar",
                           content_type="application/x-tar", headers=replayed)
    spec.validate_response("GET", "/v1/health", 503, error("unavailable"),
                           headers={"Retry-After": "1"})


VALID_REQUESTS = [
    ("POST", "/v1/sandboxes", CREATE),
    ("POST", "/v1/sandboxes?wait=0", {}),
    ("POST", "/v1/sandboxes", None),
    ("POST", "/v1/sandboxes", {"count": 4, "labels": {"job": "j"}, "user": "1000:1000",
                               "cpu": 64, "kind": "microvm",
                               "network": {"mode": "allowlist", "rules": [
                                   {"cidr": "10.0.0.0/8", "ports": "443", "proto": "tcp"}]}}),
    ("GET", "/v1/sandboxes?label=job=rollout-7&label=k=v&state=running&kind=container"
            "&limit=100&cursor=abc", None),
    ("PATCH", SB, PATCH),
    ("POST", SB + "/exec", EXEC_REQUEST),
    ("POST", SB + "/exec?stream=1", {"shell": "echo hi", "cmd": None, "encoding": "base64",
                                     "stdin": "aGk=", "stdin_encoding": "base64",
                                     "cwd": "/tmp", "user": "root", "timeout_ms": 0,
                                     "max_output_bytes": 0, "background": True,
                                     "request_id": "r-1"}),
    ("GET", SB + "/execs/ex-1?wait_ms=600000", None),
    ("GET", SB + "/execs/ex-1?stdout_offset=0&stderr_offset=9&max_bytes=67108864&wait_ms=5",
     None),
    ("POST", SB + "/execs/ex-1/kill", None),
    ("POST", SB + "/signal", {"signal": "KILL"}),
    ("POST", SB + "/signal", {"signal": "SIGTERM", "request_id": "s"}),
    ("POST", SB + "/signal", {"signal": 9}),
    ("GET", SB + "/attach?cmd=bash&cmd=-l&tty=1&cols=80&rows=24&user=&cwd=&env=K=V", None),
    ("POST", SB + "/shells", {"user": None, "request_id": "sh"}),
    ("POST", SB + "/shells/sh-1/run", {"command": "cd /repo && pytest -q", "timeout_ms": 60000,
                                       "max_output_bytes": 1048576, "encoding": "utf-8",
                                       "request_id": "run-1"}),
    ("PUT", SB + "/files?path=/workspace/a.py&mode=0644", b"print(2)"),
    ("GET", SB + "/files?path=/workspace/a.py&max_bytes=10", None),
    ("DELETE", SB + "/files?path=/workspace&recursive=1", None),
    ("PUT", SB + "/archive?path=/workspace", b"tar bytes"),
    ("POST", "/v1/fncalls", {"runtime": "python", "code": "print(sum(range(10)))", "stdin": "",
                             "files": {"in.txt": "..."}, "timeout_ms": 5000, "memory_mb": 256,
                             "max_output_bytes": 65536}),
    ("PUT", "/v1/pools/py", {"kind": "fncall", "runtime": "python", "min_idle": 8, "max": 256}),
    ("PUT", "/v1/pools/web", {"kind": "container", "image": "host"}),
    ("POST", "/v1/images/build", {"name": "py:3.11", "base": "debian:bookworm",
                                  "packages": ["python3", "git"]}),
    ("POST", SB + "/snapshot", {"image": "name:tag"}),
    ("POST", SB + "/fork", {"count": 4}),
    ("POST", "/v1/sandboxes", {"trajectory": {"id": "t-1", "checkpoint_every": 10},
                               "labels": {"job": "j"}}),
    ("POST", "/v1/sandboxes", {"trajectory": {"id": "t-1", "resume": True, "branch": 0}}),
    ("POST", "/v1/sandboxes", {"trajectory": None}),
    ("POST", "/v1/jobs/j/preempt", None),
    ("POST", "/v1/jobs/j/preempt", {"others": "snapshot", "request_id": "p-1"}),
    ("GET", "/v1/trajectories", None),
    ("GET", "/v1/trajectories/t-1?branch=1&from=18&limit=10000", None),
    ("POST", "/v1/trajectories/t-1/resume", None),
    ("POST", "/v1/trajectories/t-1/resume", {"branch": 0, "ttl_s": 600, "idle_ttl_s": 60,
                                            "labels": {"job": "j"}, "request_id": "r"}),
    ("DELETE", "/v1/trajectories/t-1", None),
]


@pytest.mark.parametrize("method,path,body", VALID_REQUESTS)
def test_valid_requests_pass(spec, method, path, body):
    spec.validate_request(method, path, body)


def test_attach_frames_and_headers(spec):
    for frame in ({"resize": [80, 24]}, {"signal": "INT"}, {"eof": True}):
        spec.validate("AttachClientMessage", frame)
    for frame in ({"stderr": "aGk="}, {"exit": EXEC_EXIT}):
        spec.validate("AttachServerMessage", frame)
    spec.validate_request("GET", SB + "/attach?cmd=sh", None,
                          headers={"Connection": "keep-alive, Upgrade", "Upgrade": "websocket"})


# ---- broken traffic: each must fail at the broken pointer -----------------------------------

INVALID_RESPONSES = [
    # (why, method, path, status, body, pointer)
    ("missing required", "GET", SB, 200, changed(RECORD, "/state", delete=True), "/state"),
    ("missing nested", "GET", SB, 200, changed(RECORD, "/limits/pids", delete=True),
     "/limits/pids"),
    ("wrong type", "GET", SB, 200, changed(RECORD, "/limits/memory_mb", "512"),
     "/limits/memory_mb"),
    ("float for integer", "GET", SB, 200, changed(RECORD, "/created_at", 1.5e12), "/created_at"),
    ("bool for integer", "POST", SB + "/exec", 200, changed(EXEC_RESULT, "/exit_code", True),
     "/exit_code"),
    ("bool for number", "GET", SB + "/stats", 200, changed(STATS, "/cpu_time_ms", False),
     "/cpu_time_ms"),
    ("unknown field", "GET", SB, 200, changed(RECORD, "/extra", 1), "/extra"),
    ("unknown nested field", "POST", SB + "/exec", 200, changed(EXEC_RESULT, "/pid", 4), "/pid"),
    ("bad state", "GET", SB, 200, changed(RECORD, "/state", "stopped"), "/state"),
    ("bad kind", "GET", SB, 200, changed(RECORD, "/kind", "vm"), "/kind"),
    ("bad file type", "GET", SB + "/files/list?path=/", 200,
     {"entries": [changed(ENTRY, "/type", "directory")]}, "/entries/0/type"),
    ("null not nullable", "GET", SB, 200, changed(RECORD, "/image", None), "/image"),
    ("null list", "GET", "/v1/sandboxes", 200, {"sandboxes": None, "next_cursor": None},
     "/sandboxes"),
    ("negative", "GET", SB + "/stats", 200, changed(STATS, "/oom_kills", -1), "/oom_kills"),
    ("signal range", "POST", SB + "/exec", 200, changed(EXEC_RESULT, "/signal", 0), "/signal"),
    ("bad exec id", "POST", SB + "/exec", 202, {"exec_id": "sb-1"}, "/exec_id"),
    ("result required", "POST", SB + "/execs/ex-1/kill", 200,
     {"exec_id": "ex-1", "state": "running", "started_at": 1}, "/result"),
    ("status or output", "GET", SB + "/execs/ex-1", 200,
     {"exec_id": "ex-1", "state": "running", "started_at": 1}, ""),
    ("nested result", "GET", SB + "/execs", 200, {"execs": [
        {"exec_id": "ex-1", "state": "exited", "started_at": 1,
         "result": changed(EXEC_EXIT, "/timed_out", "no")}]}, "/execs/0/result/timed_out"),
    ("list without output", "GET", SB + "/execs", 200, {"execs": [
        {"exec_id": "ex-1", "state": "exited", "started_at": 1, "result": EXEC_RESULT}]},
     "/execs/0/result/stdout"),
    ("live offsets", "GET", SB + "/execs/ex-1?stdout_offset=0", 200,
     {"exec_id": "ex-1", "state": "running", "started_at": 1, "result": None, "stdout": "",
      "stderr": "", "stdout_offset": -1, "stderr_offset": 0, "encoding": "utf-8"}, ""),
    ("mode range", "GET", SB + "/files/stat?path=/a", 200, changed(ENTRY, "/mode", 4096),
     "/mode"),
    ("open features only", "GET", "/v1/node", 200, changed(NODE, "/capacity/extra", 1),
     "/capacity/extra"),
    ("code/status mismatch", "GET", SB, 404, error("conflict"), "/error/code"),
    ("unknown code", "GET", SB, 404, error("gone"), "/error/code"),
    ("error extra field", "GET", SB, 404, changed(error("not_found"), "/error/hint", "x"),
     "/error/hint"),
    ("error message type", "GET", SB, 400, changed(error("bad_request"), "/error/message", 1),
     "/error/message"),
    ("body on 204", "DELETE", SB, 204, {"ok": True}, ""),
    ("undeclared 2xx", "GET", SB, 202, RECORD, ""),
    ("ok missing", "GET", "/v1/health", 200, {}, "/ok"),
    ("deep in oneOf", "POST", "/v1/sandboxes", 201, changed(RECORD, "/limits/cpu", "1"),
     "/limits/cpu"),
    ("deep in batch", "POST", "/v1/sandboxes", 201,
     {"sandboxes": [RECORD, changed(RECORD, "/ttl_s", -1)]}, "/sandboxes/1/ttl_s"),
    ("record or batch", "POST", "/v1/sandboxes", 201, {}, ""),
    ("gone reason", "GET", SB, 410, changed(error("gone"), "/error/reason", "evicted"),
     "/error/reason"),
    ("preempt lists required", "POST", "/v1/jobs/j/preempt", 200, {"affected": 1},
     "/checkpointed"),
    ("preempt item field", "POST", "/v1/jobs/j/preempt", 200,
     changed(PREEMPTED, "/checkpointed/0/seq", "25"), "/checkpointed/0/seq"),
    ("snapshot image name", "POST", "/v1/jobs/j/preempt", 200,
     changed(PREEMPTED, "/snapshots/0/image", "a b"), "/snapshots/0/image"),
    ("trajectory state", "GET", "/v1/trajectories", 200,
     {"trajectories": [changed(TRAJ_SUMMARY, "/state", "running")]}, "/trajectories/0/state"),
    ("trajectory sandbox", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/sandbox", ""), "/sandbox"),
    ("entry digest", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/entries/0/request_digest", "ab" * 32), "/entries/0/request_digest"),
    ("entry seq", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/entries/1/seq", 0), "/entries/1/seq"),
    ("entry exec id", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/entries/2/exec_id", "sb-1"), "/entries/2/exec_id"),
    ("branch parent", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/branches/1/parent", -1), "/branches/1/parent"),
    ("checkpoint jobs", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/checkpoints/0/jobs/0", "3"), "/checkpoints/0/jobs/0"),
    ("trajectory extra", "GET", "/v1/trajectories/t-1", 200,
     changed(TRAJECTORY, "/params", {}), "/params"),
    ("resume is one record", "POST", "/v1/trajectories/t-1/resume", 201,
     {"sandboxes": [RECORD]}, "/id"),
]


@pytest.mark.parametrize("why,method,path,status,body,pointer", INVALID_RESPONSES,
                         ids=[c[0] for c in INVALID_RESPONSES])
def test_invalid_responses_fail(spec, why, method, path, status, body, pointer):
    with pytest.raises(SpecError) as e:
        spec.validate_response(method, path, status, body)
    assert e.value.pointer == pointer, str(e.value)
    assert f"at {pointer or '/'}:" in str(e.value)


def test_invalid_raw_and_stream_responses_fail(spec):
    def fails(pointer, *args, **kwargs):
        with pytest.raises(SpecError) as e:
            spec.validate_response(*args, **kwargs)
        assert e.value.pointer == pointer, str(e.value)

    fails("", "GET", SB + "/files?path=/a", 200, b"x", content_type="text/html")
    fails("", "GET", SB + "/files?path=/a", 200, {"not": "raw"},
          content_type="application/octet-stream")
    with_out = dict(EXEC_EXIT, stdout="1\n")
    fails("/exit/stdout", "POST", SB + "/exec?stream=1", 200, [{"stdout": "a"}, {"exit": with_out}],
          content_type="application/x-ndjson")
    fails("", "POST", SB + "/exec?stream=1", 200, [{"stdout": 1}],
          content_type="application/x-ndjson")
    fails("", "POST", SB + "/exec?stream=1", 200, "not json\n",
          content_type="application/x-ndjson")
    fails("header Retry-After", "POST", SB + "/exec", 429, error("over_capacity"),
          headers={"Content-Type": "application/json"})
    fails("header Dsec-Quota-Exceeded", "POST", "/v1/sandboxes", 429, error("quota_exceeded"),
          headers={"Dsec-Quota-Exceeded": "disk_mb"})
    fails("header Dsec-Trajectory-Replayed", "POST", SB + "/exec", 200, EXEC_RESULT,
          headers={"Dsec-Trajectory-Replayed": "yes"})
    fails("header Dsec-Trajectory-Seq", "GET", SB + "/files?path=/a", 200, b"x",
          content_type="application/octet-stream", headers={"Dsec-Trajectory-Seq": "0"})
    fails("header Retry-After", "POST", "/v1/sandboxes", 429, error("over_capacity"),
          headers={"Retry-After": "soon"})
    fails("header Retry-After", "GET", "/v1/health", 503, error("unavailable"), headers={})
    with pytest.raises(SpecError, match="no such operation"):
        spec.validate_response("GET", "/v1/nope", 200, {})


INVALID_REQUESTS = [
    # (why, method, path, body, pointer)
    ("unknown field", "POST", "/v1/sandboxes", {"memory": 512}, "/memory"),
    ("wrong type", "POST", "/v1/sandboxes", {"memory_mb": "512"}, "/memory_mb"),
    ("float for integer", "POST", "/v1/sandboxes", {"memory_mb": 512.0}, "/memory_mb"),
    ("bool for integer", "POST", "/v1/sandboxes", {"pids": True}, "/pids"),
    ("memory too small", "POST", "/v1/sandboxes", {"memory_mb": 15}, "/memory_mb"),
    ("cpu zero", "POST", "/v1/sandboxes", {"cpu": 0}, "/cpu"),
    ("cpu too big", "POST", "/v1/sandboxes", {"cpu": 64.5}, "/cpu"),
    ("ttl too long", "POST", "/v1/sandboxes", {"ttl_s": 2592001}, "/ttl_s"),
    ("count too big", "POST", "/v1/sandboxes", {"count": 257}, "/count"),
    ("bad kind", "POST", "/v1/sandboxes", {"kind": "vm"}, "/kind"),
    ("relative workdir", "POST", "/v1/sandboxes", {"workdir": "work"}, "/workdir"),
    ("bad user", "POST", "/v1/sandboxes", {"user": "root:"}, "/user"),
    ("null label in create", "POST", "/v1/sandboxes", {"labels": {"a": None}}, "/labels/a"),
    ("too many labels", "POST", "/v1/sandboxes",
     {"labels": {f"k{i}": "v" for i in range(65)}}, "/labels"),
    ("long label value", "POST", "/v1/sandboxes", {"labels": {"k": "v" * 257}}, "/labels/k"),
    ("bad network mode", "POST", "/v1/sandboxes", {"network": {"mode": "host"}}, "/network/mode"),
    ("network extra", "POST", "/v1/sandboxes", {"network": {"mode": "none", "x": 1}},
     "/network/x"),
    ("null env", "POST", "/v1/sandboxes", {"env": None}, "/env"),
    ("env value type", "POST", "/v1/sandboxes", {"env": {"A": 1}}, "/env/A"),
    ("request_id too long", "POST", "/v1/sandboxes", {"request_id": "r" * 129}, "/request_id"),
    ("request_id empty", "POST", "/v1/sandboxes", {"request_id": ""}, "/request_id"),
    ("request_id control char", "POST", "/v1/sandboxes", {"request_id": "a\nb"}, "/request_id"),
    ("body not object", "POST", "/v1/sandboxes", [], ""),
    ("patch unknown", "PATCH", SB, {"memory_mb": 1024}, "/memory_mb"),
    ("patch ttl negative", "PATCH", SB, {"ttl_s": -1}, "/ttl_s"),
    ("patch label type", "PATCH", SB, {"labels": {"a": 1}}, "/labels/a"),
    ("patch no body", "PATCH", SB, None, ""),
    ("exec cmd and shell", "POST", SB + "/exec", {"cmd": ["ls"], "shell": "ls"}, ""),
    ("exec neither", "POST", SB + "/exec", {"stdin": "x"}, ""),
    ("exec both null", "POST", SB + "/exec", {"cmd": None, "shell": None}, ""),
    ("exec empty cmd", "POST", SB + "/exec", {"cmd": []}, "/cmd"),
    ("exec empty cmd string", "POST", SB + "/exec", {"cmd": ""}, "/cmd"),
    ("exec cmd item type", "POST", SB + "/exec", {"cmd": ["echo", 1]}, "/cmd/1"),
    ("exec timeout", "POST", SB + "/exec", {"cmd": ["x"], "timeout_ms": 86400001},
     "/timeout_ms"),
    ("exec output", "POST", SB + "/exec", {"cmd": ["x"], "max_output_bytes": -1},
     "/max_output_bytes"),
    ("exec encoding", "POST", SB + "/exec", {"cmd": ["x"], "encoding": "latin-1"}, "/encoding"),
    ("exec null stdin", "POST", SB + "/exec", {"cmd": ["x"], "stdin": None}, "/stdin"),
    ("exec relative cwd", "POST", SB + "/exec", {"cmd": ["x"], "cwd": "tmp"}, "/cwd"),
    ("exec background type", "POST", SB + "/exec", {"cmd": ["x"], "background": 1},
     "/background"),
    ("exec unknown", "POST", SB + "/exec", {"cmd": ["x"], "timeout": 5}, "/timeout"),
    ("signal name", "POST", SB + "/signal", {"signal": "SIGFOO"}, "/signal"),
    ("signal number", "POST", SB + "/signal", {"signal": 65}, "/signal"),
    ("signal missing", "POST", SB + "/signal", {}, "/signal"),
    ("shell run command", "POST", SB + "/shells/sh-1/run", {"timeout_ms": 5}, "/command"),
    ("shell create extra", "POST", SB + "/shells", {"cwd": "/"}, "/cwd"),
    ("pool kind", "PUT", "/v1/pools/py", {"kind": "vm"}, "/kind"),
    ("no body allowed", "DELETE", SB, {"force": True}, ""),
    ("unknown query", "GET", "/v1/sandboxes?limt=5", None, "?limt"),
    ("limit zero", "GET", "/v1/sandboxes?limit=0", None, "?limit"),
    ("limit not int", "GET", "/v1/sandboxes?limit=ten", None, "?limit"),
    ("limit twice", "GET", "/v1/sandboxes?limit=1&limit=2", None, "?limit"),
    ("bad state filter", "GET", "/v1/sandboxes?state=gone", None, "?state"),
    ("label without =", "GET", "/v1/sandboxes?label=job", None, "?label/0"),
    ("wait_ms range", "GET", SB + "/execs/ex-1?wait_ms=600001", None, "?wait_ms"),
    ("max_bytes range", "GET", SB + "/execs/ex-1?max_bytes=67108865", None, "?max_bytes"),
    ("negative offset", "GET", SB + "/execs/ex-1?stderr_offset=-1", None, "?stderr_offset"),
    ("missing path", "GET", SB + "/files", None, "?path"),
    ("relative path", "GET", SB + "/files?path=a.py", None, "?path"),
    ("bad mode", "PUT", SB + "/files?path=/a&mode=0999", b"", "?mode"),
    ("bad id", "GET", "/v1/sandboxes/sb..x", None, "{id}"),
    ("bad id chars", "GET", "/v1/sandboxes/sb%20x", None, "{id}"),
    ("attach tty", "GET", SB + "/attach?tty=2", None, "?tty"),
    ("attach env", "GET", SB + "/attach?env=K", None, "?env/0"),
    ("trajectory not object", "POST", "/v1/sandboxes", {"trajectory": "x"}, "/trajectory"),
    ("trajectory without id", "POST", "/v1/sandboxes", {"trajectory": {}}, "/trajectory/id"),
    ("trajectory bad id", "POST", "/v1/sandboxes", {"trajectory": {"id": "a/b"}},
     "/trajectory/id"),
    ("trajectory dotdot id", "POST", "/v1/sandboxes", {"trajectory": {"id": "a..b"}},
     "/trajectory/id"),
    ("trajectory extra", "POST", "/v1/sandboxes", {"trajectory": {"id": "x", "bogus": 1}},
     "/trajectory/bogus"),
    ("trajectory branch", "POST", "/v1/sandboxes",
     {"trajectory": {"id": "x", "resume": True, "branch": -1}}, "/trajectory/branch"),
    ("trajectory checkpoint_every", "POST", "/v1/sandboxes",
     {"trajectory": {"id": "x", "checkpoint_every": 1048577}}, "/trajectory/checkpoint_every"),
    ("preempt others", "POST", "/v1/jobs/j/preempt", {"others": "keep"}, "/others"),
    ("preempt extra", "POST", "/v1/jobs/j/preempt", {"force": True}, "/force"),
    ("trajectory branch query", "GET", "/v1/trajectories/t-1?branch=-1", None, "?branch"),
    ("trajectory from", "GET", "/v1/trajectories/t-1?from=0", None, "?from"),
    ("trajectory limit", "GET", "/v1/trajectories/t-1?limit=10001", None, "?limit"),
    ("trajectory path id", "GET", "/v1/trajectories/a..b", None, "{tid}"),
    ("resume image", "POST", "/v1/trajectories/t-1/resume", {"image": "host"}, "/image"),
    ("resume ttl", "POST", "/v1/trajectories/t-1/resume", {"ttl_s": -1}, "/ttl_s"),
    ("delete trajectory body", "DELETE", "/v1/trajectories/t-1", {"force": True}, ""),
]


@pytest.mark.parametrize("why,method,path,body,pointer", INVALID_REQUESTS,
                         ids=[c[0] for c in INVALID_REQUESTS])
def test_invalid_requests_fail(spec, why, method, path, body, pointer):
    with pytest.raises(SpecError) as e:
        spec.validate_request(method, path, body)
    assert e.value.pointer == pointer, str(e.value)


def test_invalid_frames_and_headers_fail(spec):
    for name, frame, pointer in [
        ("AttachClientMessage", {"resize": [80]}, ""),
        ("AttachClientMessage", {"eof": False}, ""),
        ("AttachClientMessage", {"resize": [80, 24], "signal": "INT"}, ""),
        ("AttachServerMessage", {"stdout": "x"}, ""),
        ("ExecExit", EXEC_RESULT, "/stdout"),
    ]:
        with pytest.raises(SpecError) as e:
            spec.validate(name, frame)
        assert e.value.pointer == pointer, str(e.value)
    with pytest.raises(SpecError) as e:
        spec.validate_request("GET", SB + "/attach?cmd=sh", None, headers={"Upgrade": "websocket"})
    assert e.value.pointer == "header connection"


# ---- the validator on its own ---------------------------------------------------------------

def toy(schema):
    return Spec({"openapi": "3.0.3", "paths": {}, "components": {"schemas": {"T": schema}}})


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "integer"}, [0, -3, 2**70], [True, 1.0, "1", None]),
    ({"type": "number"}, [0, 1.5, -2], [False, "1", None, float("nan")]),
    ({"type": "boolean"}, [True, False], [0, 1, "true"]),
    ({"type": "string", "nullable": True}, ["", None], [0, []]),
    ({"type": "integer", "format": "int32"}, [2**31 - 1], [2**31]),
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1}, [0.5, 1], [0, 1.1]),
    ({"type": "number", "maximum": 1, "exclusiveMaximum": True}, [0.9], [1]),
    ({"enum": [1, "a"]}, [1, "a"], [True, 2, "b"]),
    ({"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^a"}, ["ab", "abc"],
     ["a", "abcd", "ba"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, [[1], [1, 2]],
     [[], [1, 2, 3], ["1"], {}]),
    ({"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}, "maxProperties": 2},
     [{"a": 1}, {"a": 1, "b": "x"}],
     [{}, {"a": "1"}, {"a": 1, "b": 2}, {"a": 1, "b": "", "c": ""}]),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, [1, "x"], [1.5, None]),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, [1.5], [1, "x"]),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, [3], [2, 3.5]),
    ({"nullable": True, "allOf": [{"$ref": "#/components/schemas/T2"}]}, [None], []),
    ({"not": {"type": "string"}}, [1, None], ["x"]),
    ({"$ref": "#/components/schemas/T"}, [], []),  # self-cycle: reported, never looped
])
def test_validator_keywords(schema, good, bad):
    spec = toy(schema)
    spec.doc["components"]["schemas"]["T2"] = {"type": "object"}
    if schema == {"$ref": "#/components/schemas/T"}:
        with pytest.raises(SpecError, match="cycle"):
            spec.validate("T", 1)
        return
    for value in good:
        spec.validate("T", value)
    for value in bad:
        with pytest.raises(SpecError):
            spec.validate("T", value)


def test_validator_refuses_unknown_keywords_and_refs():
    with pytest.raises(SpecError, match="unsupported schema keyword 'propertyNames'"):
        toy({"type": "object", "propertyNames": {"pattern": "^a"}}).validate("T", {})
    with pytest.raises(SpecError, match="does not resolve"):
        toy({"$ref": "#/components/schemas/Nope"}).validate("T", 1)
    with pytest.raises(SpecError, match="only local"):
        toy({"$ref": "other.yaml#/X"}).validate("T", 1)


def test_error_message_names_pointer(spec):
    with pytest.raises(SpecError) as e:
        spec.validate_response("GET", SB, 200, changed(RECORD, "/labels/job", 7))
    message = str(e.value)
    assert message.startswith("GET /v1/sandboxes/{id} -> 200 body: at /labels/job:"), message
    assert "expected string, got integer 7" in message
    assert isinstance(e.value, AssertionError)
