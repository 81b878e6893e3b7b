"""Plain data types exchanged with the DSec API."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

__all__ = ["DSecContainerRunArgs", "ExecResult", "FnCallResult", "ExecEvent", "FileEntry"]

Output = Union[str, bytes]


@dataclass
class DSecContainerRunArgs:
    """What to create: the body of ``POST /v1/sandboxes``.

    Field names follow the SDK shape in the API contract; :meth:`to_body` maps
    them to the wire names (``cpu_cores_limit`` -> ``cpu``, ``ttl_running_stop``
    -> ``ttl_s``, ``network_rules`` -> ``network``, ...). ``None`` fields are
    omitted so the node's defaults apply. Sizes are MiB, times seconds.
    """

    container_image: str = "host"
    cpu_cores_limit: float = 1.0
    memory_limit_mb: int = 512
    pids_limit: int = 256
    disk_limit_mb: int = 256
    ttl_running_stop: int = 3600
    idle_ttl_s: int = 0
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    network_rules: dict[str, Any] | None = None
    kind: str = "container"

    def to_body(self) -> dict[str, Any]:
        """The JSON body for ``POST /v1/sandboxes`` (without count/request_id)."""
        body: dict[str, Any] = {
            "kind": self.kind,
            "image": self.container_image,
            # The edge's strict parser wants a float for cpu and ints for the
            # rest; coercing here lets callers write cpu_cores_limit=1.
            "cpu": None if self.cpu_cores_limit is None else float(self.cpu_cores_limit),
            "memory_mb": _opt_int(self.memory_limit_mb),
            "pids": _opt_int(self.pids_limit),
            "disk_mb": _opt_int(self.disk_limit_mb),
            "ttl_s": _opt_int(self.ttl_running_stop),
            "idle_ttl_s": _opt_int(self.idle_ttl_s),
            "user": self.user,
            "workdir": self.workdir,
            "env": dict(self.env) if self.env is not None else None,
            "labels": dict(self.labels) if self.labels is not None else None,
            "network": dict(self.network_rules) if self.network_rules is not None else None,
        }
        return {k: v for k, v in body.items() if v is not None}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass
class ExecResult:
    """The outcome of a command (exec, shell run, fncall, background exec).

    ``stdout``/``stderr`` are ``str`` for ``encoding="utf-8"`` results (invalid
    UTF-8 was replaced by the server) and ``bytes`` for binary (base64) results.
    ``exit_code`` is ``128 + signal`` when a signal ended the command.
    ``stdout_bytes``/``stderr_bytes`` count everything the command wrote, including
    what was cut off by ``max_output_bytes`` (then ``*_truncated`` is true).
    ``raw`` keeps the server's JSON.
    """

    exit_code: int
    stdout: Output = ""
    stderr: Output = ""
    signal: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], binary: bool | None = None) -> "ExecResult":
        """Build from an exec result object.

        Output is decoded as base64 when the object says ``"encoding": "base64"``
        or ``binary`` is true; ``binary`` also turns text output into bytes so a
        caller that asked for bytes always gets bytes.
        """
        return cls(**_exec_fields(d, binary))


@dataclass
class FnCallResult(ExecResult):
    """The outcome of a function call: an :class:`ExecResult` plus the
    ``runtime`` that ran it and ``queue_ms``, the time it waited for a worker."""

    runtime: str = ""
    queue_ms: float = 0.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any], binary: bool | None = None) -> "FnCallResult":
        return cls(**_exec_fields(d, binary), runtime=str(d.get("runtime", "")),
                   queue_ms=float(d.get("queue_ms", 0.0) or 0.0))


def _exec_fields(d: Mapping[str, Any], binary: bool | None) -> dict[str, Any]:
    base64_out = d.get("encoding") == "base64"
    if binary is None:
        binary = base64_out
    return dict(
        exit_code=int(d.get("exit_code", -1)),
        stdout=_decode_output(d.get("stdout", ""), base64_out, binary),
        stderr=_decode_output(d.get("stderr", ""), base64_out, binary),
        signal=d.get("signal"),
        stdout_truncated=bool(d.get("stdout_truncated", False)),
        stderr_truncated=bool(d.get("stderr_truncated", False)),
        timed_out=bool(d.get("timed_out", False)),
        oom_killed=bool(d.get("oom_killed", False)),
        duration_ms=float(d.get("duration_ms", 0.0) or 0.0),
        stdout_bytes=int(d.get("stdout_bytes", 0) or 0),
        stderr_bytes=int(d.get("stderr_bytes", 0) or 0),
        raw=dict(d),
    )


def _decode_output(value: Any, is_base64: bool, want_bytes: bool) -> Output:
    if value is None:
        value = ""
    if is_base64:
        data = base64.b64decode(value)
        return data if want_bytes else data.decode("utf-8", "replace")
    return value.encode("utf-8") if want_bytes else value


@dataclass
class ExecEvent:
    """One event of a streamed exec.

    ``kind`` is ``"stdout"`` or ``"stderr"`` with ``data`` holding that piece of
    output (``str``, or ``bytes`` with ``binary=True``), or ``"exit"`` (always the
    last event) with ``result`` holding the :class:`ExecResult`, whose
    stdout/stderr are the concatenation of all the pieces received.
    """

    kind: Literal["stdout", "stderr", "exit"]
    data: Output = ""
    result: ExecResult | None = None


@dataclass
class FileEntry:
    """A directory entry or stat result.

    ``type`` is one of ``file dir symlink fifo socket char block other``;
    ``mode`` holds the permission bits (``0o644``); ``mtime`` is ms since the epoch.
    """

    name: str
    type: str
    size: int = 0
    mode: int = 0
    mtime: int = 0

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FileEntry":
        return cls(
            name=str(d.get("name", "")),
            type=str(d.get("type", "other")),
            size=int(d.get("size", 0) or 0),
            mode=int(d.get("mode", 0) or 0),
            mtime=int(d.get("mtime", 0) or 0),
        )
