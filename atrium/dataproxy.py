"""The data proxy's decisions: which instance serves a request and whether the caller may ask.

Knows nothing of HTTP bodies: `DataProxy.route` returns where to send the request and the headers
the shell asserts, or raises the error to answer (decisions.md "Data proxy"). Each user's provider
table follows the apps that user sees (made at their first request, dropped on their app events:
decisions.md "Users: providers and intents per user"); the registered instance of each provider app, per user, is that
user's first instance of it to reach `resumed`, kept until it leaves `resumed` (docs/api.md "Data
proxy"). A request goes to the provider instance of the user it is made for: a user's own, an
app's owner's, an anonymous caller's the bootstrap admin's; never another user's.

What steps 4 and 5 decide for a caller, a method and a raw path (the entry, the permission it
needs, that the caller holds it) is kept in a bounded map of allowed decisions (`Decision`),
dropped whole whenever anything it was decided from may have moved: the registry's generation
(any scope read again, a user scope loaded or forgotten), an app event, a table rebuilt, a user
forgotten. Who the caller is stays decided per request (`atrium.api.auth.identify_raw`), so a
deleted token, a disabled or removed user or a destroyed instance is refused at its next request
whatever is kept (decisions.md "Data proxy: decisions kept").

On several shells of one database, a request for which this shell runs no `resumed` instance of
the user's goes to one another shell runs in a pod (which every shell reaches, at the address its
row gives), before anything is woken here: one provider serves every shell, on its data, and a
wake on one shell while another's provider boots waits for that boot. What it found is kept until
that instance's next state change or row write (their events reach every shell), and sent requests
only while its pod is known to be there (asked again every 2 s; decisions.md "Several shells: a pod
no shell holds is checked before it is sent anything"); each request
sent there is noted in its row (at most once a second), and its own shell's idle stop counts it
(decisions.md "Several shells: one provider for every shell").
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

from sqlalchemy.exc import SQLAlchemyError

from atrium.bus import Event, EventBus
from atrium.errors import (
    AtriumError,
    CallerMismatch,
    NoProvider,
    PermissionDenied,
    ProviderUnavailable,
    Unauthenticated,
)
from atrium.events import (
    APP_INSTALLED,
    APP_REMOVED,
    APP_STATE,
    INSTANCE_ROUTED,
    AppState,
    InstanceRouted,
)
from atrium.identity import Anonymous, AppCaller, Caller, UserCaller
from atrium.lifecycle.calls import AppAddress
from atrium.lifecycle.headless import Woken, is_provider_id
from atrium.lifecycle.instance import Instance
from atrium.lifecycle.manager import LifecycleManager
from atrium.lifecycle.states import InstanceState
from atrium.lifecycle.unheld import Verdict
from atrium.permissions import holds
from atrium.providers import ProviderTable
from atrium.registry import AppRegistry
from atrium.state.instances import InstanceRow

_LOGGER = logging.getLogger(__name__)
RESUMED = InstanceState.RESUMED.value
#: a provider another shell just numbered, before its boot (its row has no address yet)
INSTALLED = InstanceState.INSTALLED.value
#: a provider another shell is resuming (its `onResume` runs before the move to `resuming`)
STARTED = InstanceState.STARTED.value
#: the runner whose instances every shell reaches (`InstanceRow.runner`)
POD_RUNNER: Final = "kubernetes"
#: how many allowed decisions are kept by default; a flood of distinct paths empties the map
#: when it is full rather than growing it
DECISIONS: Final = 4096
#: a key (the raw path) longer than this is decided every time: the cap bounds memory, not only
#: the count
MAX_KEY: Final = 512
#: a request sent to another shell's instance is noted in its row at most this often (s)
NOTE_EVERY: Final = 1.0
#: how often a wake looks again at another shell's provider on its way to `resumed` (s)
LOOK_EVERY: Final = 0.1


class _Unheld(Exception):
    """The provider another shell's row names runs in a pod no shell holds, not known to run at
    the row's address: the request is refused, not sent there."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What steps 4 and 5 allowed for one (caller, method, raw path): kept, and used again while
    nothing it was decided from has changed. The caller-id and permission assertions are checked
    against it at every request (they are the request's headers, not part of the key)."""

    authority: str
    path: str
    app_id: str
    permission: str | None
    caller_app_id: str | None
    owner: str


@dataclass(frozen=True, slots=True)
class Route:
    """Where a data request goes and what the shell asserts on it. ``address`` is None when the
    provider must be woken first (`DataProxy.wake`); ``woken`` is set when a headless provider
    instance serves it (the request is counted there, and keeps it from going idle)."""

    address: AppAddress | None
    app_id: str
    permission: str | None
    caller_app_id: str | None
    authority: str
    woken: Woken | None = None
    #: the user whose provider instance serves it (and is woken for it)
    owner: str = ""


class DataProxy:
    """Provider table + registrations + the permission check."""

    def __init__(
        self,
        registry: AppRegistry,
        lifecycle: LifecycleManager,
        bus: EventBus,
        decisions: int = DECISIONS,
    ) -> None:
        self._registry = registry
        self._lifecycle = lifecycle
        #: user → the provider table built from the apps that user sees; made at a user's first
        #: request and dropped on that user's app events, so a request costs one dict lookup
        self._tables: dict[str, ProviderTable] = {}
        #: (caller, method, raw path) → what steps 4 and 5 allowed; at most ``decisions`` of them
        self._decisions: dict[tuple[Caller, str, Hashable], Decision] = {}
        self._cap = decisions
        #: the registry's generation the tables and decisions were made from
        self._generation = registry.generation
        #: (app id, owner) → this shell's instance registered for that user's requests
        self._registered: dict[tuple[str, str], str] = {}
        #: (app id, owner) → another shell's instance serving them, as its row said (several
        #: shells: every shell reaches a pod), and until when (`time.monotonic`) its pod is
        #: known to be there (`atrium.lifecycle.unheld`: a pod whose shell is gone is asked of
        #: the cluster again after that); dropped at that instance's next event
        self._elsewhere: dict[tuple[str, str], tuple[AppAddress, float]] = {}
        #: (app id, owner) no other shell serves, as the rows said: until one of theirs resumes
        self._nowhere: set[tuple[str, str]] = set()
        #: events heard that may make a row read stale (a read is kept only if none came)
        self._heard = 0
        #: instance id → when a request sent there from here was last noted in its row
        self._noted: dict[str, float] = {}
        self._unlisten: list[Callable[[], None]] = []
        self.rebuild()
        self._unlisten.append(bus.listen((APP_INSTALLED, APP_REMOVED), self._on_app))
        self._unlisten.append(bus.listen((APP_STATE,), self._on_state))
        self._unlisten.append(bus.listen((INSTANCE_ROUTED,), self._on_routed))
        # a reader that fell behind missed events: what the rows said may be gone
        bus.on_fell_behind.append(self._forget_rows)
        self._unlisten.append(lambda: bus.on_fell_behind.remove(self._forget_rows))

    def close(self) -> None:
        for unlisten in self._unlisten:
            unlisten()

    @property
    def table(self) -> ProviderTable:
        """The bootstrap admin's table (what an anonymous caller reaches)."""
        return self.table_for(self._lifecycle.bootstrap_user)

    @property
    def decisions_kept(self) -> int:
        return len(self._decisions)

    def _current(self) -> None:
        """Drop every table and decision made from an older view of the registry."""
        if self._registry.generation != self._generation:
            self._generation = self._registry.generation
            self._tables.clear()
            self._decisions.clear()

    def table_for(self, user: str) -> ProviderTable:
        """The table of the apps ``user`` sees (their user scope over global over system)."""
        self._current()
        table = self._tables.get(user)
        if table is None:
            table = self._tables[user] = self._build(user)
        return table

    def forget_user(self, user: str) -> None:
        """``user``'s account is gone: their table and registrations go with it (the registry
        announces nothing for a removed scope, and the id may be given to a new account)."""
        self._tables.pop(user, None)
        self._decisions.clear()
        for key in [k for k in self._registered if k[1] == user]:
            del self._registered[key]

    def rebuild(self) -> None:
        """Forget every user's table: each is built again from the registry when next needed."""
        self._tables.clear()
        self._decisions.clear()

    def _on_app(self, event: Event) -> None:
        # any app event may change what any caller is allowed (a caller app's permissions are
        # its owner's copy's; an app of a shared scope is seen by many users): all decisions go
        self._decisions.clear()
        owner = event.data.owner if event.data is not None else None
        if owner is None:
            self._tables.clear()
            return
        self._tables.pop(owner, None)
        # a user whose scope the registry has not loaded sees the shared scopes only and hears
        # no event of their own: their table follows every change
        loaded = set(self._registry.users())
        for user in [u for u in self._tables if u not in loaded]:
            del self._tables[user]

    def _build(self, user: str) -> ProviderTable:
        table = ProviderTable.build(
            (copy.id, copy.manifest.data_provider)
            for copy in self._registry.visible(user)
            if copy.manifest is not None and copy.manifest.data_provider is not None
        )
        for clash in table.clashes:
            _LOGGER.warning(
                "authority %r is declared by %s and %s for %s; %s serves it",
                clash.authority,
                clash.served_by,
                clash.app_id,
                user,
                clash.served_by,
            )
        return table

    def registered(self, app_id: str, owner: str | None = None) -> str | None:
        """The instance registered for ``owner``'s requests (default the bootstrap admin's)."""
        return self._registered.get((app_id, owner or self._lifecycle.bootstrap_user))

    def owner_for(self, caller: Caller) -> str:
        """Whose provider instance a request is for: the user's own, an app's owner's; an
        anonymous caller (open entries only) reaches the bootstrap admin's."""
        if isinstance(caller, AppCaller):
            return caller.owner
        if isinstance(caller, UserCaller):
            return caller.user_id
        return self._lifecycle.bootstrap_user

    def _on_state(self, event: Event) -> None:
        if not isinstance(event.data, AppState):
            return
        app_id, instance_id = event.data.app_id, event.data.instance_id
        owner = event.data.owner or self._lifecycle.bootstrap_user
        key = (app_id, owner)
        self._heard += 1
        self._forget_elsewhere(instance_id)
        if event.data.to == RESUMED:
            self._nowhere.discard(key)
        if self._lifecycle.find(instance_id) is None and self._registered.get(key) != instance_id:
            # another shell's: found from its row when needed (one of this shell's forced out
            # is out of the index before its move is told: its registration goes below)
            return
        if event.data.to == RESUMED:
            self._registered.setdefault(key, instance_id)
        elif event.data.from_ == RESUMED and self._registered.get(key) == instance_id:
            del self._registered[key]
            successor = next(
                (
                    i
                    for i in self._lifecycle.of_owner(app_id, owner)
                    if i.state is InstanceState.RESUMED and i.id != instance_id
                ),
                None,
            )
            if successor is not None:
                self._registered[key] = successor.id

    def _on_routed(self, event: Event) -> None:
        if isinstance(event.data, InstanceRouted) and event.data.view_id is None:
            self._heard += 1
            self._forget_elsewhere(event.data.instance_id)

    def _forget_rows(self) -> None:
        """Forget every other shell's instance found from the rows, and that none served: the
        events that would have dropped them were missed (the reader fell behind the table), and
        an address kept past its pod's end is sent the user's requests once the cluster gives it
        to another pod."""
        self._heard += 1
        self._elsewhere.clear()
        self._nowhere.clear()

    def _forget_elsewhere(self, instance_id: str) -> None:
        for key, (address, _) in list(self._elsewhere.items()):
            if address.instance_id == instance_id:
                del self._elsewhere[key]

    def route(
        self,
        authority: str,
        path: str,
        method: str,
        caller: Caller,
        claimed_caller: str | None,
        asserted: str | None,
        key: Hashable | None = None,
    ) -> Route:
        """Decide one request (steps 3 to 6 of docs/api.md "Data proxy"); raises what to answer.

        ``key`` is what ``path`` was read from (the raw path: `decided` looks it up): an allowed
        decision is kept under it."""
        caller_app = caller.app_id if isinstance(caller, AppCaller) else None
        if claimed_caller is not None and claimed_caller != caller_app:
            raise CallerMismatch(claimed_caller, caller_app)
        owner = self.owner_for(caller)
        match = self.table_for(owner).match(authority, path)
        if match is None:
            raise NoProvider(authority, path)
        needed = match.permission(method)
        if asserted is not None and asserted != needed:
            raise PermissionDenied(
                f"X-Os-Permission asserts {asserted!r} but {method} {authority}{path} needs "
                f"{needed!r}",
                caller_app_id=caller_app,
                permission=needed,
            )
        self._authorize(caller, match.app_id, needed, authority, path, method)
        decision = Decision(authority, path, match.app_id, needed, caller_app, owner)
        if (
            key is not None
            and self._cap > 0
            and (not isinstance(key, bytes) or len(key) <= MAX_KEY)
        ):
            if len(self._decisions) >= self._cap:
                self._decisions.clear()
            self._decisions[(caller, method, key)] = decision
        return self._to_instance(decision)

    def decided(self, caller: Caller, method: str, key: Hashable) -> Decision | None:
        """The allowed decision kept for ``caller``'s ``method`` on the raw path ``key``, if
        nothing it was made from has changed since (else None: decide it with `route`)."""
        if self._registry.generation != self._generation:
            self._current()
            return None
        return self._decisions.get((caller, method, key))

    def route_decided(
        self,
        decision: Decision,
        method: str,
        claimed_caller: str | None,
        asserted: str | None,
    ) -> Route:
        """`route` for a request whose steps 4 and 5 were decided before: the assertions it
        carries are checked against that decision as `route` checks them, then step 6."""
        if claimed_caller is not None and claimed_caller != decision.caller_app_id:
            raise CallerMismatch(claimed_caller, decision.caller_app_id)
        needed = decision.permission
        if asserted is not None and asserted != needed:
            raise PermissionDenied(
                f"X-Os-Permission asserts {asserted!r} but {method} "
                f"{decision.authority}{decision.path} needs {needed!r}",
                caller_app_id=decision.caller_app_id,
                permission=needed,
            )
        return self._to_instance(decision)

    def _to_instance(self, decision: Decision) -> Route:
        """Step 6: the registered instance of the user the request is for (or a route to wake)."""
        app_id, owner = decision.app_id, decision.owner
        instance = self._serving(app_id, owner)
        if instance is not None:
            woken = self._lifecycle.headless.record(instance.id)
            return Route(
                instance.address,
                app_id,
                decision.permission,
                decision.caller_app_id,
                decision.authority,
                woken,
                owner,
            )
        elsewhere = self._elsewhere.get((app_id, owner))
        if elsewhere is not None and (now := time.monotonic()) < elsewhere[1]:
            # past its time it is routed as found anew (`wake`: the row read, its pod checked)
            self._note(elsewhere[0].instance_id, now)
            return Route(
                elsewhere[0],
                app_id,
                decision.permission,
                decision.caller_app_id,
                decision.authority,
                owner=owner,
            )
        copy = self._registry.get(app_id, owner)
        provider = copy.manifest.data_provider if copy and copy.manifest else None
        if (provider is None or not provider.wake) and (
            self._lifecycle.rows is None or (app_id, owner) in self._nowhere
        ):
            raise self._unavailable(app_id, decision.authority, owner)
        return Route(
            None,
            app_id,
            decision.permission,
            decision.caller_app_id,
            decision.authority,
            owner=owner,
        )

    def _serving(self, app_id: str, owner: str) -> Instance | None:
        instance_id = self._registered.get((app_id, owner))
        instance = self._lifecycle.find(instance_id) if instance_id is not None else None
        if instance is None or instance.state is not InstanceState.RESUMED or instance.port is None:
            return None
        return instance

    def _unavailable(
        self, app_id: str, authority: str, owner: str, why: str = ""
    ) -> ProviderUnavailable:
        """503; the state it names is of the user's own instances only."""
        states = [i.state.value for i in self._lifecycle.of_owner(app_id, owner)]
        return ProviderUnavailable(authority, states[0] if states else None, why)

    async def wake(self, route: Route) -> Route:
        """Route a request no instance of this shell serves: to another shell's that does (or
        is on its way to, within the wait), else, for an app that opted into
        `dataProvider.wake`, hold it until its headless provider instance is `resumed` (docs/api.md
        "Waking a provider"), which waits for the end of any operation holding the app; then
        route it there, or to whichever instance registered meanwhile. 503 when it does not wake
        in time."""
        copy = self._registry.get(route.app_id, route.owner)
        provider = copy.manifest.data_provider if copy and copy.manifest else None
        if provider is None:  # uninstalled while the request was on its way
            raise NoProvider(route.authority, "/")
        wait = provider.wake_timeout_ms / 1000 if provider.wake else 0.0
        deadline = time.monotonic() + wait
        resume_within = copy.manifest.hook_timeout_ms / 1000 if copy and copy.manifest else 0.0
        try:
            elsewhere = await self._serving_elsewhere(
                route.app_id, route.owner, deadline, resume_within
            )
        except _Unheld as err:
            raise self._unavailable(route.app_id, route.authority, route.owner, str(err)) from None
        if elsewhere is not None:
            self._note(elsewhere.instance_id)
            return Route(
                elsewhere,
                route.app_id,
                route.permission,
                route.caller_app_id,
                route.authority,
                owner=route.owner,
            )
        if not provider.wake:
            raise self._unavailable(route.app_id, route.authority, route.owner)
        try:
            woken = await self._lifecycle.headless.wake(
                route.app_id,
                route.owner,
                wait=max(deadline - time.monotonic(), 0.0),
                idle_timeout=provider.idle_timeout_ms / 1000,
            )
        except TimeoutError:
            operation = self._lifecycle.headless.operation_on(route.app_id)
            why = (
                f"it did not wake within {provider.wake_timeout_ms} ms"
                if operation is None
                else f"a {operation} of the app holds it (nothing of it starts until that ends) "
                f"and did not end within {provider.wake_timeout_ms} ms"
            )
            raise self._unavailable(route.app_id, route.authority, route.owner, why) from None
        except AtriumError as err:
            if self.table.app_for(route.authority) != route.app_id:
                # uninstalled (or the authority given up) while the request was held
                raise NoProvider(route.authority, "/") from err
            raise self._unavailable(
                route.app_id, route.authority, route.owner, f"waking it failed: {err.message}"
            ) from err
        instance = self._serving(route.app_id, route.owner)
        if instance is None and woken.state is InstanceState.RESUMED and woken.port is not None:
            instance = woken
        if instance is None:
            raise self._unavailable(
                route.app_id, route.authority, route.owner, "it woke but left `resumed`"
            )
        record = self._lifecycle.headless.record(instance.id)
        return Route(
            instance.address,
            route.app_id,
            route.permission,
            route.caller_app_id,
            route.authority,
            record,
            route.owner,
        )

    async def _serving_elsewhere(
        self, app_id: str, owner: str, deadline: float, resume_within: float = 0.0
    ) -> AppAddress | None:
        """Where another shell's `resumed` instance of ``owner``'s app serves (a pod, which
        every shell reaches), waiting until ``deadline`` for one on its way there; None: there
        is none (remembered until one of theirs resumes anywhere). A provider `started` is on
        its way for ``resume_within`` s from the first look (its `onResume`, bounded by the
        app's hook time): one a shell took over from a gone shell rests there, and a wait for
        it took the whole wake time and left this shell's own wake none (503)."""
        rows = self._lifecycle.rows
        key = (app_id, owner)
        if rows is None or key in self._nowhere:
            return None
        #: provider id → when this wait first saw it `started`
        started: dict[str, float] = {}
        prefix = self._lifecycle.id_prefix(app_id, owner)
        while True:
            heard = self._heard
            now = time.monotonic()
            found = [
                r
                for r in await rows.serving_elsewhere(app_id, owner)
                # `started`: a provider in its `onResume`; another instance may rest there
                if (
                    r.state != STARTED
                    or (
                        is_provider_id(prefix, r.id)
                        and now - started.setdefault(r.id, now) <= resume_within
                    )
                )
                and (
                    r.address is not None
                    # on its way: a pod has its address once it runs
                    or (r.runner == POD_RUNNER and r.state not in (RESUMED, INSTALLED))
                    or (r.runner == POD_RUNNER and is_provider_id(prefix, r.id))
                )
            ]
            refused = None
            for row in (r for r in found if r.state == RESUMED):
                address = row.address
                if address is None:
                    continue
                # sent nothing while its shell is gone and the cluster does not say its pod runs
                # there: the address may be another pod's (`atrium.lifecycle.unheld`)
                verdict = await self._checked(row)
                if verdict.refusal is None:
                    if heard == self._heard:
                        self._elsewhere[key] = (address, verdict.until)
                    return address
                refused = f"its instance {row.id} is not served now: {verdict.refusal}"
            if refused is not None:
                self._elsewhere.pop(key, None)
                raise _Unheld(refused)
            if found:
                # a boot whose shell died is on its way nowhere: its row stays as it was left
                # until that shell's home starts again, and a wait for it took the whole wake
                # time at every request, with none left for this shell's own wake (503)
                alive = await self._lifecycle.coordination.shells_alive({r.shell for r in found})
                found = [r for r in found if r.shell in alive]
            if not found or time.monotonic() + LOOK_EVERY > deadline:
                if not found and heard == self._heard:
                    self._nowhere.add(key)
                return None
            await asyncio.sleep(LOOK_EVERY)  # one booting on another shell: its boot, not ours

    async def _checked(self, row: InstanceRow) -> Verdict:
        pods = self._lifecycle.pods
        return Verdict(math.inf) if pods is None else await pods.verdict(row)

    def _note(self, instance_id: str, now: float | None = None) -> None:
        """A request sent to another shell's instance: noted in its row (at most once a
        second), so that its own shell's idle stop counts it."""
        now = time.monotonic() if now is None else now
        if now - self._noted.get(instance_id, -NOTE_EVERY) < NOTE_EVERY:
            return
        if len(self._noted) >= DECISIONS:
            self._noted.clear()
        self._noted[instance_id] = now
        self._lifecycle.spawn_task(self._noted_in_row(instance_id), f"used {instance_id}")

    async def _noted_in_row(self, instance_id: str) -> None:
        rows = self._lifecycle.rows
        if rows is None:
            return
        try:
            await rows.used(instance_id)
        except (AtriumError, SQLAlchemyError) as err:
            _LOGGER.debug("%s: its use not noted: %s", instance_id, err)

    def _authorize(
        self,
        caller: Caller,
        provider_app: str,
        needed: str | None,
        authority: str,
        path: str,
        method: str,
    ) -> None:
        refusal = self._refusal(caller, provider_app, needed, authority, path, method)
        if refusal is not None:
            raise refusal

    def _refusal(
        self,
        caller: Caller,
        provider_app: str,
        needed: str | None,
        authority: str,
        path: str,
        method: str,
    ) -> Unauthenticated | PermissionDenied | None:
        if needed is None or not isinstance(caller, (AppCaller, Anonymous)):
            return None  # open entry, or the user, who may read and write every entry
        if isinstance(caller, Anonymous):
            return Unauthenticated(
                f"{method} {authority}{path} needs permission {needed!r}: "
                "call with an app's or the user's token"
            )
        if caller.app_id == provider_app:
            return None  # a provider may call its own authority
        copy = self._registry.get(
            caller.app_id, caller.owner
        )  # the caller's copy, as its owner sees it
        granted = copy.manifest.permissions if copy and copy.manifest else []
        if not holds(granted, needed):
            return PermissionDenied(
                f"app {caller.app_id!r} needs permission {needed!r} in its manifest to {method} "
                f"{authority}{path}",
                caller_app_id=caller.app_id,
                permission=needed,
            )
        return None

    def may_read(self, caller: Caller, authority: str, path: str) -> bool:
        """Whether a GET of ``authority`` ``path`` through the proxy would pass steps 4 and 5
        (who may hear of a change there: docs/api.md "Change notifications")."""
        table = self.table_for(self.owner_for(caller))
        match = table.match(authority, path)
        if match is None:  # no entry: only the provider itself (and the user) hear of it
            served_by = table.app_for(authority)
            return not isinstance(caller, AppCaller) or caller.app_id == served_by
        needed = match.permission("GET")
        return self._refusal(caller, match.app_id, needed, authority, path, "GET") is None

    def authority_of(self, app_id: str, owner: str | None = None) -> str:
        """The authority ``app_id`` serves for ``owner`` (its instance's owner; None: the
        bootstrap admin), or 403: only a provider announces its changes."""
        owner = owner or self._lifecycle.bootstrap_user
        copy = self._registry.get(app_id, owner)
        provider = copy.manifest.data_provider if copy and copy.manifest else None
        if provider is None:
            raise PermissionDenied(
                f"app {app_id!r} declares no dataProvider: it has no data to announce changes of",
                caller_app_id=app_id,
            )
        served_by = self.table_for(owner).app_for(provider.authority)
        if served_by != app_id:
            raise PermissionDenied(
                f"authority {provider.authority!r} is served by {served_by!r}, not {app_id!r}",
                caller_app_id=app_id,
            )
        return provider.authority
