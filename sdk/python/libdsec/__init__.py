"""libdsec: Python SDK for the DSec sandbox engine.

Blocking::

    from libdsec import DSecClient
    with DSecClient("http://127.0.0.1:7070", token="...") as client:
        with client.create(image="host", memory_mb=512) as sb:
            print(sb.run_shell("python3 -c 'print(1)'").stdout)

A :class:`SandboxSpec` holds the same fields (``client.create(spec)``).

Asyncio: :class:`AsyncDSecClient` has the same methods as coroutines.
Every failure raises :class:`DSecError` (``.code``, ``.message``, ``.status``).
"""

from .aio import AsyncDSecClient, AsyncSandbox, AsyncShell
from .client import DSecClient, Sandbox, Shell
from .errors import (
    BadRequestError,
    BuildFailedError,
    ConflictError,
    DSecError,
    DSecTimeoutError,
    ForbiddenError,
    GoneError,
    InternalError,
    NotFoundError,
    OverCapacityError,
    QuotaExceededError,
    TooLargeError,
    UnauthorizedError,
    UnavailableError,
    UnprocessableError,
    UnsafeArchiveError,
)
from .models import (
    Build,
    BuildStep,
    DSecContainerRunArgs,
    ExecEvent,
    ExecResult,
    ExecStatus,
    FileEntry,
    FnCallResult,
    Image,
    ImageConfig,
    ImageLayer,
    SandboxSpec,
)

__version__ = "0.1.0"

__all__ = [
    "DSecClient",
    "AsyncDSecClient",
    "Sandbox",
    "AsyncSandbox",
    "Shell",
    "AsyncShell",
    "SandboxSpec",
    "DSecContainerRunArgs",
    "ExecResult",
    "ExecStatus",
    "FnCallResult",
    "ExecEvent",
    "FileEntry",
    "Image",
    "ImageLayer",
    "ImageConfig",
    "Build",
    "BuildStep",
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
]
