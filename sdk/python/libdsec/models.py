"""Plain data types exchanged with the DSec API."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import difflib
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence, Union

from . import _compat

__all__ = ["SandboxSpec", "DSecContainerRunArgs", "ExecResult", "ExecStatus", "FnCallResult",
           "ExecEvent", "FileEntry", "Image", "ImageLayer", "ImageConfig", "Build",
           "BuildStep"]

Output = Union[str, bytes]


# The names the SDK used before it took the API's, kept as deprecated aliases.
_OLD_NAMES = {
    "container_image": "image",
    "cpu_cores_limit": "cpu",
    "memory_limit_mb": "memory_mb",
    "pids_limit": "pids",
    "disk_limit_mb": "disk_mb",
    "ttl_running_stop": "ttl_s",
    "network_rules": "network",
}


def spec_fields(fields: Mapping[str, Any], where: str, stacklevel: int,
                cls: type | None = None) -> dict[str, Any]:
    """``fields`` with every deprecated name turned into the API's, with a
    DeprecationWarning (``stacklevel`` counts as warnings.warn's does, from the
    caller). An old name given with its new one, or a name that is neither a
    field of ``cls`` nor an old name, is a TypeError naming ``where``."""
    names = [f.name for f in dataclasses.fields(cls or SandboxSpec)]
    out: dict[str, Any] = {}
    for key, value in fields.items():
        new = _OLD_NAMES.get(key)
        if new is not None:
            if new in fields:
                raise TypeError(f"{where} got both {new!r} and its deprecated alias {key!r}")
            _warn_old_name(key, new, stacklevel + 1)
            key = new
        elif key not in names:
            raise TypeError(f"{where} got an unexpected keyword argument {key!r}"
                            + _did_you_mean(key, names))
        out[key] = value
    return out


def _did_you_mean(key: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(names) + list(_OLD_NAMES), n=1)
    if close:
        return f"; did you mean {_OLD_NAMES.get(close[0], close[0])!r}?"
    return f" (the fields: {', '.join(names)})"


def _warn_old_name(old: str, new: str, stacklevel: int) -> None:
    # stacklevel counts from the caller, as warnings.warn's does.
    warnings.warn(f"{old!r} is deprecated: use {new!r} (the API's name)", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def _accept_old_names(cls: type) -> type:
    """Let ``cls`` (a dataclass) take the names in ``_OLD_NAMES`` as deprecated
    aliases: as keywords of its constructor and as attributes."""
    init = cls.__init__

    @functools.wraps(init)  # help() and inspect.signature show the real fields
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **spec_fields(kwargs, f"{type(self).__name__}()", 2, type(self)))

    cls.__init__ = __init__  # type: ignore[misc]
    for old, new in _OLD_NAMES.items():
        setattr(cls, old, _alias_property(old, new))
    return cls


def _alias_property(old: str, new: str) -> property:
    def get(self: Any) -> Any:
        _warn_old_name(old, new, 2)
        return getattr(self, new)

    def set_(self: Any, value: Any) -> None:
        _warn_old_name(old, new, 2)
        setattr(self, new, value)

    return property(get, set_, doc=f"Deprecated alias of ``{new}``.")


@_accept_old_names
@dataclass
class SandboxSpec:
    """What to create: the body of ``POST /v1/sandboxes``, with the API's
    field names (the CLI's ``dsec create`` options too). ``None`` fields are
    omitted so the node's defaults apply. Sizes are MiB, times seconds.

    ``image`` is one image name, or a non-empty list of names stacked in
    order, bottom first (``["debian:bookworm", "proj:abc123"]``). ``kind`` is
    ``"container"`` or ``"microvm"`` (a VM of its own; needs an image from
    the store). ``ttl_s=0`` means no TTL (``idle_ttl_s`` still applies);
    ``idle_ttl_s=0`` means no idle timeout. ``network`` is the policy, e.g.
    ``{"mode": "none"}``, ``{"mode": "open"}`` or ``{"mode": "allowlist",
    "rules": [{"cidr": "198.51.100.0/24", "ports": "443"}], "domains": ["pypi.org"]}``.

    The SDK's older names still work, deprecated (a DeprecationWarning), as
    keywords and attributes: ``container_image`` (``image``),
    ``cpu_cores_limit`` (``cpu``), ``memory_limit_mb`` (``memory_mb``),
    ``pids_limit`` (``pids``), ``disk_limit_mb`` (``disk_mb``),
    ``ttl_running_stop`` (``ttl_s``), ``network_rules`` (``network``).

    ``trajectory`` records the sandbox's calls in the trajectory log under that
    id (or ``{"id": ..., "checkpoint_every": N}``): a preempted job resumes from
    it with :meth:`DSecClient.resume_trajectory`.

    ``node`` (admins, in a cluster) makes the sandbox on that node (a name of
    ``GET /v1/nodes``), or fails (422) if it cannot take it.
    """

    image: str | Sequence[str] = "host"
    cpu: float = 1.0
    memory_mb: int = 512
    pids: int = 256
    disk_mb: int = 256
    ttl_s: int = 3600
    idle_ttl_s: int = 0
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    network: dict[str, Any] | None = None
    kind: str = "container"
    trajectory: str | dict[str, Any] | None = None
    node: str | None = None

    def to_body(self) -> dict[str, Any]:
        """The JSON body for ``POST /v1/sandboxes`` (without count/request_id)."""
        body: dict[str, Any] = {
            "kind": self.kind,
            "image": _image_field(self.image),
            # The edge's strict parser wants a float for cpu and ints for the
            # rest; coercing here lets callers write cpu=1.
            "cpu": None if self.cpu is None else float(self.cpu),
            "memory_mb": _opt_int(self.memory_mb),
            "pids": _opt_int(self.pids),
            "disk_mb": _opt_int(self.disk_mb),
            "ttl_s": _opt_int(self.ttl_s),
            "idle_ttl_s": _opt_int(self.idle_ttl_s),
            "user": self.user,
            "workdir": self.workdir,
            "env": dict(self.env) if self.env is not None else None,
            "labels": dict(self.labels) if self.labels is not None else None,
            "network": dict(self.network) if self.network is not None else None,
            "trajectory": _trajectory_field(self.trajectory),
            "node": self.node,
        }
        return {k: v for k, v in body.items() if v is not None}


# The class's name before it covered microVMs too: the same class.
DSecContainerRunArgs = SandboxSpec


def _trajectory_field(t: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A trajectory id records a new trajectory under it; a dict is sent as is
    (``{"id": ..., "checkpoint_every": 10}``)."""
    if t is None:
        return None
    if isinstance(t, str):
        return {"id": t}
    return dict(t)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _image_field(image: str | Sequence[str] | None) -> str | list[str] | None:
    """A name goes as a string; a list (the stack, bottom first) as a list."""
    if image is None or isinstance(image, str):
        return image
    names = list(image)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError("image must be a name or a non-empty list of names")
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
class ExecStatus:
    """A background exec's status (:meth:`Sandbox.exec_status`, ``GET
    .../execs/{eid}``).

    ``state`` is ``"running"`` or ``"exited"``; ``result`` is the
    :class:`ExecResult` once it exited, with all its output (``None`` while it
    runs: read live output with ``exec_output``); ``started_at`` is ms since
    the epoch. ``exit_code``, ``stdout``, ``stderr`` and ``ok`` read
    ``result`` (``None``, or ``False`` for ``ok``, while it runs). ``raw``
    keeps the server's JSON.

    Reading it as the dict it once was (``st["state"]``, ``st.get("result")``,
    ``"result" in st``) still works, deprecated: that reads ``raw``.
    """

    exec_id: str
    state: str = "running"
    started_at: int = 0
    result: ExecResult | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def exited(self) -> bool:
        return self.state == "exited"

    @property
    def exit_code(self) -> int | None:
        return None if self.result is None else self.result.exit_code

    @property
    def stdout(self) -> Output | None:
        return None if self.result is None else self.result.stdout

    @property
    def stderr(self) -> Output | None:
        return None if self.result is None else self.result.stderr

    @property
    def ok(self) -> bool:
        """True when it exited 0 and did not time out."""
        return self.result is not None and self.result.ok

    @classmethod
    def from_json(cls, d: Mapping[str, Any], binary: bool | None = None) -> "ExecStatus":
        result = d.get("result")
        return cls(
            exec_id=str(d.get("exec_id", "")),
            state=str(d.get("state", "running")),
            started_at=int(d.get("started_at", 0) or 0),
            result=None if result is None else ExecResult.from_json(result, binary),
            raw=dict(d),
        )

    # -- the dict it was (deprecated) ----------------------------------------

    @staticmethod
    def _dict_access(what: str) -> None:
        warnings.warn(f"exec_status() returns an ExecStatus: {what} is deprecated; use its "
                      "attributes (.state, .result, ...) or .raw", DeprecationWarning,
                      stacklevel=3)

    def __getitem__(self, key: str) -> Any:
        self._dict_access(f"[{key!r}]")
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._dict_access(f".get({key!r})")
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        self._dict_access("'in'")
        return key in self.raw

    def keys(self) -> Any:
        self._dict_access(".keys()")
        return self.raw.keys()

    def values(self) -> Any:
        self._dict_access(".values()")
        return self.raw.values()

    def items(self) -> Any:
        self._dict_access(".items()")
        return self.raw.items()


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
