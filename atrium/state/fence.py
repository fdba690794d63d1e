"""No write for a request that began before this shell last lost its link to the state database.

A request that reached a shell just before its database link broke may wait through the loss (for
a connection from the pool, behind a read) and go on once the link is back. By then the client
and the load balancer have given up on it (the client may have written the same key again through
another shell), and the shell's database sessions of that time are gone with every lock they held:
its write would land after newer ones, a write nobody was told of. So a write transaction that a
request's own task begins is refused (`DatabaseLost`, 503) when the shell noticed a loss of its
database link after the request arrived (`state.database.Database.transaction`).

Only the request's own task is fenced, not tasks it started (the bus's writer, a boot): those
carry the request's context but are not answering it. The mark is a context variable set by the
HTTP entry point (`request_began`); this module imports no SQLAlchemy, so the entry point loads
none by importing it.
"""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar

#: the task answering the current request, and when the request arrived (monotonic seconds)
_REQUEST: ContextVar[tuple[asyncio.Task[object] | None, float] | None] = ContextVar(
    "atrium_request_began", default=None
)


def request_began() -> None:
    """Mark the current task as answering a request that arrives now."""
    _REQUEST.set((asyncio.current_task(), time.monotonic()))


def began_before(moment: float) -> bool:
    """Whether the current task answers a request that arrived before ``moment`` (monotonic)."""
    mark = _REQUEST.get()
    return mark is not None and mark[0] is asyncio.current_task() and mark[1] < moment
