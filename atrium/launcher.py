"""Intents end to end: the index follows the visible apps; `start` launches the winner's activity.

The index is updated per app on `app:installed` / `app:removed` (no restart). A tie at the top
opens a chooser and starts nothing; `target` picks one of the matches (docs/api.md "Intents",
decisions.md "Data proxy and intents").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atrium.bus import Event, EventBus
from atrium.errors import NoHandler, NotFound
from atrium.events import APP_INSTALLED, APP_REMOVED, AppInstalled, AppRemoved
from atrium.intents import Intent, IntentIndex, IntentMatch, tied_at_top
from atrium.lifecycle.manager import LifecycleManager
from atrium.registry import AppRegistry


@dataclass(frozen=True, slots=True)
class Started:
    """An intent's handler activity, created."""

    app_id: str
    instance_id: str
    activity_id: str
    path: str
    title: str


@dataclass(frozen=True, slots=True)
class Chooser:
    """Several apps tie at the top: the caller chooses (re-posts with `target`)."""

    candidates: list[IntentMatch]


class Launcher:
    """Resolves intents against the visible apps and starts the winner's activity."""

    def __init__(self, registry: AppRegistry, lifecycle: LifecycleManager, bus: EventBus) -> None:
        self._registry = registry
        self._lifecycle = lifecycle
        self.index = IntentIndex()
        for copy in registry.visible():
            self._refresh(copy.id)
        self._unlisten: list[Callable[[], None]] = [
            bus.listen((APP_INSTALLED, APP_REMOVED), self._on_app),
        ]

    def close(self) -> None:
        for unlisten in self._unlisten:
            unlisten()

    def _on_app(self, event: Event) -> None:
        if isinstance(event.data, AppInstalled | AppRemoved):
            self._refresh(event.data.app_id)

    def _refresh(self, app_id: str) -> None:
        copy = self._registry.get(app_id)
        if copy is None or copy.manifest is None:
            self.index.set_app(app_id, None, ())
        else:
            self.index.set_app(app_id, copy.scope, copy.manifest.intent_filters)

    def resolve(self, intent: Intent) -> list[IntentMatch]:
        return self.index.resolve(intent)

    async def start(self, intent: Intent, target: str | None = None) -> Started | Chooser:
        matches = self.resolve(intent)
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
        else:
            top = tied_at_top(matches)
            if len(top) > 1:
                return Chooser(top)
            chosen = top[0]
        instance = await self._lifecycle.create(chosen.app_id)
        activity = await self._lifecycle.create_activity(
            instance.id, intent.extras, intent=intent_body(intent)
        )
        return Started(chosen.app_id, instance.id, activity.id, activity.path, activity.title)


def intent_body(intent: Intent) -> dict[str, Any]:
    """The whole intent as the handler's `onActivityCreate` receives it under `intent`."""
    body: dict[str, Any] = {"action": intent.action, "extras": dict(intent.extras)}
    if intent.type is not None:
        body["type"] = intent.type
    if intent.uri is not None:
        body["uri"] = intent.uri
    if intent.category:
        body["category"] = list(intent.category)
    return body
