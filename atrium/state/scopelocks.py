"""One writer per scope repository among shells that share the scope folder and one PostgreSQL
database (docs/decisions.md "Several shells: the scope repositories").

A write of a scope (`atrium.git.ScopeRepo.writing`: an install's swap, record and commit, a trust
store, a remote, a recovery) holds ``pg_advisory_xact_lock`` of the scope's key on a database
transaction of its own for its whole duration: the lock is the transaction's, so it ends with the
transaction, or with the session when the shell dies or is cut off, and never outlives its holder.
Before each change is committed the writer checks that transaction still answers (the fence): a
shell that lost the database writes nothing more, since another may hold the lock by then. At the
end, the same transaction appends `scope:changed` (the scope, owned by its user for a user scope),
so every other shell reads the scope again: inotify does not see another machine's writes.

SQLite (one shell, one machine) has no guard: the repository's own in-process lock is the whole
lock, and no event is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from atrium.errors import DatabaseLost
from atrium.events import ScopeChanged
from atrium.git import Fence
from atrium.scopes import Scope
from atrium.state.locks import PING_TIMEOUT, lock_key

if TYPE_CHECKING:
    from atrium.bus import EventBus
    from atrium.state.database import Database

#: how many scope writes of one shell hold (or wait for) their lock's transaction at once; the
#: others wait in the shell, holding no connection: each holds one of the pool's (5, and 10 more
#: on demand) for the whole write, and twenty members installing at once took all of them, so
#: every KV write, sign-in and event of the shell waited for the pool's 30 s timeout
HELD_AT_ONCE: Final = 4


def scope_key(name: str) -> int:
    """The advisory-lock key of the scope named ``name``: ``global`` or ``users/<id>``."""
    return lock_key("scope", name)


def scope_of(scopes_root: Path, root: Path) -> tuple[str, Scope, str | None]:
    """Which scope the repository at ``root`` is: its name, scope and owner (a user scope's
    user, None for the global scope). ValueError for a folder that is neither."""
    parts = root.relative_to(scopes_root).parts
    if parts == ("global",):
        return "global", Scope.GLOBAL, None
    if len(parts) == 2 and parts[0] == "users":
        return f"users/{parts[1]}", Scope.USER, parts[1]
    raise ValueError(f"{root} is no scope repository under {scopes_root}")


class ScopeLocks:
    """The `atrium.git.WriteGuard` of every scope repository of a shell on PostgreSQL (`guard`;
    None on SQLite). ``bus`` is set once the bus is open: recovery at start writes before it,
    and its events are read by the other shells only (this one reads the table from its newest
    row on). ``shared``: the scope folder is one of its own (``ATRIUM_SCOPES_DIR``), which other
    shells may write."""

    def __init__(self, db: Database, scopes_root: Path, *, shared: bool) -> None:
        self._db = db
        self._root = scopes_root
        self._shared = shared
        self._slots = asyncio.Semaphore(HELD_AT_ONCE)
        self.bus: EventBus | None = None

    @property
    def guard(self) -> ScopeLocks | None:
        """What each scope repository holds while written: these locks on PostgreSQL, nothing
        on SQLite (one shell: the repository's own lock is the whole lock, and no event)."""
        return self if self._db.dialect == "postgresql" else None

    @property
    def watch(self) -> bool:
        """Whether the registry watches the scope folders with inotify: not when other shells
        write them (another machine's writes are not seen, and on one machine every shell's
        watcher would announce each change once more); their `scope:changed` says when to read
        a scope again, and a hand edit there is read at the next write or start."""
        return self.guard is None or not self._shared

    @asynccontextmanager
    async def hold(self, root: Path, announce: Callable[[], bool]) -> AsyncIterator[Fence]:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        from atrium.state.events import append

        name, scope, owner = scope_of(self._root, root)
        async with self._slots, self._db.transaction() as tx:
            await tx.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": scope_key(name)})
            taken = time.monotonic()

            async def fence() -> None:
                lost = self._db.link_lost_at
                if lost is not None and lost >= taken:
                    raise DatabaseLost(f"the writer lock of the {name} scope may be gone")
                try:
                    async with asyncio.timeout(PING_TIMEOUT):
                        await tx.execute(text("SELECT 1"))
                except (TimeoutError, SQLAlchemyError, OSError) as err:
                    self._db.link_lost()
                    raise DatabaseLost(f"the writer lock of the {name} scope is gone") from err

            yield fence
            if not announce():
                return
            payload = ScopeChanged(scope.value, owner=owner)
            stored = await append(tx, payload.TOPIC, payload.owner, payload.wire())
        if self.bus is not None:
            self.bus.committed([(stored, payload)])
