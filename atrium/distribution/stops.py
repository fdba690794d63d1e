"""An app's instances stopped around a change of its tree or its data, and brought back after.

A bind mount would keep serving the old tree, and a copy of runtime data taken while an instance
writes is not one state: every change to an installed app (install, update, rollback, restore,
export, uninstall) stops the app's instances first and starts the same ids again afterwards (so
each comes back to the same runtime data).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from atrium.distribution.operations import AppLocks
from atrium.errors import AtriumError, NotFound
from atrium.lifecycle.manager import LifecycleManager
from atrium.lifecycle.states import InstanceState
from atrium.registry import AppRegistry, UserApps
from atrium.scopes import Scope

_LOGGER = logging.getLogger(__name__)


class InstanceStops:
    """Stop and restart an app's instances for the distribution service."""

    def __init__(self, lifecycle: LifecycleManager, registry: UserApps) -> None:
        self._lifecycle = lifecycle
        self._registry = registry

    def _runs_from(self, app_id: str, owner: str, scope: Scope | None) -> bool:
        """Whether ``owner``'s instances of the app run the copy in ``scope`` (None: any), so a
        change there concerns them: a user scope is its one user's; the global scope concerns
        each user who sees its copy (not one whose own copy masks it)."""
        if scope is None:
            return True
        if scope is Scope.USER:
            return owner == self._registry.user
        seen = self._registry.registry.get(app_id, owner)
        return seen is None or seen.scope.priority <= scope.priority

    async def stop_all(
        self,
        app_id: str,
        scope: Scope | None = None,
        *,
        errored_too: bool = False,
        owner: str | None = None,
    ) -> list[str]:
        """Stop every instance of the app that runs the copy in ``scope`` (None: every one) and
        drain its warm pool (the bootstrap admin's) when it does; the ids of those that were
        running, to bring them back afterwards with the same ids. Another user's instances of
        another copy are never touched. ``owner``: only that user's instances (an operation on
        their own data of a shared app leaves everyone else's running)."""
        default = self._registry.registry.default_user
        if owner in (None, default) and self._runs_from(app_id, default, scope):
            await self._lifecycle.pool.drain(app_id)
        instances = [
            i
            for i in self._lifecycle.of_app(app_id)
            if not self._lifecycle.is_pooled(i)
            and self._runs_from(app_id, i.owner, scope)
            and owner in (None, i.owner)
        ]
        # a headless provider is not brought back: the next data request wakes the new version
        running = [
            i.id
            for i in instances
            if (errored_too or i.state is not InstanceState.ERROR)
            and not self._lifecycle.is_headless(i)
        ]
        for instance in instances:
            try:
                await self._lifecycle.remove(instance.id)
            except NotFound:
                continue  # gone meanwhile
            except AtriumError as err:
                _LOGGER.warning(
                    "%s %s: stopping for the install failed (%s); killing it",
                    app_id,
                    instance.id,
                    err.message,
                )
                with contextlib.suppress(NotFound):
                    await self._lifecycle.remove(instance.id, force=True)
        return running

    async def stop_if_visible(
        self, app_id: str, scope: Scope, *, errored_too: bool = False, owner: str | None = None
    ) -> list[str]:
        """`stop_all` when ``scope`` holds the app's visible copy (a masked copy runs nothing).
        ``errored_too``: an instance that failed is brought back too (a dev copy's save after
        one that did not start: the author's open tab is on it)."""
        visible = self._registry.get(app_id)
        if visible is not None and visible.scope.priority > scope.priority:
            return []
        return await self.stop_all(app_id, scope, errored_too=errored_too, owner=owner)

    @contextlib.asynccontextmanager
    async def stopped(
        self, app_id: str, scope: Scope, owner: str | None = None
    ) -> AsyncIterator[list[str]]:
        """The app's instances (``owner``'s only, when given) stopped for the block, started
        again after it whatever happened; yields the ids of those that were running."""
        stopped = await self.stop_if_visible(app_id, scope, owner=owner)
        try:
            yield stopped
        finally:
            await self.restart(app_id, stopped)

    async def restart(self, app_id: str, instance_ids: list[str]) -> dict[str, str]:
        """Start the given instances again (same ids) and refill the app's warm pool; a failure
        is logged and returned (instance id to message), never raised: the change that stopped
        them has happened."""
        failed: dict[str, str] = {}
        for instance_id in instance_ids:
            try:
                instance = await self._lifecycle.create(app_id, new=True, instance_id=instance_id)
            except AtriumError as err:
                _LOGGER.warning("%s: restarting an instance failed: %s", app_id, err.message)
                failed[instance_id] = err.message
                continue
            if instance.state is InstanceState.ERROR:  # a failed start is a state, not raised
                failed[instance_id] = instance.error or "it failed to start"
        if self._registry.get(app_id) is not None:
            self._lifecycle.spawn_task(
                self._lifecycle.pool.refill(app_id), f"warm-pool fill {app_id}"
            )
        return failed


class ChangedElsewhere:
    """With a scope folder several shells share: after another shell changed a scope (an install,
    update, rollback or uninstall there, heard as its `scope:changed` once this shell read the
    scope again), this shell's instances that run a copy their owner no longer sees are stopped
    and, while the app is still visible to that owner, brought back on the copy they see now,
    as a change made here does. They ran the old version on until they were closed (a woken
    provider until it was idle: every shell's data requests kept it busy), or an uninstalled
    app on. An app an operation here holds is left to it until it is over, then looked at
    again (what it brought back runs the new copy already)."""

    def __init__(self, lifecycle: LifecycleManager, registry: AppRegistry, locks: AppLocks) -> None:
        self._lifecycle = lifecycle
        self._registry = registry
        self._locks = locks
        self._task: asyncio.Task[None] | None = None
        self._again = False
        #: apps an operation here holds, to look at again once it is over (`_after`)
        self._waiting: set[str] = set()

    def heard(self) -> None:
        """A scope was read again: look (one look at a time; a change heard during one makes
        another after it)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = self._lifecycle.spawn_task(self._look(), "instances of a changed copy")

    def _stale(self) -> dict[tuple[str, str], bool]:
        """(app, owner) of the instances whose copy is not the one their owner sees now, and
        whether the app is still visible to that owner."""
        stale: dict[tuple[str, str], bool] = {}
        for instance in self._lifecycle.all():
            copy = self._registry.get(instance.app_id, instance.owner)
            if copy is None or copy.manifest != instance.manifest:
                stale[(instance.app_id, instance.owner)] = copy is not None
        return stale

    async def _look(self) -> None:
        while True:
            self._again = False
            #: apps an operation here held: looked at again once it is over, since it may have
            #: brought back only some of their instances (a user's backup stops that user's)
            held: set[str] = set()
            for (app_id, owner), visible in self._stale().items():
                if self._locks.is_held(app_id):
                    held.add(app_id)
                    continue
                try:
                    await self._renew(app_id, owner, visible)
                except AtriumError as err:
                    _LOGGER.warning("%s of %s: not renewed: %s", app_id, owner, err.message)
            for app_id in held - self._waiting:
                self._waiting.add(app_id)
                self._lifecycle.spawn_task(
                    self._after(app_id), f"renewal after the operation on {app_id}"
                )
            if not self._again:
                return

    async def _after(self, app_id: str) -> None:
        """Look again once the operation holding ``app_id`` is over (the others' changes are
        not held back meanwhile)."""
        try:
            await self._locks.released(app_id)
        finally:
            self._waiting.discard(app_id)
        self.heard()

    async def _renew(self, app_id: str, owner: str, visible: bool) -> None:
        stops = InstanceStops(self._lifecycle, UserApps(self._registry, owner))
        async with self._locks.hold(app_id, "a change made on another shell", here=True):
            stopped = await stops.stop_all(app_id, owner=owner)
            failed = await stops.restart(app_id, stopped) if visible else {}
        _LOGGER.info(
            "%s of %s changed on another shell: %d instances %s here%s",
            app_id,
            owner,
            len(stopped),
            "brought back on the new copy" if visible else "stopped (the app is gone)",
            f" ({len(failed)} did not come back)" if failed else "",
        )
