"""Intents end to end: the index follows the visible apps; `start` launches the winner's activity.

Each user's index holds the apps that user sees, updated per app on that user's `app:installed` /
`app:removed` (no restart). A tie at the top
opens a chooser and starts nothing; `target` picks one of the matches (docs/api.md "Intents",
decisions.md "Data proxy and intents"). A default the user remembered for the intent's action and
type sends `start` straight to its app, tie or not (docs/api.md "Default handlers").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from atrium import intentdefaults
from atrium.bus import Event, EventBus
from atrium.errors import InvalidRequest, NoHandler, NotFound, PermissionDenied
from atrium.events import APP_INSTALLED, APP_REMOVED, AppInstalled, AppRemoved
from atrium.intentdefaults import KEY, IntentDefault
from atrium.intents import Intent, IntentIndex, IntentMatch, tied_at_top
from atrium.kv import KvStore
from atrium.lifecycle.manager import LifecycleManager
from atrium.permissions import holds
from atrium.registry import AppRegistry

_LOGGER = logging.getLogger(__name__)
NAMESPACE: Final = "os"


@dataclass(frozen=True, slots=True)
class Started:
    """An intent's handler activity, created."""

    app_id: str
    instance_id: str
    activity_id: str
    path: str
    title: str
    #: started through the user's remembered default (no `target`, a tie or not)
    by_default: bool = False


@dataclass(frozen=True, slots=True)
class Chooser:
    """Several apps tie at the top: the caller chooses (re-posts with `target`)."""

    candidates: list[IntentMatch]


@dataclass(frozen=True, slots=True)
class Resolution:
    """The ranked matches of an intent, and the remembered default that applies, if any (and
    still matches), with the matching apps installed since it was chosen."""

    matches: list[IntentMatch]
    default: IntentDefault | None = None
    new_since: tuple[str, ...] = ()

    def wire(self) -> list[dict[str, Any]]:
        items = []
        for match in self.matches:
            item = match.wire()
            chosen = self.default is not None and match.app_id == self.default.app_id
            item["default"] = chosen
            if chosen and self.default is not None:
                kind = self.default.type or "no type"
                item["defaultSince"] = self.default.wire()["since"]
                item["explanation"] = (
                    f"the user chose {match.app_id} for {self.default.action} ({kind}) with "
                    f"remember: true; start goes straight to it"
                )
                item["newSince"] = list(self.new_since)
            items.append(item)
        return items


class Launcher:
    """Resolves intents against the visible apps and starts the winner's activity; keeps the
    user's remembered default handlers (`os/intent.defaults` in the KV store)."""

    def __init__(
        self,
        registry: AppRegistry,
        lifecycle: LifecycleManager,
        bus: EventBus,
        kv: KvStore,
        installed_at: Callable[[str], datetime | None],
    ) -> None:
        self._registry = registry
        self._lifecycle = lifecycle
        self._kv = kv
        self._installed_at = installed_at
        self._defaults_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        #: user → the intent index of the apps that user sees: made at their first intent,
        #: kept in step by their own app events
        self._indexes: dict[str, IntentIndex] = {}
        self.index_for(registry.default_user)
        kv.add_validator(NAMESPACE, KEY, _validate_defaults)
        self._unlisten: list[Callable[[], None]] = [
            bus.listen((APP_INSTALLED, APP_REMOVED), self._on_app),
        ]

    def close(self) -> None:
        for unlisten in self._unlisten:
            unlisten()
        for task in tuple(self._tasks):
            task.cancel()

    def forget_user(self, user: str) -> None:
        """``user``'s account is gone: their intent index goes with it (the id may be reused)."""
        self._indexes.pop(user, None)

    def _on_app(self, event: Event) -> None:
        if not isinstance(event.data, AppInstalled | AppRemoved):
            return
        owner = event.data.owner
        if owner is None:
            self._indexes.clear()
        elif owner in self._indexes:
            self._refresh(event.data.app_id, owner)
        # a user whose scope the registry has not loaded sees the shared scopes only and hears no
        # event of their own: their index is made again at their next intent
        loaded = set(self._registry.users())
        for user in [u for u in self._indexes if u not in loaded]:
            del self._indexes[user]
        if isinstance(event.data, AppRemoved):
            # a user who sees no copy left forgets their remembered defaults for it
            task = asyncio.get_running_loop().create_task(
                self._forget_app(event.data.app_id, owner)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def index_for(self, user: str) -> IntentIndex:
        """The intent index of the apps ``user`` sees (their user scope over global over system)."""
        index = self._indexes.get(user)
        if index is None:
            index = self._indexes[user] = IntentIndex()
            for copy in self._registry.visible(user):
                self._refresh(copy.id, user)
        return index

    def _refresh(self, app_id: str, user: str) -> None:
        index = self._indexes[user]
        copy = self._registry.get(app_id, user)
        if copy is None or copy.manifest is None:
            index.set_app(app_id, None, ())
        else:
            index.set_app(app_id, copy.scope, copy.manifest.intent_filters)

    # -- remembered defaults --------------------------------------------------------------------

    async def defaults(self, owner: str | None = None) -> list[IntentDefault]:
        """``owner``'s remembered defaults (None: the bootstrap admin's): each user's own row
        `os/intent.defaults`, so one user's choice never decides another's intents."""
        entry = await self._kv.get(NAMESPACE, KEY, owner=owner)
        return intentdefaults.parse(entry.value) if entry is not None else []

    async def _store(self, defaults: list[IntentDefault], owner: str | None) -> None:
        await self._kv.set(NAMESPACE, KEY, intentdefaults.dump(defaults), owner=owner)

    async def forget(
        self, action: str, mime: str | None, owner: str | None = None
    ) -> IntentDefault:
        """Forget ``owner``'s default stored for exactly (action, type); 404 when there is none."""
        wanted = (action, intentdefaults.normal_type(mime))
        async with self._defaults_lock:
            defaults = await self.defaults(owner)
            found = next((d for d in defaults if (d.action, d.type) == wanted), None)
            if found is None:
                raise NotFound("intent default", f"{action} ({mime or 'no type'})")
            await self._store([d for d in defaults if d is not found], owner)
        _LOGGER.info("forgot the default %s for %s (%s)", found.app_id, action, mime)
        return found

    async def _forget_app(self, app_id: str, removed_by: str | None) -> None:
        """``app_id`` was removed from a scope (``removed_by``: a user's own scope, None: a
        shared one): each user concerned who no longer sees a copy forgets their defaults for it."""
        async with self._defaults_lock:
            owners = await self._kv.owners(NAMESPACE, KEY)
            for owner in owners if removed_by is None else [o for o in owners if o == removed_by]:
                if self._registry.copies(app_id, owner):
                    continue
                defaults = await self.defaults(owner)
                kept = intentdefaults.forget_app(defaults, app_id)
                if len(kept) != len(defaults):
                    await self._store(kept, owner)
                    _LOGGER.info(
                        "%s is gone for %s: forgot %d default(s)",
                        app_id,
                        owner,
                        len(defaults) - len(kept),
                    )

    async def _remember(self, intent: Intent, app_id: str, owner: str | None) -> None:
        # whole seconds, as install records keep them: `newSince` compares the two
        now = datetime.now(UTC).replace(microsecond=0)
        choice = IntentDefault(intent.action, intent.mime, app_id, now)
        async with self._defaults_lock:
            current = await self.defaults(owner)
            await self._store(intentdefaults.remember(current, choice), owner)

    # -- resolving and starting -----------------------------------------------------------------

    async def resolve(self, intent: Intent, owner: str | None = None) -> Resolution:
        """The matches of ``intent`` among the apps ``owner`` sees, with their remembered default
        (None: the bootstrap admin's)."""
        matches = self.index_for(owner or self._registry.default_user).resolve(intent)
        default = intentdefaults.lookup(await self.defaults(owner), intent.action, intent.mime)
        if default is None or not any(m.app_id == default.app_id for m in matches):
            return Resolution(matches)
        others = [m.app_id for m in matches if m.app_id != default.app_id]
        times = await asyncio.to_thread(lambda: {a: self._installed_at(a) for a in others})
        new = tuple(a for a in others if (t := times[a]) is not None and t > default.since)
        return Resolution(matches, default, new)

    async def start(
        self,
        intent: Intent,
        target: str | None = None,
        *,
        remember: bool = False,
        caller_app_id: str | None = None,
        owner: str | None = None,
    ) -> Started | Chooser:
        """Start the handler's activity; ``caller_app_id`` is the app that asks (None: the user),
        refused before anything starts when the chosen filter names a permission it lacks.
        ``owner``: the user it starts for (an app's intent: its owner), whose own instance of the
        handler is reused or started (default the bootstrap admin)."""
        resolution = await self.resolve(intent, owner)
        matches = resolution.matches
        if not matches:
            raise NoHandler(intent.action)
        if target is not None:
            chosen = next((m for m in matches if m.app_id == target), None)
            if chosen is None:
                raise NotFound(
                    "intent handler",
                    target,
                    f"{target!r} is not among the handlers of {intent.action!r}",
                )
        elif resolution.default is not None:
            chosen = next(m for m in matches if m.app_id == resolution.default.app_id)
        else:
            top = tied_at_top(matches)
            if len(top) > 1:
                return Chooser(top)
            chosen = top[0]
        self._authorize(chosen, intent, caller_app_id)
        if remember:
            await self._remember(intent, chosen.app_id, owner)
        instance = await self._lifecycle.create(chosen.app_id, owner=owner)
        activity = await self._lifecycle.create_activity(
            instance.id, intent.extras, intent=intent_body(intent, caller_app_id)
        )
        return Started(
            chosen.app_id,
            instance.id,
            activity.id,
            activity.path,
            activity.title,
            by_default=target is None and resolution.default is not None,
        )

    def _authorize(self, chosen: IntentMatch, intent: Intent, caller_app_id: str | None) -> None:
        """An app may start a filter that names a permission only when its manifest grants it
        (the user always may; a handler may start its own filter), as the data proxy decides a
        provider entry: an intent is a request anyone may send, the filter says who may ask."""
        needed = chosen.permission
        if needed is None or caller_app_id is None or caller_app_id == chosen.app_id:
            return
        copy = self._registry.get(caller_app_id)
        granted = copy.manifest.permissions if copy and copy.manifest else []
        if not holds(granted, needed):
            raise PermissionDenied(
                f"app {caller_app_id!r} needs permission {needed!r} in its manifest to start "
                f"{chosen.app_id}'s {intent.action!r}",
                caller_app_id=caller_app_id,
                permission=needed,
            )


def _validate_defaults(value: Any) -> Any:
    """A raw `PUT /api/kv/os/intent.defaults` must hold a valid list (stored normalized)."""
    try:
        return intentdefaults.dump(intentdefaults.parse(value))
    except ValueError as err:
        raise InvalidRequest(str(err)) from err


def intent_body(intent: Intent, caller_app_id: str | None = None) -> dict[str, Any]:
    """The whole intent as the handler's `onActivityCreate` receives it under `intent`, with who
    started it (`callerAppId`: an app's id, or null for the user)."""
    body: dict[str, Any] = {
        "action": intent.action,
        "extras": dict(intent.extras),
        "callerAppId": caller_app_id,
    }
    if intent.type is not None:
        body["type"] = intent.type
    if intent.uri is not None:
        body["uri"] = intent.uri
    if intent.category:
        body["category"] = list(intent.category)
    return body
