"""The asyncio client: AsyncDSecClient, AsyncSandbox and AsyncShell.

Same methods and semantics as :mod:`libdsec.client`, as coroutines; see the
docstrings there for the contracts. ``exec_stream`` returns an async iterator.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import ssl
import time
from typing import Any, AsyncIterator, BinaryIO, Callable, Mapping, Sequence

from . import _archive, _ops
from ._async import AsyncTransport
from ._http import (DEFAULT_TIMEOUT, Request, RetryPolicy, port_url, resolve_config,
                    resolve_project)
from ._ops import Cmd, Stdin
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

__all__ = ["AsyncDSecClient", "AsyncSandbox", "AsyncShell"]

_STATUS_POLL_MS = 30_000
# kill_exec: how long it waits for a killed exec's final state when the edge answered before it
# (a process stuck in the kernel); then DSecTimeoutError.
_KILL_WAIT_S = 60.0


class AsyncDSecClient:
    """Asyncio client for one DSec edge (or an apiserver).

    Arguments as for :class:`~libdsec.DSecClient`, plus ``max_connections``:
    the pool's bound on open connections (default 64); more concurrent calls
    wait for a free connection. Use one client per event loop.
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
        max_connections: int = 64,
        ssl_context: ssl.SSLContext | None = None,
        project: str | None = None,
    ) -> None:
        endpoint, token = resolve_config(url, token)
        self.url = url
        self.endpoint = endpoint
        self.project = resolve_project(project)
        self._t = AsyncTransport(
            endpoint, token, timeout,
            RetryPolicy(retries, backoff_base, backoff_cap, retry_after_cap),
            max_connections, ssl_context, self.project,
        )

    async def _call(self, req: Request) -> bytes:
        return (await self._t.request(req)).body

    async def _json(self, req: Request) -> Any:
        return (await self._t.request(req)).json()

    async def close(self) -> None:
        """Close the pooled connections (the client reconnects if used again)."""
        await self._t.aclose()

    async def __aenter__(self) -> "AsyncDSecClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        ep = self.endpoint
        where = f"unix://{ep.unix_path}" if ep.unix_path else f"{ep.scheme}://{ep.host}:{ep.port}"
        return f"AsyncDSecClient({where!r})"

    # -- sandboxes ---------------------------------------------------------

    async def create(self, spec: SandboxSpec | None = None, request_id: str | None = None, *,
                     wait: bool = True, **fields: Any) -> "AsyncSandbox":
        """See :meth:`DSecClient.create`: a :class:`SandboxSpec` or its fields as
        keywords (``await client.create(image="host", memory_mb=256)``)."""
        spec = _ops.sandbox_spec(spec, fields, "create()")
        return AsyncSandbox(self, await self._json(_ops.create(spec, None, request_id, wait)))

    async def create_many(self, count: int, spec: SandboxSpec | None = None,
                          request_id: str | None = None, *, wait: bool = True,
                          **fields: Any) -> list["AsyncSandbox"]:
        """See :meth:`DSecClient.create_many`."""
        spec = _ops.sandbox_spec(spec, fields, "create_many()")
        data = await self._json(_ops.create(spec, count, request_id, wait))
        return [AsyncSandbox(self, r) for r in _ops.created_records(data, count)]

    async def run_container(self, args: SandboxSpec | None = None,
                            request_id: str | None = None, *,
                            wait: bool = True, **fields: Any) -> "AsyncSandbox":
        """The same as :meth:`create` (its older name)."""
        spec = _ops.sandbox_spec(args, fields, "run_container()")
        return AsyncSandbox(self, await self._json(_ops.create(spec, None, request_id, wait)))

    async def run_containers(self, args: SandboxSpec | None, count: int,
                             request_id: str | None = None, *,
                             wait: bool = True, **fields: Any) -> list["AsyncSandbox"]:
        """The same as :meth:`create_many` (its older name), arguments in this order."""
        spec = _ops.sandbox_spec(args, fields, "run_containers()")
        data = await self._json(_ops.create(spec, count, request_id, wait))
        return [AsyncSandbox(self, r) for r in _ops.created_records(data, count)]

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """See :meth:`DSecClient.get_sandbox`."""
        return AsyncSandbox(self, await self._json(_ops.get(sandbox_id)))

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """A handle without a request; see :meth:`DSecClient.sandbox`."""
        return AsyncSandbox(self, sandbox_id)

    async def list_sandboxes(self, labels: Mapping[str, str] | None = None,
                             state: str | None = None, kind: str | None = None,
                             page_size: int = 100) -> list["AsyncSandbox"]:
        """See :meth:`DSecClient.list_sandboxes`: :class:`AsyncSandbox` objects."""
        found: list[AsyncSandbox] = []
        cursor = None
        while True:
            q = _ops.list_query(labels, state, kind, page_size, cursor)
            data = await self._json(_ops.list_page(q))
            found.extend(AsyncSandbox(self, r) for r in data.get("sandboxes", []))
            cursor = data.get("next_cursor")
            if not cursor:
                return found

    async def delete_sandbox(self, sandbox_id: str, request_id: str | None = None) -> None:
        """See :meth:`DSecClient.delete_sandbox`."""
        await self._call(_ops.delete(sandbox_id, request_id))

    async def pause_job(self, job: str, request_id: str | None = None) -> int:
        """See :meth:`DSecClient.pause_job`."""
        return int((await self._json(_ops.job("pause", job, request_id)))["affected"])

    async def resume_job(self, job: str, request_id: str | None = None) -> int:
        """See :meth:`DSecClient.resume_job`."""
        return int((await self._json(_ops.job("resume", job, request_id)))["affected"])

    async def delete_job(self, job: str, request_id: str | None = None) -> int:
        """See :meth:`DSecClient.delete_job`."""
        return int((await self._json(_ops.job("delete", job, request_id)))["affected"])

    async def preempt_job(self, job: str, others: str = "delete",
                          request_id: str | None = None) -> dict[str, Any]:
        """See :meth:`DSecClient.preempt_job`."""
        return await self._json(_ops.preempt_job(job, others, request_id))

    async def trajectory(self, trajectory_id: str, branch: int | None = None) -> dict[str, Any]:
        """See :meth:`DSecClient.trajectory`."""
        return await self._json(_ops.trajectory(trajectory_id, branch))

    async def list_trajectories(self) -> list[dict[str, Any]]:
        """See :meth:`DSecClient.list_trajectories`."""
        return list((await self._json(_ops.simple_get("/v1/trajectories")))["trajectories"])

    async def resume_trajectory(self, trajectory_id: str, branch: int | None = None,
                                request_id: str | None = None, **fields: Any) -> "AsyncSandbox":
        """See :meth:`DSecClient.resume_trajectory`."""
        return AsyncSandbox(self, await self._json(
            _ops.resume_trajectory(trajectory_id, branch, fields, request_id)))

    async def delete_trajectory(self, trajectory_id: str, request_id: str | None = None) -> None:
        """See :meth:`DSecClient.delete_trajectory`."""
        await self._call(_ops.delete_trajectory(trajectory_id, request_id))

    async def health(self) -> dict[str, Any]:
        return await self._json(_ops.simple_get("/v1/health"))

    async def node(self) -> dict[str, Any]:
        return await self._json(_ops.simple_get("/v1/node"))

    async def quota(self, project: str | None = None, token: str | None = None,
                    org: bool = False) -> dict[str, Any]:
        """See :meth:`DSecClient.quota`."""
        return await self._json(
            _ops.simple_get(_ops.quota_path(project or self.project, token, org)))

    async def set_quota(self, project: str | None = None, token: str | None = None,
                        org: bool = False, **limits: Any) -> dict[str, Any]:
        """See :meth:`DSecClient.set_quota`."""
        path = _ops.quota_path(project or self.project, token, org)
        return await self._json(_ops.quota_patch(path, limits))

    async def images(self) -> list[dict[str, Any]]:
        return list((await self._json(_ops.simple_get("/v1/images"))).get("images", []))

    # -- images ------------------------------------------------------------

    async def list_images(self) -> list[Image]:
        """See :meth:`DSecClient.list_images`."""
        return _ops.images(await self._json(_ops.simple_get("/v1/images")))

    async def get_image(self, name: str) -> Image:
        """See :meth:`DSecClient.get_image`."""
        return Image.from_json(await self._json(_ops.image_get(name)))

    async def delete_image(self, name: str, request_id: str | None = None) -> None:
        """See :meth:`DSecClient.delete_image`."""
        await self._call(_ops.image_delete(name, request_id))

    async def import_image(self, name: str,
                           path_or_fileobj: str | os.PathLike[str] | BinaryIO | bytes,
                           format: str = "auto", layer_format: str | None = None,
                           base: str | None = None, *,
                           request_id: str | None = None) -> Image:
        """See :meth:`DSecClient.import_image` (the body is read, and a
        directory packed, in worker threads)."""
        req = _ops.image_import(name, path_or_fileobj, format, layer_format, base, request_id)
        return Image.from_json(await self._json(req))

    async def snapshot(self, sandbox_id: str, image: str,
                       request_id: str | None = None, keep_setuid: bool = False) -> Image:
        """See :meth:`DSecClient.snapshot`."""
        return Image.from_json(await self._json(_ops.snapshot(sandbox_id, image, request_id,
                                                              keep_setuid)))

    async def fork(self, sandbox_id: str, count: int = 1,
                   request_id: str | None = None,
                   keep_setuid: bool = False, memory: bool = False) -> list["AsyncSandbox"]:
        """See :meth:`DSecClient.fork`."""
        data = await self._json(_ops.fork(sandbox_id, count, request_id, keep_setuid,
                                          memory))
        return [AsyncSandbox(self, r) for r in data.get("sandboxes", [])]

    # -- image builds ------------------------------------------------------

    async def build_image(self, name: str, *, base: str | None = None,
                          from_: str | Sequence[str] | None = None,
                          packages: Sequence[str] | None = None,
                          run: str | Sequence[str] | None = None,
                          env: Mapping[str, str] | None = None, workdir: str | None = None,
                          variant: str | None = None, memory_mb: int | None = None,
                          disk_mb: int | None = None, timeout_s: int | None = None,
                          wait: bool = True, poll_interval: float = 0.5,
                          on_log: Callable[[str], Any] | None = None,
                          request_id: str | None = None) -> Build:
        """See :meth:`DSecClient.build_image`. ``on_log`` may be a plain
        function or a coroutine function. Cancelling the task while it waits
        cancels the build."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        body = _ops.build_body(name, base, from_, packages, run, env, workdir, variant,
                               memory_mb, disk_mb, timeout_s)
        build = Build.from_json(await self._json(_ops.build_start(body, request_id)))
        if not wait:
            return build
        try:
            return await self._follow_build(build, poll_interval, on_log, None)
        except (asyncio.CancelledError, KeyboardInterrupt):
            try:  # the build is ours: leave nothing running behind
                await self.cancel_build(build.id)
            except DSecError:
                pass
            raise

    async def get_build(self, build_id: str) -> Build:
        """See :meth:`DSecClient.get_build`."""
        return Build.from_json(await self._json(_ops.build_get(build_id)))

    async def build_log(self, build_id: str, offset: int = 0,
                        max_bytes: int | None = None) -> tuple[str, int, bool]:
        """See :meth:`DSecClient.build_log`."""
        return _ops.build_log_page(
            await self._json(_ops.build_log(build_id, offset, max_bytes)))

    async def cancel_build(self, build_id: str, request_id: str | None = None) -> Build:
        """See :meth:`DSecClient.cancel_build`."""
        return Build.from_json(await self._json(_ops.build_cancel(build_id, request_id)))

    async def wait_build(self, build_id: str, *, poll_interval: float = 0.5,
                         on_log: Callable[[str], Any] | None = None,
                         timeout_s: float | None = None) -> Build:
        """See :meth:`DSecClient.wait_build`."""
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        return await self._follow_build(await self.get_build(build_id), poll_interval, on_log,
                                        timeout_s)

    async def _follow_build(self, build: Build, poll_interval: float,
                            on_log: Callable[[str], Any] | None,
                            timeout_s: float | None) -> Build:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        offset = 0
        while True:
            if on_log is not None:
                while True:  # after a finished record this drains the whole log
                    text, offset, _ = await self.build_log(build.id, offset)
                    if not text:
                        break
                    res = on_log(text)
                    if inspect.isawaitable(res):
                        await res
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
            await asyncio.sleep(pause)
            build = await self.get_build(build.id)

    # -- function calls and pools -----------------------------------------

    async def run_fncall(self, runtime: str, code: str, stdin: Stdin | None = None,
                         files: Mapping[str, str | bytes] | None = None,
                         timeout_ms: int | None = None, memory_mb: int | None = None,
                         max_output_bytes: int | None = None, *,
                         filename: str | None = None, binary: bool = False,
                         request_id: str | None = None) -> FnCallResult:
        """See :meth:`DSecClient.run_fncall`."""
        body = _ops.fncall_body(runtime, code, stdin, files, timeout_ms, memory_mb,
                                max_output_bytes, filename, binary)
        data = await self._json(_ops.fncall(body, request_id))
        return FnCallResult.from_json(data, binary=binary)

    async def list_pools(self) -> list[dict[str, Any]]:
        """See :meth:`DSecClient.list_pools`."""
        return list((await self._json(_ops.simple_get("/v1/pools"))).get("pools", []))

    async def get_pool(self, name: str) -> dict[str, Any]:
        """See :meth:`DSecClient.get_pool`."""
        return await self._json(_ops.simple_get(_ops.pool_path(name)))

    async def put_pool(self, name: str, *, request_id: str | None = None,
                       **config: Any) -> dict[str, Any]:
        """See :meth:`DSecClient.put_pool`."""
        return await self._json(_ops.pool_put(name, config, request_id))

    async def delete_pool(self, name: str, request_id: str | None = None) -> None:
        """See :meth:`DSecClient.delete_pool`."""
        await self._call(_ops.pool_delete(name, request_id))


class AsyncSandbox:
    """Asyncio handle on one sandbox; see :class:`~libdsec.Sandbox`.
    ``async with`` deletes it on exit."""

    def __init__(self, client: AsyncDSecClient, record: Mapping[str, Any] | str) -> None:
        self._client = client
        if isinstance(record, str):
            self.id = record
            self.record: dict[str, Any] = {"id": record}
        else:
            self.record = dict(record)
            self.id = str(self.record["id"])
        self._shell: AsyncShell | None = None
        self._shell_lock = asyncio.Lock()

    @property
    def client(self) -> AsyncDSecClient:
        return self._client

    def __getitem__(self, key: str) -> Any:
        """A field of the last record seen (``sb["labels"]``)."""
        return self.record[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.record.get(key, default)

    @property
    def state(self) -> str | None:
        return self.record.get("state")

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, state={self.state!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop()
        except NotFoundError:
            pass

    async def _json(self, req: Request) -> Any:
        return await self._client._json(req)

    async def _call(self, req: Request) -> bytes:
        return await self._client._call(req)

    def _set_record(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and "id" in data:
            self.record = data
        return self.record

    # -- lifecycle ---------------------------------------------------------

    async def refresh(self) -> dict[str, Any]:
        return self._set_record(await self._json(_ops.get(self.id)))

    def port_url(self, port: int, path: str = "") -> str:
        """The edge's port proxy URL for ``port`` inside the sandbox (Sandbox.port_url)."""
        return port_url(self._client.endpoint, self.id, port, path)

    async def update(self, ttl_s: int | None = None, idle_ttl_s: int | None = None,
                     labels: Mapping[str, str | None] | None = None,
                     network: Mapping[str, Any] | None = None, *,
                     request_id: str | None = None) -> dict[str, Any]:
        """See :meth:`Sandbox.update`."""
        fields = {"ttl_s": ttl_s, "idle_ttl_s": idle_ttl_s,
                  "labels": None if labels is None else dict(labels),
                  "network": None if network is None else dict(network)}
        return self._set_record(await self._json(_ops.patch(self.id, fields, request_id)))

    async def pause(self, request_id: str | None = None) -> dict[str, Any]:
        return self._set_record(await self._json(_ops.lifecycle(self.id, "pause", request_id)))

    async def resume(self, request_id: str | None = None) -> dict[str, Any]:
        return self._set_record(await self._json(_ops.lifecycle(self.id, "resume", request_id)))

    async def delete(self, request_id: str | None = None) -> None:
        """Delete the sandbox: every process is killed and its files are gone."""
        self._shell = None
        await self._client.delete_sandbox(self.id, request_id)

    async def stop(self, request_id: str | None = None) -> None:
        """Same as :meth:`delete` (kept for older callers)."""
        await self.delete(request_id)

    async def signed_port_url(self, port: int, ttl_s: int = 3600) -> dict[str, Any]:
        """Sandbox.signed_port_url."""
        return await self._json(_ops.port_urls(self.id, port, ttl_s))

    async def stats(self) -> dict[str, Any]:
        return await self._json(_ops.stats(self.id))

    async def signal(self, sig: str | int = "KILL", request_id: str | None = None) -> int:
        return int((await self._json(_ops.signal(self.id, sig, request_id)))["signaled"])

    async def snapshot(self, image: str, request_id: str | None = None,
                       keep_setuid: bool = False) -> Image:
        """See :meth:`Sandbox.snapshot`."""
        return await self._client.snapshot(self.id, image, request_id, keep_setuid)

    async def fork(self, count: int = 1, request_id: str | None = None,
                   keep_setuid: bool = False, memory: bool = False) -> list["AsyncSandbox"]:
        """See :meth:`Sandbox.fork`."""
        return await self._client.fork(self.id, count, request_id, keep_setuid, memory)

    # -- exec --------------------------------------------------------------

    async def exec(self, cmd: Cmd, stdin: Stdin = b"", env: Mapping[str, str] | None = None,
                   cwd: str | None = None, user: str | None = None,
                   timeout_ms: int = 30_000, max_output_bytes: int = 1 << 20,
                   binary: bool = False, *, request_id: str | None = None,
                   grader: bool = False, on_stdout: Callable[[Any], Any] | None = None,
                   on_stderr: Callable[[Any], Any] | None = None) -> ExecResult:
        """See :meth:`Sandbox.exec`; the callbacks may be plain functions or coroutine
        functions."""
        if on_stdout or on_stderr:
            async for ev in self.exec_stream(cmd, stdin, env, cwd, user, timeout_ms,
                                             max_output_bytes, binary, request_id=request_id,
                                             grader=grader):
                cb = on_stdout if ev.kind == "stdout" else on_stderr if ev.kind == "stderr" else None
                if cb is not None:
                    r = cb(ev.data)
                    if inspect.isawaitable(r):
                        await r
                elif ev.kind == "exit":
                    return ev.result
            raise DSecError("unavailable", "exec stream ended before its exit event", None)
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        data = await self._json(_ops.exec_request(self.id, body, request_id=request_id))
        return ExecResult.from_json(data, binary=binary)

    def exec_stream(self, cmd: Cmd, stdin: Stdin = b"", env: Mapping[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None,
                    timeout_ms: int = 30_000, max_output_bytes: int = 1 << 20,
                    binary: bool = False, *, request_id: str | None = None,
                    grader: bool = False) -> AsyncIterator[ExecEvent]:
        """See :meth:`Sandbox.exec_stream`; use with ``async for``. To stop
        early and kill the command promptly, wrap it in
        ``contextlib.aclosing(...)``."""
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        req = _ops.exec_request(self.id, body, stream=True, request_id=request_id)
        return _aiter_exec_stream(self._client._t, req, binary)

    async def start_background(self, cmd: Cmd, stdin: Stdin = b"",
                               env: Mapping[str, str] | None = None, cwd: str | None = None,
                               user: str | None = None, timeout_ms: int = 30_000,
                               max_output_bytes: int = 1 << 20, binary: bool = False, *,
                               request_id: str | None = None, grader: bool = False) -> str:
        """See :meth:`Sandbox.start_background`."""
        body = _ops.exec_body(cmd, stdin, env, cwd, user, timeout_ms, max_output_bytes, binary,
                              grader)
        req = _ops.exec_request(self.id, body, background=True, request_id=request_id)
        return str((await self._json(req))["exec_id"])

    async def exec_status(self, exec_id: str, wait_ms: int = 0) -> ExecStatus:
        """See :meth:`Sandbox.exec_status`."""
        return ExecStatus.from_json(await self._json(_ops.exec_status(self.id, exec_id,
                                                                      wait_ms)))

    async def wait_exec(self, exec_id: str, timeout_s: float | None = None) -> ExecResult:
        """See :meth:`Sandbox.wait_exec`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.05
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            wait_ms = _STATUS_POLL_MS if remaining is None else int(
                max(0.0, min(remaining, _STATUS_POLL_MS / 1000)) * 1000)
            started = time.monotonic()
            status = await self.exec_status(exec_id, wait_ms=wait_ms)
            if status.exited and status.result is not None:
                return status.result
            if deadline is not None and time.monotonic() >= deadline:
                raise DSecTimeoutError(
                    "timeout", f"exec {exec_id} still running after {timeout_s}s", None)
            if time.monotonic() - started < wait_ms / 2000:
                await asyncio.sleep(pause if remaining is None else min(pause, max(remaining, 0)))
                pause = min(pause * 2, 1.0)

    async def exec_output(self, exec_id: str, stdout_offset: int | None = 0,
                          stderr_offset: int | None = 0, wait_ms: int = 0,
                          max_bytes: int | None = None) -> dict[str, Any]:
        return await self._json(_ops.exec_output(self.id, exec_id, stdout_offset,
                                                 stderr_offset, wait_ms, max_bytes))

    async def kill_exec(self, exec_id: str, request_id: str | None = None) -> ExecResult:
        status = await self._json(_ops.exec_kill(self.id, exec_id, request_id))
        if status.get("result") is None:  # still going: wait for its final state
            return await self.wait_exec(exec_id, timeout_s=_KILL_WAIT_S)
        return ExecResult.from_json(status["result"])

    async def forget_exec(self, exec_id: str, request_id: str | None = None) -> None:
        await self._call(_ops.exec_forget(self.id, exec_id, request_id))

    # -- shells ------------------------------------------------------------

    async def open_shell(self, user: str | None = None,
                         request_id: str | None = None) -> "AsyncShell":
        data = await self._json(_ops.shell_open(self.id, user, request_id))
        return AsyncShell(self, str(data["shell_id"]))

    async def run_shell(self, command: str, timeout_ms: int = 60_000,
                        max_output_bytes: int = 1 << 20, binary: bool = False, *,
                        request_id: str | None = None) -> ExecResult:
        """See :meth:`Sandbox.run_shell`."""
        async with self._shell_lock:
            if self._shell is None:
                self._shell = await self.open_shell()
            shell = self._shell
            try:
                return await shell.run(command, timeout_ms, max_output_bytes, binary,
                                       request_id=request_id)
            except NotFoundError:
                self._shell = None
                raise

    # -- files -------------------------------------------------------------

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644,
                         request_id: str | None = None) -> None:
        await self._call(_ops.file_write(self.id, path, data, mode, request_id))

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self._call(_ops.file_read(self.id, path, max_bytes))

    async def list_dir(self, path: str) -> list[FileEntry]:
        return _ops.entries(await self._json(_ops.file_list(self.id, path)))

    async def stat(self, path: str) -> FileEntry:
        return FileEntry.from_json(await self._json(_ops.file_stat(self.id, path)))

    async def remove(self, path: str, recursive: bool = False,
                     request_id: str | None = None) -> None:
        await self._call(_ops.file_remove(self.id, path, recursive, request_id))

    async def mkdir(self, path: str, mode: int = 0o755, request_id: str | None = None) -> None:
        await self._call(_ops.file_mkdir(self.id, path, mode, request_id))

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str,
                         request_id: str | None = None) -> None:
        """See :meth:`Sandbox.upload_dir` (the tar is built in a worker thread)."""
        tar = await asyncio.to_thread(_archive.build_tar, local_dir)
        await self._call(_ops.archive_put(self.id, remote_dir, tar, request_id))

    async def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str],
                           skip_unsafe: bool = False) -> list[str]:
        """See :meth:`Sandbox.download_dir` (extracted in a worker thread)."""
        data = await self._call(_ops.archive_get(self.id, remote_dir))
        return await asyncio.to_thread(_archive.extract_tar, data, local_dir, skip_unsafe)


class AsyncShell:
    """A persistent shell session; see :class:`~libdsec.client.Shell`."""

    def __init__(self, sandbox: AsyncSandbox, shell_id: str) -> None:
        self.sandbox = sandbox
        self.id = shell_id

    def __repr__(self) -> str:
        return f"AsyncShell({self.id!r}, sandbox={self.sandbox.id!r})"

    async def run(self, command: str, timeout_ms: int = 60_000,
                  max_output_bytes: int = 1 << 20, binary: bool = False, *,
                  request_id: str | None = None) -> ExecResult:
        req = _ops.shell_run(self.sandbox.id, self.id, command, timeout_ms,
                             max_output_bytes, binary, request_id)
        return ExecResult.from_json(await self.sandbox._json(req), binary=binary)

    async def close(self, request_id: str | None = None) -> None:
        await self.sandbox._call(_ops.shell_close(self.sandbox.id, self.id, request_id))

    async def __aenter__(self) -> "AsyncShell":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        except NotFoundError:
            pass


async def _aiter_exec_stream(transport: AsyncTransport, req: Request,
                             binary: bool) -> AsyncIterator[ExecEvent]:
    stream = await transport.stream(req)
    decoder = _ops.ExecStreamDecoder(binary)
    exit_event: ExecEvent | None = None
    chunks = stream.iter_chunks()
    try:
        async for chunk in chunks:
            for ev in decoder.feed(chunk):
                if ev.kind == "exit":
                    exit_event = ev  # yielded after the body's end; see client.py
                else:
                    yield ev
        for ev in decoder.close():
            if ev.kind == "exit":
                exit_event = ev
            else:
                yield ev
    finally:
        await chunks.aclose()
        stream.close()
    if exit_event is None:
        raise DSecError("unavailable", "exec stream ended before its exit event", None)
    yield exit_event
