"""The warm pool: instances booted to `resumed` ahead of demand, per app (`warmPool` in the manifest).

The pool owns which instances are pooled (a set of ids, not a flag on the instance), follows the
registry itself (an app installed or changed refills its pool, one removed drains it) and hands
an instance over on `claim`, refilling behind it. What it needs of the lifecycle manager is the
narrow `PoolHost`.

Nothing is pooled while an operation holds the app (`OperationGate`, the distribution's per-app
lock): an update's registry event and its own restart both ask for a refill while it still holds
the app, and a pooled instance started then took the next free id, which is the id (and the
runtime data) of an instance the update was about to bring back. A refill waits for the
operation's end, and checks again before each instance it adds.

A spawn that fails is tried again after a pause (1 s, doubling to 60 s): once, it left the pool
empty until the next launch or install. The failed instance goes (nobody asked for it).

Of several shells on one database only the leader fills pools (`Coordination.is_leader`): a pool
is the bootstrap admin's, and each shell filling its own would boot it once per shell. A shell
that becomes leader fills every pool; one that stops leading refills nothing more (what it has
pooled is still handed out on its own launches). A pooled instance is numbered as a launch's is,
past every shell's rows (`LifecycleManager.numbered`): numbered from the leader's memory, it took
the id of another shell's instance, and its pod met that one's Secret (in one namespace) at every
try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final, Protocol

from atrium.bus import Event, EventBus
from atrium.errors import AtriumError
from atrium.events import APP_INSTALLED, APP_REMOVED, AppInstalled, AppRemoved
from atrium.lifecycle.headless import NoOperations, OperationGate, after_operation
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.states import InstanceState
from atrium.registry import AppRegistry
from atrium.state.locks import Coordination

_LOGGER = logging.getLogger(__name__)
#: seconds before a failed pool spawn is tried again, doubling with each failure in a row
RETRY_FIRST: Final = 1.0
RETRY_MAX: Final = 60.0


class PoolHost(Protocol):
    """What the pool asks of the lifecycle manager."""

    def of_app(self, app_id: str) -> list[Instance]: ...

    @property
    def bootstrap_user(self) -> str: ...

    def id_prefix(self, app_id: str, owner: str) -> str: ...

    def new_instance(self, app_id: str, *, taken_elsewhere: Collection[str] = ()) -> Instance: ...

    async def numbered(
        self, app_id: str, prefix: str, make: Callable[[set[str]], Instance | None]
    ) -> Instance | None: ...

    async def boot_resumed(self, instance: Instance) -> None: ...

    async def force(self, instance: Instance) -> None: ...

    def spawn_task(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...


class WarmPool:
    """Pre-spawned instances per app; see the module docstring."""

    def __init__(
        self,
        host: PoolHost,
        registry: AppRegistry,
        bus: EventBus,
        operations: OperationGate | None = None,
        coordination: Coordination | None = None,
    ) -> None:
        self._host = host
        self._coordination = coordination or Coordination()
        self._coordination.on_lead(self._lead)
        self._registry = registry
        self._bus = bus
        self._operations = operations or NoOperations()
        self._pooled: set[str] = set()
        self._closing = False
        #: refills per app waiting for the end of an operation holding it
        self.held: dict[str, int] = {}
        #: spawns failed in a row per app: the pause before the next try doubles
        self._failures: dict[str, int] = {}

    def holds(self, instance: Instance) -> bool:
        return instance.id in self._pooled

    def forget(self, instance: Instance) -> None:
        self._pooled.discard(instance.id)

    def close(self) -> None:
        self._closing = True

    def claim(self, app_id: str, owner: str) -> Instance | None:
        """A pooled instance of the app in `resumed` that belongs to ``owner``, now handed out;
        the pool refills. Pooled instances are the bootstrap admin's, booted on their data
        folders, so only they are served from the pool: anyone else's launch spawns their own
        (a pooled instance cannot change owner: its data folder and app token are whose it was
        booted for)."""
        pooled = next(
            (
                i
                for i in self._host.of_app(app_id)
                if self.holds(i) and i.owner == owner and i.state is InstanceState.RESUMED
            ),
            None,
        )
        if pooled is not None:
            self._pooled.discard(pooled.id)
            _LOGGER.info("%s %s: taken from the warm pool", app_id, pooled.id)
            self._host.spawn_task(self.refill(app_id), f"warm-pool refill {app_id}")
        return pooled

    async def refill(self, app_id: str) -> None:
        """Pre-spawn the app to `resumed` until its pool holds `warmPool` instances (of the copy
        visible then), each once no operation holds the app; only while this shell leads."""
        while not self._closing and self._coordination.is_leader:
            if await after_operation(self._operations, app_id, self.held):
                continue
            if self._full(app_id):
                return
            prefix = self._host.id_prefix(app_id, self._host.bootstrap_user)
            try:
                instance = await self._host.numbered(app_id, prefix, self._pool_one(app_id))
            except AtriumError as err:  # other shells took every id it tried
                await self._pause(app_id, err)
                continue
            if instance is None:
                continue  # an operation holds the app now, or its pool is full
            try:
                await self._host.boot_resumed(instance)
            except AtriumError as err:
                self._pooled.discard(instance.id)
                with contextlib.suppress(AtriumError):
                    await self._host.force(instance)  # no instance in error nobody asked for
                await self._pause(app_id, err)
                continue
            self._failures.pop(app_id, None)

    async def _pause(self, app_id: str, err: AtriumError) -> None:
        """Before the next try: a spawn that failed once (a start deadline met on a busy
        machine) left the pool empty until the next launch or install."""
        pause = min(RETRY_FIRST * 2 ** self._failures.get(app_id, 0), RETRY_MAX)
        self._failures[app_id] = self._failures.get(app_id, 0) + 1
        _LOGGER.warning(
            "%s: warm-pool spawn failed (tried again in %.0f s): %s", app_id, pause, err.message
        )
        await asyncio.sleep(pause)

    def _full(self, app_id: str) -> bool:
        copy = self._registry.get(app_id)
        size = copy.manifest.warm_pool_size if copy and copy.manifest else 0
        return self._size(app_id) >= size

    def _pool_one(self, app_id: str) -> Callable[[set[str]], Instance | None]:
        """A new pooled instance in the index, numbered past ``taken`` (every shell's ids), or
        None when an operation holds the app or the pool is full (both checked again after
        the numbering's read): nothing is awaited between these checks and the instance in the
        index."""

        def make(taken: set[str]) -> Instance | None:
            if self._operations.operation(app_id) is not None or self._full(app_id):
                return None
            if self._closing or not self._coordination.is_leader:
                return None
            instance = self._host.new_instance(app_id, taken_elsewhere=taken)
            self._pooled.add(instance.id)
            return instance

        return make

    def _size(self, app_id: str) -> int:
        return len([i for i in self._host.of_app(app_id) if self.holds(i)])

    def _lead(self) -> None:
        if not self._closing:
            self._host.spawn_task(self.fill_all(), "warm-pool fill (leader)")

    async def fill_all(self) -> None:
        if not self._coordination.is_leader:
            return
        for copy in self._registry.visible():
            if copy.manifest is not None and copy.manifest.warm_pool_size:
                self._host.spawn_task(self.refill(copy.id), f"warm-pool fill {copy.id}")

    async def drain(self, app_id: str) -> None:
        """Destroy the app's pooled instances (an operation's stop, an uninstall), each under its
        lock: one still booting is waited for. Ended inside the runner's spawn, before it had a
        child, its child started after its end, outside the index, on its data folder, through
        the operation that drained it and after."""
        for instance in [i for i in self._host.of_app(app_id) if self.holds(i)]:
            async with instance.lock:
                if self.holds(instance):  # (not claimed meanwhile: then the stop removes it)
                    await self._host.force(instance)

    def follow_registry(self) -> Callable[[], None]:
        """Keep the pools in step with the visible apps; returns the remover."""

        def on_app(event: Event) -> None:
            if event.data is not None and event.data.owner not in (
                None,
                self._registry.default_user,
            ):
                return  # the pool holds the bootstrap admin's instances: another user's view
            if isinstance(event.data, AppInstalled):
                app_id = event.data.app_id
                self._host.spawn_task(self.refill(app_id), f"warm-pool fill {app_id}")
            elif isinstance(event.data, AppRemoved):
                app_id = event.data.app_id
                self._host.spawn_task(self.drain(app_id), f"warm-pool drain {app_id}")

        return self._bus.listen((APP_INSTALLED, APP_REMOVED), on_app)
