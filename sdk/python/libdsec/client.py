"""The blocking client: DSecClient, Sandbox and Shell."""

from __future__ import annotations

import os
import ssl
import threading
import time
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Sequence

from . import _archive, _ops
from ._http import (DEFAULT_TIMEOUT, Request, RetryPolicy, port_url, resolve_config,
                    resolve_project)
from ._ops import Cmd, Stdin
from ._sync import SyncTransport
from .errors import BuildFailedError, DSecError, DSecTimeoutError, NotFoundError
from .models import (
    Build,
    ExecEvent,
    ExecResult,
    ExecStatus,
    FileEntry,
    FnCallResult,
    Image,
    SandboxSpec,
)

__all__ = ["DSecClient", "Sandbox", "Shell"]

_STATUS_POLL_MS = 30_000
# kill_exec: how long it waits for a killed exec's final state when the edge answered before it
# (a process stuck in the kernel); then DSecTimeoutError.
_KILL_WAIT_S = 60.0


class DSecClient:
    """Blocking client for one DSec edge (or an apiserver).

    Args:
        url: ``http://host:port``, ``https://...`` or ``unix:///path/edge.sock``;
            ``None`` reads ``DSEC_URL``, else ``http://127.0.0.1:7070``.
        token: bearer token; ``None`` reads ``DSEC_TOKEN``. Sent on every
            request when set (the edge's unix socket needs none).
        timeout: seconds to wait on the socket for the server, on top of any
            server-side wait the call asks for (an exec's ``timeout_ms``, a
            ``wait_ms``); ``None`` waits forever. Timeouts are not retried.
        retries: re-sends after the first attempt on 429, 503 and connection
            failures (default 5, i.e. 6 attempts; 0 disables). Every mutating
            call carries one request id for all its attempts, so the server
            runs it at most once.
        backoff_base, backoff_cap: exponential backoff with jitter, seconds.
        retry_after_cap: upper bound on a server's ``Retry-After``, seconds.
        project: the cluster project to act in (sent as ``Dsec-Project``); ``None``
            reads ``DSEC_PROJECT``, else none: a project token acts in its own project,
            a cluster admin's in ``default``. A lone edge keeps every sandbox in
            ``default``.

    The client is thread-safe: each thread uses its own keep-alive connection.
    All errors are :class:`~libdsec.DSecError`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        retries: int = 5,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        retry_after_cap: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        project: str | None = None,
    ) -> None:
        endpoint, token = resolve_config(url, token)
        self.url = url
        self.endpoint = endpoint
        self.project = resolve_project(project)
        self._t = SyncTransport(
            endpoint, token, timeout,
            RetryPolicy(retries, backoff_base, backoff_cap, retry_after_cap), ssl_context,
            self.project,
        )

    # -- plumbing ----------------------------------------------------------

    def _call(self, req: Request) -> bytes:
        return self._t.request(req).body

    def _json(self, req: Request) -> Any:
        return self._t.request(req).json()

    def close(self) -> None:
        """Close the client's connections (it reconnects if used again)."""
        self._t.close()

    def __enter__(self) -> "DSecClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ep = self.endpoint
        where = f"unix://{ep.unix_path}" if ep.unix_path else f"{ep.scheme}://{ep.host}:{ep.port}"
        return f"DSecClient({where!r})"

    # -- sandboxes ---------------------------------------------------------

    def create(
        self,
        spec: SandboxSpec | None = None,
        request_id: str | None = None,
        *,
        wait: bool = True,
        **fields: Any,
    ) -> "Sandbox":
        """Create a sandbox and return it once it is running (``wait=False`` may
        return it still ``creating``; later calls on it wait for readiness).

        What to create is a :class:`SandboxSpec`, or its fields as keywords with
        the API's names: ``create(image="py:3.11", memory_mb=1024, network={"mode":
        "open"}, labels={"job": "r7"})``; ``kind="microvm"`` makes a microVM.
        Keywords given with a spec override its fields (the spec is not changed).
        An unknown keyword raises TypeError."""
        spec = _ops.sandbox_spec(spec, fields, "create()")
        return Sandbox(self, self._json(_ops.create(spec, None, request_id, wait)))

    def create_many(
        self,
        count: int,
        spec: SandboxSpec | None = None,
        request_id: str | None = None,
        *,
        wait: bool = True,
        **fields: Any,
    ) -> list["Sandbox"]:
        """Create ``count`` (1..256) alike sandboxes in one request (all or
        nothing); ``spec`` and keywords as for :meth:`create`."""
        spec = _ops.sandbox_spec(spec, fields, "create_many()")
        data = self._json(_ops.create(spec, count, request_id, wait))
        return [Sandbox(self, r) for r in _ops.created_records(data, count)]

    def run_container(
        self,
        args: SandboxSpec | None = None,
        request_id: str | None = None,
        *,
        wait: bool = True,
        **fields: Any,
    ) -> "Sandbox":
        """The same as :meth:`create` (its older name)."""
        spec = _ops.sandbox_spec(args, fields, "run_container()")
        return Sandbox(self, self._json(_ops.create(spec, None, request_id, wait)))

    def run_containers(
        self,
        args: SandboxSpec | None,
        count: int,
        request_id: str | None = None,
        *,
        wait: bool = True,
        **fields: Any,
    ) -> list["Sandbox"]:
        """The same as :meth:`create_many` (its older name), arguments in this order."""
        spec = _ops.sandbox_spec(args, fields, "run_containers()")
        data = self._json(_ops.create(spec, count, request_id, wait))
        return [Sandbox(self, r) for r in _ops.created_records(data, count)]

    def get_sandbox(self, sandbox_id: str) -> "Sandbox":
        """Fetch a sandbox's record; raises NotFoundError if it does not exist."""
        return Sandbox(self, self._json(_ops.get(sandbox_id)))

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox without a request (record empty
        until :meth:`Sandbox.refresh`)."""
        return Sandbox(self, sandbox_id)

    def list_sandboxes(
        self,
        labels: Mapping[str, str] | None = None,
        state: str | None = None,
        kind: str | None = None,
        page_size: int = 100,
    ) -> list["Sandbox"]:
        """Every sandbox matching every label and the state/kind, following
        ``next_cursor`` across pages of ``page_size``: the same :class:`Sandbox`
        objects :meth:`get_sandbox` returns (``sb["labels"]`` reads its record)."""
        found: list[Sandbox] = []
        cursor = None
        while True:
            q = _ops.list_query(labels, state, kind, page_size, cursor)
            data = self._json(_ops.list_page(q))
            found.extend(Sandbox(self, r) for r in data.get("sandboxes", []))
            cursor = data.get("next_cursor")
            if not cursor:
                return found

    def delete_sandbox(self, sandbox_id: str, request_id: str | None = None) -> None:
        """Delete a sandbox. NotFoundError if it does not exist, except when a
        retry finds it gone (the lost first attempt deleted it)."""
        self._call(_ops.delete(sandbox_id, request_id))

    # -- jobs --------------------------------------------------------------

    def pause_job(self, job: str, request_id: str | None = None) -> int:
        """Pause every sandbox labelled ``job=<job>``; returns how many."""
        return int(self._json(_ops.job("pause", job, request_id))["affected"])

    def resume_job(self, job: str, request_id: str | None = None) -> int:
        """Resume every sandbox labelled ``job=<job>``; returns how many."""
        return int(self._json(_ops.job("resume", job, request_id))["affected"])

    def delete_job(self, job: str, request_id: str | None = None) -> int:
        """Delete every sandbox labelled ``job=<job>``; returns how many."""
        return int(self._json(_ops.job("delete", job, request_id))["affected"])

    def preempt_job(self, job: str, others: str = "delete",
                    request_id: str | None = None) -> dict[str, Any]:
        """Preempt a job: every sandbox labelled ``job=<job>`` that records a
        trajectory is checkpointed, then all of them are deleted and their
        resources freed (``others="snapshot"`` snapshots the ones without a
        trajectory into images first). Returns ``{"affected", "checkpointed",
        "snapshots", "failed"}``."""
        return self._json(_ops.preempt_job(job, others, request_id))

    # -- trajectories --------------------------------------------------------

    def trajectory(self, trajectory_id: str, branch: int | None = None) -> dict[str, Any]:
        """A trajectory's state, branches, checkpoints and entries (of ``branch``,
        default its head)."""
        return self._json(_ops.trajectory(trajectory_id, branch))

    def list_trajectories(self) -> list[dict[str, Any]]:
        """The trajectories of the client's project."""
        return list(self._json(_ops.simple_get("/v1/trajectories"))["trajectories"])

    def resume_trajectory(self, trajectory_id: str, branch: int | None = None,
                          request_id: str | None = None, **fields: Any) -> "Sandbox":
        """A sandbox that resumes the trajectory: calls that match its log are
        answered from it without running; the first that differs, or goes past
        it, makes the sandbox (from the latest checkpoint before it) and runs
        live. ``fields``: ``ttl_s``, ``idle_ttl_s``, ``labels``."""
        return Sandbox(self, self._json(_ops.resume_trajectory(trajectory_id, branch, fields,
                                                                request_id)))

    def delete_trajectory(self, trajectory_id: str, request_id: str | None = None) -> None:
        """Delete a trajectory (not while a sandbox follows it)."""
        self._call(_ops.delete_trajectory(trajectory_id, request_id))

    # -- node --------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /v1/health`` -> ``{"ok": true}``."""
        return self._json(_ops.simple_get("/v1/health"))

    def node(self) -> dict[str, Any]:
        """Node capacity, usage, backends, pools and version."""
        return self._json(_ops.simple_get("/v1/node"))

    def quota(self, project: str | None = None, token: str | None = None,
              org: bool = False) -> dict[str, Any]:
        """A cluster level's quota: ``{"level", "limits", "usage", "held",
        "creates_this_second"}``. The project's (``project`` or the client's), a
        token's within it (``token=NAME``), or the organisation's (``org=True``)."""
        return self._json(_ops.simple_get(_ops.quota_path(project or self.project, token, org)))

    def set_quota(self, project: str | None = None, token: str | None = None,
                  org: bool = False, **limits: Any) -> dict[str, Any]:
        """Change the limits named (admin): ``sandboxes``, ``memory_mb``, ``cpu``
        (cores), ``creates_per_s``, and for a project ``parent`` (a project whose
        limits hold this one's too); ``None`` removes one. Returns the level as
        :meth:`quota` does. A create that does not fit raises QuotaExceededError."""
        path = _ops.quota_path(project or self.project, token, org)
        return self._json(_ops.quota_patch(path, limits))

    def images(self) -> list[dict[str, Any]]:
        """The image records of the node as plain dicts (see :meth:`list_images`)."""
        return list(self._json(_ops.simple_get("/v1/images")).get("images", []))

    # -- images ------------------------------------------------------------

    def list_images(self) -> list[Image]:
        """Every image of the node, the built-in ``host`` included."""
        return _ops.images(self._json(_ops.simple_get("/v1/images")))

    def get_image(self, name: str) -> Image:
        """One image (``"x"`` means ``"x:latest"``); NotFoundError if unknown."""
        return Image.from_json(self._json(_ops.image_get(name)))

    def delete_image(self, name: str, request_id: str | None = None) -> None:
        """Delete an image. Its layers stay while sandboxes still use them.
        NotFoundError if unknown (except when a retry finds it gone);
        ConflictError for the built-in ``host``."""
        self._call(_ops.image_delete(name, request_id))

    def import_image(
        self,
        name: str,
        path_or_fileobj: str | os.PathLike[str] | BinaryIO | bytes,
        format: str = "auto",
        layer_format: str | None = None,
        base: str | None = None,
        *,
        request_id: str | None = None,
    ) -> Image:
        """Import an image named ``name`` (``"name:tag"``) and return it.

        ``path_or_fileobj`` is an archive — a tar, tar.gz or tar.zst of a root
        filesystem, an OCI image layout as a tar, or a ``docker save`` tar — as
        a path, a binary file object or bytes; or the path of a directory,
        packed into a tar as it is sent (numeric owners, full modes, symlinks
        not followed; devices, FIFOs, sockets and other file systems left out)
        and imported with ``format="rootfs"``. Files are streamed, never read
        whole. ``format``: ``"auto"``, ``"rootfs"``, ``"oci"`` or ``"docker"``;
        ``layer_format``: ``"dir"`` or ``"erofs"`` (default: the node's);
        ``base="host"`` stacks the files on the built-in host image.

        A bad name or a corrupt or malicious archive raises BadRequestError,
        one over the node's limits TooLargeError, an existing name
        ConflictError. Local read errors raise OSError. A retry (429, 503, a
        lost connection) sends the body again, so a pipe or other unseekable
        file object is sent once, without retries.
        """
        req = _ops.image_import(name, path_or_fileobj, format, layer_format, base, request_id)
        return Image.from_json(self._json(req))

    def snapshot(self, sandbox_id: str, image: str, request_id: str | None = None,
                 keep_setuid: bool = False) -> Image:
        """Save a sandbox's current files as the new image ``image``
        (``"name:tag"``): its writable layer becomes a new top layer. Setuid/setgid
        bits are dropped unless ``keep_setuid``."""
        return Image.from_json(self._json(_ops.snapshot(sandbox_id, image, request_id,
                                                        keep_setuid)))

    def fork(self, sandbox_id: str, count: int = 1,
             request_id: str | None = None, keep_setuid: bool = False,
             memory: bool = False) -> list["Sandbox"]:
        """Create ``count`` (1..64) sandboxes starting from a sandbox's current
        files; processes start fresh. With ``memory=True`` (microVMs) each is a
        copy of the running machine: memory, processes and files. All or
        nothing."""
        data = self._json(_ops.fork(sandbox_id, count, request_id, keep_setuid, memory))
        return [Sandbox(self, r) for r in data.get("sandboxes", [])]

    # -- image builds ------------------------------------------------------

    def build_image(
        self,
        name: str,
        *,
        base: str | None = None,
        from_: str | Sequence[str] | None = None,
        packages: Sequence[str] | None = None,
        run: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        variant: str | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        timeout_s: int | None = None,
        wait: bool = True,
        poll_interval: float = 0.5,
        on_log: Callable[[str], Any] | None = None,
        request_id: str | None = None,
    ) -> Build:
        """Build the image ``name`` (``"name:tag"``) on the node.

        Either ``base="debian:SUITE"`` — a new Debian root filesystem made with
        mmdebstrap (plus ``packages``; ``variant`` ``"minbase"`` by default) —
        or ``from_``: an image, or a list of images stacked bottom first
        (``"host"`` may come first). ``run`` holds shell commands (a string is
        one command) run as root, in order, in a build sandbox from those
        (needed with ``from_``, optional with ``base``); their files become the
        image's top layer. ``env`` and ``workdir`` apply to the commands and are
        kept in the image. ``memory_mb``/``disk_mb`` size the build sandbox,
        ``timeout_s`` bounds the whole build (node defaults: 2048, 4096, 3600).

        With ``wait=False`` returns the queued :class:`Build` at once (see
        :meth:`get_build`, :meth:`wait_build`). Otherwise polls every
        ``poll_interval`` seconds until it finishes, feeding new log text to
        ``on_log(str)`` as it comes, and returns the succeeded Build (its
        ``.image`` is the name); a failed or canceled build raises
        :class:`BuildFailedError` (``.build``). Interrupting the wait
        (KeyboardInterrupt) cancels the build.

        Bad arguments the SDK can tell raise ValueError/TypeError before
        sending; the node answers BadRequestError (bad name, suite, package,
        a ``from_`` build without ``run``, ...), NotFoundError (an unknown
        ``from_`` image), ConflictError (the image exists, or a build of it
        runs), OverCapacityError (its build queue stays full through the
        retries).
        """
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        body = _ops.build_body(name, base, from_, packages, run, env, workdir, variant,
                               memory_mb, disk_mb, timeout_s)
        build = Build.from_json(self._json(_ops.build_start(body, request_id)))
        if not wait:
            return build
        try:
            return self._follow_build(build, poll_interval, on_log, None)
        except KeyboardInterrupt:
            try:  # the build is ours: leave nothing running behind
                self.cancel_build(build.id)
            except DSecError:
                pass
            raise

    def get_build(self, build_id: str) -> Build:
        """A build's record; NotFoundError if the node does not know it (builds
        live in the node's memory: a restart forgets them)."""
        return Build.from_json(self._json(_ops.build_get(build_id)))

    def build_log(self, build_id: str, offset: int = 0,
                  max_bytes: int | None = None) -> tuple[str, int, bool]:
        """The build's log from byte ``offset`` (at most ``max_bytes``, node
        default 1 MiB, at most 4 MiB): ``(text, next_offset, done)``; ``done``
        once the build has finished. Pass ``next_offset`` to read on. The node
        keeps the last 4 MiB: an older ``offset`` gets text from the oldest
        byte kept."""
        return _ops.build_log_page(self._json(_ops.build_log(build_id, offset, max_bytes)))

    def cancel_build(self, build_id: str, request_id: str | None = None) -> Build:
        """Cancel a queued or running build (its sandbox is deleted); returns
        its record: ``canceled`` for a queued one, ``canceling`` for a running
        one until its sandbox and layers are gone (``running`` if it was
        already saving its image). A finished build is returned as it is."""
        return Build.from_json(self._json(_ops.build_cancel(build_id, request_id)))

    def wait_build(
        self,
        build_id: str,
        *,
        poll_interval: float = 0.5,
        on_log: Callable[[str], Any] | None = None,
        timeout_s: float | None = None,
    ) -> Build:
        """Wait for a build (e.g. one started with ``wait=False``) like
        :meth:`build_image` does: returns it when it succeeded, raises
        BuildFailedError when it failed or was canceled, DSecTimeoutError when
        it is still going after ``timeout_s`` (the build goes on). ``on_log``
        gets the whole log, from its start."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        return self._follow_build(self.get_build(build_id), poll_interval, on_log, timeout_s)

    def _follow_build(self, build: Build, poll_interval: float,
                      on_log: Callable[[str], Any] | None, timeout_s: float | None) -> Build:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        offset = 0
        while True:
            if on_log is not None:
                # After a finished record the log is complete: this drains it.
                while True:
                    text, offset, _ = self.build_log(build.id, offset)
                    if not text:
                        break
                    on_log(text)
            if build.finished:
                if not build.ok:
                    raise BuildFailedError(build)
                return build
            pause = poll_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DSecTimeoutError(
                        "timeout", f"build {build.id} still {build.state} after {timeout_s}s",
                        None)
                pause = min(pause, left)
            time.sleep(pause)
            build = self.get_build(build.id)

    # -- function calls and pools -----------------------------------------

    def run_fncall(
        self,
        runtime: str,
        code: str,
        stdin: Stdin | None = None,
        files: Mapping[str, str | bytes] | None = None,
        timeout_ms: int | None = None,
        memory_mb: int | None = None,
        max_output_bytes: int | None = None,
        *,
        filename: str | None = None,
        binary: bool = False,
        request_id: str | None = None,
    ) -> FnCallResult:
        """Run ``code`` on a warm worker of ``runtime`` (``"python"``, ``"bash"``
        or another fncall pool) and wait for it.

        ``files`` (relative path -> ``str`` or ``bytes``) are written into the
        call's fresh working directory first; ``stdin`` may be ``str`` or
        ``bytes``. ``None`` arguments take the server's defaults (timeout 5 s,
        the pool's memory limit, 64 KiB of output per stream). ``filename``
        names the code in Python tracebacks; ``binary=True`` returns
        stdout/stderr as bytes. An unknown runtime raises NotFoundError. A pool
        whose queue is full or that found no free worker in time answers 429,
        retried like any 429; after the retries it raises OverCapacityError.
        """
        body = _ops.fncall_body(runtime, code, stdin, files, timeout_ms, memory_mb,
                                max_output_bytes, filename, binary)
        return FnCallResult.from_json(self._json(_ops.fncall(body, request_id)), binary=binary)

    def list_pools(self) -> list[dict[str, Any]]:
        """Every warm pool of the node (fncall runtimes and container pools):
        its config plus live counts (``workers``, ``queued``, ``calls``, ...)."""
        return list(self._json(_ops.simple_get("/v1/pools")).get("pools", []))

    def get_pool(self, name: str) -> dict[str, Any]:
        """One pool; NotFoundError if there is none of that name."""
        return self._json(_ops.simple_get(_ops.pool_path(name)))

    def put_pool(self, name: str, *, request_id: str | None = None,
                 **config: Any) -> dict[str, Any]:
        """Create or change a pool, e.g. ``put_pool("py", runtime="python",
        preload=["numpy"], min_idle=4, max=32)`` or ``put_pool("web",
        kind="container", min_idle=8)``. Fields left out (or ``None``) keep their
        values on an existing pool and take the node's defaults on a new one;
        ``kind`` defaults to ``"fncall"``, so pass ``kind="container"`` with every
        change of a container pool. Returns the pool."""
        return self._json(_ops.pool_put(name, config, request_id))

    def delete_pool(self, name: str, request_id: str | None = None) -> None:
        """Delete a pool and its workers (no error if a retry finds it gone)."""
        self._call(_ops.pool_delete(name, request_id))


class Sandbox:
    """A handle on one sandbox.

    ``record`` is the last sandbox record seen (from create, get, pause,
    resume, update or :meth:`refresh`); ``state`` reads it. As a context
    manager the sandbox is deleted on exit.
    """

    def __init__(self, client: DSecClient, record: Mapping[str, Any] | str) -> None:
        self._client = client
        if isinstance(record, str):
            self.id = record
            self.record: dict[str, Any] = {"id": record}
        else:
            self.record = dict(record)
            self.id = str(self.record["id"])
        self._shell: Shell | None = None
        self._shell_lock = threading.Lock()

    @property
    def client(self) -> DSecClient:
        return self._client

    def __getitem__(self, key: str) -> Any:
        """A field of the last record seen (``sb["labels"]``, ``sb["state"]``)."""
        return self.record[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.record.get(key, default)

    @property
    def state(self) -> str | None:
        return self.record.get("state")

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.state!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        except NotFoundError:
            pass

    def _json(self, req: Request) -> Any:
        return self._client._json(req)

    def _call(self, req: Request) -> bytes:
        return self._client._call(req)

    def _set_record(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and "id" in data:
            self.record = data
        return self.record

    # -- lifecycle ---------------------------------------------------------

    def refresh(self) -> dict[str, Any]:
        """Re-read the record from the server and return it."""
        return self._set_record(self._json(_ops.get(self.id)))

    def port_url(self, port: int, path: str = "") -> str:
        """The URL of the edge's port proxy to a server listening on ``port`` inside the
        sandbox (any method, streaming, WebSocket upgrades; in every network mode). Requests
        must carry the API token (``Authorization: Bearer ...``)."""
        return port_url(self._client.endpoint, self.id, port, path)

    def signed_port_url(self, port: int, ttl_s: int = 3600) -> dict[str, Any]:
        """A URL for ``port`` that needs no token (a browser, a tool that takes only a URL),
        valid for ``ttl_s`` seconds or until the sandbox goes: ``{"url", "path", "host_url",
        "expires_at", "port"}``. ``host_url`` (when the node has a ``port_domain``) gives the
        port an origin of its own, where absolute links work."""
        return self._json(_ops.port_urls(self.id, port, ttl_s))

    def update(
        self,
        ttl_s: int | None = None,
        idle_ttl_s: int | None = None,
        labels: Mapping[str, str | None] | None = None,
        network: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """PATCH the sandbox: ``ttl_s`` restarts the TTL from now; a label
        set to ``None`` is removed. Returns the new record."""
        fields = {"ttl_s": ttl_s, "idle_ttl_s": idle_ttl_s,
                  "labels": None if labels is None else dict(labels),
                  "network": None if network is None else dict(network)}
        return self._set_record(self._json(_ops.patch(self.id, fields, request_id)))

    def pause(self, request_id: str | None = None) -> dict[str, Any]:
        """Freeze every process of the sandbox. Returns the new record."""
        return self._set_record(self._json(_ops.lifecycle(self.id, "pause", request_id)))

    def resume(self, request_id: str | None = None) -> dict[str, Any]:
        """Thaw a paused sandbox (any other call also resumes it). Returns the record."""
        return self._set_record(self._json(_ops.lifecycle(self.id, "resume", request_id)))

    def delete(self, request_id: str | None = None) -> None:
        """Delete the sandbox: every process is killed and its files are gone (same as
        ``client.delete_sandbox(id)``)."""
        self._shell = None
        self._client.delete_sandbox(self.id, request_id)

    def stop(self, request_id: str | None = None) -> None:
        """Same as :meth:`delete` (kept for older callers)."""
        self.delete(request_id)

    def stats(self) -> dict[str, Any]:
        """CPU time, memory current/peak/limit, disk used/limit, pids, OOM kills, exec count."""
        return self._json(_ops.stats(self.id))

    def signal(self, sig: str | int = "KILL", request_id: str | None = None) -> int:
        """Send ``sig`` to every user process (the agent survives); returns how many."""
        return int(self._json(_ops.signal(self.id, sig, request_id))["signaled"])

    def snapshot(self, image: str, request_id: str | None = None,
                 keep_setuid: bool = False) -> Image:
        """Save this sandbox's current files as the new image ``image``
        (``"name:tag"``); see :meth:`DSecClient.snapshot`."""
        return self._client.snapshot(self.id, image, request_id, keep_setuid)

    def fork(self, count: int = 1, request_id: str | None = None,
             keep_setuid: bool = False, memory: bool = False) -> list["Sandbox"]:
        """``count`` new sandboxes starting from this one's current files
        (processes start fresh), or with ``memory=True`` (microVMs) from its
        running machine; see :meth:`DSecClient.fork`."""
        return self._client.fork(self.id, count, request_id, keep_setuid, memory)

    # -- exec --------------------------------------------------------------

    def exec(
        self,
        cmd: Cmd,
        stdin: Stdin = b"",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_ms: int = 30_000,
        max_output_bytes: int = 1 << 20,
        binary: bool = False,
        *,
        request_id: str | None = None,
        grader: bool = False,
        on_stdout: Callable[[str | bytes], Any] | None = None,
        on_stderr: Callable[[str | bytes], Any] | None = None,
    ) -> ExecResult:
        """Run a command and wait for it.

        ``cmd`` is an argv list, or a string run by ``/bin/sh -c``. ``stdin``
        that is not valid UTF-8 is sent base64-encoded. ``timeout_ms=0`` means
        no timeout. ``binary=True`` returns stdout/stderr as bytes (base64 on
        the wire); otherwise invalid UTF-8 in the output is replaced.
        ``max_output_bytes`` caps each stream. Retrying never runs it twice.
        ``grader=True`` first kills every process in the sandbox (what the agent
        left running could tamper with a grader of the same uid), then runs the
        command as a uid of its own with a clean environment; see the README's
        "Grading" for what it cannot guard against.
        ``on_stdout`` / ``on_stderr`` are called with each piece of output as it
        arrives (the result still holds all of it).
        """
        if on_stdout or on_stderr:
            for ev in self.exec_stream(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes,
                                       binary, request_id=request_id, grader=grader):
                cb = on_stdout if ev.kind == "stdout" else on_stderr if ev.kind == "stderr" else None
                if cb is not None:
                    cb(ev.data)
                elif ev.kind == "exit":
                    return ev.result
            raise DSecError("unavailable", "exec stream ended before its exit event", None)
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        data = self._json(_ops.exec_request(self.id, body, request_id=request_id))
        return ExecResult.from_json(data, binary=binary)

    def exec_stream(
        self,
        cmd: Cmd,
        stdin: Stdin = b"",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_ms: int = 30_000,
        max_output_bytes: int = 1 << 20,
        binary: bool = False,
        *,
        request_id: str | None = None,
        grader: bool = False,
    ) -> Iterator[ExecEvent]:
        """Like :meth:`exec`, but yield output as it is produced.

        Yields ExecEvent("stdout"/"stderr", data) as lines of the NDJSON
        stream arrive, then one ExecEvent("exit", result=ExecResult) holding
        all the output. The request is sent when iteration starts. Stopping
        the iteration early closes the connection, which kills the command.
        """
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        req = _ops.exec_request(self.id, body, stream=True, request_id=request_id)
        return _iter_exec_stream(self._client._t, req, binary)

    def start_background(
        self,
        cmd: Cmd,
        stdin: Stdin = b"",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout_ms: int = 30_000,
        max_output_bytes: int = 1 << 20,
        binary: bool = False,
        *,
        request_id: str | None = None,
        grader: bool = False,
    ) -> str:
        """Start a command without waiting; returns its exec id for
        :meth:`exec_status`, :meth:`wait_exec` and :meth:`kill_exec`."""
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        req = _ops.exec_request(self.id, body, background=True, request_id=request_id)
        return str(self._json(req)["exec_id"])

    def exec_status(self, exec_id: str, wait_ms: int = 0) -> ExecStatus:
        """A background exec's :class:`ExecStatus`: ``state`` (``"running"`` or
        ``"exited"``), ``started_at`` and, once it exited, ``result`` (an
        :class:`ExecResult`; ``exit_code``/``stdout``/``stderr``/``ok`` read it).
        ``wait_ms`` blocks server-side up to that long for the exec to end."""
        return ExecStatus.from_json(self._json(_ops.exec_status(self.id, exec_id, wait_ms)))

    def wait_exec(self, exec_id: str, timeout_s: float | None = None) -> ExecResult:
        """Wait for a background exec to end and return its result.
        Raises DSecTimeoutError if it is still running after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.05
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            wait_ms = _STATUS_POLL_MS if remaining is None else int(
                max(0.0, min(remaining, _STATUS_POLL_MS / 1000)) * 1000)
            started = time.monotonic()
            status = self.exec_status(exec_id, wait_ms=wait_ms)
            if status.exited and status.result is not None:
                return status.result
            if deadline is not None and time.monotonic() >= deadline:
                raise DSecTimeoutError(
                    "timeout", f"exec {exec_id} still running after {timeout_s}s", None)
            # A server that answers before wait_ms must not make us spin.
            if time.monotonic() - started < wait_ms / 2000:
                time.sleep(pause if remaining is None else min(pause, max(remaining, 0)))
                pause = min(pause * 2, 1.0)

    def exec_output(self, exec_id: str, stdout_offset: int | None = 0,
                    stderr_offset: int | None = 0, wait_ms: int = 0,
                    max_bytes: int | None = None) -> dict[str, Any]:
        """A background exec's output so far, also while it runs: ``stdout``/``stderr`` from
        the offsets and ``stdout_offset``/``stderr_offset`` to read from next, with ``state``
        and ``result``. ``wait_ms`` waits for output past the offsets (or the exit); a stream
        given ``None`` is not read."""
        return self._json(_ops.exec_output(self.id, exec_id, stdout_offset, stderr_offset,
                                           wait_ms, max_bytes))

    def kill_exec(self, exec_id: str, request_id: str | None = None) -> ExecResult:
        """Kill a background exec's process tree; returns once it is gone, with its result.
        The exec stays listed until :meth:`forget_exec`."""
        status = self._json(_ops.exec_kill(self.id, exec_id, request_id))
        if status.get("result") is None:
            # Still going after the edge's wait (a process stuck in the kernel): its final
            # state, not a half answer.
            return self.wait_exec(exec_id, timeout_s=_KILL_WAIT_S)
        return ExecResult.from_json(status["result"])

    def forget_exec(self, exec_id: str, request_id: str | None = None) -> None:
        """Kill a background exec if it runs and forget it and its output (no error if a retry
        finds it gone)."""
        self._call(_ops.exec_forget(self.id, exec_id, request_id))

    # -- shells ------------------------------------------------------------

    def open_shell(self, user: str | None = None, request_id: str | None = None) -> "Shell":
        """Start a persistent shell: cwd, env and jobs persist between its runs."""
        data = self._json(_ops.shell_open(self.id, user, request_id))
        return Shell(self, str(data["shell_id"]))

    def run_shell(
        self,
        command: str,
        timeout_ms: int = 60_000,
        max_output_bytes: int = 1 << 20,
        binary: bool = False,
        *,
        request_id: str | None = None,
    ) -> ExecResult:
        """Run ``command`` in this Sandbox object's own persistent shell,
        opened on first use, so ``cd``/``export`` carry over to the next call.
        Calls from several threads run one after another. If the shell is gone
        (e.g. the command ran ``exit``) this raises NotFoundError and the next
        call opens a new shell."""
        with self._shell_lock:
            if self._shell is None:
                self._shell = self.open_shell()
            shell = self._shell
            try:
                return shell.run(command, timeout_ms, max_output_bytes, binary,
                                 request_id=request_id)
            except NotFoundError:
                self._shell = None
                raise

    # -- files -------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644,
                   request_id: str | None = None) -> None:
        """Create or replace a file (parents are created); ``str`` is UTF-8 encoded."""
        self._call(_ops.file_write(self.id, path, data, mode, request_id))

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """A file's bytes; TooLargeError if it is over ``max_bytes`` (server default 64 MiB)."""
        return self._call(_ops.file_read(self.id, path, max_bytes))

    def list_dir(self, path: str) -> list[FileEntry]:
        """The entries of a directory."""
        return _ops.entries(self._json(_ops.file_list(self.id, path)))

    def stat(self, path: str) -> FileEntry:
        """One entry (``name`` is the last path component); NotFoundError if missing."""
        return FileEntry.from_json(self._json(_ops.file_stat(self.id, path)))

    def remove(self, path: str, recursive: bool = False, request_id: str | None = None) -> None:
        """Delete a file, or a directory tree with ``recursive=True``."""
        self._call(_ops.file_remove(self.id, path, recursive, request_id))

    def mkdir(self, path: str, mode: int = 0o755, request_id: str | None = None) -> None:
        """Create a directory and its missing parents."""
        self._call(_ops.file_mkdir(self.id, path, mode, request_id))

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str,
                   request_id: str | None = None) -> None:
        """Copy the contents of ``local_dir`` into ``remote_dir`` (created if
        missing) as one tar; file modes and symlinks are preserved."""
        tar = _archive.build_tar(local_dir)
        self._call(_ops.archive_put(self.id, remote_dir, tar, request_id))

    def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str],
                     skip_unsafe: bool = False) -> list[str]:
        """Copy the contents of ``remote_dir`` into ``local_dir``.

        Extraction applies tarfile's ``data`` filter rules, since the
        sandbox's files are untrusted: a member escaping ``local_dir``, an
        absolute or escaping link, or a device raises UnsafeArchiveError, or
        is skipped with ``skip_unsafe=True``. Returns the skipped names.
        """
        data = self._call(_ops.archive_get(self.id, remote_dir))
        return _archive.extract_tar(data, local_dir, skip_unsafe)


class Shell:
    """A persistent shell session in a sandbox (see :meth:`Sandbox.open_shell`)."""

    def __init__(self, sandbox: Sandbox, shell_id: str) -> None:
        self.sandbox = sandbox
        self.id = shell_id

    def __repr__(self) -> str:
        return f"Shell({self.id!r}, sandbox={self.sandbox.id!r})"

    def run(
        self,
        command: str,
        timeout_ms: int = 60_000,
        max_output_bytes: int = 1 << 20,
        binary: bool = False,
        *,
        request_id: str | None = None,
    ) -> ExecResult:
        """Run ``command`` in this shell and return its result."""
        req = _ops.shell_run(self.sandbox.id, self.id, command, timeout_ms,
                             max_output_bytes, binary, request_id)
        return ExecResult.from_json(self.sandbox._json(req), binary=binary)

    def close(self, request_id: str | None = None) -> None:
        """End the shell (no error if a retry finds it gone)."""
        self.sandbox._call(_ops.shell_close(self.sandbox.id, self.id, request_id))

    def __enter__(self) -> "Shell":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        except NotFoundError:
            pass


def _iter_exec_stream(transport: SyncTransport, req: Request, binary: bool) -> Iterator[ExecEvent]:
    stream = transport.stream(req)
    decoder = _ops.ExecStreamDecoder(binary)
    exit_event: ExecEvent | None = None
    try:
        chunks = stream.iter_chunks()
        for chunk in chunks:
            for ev in decoder.feed(chunk):
                if ev.kind == "exit":
                    # Hold it until the body's end is read, so the
                    # connection is reusable even if the caller stops here.
                    exit_event = ev
                else:
                    yield ev
        for ev in decoder.close():
            if ev.kind == "exit":
                exit_event = ev
            else:
                yield ev
    finally:
        stream.close()
    if exit_event is None:  # decoder.close() raises first; kept for type checkers
        raise DSecError("unavailable", "exec stream ended before its exit event", None)
    yield exit_event
