"""The SDK on Python 3.9 and 3.10: every module parses as 3.9 grammar, and the async client's
timeouts work without asyncio.timeout (the _compat fallback, forced here on a newer Python:
the async suite's timeout, streaming and retry tests run again on it)."""

from __future__ import annotations

import ast
import asyncio
import pathlib

import pytest

from libdsec import _compat

PKG = pathlib.Path(__file__).resolve().parents[1] / "libdsec"


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_parses_as_python_3_9(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


@pytest.fixture(autouse=True)
def fallback(monkeypatch):
    monkeypatch.setattr(_compat, "_FORCE_FALLBACK", True)


def test_fallback_timeout_fires_as_timeout_error():
    async def main():
        with pytest.raises(TimeoutError):
            async with _compat.timeout(0.05):
                await asyncio.sleep(5)
        async with _compat.timeout(5):  # not reached: nothing raised, nothing left scheduled
            await asyncio.sleep(0.01)
        async with _compat.timeout(None):
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with _compat.timeout_at(loop.time() + 0.05):
                await asyncio.sleep(5)
        # A cancellation from elsewhere stays a cancellation.
        task = asyncio.ensure_future(asyncio.sleep(5))

        async def inner():
            async with _compat.timeout(5):
                await task

        t = asyncio.ensure_future(inner())
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())


# The async client's own tests, again on the fallback (this module's autouse fixture).
from test_async import (  # noqa: E402,F401
    test_default_pool_serves_50_concurrent_calls as test_fallback_50_concurrent_calls,
    test_dropped_connections as test_fallback_dropped_connections,
    test_retry_503_same_request_id as test_fallback_retry_503,
    test_round_trip as test_fallback_round_trip,
    test_stream_is_incremental as test_fallback_stream_is_incremental,
    test_timeout_not_retried as test_fallback_timeout_not_retried,
)
