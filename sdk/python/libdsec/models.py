"""Plain data types exchanged with the DSec API."""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence, Union

from . import _compat

__all__ = ["DSecContainerRunArgs", "ExecResult", "FnCallResult", "ExecEvent", "FileEntry",
           "Image", "ImageLayer", "ImageConfig", "Build", "BuildStep"]

Output = Union[str, bytes]


@dataclass
class DSecContainerRunArgs:
    """What to create: the body of ``POST /v1/sandboxes``.

    Field names follow the SDK shape in the API contract; :meth:`to_body` maps
    them to the wire names (``cpu_cores_limit`` -> ``cpu``, ``ttl_running_stop``
    -> ``ttl_s``, ``network_rules`` -> ``network``, ...). ``None`` fields are
    omitted so the node's defaults apply. Sizes are MiB, times seconds.

    ``container_image`` is one image name, or a non-empty list of names
    stacked in order, bottom first (``["debian:bookworm", "proj:abc123"]``).
    """

    container_image: str | Sequence[str] = "host"
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
            "image": _image_field(self.container_image),
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


def _image_field(image: str | Sequence[str] | None) -> str | list[str] | None:
    """A name goes as a string; a list (the stack, bottom first) as a list."""
    if image is None or isinstance(image, str):
        return image
    names = list(image)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError("container_image must be a name or a non-empty list of names")
    return names


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


@dataclass
class ImageLayer:
    """One read-only layer of an image: ``digest`` is ``"sha256:<hex>"`` of
    the uncompressed layer tar, ``size`` its bytes of file content, ``format``
    how the node stores it (``"dir"`` or ``"erofs"``)."""

    digest: str
    size: int = 0
    format: str = "dir"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ImageLayer":
        return cls(digest=str(d.get("digest", "")), size=int(d.get("size", 0) or 0),
                   format=str(d.get("format", "dir")))


@dataclass
class ImageConfig:
    """Defaults an image gives its sandboxes (empty values: the node's)."""

    env: list[str] = field(default_factory=list)  # "KEY=VALUE"
    workdir: str = ""
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "ImageConfig":
        d = d or {}
        return cls(env=[str(e) for e in d.get("env") or []],
                   workdir=str(d.get("workdir") or ""), user=str(d.get("user") or ""),
                   entrypoint=[str(e) for e in d.get("entrypoint") or []],
                   cmd=[str(e) for e in d.get("cmd") or []])


@dataclass
class Image:
    """An image record (``GET /v1/images/{name}``).

    ``base`` is ``"host"`` when the layers sit on the built-in host image,
    ``None`` when they are the whole root filesystem. ``layers`` are bottom
    first (none for the built-in ``host``). ``source`` is ``"builtin"``,
    ``"import"``, ``"snapshot"`` or ``"build"``; ``in_use`` counts the
    sandboxes using its layers; ``size`` is in bytes. ``created_at`` is kept as
    the server sent it (ms since the epoch, 0 for ``host``; edges before the
    ms form sent an RFC 3339 string); :attr:`created` parses either.
    ``raw`` keeps the server's JSON.
    """

    name: str
    base: str | None = None
    layers: list[ImageLayer] = field(default_factory=list)
    config: ImageConfig = field(default_factory=ImageConfig)
    size: int = 0
    source: str = ""
    created_at: str | int | None = None
    in_use: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def builtin(self) -> bool:
        return self.source == "builtin" or self.raw.get("builtin") is True

    @property
    def created(self) -> datetime.datetime | None:
        """``created_at`` as an aware UTC datetime (None if absent or unparsable).
        Numbers are taken as ms since the epoch (seconds when too small for ms)."""
        v = self.created_at
        try:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sec = v / 1000 if v >= 100_000_000_000 else v
                return datetime.datetime.fromtimestamp(sec, datetime.timezone.utc)
            if isinstance(v, str) and v:
                t = _compat.parse_iso8601(v)
                if t.tzinfo is None:
                    t = t.replace(tzinfo=datetime.timezone.utc)
                return t.astimezone(datetime.timezone.utc)
        except (ValueError, OverflowError, OSError):
            pass
        return None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Image":
        base = d.get("base")
        return cls(
            name=str(d.get("name", "")),
            base=str(base) if base else None,
            layers=[ImageLayer.from_json(x) for x in d.get("layers") or []],
            config=ImageConfig.from_json(d.get("config")),
            size=int(d.get("size", 0) or 0),
            source=str(d.get("source") or ("builtin" if d.get("builtin") else "")),
            created_at=d.get("created_at"),
            in_use=int(d.get("in_use", 0) or 0),
            raw=dict(d),
        )


BUILD_STATES = ("queued", "running", "canceling", "succeeded", "failed", "canceled")
BUILD_FINISHED = frozenset({"succeeded", "failed", "canceled"})


@dataclass
class BuildStep:
    """One step of an image build: ``name`` as the node shows it (``"bootstrap
    debian:bookworm"``, ``"run: pip install ..."``, ``"save image x:1"``) and
    ``state``: ``pending``, ``running``, ``done``, ``failed`` or ``canceled``."""

    name: str
    state: str = "pending"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BuildStep":
        return cls(name=str(d.get("name", "")), state=str(d.get("state", "pending")))


@dataclass
class Build:
    """An image build job (``POST /v1/images/build``, ``GET /v1/images/builds/{id}``).

    ``state`` is ``queued``, ``running``, ``canceling``, ``succeeded``,
    ``failed`` or ``canceled``; ``step`` the index in ``steps`` of the running step (``None``
    when none runs); ``progress`` the share of steps done (0..1); ``error`` why
    it failed; ``image`` the image's name once it succeeded; ``sandbox`` the
    build sandbox's id (once made); ``log_bytes`` the log's length so far.
    Times are ms since the epoch (``started_at``/``finished_at`` ``None``
    until then). ``raw`` keeps the server's JSON.
    """

    id: str
    name: str = ""
    state: str = "queued"
    steps: list[BuildStep] = field(default_factory=list)
    step: int | None = None
    progress: float = 0.0
    error: str | None = None
    image: str | None = None
    sandbox: str | None = None
    log_bytes: int = 0
    created_at: int = 0
    started_at: int | None = None
    finished_at: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the build succeeded (the image exists)."""
        return self.state == "succeeded"

    @property
    def finished(self) -> bool:
        """True once the build succeeded, failed or was canceled."""
        return self.state in BUILD_FINISHED

    @property
    def current_step(self) -> BuildStep | None:
        """The running step, if any."""
        if self.step is None or not 0 <= self.step < len(self.steps):
            return None
        return self.steps[self.step]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Build":
        def opt_int(v: Any) -> int | None:
            return None if v is None else int(v)

        def opt_str(v: Any) -> str | None:
            return None if v is None or v == "" else str(v)

        return cls(
            id=str(d.get("id", "")),
            name=str(d.get("name", "")),
            state=str(d.get("state", "queued")),
            steps=[BuildStep.from_json(s) for s in d.get("steps") or []],
            step=opt_int(d.get("step")),
            progress=float(d.get("progress", 0.0) or 0.0),
            error=opt_str(d.get("error")),
            image=opt_str(d.get("image")),
            sandbox=opt_str(d.get("sandbox")),
            log_bytes=int(d.get("log_bytes", 0) or 0),
            created_at=int(d.get("created_at", 0) or 0),
            started_at=opt_int(d.get("started_at")),
            finished_at=opt_int(d.get("finished_at")),
            raw=dict(d),
        )
