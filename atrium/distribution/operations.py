"""What every distribution operation needs around it: a scope that may change, the per-app lock,
a staging directory that removes itself, and running the install stage to its end even when the
client goes away."""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeVar

from atrium.distribution.journal import JournalStore
from atrium.errors import (
    Busy,
    ScopeNeedsRepair,
    StorageFailed,
    StorageFull,
    SystemScopeImmutable,
)
from atrium.scopes import Scope, ScopeLayout

T = TypeVar("T")


def mutable(scope: Scope, action: str, journals: JournalStore | None = None) -> Scope:
    """``scope`` if it may change; with ``journals``, also refuses a scope that needs repair."""
    if not scope.is_mutable:
        raise SystemScopeImmutable(action)
    if journals is not None and (unreadable := journals.unreadable(scope)):
        raise ScopeNeedsRepair(scope.value, [str(p) for p in unreadable])
    return scope


class SharedOperations(Protocol):
    """The operation locks every shell on one database and scope folder honours
    (`atrium.state.locks.Coordination.operation`)."""

    def operation(self, app_id: str, operation: str) -> AbstractAsyncContextManager[None]: ...


class AppLocks:
    """One operation per app id at a time; a second one is refused (409 busy), never queued.

    The lock is also what keeps the app quiet while an operation has its instances stopped: a
    data request's wake (`lifecycle.headless`, through the composition root) asks `operation`
    and waits on `released` before it starts anything, so no process of the app starts on its
    data between the stop and the operation's end.

    ``shared``: with several shells on one scope folder, an operation also holds the app's lock
    among them, so an uninstall through one shell is refused while another shell backs the app
    up (docs/decisions.md "Several shells: one operation per app among them"). `operation` and
    `released` answer for this shell's operations only: another shell's stop and restart of
    its own instances are its own."""

    def __init__(self, shared: SharedOperations | None = None) -> None:
        self._held: dict[str, tuple[str, asyncio.Event]] = {}
        self._shared = shared

    @asynccontextmanager
    async def hold(self, app_id: str, operation: str, *, here: bool = False) -> AsyncIterator[None]:
        """``here``: this shell's lock only (a renewal of this shell's own instances, which
        changes nothing the other shells share)."""
        running = self._held.get(app_id)
        if running is not None:
            raise Busy(app_id, running[0])
        ended = asyncio.Event()
        # marked before the first await: a second operation here is refused at once
        self._held[app_id] = (operation, ended)
        try:
            if self._shared is None or here:
                yield
            else:
                async with self._shared.operation(app_id, operation):
                    yield
        finally:
            del self._held[app_id]
            ended.set()

    def is_held(self, app_id: str) -> bool:
        return app_id in self._held

    def operation(self, app_id: str) -> str | None:
        """The operation holding ``app_id`` (install, update, backup, …), or None."""
        held = self._held.get(app_id)
        return held[0] if held is not None else None

    async def released(self, app_id: str) -> None:
        """Return once no operation holds ``app_id`` (at once when none does)."""
        while (held := self._held.get(app_id)) is not None:
            await held[1].wait()


@asynccontextmanager
async def staging(layout: ScopeLayout, journals: JournalStore, scope: Scope) -> AsyncIterator[Path]:
    """A fresh ``scopes/<scope>/.staging/<opId>/`` (same filesystem as the scope, outside `apps/`),
    removed on exit unless a journal still refers to it (recovery needs it then)."""
    path = layout.staging_dir(scope) / secrets.token_hex(8)
    try:
        path.mkdir(parents=True)
    except OSError as err:  # a full or read-only scope: named, not 500 internal (issue 14)
        error = StorageFull if err.errno == errno.ENOSPC else StorageFailed
        raise error(
            f"cannot create the staging folder {path.parent}: {err}", path=str(path.parent)
        ) from err
    # in a folder other shells share, a starting shell takes a staging folder nobody touched for
    # an hour for a kill's (`Installer._clear_staging`): one under way is touched meanwhile,
    # whatever its fetch or its stop takes
    touching = asyncio.ensure_future(_touch_while(path)) if layout.shared else None
    try:
        yield path
    finally:
        if touching is not None:
            touching.cancel()
        if not journals.exists(scope, path.name):
            await asyncio.to_thread(shutil.rmtree, path, True)


#: seconds between two touches of a staging folder under way in a shared scope folder
STAGING_TOUCH_EVERY = 300.0


async def _touch_while(path: Path) -> None:
    while True:
        await asyncio.sleep(STAGING_TOUCH_EVERY)
        with suppress(OSError):  # gone: nothing left to keep
            os.utime(path)


async def run_to_completion(coro: Coroutine[Any, Any, T] | asyncio.Future[T]) -> T:
    """Await ``coro`` to its end even if the caller is cancelled (a client that hangs up while
    its app is being swapped must not leave it half-installed); the caller's cancellation is
    raised afterwards."""
    task = asyncio.ensure_future(coro)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
    return task.result()


async def in_thread(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a worker thread, awaited to its end even if the caller is cancelled
    (then the cancellation is raised after it). `asyncio.to_thread` gives the thread up at a
    cancellation (a shutdown's, when its grace ends) while it goes on: the operation's cleanup
    then ran under a copy still writing (its staging folder removed, the app's lock released,
    its instances started again), and a restore exchanged a half-removed copy in as the app's
    data. The thread's future is no task, so nothing else can cancel it either."""
    loop = asyncio.get_running_loop()
    return await run_to_completion(loop.run_in_executor(None, functools.partial(func, *args)))
