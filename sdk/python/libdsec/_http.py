"""Transport-independent HTTP pieces shared by the sync and async clients:
endpoint parsing, the request/response values, the retry policy and the
decision of what a response means (retry, success, or which DSecError)."""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import quote, urlencode, urlsplit

from .errors import DSecError, error_from_response, make_error

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_TIMEOUT = 60.0
USER_AGENT = "libdsec/0.1.0"

# Only statuses that promise "nothing happened, try later" are retried:
# other 5xx may have had side effects the idempotency key cannot vouch for.
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Endpoint:
    """Where the API lives: TCP (``http``/``https``) or a unix socket."""

    scheme: str
    host: str
    port: int | None
    unix_path: str | None
    base_path: str

    @property
    def host_header(self) -> str:
        if self.unix_path is not None:
            return "localhost"
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port in (None, default) else f"{host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    """Parse ``http://host:port[/prefix]``, ``https://...`` or ``unix:///path.sock``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        # unix:///run/dsec/edge.sock -> netloc "" and path "/run/dsec/edge.sock";
        # tolerate unix://relative.sock (netloc holds the start of the path).
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise ValueError(f"no socket path in {url!r}")
        return Endpoint("unix", "localhost", None, path, "")
    if scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in {url!r} (want http, https or unix)")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    return Endpoint(scheme, parts.hostname, port, None, parts.path.rstrip("/"))


def port_url(endpoint: Endpoint, sandbox_id: str, port: int, path: str = "") -> str:
    """The port proxy's URL for a server on ``port`` inside the sandbox (send the API token
    with it). On a unix socket endpoint it is ``unix://SOCKET:/v1/...``: only clients that
    speak HTTP over unix sockets can use it."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be 1-65535, not {port!r}")
    rest = f"/v1/sandboxes/{seg(sandbox_id)}/ports/{port}/{path.lstrip('/')}"
    if endpoint.unix_path is not None:
        return f"unix://{endpoint.unix_path}:{rest}"
    return f"{endpoint.scheme}://{endpoint.host_header}{endpoint.base_path}{rest}"


def resolve_config(url: str | None, token: str | None) -> tuple[Endpoint, str | None]:
    """Apply the ``DSEC_URL`` / ``DSEC_TOKEN`` defaults for arguments left ``None``."""
    if url is None:
        url = os.environ.get("DSEC_URL") or DEFAULT_URL
    if token is None:
        token = os.environ.get("DSEC_TOKEN") or None
    return parse_url(url), token


def resolve_project(project: str | None) -> str | None:
    """The cluster project to act in: ``project``, else ``DSEC_PROJECT``, else none (a
    token acts in its own project; a cluster admin's in ``default``)."""
    if project is None:
        project = os.environ.get("DSEC_PROJECT") or None
    return project or None


FRESH_ID_HEADER = "Dsec-Fresh-Request-Id"


def new_request_id() -> str:
    return uuid.uuid4().hex


def seg(value: str) -> str:
    """Quote one path segment (ids, job and image names)."""
    return quote(str(value), safe="")


@dataclass
class Request:
    """One logical API call; the transports may send it several times.

    ``extra_wait`` is how long the server may legitimately take on top of a
    normal round trip (an exec's timeout, a ``wait_ms``); ``None`` means the
    server may take arbitrarily long, so no client timeout applies.
    ``gone_on_retry_ok`` makes a 404 on a retried attempt a success: the
    earlier attempt probably deleted the thing before its reply was lost.
    ``stream_body`` (an ``_upload.BodySource``), when set, replaces ``body``:
    the body is produced in pieces and never held whole.
    """

    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    extra_wait: float | None = 0.0
    gone_on_retry_ok: bool = False
    request_id: str | None = None
    stream_body: Any = None
    # The request id was made for this call (not given by the caller): its first attempt can
    # say so (FRESH_ID_HEADER), and a cluster's apiserver then skips asking the nodes whether
    # an earlier attempt reached one of them.
    fresh_id: bool = False

    def mark_attempt(self, resent: bool) -> None:
        """Before each attempt: the fresh-id header on the first one only."""
        if self.fresh_id and not resent:
            self.headers[FRESH_ID_HEADER] = "1"
        else:
            self.headers.pop(FRESH_ID_HEADER, None)

    def resendable(self) -> bool:
        """False for a streamed body that cannot start again (a pipe)."""
        return self.stream_body is None or bool(self.stream_body.replayable)

    def target(self, endpoint: Endpoint) -> str:
        # Keep '/', ':' and '=' literal so paths, image tags and label=k=v read
        # exactly like the contract's examples; everything else is %-escaped
        # (quote, not quote_plus: a space must not become '+').
        qs = urlencode(self.query, safe="/:=", quote_via=quote)
        return endpoint.base_path + self.path + (f"?{qs}" if qs else "")

    def timeout(self, base: float | None) -> float | None:
        if base is None or self.extra_wait is None:
            return None
        return base + self.extra_wait


def _clean_query(query: Iterable[tuple[str, Any]] | None) -> list[tuple[str, str]]:
    out = []
    for k, v in query or ():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "1" if v else "0"
        out.append((k, str(v)))
    return out


def json_request(
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    query: Iterable[tuple[str, Any]] | None = None,
    mutating: bool = True,
    request_id: str | None = None,
    extra_wait: float | None = 0.0,
    gone_on_retry_ok: bool = False,
) -> Request:
    """A request with a JSON body (or none).

    A mutating call gets one request id for all its attempts: inside the JSON
    body as ``request_id`` when there is a body, else as ``Idempotency-Key``
    (body-less POSTs like pause, and DELETEs).
    """
    headers: dict[str, str] = {}
    data = None
    rid = None
    if mutating:
        rid = request_id or new_request_id()
    if body is not None:
        payload = dict(body)
        if rid is not None:
            payload["request_id"] = rid
        data = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        headers["Content-Type"] = "application/json"
    elif rid is not None:
        headers["Idempotency-Key"] = rid
    return Request(
        method,
        path,
        _clean_query(query),
        data,
        headers,
        extra_wait,
        gone_on_retry_ok,
        rid,
        fresh_id=rid is not None and request_id is None,
    )


def raw_request(
    method: str,
    path: str,
    body: bytes,
    content_type: str,
    *,
    query: Iterable[tuple[str, Any]] | None = None,
    request_id: str | None = None,
) -> Request:
    """A mutating request with a raw body; its request id goes in ``Idempotency-Key``."""
    rid = request_id or new_request_id()
    headers = {"Content-Type": content_type, "Idempotency-Key": rid}
    return Request(method, path, _clean_query(query), bytes(body), headers, 0.0, False, rid,
                   fresh_id=request_id is None)


def stream_request(
    method: str,
    path: str,
    source: Any,
    content_type: str,
    *,
    query: Iterable[tuple[str, Any]] | None = None,
    request_id: str | None = None,
    extra_wait: float | None = 0.0,
) -> Request:
    """A mutating request whose body comes from ``source`` (an
    ``_upload.BodySource``); its request id goes in ``Idempotency-Key``."""
    rid = request_id or new_request_id()
    headers = {"Content-Type": content_type, "Idempotency-Key": rid}
    return Request(method, path, _clean_query(query), None, headers, extra_wait, False, rid,
                   source, fresh_id=request_id is None)


def base_headers(endpoint: Endpoint, token: str | None,
                 project: str | None = None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if project:
        headers["Dsec-Project"] = project
    return headers


@dataclass
class Response:
    """A fully read HTTP response; header names are lower case."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise make_error(
                "internal", f"invalid JSON from server: {e}", self.status
            ) from None


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class RetryPolicy:
    """When and how long to wait before re-sending a request.

    ``retries`` is the number of re-sends after the first attempt (default 5,
    i.e. at most 6 attempts; 0 disables retrying). The n-th retry waits
    ``d/2 + uniform(0, d/2)`` with ``d = min(backoff_cap, backoff_base * 2**n)``:
    jitter spreads out thousands of clients, the floor keeps the wait growing
    while a daemon restarts. A ``Retry-After`` header replaces the backoff
    (capped at ``retry_after_cap``, plus a little jitter).
    """

    retries: int = 5
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    retry_after_cap: float = 30.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError("retries must be >= 0")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, self.retry_after_cap) + random.uniform(0, self.backoff_base)
        d = min(self.backoff_cap, self.backoff_base * (2 ** min(attempt, 30)))
        return d / 2 + random.uniform(0, d / 2)


def status_retry_delay(
    policy: RetryPolicy, status: int, headers: Mapping[str, str], attempt: int
) -> float | None:
    """The wait before retrying a response with ``status``, or None to not retry."""
    if status not in RETRY_STATUSES or attempt >= policy.retries:
        return None
    # A quota (a cluster's) is final, but for a create rate: its room is back next second.
    if headers.get("dsec-quota-exceeded", "creates_per_s") != "creates_per_s":
        return None
    return policy.delay(attempt, parse_retry_after(headers.get("retry-after")))


def finish(req: Request, resp: Response, resent: bool) -> Response:
    """Turn an HTTP error into a DSecError; apply the 404-on-retry rule."""
    if resp.status == 404 and resent and req.gone_on_retry_ok:
        return Response(204, resp.headers, b"")
    if resp.status >= 400:
        raise error_from_response(
            resp.status, resp.body, parse_retry_after(resp.headers.get("retry-after"))
        )
    return resp


def unavailable(req: Request, cause: BaseException | str, attempts: int) -> DSecError:
    return make_error(
        "unavailable",
        f"{req.method} {req.path} failed after {attempts} attempt(s): {cause}",
        None,
    )


def timed_out(req: Request, timeout: float | None) -> DSecError:
    return make_error(
        "timeout", f"{req.method} {req.path}: no response within {timeout}s", None
    )


class RetryableError(Exception):
    """A failed exchange that can be re-sent (the request id makes it safe).

    ``fresh_retry`` marks a failure on a reused keep-alive connection before
    any response byte: the server most likely closed the idle connection, so
    the transports re-send once at once on a new connection, outside the
    retry budget.
    """

    def __init__(self, cause: BaseException | str, fresh_retry: bool = False) -> None:
        super().__init__(str(cause))
        self.fresh_retry = fresh_retry
