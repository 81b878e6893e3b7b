"""Errors raised by libdsec.

Every failure the SDK reports is a :class:`DSecError`. Server errors carry the
``code`` and ``message`` of the JSON error body and the HTTP ``status``;
client-side failures (the server could not be reached, a timeout, an unsafe
archive) use ``status=None`` and one of the client codes below.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .models import Build

__all__ = [
    "DSecError",
    "BadRequestError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "GoneError",
    "ConflictError",
    "TooLargeError",
    "UnprocessableError",
    "OverCapacityError",
    "QuotaExceededError",
    "UnavailableError",
    "InternalError",
    "DSecTimeoutError",
    "UnsafeArchiveError",
    "BuildFailedError",
    "error_from_response",
]


class DSecError(Exception):
    """An error reported by the DSec API or by the SDK itself.

    Attributes:
        code: machine-readable code, e.g. ``"not_found"``; see the API contract.
            Client-side codes: ``"unavailable"`` (server unreachable after the
            retries), ``"timeout"`` (no response in time), ``"unsafe_archive"``.
        message: one human-readable line.
        status: the HTTP status, or ``None`` when no response was received.
        retry_after: seconds from the ``Retry-After`` header, when given.

    Constructing ``DSecError(code, message, status)`` directly is allowed; the
    SDK itself raises the subclass matching the code (e.g. :class:`NotFoundError`),
    so ``except DSecError`` catches everything and ``e.code`` is always set.
    """

    def __init__(
        self,
        code: str,
        message: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        # Passing every field to Exception keeps instances picklable, which
        # matters when they cross multiprocessing boundaries in trainers.
        super().__init__(code, message, status, retry_after)
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r})"
        )


class BadRequestError(DSecError):
    """400 bad_request: malformed request, unknown field, value out of range."""


class UnauthorizedError(DSecError):
    """401 unauthorized: missing or wrong token."""


class ForbiddenError(DSecError):
    """403 forbidden."""


class NotFoundError(DSecError):
    """404 not_found: unknown sandbox, exec, shell, file, image or route."""


class GoneError(NotFoundError):
    """410 gone: the sandbox existed and its node removed it by itself.

    A :class:`NotFoundError` too (``except NotFoundError`` still catches it).
    ``reason`` says why: ``"ttl"`` or ``"idle"`` (its ``ttl_s`` or ``idle_ttl_s``
    ran out), ``"failed"``, ``"job"`` (its job was deleted) or ``"lost"`` (an
    edge restart could not re-adopt it); ``at`` when, in ms since the epoch.
    Nodes keep these for an hour by default; after that, and after an explicit
    delete, the id is simply not found.
    """

    def __init__(
        self,
        code: str,
        message: str = "",
        status: int | None = None,
        retry_after: float | None = None,
        reason: str | None = None,
        at: int | None = None,
    ) -> None:
        super().__init__(code, message, status, retry_after)
        self.args = (code, message, status, retry_after, reason, at)
        self.reason = reason
        self.at = at


class ConflictError(DSecError):
    """409 conflict: wrong state, or an idempotency key reused with another body."""


class TooLargeError(DSecError):
    """413 too_large."""


class UnprocessableError(DSecError):
    """422 unprocessable: well-formed but not supported (e.g. microvm for now)."""


class OverCapacityError(DSecError):
    """429 over_capacity: node full or too many concurrent execs (after retries)."""


class QuotaExceededError(DSecError):
    """429 quota_exceeded: a create does not fit a quota of its chain (a cluster).

    Attributes ``level`` (``"org"``, ``"project/<p>"``, ``"token/<p>/<name>"``),
    ``quota`` (``"sandboxes"``, ``"memory_mb"``, ``"cpu"``, ``"creates_per_s"``),
    ``limit``, ``usage`` and ``asked``. Not retried by the SDK, but for
    ``creates_per_s`` (room comes back the next second)."""

    level: str | None = None
    quota: str | None = None
    limit: float | None = None
    usage: float | None = None
    asked: float | None = None


class UnavailableError(DSecError):
    """503 unavailable, or the server could not be reached after the retries."""


class InternalError(DSecError):
    """500 internal."""


class DSecTimeoutError(DSecError):
    """No response within the client-side timeout (code ``"timeout"``).

    Not retried automatically: the server may still be working on the request.
    Retrying with the same ``request_id`` is safe and returns its result.
    """


class UnsafeArchiveError(DSecError):
    """A downloaded archive member would escape the destination directory,
    is an absolute or escaping link, or is a device/fifo (code ``"unsafe_archive"``)."""


class BuildFailedError(DSecError):
    """An image build the SDK waited for failed or was canceled.

    ``build`` is its final :class:`~libdsec.Build` (``.state``, ``.error``,
    ``.steps``; the log stays readable with ``build_log(build.id)``). ``code``
    is ``"build_failed"`` or ``"build_canceled"``; ``status`` is ``None`` (the
    requests themselves succeeded).
    """

    def __init__(self, build: "Build") -> None:
        canceled = build.state == "canceled"
        what = build.error or build.state
        super().__init__(
            "build_canceled" if canceled else "build_failed",
            f"build {build.id} of {build.name} {build.state}: {what}",
            None,
        )
        self.build = build

    def __reduce__(self):  # type: ignore[override]
        # Picklable (e.g. across multiprocessing) although __init__ takes the build.
        return (type(self), (self.build,))


_CODE_CLASSES: dict[str, type[DSecError]] = {
    "bad_request": BadRequestError,
    "unauthorized": UnauthorizedError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "gone": GoneError,
    "conflict": ConflictError,
    "too_large": TooLargeError,
    "unprocessable": UnprocessableError,
    "over_capacity": OverCapacityError,
    "quota_exceeded": QuotaExceededError,
    "unavailable": UnavailableError,
    "internal": InternalError,
    "timeout": DSecTimeoutError,
    "unsafe_archive": UnsafeArchiveError,
}

_STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "too_large",
    422: "unprocessable",
    429: "over_capacity",
    500: "internal",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def make_error(
    code: str, message: str, status: int | None = None, retry_after: float | None = None
) -> DSecError:
    """Build the :class:`DSecError` subclass registered for ``code``."""
    cls = _CODE_CLASSES.get(code, DSecError)
    return cls(code, message, status, retry_after)


def fallback_code(status: int) -> str:
    """The error code implied by an HTTP status when the body has none."""
    if status in _STATUS_CODES:
        return _STATUS_CODES[status]
    return "internal" if status >= 500 else "bad_request"


def error_from_response(
    status: int, body: bytes, retry_after: float | None = None
) -> DSecError:
    """Map an HTTP error response to a :class:`DSecError`.

    Uses the ``{"error": {"code", "message"}}`` body when it parses; otherwise
    (a proxy page, an empty body) derives the code from the status and keeps
    a bounded excerpt of the body as the message.
    """
    code = message = None
    err: object = None
    try:
        err = json.loads(body)["error"]
        code, message = err.get("code"), err.get("message")
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    if not isinstance(code, str) or not code:
        code = fallback_code(status)
    if not isinstance(message, str):
        message = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
    e = make_error(code, message, status, retry_after)
    if isinstance(e, QuotaExceededError) and isinstance(err, dict):
        for k in ("level", "quota"):
            v = err.get(k)
            setattr(e, k, v if isinstance(v, str) else None)
        for k in ("limit", "usage", "asked"):
            v = err.get(k)
            setattr(e, k, v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    if isinstance(e, GoneError) and isinstance(err, dict):
        reason, at = err.get("reason"), err.get("at")
        e.reason = reason if isinstance(reason, str) else None
        e.at = at if isinstance(at, int) and not isinstance(at, bool) else None
        e.args = (code, message, status, retry_after, e.reason, e.at)
    return e


def error_from_stream_line(err: Mapping[str, object]) -> DSecError:
    """Map a final ``{"error": {...}}`` line of an NDJSON exec stream."""
    code = err.get("code") if isinstance(err.get("code"), str) else "internal"
    message = err.get("message") if isinstance(err.get("message"), str) else ""
    return make_error(str(code), str(message), None)
