"""The lifecycle manager: every move of every instance, over the instance index it extends.

Each action takes the instance's lock, runs the hook that belongs to each move (decisions.md
"Lifecycle": hooks run before the move is committed), then commits it through `Instance.enter`.
Errors choose states: a failed spawn or `onCreate` goes to `error`; any other failed hook leaves the
state the move started from. A child that dies while running is a crash (`mark_crashed`).

The jobs around the moves live beside it, each reaching back through a narrow protocol: `index`
(the live instances), `booting` (spawn, health, crash watch, teardown), `activities`, `views`
(tickets, cookies, the stop after the last view), `trials` (an update's check instance),
`warmpool` and `headless`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from sqlalchemy.exc import SQLAlchemyError

from atrium.bus import EventBus
from atrium.errors import (
    AtriumError,
    Busy,
    DatabaseLost,
    HookFailed,
    InstanceElsewhere,
    InvalidRequest,
    LifecycleTransitionError,
    NotFound,
    NotServing,
    PermissionDenied,
    ShuttingDown,
)
from atrium.identity import AppTokens
from atrium.lifecycle.activities import Activities
from atrium.lifecycle.asked import (
    ACTIVITY,
    ACTIVITY_END,
    DELETE,
    DELETE_FORCE,
    RELEASE_USER,
    RELEASE_VIEW,
    AskedActions,
)
from atrium.lifecycle.booting import STOP_GRACE, Booter, LifecycleConfig
from atrium.lifecycle.calls import call_hook
from atrium.lifecycle.headless import (
    HeadlessProviders,
    NoOperations,
    OperationGate,
    is_provider_id,
)
from atrium.lifecycle.index import InstanceIndex, new_slug
from atrium.lifecycle.instance import Activity, Instance
from atrium.lifecycle.limits import Limits
from atrium.lifecycle.ports import PortAllocator
from atrium.lifecycle.runners import LogChunk, Runner, Survivor
from atrium.lifecycle.runners.process import read_log_file
from atrium.lifecycle.states import HOOK_BEFORE, TRANSITIONS, Hook, InstanceState
from atrium.lifecycle.trials import Trials
from atrium.lifecycle.unheld import PodCheck
from atrium.lifecycle.views import ViewDesk
from atrium.lifecycle.warmpool import WarmPool
from atrium.registry import AppCopy, AppRegistry
from atrium.state.instances import InstanceRow, InstanceRows
from atrium.state.locks import Coordination
from atrium.upstream import UpstreamClient

if TYPE_CHECKING:
    from atrium.lifecycle.takeover import Takeover

__all__ = ["STOP_GRACE", "LifecycleConfig", "LifecycleManager"]

_LOGGER = logging.getLogger(__name__)
S = InstanceState
#: states a view release stops the instance from (when it was the last view)
STOPPABLE: Final = frozenset({S.STARTED, S.RESUMED, S.PAUSING, S.PAUSED})
#: seconds a launch waits for its row to be written before it answers (several shells)
ROW_WAIT: Final = 5.0
#: how many ids a launch tries while other shells take each at once (several shells)
NUMBERING_TRIES: Final = 5


class LifecycleManager(InstanceIndex):
    """Owns every instance (the index it extends); all lifecycle actions go through it."""

    def __init__(
        self,
        *,
        runner: Runner,
        registry: AppRegistry,
        bus: EventBus,
        upstream: UpstreamClient,
        tokens: AppTokens,
        ports: PortAllocator,
        config: LifecycleConfig,
        operations: OperationGate | None = None,
        may_run: Callable[[str], bool] | None = None,
        coordination: Coordination | None = None,
        rows: InstanceRows | None = None,
    ) -> None:
        """``operations``: which apps a distribution operation holds (no wake starts then).
        ``may_run(owner)``: whether that user may have instances running (not disabled or
        removed; default: everyone), asked before and again after an instance of theirs boots.
        ``coordination``: the instance locks and the leader of several shells on one database
        (default: this shell alone). ``rows``: the instances' rows for other shells (a
        PostgreSQL database's)."""
        super().__init__(registry, bus, config.layout, coordination, rows)
        self._upstream = upstream
        self._config = config
        self._tasks: set[asyncio.Task[Any]] = set()
        self._booter = Booter(
            runner=runner,
            registry=registry,
            upstream=upstream,
            tokens=tokens,
            ports=ports,
            config=config,
            spawn_task=self.spawn_task,
        )
        self._activities = Activities(upstream, bus)
        self.views = ViewDesk(self, rows)
        #: the leader's look for a gone shell's pods (PostgreSQL with the Kubernetes runner)
        self.takeover: Takeover | None = None
        #: actions asked of other shells' pods, and done here for theirs (several shells only)
        self.asked = AskedActions(self, rows) if rows is not None else None
        #: whether another shell's pod may be sent requests at its row's address (several
        #: shells only: a pod whose shell is gone is asked of the cluster first)
        self.pods = PodCheck(self.coordination, runner) if rows is not None else None
        self._operations = operations or NoOperations()
        self._may_run = may_run or (lambda _owner: True)
        self.pool = WarmPool(self, registry, bus, self._operations, self.coordination)
        self.headless = HeadlessProviders(self, self._operations)
        self.trials = Trials(self)
        #: set by shutdown: nothing boots after it (an operation ending later brings nothing back)
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
        if self.pods is not None:
            await self.pods.close()

    @property
    def runner_name(self) -> str:
        return self._booter.runner.name

    @property
    def limit_ceilings(self) -> Limits:
        """The administrator's ceilings of every instance's ``resources`` (none without
        `Cgroups`, as in unit tests)."""
        cgroups = self._config.cgroups
        return cgroups.ceilings if cgroups is not None else Limits()

    def is_pooled(self, instance: Instance) -> bool:
        return self.pool.holds(instance)

    def is_headless(self, instance: Instance) -> bool:
        return self.headless.holds(instance)

    async def logs(self, instance: Instance, lines: int, after: str | None = None) -> LogChunk:
        """Its output, from the runner's handle while it runs, else from the log file a local
        runner left (a pod's log goes with its pod)."""
        if instance.child is not None:
            return await instance.child.logs(lines, after)
        return read_log_file(instance.log_path, lines, after)

    async def logs_elsewhere(
        self, row: InstanceRow, lines: int, after: str | None = None
    ) -> LogChunk | None:
        """Another shell's pod's log, read from the cluster's API as its own shell reads it
        (a pod in this shell's namespace); None when this shell's runner cannot."""
        read = getattr(self._booter.runner, "pod_logs", None)
        ref = row.ref or {}
        pod, namespace = ref.get("pod"), ref.get("namespace")
        if read is None or not isinstance(pod, str) or not pod:
            return None
        if namespace != getattr(self._booter.runner, "namespace", None):
            return None
        chunk: LogChunk = await read(pod, lines, after)
        return chunk

    def ports_in_use(self) -> int:
        return self._booter.ports_in_use()

    def _forget(self, instance: Instance) -> None:
        instance.views.clear()
        self.pool.forget(instance)
        self.headless.forget(instance)
        self.trials.forget(instance)
        self.drop(instance)

    # -- creating -------------------------------------------------------------------------------

    async def create(
        self,
        app_id: str,
        *,
        new: bool = False,
        instance_id: str | None = None,
        owner: str | None = None,
    ) -> Instance:
        """Reuse ``owner``'s live instance of the app unless ``new``, else a warm-pool one (the
        bootstrap admin's only: `warmpool`), else spawn one and walk it `installed → … →
        started`. ``owner``: the user it is for (default the bootstrap admin; with
        ``instance_id``, the one that id names). ``instance_id`` brings back a given instance
        (same id, same runtime data), as an update does after replacing the app.

        No new instance is spawned while an operation holds the app (409 busy): it has the app's
        instances stopped so that what it copies or swaps is one state (the instances it brings
        back itself, with their ``instance_id``, are its own).

        On several shells it answers once the instance's row is written as it is then: the
        caller's next call (a view, through the balancer) may reach another shell, which reads
        the row, and refused the view while the row still said `creating`."""
        if owner is None:
            owner = self.owner_of(app_id, instance_id) if instance_id else self._layout.user
        self._refuse_stopped_owner(owner)
        if not new:
            instance = self.live_of(app_id, owner)
            if instance is not None:
                if instance.state is S.STOPPED:
                    await self.act(instance.id, "start")
                await self._row_written()
                return instance
            pooled = self.pool.claim(app_id, owner)
            if pooled is not None:
                await self._row_written()
                return pooled
        operation = self._operations.operation(app_id) if instance_id is None else None
        if operation is not None:
            raise Busy(app_id, operation)
        instance = await self._numbered(app_id, instance_id, owner)
        async with self._unmade_if_lost(instance), instance.lock:
            await self._boot_owned(instance)
        await self._row_written()
        return instance

    async def _numbered(self, app_id: str, instance_id: str | None, owner: str) -> Instance:
        """A new instance in the index: numbered past the ids of every shell's rows, and its row
        written before it boots (`numbered`). Each shell numbered its own, so two shells gave
        one owner's instances of an app one id: its pods, Secrets and claims (named by id, in
        one namespace) clashed, the second launch failed, and every list showed the id
        twice."""
        if self.rows is None:
            return self.new_instance(app_id, instance_id, owner=owner)
        if instance_id is not None:
            return await self._claimed_again(app_id, instance_id, owner)
        made = await self.numbered(
            app_id,
            self.id_prefix(app_id, owner),
            lambda taken: self.new_instance(app_id, owner=owner, taken_elsewhere=taken),
        )
        if made is None:  # pragma: no cover - ``make`` always makes one
            raise Busy(app_id, "numbering a new instance")
        return made

    async def _claimed_again(self, app_id: str, instance_id: str, owner: str) -> Instance:
        """An instance brought back under its own id (after a change of its app stopped it),
        its row claimed as a new one's: while it was stopped its id was free, and another
        shell's launch may have numbered its own with it. Brought back then, two shells held one
        id: on a cluster the second's pod, Secret and claim clashed with the first's, and with a
        shared scope folder both ran on one data folder. InstanceElsewhere then."""
        assert self.rows is not None  # noqa: S101 - several shells only
        instance = self.new_instance(app_id, instance_id, owner=owner)
        try:
            if await self.rows.claim(instance):
                return instance
        except SQLAlchemyError:
            return instance  # cut off: the boot is refused by the instance lock anyway
        self._forget(instance)
        raise InstanceElsewhere(
            f"instance {instance_id} was not brought back: another shell launched an instance "
            "under its id while it was stopped (that one keeps its data)",
            instanceId=instance_id,
        )

    async def numbered(
        self, app_id: str, prefix: str, make: Callable[[set[str]], Instance | None]
    ) -> Instance | None:
        """The one door every new instance's id goes through (a launch's, the warm pool's, a
        headless provider's, a trial's): ``make`` puts an instance in the index with an id free
        of the ids given (those of every shell's rows that start with ``prefix``; none on one
        shell) and of this shell's, or gives None (then so does this: its caller looks again).
        On several shells its row is written at once: the id is the table's key, so of two
        shells numbering at once one row is written and the other shell numbers again (at most
        `NUMBERING_TRIES`, then 409 busy)."""
        if self.rows is None:
            return make(set())
        for _ in range(NUMBERING_TRIES):
            try:
                taken = await self.rows.ids_taken(prefix)
            except SQLAlchemyError:
                taken = set()  # cut off: the boot is refused by the instance lock anyway
            instance = make(taken)
            if instance is None:
                return None
            try:
                if await self.rows.claim(instance):
                    return instance
            except SQLAlchemyError:
                return instance  # its row is written by the writer once the link is back
            self._forget(instance)
        raise Busy(app_id, "numbering a new instance (other shells took each id tried)")

    def live_of(self, app_id: str, owner: str) -> Instance | None:
        """The owner's instance of the app a launch hands out (not pooled, headless, a trial or
        in error), if this shell runs one. Only one numbered as a launch numbers
        (`<prefix><n>`): a provider or trial taken over from a gone shell (or adopted from
        this shell's last run) is none of this shell's headless or trial instances, and was
        handed out as the owner's page instance."""
        prefix = self.id_prefix(app_id, owner)
        live = [
            i
            for i in self.of_owner(app_id, owner)
            if i.id.removeprefix(prefix).isdigit()
            and not self.is_pooled(i)
            and not self.is_headless(i)
            and not self.trials.holds(i)
            and i.state is not S.ERROR
        ]
        return live[0] if live else None

    async def _row_written(self) -> None:
        """Until this shell's rows are written as its instances are now (bounded: a shell cut
        off from the database answers anyway, its row written once the link is back)."""
        if self.rows is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(self.rows.flush(), ROW_WAIT)

    async def boot_resumed(self, instance: Instance) -> None:
        """Boot a new instance and walk it to `resumed` headless (the warm pool's)."""
        async with self._unmade_if_lost(instance), instance.lock:
            await self._boot_owned(instance)
            await self._resumed(instance)

    @asynccontextmanager
    async def _unmade_if_lost(self, instance: Instance) -> AsyncIterator[None]:
        """A new instance whose boot a cut-off shell refused (DatabaseLost) before it left
        `installed` goes out of the index: left there, it was listed, and the next launch of
        the app handed it out as the owner's live instance, never booted."""
        try:
            yield
        except DatabaseLost:
            if instance.state is S.INSTALLED:
                self._forget(instance)
            raise

    def _refuse_stopped_owner(self, owner: str, instance: Instance | None = None) -> None:
        if not self._may_run(owner):
            if instance is not None:
                self._forget(instance)
            raise PermissionDenied(
                f"user {owner!r} is disabled or removed: no instance of theirs runs"
            )

    async def _boot_owned(self, instance: Instance) -> None:
        """`_boot` for an instance of a user, who is asked about before and after: a user
        disabled (or removed) while their instance was booting had their instances stopped by
        a sweep that could not see this one yet, so it ends here instead of outliving them."""
        self._refuse_stopped_owner(instance.owner, instance)
        await self._boot(instance)
        if not self._may_run(instance.owner):
            await self.force(instance)
            self._refuse_stopped_owner(instance.owner)

    async def _boot(self, instance: Instance) -> None:
        """`installed|error → creating → created → starting → started` (the caller holds the lock).

        Refused once the manager has shut down: an operation whose copy outlived the shutdown
        grace restarts the instances it stopped when it ends, and a child spawned then would
        outlive every instance the shutdown destroyed."""
        if self._closed:
            self._forget(instance)
            raise ShuttingDown()
        instance.enter(S.CREATING)
        instance.error = None
        await self._booter.spawn(instance)
        await self._move(instance, S.CREATED, failure_state=S.ERROR)
        await self._move(instance, S.STARTING)
        instance.enter(S.STARTED)

    async def boot(self, instance: Instance) -> None:
        """`installed → … → started` under the instance's lock (a trial's)."""
        async with instance.lock:
            await self._boot(instance)

    async def trial(self, copy: AppCopy, data_dir: Path) -> float:
        """Boot the staged version ``copy`` as `<appId>-check` (`trials`: `<appId>-check2`, …
        while another shell tries it) on the empty ``data_dir``, then remove it; how long it took (s). InstallFailed when it does not start (`trials`)."""
        manifest = copy.manifest
        if manifest is None:  # pragma: no cover - the pipeline validated it
            raise InvalidRequest(f"{copy.id}: no valid manifest to try")
        base = f"{copy.id}-check"
        old = self.find(base)
        if old is not None and not self.trials.holds(old):
            await self.force(old)  # one a trial of this shell left

        def make(taken: set[str]) -> Instance:
            # numbered past every shell's: two shells trying the app at once made one pod name
            taken = taken | set(self._instances)
            n = 1
            while (instance_id := base if n == 1 else f"{base}{n}") in taken:
                n += 1
            return self.trials.enter(
                Instance(
                    id=instance_id,
                    app_id=copy.id,
                    scope=copy.scope,
                    app_dir=copy.path,
                    data_dir=data_dir,
                    manifest=manifest,
                    slug=new_slug(),
                    bus=self._bus,
                    source=copy,
                    owner=self._layout.user,
                    lock=self.coordination.instance(instance_id),
                )
            )

        instance = await self.numbered(copy.id, base, make)
        if instance is None:  # pragma: no cover - ``make`` always makes one
            raise Busy(copy.id, "numbering a trial instance")
        return await self.trials.run(copy, instance)

    # -- moves ----------------------------------------------------------------------------------

    async def _move(
        self,
        instance: Instance,
        target: InstanceState,
        failure_state: InstanceState | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """Run the hook that belongs to ``state → target`` (if any), then commit the move.

        A failed hook leaves the state as it was (or moves to ``failure_state``), emits
        `app:lifecycle.error` and raises HookFailed.
        """
        current = instance.state
        instance.lock.check()  # a shell that lost the lock calls no hook
        if target not in TRANSITIONS[current]:
            instance.enter(target)  # raises LifecycleTransitionError and reports it
        hook = HOOK_BEFORE.get(target)
        # an image app does not speak the contract: its hook steps pass through (the move is
        # made, nothing is sent); an app that exited gets no onDestroy
        skip = instance.manifest.runtime is not None or (
            hook is Hook.ON_DESTROY
            and (instance.child is None or instance.child.status is not None)
        )
        if hook is not None and not skip:
            try:
                await call_hook(
                    self._upstream.session,
                    instance.address,
                    hook.value,
                    {"instanceId": instance.id, "appId": instance.app_id, **(body or {})},
                    instance.manifest.hook_timeout_ms,
                )
            except HookFailed as err:
                if not self.holds(instance) or instance.state is not current:
                    raise
                instance.report_error(current, target, err.message)
                instance.error = err.message
                if failure_state is not None:
                    await self._booter.teardown(instance)
                    instance.enter(failure_state)
                raise
        if not self.holds(instance) or instance.state is not current:
            # forced out, or crashed, while the hook ran: the move no longer applies
            raise LifecycleTransitionError(
                instance.id, instance.state, target, app_id=instance.app_id
            )
        instance.enter(target)

    async def act(self, instance_id: str, action: str) -> Instance:
        """One action of the instances API (decisions.md "Lifecycle")."""
        handler = self._ACTIONS.get(action)
        if handler is None:
            raise InvalidRequest(
                f"unknown action {action!r}; actions: {', '.join(sorted(self._ACTIONS))}"
            )
        instance = self.get(instance_id)
        async with instance.lock:
            if not self.holds(instance):
                raise NotFound("instance", instance_id)
            await handler(self, instance)
        return instance

    async def _resume(self, instance: Instance) -> None:
        await self._move(instance, S.RESUMING)

    async def _resumed(self, instance: Instance) -> None:
        """`resuming → resumed`; from `started`/`paused` a headless resume walks both moves."""
        if instance.state in {S.STARTED, S.PAUSED}:
            await self._move(instance, S.RESUMING)
        await self._move(instance, S.RESUMED)

    async def _pause(self, instance: Instance) -> None:
        """`resumed → pausing → paused`; from `pausing` (a failed `onPause`) it is retried."""
        if instance.state is not S.PAUSING:
            await self._move(instance, S.PAUSING)
        await self._move(instance, S.PAUSED)

    async def _stop(self, instance: Instance) -> None:
        """Walks through `pausing`/`paused` when needed; the runner and port stay up."""
        if instance.state in {S.RESUMED, S.PAUSING}:
            await self._pause(instance)
        await self._move(instance, S.STOPPING)
        await self._move(instance, S.STOPPED)

    async def _start(self, instance: Instance) -> None:
        await self._move(instance, S.STARTING)
        await self._move(instance, S.STARTED)

    async def _destroy(self, instance: Instance) -> None:
        """`stopped|error → destroying → destroyed → installed`: child killed, port returned."""
        await self._move(instance, S.DESTROYING)
        await self._booter.teardown(instance)
        instance.enter(S.DESTROYED)
        instance.enter(S.INSTALLED)
        self._forget(instance)

    async def _retry(self, instance: Instance) -> None:
        if instance.state is not S.ERROR:
            instance.enter(S.CREATING)  # raises: only `error` may retry
        await self._booter.teardown(instance)
        await self._boot(instance)

    async def _reset(self, instance: Instance) -> None:
        instance.enter(S.INSTALLED)  # only `error` may reset (the table says so)
        await self._booter.teardown(instance)
        self._forget(instance)

    _ACTIONS: Final[Mapping[str, Callable[[LifecycleManager, Instance], Awaitable[None]]]] = {
        "resume": _resume,
        "resumed": _resumed,
        "pause": _pause,
        "stop": _stop,
        "start": _start,
        "destroy": _destroy,
        "retry": _retry,
        "reset": _reset,
    }

    def is_action(self, action: str) -> bool:
        return action in self._ACTIONS

    async def remove(self, instance_id: str, *, force: bool = False) -> str | None:
        """`DELETE /api/instances/{id}`: walk whatever is left to `installed`; ``force`` kills
        without hooks and without waiting for a running action.

        DELETE always ends the instance: when the orderly walk cannot finish (a hook fails, or a
        state such as `created` after a failed `onStart` has no way to `stopping`), the instance
        is torn down without further hooks and the reason is returned for the answer.
        """
        instance = self.get(instance_id)
        if force:
            await self.force(instance)
            return None
        async with instance.lock:
            if not self.holds(instance):
                return None
            try:
                if instance.state not in {S.ERROR, S.STOPPED}:
                    await self._stop(instance)
                await self._destroy(instance)
            except (HookFailed, LifecycleTransitionError) as err:
                await self.force(instance)
                return err.message
        return None

    async def do_asked(
        self, instance_id: str, action: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """An action another shell asked of this shell's instance (`asked`), done as this
        shell's API does it: what the answer says (the instance's state after the move; for a
        DELETE, its answer; for an activity, its id, path and title; for a revoked grantee's
        views, the ids of those closed; for a released view, the state after its release)."""
        if action == ACTIVITY:
            extras = body.get("extras")
            activity = await self.create_activity(
                instance_id, extras if isinstance(extras, dict) else {}
            )
            return {"activityId": activity.id, "path": activity.path, "title": activity.title}
        if action == ACTIVITY_END:
            await self.destroy_activity(instance_id, str(body.get("activityId", "")))
            return {"ok": True}
        if action == RELEASE_USER:
            self.get(instance_id)  # this shell's still
            closed = await self.views.release_revoked(instance_id, str(body.get("user", "")))
            return {"closedViews": closed}
        if action == RELEASE_VIEW:
            instance = await self.views.release_asked(instance_id, str(body.get("viewId", "")))
            return {"state": instance.state.value}
        if action in {DELETE, DELETE_FORCE}:
            problem = await self.remove(instance_id, force=action == DELETE_FORCE)
            answer: dict[str, Any] = {"ok": True, "instanceId": instance_id, "state": "installed"}
            if problem is not None:
                answer["problem"] = problem
            return answer
        instance = await self.act(instance_id, action)
        return {"state": instance.state.value}

    async def force(self, instance: Instance) -> None:
        """End the instance without hooks: out of the index first (so a move waiting on a hook
        gives up), then the child torn down, then `installed` through the sanctioned bypass."""
        self._forget(instance)
        await self._booter.teardown(instance)
        if instance.state is not S.INSTALLED:
            instance.force_installed()

    # -- activities -----------------------------------------------------------------------------

    async def create_activity(
        self, instance_id: str, extras: Mapping[str, Any], intent: Mapping[str, Any] | None = None
    ) -> Activity:
        """`onActivityCreate`; an instance not `resumed` is first walked there headless."""
        instance = self.get(instance_id)
        async with instance.lock:
            if instance.state is not S.RESUMED:
                if instance.state is S.STOPPED:
                    await self._start(instance)
                if instance.state is S.RESUMING:
                    await self._move(instance, S.RESUMED)
                elif instance.state in {S.STARTED, S.PAUSED}:
                    await self._resumed(instance)
                else:
                    raise NotServing(
                        instance.id,
                        instance.app_id,
                        instance.state,
                        "an activity needs an instance in stopped, started, resuming, resumed "
                        "or paused",
                    )
            return await self._activities.create(instance, extras, intent)

    async def destroy_activity(self, instance_id: str, activity_id: str) -> None:
        instance = self.get(instance_id)
        async with instance.lock:
            await self._activities.destroy(instance, activity_id)

    async def stop_unviewed(self, instance: Instance) -> None:
        """Stop ``instance`` if it is still live, has no view and can stop (`views`)."""
        async with instance.lock:
            if self.holds(instance) and not instance.views and instance.state in STOPPABLE:
                await self._stop(instance)

    # -- background tasks, shutdown --------------------------------------------------------------

    async def used_elsewhere(self, instance_id: str) -> str | None:
        """The mark of the last data request another shell sent this shell's instance (None:
        never, one shell, or the database unread: the idle stop goes ahead, or is put off by
        the move itself when the link is lost)."""
        if self.rows is None:
            return None
        try:
            return await self.rows.used_at(instance_id)
        except SQLAlchemyError:
            return None

    def spawn_task(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def adopt_survivors(self) -> list[Instance]:
        """At start: what an earlier shell left running (a ``survives_shell`` runner's) comes
        back as instances in `started` with the same ids, tokens and shell secrets, without
        their hooks running again (they ran when the server started). A server whose app is
        no longer installed for its owner, whose owner is disabled or removed (a disable whose
        sweep the last shell did not finish), or whose instance id is not one this shell makes
        for that app and owner (``<prefix><n>``, ``<prefix>provider[<n>]``: the id names folders of
        the shell's) is stopped."""
        adopted: list[Instance] = []
        for survivor in await self._booter.runner.survivors():
            try:
                self._refuse_stopped_owner(survivor.owner)
                prefix = self.id_prefix(survivor.app_id, survivor.owner)
                rest = survivor.instance_id.removeprefix(prefix)
                if rest == survivor.instance_id or not (
                    (rest.isascii() and rest.isdigit())
                    or is_provider_id(prefix, survivor.instance_id)
                ):
                    raise InvalidRequest(
                        f"instance id {survivor.instance_id[:200]!r} is not one of "
                        f"{survivor.app_id}'s for {survivor.owner}"
                    )
                instance = self.new_instance(
                    survivor.app_id, survivor.instance_id, owner=survivor.owner
                )
            except AtriumError as err:
                _LOGGER.warning(
                    "%s left by the last shell cannot come back (%s): stopped",
                    survivor.ref,
                    err.message,
                )
                await survivor.app.stop(STOP_GRACE)
                continue
            async with instance.lock:
                holder = None if self.rows is None else await self.rows.shell_of(instance.id)
                if holder is not None and holder != self.rows.shell:  # type: ignore[union-attr]
                    # taken over by another shell while this one was gone (its relabel not
                    # yet seen): that shell's now, its handle forgotten here
                    forget = getattr(self._booter.runner, "forget", None)
                    if forget is not None:
                        forget(survivor.app)
                    self.drop(instance, keep_row=True)
                    continue
                self.adopt_one(instance, survivor)
            _LOGGER.info(
                "%s %s adopted from the last shell: %s", instance.app_id, instance.id, survivor.ref
            )
            adopted.append(instance)
        return adopted

    async def let_go_of_taken(self) -> None:
        """After a loss of the database: the instances whose rows another shell holds now (it
        took them over while this one was cut off) leave this shell without a hook and with
        their servers left running (atrium.lifecycle.takeover). So do those running whose rows
        are gone though this shell had written them: only the shell that took one over (then
        removed it) deletes it; kept, it was a ghost whose server was gone. A change of it still
        queued does not keep it (the writer only updates a row it wrote, and only while the row
        names this shell: `InstanceRows.written`); only an instance whose first row is still to
        be written is kept, since no other shell can have taken a row that never was."""
        rows = self.rows
        if rows is None:
            return
        holders = await rows.shells_of([instance.id for instance in self.all()])
        for instance in self.all():
            holder = holders.get(instance.id)
            if holder == rows.shell or (
                holder is None and (not rows.written(instance) or instance.child is None)
            ):
                continue
            _LOGGER.warning(
                "%s %s: taken over by %s while this shell was cut off: let go",
                instance.app_id,
                instance.id,
                holder or "another shell (and removed there)",
            )
            rows.discard(instance.id)
            child = instance.child
            self._booter.detach(instance)
            forget = getattr(self._booter.runner, "forget", None)
            if child is not None and forget is not None:
                forget(child)
            self._forget_kept(instance)

    def _forget_kept(self, instance: Instance) -> None:
        instance.views.clear()
        self.pool.forget(instance)
        self.headless.forget(instance)
        self.drop(instance, keep_row=True)

    def adopt_one(self, instance: Instance, survivor: Survivor) -> None:
        """``instance`` (new, in `installed`; the caller holds its lock) takes the server
        ``survivor`` over and is `started` without a hook (they ran when the server started)."""
        self._booter.adopt(instance, survivor)
        for state in (S.CREATING, S.CREATED, S.STARTING, S.STARTED):
            instance.enter(state)
        provider = instance.manifest.data_provider
        if is_provider_id(self.id_prefix(instance.app_id, instance.owner), instance.id):
            # a woken provider (a gone shell's, or this shell's last run's): idle-stopped here
            # as one woken here, or it ran on, no shell's to stop
            idle = provider.idle_timeout_ms / 1000 if provider is not None else 0.0
            self.headless.hold(instance, idle)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None and not isinstance(err, AtriumError):
            _LOGGER.error("background task %s failed", task.get_name(), exc_info=err)

    async def shutdown(self) -> None:
        """Destroy every instance: children killed, ports freed; no hooks when they hang. A
        runner whose servers outlive the shell (``survives_shell``: pods) keeps those that run,
        for the next shell to adopt (`adopt_survivors`); the rest are destroyed."""
        self._closed = True
        self.pool.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        instances = self.all()
        if self._booter.runner.survives_shell:
            kept = [i for i in instances if i.child is not None and i.child.status is None]
            for instance in kept:
                self._booter.detach(instance)
                self.drop(instance, keep_row=True)
            instances = [i for i in instances if i not in kept]
        await asyncio.gather(*(self._shutdown_one(i) for i in instances), return_exceptions=True)

    async def _shutdown_one(self, instance: Instance) -> None:
        try:
            async with asyncio.timeout(STOP_GRACE * 2):
                await self.remove(instance.id)
        except (AtriumError, TimeoutError):
            pass
        if self.holds(instance) or instance.child is not None:
            await self.force(instance)
