"""The lifecycle manager: creates instances and walks them through the state machine.

Each action takes the instance's lock, runs the hook that belongs to each move (decisions.md
"Lifecycle": hooks run before the move is committed), then commits it through `Instance.enter`.
Errors choose states: a failed spawn or `onCreate` goes to `error`; any other failed hook leaves the
state the move started from. A child that dies while running is a crash (`mark_crashed`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from atrium.bus import Event, EventBus
from atrium.errors import (
    AtriumError,
    HookFailed,
    InvalidRequest,
    LifecycleTransitionError,
    NotFound,
    SpawnFailed,
)
from atrium.events import APP_INSTALLED, APP_REMOVED, ActivityOpened, AppInstalled, AppRemoved
from atrium.identity import AppTokens
from atrium.lifecycle.calls import ChildExited, HealthMismatch, call_hook, wait_healthy
from atrium.lifecycle.instance import Activity, Instance, View
from atrium.lifecycle.ports import PortAllocator, PortExhausted
from atrium.lifecycle.runners import Runner, SpawnSpec
from atrium.lifecycle.runners.bwrap import classify_early_exit
from atrium.lifecycle.spawning import (
    app_environment,
    app_user,
    interpreter_paths,
    log_tail,
    port_answers,
    resolve_argv,
    sdk_path,
)
from atrium.lifecycle.states import HOOK_BEFORE, SERVING, TRANSITIONS, Hook, InstanceState
from atrium.lifecycle.views import ViewDesk
from atrium.manifest import Manifest
from atrium.registry import AppCopy, AppRegistry
from atrium.scopes import ScopeLayout
from atrium.settings import create_private
from atrium.upstream import UpstreamClient

_LOGGER = logging.getLogger(__name__)
S = InstanceState
STOP_GRACE: Final = 3.0
SLUG_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """The slice of the settings the manager needs."""

    layout: ScopeLayout
    shell_url: str
    app_host: str = "127.0.0.1"
    toolchain_dir: Path | None = None


def new_slug() -> str:
    return "".join(secrets.choice(SLUG_ALPHABET) for _ in range(12))


class LifecycleManager:
    """Owns every instance; all lifecycle actions go through it."""

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
    ) -> None:
        self._runner = runner
        self._registry = registry
        self._bus = bus
        self._upstream = upstream
        self._tokens = tokens
        self._ports = ports
        self._config = config
        self._instances: dict[str, Instance] = {}
        self._by_slug: dict[str, Instance] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._views = ViewDesk()
        self._closing = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    @property
    def runner_name(self) -> str:
        return self._runner.name

    # -- queries --------------------------------------------------------------------------------

    def all(self) -> list[Instance]:
        return sorted(self._instances.values(), key=lambda i: i.id)

    def find(self, instance_id: str) -> Instance | None:
        return self._instances.get(instance_id)

    def get(self, instance_id: str) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None:
            raise NotFound("instance", instance_id)
        return instance

    def by_slug(self, slug: str) -> Instance | None:
        return self._by_slug.get(slug)

    def of_app(self, app_id: str) -> list[Instance]:
        return [i for i in self.all() if i.app_id == app_id]

    # -- creating -------------------------------------------------------------------------------

    async def create(
        self, app_id: str, *, new: bool = False, instance_id: str | None = None
    ) -> Instance:
        """Reuse the app's live instance unless ``new``, else a warm-pool one, else spawn one and
        walk it `installed → … → started`. ``instance_id`` brings back a given instance (same id,
        same runtime data), as an update does after replacing the app."""
        if not new:
            live = [i for i in self.of_app(app_id) if not i.pooled and i.state is not S.ERROR]
            if live:
                instance = live[0]
                if instance.state is S.STOPPED:
                    await self.act(instance.id, "start")
                return instance
            pooled = self._claim_pooled(app_id)
            if pooled is not None:
                return pooled
        instance = self._new_instance(app_id, instance_id)
        async with instance.lock:
            await self._boot(instance)
        return instance

    def _new_instance(self, app_id: str, wanted: str | None = None) -> Instance:
        copy = self._registry.get(app_id)
        if copy is None or copy.manifest is None:
            raise NotFound("app", app_id)
        taken = {i.id for i in self._instances.values()}
        if wanted is not None and (wanted in taken or not wanted.startswith(f"{app_id}-")):
            raise InvalidRequest(f"instance id {wanted!r} is taken or not one of {app_id}'s")
        n = 1
        while f"{app_id}-{n}" in taken:
            n += 1
        instance_id = wanted or f"{app_id}-{n}"
        instance = Instance(
            id=instance_id,
            app_id=app_id,
            scope=copy.scope,
            app_dir=copy.path,
            data_dir=self._config.layout.runtime_dir(copy.scope, app_id, instance_id),
            manifest=copy.manifest,
            slug=new_slug(),
            bus=self._bus,
        )
        self._instances[instance.id] = instance
        self._by_slug[instance.slug] = instance
        return instance

    async def _boot(self, instance: Instance) -> None:
        """`installed|error → creating → created → starting → started` (the caller holds the lock)."""
        instance.enter(S.CREATING)
        instance.error = None
        await self._spawn(instance)
        await self._move(instance, S.CREATED, failure_state=S.ERROR)
        await self._move(instance, S.STARTING)
        instance.enter(S.STARTED)

    async def _spawn(self, instance: Instance) -> None:
        """Start the child and wait for its `/health` identity; any failure → `error`."""
        copy = self._registry.get(instance.app_id)
        if copy is None or copy.manifest is None:
            raise await self._fail_spawn(instance, "the app is no longer installed", "exited")
        instance.manifest = copy.manifest
        try:
            port = self._ports.reserve()
        except PortExhausted as err:
            raise await self._fail_spawn(instance, str(err), "port") from err
        except OSError as err:  # the probe socket: no fd left (EMFILE), issue 14
            raise await self._fail_spawn(instance, _setup_problem(err), "setup") from err
        instance.port, instance.host = port, self._config.app_host
        instance.secret = secrets.token_urlsafe(24)
        token = instance.token = self._tokens.issue(instance.app_id, instance.id)
        instance.expected_exit = False
        log_path = instance.log_path = (
            self._config.layout.home / "run" / "logs" / f"{instance.id}.log"
        )
        try:
            spec = self._spawn_spec(instance, copy, copy.manifest, port, token, log_path)
            instance.child = await self._runner.spawn(spec)
        except SpawnFailed as err:
            cause = str(err.fields.get("cause", "exited"))
            raise await self._fail_spawn(instance, err.message, cause) from err
        except OSError as err:
            # before the child runs (the log cannot be opened, no fd left, a full disk): the
            # instance goes to `error` with the reason, never stays in `creating`
            raise await self._fail_spawn(instance, _setup_problem(err), "setup") from err
        child = instance.child
        instance.host = child.host
        exited = asyncio.ensure_future(child.wait())
        try:
            await wait_healthy(
                self._upstream.session,
                instance.address,
                copy.manifest.start_timeout_ms / 1000,
                exited,
            )
        except ChildExited as err:
            cause = classify_early_exit(log_path, err.code)
            raise await self._fail_spawn(instance, f"{err} ({log_tail(log_path)})", cause) from err
        except HealthMismatch as err:
            raise await self._fail_spawn(instance, str(err), "identity") from err
        except TimeoutError as err:
            raise await self._fail_spawn(
                instance,
                f"/health did not answer within {copy.manifest.start_timeout_ms} ms on port "
                f"{port}: the app must listen on OS_PORT and answer /health",
                "port" if not await port_answers(instance.host, port) else "timeout",
            ) from err
        except OSError as err:  # the shell's side of the check (EMFILE); TimeoutError is one too
            raise await self._fail_spawn(instance, _setup_problem(err), "setup") from err
        finally:
            if not exited.done():
                exited.cancel()
        instance.stamp_started()
        instance.watcher = self.spawn_task(self._watch(instance), f"crash watch {instance.id}")

    def _spawn_spec(
        self,
        instance: Instance,
        copy: AppCopy,
        manifest: Manifest,
        port: int,
        token: str,
        log_path: Path,
    ) -> SpawnSpec:
        """The log file (owner-only: the runner appends to it) and what the runner needs."""
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        create_private(log_path)
        return SpawnSpec(
            app_id=instance.app_id,
            instance_id=instance.id,
            app_dir=copy.path,
            argv=resolve_argv(copy),
            env=app_environment(
                app_id=instance.app_id,
                instance_id=instance.id,
                host=self._config.app_host,
                port=port,
                shell_url=self._config.shell_url,
                token=token,
                secret=instance.secret,
                sdk=sdk_path(self._config.layout.home),
            ),
            data_dir=instance.data_dir,
            host=self._config.app_host,
            port=port,
            log_path=log_path,
            tools=tuple(manifest.tools),
            toolchain_dir=self._config.toolchain_dir,
            ro_paths=interpreter_paths(self._config.layout.home),
            user=app_user(instance.app_id),
            home=self._config.layout.home,
        )

    async def _fail_spawn(self, instance: Instance, reason: str, cause: str) -> SpawnFailed:
        """Tear the child down, move to `error`, and return the error for the caller to raise."""
        await self._teardown_child(instance)
        instance.error = f"spawn failed ({cause}): {reason}"
        if instance.state is S.CREATING:
            instance.enter(S.ERROR)
        return SpawnFailed(instance.error, app_id=instance.app_id, cause=cause)

    async def _watch(self, instance: Instance) -> None:
        """Crash detection: the child's exit while the shell did not ask for it."""
        child = instance.child
        if child is None:
            return
        code = await child.wait()
        if instance.expected_exit or instance.gone or instance.child is not child:
            return
        _LOGGER.warning("%s %s: child exited with status %s", instance.app_id, instance.id, code)
        self._release(instance)
        instance.child = None
        instance.mark_crashed(code)

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
        if target not in TRANSITIONS[current]:
            instance.enter(target)  # raises LifecycleTransitionError and reports it
        hook = HOOK_BEFORE.get(target)
        skip = hook is Hook.ON_DESTROY and (
            instance.child is None or instance.child.returncode is not None
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
                if instance.gone or instance.state is not current:
                    raise
                instance.report_error(current, target, err.message)
                instance.error = err.message
                if failure_state is not None:
                    await self._teardown_child(instance)
                    instance.enter(failure_state)
                raise
        if instance.gone or instance.state is not current:
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
            if instance.gone:
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
        await self._teardown_child(instance)
        instance.enter(S.DESTROYED)
        instance.enter(S.INSTALLED)
        self._forget(instance)

    async def _retry(self, instance: Instance) -> None:
        if instance.state is not S.ERROR:
            instance.enter(S.CREATING)  # raises: only `error` may retry
        await self._teardown_child(instance)
        await self._boot(instance)

    async def _reset(self, instance: Instance) -> None:
        instance.enter(S.INSTALLED)  # only `error` may reset (the table says so)
        await self._teardown_child(instance)
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

    async def remove(self, instance_id: str, *, force: bool = False) -> str | None:
        """`DELETE /api/instances/{id}`: walk whatever is left to `installed`; ``force`` kills
        without hooks and without waiting for a running action.

        DELETE always ends the instance: when the orderly walk cannot finish (a hook fails, or a
        state such as `created` after a failed `onStart` has no way to `stopping`), the instance
        is torn down without further hooks and the reason is returned for the answer.
        """
        instance = self.get(instance_id)
        if force:
            await self._force(instance)
            return None
        async with instance.lock:
            if instance.gone:
                return None
            try:
                if instance.state not in {S.ERROR, S.STOPPED}:
                    await self._stop(instance)
                await self._destroy(instance)
            except (HookFailed, LifecycleTransitionError) as err:
                await self._force(instance)
                return err.message
        return None

    async def _force(self, instance: Instance) -> None:
        instance.gone = True
        await self._teardown_child(instance)
        if instance.state is not S.INSTALLED:
            instance.force_installed()
        self._forget(instance)

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
                    raise LifecycleTransitionError(
                        instance.id, instance.state, S.RESUMED, app_id=instance.app_id
                    )
            activity_id = secrets.token_hex(6)
            body: dict[str, Any] = {
                "instanceId": instance.id,
                "appId": instance.app_id,
                "activityId": activity_id,
                "extras": dict(extras),
            }
            if intent is not None:
                body["intent"] = dict(intent)
            answer = await call_hook(
                self._upstream.session,
                instance.address,
                Hook.ON_ACTIVITY_CREATE.value,
                body,
                instance.manifest.hook_timeout_ms,
            )
            title = answer.get("title")
            activity = Activity(
                activity_id,
                answer["path"],
                title if isinstance(title, str) else instance.manifest.name,
            )
            instance.activities[activity_id] = activity
        self._bus.emit(
            ActivityOpened(instance.id, instance.app_id, activity.id, activity.path, activity.title)
        )
        return activity

    async def destroy_activity(self, instance_id: str, activity_id: str) -> None:
        instance = self.get(instance_id)
        async with instance.lock:
            if activity_id not in instance.activities:
                raise NotFound("activity", activity_id)
            if instance.state not in {S.RESUMED, S.PAUSED, S.RESUMING, S.PAUSING}:
                raise LifecycleTransitionError(
                    instance.id, instance.state, instance.state, app_id=instance.app_id
                )
            hook = f"{Hook.ON_ACTIVITY_DESTROY.value}/{activity_id}"
            await call_hook(
                self._upstream.session,
                instance.address,
                hook,
                {"instanceId": instance.id, "appId": instance.app_id, "activityId": activity_id},
                instance.manifest.hook_timeout_ms,
            )
            del instance.activities[activity_id]

    # -- teardown -------------------------------------------------------------------------------

    async def _teardown_child(self, instance: Instance) -> None:
        """Stop the child (process group, SIGTERM → SIGKILL), return its port, revoke its token."""
        instance.expected_exit = True
        child, instance.child = instance.child, None
        if child is not None:
            await child.stop(STOP_GRACE)
        self._release(instance)

    def _release(self, instance: Instance) -> None:
        if instance.port is not None:
            self._ports.release(instance.port)
            instance.port = None
        self._tokens.revoke(instance.id)
        instance.token = None

    def _forget(self, instance: Instance) -> None:
        instance.gone = True
        instance.views.clear()
        self._instances.pop(instance.id, None)
        self._by_slug.pop(instance.slug, None)

    def spawn_task(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None and not isinstance(err, AtriumError):
            _LOGGER.error("background task %s failed", task.get_name(), exc_info=err)

    # -- views ----------------------------------------------------------------------------------

    def create_view(
        self, instance_id: str, path: str = "/", client: str | None = None
    ) -> tuple[View, str]:
        """A view and its one-time ticket (decisions.md "Lifecycle"); the instance must be serving."""
        instance = self.get(instance_id)
        if not path.startswith("/") or path.startswith("//"):
            raise InvalidRequest(f"view path {path!r} must start with a single '/'")
        if instance.state not in SERVING:
            raise LifecycleTransitionError(
                instance.id, instance.state, S.RESUMING, app_id=instance.app_id
            )
        return self._views.issue(instance, path, client)

    def redeem_ticket(self, slug: str, ticket: str) -> View | None:
        return self._views.redeem(self._by_slug.get(slug), ticket)

    def view_for_cookie(self, instance: Instance, cookie: str) -> View | None:
        return self._views.for_cookie(instance, cookie)

    async def release_client_views(self, client: str) -> None:
        """Release every view held by a host page that has gone away."""
        for instance in self.all():
            for view in [v for v in instance.views.values() if v.client == client]:
                try:
                    await self.release_view(instance.id, view.id)
                except AtriumError as err:
                    _LOGGER.warning(
                        "%s %s: releasing view %s failed: %s",
                        instance.app_id,
                        instance.id,
                        view.id,
                        err.message,
                    )

    async def release_view(self, instance_id: str, view_id: str) -> Instance:
        """Drop a view; dropping the last one stops the instance unless it is a background
        service (docs/api.md "Views": `paused → stopping` when the last view is dropped)."""
        instance = self.get(instance_id)
        if instance.views.pop(view_id, None) is None:
            raise NotFound("view", view_id)
        if instance.views or instance.manifest.background_service:
            return instance
        async with instance.lock:
            if (
                not instance.gone
                and not instance.views
                and instance.state
                in {
                    S.STARTED,
                    S.RESUMED,
                    S.PAUSING,
                    S.PAUSED,
                }
            ):
                await self._stop(instance)
        return instance

    # -- warm pool ------------------------------------------------------------------------------

    def _claim_pooled(self, app_id: str) -> Instance | None:
        pooled = next((i for i in self.of_app(app_id) if i.pooled and i.state is S.RESUMED), None)
        if pooled is not None:
            pooled.pooled = False
            _LOGGER.info("%s %s: taken from the warm pool", app_id, pooled.id)
            self.spawn_task(self.refill(app_id), f"warm-pool refill {app_id}")
        return pooled

    async def refill(self, app_id: str) -> None:
        """Pre-spawn the app to `resumed` until its pool holds `warmPool` instances."""
        if self._closing:
            return
        copy = self._registry.get(app_id)
        size = copy.manifest.warm_pool_size if copy and copy.manifest else 0
        while not self._closing and len([i for i in self.of_app(app_id) if i.pooled]) < size:
            instance = self._new_instance(app_id)
            instance.pooled = True
            try:
                async with instance.lock:
                    await self._boot(instance)
                    await self._resumed(instance)
            except AtriumError as err:
                _LOGGER.warning("%s: warm-pool spawn failed: %s", app_id, err.message)
                instance.pooled = False
                return

    def follow_registry(self) -> Callable[[], None]:
        """Keep warm pools in step with the visible apps: an app installed (or changed) refills
        its pool, one removed drains it. Returns the remover."""

        def on_app(event: Event) -> None:
            if isinstance(event.data, AppInstalled):
                app_id = event.data.app_id
                self.spawn_task(self.refill(app_id), f"warm-pool fill {app_id}")
            elif isinstance(event.data, AppRemoved):
                app_id = event.data.app_id
                self.spawn_task(self.drain(app_id), f"warm-pool drain {app_id}")

        return self._bus.listen((APP_INSTALLED, APP_REMOVED), on_app)

    async def fill_pools(self) -> None:
        for copy in self._registry.visible():
            if copy.manifest is not None and copy.manifest.warm_pool_size:
                self.spawn_task(self.refill(copy.id), f"warm-pool fill {copy.id}")

    async def drain(self, app_id: str) -> None:
        """Destroy the app's pooled instances (uninstall)."""
        for instance in [i for i in self.of_app(app_id) if i.pooled]:
            await self._force(instance)

    async def shutdown(self) -> None:
        """Destroy every instance: children killed, ports freed; no hooks when they hang."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        instances = self.all()
        await asyncio.gather(*(self._shutdown_one(i) for i in instances), return_exceptions=True)

    async def _shutdown_one(self, instance: Instance) -> None:
        try:
            async with asyncio.timeout(STOP_GRACE * 2):
                await self.remove(instance.id)
        except (AtriumError, TimeoutError):
            pass
        if not instance.gone or instance.child is not None:
            await self._force(instance)


def _setup_problem(err: OSError) -> str:
    where = f" ({err.filename})" if err.filename else ""
    return f"the spawn could not be set up: {err.strerror or err}{where}"
