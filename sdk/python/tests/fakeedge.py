"""A fake DSec edge for the SDK's unit tests.

NOT the real daemon: an in-process http.server that implements just enough of
the v1 API to drive the SDK's real transport and client code, plus fault
injection (503/429, dropped connections, stalled streams) and a log of
everything it received. End-to-end tests against a live dsec-edge live
elsewhere.

The fake is held to the same contract as the real edge: every request the SDK
sends and every reply the fake gives is checked against api/openapi.yaml
(tests/integration/openapi_check.py), and a mismatch fails the test (the
fixtures assert ``edge.spec_errors`` is empty). Only deliberately off-contract
replies are exempt: an injected fault with a raw (non-JSON) body, which stands
for a proxy's error page.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import re
import socket
import socketserver
import sys
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "integration"))
import openapi_check  # noqa: E402  (needs PyYAML: python3-yaml)

SPEC = openapi_check.Spec.load()

CREATE_FIELDS = {"kind", "image", "cpu", "memory_mb", "pids", "disk_mb", "ttl_s", "idle_ttl_s",
                 "user", "workdir", "env", "labels", "network", "pool", "count", "request_id"}
EXEC_FIELDS = {"cmd", "shell", "stdin", "stdin_encoding", "env", "cwd", "user", "timeout_ms",
               "max_output_bytes", "encoding", "background", "grader", "request_id"}
PATCH_FIELDS = {"ttl_s", "idle_ttl_s", "labels", "network", "request_id"}
SHELL_OPEN_FIELDS = {"user", "request_id"}
SHELL_RUN_FIELDS = {"command", "timeout_ms", "max_output_bytes", "encoding", "request_id"}
SIGNAL_FIELDS = {"signal", "request_id"}
FNCALL_FIELDS = {"runtime", "code", "filename", "stdin", "stdin_encoding", "files",
                 "timeout_ms", "memory_mb", "max_output_bytes", "encoding", "request_id"}
SNAPSHOT_FIELDS = {"image", "keep_setuid", "request_id"}
FORK_FIELDS = {"count", "keep_setuid", "request_id"}
IMPORT_QUERY = {"name", "format", "layer_format", "base"}
IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[A-Za-z0-9._-]+)?$")
BUILD_FIELDS = {"name", "base", "from", "packages", "variant", "run", "env", "workdir",
                "memory_mb", "disk_mb", "timeout_s", "request_id"}
BUILD_VARIANTS = {"minbase", "apt", "essential", "required", "important", "standard"}
DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+([=/][A-Za-z0-9.+~:_-]+)?$")
POOL_FIELDS = {"name", "kind", "runtime", "image", "preload", "command", "min_idle", "max",
               "memory_mb", "disk_mb", "pids", "cpu", "max_queue", "queue_timeout_ms",
               "idle_timeout_s", "request_id"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers=None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    query: list
    headers: dict
    body: bytes
    conn: int

    @property
    def json(self):
        return json.loads(self.body) if self.body else None

    @property
    def request_id(self):
        return self.json.get("request_id") if self.body and self.body[:1] == b"{" else None


@dataclass
class Fault:
    """Applies to the next ``times`` requests matching method and path prefix.

    action: "status" (reply ``status`` with a JSON error or ``raw_body``),
    "drop" (close without replying, nothing done), "drop_after" (do the work,
    record it for idempotency unless ``forget``, then close without replying),
    "close_after" (reply normally, then close the idle connection).
    """

    method: str
    path: str
    action: str
    times: int = 1
    status: int = 503
    retry_after: str | None = None
    raw_body: bytes | None = None
    forget: bool = False


@dataclass
class Edge:
    token: str | None = None
    chunked_json: bool = False          # send ordinary JSON replies chunked
    slow_s: float = 0.0                 # GET /v1/node sleeps this long
    # A kill the process outlives for a while (a stuck process): the kill answers `running`
    # with no result, and the exec ends this much later.
    kill_lag_s: float = 0.0
    # GET /v1/node waits here until this many are in progress at once (a 500 if they never
    # are): concurrency shown by the calls themselves, not by timing.
    node_barrier: threading.Barrier | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    sandboxes: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    archives: dict = field(default_factory=dict)
    shells: dict = field(default_factory=dict)
    execs: dict = field(default_factory=dict)
    pools: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)   # name -> image record (host is implicit)
    imports: list = field(default_factory=list)  # (query dict, body bytes, headers) received
    max_import_bytes: int = 64 << 20
    refuse_imports: bool = False  # 413 before reading an import's body, then close
    fncalls: list = field(default_factory=list)  # decoded (runtime, code, stdin, files)
    builds: dict = field(default_factory=dict)  # id -> FakeBuild, in creation order
    build_workers: int = 2           # builds running at once (the edge's max_builds)
    max_queued_builds: int = 16      # more waiting -> 429
    build_step_s: float = 0.03       # how long a step takes (a "sleep N" run step: N s)
    build_cancel_s: float = 0.05     # a canceled running build still "running" this long
    build_log_keep: int = 4 << 20    # the log tail kept per build
    idem: dict = field(default_factory=dict)
    log: list = field(default_factory=list)
    faults: list = field(default_factory=list)
    exec_count: int = 0
    conn_count: int = 0
    active: int = 0
    max_active: int = 0
    server_errors: list = field(default_factory=list)
    spec_errors: list = field(default_factory=list)  # requests/replies off api/openapi.yaml
    stream_gate: threading.Event = field(default_factory=threading.Event)
    stream_progress: list = field(default_factory=list)

    def fault(self, method, path, action, **kw) -> Fault:
        f = Fault(method, path, action, **kw)
        with self.lock:
            self.faults.append(f)
        return f

    def seen(self, method=None, path=None) -> list[Seen]:
        with self.lock:
            return [s for s in self.log
                    if (method is None or s.method == method)
                    and (path is None or s.path == path)]

    def conns(self) -> set[int]:
        with self.lock:
            return {s.conn for s in self.log}

    def take_fault(self, method, path):
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and path.startswith(f.path):
                    f.times -= 1
                    return f
        return None

    def add_sandbox(self, body=None, sid=None) -> dict:
        body = body or {}
        sid = sid or f"sb-fake-{uuid.uuid4().hex[:8]}"
        now = int(time.time() * 1000)
        ttl_s = body.get("ttl_s", 3600)
        rec = {"id": sid, "kind": body.get("kind", "container"), "state": "running",
               "node": "fake", "image": body.get("image", "host"), "created_at": now,
               "expires_at": _expires_at(now, ttl_s),
               "ttl_s": ttl_s, "idle_ttl_s": body.get("idle_ttl_s", 0),
               "last_used_at": now,
               "limits": {"cpu": body.get("cpu", 1.0), "memory_mb": body.get("memory_mb", 512),
                          "pids": body.get("pids", 256), "disk_mb": body.get("disk_mb", 256)},
               "user": body.get("user", "sandbox"), "workdir": body.get("workdir", "/workspace"),
               "network": body.get("network", {"mode": "none"}),
               "labels": dict(body.get("labels") or {}), "project": "default", "reason": None}
        with self.lock:
            self.sandboxes[sid] = rec
        return rec

    # -- images ------------------------------------------------------------

    @staticmethod
    def image_name(name: str) -> str:
        if name == "host":
            return name
        if not isinstance(name, str) or not IMAGE_NAME.match(name):
            raise ApiError(400, "bad_request", f"bad image name {name!r}")
        return name if ":" in name else name + ":latest"

    def image_record(self, name: str) -> dict | None:
        """The record as the edge sends it, ``in_use`` counted now."""
        with self.lock:
            if name == "host":
                rec = {"name": "host", "base": None, "layers": [],
                       "config": {"env": [], "workdir": "", "user": "", "entrypoint": [],
                                  "cmd": []},
                       "size": 0, "source": "builtin", "created_at": 0}
            elif name in self.images:
                rec = dict(self.images[name])
            else:
                return None
            digests = {layer["digest"] for layer in rec["layers"]}
            rec["in_use"] = sum(
                1 for sb in self.sandboxes.values()
                if any(i == name or (digests and digests <= self._layers_of(i))
                       for i in _image_list(sb["image"])))
        return rec

    def _layers_of(self, name) -> set:
        rec = self.images.get(name if ":" in name or name == "host" else name + ":latest")
        return {layer["digest"] for layer in rec["layers"]} if rec else set()

    def add_image(self, name, layers, source, base=None, config=None) -> dict:
        rec = {"name": name, "base": base, "layers": layers,
               "config": config or {"env": ["PATH=/usr/bin:/bin"], "workdir": "", "user": "",
                                    "entrypoint": [], "cmd": []},
               "size": sum(layer["size"] for layer in layers), "source": source,
               "created_at": int(time.time() * 1000)}
        with self.lock:
            self._put_image_locked(name, rec)
        return self.image_record(name)

    def _put_image_locked(self, name, rec) -> None:
        if name in self.images or name == "host":
            raise ApiError(409, "conflict", f"image {name} exists")
        self.images[name] = rec

    # -- image builds ------------------------------------------------------

    def start_build(self, obj) -> dict:
        """POST /v1/images/build: validated in the edge's order (400, then 404 for
        an unknown "from" image, 409 for a taken name, 429 for a full queue, 409
        for a build of the same name still going); returns the record."""
        req = _parse_build(self, obj)
        for n in req["from"]:
            if n != "host" and self.image_record(n) is None:
                raise ApiError(404, "not_found", f"image \"{n}\" not found")
        build = FakeBuild(self, req)
        with self.lock:
            now = time.monotonic()
            self._advance_locked(now)
            if req["name"] in self.images:
                raise ApiError(409, "conflict", f"image \"{req['name']}\" already exists")
            queued = sum(1 for b in self.builds.values() if b.queued(now))
            if queued >= self.max_queued_builds:
                raise ApiError(429, "over_capacity",
                               f"{self.max_queued_builds} builds are already waiting",
                               {"Retry-After": "1"})
            for other in self.builds.values():
                if other.name == req["name"] and not other.finished(now):
                    raise ApiError(409, "conflict", f"build {other.id} is already making image "
                                                    f"\"{req['name']}\"")
            self.builds[build.id] = build
            self._advance_locked(now)
            return build.record(now)

    def build(self, build_id) -> tuple["FakeBuild", float]:
        """The build (advanced to now) and now; 404 if unknown."""
        with self.lock:
            now = time.monotonic()
            self._advance_locked(now)
            b = self.builds.get(build_id)
        if b is None:
            raise ApiError(404, "not_found", f"build {build_id} not found")
        return b, now

    def cancel_build(self, build_id) -> dict:
        b, now = self.build(build_id)
        with self.lock:
            if b.started is None and b.queue_canceled is None:
                b.queue_canceled = now  # taken off the queue: canceled at once
            elif b.started is not None and not b.finished(now) and b.canceled_at is None:
                b.canceled_at = now + self.build_cancel_s  # its command dies shortly
            self._advance_locked(now)
            return b.record(now)

    def _advance_locked(self, now) -> None:
        """Starts queued builds as workers free up (in creation order) and stores
        the images of builds that have succeeded by now."""
        slots = [float("-inf")] * self.build_workers  # when each worker is free
        for b in self.builds.values():
            if b.queue_canceled is not None and b.started is None:
                continue
            i = min(range(len(slots)), key=slots.__getitem__)
            if b.started is None:
                start = max(b.created, slots[i])
                if start > now:
                    break  # the queue waits, and everything after it
                b.started = start
            slots[i] = b.end()
            if b.end() <= now and b.outcome() == "succeeded" and not b.saved:
                b.saved = True
                try:
                    self._put_image_locked(b.name, b.image_record())
                except ApiError as e:  # taken meanwhile: the build fails at its last step
                    b.save_error = f"image \"{b.name}\" already exists ({e.message})"

    def put_pool(self, name, body) -> tuple[dict, bool]:
        """PUT /v1/pools/NAME as the edge does it: a new pool takes defaults, an
        existing one of the same kind keeps the fields the body leaves out."""
        _strict(body, POOL_FIELDS)
        with self.lock:
            old = self.pools.get(name)
        # Like the edge: a PUT without "kind" changes the pool that is there.
        kind = body.get("kind", old["kind"] if old else "fncall")
        if old is not None and old["kind"] == kind:
            pool = {k: v for k, v in old.items() if k not in ("workers", "queued", "calls")}
        elif kind == "container":
            pool = {"name": name, "kind": "container", "image": "host", "min_idle": 8, "max": 64,
                    "memory_mb": 512, "disk_mb": 256, "pids": 256, "cpu": 1.0}
        elif kind == "fncall":
            if "runtime" not in body and "command" not in body:
                raise ApiError(400, "bad_request", '"runtime" is required')
            pool = {"name": name, "kind": "fncall", "runtime": body.get("runtime", "exec"),
                    "image": "host", "min_idle": 2, "max": 8, "memory_mb": 512, "disk_mb": 64,
                    "pids": 256, "cpu": 1.0, "max_queue": 256, "queue_timeout_ms": 10000,
                    "idle_timeout_s": 60}
        else:
            raise ApiError(400, "bad_request", '"kind" must be "fncall" or "container"')
        pool.update({k: v for k, v in body.items() if k != "request_id" and v is not None})
        if pool["kind"] == "fncall":  # like the edge: preload for python, command for exec
            pool.setdefault("preload", [])
            pool.setdefault("command", [])
            for key, runtime in (("preload", "python"), ("command", "exec")):
                if pool["runtime"] != runtime:
                    del pool[key]
        live = {"idle": pool["min_idle"], "busy": 0, "starting": 0}
        pool.update(workers=live, rejected=0, replaced=0, last_error=None)
        pool.update({"taken": 0, "missed": 0} if kind == "container" else {"queued": 0, "calls": 0})
        with self.lock:
            self.pools[name] = pool
        return pool, old is None


def _parse_build(edge, obj) -> dict:
    """ParseBuildRequest of the edge: the same checks, the same order."""
    obj = _strict(obj if obj is not None else {}, BUILD_FIELDS)

    def typed(key, kind, what):
        v = obj.get(key)
        if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise ApiError(400, "bad_request", f'"{key}" must be {what}')
        return v

    name = typed("name", str, "a string")
    base = typed("base", str, "a string")
    variant = typed("variant", str, "a string")
    packages = typed("packages", list, "an array of strings")
    run = typed("run", list, "an array of strings")
    env = typed("env", dict, "an object of strings")
    workdir = typed("workdir", str, "a string")
    for key, (lo, hi) in {"memory_mb": (64, 1 << 20), "disk_mb": (16, 1 << 20),
                          "timeout_s": (1, 86400)}.items():
        v = typed(key, int, "an integer")
        if v is not None and not lo <= v <= hi:
            raise ApiError(400, "bad_request", f'"{key}" must be between {lo} and {hi}')
    for key, v in (("packages", packages), ("run", run)):
        if v is not None and not all(isinstance(x, str) for x in v):
            raise ApiError(400, "bad_request", f'"{key}" must be an array of strings')
    if env is not None and not all(isinstance(v, str) for v in env.values()):
        raise ApiError(400, "bad_request", '"env" must be an object of strings')
    from_ = obj.get("from")
    if from_ is not None:
        if isinstance(from_, str):
            from_ = [from_]
        elif not (isinstance(from_, list) and 1 <= len(from_) <= 16):
            raise ApiError(400, "bad_request",
                           '"from" must be an image name or a list of 1-16 of them')
        elif not all(isinstance(x, str) for x in from_):
            raise ApiError(400, "bad_request", '"from" must be an image name or a list')
    if name is None:
        raise ApiError(400, "bad_request", '"name" (name:tag) is required')
    name = edge.image_name(name)
    if name == "host":
        raise ApiError(400, "bad_request", '"host" is the built-in image')
    if (base is None) == (from_ is None):
        raise ApiError(400, "bad_request", 'give either "base" (debian:SUITE, made with '
                                           'mmdebstrap) or "from" (images)')
    suite = ""
    stack = []
    if base is not None:
        if not base.startswith("debian:"):
            raise ApiError(400, "bad_request", '"base" must be debian:SUITE (e.g. '
                                               'debian:bookworm); use "from" to start from an '
                                               'image')
        suite = base[7:]
    else:
        for i, n in enumerate(from_):
            if n in ("host", "host:latest"):
                if i:
                    raise ApiError(400, "bad_request",
                                   '"host" can only be the first image of "from"')
                stack.append("host")
            else:
                stack.append(edge.image_name(n))
        if packages:
            raise ApiError(400, "bad_request", '"packages" need a "base" (debian:SUITE); with '
                                               '"from", install them in a "run" step')
        if not run:
            raise ApiError(400, "bad_request", 'a build "from" images needs "run" steps')
    if any(not c or "\0" in c for c in run or []):
        raise ApiError(400, "bad_request", '"run" steps must be non-empty commands without NUL')
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in (env or {}).items()):
        raise ApiError(400, "bad_request", "env names must not contain '=' or NUL, values no NUL")
    if workdir is not None and not workdir.startswith("/"):
        raise ApiError(400, "bad_request", '"workdir" must be an absolute path')
    variant = "minbase" if variant is None else variant
    if suite:
        if not re.fullmatch(r"[a-z-]{1,32}", suite):
            raise ApiError(400, "bad_request",
                           f'Debian suite "{suite}": expected letters (bookworm, ...)')
        if variant not in BUILD_VARIANTS:
            raise ApiError(400, "bad_request", f'variant "{variant}": expected minbase, apt, '
                                               'essential, required, important or standard')
        for p in packages or []:
            if not DEBIAN_PACKAGE.match(p):
                raise ApiError(400, "bad_request",
                               f'package "{p}": expected a Debian package name')
    return {"name": name, "suite": suite, "from": stack, "packages": list(packages or []),
            "run": list(run or []), "env": dict(env or {}), "workdir": workdir or "",
            "variant": variant}


def _short(cmd: str) -> str:
    s = cmd[:60].replace("\n", " ").replace("\t", " ")
    return s + "..." if len(cmd) > 60 else s


class FakeBuild:
    """One build job, computed from the clock: it starts when a worker is free
    and each step takes edge.build_step_s. Run steps understand "sleep N"
    (takes N s), "echo TEXT", "spam N" (N bytes of log), "false" and "exit N"
    (the step fails); anything else just succeeds."""

    def __init__(self, edge, req) -> None:
        self.edge = edge
        self.id = "bld-" + uuid.uuid4().hex[:16]
        self.req = req
        self.name = req["name"]
        self.created = time.monotonic()
        self.created_ms = int(time.time() * 1000)
        self.started: float | None = None
        self.canceled_at: float | None = None
        self.queue_canceled: float | None = None
        self.saved = False
        self.save_error: str | None = None
        self.sandbox = f"sb-fake-{uuid.uuid4().hex[:8]}"
        self.layer = _layer(self.id.encode(), 1234)
        step = edge.build_step_s
        # (name, seconds, log text, error if the step fails)
        self.steps: list[tuple[str, float, str, str | None]] = []
        if req["suite"]:
            self.steps.append((f"bootstrap debian:{req['suite']}", step,
                               f"I: mmdebstrap --variant={req['variant']} {req['suite']}\n"
                               f"[dsec] root filesystem stored as layer {self.layer['digest']}\n",
                               None))
        if req["run"]:
            stack = ",".join(req["from"]) or self.name
            self.steps.append(("start a build sandbox", step,
                               f"[dsec] sandbox {self.sandbox} from {stack}\n", None))
            for cmd in req["run"]:
                self.steps.append(self._run_step(cmd, step))
            self.steps.append(("capture the sandbox's files", step,
                               f"[dsec] captured layer {self.layer['digest']}\n", None))
        self.steps.append((f"save image {self.name}", step,
                           f"[dsec] image {self.name} saved (N layers)\n", None))

    @staticmethod
    def _run_step(cmd, step):
        words = cmd.split()
        out, secs, error = "", step, None
        if words[:1] == ["sleep"] and len(words) == 2:
            secs = float(words[1])
        elif words[:1] == ["echo"]:
            out = cmd[5:] + "\n"
        elif words[:1] == ["spam"] and len(words) == 2:
            n = int(words[1])
            out = ("x" * 63 + "\n") * (n // 64) + "y" * (n % 64)
        elif words == ["false"] or (words[:1] == ["exit"] and len(words) == 2
                                    and words[1] != "0"):
            code = 1 if words == ["false"] else int(words[1])
            out = "about to fail\n"
            error = f'step "{_short(cmd)}" exited with status {code}'
        return (f"run: {_short(cmd)}", secs, f"$ {cmd}\n{out}", error)

    # -- the timeline --------------------------------------------------------

    def _ends(self) -> list[float]:
        """When each step ends, in seconds from the start."""
        t, out = 0.0, []
        for _, secs, _, _ in self.steps:
            t += secs
            out.append(t)
        return out

    def _natural(self) -> tuple[float, int | None]:
        """(seconds from start to the natural end, index of the failing step)."""
        ends = self._ends()
        for k, (_, _, _, error) in enumerate(self.steps):
            if error:
                return ends[k], k
        return ends[-1], None

    def end(self) -> float:
        """When it finishes (started builds only)."""
        natural = self.started + self._natural()[0]
        return natural if self.canceled_at is None else min(natural, self.canceled_at)

    def outcome(self) -> str:
        natural_end = self.started + self._natural()[0]
        if self.canceled_at is not None and self.canceled_at < natural_end:
            return "canceled"
        if self._natural()[1] is not None or self.save_error:
            return "failed"
        return "succeeded"

    def queued(self, now) -> bool:
        return self.queue_canceled is None and (self.started is None or self.started > now)

    def finished(self, now) -> bool:
        if self.queue_canceled is not None and self.started is None:
            return True
        return self.started is not None and self.end() <= now

    def image_record(self) -> dict:
        req = self.req
        layers, base = [], None
        for n in req["from"]:
            if n == "host":
                base = "host"
            else:
                rec = self.edge.images.get(n)
                layers += rec["layers"] if rec else []
                base = base or (rec or {}).get("base")
        layers.append(self.layer)
        env = ["PATH=/usr/bin:/bin"] + [f"{k}={v}" for k, v in sorted(req["env"].items())]
        return {"name": self.name, "base": base, "layers": layers,
                "config": {"env": env, "workdir": req["workdir"], "user": "",
                           "entrypoint": [], "cmd": []},
                "size": sum(layer["size"] for layer in layers), "source": "build",
                "created_at": int(time.time() * 1000)}

    def state_at(self, now) -> dict:
        """The record's fields and the whole log (before the tail is cut) at now."""
        n = len(self.steps)
        st = {"steps": [[name, "pending"] for name, *_ in self.steps], "step": None,
              "error": None, "image": None, "sandbox": None, "log": "",
              "started_at": None, "finished_at": None, "state": "queued"}
        if self.queue_canceled is not None and self.started is None:
            for s in st["steps"]:
                s[1] = "canceled"
            st.update(state="canceled", error="canceled before it started",
                      finished_at=self._ms(self.queue_canceled))
            return st
        if self.started is None or self.started > now:
            return st
        st["state"] = "running"
        st["started_at"] = self._ms(self.started)
        end = self.end()
        upto = min(now, end)
        ends = [self.started + e for e in self._ends()]
        fail_k = self._natural()[1]
        log = []
        for k, (name, _, text, _) in enumerate(self.steps):
            if k > 0 and ends[k - 1] >= upto:
                break  # not begun by now (or by the end of the build)
            log.append(f"[dsec] step {k + 1}/{n}: {name}\n")
            is_run = name.startswith("run: ")
            if is_run:
                log.append(text)  # the command line and its output, as it starts
            if name == "start a build sandbox":
                st["sandbox"] = self.sandbox
            if k != fail_k and ends[k] <= upto:
                st["steps"][k][1] = "done"
                if not is_run:
                    log.append(text)  # what the step made, once it is done
                continue
            st["steps"][k][1] = "running"  # (the failing one: turned "failed" below)
            st["step"] = k
            break
        if end <= now:
            outcome = self.outcome()
            st["state"] = outcome
            st["step"] = None
            st["finished_at"] = self._ms(end)
            if outcome == "succeeded":
                st["image"] = self.name
                log[-1] = log[-1].replace("(N layers)", f"({len(self.image_record()['layers'])} "
                                                        "layers)")
            else:
                st["error"] = "canceled" if outcome == "canceled" else \
                    self.save_error or self.steps[self._natural()[1]][3]
                if self.save_error:
                    st["steps"][-1][1] = "running"
                    log[-1] = ""  # not saved after all
                for s in st["steps"]:
                    if s[1] in ("running", "pending"):
                        s[1] = outcome
                log.append(f"\n[dsec] build {outcome}: {st['error']}\n")
        st["log"] = "".join(log)
        return st

    def _ms(self, t) -> int:
        return self.created_ms + int((t - self.created) * 1000)

    def log_tail(self, now) -> tuple[bytes, int]:
        """The log bytes kept and the offset of the first one (the edge drops a
        quarter more than it must whenever the log outgrows its limit)."""
        data = self.state_at(now)["log"].encode()
        keep, start = self.edge.build_log_keep, 0
        while len(data) - start > keep:
            start += len(data) - start - keep + keep // 4
        return data[start:], start

    def record(self, now) -> dict:
        st = self.state_at(now)
        done = sum(1 for _, state in st["steps"] if state == "done")
        data, start = self.log_tail(now)
        return {"id": self.id, "name": self.name, "state": st["state"],
                "steps": [{"name": name, "state": state} for name, state in st["steps"]],
                "step": st["step"], "progress": done / len(st["steps"]),
                "error": st["error"], "image": st["image"], "sandbox": st["sandbox"],
                "log_bytes": start + len(data), "created_at": self.created_ms,
                "started_at": st["started_at"], "finished_at": st["finished_at"]}

    def log_page(self, now, offset, max_bytes) -> dict:
        data, start = self.log_tail(now)
        end = start + len(data)
        frm = min(max(offset, start), end)
        text = data[frm - start:frm - start + max_bytes]
        if frm + len(text) < end:  # whole UTF-8 characters only
            while text and (text[-1] & 0xC0) == 0x80:
                text = text[:-1]
            if text and text[-1] & 0x80:
                text = text[:-1]
        return {"offset": frm, "next_offset": frm + len(text), "text": text.decode(),
                "done": self.finished(now)}


def _expires_at(now_ms: int, ttl_s: int):
    """As the edge: ``ttl_s`` 0 is no TTL (``expires_at`` null)."""
    return None if ttl_s == 0 else now_ms + 1000 * ttl_s


def _image_list(image) -> list:
    return list(image) if isinstance(image, list) else [image]


def _layer(data: bytes, size: int) -> dict:
    return {"digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": size,
            "format": "dir"}


def _strict(body, allowed):
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "body must be a JSON object")
    unknown = set(body) - allowed
    if unknown:
        raise ApiError(400, "bad_request", f"unknown fields {sorted(unknown)}")
    return body


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10  # idle keep-alive connections end, so server_close() can join

    def setup(self):
        super().setup()
        if self.server.tcp:
            # Headers and body go out in separate writes; without this, Nagle
            # plus delayed ACKs add 40 ms to every reply.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        edge = self.server.edge
        with edge.lock:
            edge.conn_count += 1
            self.conn_id = edge.conn_count

    def log_message(self, *args):
        pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = lambda self: self.dispatch()

    # -- plumbing ----------------------------------------------------------

    def check(self, what, fn, *args, **kw):
        """Runs one openapi_check validation; a mismatch is recorded, not raised, so the
        reply still goes out and the test fails in its fixture with the spec's message."""
        try:
            fn(*args, **kw)
        except openapi_check.SpecError as e:
            with self.server.edge.lock:
                self.server.edge.spec_errors.append(f"{what}: {e}")

    def check_request(self, body):
        ctype = self.headers.get("Content-Type")
        decoded = body or None
        if body and ctype and ctype.split(";")[0].strip() == "application/json":
            try:
                decoded = json.loads(body)
            except ValueError:
                decoded = body  # the fake answers 400; the spec check reports the type
        try:
            SPEC.validate_request(self.command, self.path, decoded,
                                  headers=dict(self.headers.items()),
                                  content_type=ctype if body else None)
            self.off_contract = None
        except openapi_check.SpecError as e:
            self.off_contract = str(e)

    def check_reply(self, status, body, ctype, headers):
        # A request off the contract is the test's doing (bad input on purpose) as long as
        # the fake refuses it, as the edge would; accepting one means the fake is too lax.
        if getattr(self, "off_contract", None) and status < 400:
            with self.server.edge.lock:
                self.server.edge.spec_errors.append(
                    f"accepted with {status} a request the edge refuses: {self.off_contract}")
        if status == 204 or ctype == "application/json":
            decoded = json.loads(body) if body else None
        elif ctype == "application/x-ndjson":
            decoded = body.decode()
        else:
            decoded = body
        self.check("reply", SPEC.validate_response, self.command, self.path, status, decoded,
                   content_type=None if status == 204 else ctype, headers=headers)

    def send(self, status, body=b"", ctype="application/json", headers=None, chunked=False,
             on_contract=True):
        if on_contract:
            self.check_reply(status, body, ctype, headers or {})
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if status != 204:
            self.send_header("Content-Type", ctype)
        if chunked and status != 204:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):  # tiny chunks exercise the decoder
                self.write_chunk(body[i:i + 7])
            self.end_chunks()
        else:
            if status != 204:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def read_chunked(self) -> bytes:
        parts = []
        while True:
            line = self.rfile.readline()
            if not line:  # the client gave up mid-body
                raise ConnectionResetError("request body cut short")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()  # CRLF after the chunk

    def write_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def drop(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def dispatch(self):
        edge = self.server.edge
        if edge.refuse_imports and self.path.startswith("/v1/images/import"):
            # Like the edge over its body limit: answer at once, close unread.
            self.close_connection = True
            return self.send_error_json(ApiError(413, "too_large", "request body is too large"))
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = self.read_chunked()
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
        parts = urlsplit(self.path)
        path = parts.path  # still %-escaped: routing splits, then unescapes
        query = parse_qsl(parts.query, keep_blank_values=True)
        seen = Seen(self.command, path, query, {k.lower(): v for k, v in self.headers.items()},
                    body, self.conn_id)
        self.check_request(body)
        with edge.lock:
            edge.log.append(seen)
            edge.active += 1
            edge.max_active = max(edge.max_active, edge.active)
        try:
            self.handle_api(edge, seen, parts.query)
        finally:
            with edge.lock:
                edge.active -= 1

    def handle_api(self, edge: Edge, seen: Seen, raw_query: str):
        fault = edge.take_fault(seen.method, seen.path)
        if fault and fault.action == "drop":
            return self.drop()
        if fault and fault.action == "status":
            # Like the edge, every 429 and 503 says when to come back.
            headers = ({"Retry-After": fault.retry_after or "0"}
                       if fault.status in (429, 503) or fault.retry_after else {})
            if fault.raw_body is not None:
                return self.send(fault.status, fault.raw_body, "text/html", headers,
                                 on_contract=False)
            err = {"error": {"code": {429: "over_capacity"}.get(fault.status, "unavailable"),
                             "message": "injected"}}
            return self.send(fault.status, json.dumps(err).encode(), headers=headers)

        if edge.token and seen.path != "/v1/health" and self.server.tcp:
            if seen.headers.get("authorization") != f"Bearer {edge.token}":
                return self.send_error_json(ApiError(401, "unauthorized", "bad token"))

        key = seen.headers.get("idempotency-key")
        obj = None
        if seen.body and seen.headers.get("content-type") == "application/json":
            try:
                obj = json.loads(seen.body)
            except ValueError:
                return self.send_error_json(ApiError(400, "bad_request", "bad JSON"))
            if isinstance(obj, dict) and obj.get("request_id"):
                key = obj["request_id"]
        scope = (seen.method, seen.path + "?" + raw_query, key)
        if key:
            with edge.lock:
                prior = edge.idem.get(scope)
            if prior is not None:
                if prior[0] != seen.body:
                    return self.send_error_json(ApiError(409, "conflict", "key reused"))
                return self.send(*prior[1])

        if dict(seen.query).get("stream") == "1":
            return self.stream_exec(edge, seen, obj)
        try:
            reply = self.route(edge, seen, obj)
        except ApiError as e:
            reply = (e.status, json.dumps({"error": {"code": e.code, "message": e.message}})
                     .encode(), "application/json", e.headers)
        if key and not (fault and fault.forget):
            with edge.lock:
                edge.idem[scope] = (seen.body, reply)
        if fault and fault.action == "drop_after":
            return self.drop()
        self.send(*reply, chunked=edge.chunked_json and reply[0] == 200
                  and reply[2] == "application/json")
        if fault and fault.action == "close_after":
            self.drop()

    def send_error_json(self, e: ApiError):
        body = json.dumps({"error": {"code": e.code, "message": e.message}}).encode()
        self.send(e.status, body, headers=e.headers)

    # -- routes ------------------------------------------------------------

    def route(self, edge: Edge, s: Seen, obj):
        q = dict(s.query)
        segs = [unquote(x) for x in s.path.strip("/").split("/")]
        ok = lambda data, status=200: (status, json.dumps(data).encode(), "application/json", {})
        empty = (204, b"", "application/json", {})
        m = s.method
        if segs[:1] != ["v1"]:
            raise ApiError(404, "not_found", "no route")
        segs = segs[1:]
        if segs == ["health"]:
            return ok({"ok": True})
        if segs == ["node"]:
            time.sleep(edge.slow_s)
            if edge.node_barrier is not None:
                try:
                    edge.node_barrier.wait()
                except threading.BrokenBarrierError:
                    raise ApiError(500, "internal", "the calls were not all in progress at once")
            with edge.lock:
                by_state = {}
                for sb in edge.sandboxes.values():
                    by_state[sb["state"]] = by_state.get(sb["state"], 0) + 1
                memory = sum(sb.get("memory_mb", 0) for sb in edge.sandboxes.values())
                pools = [dict(p) for _, p in sorted(edge.pools.items())]
            return ok({"node": "fake", "version": "0", "instance": "fake-instance",
                       "backends": ["container"], "pools": pools,
                       "capacity": {"max_sandboxes": 1000, "memory_mb": 65536, "overcommit": 1.0,
                                    "admit_memory_mb": 65536},
                       "usage": {"sandboxes": sum(by_state.values()), "memory_mb": memory,
                                 "by_state": by_state},
                       "features": {}})
        if segs == ["images"] and m == "GET":
            with edge.lock:
                names = sorted(edge.images)
            return ok({"images": [edge.image_record(n) for n in ["host"] + names]})
        if segs == ["images", "build"] and m == "POST":
            return ok(edge.start_build(obj), 202)
        if segs[:2] == ["images", "builds"] and len(segs) in (3, 4):
            if len(segs) == 3 and m == "GET":
                b, now = edge.build(segs[2])
                with edge.lock:
                    return ok(b.record(now))
            if len(segs) == 3 and m == "DELETE":
                return ok(edge.cancel_build(segs[2]))
            if segs[3:] == ["log"] and m == "GET":
                def num(key, default, lo, hi):
                    try:
                        v = int(q.get(key, default))
                    except ValueError:
                        v = lo - 1
                    if not lo <= v <= hi:
                        raise ApiError(400, "bad_request", f'"{key}" must be {lo}..{hi}')
                    return v
                offset = num("offset", 0, 0, 1 << 62)
                max_bytes = num("max_bytes", 1 << 20, 1, 4 << 20)
                b, now = edge.build(segs[2])
                with edge.lock:
                    return ok(b.log_page(now, offset, max_bytes))
            raise ApiError(404, "not_found", "no route")
        if segs == ["images", "import"] and m == "POST":
            return ok(self.import_image(edge, s), 201)
        if segs[:1] == ["images"] and len(segs) == 2:
            name = edge.image_name(segs[1])
            if m == "GET":
                rec = edge.image_record(name)
                if rec is None:
                    raise ApiError(404, "not_found", f"image {name} not found")
                return ok(rec)
            if m == "DELETE":
                if name == "host":
                    raise ApiError(409, "conflict", "the built-in image host cannot be deleted")
                with edge.lock:
                    if edge.images.pop(name, None) is None:
                        raise ApiError(404, "not_found", f"image {name} not found")
                return empty
        if segs == ["fncalls"] and m == "POST":
            return ok(self.fncall(edge, _strict(obj, FNCALL_FIELDS)))
        if segs == ["pools"] and m == "GET":
            with edge.lock:
                return ok({"pools": [edge.pools[n] for n in sorted(edge.pools)]})
        if segs[:1] == ["pools"] and len(segs) == 2:
            name = segs[1]
            if m == "PUT":
                pool, new = edge.put_pool(name, obj if obj is not None else {})
                return ok(pool, 201 if new else 200)
            with edge.lock:
                pool = edge.pools.pop(name, None) if m == "DELETE" else edge.pools.get(name)
            if pool is None:
                raise ApiError(404, "not_found", f"pool {name} not found")
            return empty if m == "DELETE" else ok(pool)
        if segs[:1] == ["jobs"] and len(segs) >= 2:
            if s.body:
                raise ApiError(400, "bad_request", "no body expected")
            job = segs[1]
            with edge.lock:
                hit = [r for r in edge.sandboxes.values() if r["labels"].get("job") == job]
                if m == "DELETE" and len(segs) == 2:
                    for r in hit:
                        del edge.sandboxes[r["id"]]
                elif m == "POST" and len(segs) == 3 and segs[2] in ("pause", "resume"):
                    for r in hit:
                        r["state"] = "paused" if segs[2] == "pause" else "running"
                else:
                    raise ApiError(404, "not_found", "no route")
            return ok({"affected": len(hit)})
        if segs[:1] != ["sandboxes"]:
            raise ApiError(404, "not_found", "no route")
        if len(segs) == 1:
            if m == "POST":
                _strict(obj or {}, CREATE_FIELDS)
                image = (obj or {}).get("image", "host")
                if isinstance(image, list):
                    if not image or not all(isinstance(i, str) for i in image):
                        raise ApiError(400, "bad_request", '"image": a name or a non-empty list')
                    for i in image:
                        if edge.image_record(edge.image_name(i)) is None:
                            raise ApiError(404, "not_found", f"image {i} not found")
                elif not isinstance(image, str):
                    raise ApiError(400, "bad_request", '"image": a name or a non-empty list')
                if obj and "count" in obj:
                    recs = [edge.add_sandbox(obj) for _ in range(obj["count"])]
                    return ok({"sandboxes": recs}, 201)
                return ok(edge.add_sandbox(obj), 201)
            if m == "GET":
                want = [v.split("=", 1) for k, v in s.query if k == "label"]
                with edge.lock:
                    recs = sorted(edge.sandboxes.values(), key=lambda r: r["id"])
                recs = [r for r in recs if all(r["labels"].get(k) == v for k, v in want)
                        and q.get("state") in (None, r["state"])
                        and q.get("kind") in (None, r["kind"])]
                start = int(q.get("cursor") or 0)
                limit = int(q.get("limit", 100))
                page = recs[start:start + limit]
                nxt = str(start + limit) if start + limit < len(recs) else None
                return ok({"sandboxes": page, "next_cursor": nxt})
        sid = segs[1]
        with edge.lock:
            rec = edge.sandboxes.get(sid)
        if rec is None:
            raise ApiError(404, "not_found", f"sandbox {sid} not found")
        rest = segs[2:]
        if not rest:
            if m == "GET":
                return ok(rec)
            if m == "DELETE":
                with edge.lock:
                    edge.sandboxes.pop(sid, None)
                return empty
            if m == "PATCH":
                _strict(obj, PATCH_FIELDS)
                if "ttl_s" in obj:
                    rec["ttl_s"] = obj["ttl_s"]
                    rec["expires_at"] = _expires_at(int(time.time() * 1000), obj["ttl_s"])
                for k, v in (obj.get("labels") or {}).items():
                    if v is None:
                        rec["labels"].pop(k, None)
                    else:
                        rec["labels"][k] = v
                return ok(rec)
        if rest in (["pause"], ["resume"]) and m == "POST":
            if s.body:
                raise ApiError(400, "bad_request", "no body expected")
            rec["state"] = "paused" if rest == ["pause"] else "running"
            return ok(rec)
        if rest == ["snapshot"] and m == "POST":
            name = edge.image_name(_strict(obj, SNAPSHOT_FIELDS).get("image"))
            stack = [edge.image_record(edge.image_name(i)) for i in _image_list(rec["image"])]
            base = "host" if stack[0] is None or stack[0]["source"] == "builtin" \
                else stack[0]["base"]
            layers = [layer for r in stack if r for layer in r["layers"]]
            with edge.lock:
                files = sorted((k[1], v[0]) for k, v in edge.files.items() if k[0] == sid)
            top = json.dumps([[p, d.decode("latin-1")] for p, d in files]).encode()
            return ok(edge.add_image(name, layers + [_layer(top, sum(len(d) for _, d in files))],
                                     "snapshot", base), 201)
        if rest == ["fork"] and m == "POST":
            count = _strict(obj if obj is not None else {}, FORK_FIELDS).get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 64:
                raise ApiError(400, "bad_request", '"count" must be 1..64')
            body = {"image": rec["image"], "labels": rec["labels"], "ttl_s": rec["ttl_s"],
                    "user": rec["user"], "workdir": rec["workdir"], **rec["limits"]}
            kids = [edge.add_sandbox(body) for _ in range(count)]
            with edge.lock:
                for k in kids:
                    for key, v in list(edge.files.items()):
                        if key[0] == sid:
                            edge.files[(k["id"], key[1])] = v
            return ok({"sandboxes": kids}, 201)
        if rest == ["stats"]:
            return ok({"cpu_time_ms": 1.5, "memory_current": 1, "memory_peak": 2,
                       "memory_limit": 3, "disk_used": 0, "disk_limit": 4,
                       "disk_kind": "tmpfs", "pids": 1, "oom_kills": 0,
                       "exec_count": edge.exec_count})
        if rest == ["signal"]:
            _strict(obj, SIGNAL_FIELDS)
            return ok({"signaled": 3})
        if rest == ["exec"]:
            result = self.run_exec(edge, sid, _strict(obj, EXEC_FIELDS))
            if obj.get("background"):
                eid = f"ex-{uuid.uuid4().hex[:6]}"
                delay = float(obj["cmd"][1]) if obj.get("cmd", [""])[0] == "sleep" else 0.0
                with edge.lock:
                    edge.execs[(sid, eid)] = (time.monotonic() + delay, result)
                return ok({"exec_id": eid}, 202)
            return ok(result)
        if rest[:1] == ["execs"] and len(rest) == 3 and rest[2] == "kill" and m == "POST":
            with edge.lock:
                ent = edge.execs.get((sid, rest[1]))
                if ent is None:
                    raise ApiError(404, "not_found", "no such exec")
                done_at, result = ent
                if done_at > time.monotonic():  # killed: ends now, by SIGKILL
                    result = dict(result, exit_code=137, signal=9)
                    edge.execs[(sid, rest[1])] = (time.monotonic() + edge.kill_lag_s, result)
                    if edge.kill_lag_s:
                        return ok({"exec_id": rest[1], "state": "running", "started_at": 0,
                                   "result": None})
            return ok({"exec_id": rest[1], "state": "exited", "started_at": 0,
                       "result": result})
        if rest[:1] == ["execs"] and len(rest) == 2:
            with edge.lock:
                ent = edge.execs.get((sid, rest[1]))
            if ent is None:
                raise ApiError(404, "not_found", "no such exec")
            if m == "DELETE":
                with edge.lock:
                    edge.execs.pop((sid, rest[1]), None)
                return empty
            done_at, result = ent
            left = done_at - time.monotonic()
            wait = int(q.get("wait_ms", 0)) / 1000
            if left > 0 and wait:
                time.sleep(min(left, wait))
                left = done_at - time.monotonic()
            done = left <= 0
            return ok({"exec_id": rest[1], "state": "exited" if done else "running",
                       "started_at": 0, "result": result if done else None})
        if rest == ["shells"] and m == "POST":
            _strict(obj, SHELL_OPEN_FIELDS)
            shid = f"sh-{uuid.uuid4().hex[:6]}"
            with edge.lock:
                edge.shells[(sid, shid)] = rec["workdir"]
            return ok({"shell_id": shid}, 201)
        if rest[:1] == ["shells"] and len(rest) >= 2:
            skey = (sid, rest[1])
            with edge.lock:
                cwd = edge.shells.get(skey)
            if cwd is None:
                raise ApiError(404, "not_found", "no such shell")
            if m == "DELETE" and len(rest) == 2:
                with edge.lock:
                    edge.shells.pop(skey, None)
                return empty
            if rest[2:] == ["run"] and m == "POST":
                cmd = _strict(obj, SHELL_RUN_FIELDS)["command"]
                out, code = "", 0
                if cmd.startswith("cd "):
                    cwd = cmd[3:].strip()
                elif cmd == "pwd":
                    out = cwd + "\n"
                elif cmd == "exit":
                    with edge.lock:
                        edge.shells.pop(skey, None)
                else:
                    out = cmd + "\n"
                with edge.lock:
                    if cmd != "exit":
                        edge.shells[skey] = cwd
                return ok(self.result(out.encode(), b"", code, obj.get("encoding")))
        if rest[:1] == ["files"]:
            return self.files(edge, s, sid, rest[1:], q)
        if rest == ["archive"]:
            key = (sid, q["path"])
            if m == "PUT":
                if s.headers.get("content-type") != "application/x-tar":
                    raise ApiError(400, "bad_request", "want a tar")
                tarfile.open(fileobj=io.BytesIO(s.body)).getmembers()  # must parse
                with edge.lock:
                    edge.archives[key] = s.body
                return empty
            with edge.lock:
                data = edge.archives.get(key)
            if data is None:
                raise ApiError(404, "not_found", "no archive")
            return (200, data, "application/x-tar", {})
        raise ApiError(404, "not_found", "no route")

    def files(self, edge, s, sid, rest, q):
        m = s.method
        path = q.get("path", "")
        if not path.startswith("/"):
            raise ApiError(400, "bad_request", "path must be absolute")
        empty = (204, b"", "application/json", {})
        ok = lambda data: (200, json.dumps(data).encode(), "application/json", {})
        with edge.lock:
            ent = edge.files.get((sid, path))
        if not rest and m == "PUT":
            with edge.lock:
                edge.files[(sid, path)] = (s.body, int(q.get("mode", "0644"), 8), "file")
            return empty
        if not rest and m == "GET":
            if ent is None:
                raise ApiError(404, "not_found", f"{path} not found")
            if "max_bytes" in q and len(ent[0]) > int(q["max_bytes"]):
                raise ApiError(413, "too_large", "file too large")
            return (200, ent[0], "application/octet-stream", {})
        if not rest and m == "DELETE":
            with edge.lock:
                victims = [k for k in edge.files if k[0] == sid and
                           (k[1] == path or (q.get("recursive") == "1"
                                             and k[1].startswith(path.rstrip("/") + "/")))]
                for k in victims:
                    del edge.files[k]
            if not victims:
                raise ApiError(404, "not_found", f"{path} not found")
            return empty
        if rest == ["mkdir"] and m == "POST":
            if s.body:
                raise ApiError(400, "bad_request", "no body expected")
            with edge.lock:
                edge.files[(sid, path)] = (b"", int(q.get("mode", "0755"), 8), "dir")
            return empty
        if rest == ["stat"]:
            if ent is None:
                raise ApiError(404, "not_found", f"{path} not found")
            return ok(self.entry(path, ent))
        if rest == ["list"]:
            prefix = path.rstrip("/") + "/"
            with edge.lock:
                items = [(k[1], v) for k, v in edge.files.items()
                         if k[0] == sid and k[1].startswith(prefix) and "/" not in k[1][len(prefix):]]
            return ok({"entries": [self.entry(p, v) for p, v in sorted(items)]})
        raise ApiError(404, "not_found", "no route")

    def import_image(self, edge, s):
        """Like the edge, as far as a fake can: the body must be a tar (gzip is
        fine), an OCI layout for format=oci, a docker save for docker."""
        q = dict(s.query)
        unknown = {k for k, _ in s.query} - IMPORT_QUERY
        if unknown:
            raise ApiError(400, "bad_request", f"unknown parameters {sorted(unknown)}")
        if "name" not in q:
            raise ApiError(400, "bad_request", '"name" is required')
        name = edge.image_name(q["name"])
        fmt = q.get("format", "auto")
        if fmt not in ("auto", "rootfs", "oci", "docker") \
                or q.get("layer_format", "dir") not in ("dir", "erofs") \
                or q.get("base", "host") != "host":
            raise ApiError(400, "bad_request", "bad format, layer_format or base")
        with edge.lock:
            edge.imports.append((q, s.body, s.headers))
        if len(s.body) > edge.max_import_bytes:
            raise ApiError(413, "too_large", "the archive is over the import limit")
        try:
            with tarfile.open(fileobj=io.BytesIO(s.body), mode="r:*") as tar:
                members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError):
            raise ApiError(400, "bad_request", "not a tar, tar.gz or tar.zst archive") from None
        names = {m.name.rstrip("/") for m in members}
        if any(m.name.startswith("/") or ".." in m.name.split("/") for m in members):
            raise ApiError(400, "bad_request", "an entry escapes the root")
        if fmt == "auto":
            fmt = "oci" if "index.json" in names else \
                "docker" if "manifest.json" in names else "rootfs"
        if (fmt == "oci") != ("index.json" in names) and fmt != "docker":
            raise ApiError(400, "bad_request", f"not a {fmt} archive")
        layer = dict(_layer(s.body, sum(m.size for m in members if m.isfile())),
                     format=q.get("layer_format", "dir"))
        return edge.add_image(name, [layer], "import", q.get("base"))

    @staticmethod
    def entry(path, ent):
        return {"name": path.rsplit("/", 1)[-1], "type": ent[2], "size": len(ent[0]),
                "mode": ent[1], "mtime": 1764480000000}

    # -- exec --------------------------------------------------------------

    @staticmethod
    def result(out: bytes, err: bytes, code: int, encoding, **extra):
        enc = (lambda b: base64.b64encode(b).decode()) if encoding == "base64" else \
            (lambda b: b.decode("utf-8", "replace"))
        res = {"exit_code": code, "signal": None, "stdout": enc(out), "stderr": enc(err),
               "stdout_truncated": False, "stderr_truncated": False, "timed_out": False,
               "oom_killed": False, "duration_ms": 2.5, "stdout_bytes": len(out),
               "stderr_bytes": len(err), "encoding": encoding or "utf-8"}
        res.update(extra)
        return res

    def fncall(self, edge, obj):
        """Echoes: stdout is the code, stderr is stdin; the decoded inputs are
        kept in edge.fncalls. Code "exit N" exits N."""
        with edge.lock:
            pool = edge.pools.get(obj.get("runtime"))
        if pool is None or pool["kind"] != "fncall":
            raise ApiError(404, "not_found", f'no fncall runtime "{obj.get("runtime")}"')
        if obj.get("memory_mb", 0) > pool["memory_mb"]:
            raise ApiError(400, "bad_request", f'"memory_mb" must be at most {pool["memory_mb"]}')

        def decode(text):
            try:
                return base64.b64decode(text, validate=True)
            except ValueError:
                raise ApiError(400, "bad_request", "not valid base64") from None

        stdin = obj.get("stdin", "")
        stdin = decode(stdin) if obj.get("stdin_encoding") == "base64" else stdin.encode()
        files = {}
        for name, content in (obj.get("files") or {}).items():
            files[name] = decode(content["base64"]) if isinstance(content, dict) \
                else content.encode()
        code = obj["code"]
        with edge.lock:
            edge.exec_count += 1
            pool["calls"] += 1
            edge.fncalls.append((obj["runtime"], code, stdin, files))
        rc = int(code[5:]) if code.startswith("exit ") else 0
        return self.result(code.encode(), stdin, rc, obj.get("encoding"),
                           runtime=obj["runtime"], queue_ms=0.5)

    def run_exec(self, edge, sid, obj):
        """echo ARGS / cat (stdin to stdout) / false / bytes / anything else:
        argv echoed on stderr. A shell string is echoed on stdout."""
        if ("cmd" in obj) == ("shell" in obj):
            raise ApiError(400, "bad_request", "cmd xor shell")
        with edge.lock:
            edge.exec_count += 1
        stdin = obj.get("stdin", "")
        stdin_b = base64.b64decode(stdin) if obj.get("stdin_encoding") == "base64" \
            else stdin.encode()
        enc = obj.get("encoding")
        if "shell" in obj:
            return self.result(obj["shell"].encode() + b"\n", b"", 0, enc)
        argv = obj["cmd"]
        if argv[0] == "echo":
            return self.result(" ".join(argv[1:]).encode() + b"\n", b"", 0, enc)
        if argv[0] == "cat":
            return self.result(stdin_b, b"", 0, enc)
        if argv[0] == "false":
            return self.result(b"", b"", 1, enc)
        if argv[0] == "bytes":
            return self.result(b"\x00\xff\xfe\n", b"\x80", 0, enc)
        if argv[0] == "env":
            return self.result(json.dumps([obj.get("env"), obj.get("cwd"), obj.get("user")])
                               .encode(), b"", 0, enc)
        return self.result(b"", json.dumps(argv).encode(), 0, enc)

    def stream_exec(self, edge, seen, obj):
        """["stream", N]: N output lines alternating stdout/stderr. After the
        first line the server waits for edge.stream_gate (recording progress
        in edge.stream_progress), so a test can prove the client got line 1
        while line 2 was not sent yet; without the gate it would time out.
        ["stream-error"]: one line, then an error line."""
        _strict(obj, EXEC_FIELDS)
        argv = obj["cmd"]
        b64 = obj.get("encoding") == "base64"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def line(d):
            self.check("stream line", SPEC.validate, "ExecStreamEvent", d)
            self.write_chunk(json.dumps(d).encode() + b"\n")

        def text(s):
            return base64.b64encode(s.encode()).decode() if b64 else s

        if argv[0] == "stream-error":
            line({"stdout": text("partial\n")})
            line({"error": {"code": "internal", "message": "agent died"}})
            return self.end_chunks()
        n = int(argv[1])
        for i in range(n):
            kind = "stdout" if i % 2 == 0 else "stderr"
            event = {kind: text(f"line{i}\n")}
            self.check("stream line", SPEC.validate, "ExecStreamEvent", event)
            payload = json.dumps(event).encode() + b"\n"
            if i == 1:
                edge.stream_progress.append("waiting")
                edge.stream_progress.append("gate" if edge.stream_gate.wait(5) else "gate-timeout")
            edge.stream_progress.append(f"send{i}")
            # Split one line over two chunks: the client must reassemble it.
            self.write_chunk(payload[:5])
            self.write_chunk(payload[5:])
        ex = {k: v for k, v in self.result(b"", b"", 0, None).items()
              if k not in ("stdout", "stderr")}
        line({"exit": ex})
        self.end_chunks()


class _QuietErrors:
    def handle_error(self, request, client_address):
        # Clients that drop connections (timeouts, streams closed early) are
        # part of the tests; anything else is a bug in the fake, reported by
        # the fixtures.
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            self.edge.server_errors.append(repr(exc))


class _TCPServer(_QuietErrors, http.server.ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close(): tests prove nothing leaks
    block_on_close = True
    request_queue_size = 128  # the default backlog of 5 stalls bursts of connects
    tcp = True


class _UnixServer(_QuietErrors, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128
    tcp = False

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("unix", 0)  # BaseHTTPRequestHandler wants a (host, port)


class FakeEdgeServer:
    """Runs an Edge on 127.0.0.1:<free port> or on a unix socket in a thread."""

    def __init__(self, edge: Edge | None = None, unix_path: str | None = None) -> None:
        self.edge = edge or Edge()
        if unix_path:
            self.httpd = _UnixServer(unix_path, Handler)
            self.url = f"unix://{unix_path}"
        else:
            self.httpd = _TCPServer(("127.0.0.1", 0), Handler)
            self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.httpd.edge = self.edge
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, name="fake-edge")
        self.thread.start()

    def close(self) -> None:
        self.edge.stream_gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()  # joins every handler thread
        self.thread.join()
