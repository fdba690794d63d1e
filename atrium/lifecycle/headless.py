"""Headless provider instances: woken by a data request, stopped when idle (docs/api.md
"Waking a provider").

A provider app that sets `dataProvider.wake` gets one headless instance when a data request finds
none of its instances `resumed`. Every request that arrives while it boots waits on the same boot
(one spawn for all); the callers give up after the app's `wakeTimeoutMs` each, the boot goes on.
Each user has their own: a request wakes the provider instance of the user it is made for (an
app's request: its owner's), never another user's. The instance has its own id
(`<appId>-provider`, or `<appId>~<owner>-provider` for a user other than the bootstrap admin;
on several shells each shell wakes its own, numbered past the others' rows, `…-provider2`, …) and
no view, so nothing the user opened is touched, but it runs on the data folder of that user's
first instance of the app (`<appId>-1`, `<appId>~<owner>-1`): a provider's data is the data its
app shows, whichever process serves it (decisions.md "Waking a provider", "Users: instances and
their data").
When it has had no data request for `idleTimeoutMs`, it is stopped and destroyed through the
normal moves (hooks and `app:state` events).

Like the warm pool, this owns which instances are headless (a table of ids, not a flag on the
instance); what it needs of the lifecycle manager is the narrow `WakeHost`.

Nothing wakes while a distribution operation (backup, restore, export, install, update,
rollback, import, uninstall) holds the app: those stop the app's instances so that what they
copy or swap is one state, and a provider started on the same data folder meanwhile would break
that. A wake first waits for the operation's end (`OperationGate`, the distribution's per-app
lock, given by the composition root), within the caller's ``wait``; the boot checks again right
before it creates the instance, with nothing awaited in between, so a wake asked just before an
operation began cannot slip in after its stop (decisions.md "Hardening: nothing wakes during an
operation; JSON at shutdown").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from atrium.errors import AtriumError, DatabaseLost
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.states import InstanceState
from atrium.state.locks import PING_EVERY

_LOGGER = logging.getLogger(__name__)
#: the headless instance's id is the app id plus this
SUFFIX: Final = "-provider"
#: after a failed wake, requests within this many seconds get its error without a new spawn
#: (anyone who may read an open entry can wake an app: a broken one must not cost a spawn each)
RETRY_AFTER: Final = 5.0


def is_provider_id(prefix: str, instance_id: str) -> bool:
    """Whether ``instance_id`` is one of the headless provider ids of ``prefix`` (one owner's
    of one app: `<prefix>provider`, `<prefix>provider2`, …)."""
    rest = instance_id.removeprefix(prefix)
    number = rest.removeprefix(SUFFIX[1:])
    return rest != instance_id and number != rest and (not number or number.isdigit())


class WakeHost(Protocol):
    """What waking asks of the lifecycle manager."""

    def find(self, instance_id: str) -> Instance | None: ...

    def of_owner(self, app_id: str, owner: str) -> list[Instance]: ...

    async def numbered(
        self, app_id: str, prefix: str, make: Callable[[set[str]], Instance | None]
    ) -> Instance | None: ...

    def holds(self, instance: Instance) -> bool: ...

    def new_instance(
        self,
        app_id: str,
        wanted: str | None = None,
        data_of: str | None = None,
        owner: str | None = None,
    ) -> Instance: ...

    def id_prefix(self, app_id: str, owner: str) -> str: ...

    async def boot_resumed(self, instance: Instance) -> None: ...

    async def remove(self, instance_id: str, *, force: bool = False) -> str | None: ...

    async def force(self, instance: Instance) -> None: ...

    def spawn_task(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...

    async def used_elsewhere(self, instance_id: str) -> str | None:
        """What the instance's row says of the last data request another shell sent it, as a
        mark to compare (None: never, or one shell)."""


class OperationGate(Protocol):
    """Whether an operation holds an app (the distribution's per-app lock), and its end."""

    def operation(self, app_id: str) -> str | None:
        """The operation holding ``app_id``, or None."""

    async def released(self, app_id: str) -> None:
        """Return once no operation holds ``app_id``."""


async def after_operation(gate: OperationGate, app_id: str, held: dict[str, int]) -> bool:
    """Return once no operation holds ``app_id``, counted in ``held`` (waiters per app) while it
    waits: a wake and a warm-pool refill wait the same way. True when it had to wait (the caller
    looks again)."""
    if gate.operation(app_id) is None:
        return False
    held[app_id] = held.get(app_id, 0) + 1
    try:
        await gate.released(app_id)
    finally:
        held[app_id] -= 1
        if not held[app_id]:
            del held[app_id]
    return True


class NoOperations:
    """The gate of a lifecycle manager with no distribution beside it: nothing is ever held."""

    def operation(self, app_id: str) -> str | None:
        return None

    async def released(self, app_id: str) -> None:
        return None


@dataclass(slots=True)
class Woken:
    """What the shell knows of one headless instance's wake and use."""

    idle_timeout: float
    asked_at: float
    #: wall time from the first held request to `resumed`, in ms (None while booting)
    wake_ms: float | None = None
    requests: int = 0
    in_flight: int = 0
    last_used: float = 0.0
    #: the mark of another shell's last request its idle stop last saw (`used_elsewhere`)
    noted: str | None = None

    def begin(self) -> None:
        self.requests += 1
        self.in_flight += 1
        self.last_used = time.monotonic()

    def end(self) -> None:
        self.in_flight -= 1
        self.last_used = time.monotonic()

    def wire(self) -> dict[str, Any]:
        return {
            "wakeMs": None if self.wake_ms is None else round(self.wake_ms, 1),
            "requests": self.requests,
            "idleTimeoutMs": round(self.idle_timeout * 1000),
        }


class HeadlessProviders:
    """The headless provider instances and the wakes in flight; see the module docstring."""

    def __init__(self, host: WakeHost, operations: OperationGate) -> None:
        self._host = host
        self._operations = operations
        self._woken: dict[str, Woken] = {}
        #: per (app id, owner)
        self._booting: dict[tuple[str, str], asyncio.Task[Instance]] = {}
        self._failed: dict[tuple[str, str], tuple[float, AtriumError]] = {}
        #: wakes started per app since the shell started
        self.wakes: dict[str, int] = {}
        #: the same per (app, user): what an instance object shows its owner
        self.wakes_of: dict[tuple[str, str], int] = {}
        #: requests per app waiting for the end of an operation before they wake it
        self.held: dict[str, int] = {}

    def holds(self, instance: Instance) -> bool:
        return instance.id in self._woken

    def record(self, instance_id: str) -> Woken | None:
        return self._woken.get(instance_id)

    def forget(self, instance: Instance) -> None:
        self._woken.pop(instance.id, None)

    def operation_on(self, app_id: str) -> str | None:
        """The operation holding ``app_id`` now (a wake waits for its end), or None."""
        return self._operations.operation(app_id)

    async def wake(self, app_id: str, owner: str, *, wait: float, idle_timeout: float) -> Instance:
        """``owner``'s headless instance of the app once `resumed`, booting it if needed (one
        boot for every caller), after any operation holding the app has ended. TimeoutError
        after ``wait`` s (a boot goes on); the boot's AtriumError when it failed."""
        async with asyncio.timeout(wait):
            while True:
                await after_operation(self._operations, app_id, self.held)
                instance = await asyncio.shield(self._boot_task(app_id, owner, idle_timeout))
                if self._operations.operation(app_id) is None:
                    return instance
                # an operation began while it booted (its stop ends it): wait for the end

    def _boot_task(self, app_id: str, owner: str, idle_timeout: float) -> asyncio.Task[Instance]:
        """The boot in flight for (``app_id``, ``owner``), or a new one; the last failure again
        within `RETRY_AFTER` s of it."""
        key = (app_id, owner)
        task = self._booting.get(key)
        failed = self._failed.get(key)
        if task is None and failed is not None and time.monotonic() - failed[0] < RETRY_AFTER:
            raise failed[1]
        if task is None:
            task = self._host.spawn_task(
                self._boot(app_id, owner, idle_timeout), f"wake {app_id} for {owner}"
            )
            self._booting[key] = task
            task.add_done_callback(lambda done: self._boot_done(key, done))
        return task

    def _boot_done(self, key: tuple[str, str], task: asyncio.Task[Instance]) -> None:
        if self._booting.get(key) is task:
            del self._booting[key]

    async def _boot(self, app_id: str, owner: str, idle_timeout: float) -> Instance:
        prefix = self._host.id_prefix(app_id, owner)
        for existing in self._host.of_owner(app_id, owner):
            if not is_provider_id(prefix, existing.id):
                continue
            if existing.state is InstanceState.RESUMED and self.holds(existing):
                return existing
            # a headless one left in `error` or half-stopped, or one this shell adopted
            await self._host.force(existing)
        instance = None
        while instance is None:
            # an operation that began since the wake was asked: its stop has listed the app's
            # instances already, so this one must not exist before the operation ends
            while self._operations.operation(app_id) is not None:
                await self._operations.released(app_id)
            instance = await self._host.numbered(
                app_id, f"{prefix}{SUFFIX[1:]}", self._new_provider(app_id, owner, idle_timeout)
            )
        woken = self._woken[instance.id]
        self.wakes[app_id] = self.wakes.get(app_id, 0) + 1
        self.wakes_of[(app_id, owner)] = self.wakes_of.get((app_id, owner), 0) + 1
        _LOGGER.info("%s: waking a headless provider instance %s", app_id, instance.id)
        try:
            await self._host.boot_resumed(instance)
        except AtriumError as err:
            _LOGGER.warning("%s: the provider did not wake: %s", app_id, err.message)
            self._failed[(app_id, owner)] = (time.monotonic(), err)
            raise
        self._failed.pop((app_id, owner), None)
        woken.wake_ms = (time.monotonic() - woken.asked_at) * 1000
        woken.last_used = time.monotonic()
        _LOGGER.info("%s %s: woke in %.0f ms", app_id, instance.id, woken.wake_ms)
        self._host.spawn_task(self._reap_when_idle(instance, woken), f"idle {instance.id}")
        return instance

    def hold(self, instance: Instance, idle_timeout: float) -> None:
        """A provider instance this shell adopted (taken over from a gone shell, or left by its
        own last run), held as one it woke: stopped once idle for ``idle_timeout`` s from now,
        and never handed out by a launch. Not handed a data request: the next wake for its
        owner finds it `started`, not `resumed`, and ends it for one of its own."""
        woken = self._woken[instance.id] = Woken(idle_timeout, time.monotonic())
        woken.last_used = time.monotonic()
        self._host.spawn_task(self._reap_when_idle(instance, woken), f"idle {instance.id}")

    def _new_provider(
        self, app_id: str, owner: str, idle_timeout: float
    ) -> Callable[[set[str]], Instance | None]:
        """``owner``'s provider instance in the index, numbered past ``taken`` (every shell's
        ids): `<prefix>provider`, else `<prefix>provider2`, … Each shell wakes its own for the
        requests it answers (their count and idle stop are where they arrive), and all were
        `<prefix>provider`: in one namespace the second shell's pod met the first one's Secret
        and its wake failed. None when an operation holds the app (checked again after the
        numbering's read, nothing awaited between the check and the instance in the index)."""
        prefix = self._host.id_prefix(app_id, owner)

        def make(taken: set[str]) -> Instance | None:
            if self._operations.operation(app_id) is not None:
                return None
            taken = taken | {i.id for i in self._host.of_owner(app_id, owner)}
            base = f"{prefix}{SUFFIX[1:]}"
            n = 1
            while (wanted := base if n == 1 else f"{base}{n}") in taken:
                n += 1
            instance = self._host.new_instance(app_id, wanted, data_of=f"{prefix}1", owner=owner)
            self._woken[instance.id] = Woken(idle_timeout, time.monotonic())
            return instance

        return make

    async def _reap_when_idle(self, instance: Instance, woken: Woken) -> None:
        """Stop and destroy the instance once it has had no data request for its idle time. A
        shell cut off from the shared database makes no move (DatabaseLost): the stop is put
        off, and made once the link is back if the instance is still idle then."""
        while await self._idle(instance, woken):
            _LOGGER.info(
                "%s %s: no data request for %.0f s; stopping it",
                instance.app_id,
                instance.id,
                woken.idle_timeout,
            )
            try:
                reason = await self._host.remove(instance.id)
            except DatabaseLost as err:
                _LOGGER.warning("%s: idle stop put off: %s", instance.id, err.message)
                await asyncio.sleep(PING_EVERY)
                continue
            if reason is not None:
                _LOGGER.warning("%s: idle headless instance forced out: %s", instance.id, reason)
            return

    async def _idle(self, instance: Instance, woken: Woken) -> bool:
        """Return once the instance has been idle for its idle time (True), or is gone (False).
        The requests other shells sent it count (they forward their data requests to it, and
        note them in its row: `InstanceRows.used`): a mark that changed since the last look is
        a request within the last idle time, whatever the noting shell's clock says (its time
        is never compared with this shell's: a clock an hour ahead held a provider an hour)."""
        while self._host.holds(instance):
            remaining = woken.last_used + woken.idle_timeout - time.monotonic()
            if woken.in_flight == 0 and remaining <= 0:
                try:
                    noted = await self._host.used_elsewhere(instance.id)
                except DatabaseLost:
                    noted = None  # the stop is put off by `remove` itself
                if noted is not None and noted != woken.noted:
                    woken.noted = noted
                    woken.last_used = time.monotonic()
                    continue
                return True
            await asyncio.sleep(
                max(remaining, 0.05) if woken.in_flight == 0 else woken.idle_timeout
            )
        return False
