"""Blocking transport on http.client: keep-alive connections, one idle
connection per thread, retries."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
import weakref
from typing import Iterator

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


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over an AF_UNIX stream socket."""

    def __init__(self, path: str, timeout: float | None = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _looks_alive(conn: http.client.HTTPConnection) -> bool:
    """Cheap check that an idle keep-alive connection was not closed by the
    server: an idle HTTP connection must have nothing to read, so readable
    (EOF or stray bytes) means it is unusable."""
    sock = conn.sock
    if sock is None:
        return False
    # A socket with a timeout polls before recv even with MSG_DONTWAIT, so
    # switch it to non-blocking for the peek.
    prev = sock.gettimeout()
    try:
        sock.settimeout(0.0)
        sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return True
    except ValueError:
        return True  # SSL sockets refuse recv flags; rely on the fresh retry
    except OSError:
        return False
    finally:
        try:
            sock.settimeout(prev)
        except OSError:
            pass
    return False


def _early_response(conn: http.client.HTTPConnection) -> http.client.HTTPResponse | None:
    """The reply a server sent before it stopped reading our body, if any."""
    if conn.sock is None:
        return None
    try:
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None


class _OpenStream:
    """A response whose body is read incrementally by the caller."""

    def __init__(self, transport: "SyncTransport", conn, resp, timeout) -> None:
        self._transport = transport
        self._conn = conn
        self._resp = resp
        self._timeout = timeout
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    def iter_chunks(self) -> Iterator[bytes]:
        """Yield body bytes as they arrive; closing early drops the connection
        (the server then kills a streamed command)."""
        finished = False
        try:
            while True:
                try:
                    chunk = self._resp.read1(_READ_SIZE)
                except _compat.TIMEOUT_ERRORS:
                    raise DSecError(
                        "timeout", f"stream stalled for {self._timeout}s", None
                    ) from None
                except (OSError, http.client.HTTPException) as e:
                    raise DSecError("unavailable", f"stream broken: {e!r}", None) from None
                if not chunk:
                    break
                yield chunk
            finished = True
        finally:
            self._finish(reusable=finished and not self._resp.will_close)

    def close(self) -> None:
        self._finish(reusable=False)

    def _finish(self, reusable: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._release(conn, reusable)


class SyncTransport:
    """Sends Requests with retries over per-thread keep-alive connections.

    Each thread keeps at most one idle connection, so a client object can be
    shared by many threads without locking around requests. A call made while
    the thread's connection is busy (e.g. inside an exec_stream loop) simply
    opens another. After ``os.fork`` the child drops inherited connections.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str | None,
        timeout: float | None,
        retry: RetryPolicy,
        ssl_context: ssl.SSLContext | None = None,
        project: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.retry = retry
        self._headers = base_headers(endpoint, token, project)
        self._ssl_context = ssl_context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()

    # -- connections -------------------------------------------------------

    def _new_conn(self, timeout: float | None) -> http.client.HTTPConnection:
        ep = self.endpoint
        if ep.unix_path is not None:
            conn = UnixHTTPConnection(ep.unix_path, timeout=timeout)
        elif ep.scheme == "https":
            conn = http.client.HTTPSConnection(
                ep.host, ep.port, timeout=timeout, context=self._ssl_context
            )
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout)
        with self._lock:
            self._conns.add(conn)
        return conn

    def _idle_list(self) -> list:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            # Inherited across fork: the parent still uses those sockets.
            local.pid = os.getpid()
            local.idle = []
        return local.idle

    def _acquire(self, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        idle = self._idle_list()
        while idle:
            conn = idle.pop()
            if _looks_alive(conn):
                conn.sock.settimeout(timeout)
                return conn, True
            conn.close()
        return self._new_conn(timeout), False

    def _release(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        idle = self._idle_list()
        if reusable and conn.sock is not None and not idle:
            idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close every connection this transport opened, in every thread.
        The transport stays usable and reconnects on the next request."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.close()
            except OSError:
                pass
        self._idle_list().clear()

    # -- one attempt -------------------------------------------------------

    def _attempt(self, req: Request, stream: bool) -> Response | _OpenStream:
        timeout = req.timeout(self.timeout)
        conn, reused = self._acquire(timeout)
        headers = dict(self._headers)
        headers.update(req.headers)
        target = req.target(self.endpoint)
        reusable = False
        chunks = None
        try:
            if conn.sock is None:
                try:
                    conn.connect()
                except OSError as e:  # refused, missing socket file, connect timeout
                    raise RetryableError(e) from None
            body = req.body
            if req.stream_body is not None:
                # http.client sends an iterable as is after a Content-Length
                # header, and chunked without one.
                length, chunks = req.stream_body.open()
                body = chunks
                if length is not None:
                    headers["Content-Length"] = str(length)
            try:
                conn.request(req.method, target, body=body, headers=headers)
                resp = conn.getresponse()
            except _compat.TIMEOUT_ERRORS:
                raise timed_out(req, timeout) from None
            except (OSError, http.client.HTTPException) as e:
                # A server may refuse a streamed body early (413) and close:
                # its answer can still be there to read.
                resp = _early_response(conn) if chunks is not None else None
                if resp is None:
                    # Nothing of the reply was read: safe to re-send (request id).
                    raise RetryableError(e, fresh_retry=reused) from None
                reusable = False
            if stream and resp.status < 400:
                opened = _OpenStream(self, conn, resp, timeout)
                conn = None  # ownership moves to the stream
                return opened
            try:
                body = resp.read()
            except _compat.TIMEOUT_ERRORS:
                raise timed_out(req, timeout) from None
            except (OSError, http.client.HTTPException) as e:
                raise RetryableError(e) from None
            reusable = not resp.will_close and (chunks is None or resp.status < 400)
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
        finally:
            if chunks is not None:
                chunks.close()
            if conn is not None:
                self._release(conn, reusable)

    # -- retries -----------------------------------------------------------

    def _send(self, req: Request, stream: bool) -> Response | _OpenStream:
        attempt = 0  # retries used
        resent = False
        fresh_used = False
        while True:
            req.mark_attempt(resent)
            try:
                result = self._attempt(req, stream)
            except RetryableError as e:
                if not req.resendable():
                    raise unavailable(req, e, attempt + 1) from None
                if e.fresh_retry and not fresh_used:
                    fresh_used = resent = True
                    continue
                if attempt >= self.retry.retries:
                    raise unavailable(req, e, attempt + 1) from None
                time.sleep(self.retry.delay(attempt))
                attempt += 1
                resent = True
                continue
            delay = status_retry_delay(self.retry, result.status, result.headers, attempt)
            if delay is not None and req.resendable():
                if isinstance(result, _OpenStream):
                    result.close()
                time.sleep(delay)
                attempt += 1
                resent = True
                continue
            if isinstance(result, _OpenStream):
                return result
            return finish(req, result, resent)

    def request(self, req: Request) -> Response:
        """Send ``req`` with retries; return the response or raise DSecError
        (or, for a streamed body, the OSError reading it locally)."""
        try:
            result = self._send(req, stream=False)
        except BodyReadError as e:
            raise e.cause from None
        assert isinstance(result, Response)
        return result

    def stream(self, req: Request) -> _OpenStream:
        """Like :meth:`request`, but hand back a 2xx response before reading
        its body. Retries happen only before the response starts."""
        result = self._send(req, stream=True)
        if isinstance(result, Response):  # an error response, already read
            finish(req, result, False)
            raise DSecError("internal", f"unexpected status {result.status}", result.status)
        return result
