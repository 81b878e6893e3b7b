"""Request builders and response decoders shared by DSecClient and
AsyncDSecClient, so the two differ only in how they send."""

from __future__ import annotations

import base64
import copy
import dataclasses
import io
import json
import os
from typing import Any, Mapping, Sequence, Union
from urllib.parse import quote

from . import _upload
from ._http import Request, json_request, raw_request, seg, stream_request
from .errors import DSecError, error_from_stream_line
from .models import ExecEvent, ExecResult, FileEntry, Image, SandboxSpec, spec_fields

Cmd = Union[str, Sequence[str]]
Stdin = Union[str, bytes, bytearray, memoryview]


def sb_path(sandbox_id: str, *rest: str) -> str:
    return "/v1/sandboxes/" + seg(sandbox_id) + "".join("/" + r for r in rest)


def wait_s(ms: int | float | None) -> float | None:
    """Client-side allowance for a server-side wait of ``ms`` (0/None = unbounded)."""
    if not ms:
        return None
    return ms / 1000.0


# -- sandboxes ---------------------------------------------------------------


def sandbox_spec(spec: SandboxSpec | None, fields: Mapping[str, Any], where: str) -> SandboxSpec:
    """What a create method was given: ``spec`` with the keyword ``fields``
    (the API's names) set on a copy, or a SandboxSpec of those fields.
    Deprecated names warn as the caller's caller's; unknown ones raise TypeError."""
    if not fields:
        return spec if spec is not None else SandboxSpec()
    fields = spec_fields(fields, where, 3, None if spec is None else type(spec))
    if spec is None:
        return SandboxSpec(**fields)
    spec = copy.copy(spec)  # not dataclasses.replace: a subclass may have its own __init__
    for key, value in fields.items():
        setattr(spec, key, value)
    return spec


def create(args: SandboxSpec, count: int | None, request_id: str | None,
           wait: bool) -> Request:
    body = args.to_body()
    if count is not None:
        body["count"] = int(count)
    # Creating may queue behind other creates on a busy node; allow for it.
    return json_request("POST", "/v1/sandboxes", body, request_id=request_id,
                        query=None if wait else [("wait", "0")], extra_wait=60.0)


def created_records(data: Any, count: int | None) -> list[dict[str, Any]]:
    if count is None:
        return [data]
    return list(data["sandboxes"])


def list_query(labels: Mapping[str, str] | None, state: str | None, kind: str | None,
               page_size: int, cursor: str | None) -> list[tuple[str, Any]]:
    q: list[tuple[str, Any]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
    q += [("state", state), ("kind", kind), ("limit", int(page_size)), ("cursor", cursor)]
    return q


def list_page(query: list[tuple[str, Any]]) -> Request:
    return json_request("GET", "/v1/sandboxes", query=query, mutating=False)


def get(sandbox_id: str) -> Request:
    return json_request("GET", sb_path(sandbox_id), mutating=False)


def delete(sandbox_id: str, request_id: str | None) -> Request:
    return json_request("DELETE", sb_path(sandbox_id), request_id=request_id,
                        gone_on_retry_ok=True)


def patch(sandbox_id: str, fields: Mapping[str, Any], request_id: str | None) -> Request:
    body = {k: v for k, v in fields.items() if v is not None}
    return json_request("PATCH", sb_path(sandbox_id), body, request_id=request_id)


def lifecycle(sandbox_id: str, action: str, request_id: str | None) -> Request:
    return json_request("POST", sb_path(sandbox_id, action), request_id=request_id)


def stats(sandbox_id: str) -> Request:
    return json_request("GET", sb_path(sandbox_id, "stats"), mutating=False)


def port_urls(sandbox_id: str, port: int, ttl_s: int) -> Request:
    # Each call signs a new URL: nothing to deduplicate, safe to retry.
    return json_request("POST", sb_path(sandbox_id, "port-urls"), {"port": port, "ttl_s": ttl_s},
                        mutating=False)


def signal(sandbox_id: str, sig: str | int, request_id: str | None) -> Request:
    return json_request("POST", sb_path(sandbox_id, "signal"), {"signal": sig},
                        request_id=request_id)


def snapshot(sandbox_id: str, image: str, request_id: str | None,
             keep_setuid: bool = False) -> Request:
    body = {"image": image}
    if keep_setuid:
        body["keep_setuid"] = True
    # Capturing a large writable layer takes a while.
    return json_request("POST", sb_path(sandbox_id, "snapshot"), body,
                        request_id=request_id, extra_wait=300.0)


def fork(sandbox_id: str, count: int, request_id: str | None,
         keep_setuid: bool = False, memory: bool = False) -> Request:
    count = int(count)
    if count < 1:
        raise ValueError("count must be at least 1")
    body = {"count": count}
    if keep_setuid:
        body["keep_setuid"] = True
    if memory:
        body["memory"] = True
    # Like a create of `count` sandboxes, plus copying the writable layer.
    return json_request("POST", sb_path(sandbox_id, "fork"), body,
                        request_id=request_id, extra_wait=120.0)


def job(action: str, job_name: str, request_id: str | None) -> Request:
    path = "/v1/jobs/" + seg(job_name)
    if action == "delete":
        return json_request("DELETE", path, request_id=request_id)
    return json_request("POST", f"{path}/{action}", request_id=request_id)


def preempt_job(job_name: str, others: str, request_id: str | None) -> Request:
    return json_request("POST", "/v1/jobs/" + seg(job_name) + "/preempt", {"others": others},
                        request_id=request_id, extra_wait=60.0)


# -- trajectories --------------------------------------------------------------


def trajectory(tid: str, branch: int | None) -> Request:
    q = None if branch is None else [("branch", int(branch))]
    return json_request("GET", "/v1/trajectories/" + seg(tid), query=q, mutating=False)


def resume_trajectory(tid: str, branch: int | None, fields: Mapping[str, Any],
                      request_id: str | None) -> Request:
    body = {k: v for k, v in fields.items() if v is not None}
    unknown = set(body) - {"ttl_s", "idle_ttl_s", "labels"}
    if unknown:
        raise TypeError(f"resume_trajectory() got unexpected keyword arguments {sorted(unknown)}")
    if branch is not None:
        body["branch"] = int(branch)
    return json_request("POST", "/v1/trajectories/" + seg(tid) + "/resume", body,
                        request_id=request_id, extra_wait=60.0)


def delete_trajectory(tid: str, request_id: str | None) -> Request:
    return json_request("DELETE", "/v1/trajectories/" + seg(tid), request_id=request_id)


# -- exec --------------------------------------------------------------------


def encode_stdin(stdin: Stdin | None) -> tuple[str, str | None]:
    """Return (text, stdin_encoding): UTF-8 goes as is, other bytes as base64."""
    if stdin is None:
        return "", None
    if isinstance(stdin, str):
        return stdin, None
    data = bytes(stdin)
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def exec_body(cmd: Cmd, stdin: Stdin | None, env: Mapping[str, str] | None,
              cwd: str | None, user: str | None, timeout_ms: int,
              max_output_bytes: int, binary: bool, grader: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if grader:
        # Kills every process in the sandbox first, then runs as a uid of its own with a
        # clean environment (API.md "grader").
        if user is not None:
            raise ValueError("a grader exec runs as its own user: do not pass user")
        body["grader"] = True
    if isinstance(cmd, str):
        body["shell"] = cmd
    else:
        argv = [os.fspath(a) for a in cmd]
        if not argv:
            raise ValueError("cmd must not be empty")
        body["cmd"] = argv
    text, stdin_encoding = encode_stdin(stdin)
    if text:
        body["stdin"] = text
        if stdin_encoding:
            body["stdin_encoding"] = stdin_encoding
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    body["timeout_ms"] = int(timeout_ms)
    body["max_output_bytes"] = int(max_output_bytes)
    body["encoding"] = "base64" if binary else "utf-8"
    return body


def exec_request(sandbox_id: str, body: dict[str, Any], *, stream: bool = False,
                 background: bool = False, request_id: str | None = None) -> Request:
    if background:
        body = dict(body, background=True)
        extra = 0.0
    else:
        extra = wait_s(body.get("timeout_ms"))
    return json_request("POST", sb_path(sandbox_id, "exec"), body, request_id=request_id,
                        query=[("stream", "1")] if stream else None, extra_wait=extra)


def exec_status(sandbox_id: str, exec_id: str, wait_ms: int) -> Request:
    return json_request("GET", sb_path(sandbox_id, "execs", seg(exec_id)),
                        query=[("wait_ms", int(wait_ms))] if wait_ms else None,
                        mutating=False, extra_wait=wait_ms / 1000.0)


def exec_output(sandbox_id: str, exec_id: str, stdout_offset: int | None,
                stderr_offset: int | None, wait_ms: int, max_bytes: int | None) -> Request:
    query: list[tuple[str, Any]] = []
    if stdout_offset is not None:
        query.append(("stdout_offset", int(stdout_offset)))
    if stderr_offset is not None:
        query.append(("stderr_offset", int(stderr_offset)))
    if wait_ms:
        query.append(("wait_ms", int(wait_ms)))
    if max_bytes is not None:
        query.append(("max_bytes", int(max_bytes)))
    return json_request("GET", sb_path(sandbox_id, "execs", seg(exec_id)), query=query,
                        mutating=False, extra_wait=wait_ms / 1000.0)


def exec_kill(sandbox_id: str, exec_id: str, request_id: str | None) -> Request:
    # Answers once the exec is gone, with its final status (its result included).
    return json_request("POST", sb_path(sandbox_id, "execs", seg(exec_id), "kill"),
                        request_id=request_id)


def exec_forget(sandbox_id: str, exec_id: str, request_id: str | None) -> Request:
    return json_request("DELETE", sb_path(sandbox_id, "execs", seg(exec_id)),
                        request_id=request_id, gone_on_retry_ok=True)


class ExecStreamDecoder:
    """Turns the NDJSON bytes of ``POST .../exec?stream=1`` into ExecEvents.

    Feed it chunks as they arrive; it keeps a partial trailing line for the
    next chunk (a JSON line never contains a raw newline, so splitting on
    ``\\n`` is exact). The exit event's result carries all output received.
    A final ``{"error": ...}`` line raises the matching DSecError.
    """

    def __init__(self, binary: bool) -> None:
        self.binary = binary
        self.finished = False
        self._partial = b""
        self._out: list[Any] = []
        self._err: list[Any] = []

    def feed(self, chunk: bytes) -> list[ExecEvent]:
        events = []
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        return events

    def close(self) -> list[ExecEvent]:
        """Call at the end of the body; raises if no exit event arrived."""
        events = []
        if self._partial.strip():
            ev = self._line(self._partial)
            self._partial = b""
            if ev is not None:
                events.append(ev)
        if not self.finished:
            raise DSecError("unavailable", "exec stream ended before its exit event", None)
        return events

    def _text(self, value: Any) -> Any:
        value = value if isinstance(value, str) else ""
        return base64.b64decode(value) if self.binary else value

    def _line(self, line: bytes) -> ExecEvent | None:
        line = line.strip()
        if not line or self.finished:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            raise DSecError("internal", f"bad line in exec stream: {line[:80]!r}", None) from None
        if not isinstance(obj, dict):
            return None
        if "stdout" in obj:
            data = self._text(obj["stdout"])
            self._out.append(data)
            return ExecEvent("stdout", data)
        if "stderr" in obj:
            data = self._text(obj["stderr"])
            self._err.append(data)
            return ExecEvent("stderr", data)
        if "exit" in obj:
            self.finished = True
            fields = {k: v for k, v in dict(obj["exit"]).items()
                      if k not in ("stdout", "stderr", "encoding")}
            joiner = b"" if self.binary else ""
            result = dataclasses.replace(
                ExecResult.from_json(fields),
                stdout=joiner.join(self._out),
                stderr=joiner.join(self._err),
            )
            return ExecEvent("exit", result=result)
        if "error" in obj:
            self.finished = True
            raise error_from_stream_line(obj["error"] if isinstance(obj["error"], dict) else {})
        return None  # an event kind this SDK does not know yet


# -- shells ------------------------------------------------------------------


def shell_open(sandbox_id: str, user: str | None, request_id: str | None) -> Request:
    return json_request("POST", sb_path(sandbox_id, "shells"), {"user": user},
                        request_id=request_id)


def shell_run(sandbox_id: str, shell_id: str, command: str, timeout_ms: int,
              max_output_bytes: int, binary: bool, request_id: str | None) -> Request:
    body = {"command": command, "timeout_ms": int(timeout_ms),
            "max_output_bytes": int(max_output_bytes),
            "encoding": "base64" if binary else "utf-8"}
    return json_request("POST", sb_path(sandbox_id, "shells", seg(shell_id), "run"), body,
                        request_id=request_id, extra_wait=wait_s(timeout_ms))


def shell_close(sandbox_id: str, shell_id: str, request_id: str | None) -> Request:
    return json_request("DELETE", sb_path(sandbox_id, "shells", seg(shell_id)),
                        request_id=request_id, gone_on_retry_ok=True)


# -- files -------------------------------------------------------------------


def octal(mode: int) -> str:
    return format(int(mode) & 0o7777, "04o")


def to_bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def file_write(sandbox_id: str, path: str, data: bytes | str, mode: int,
               request_id: str | None) -> Request:
    return raw_request("PUT", sb_path(sandbox_id, "files"), to_bytes(data),
                       "application/octet-stream",
                       query=[("path", path), ("mode", octal(mode))], request_id=request_id)


def file_read(sandbox_id: str, path: str, max_bytes: int | None) -> Request:
    return json_request("GET", sb_path(sandbox_id, "files"), mutating=False,
                        query=[("path", path), ("max_bytes", max_bytes)])


def file_list(sandbox_id: str, path: str) -> Request:
    return json_request("GET", sb_path(sandbox_id, "files", "list"), mutating=False,
                        query=[("path", path)])


def file_stat(sandbox_id: str, path: str) -> Request:
    return json_request("GET", sb_path(sandbox_id, "files", "stat"), mutating=False,
                        query=[("path", path)])


def file_remove(sandbox_id: str, path: str, recursive: bool, request_id: str | None) -> Request:
    return json_request("DELETE", sb_path(sandbox_id, "files"), request_id=request_id,
                        query=[("path", path), ("recursive", "1" if recursive else None)])


def file_mkdir(sandbox_id: str, path: str, mode: int, request_id: str | None) -> Request:
    return json_request("POST", sb_path(sandbox_id, "files", "mkdir"), request_id=request_id,
                        query=[("path", path), ("mode", octal(mode))])


def archive_put(sandbox_id: str, remote_dir: str, tar_bytes: bytes,
                request_id: str | None) -> Request:
    req = raw_request("PUT", sb_path(sandbox_id, "archive"), tar_bytes, "application/x-tar",
                      query=[("path", remote_dir)], request_id=request_id)
    req.extra_wait = 60.0  # extracting a large tree takes a while
    return req


def archive_get(sandbox_id: str, remote_dir: str) -> Request:
    return json_request("GET", sb_path(sandbox_id, "archive"), mutating=False,
                        query=[("path", remote_dir)], extra_wait=60.0)


def entries(data: Any) -> list[FileEntry]:
    return [FileEntry.from_json(e) for e in data.get("entries", [])]


# -- function calls ----------------------------------------------------------


def _b64(data: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def fncall_body(runtime: str, code: str, stdin: Stdin | None,
                files: Mapping[str, str | bytes] | None, timeout_ms: int | None,
                memory_mb: int | None, max_output_bytes: int | None, filename: str | None,
                binary: bool) -> dict[str, Any]:
    """The body of ``POST /v1/fncalls``; ``None`` leaves a field to the server's
    default. Bytes (stdin, file contents) travel base64-encoded."""
    body: dict[str, Any] = {"runtime": runtime, "code": code}
    if filename is not None:
        body["filename"] = filename
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif stdin is not None:
        body["stdin"] = _b64(stdin)
        body["stdin_encoding"] = "base64"
    if files is not None:
        wire: dict[str, Any] = {}
        for name, content in files.items():
            if isinstance(content, str):
                wire[name] = content
            elif isinstance(content, (bytes, bytearray, memoryview)):
                wire[name] = {"base64": _b64(content)}
            else:
                raise TypeError(f"file {name!r}: content must be str or bytes, "
                                f"not {type(content).__name__}")
        body["files"] = wire
    for key, value in (("timeout_ms", timeout_ms), ("memory_mb", memory_mb),
                       ("max_output_bytes", max_output_bytes)):
        if value is not None:
            body[key] = int(value)
    if binary:
        body["encoding"] = "base64"
    return body


def fncall(body: dict[str, Any], request_id: str | None) -> Request:
    # The base timeout also covers the wait for a worker (a pool's queue_timeout_ms, 10 s by
    # default); the call's own timeout (5 s when not given) comes on top.
    return json_request("POST", "/v1/fncalls", body, request_id=request_id,
                        extra_wait=wait_s(body.get("timeout_ms", 5000)))


# -- pools -------------------------------------------------------------------


def pool_path(name: str) -> str:
    return "/v1/pools/" + seg(name)


def pool_put(name: str, config: Mapping[str, Any], request_id: str | None) -> Request:
    body = {k: v for k, v in config.items() if v is not None}
    # A new pool's first workers start in the background: the reply does not wait for them.
    return json_request("PUT", pool_path(name), body, request_id=request_id)


def pool_delete(name: str, request_id: str | None) -> Request:
    return json_request("DELETE", pool_path(name), request_id=request_id,
                        gone_on_retry_ok=True)


# -- images ------------------------------------------------------------------

IMPORT_FORMATS = ("auto", "rootfs", "oci", "docker")


def image_path(name: str) -> str:
    # ':' is valid in a path segment and keeps "debian:bookworm" readable.
    return "/v1/images/" + quote(str(name), safe=":")


def image_get(name: str) -> Request:
    return json_request("GET", image_path(name), mutating=False)


def image_delete(name: str, request_id: str | None) -> Request:
    return json_request("DELETE", image_path(name), request_id=request_id,
                        gone_on_retry_ok=True)


def image_import(name: str, source: Any, format: str, layer_format: str | None,
                 base: str | None, request_id: str | None) -> Request:
    """``POST /v1/images/import``: ``source`` is a path (a directory is sent as
    a rootfs tar packed on the fly), a binary file object, or bytes."""
    if format not in IMPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(IMPORT_FORMATS)}, not {format!r}")
    body: _upload.BodySource
    if isinstance(source, (str, os.PathLike)):
        if os.path.isdir(source):
            if format not in ("auto", "rootfs"):
                raise ValueError(f"{os.fspath(source)!r} is a directory: it is sent as a rootfs "
                                 f"tar, so format must be 'auto' or 'rootfs', not {format!r}")
            format = "rootfs"
            body = _upload.DirTarBody(source)
        else:
            body = _upload.FileBody(source)  # raises FileNotFoundError & co. now
    elif isinstance(source, (bytes, bytearray, memoryview)):
        body = _upload.FileObjBody(io.BytesIO(bytes(source)))
    elif hasattr(source, "read"):
        body = _upload.FileObjBody(source)
    else:
        raise TypeError("import_image takes a path, a binary file object or bytes, "
                        f"not {type(source).__name__}")
    query = [("name", name), ("format", format), ("layer_format", layer_format),
             ("base", base)]
    # The edge unpacks and stores the layers after the last byte: allow for it.
    return stream_request("POST", "/v1/images/import", body, "application/octet-stream",
                          query=query, request_id=request_id, extra_wait=600.0)


def images(data: Any) -> list[Image]:
    return [Image.from_json(i) for i in data.get("images", [])]


# -- image builds ------------------------------------------------------------


def _names(value: Any, what: str, *, one_ok: bool) -> list[str]:
    """A list of non-empty strings; a lone string is one item when ``one_ok``
    (a string is never split into characters)."""
    if isinstance(value, str):
        if not one_ok:
            raise TypeError(f"{what} must be a list of strings, not a string")
        value = [value]
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be a list of strings, not {type(value).__name__}")
    items = list(value)
    if not all(isinstance(x, str) and x for x in items):
        raise TypeError(f"{what} must be a list of non-empty strings")
    return items


def build_body(name: str, base: str | None, from_: str | Sequence[str] | None,
               packages: Sequence[str] | None, run: str | Sequence[str] | None,
               env: Mapping[str, str] | None, workdir: str | None, variant: str | None,
               memory_mb: int | None, disk_mb: int | None,
               timeout_s: int | None) -> dict[str, Any]:
    """The body of ``POST /v1/images/build``; ``None`` leaves a field to the
    node. What only the node can judge (a suite, package names, unknown
    images) it answers with 400/404."""
    if not isinstance(name, str) or not name:
        raise ValueError("name (\"name:tag\") is required")
    if (base is None) == (from_ is None):
        raise ValueError("give either base (\"debian:SUITE\") or from_ (an image or a list "
                         "of images, bottom first)")
    body: dict[str, Any] = {"name": name}
    if base is not None:
        body["base"] = str(base)
    if from_ is not None:
        images = _names(from_, "from_", one_ok=True)
        if not images:
            raise ValueError("from_ must name at least one image")
        body["from"] = images[0] if len(images) == 1 else images
    if packages is not None:
        body["packages"] = _names(packages, "packages", one_ok=False)
    if variant is not None:
        body["variant"] = str(variant)
    if run is not None:
        body["run"] = _names(run, "run", one_ok=True)  # a string is one command
    if env is not None:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if workdir is not None:
        body["workdir"] = str(workdir)
    for key, value in (("memory_mb", memory_mb), ("disk_mb", disk_mb),
                       ("timeout_s", timeout_s)):
        if value is not None:
            body[key] = int(value)
    return body


def build_path(build_id: str, *rest: str) -> str:
    return "/v1/images/builds/" + seg(build_id) + "".join("/" + r for r in rest)


def build_start(body: dict[str, Any], request_id: str | None) -> Request:
    # The node answers at once (202) with the queued build; the work goes on in the background.
    return json_request("POST", "/v1/images/build", body, request_id=request_id)


def build_get(build_id: str) -> Request:
    return json_request("GET", build_path(build_id), mutating=False)


def build_log(build_id: str, offset: int, max_bytes: int | None) -> Request:
    offset = int(offset)
    if offset < 0:
        raise ValueError("offset must not be negative")
    return json_request("GET", build_path(build_id, "log"), mutating=False,
                        query=[("offset", offset),
                               ("max_bytes", None if max_bytes is None else int(max_bytes))])


def build_log_page(data: Any) -> tuple[str, int, bool]:
    """``(text, next_offset, done)`` of a log page. When the node no longer
    keeps the part asked for (it keeps a tail), ``text`` starts later: at
    ``next_offset - len(text.encode())``."""
    return str(data.get("text", "")), int(data.get("next_offset", 0)), bool(data.get("done"))


def build_cancel(build_id: str, request_id: str | None) -> Request:
    return json_request("DELETE", build_path(build_id), request_id=request_id)


# -- misc --------------------------------------------------------------------


# -- quotas (a cluster) --------------------------------------------------------

QUOTA_FIELDS = ("sandboxes", "memory_mb", "cpu", "creates_per_s", "parent")


def quota_path(project: str | None, token: str | None = None, org: bool = False) -> str:
    """``/v1/quota`` (org), ``/v1/projects/{p}/quota`` or ``.../tokens/{name}/quota``."""
    if org:
        if token is not None:
            raise ValueError("org=True and token do not go together")
        return "/v1/quota"
    if not project:
        raise ValueError("name the project: project=... (or DSEC_PROJECT), or org=True")
    path = "/v1/projects/" + seg(project)
    if token is not None:
        path += "/tokens/" + seg(token)
    return path + "/quota"


def quota_patch(path: str, limits: Mapping[str, Any]) -> Request:
    """A PATCH of the limits named (``None`` removes one)."""
    unknown = set(limits) - set(QUOTA_FIELDS)
    if unknown:
        raise ValueError(f"unknown quota field(s) {sorted(unknown)}; known: {QUOTA_FIELDS}")
    if not limits:
        raise ValueError("name a limit to set: " + ", ".join(QUOTA_FIELDS))
    return json_request("PATCH", path, dict(limits))


def simple_get(path: str) -> Request:
    return json_request("GET", path, mutating=False)
