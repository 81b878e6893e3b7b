"""Asyncio transport: a small HTTP/1.1 client on asyncio streams with a
bounded keep-alive connection pool and retries."""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
from typing import AsyncIterator

from ._http import (
    Endpoint,
    Request,
    Response,
    RetryableError,
    RetryPolicy,
    base_headers,
    finish,
    status_retry_delay,
    timed_out,
    unavailable,
)
from . import _compat
from ._upload import BodyReadError
from .errors import DSecError

_READ_SIZE = 64 * 1024
_LINE_LIMIT = 64 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class _ProtocolError(Exception):
    """The server sent something that is not valid HTTP/1.1."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        # The event loop feeds EOF to the reader when the peer closes, so an
        # idle connection the server dropped shows up here without I/O.
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class _Body:
    """Reads one response body: Content-Length, chunked, or until EOF."""

    def __init__(self, reader: asyncio.StreamReader, method: str, status: int,
                 headers: dict[str, str], keep_alive: bool) -> None:
        self._reader = reader
        self.done = False
        self._chunked = False
        self._left: int | None = None  # bytes left (length mode / current chunk)
        self._until_eof = False
        te = headers.get("transfer-encoding", "").lower()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self.done = True
        elif "chunked" in te:
            self._chunked = True
            self._left = 0
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise _ProtocolError("bad Content-Length") from None
            if self._left < 0:
                raise _ProtocolError("bad Content-Length")
            self.done = self._left == 0
        else:
            self._until_eof = True
        self.reusable_when_done = keep_alive and not self._until_eof

    async def read_chunk(self) -> bytes:
        """Return the next piece of the body, b"" at its end."""
        if self.done:
            return b""
        r = self._reader
        if self._until_eof:
            data = await r.read(_READ_SIZE)
            if not data:
                self.done = True
            return data
        if self._chunked and self._left == 0:
            line = await r.readline()
            if not line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(line, None)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                while True:  # trailers, up to the blank line
                    line = await r.readline()
                    if not line.endswith(b"\n"):
                        raise asyncio.IncompleteReadError(line, None)
                    if line in (b"\r\n", b"\n"):
                        break
                self.done = True
                return b""
            self._left = size
        assert self._left is not None
        data = await r.read(min(self._left, _READ_SIZE))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._left)
        self._left -= len(data)
        if self._left == 0:
            if self._chunked:
                await r.readexactly(2)  # CRLF after the chunk data
            else:
                self.done = True
        return data

    async def read_all(self) -> bytes:
        parts = []
        while True:
            data = await self.read_chunk()
            if not data:
                return b"".join(parts)
            parts.append(data)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bool]:
    """Read the status line and headers; skip 1xx interim responses.

    Returns (status, lower-cased headers, keep_alive). An EOF before the
    first byte raises ConnectionResetError: the server closed without replying.
    """
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionResetError("server closed the connection before replying")
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise _ProtocolError(f"bad status line {line[:60]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise _ProtocolError(f"bad status line {line[:60]!r}") from None
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(line, None)
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise _ProtocolError(f"bad header line {line[:60]!r}")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if 100 <= status < 200 and status != 101:
            continue
        conn_tokens = headers.get("connection", "").lower()
        if parts[0] == "HTTP/1.0":
            keep_alive = "keep-alive" in conn_tokens
        else:
            keep_alive = "close" not in conn_tokens
        return status, headers, keep_alive


async def _read_head_block(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bool]:
    """Like _read_head, but the head is taken from the reader in one call:
    once a failed write has closed the connection, the reader raises on
    every new call even with the reply already in its buffer."""
    while True:
        try:
            block = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _ProtocolError("response head too large") from None
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise ConnectionResetError("server closed the connection before replying") \
                    from None
            raise
        status_line = block.split(b"\n", 1)[0].split(b" ", 2)
        if len(status_line) > 1 and status_line[1][:1] == b"1" and status_line[1] != b"101":
            continue  # an interim reply
        head = asyncio.StreamReader()
        head.feed_data(block)
        head.feed_eof()
        return await _read_head(head)


class AsyncStream:
    """A 2xx response whose body the caller reads incrementally."""

    def __init__(self, transport: "AsyncTransport", conn: _Conn, status: int,
                 headers: dict[str, str], body: _Body, timeout: float | None) -> None:
        self._transport = transport
        self._conn: _Conn | None = conn
        self._body = body
        self._timeout = timeout
        self.status = status
        self.headers = headers

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive. Each wait for data is bounded by
        the request's timeout; stopping early drops the connection (the server
        then kills a streamed command)."""
        try:
            while True:
                try:
                    async with _compat.timeout(self._timeout):
                        chunk = await self._body.read_chunk()
                except _compat.TIMEOUT_ERRORS:
                    raise DSecError(
                        "timeout", f"stream stalled for {self._timeout}s", None
                    ) from None
                except (OSError, asyncio.IncompleteReadError, _ProtocolError, ValueError) as e:
                    raise DSecError("unavailable", f"stream broken: {e!r}", None) from None
                if not chunk:
                    break
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._release(conn, self._body.done and self._body.reusable_when_done)


class AsyncTransport:
    """Sends Requests with retries over a pool of keep-alive connections.

    At most ``max_connections`` connections exist at once (busy + idle); a
    request waits for a free slot. A client must be used from one event loop.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str | None,
        timeout: float | None,
        retry: RetryPolicy,
        max_connections: int = 64,
        ssl_context: ssl_module.SSLContext | None = None,
        project: str | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.endpoint = endpoint
        self.timeout = timeout
        self.retry = retry
        self.max_connections = max_connections
        self._headers = base_headers(endpoint, token, project)
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: collections.deque[_Conn] = collections.deque()

    # -- pool --------------------------------------------------------------

    async def _open(self, timeout: float | None) -> _Conn:
        ep = self.endpoint
        try:
            async with _compat.timeout(timeout):
                if ep.unix_path is not None:
                    reader, writer = await asyncio.open_unix_connection(
                        ep.unix_path, limit=_LINE_LIMIT
                    )
                else:
                    ssl_ctx = None
                    if ep.scheme == "https":
                        ssl_ctx = self._ssl or ssl_module.create_default_context()
                    reader, writer = await asyncio.open_connection(
                        ep.host, ep.port, ssl=ssl_ctx, limit=_LINE_LIMIT
                    )
        except (OSError, *_compat.TIMEOUT_ERRORS) as e:  # refused, no socket, connect timeout
            raise RetryableError(e) from None
        return _Conn(reader, writer)

    async def _acquire(self, timeout: float | None) -> tuple[_Conn, bool]:
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if conn.usable():
                    return conn, True
                conn.close()
            return await self._open(timeout), False
        except BaseException:
            self._slots.release()
            raise

    def _release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and conn.usable():
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    async def aclose(self) -> None:
        """Close the idle connections; busy ones close when released.
        The transport stays usable and reconnects on the next request."""
        idle, self._idle = list(self._idle), collections.deque()
        for conn in idle:
            conn.close()
        for conn in idle:
            try:
                await conn.writer.wait_closed()
            except OSError:
                pass

    # -- one attempt -------------------------------------------------------

    def _encode(self, req: Request, length: int | None = -1) -> bytes:
        """The request head, and the body unless it is streamed: ``length``
        is then its Content-Length, or None for chunked."""
        lines = [f"{req.method} {req.target(self.endpoint)} HTTP/1.1",
                 f"Host: {self.endpoint.host_header}"]
        headers = dict(self._headers)
        headers.update(req.headers)
        if req.stream_body is not None:
            if length is None:
                headers["Transfer-Encoding"] = "chunked"
            else:
                headers["Content-Length"] = str(length)
        elif req.body is not None or req.method in _BODY_METHODS:
            headers["Content-Length"] = str(len(req.body or b""))
        for k, v in headers.items():
            lines.append(f"{k}: {v}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if req.stream_body is not None else head + (req.body or b"")

    async def _send_streamed(self, conn: _Conn, req: Request, timeout: float | None,
                             replied: asyncio.Future) -> bool:
        """Writes the head and the body piece by piece; each write (and each
        local read, in a worker thread) gets the whole timeout, so a large
        upload is bounded by progress rather than by its total time. Stops
        once ``replied`` is done (the server answered before the end: it
        refused the body). Returns whether the whole body went out."""
        length, chunks = req.stream_body.open()
        try:
            async with _compat.timeout(timeout):
                conn.writer.write(self._encode(req, length))
                await conn.writer.drain()
            while not replied.done():
                chunk = await asyncio.to_thread(next, chunks, None)
                if chunk is None:
                    if length is None:
                        async with _compat.timeout(timeout):
                            conn.writer.write(b"0\r\n\r\n")
                            await conn.writer.drain()
                    return True
                if length is None:
                    chunk = b"%X\r\n%s\r\n" % (len(chunk), chunk)
                async with _compat.timeout(timeout):
                    conn.writer.write(chunk)
                    await conn.writer.drain()
            return False
        finally:
            try:
                chunks.close()
            except ValueError:  # cancelled while a worker thread was reading it
                pass

    async def _attempt(self, req: Request, stream: bool) -> Response | AsyncStream:
        timeout = req.timeout(self.timeout)
        conn, reused = await self._acquire(timeout)
        owned: _Conn | None = conn
        reusable = False
        got_reply = False
        streamed = req.stream_body is not None
        complete = True
        head_task: asyncio.Future | None = None
        try:
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            if streamed:
                # The reply is read while the body goes out: a server may
                # refuse it early (413) and stop reading or close, and its
                # answer must not be lost behind the failed write.
                head_task = asyncio.ensure_future(_read_head_block(conn.reader))
                try:
                    complete = await self._send_streamed(conn, req, timeout, head_task)
                except OSError as e:  # TimeoutError included
                    complete = False
                    try:
                        async with _compat.timeout(1.0):
                            await asyncio.shield(head_task)
                    except (OSError, asyncio.IncompleteReadError, _ProtocolError, ValueError):
                        pass
                    if not head_task.done() or head_task.exception() is not None:
                        raise e
                deadline = None if timeout is None else loop.time() + timeout
            else:
                async with _compat.timeout_at(deadline):
                    conn.writer.write(self._encode(req))
                    await conn.writer.drain()
            async with _compat.timeout_at(deadline):
                if head_task is not None:
                    status, headers, keep_alive = await head_task
                else:
                    status, headers, keep_alive = await _read_head(conn.reader)
                got_reply = True
                body = _Body(conn.reader, req.method, status, headers, keep_alive)
                if stream and status < 400:
                    owned = None  # ownership moves to the stream
                    return AsyncStream(self, conn, status, headers, body, timeout)
                try:
                    data = await body.read_all()
                except (OSError, asyncio.IncompleteReadError):
                    if complete:
                        raise
                    data = b""  # refused mid-body and gone: the status says enough
                reusable = body.reusable_when_done and complete and (not streamed or status < 400)
                return Response(status, headers, data)
        except _compat.TIMEOUT_ERRORS:
            raise timed_out(req, timeout) from None
        except (OSError, asyncio.IncompleteReadError, _ProtocolError, ValueError) as e:
            # ValueError: a line over the StreamReader limit.
            raise RetryableError(e, fresh_retry=reused and not got_reply) from None
        finally:
            if head_task is not None:
                if not head_task.done():
                    head_task.cancel()
                elif not head_task.cancelled():
                    head_task.exception()  # retrieved: no "never retrieved" warning
            if owned is not None:
                self._release(owned, reusable)

    # -- retries -----------------------------------------------------------

    async def _send(self, req: Request, stream: bool) -> Response | AsyncStream:
        attempt = 0
        resent = False
        fresh_used = False
        while True:
            req.mark_attempt(resent)
            try:
                result = await self._attempt(req, stream)
            except RetryableError as e:
                if not req.resendable():
                    raise unavailable(req, e, attempt + 1) from None
                if e.fresh_retry and not fresh_used:
                    fresh_used = resent = True
                    continue
                if attempt >= self.retry.retries:
                    raise unavailable(req, e, attempt + 1) from None
                await asyncio.sleep(self.retry.delay(attempt))
                attempt += 1
                resent = True
                continue
            delay = status_retry_delay(self.retry, result.status, result.headers, attempt)
            if delay is not None and req.resendable():
                if isinstance(result, AsyncStream):
                    result.close()
                await asyncio.sleep(delay)
                attempt += 1
                resent = True
                continue
            if isinstance(result, AsyncStream):
                return result
            return finish(req, result, resent)

    async def request(self, req: Request) -> Response:
        """Send ``req`` with retries; return the response or raise DSecError
        (or, for a streamed body, the OSError reading it locally)."""
        try:
            result = await self._send(req, stream=False)
        except BodyReadError as e:
            raise e.cause from None
        assert isinstance(result, Response)
        return result

    async def stream(self, req: Request) -> AsyncStream:
        """Like :meth:`request`, but hand back a 2xx response before reading
        its body. Retries happen only before the response starts."""
        result = await self._send(req, stream=True)
        if isinstance(result, Response):
            raise DSecError("internal", f"unexpected status {result.status}", result.status)
        return result
