"""What the SDK needs from Python 3.11 on 3.9 and 3.10 too (standard library only).

- ``timeout(seconds)`` / ``timeout_at(when)``: ``asyncio.timeout``/``asyncio.timeout_at`` where
  they exist (3.11+); before, an equivalent that cancels the enclosing task at the deadline and
  raises the builtin ``TimeoutError`` on the way out (as 3.11's do).
- ``TIMEOUT_ERRORS``: what a socket timeout raises: ``TimeoutError`` (3.10+, where
  ``socket.timeout`` is an alias of it) and ``socket.timeout`` (3.9, where it is not).
- ``parse_iso8601``: RFC 3339 timestamps as 3.11's ``fromisoformat`` reads them.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
from typing import Any, Optional

TIMEOUT_ERRORS = (TimeoutError, socket.timeout)


def parse_iso8601(text: str) -> datetime.datetime:
    """datetime.fromisoformat as 3.11 reads RFC 3339 ("Z", any number of fraction digits),
    on 3.9/3.10 too (theirs takes 3 or 6 digits and no "Z"). ValueError when malformed."""
    t = text.strip()
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)\.(\d+)(.*)$", t)
    if m:
        t = m.group(1) + "." + (m.group(2) + "000000")[:6] + m.group(3)
    return datetime.datetime.fromisoformat(t)


class _Timeout:
    """asyncio.timeout_at for Pythons without it: cancels the current task at `when` (the
    loop's clock) and turns that cancellation into TimeoutError."""

    def __init__(self, when: Optional[float]) -> None:
        self._when = when
        self._handle: Any = None
        self._task: Any = None
        self._fired = False

    async def __aenter__(self) -> "_Timeout":
        if self._when is not None:
            loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._handle = loop.call_at(self._when, self._fire)
        return self

    def _fire(self) -> None:
        self._fired = True
        if self._task is not None:
            self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._handle is not None:
            self._handle.cancel()
        if self._fired and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
        if exc_type is not None and issubclass(exc_type, asyncio.TimeoutError) and \
                not issubclass(exc_type, TimeoutError):
            raise TimeoutError from exc  # 3.9/3.10: asyncio's own is not the builtin one
        return False


def timeout_at(when: Optional[float]) -> Any:
    native = getattr(asyncio, "timeout_at", None)
    if native is not None and not _FORCE_FALLBACK:
        return native(when)
    return _Timeout(when)


def timeout(seconds: Optional[float]) -> Any:
    native = getattr(asyncio, "timeout", None)
    if native is not None and not _FORCE_FALLBACK:
        return native(seconds)
    when = None if seconds is None else asyncio.get_running_loop().time() + seconds
    return _Timeout(when)


# Tests set this to run the 3.9/3.10 path on a newer Python (tests/test_compat.py).
_FORCE_FALLBACK = False
