"""A gone shell's pods taken over by another (docs/decisions.md "Several shells: pods taken
over"; PostgreSQL and the Kubernetes runner only).

Each shell holds a lock of its own on its beacon's session while it lives
(`Coordination.hold_shell`). Every `EVERY` s the leader reads the rows of other shells' pods
(runner ``kubernetes``, this namespace) and asks which of their shells still hold their lock
(once it has `settled`: a leader started or back from a loss less than `locks.SETTLE` s ago
takes nothing, since a restart of the server frees every shell lock for a moment);
each instance of a gone shell is taken over under that instance's advisory lock: the row moves
to this shell by a compare-and-set on its ``shell`` (a shell that came back, or another taker,
wins or loses there, never both), the pod is relabelled as this shell's and adopted with the
secrets of its Secret (the same pod, no hook runs again), the instance keeps its id and slug
(its app origin goes on working) and its views are read back from ``views`` (known by their
cookies' hashes). A pod that ended meanwhile gives one `app:crashed`, by the shell that won the
row, and the instance stays here in `error`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from atrium.errors import AtriumError, SpawnFailed
from atrium.lifecycle.instance import View
from atrium.state.schema import instances, views

if TYPE_CHECKING:
    from atrium.identity import AppTokens
    from atrium.lifecycle.manager import LifecycleManager
    from atrium.lifecycle.runners.kubernetes.runner import KubernetesRunner
    from atrium.state.database import Database
    from atrium.state.instances import InstanceRows
    from atrium.state.locks import Coordination

_LOGGER = logging.getLogger(__name__)
#: seconds between two looks for a gone shell's instances (on the leader)
EVERY: Final = 1.0
#: what a look reads of a row and the takeover acts on: read again as the row is moved, under
#: the instance's lock, and the same or nothing is taken
_LISTED: Final = ("app_id", "owner", "slug", "runner", "ref", "state")
#: states whose row may still name the pod the instance had, though its shell let it end (a
#: stop deletes the pod and writes no row after): taken over, that pod was gone, and the taker
#: announced a crash of an instance stopped on purpose (or crashed and announced already)
ENDED: Final = frozenset({"installed", "stopped", "error"})
#: seconds at most between two tries of an instance that cannot be taken over here (its app
#: not installed for its owner here, its id one of this shell's): the wait doubles from
#: `EVERY` up to this
LATER_MAX: Final = 60.0


class _Changed(Exception):
    """The row moved was no longer the one listed: its move is rolled back."""


class Takeover:
    """The leader's look for a gone shell's pods, every `EVERY` s (the module docstring)."""

    def __init__(
        self,
        manager: LifecycleManager,
        runner: KubernetesRunner,
        db: Database,
        rows: InstanceRows,
        coordination: Coordination,
        tokens: AppTokens | None = None,
    ) -> None:
        self._manager = manager
        self._tokens = tokens
        self._runner = runner
        self._db = db
        self._rows = rows
        self._coordination = coordination
        self._task: asyncio.Task[None] | None = None
        #: the instances said to be impossible to take over here (said once each, not each second)
        self._told: set[str] = set()
        #: instance id → (when it is tried again, the wait after that), for those refused here
        self._later: dict[str, tuple[float, float]] = {}
        #: the turns this shell took as leader (counted at their end, each a look or, before
        #: the coordination has `settled`, none)
        self.turns = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="pod takeover")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(EVERY)
            if not self._coordination.is_leader or self._coordination.lost is not None:
                continue
            # back after a loss of its own (a restart of the server ends every shell's
            # session), the other shells are given time to take their locks again
            if self._coordination.settled:
                try:
                    await self.once()
                except asyncio.CancelledError:
                    raise
                except Exception:  # the next turn tries again
                    _LOGGER.exception("taking over a gone shell's pods failed")
            self.turns += 1

    async def once(self) -> list[str]:
        """Take over every instance whose shell is gone; the ids taken."""
        async with self._db.connect() as conn:
            found = (
                await conn.execute(
                    sa.select(
                        instances.c.id,
                        instances.c.shell,
                        *(instances.c[name] for name in _LISTED),
                    ).where(
                        (instances.c.shell != self._rows.shell)
                        & (instances.c.runner == self._runner.name)
                    )
                )
            ).all()
        candidates = [
            row
            for row in found
            if isinstance(row.ref, dict)
            and row.ref.get("namespace") == self._runner.namespace
            and row.state not in ENDED
        ]
        alive = await self._coordination.shells_alive({row.shell for row in candidates})
        taken = []
        now = time.monotonic()
        listed = {row.id for row in candidates}
        for instance_id in [i for i in self._later if i not in listed]:  # taken or gone
            del self._later[instance_id]
            self._told.discard(instance_id)
        for row in candidates:
            if row.shell in alive or self._later.get(row.id, (0.0, 0.0))[0] > now:
                continue
            if await self._take(row):
                taken.append(row.id)
        return taken

    def _tell(self, instance_id: str, why: str) -> None:
        """A gone shell's instance this shell cannot hold: tried again later, each time twice as
        late (up to `LATER_MAX` s), and said once. Its pod runs on, served by every shell from
        its row, with no shell to watch it or call its hooks, until it can be taken (its app
        installed here) or its shell starts again on its home (which adopts it, or stops it if
        its app is not installed there either)."""
        wait = min(self._later.get(instance_id, (0.0, EVERY))[1] * 2, LATER_MAX)
        self._later[instance_id] = (time.monotonic() + wait, wait)
        if instance_id not in self._told:
            self._told.add(instance_id)
            _LOGGER.warning(
                "%s cannot be taken over here (tried again later, at most every %.0f s): %s",
                instance_id,
                LATER_MAX,
                why,
            )

    async def _take(self, row: Any) -> bool:
        manager = self._manager
        if manager.find(row.id) is not None:
            self._tell(row.id, "a gone shell's instance has the id of one of this shell's")
            return False
        try:
            # listed once its row is this shell's: until then its origin is served from the row
            # as before (listed from here, not serving and with no view, a request there found
            # no view in memory and dropped the view's row as one made for a stopped instance)
            instance = manager.new_instance(
                row.app_id, row.id, owner=row.owner, slug=row.slug, listed=False
            )
        except AtriumError as err:
            self._tell(row.id, err.message)
            return False
        won = False
        try:
            async with instance.lock:
                if await self._coordination.shells_alive({row.shell}):
                    return False  # back meanwhile: still its own
                try:
                    async with instance.lock.transaction() as tx:
                        moved = (
                            await tx.execute(
                                sa.update(instances)
                                .where(
                                    (instances.c.id == row.id) & (instances.c.shell == row.shell)
                                )
                                .values(shell=self._rows.shell)
                                .returning(*(instances.c[name] for name in _LISTED))
                            )
                        ).first()
                        if moved is None:
                            return False
                        if manager.find(row.id) is not None or any(
                            getattr(moved, name) != getattr(row, name) for name in _LISTED
                        ):
                            # the gone shell changed it after the list was read, before it went
                            # (stopped it, a new pod, another instance of that id), or this
                            # shell holds an instance of that id now: the row is put back as it
                            # is, and the next look reads it anew
                            raise _Changed
                        opened = (
                            await tx.execute(sa.select(views).where(views.c.slug == row.slug))
                        ).all()
                        # listed with its views as its row becomes this shell's (a failed
                        # commit drops it again): a request on its origin while the pod is
                        # taken over finds its view, and is told to retry until it serves
                        for view in opened:
                            instance.views[view.id] = View(
                                view.id,
                                "",
                                view.path,
                                client=view.client,
                                user=view.user_id,
                                digest=view.hash,
                            )
                        manager.adopt(instance)
                except _Changed:
                    return False
                won = True
                try:
                    survivor = await self._runner.take_over(row.ref)
                except Exception as err:  # noqa: BLE001 - any failure: tried again later
                    if isinstance(err, SpawnFailed) and err.fields.get("cause") == "exited":
                        _LOGGER.warning("%s %s: %s", row.app_id, row.id, err.message)
                        instance.views.clear()  # their next request drops them (`ViewDesk`)
                        instance.mark_crashed(-1, "exited")
                        instance.error = f"its pod ended while no shell held it: {err.message}"
                        if self._tokens is not None:
                            # its token's row names the gone shell: valid everywhere until gone
                            self._tokens.revoke_rows(row.id)
                        return True
                    # the API refused or failed (a Role without 'patch', an outage: the
                    # runner's SpawnFailed cause 'api' too): the row goes back to the gone
                    # shell and the next look tries again; the pod runs on
                    won = False
                    async with instance.lock.transaction() as tx:
                        await tx.execute(
                            sa.update(instances)
                            .where(
                                (instances.c.id == row.id) & (instances.c.shell == self._rows.shell)
                            )
                            .values(shell=row.shell)
                        )
                    _LOGGER.warning(
                        "%s %s: not taken over this time (%s: %s)",
                        row.app_id,
                        row.id,
                        type(err).__name__,
                        getattr(err, "message", err),
                    )
                    return False
                manager.adopt_one(instance, survivor)
            _LOGGER.warning(
                "%s %s taken over from the gone shell %s: %s",
                row.app_id,
                row.id,
                row.shell,
                survivor.ref,
            )
            return True
        finally:
            if not won:
                manager.drop(instance, keep_row=True)
