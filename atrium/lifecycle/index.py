"""The instance index: every live instance by id and by slug, and the making of new ones.

An instance is live while the index holds it; one that was removed (or forced out) is no longer
held, which every waiting action checks after its awaits (`holds`) instead of a flag on the
instance. The lifecycle manager extends this with the moves.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from typing import Final

from atrium.bus import EventBus
from atrium.errors import InvalidRequest, NotFound
from atrium.lifecycle.instance import Instance
from atrium.registry import AppRegistry
from atrium.scopes import ScopeLayout
from atrium.state.instances import InstanceRows
from atrium.state.locks import Coordination

SLUG_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_slug() -> str:
    return "".join(secrets.choice(SLUG_ALPHABET) for _ in range(12))


class InstanceIndex:
    """The live instances; `new_instance` adds one, `drop` takes one out."""

    def __init__(
        self,
        registry: AppRegistry,
        bus: EventBus,
        layout: ScopeLayout,
        coordination: Coordination | None = None,
        rows: InstanceRows | None = None,
    ) -> None:
        """``coordination``: where the instances' locks come from (default: this process only,
        one shell). ``rows``: where the instances are written for other shells' app origins (a
        PostgreSQL database's; None: one shell)."""
        self._registry = registry
        self.coordination = coordination or Coordination()
        self._bus = bus
        self._layout = layout
        self._instances: dict[str, Instance] = {}
        self._by_slug: dict[str, Instance] = {}
        self.rows = rows

    @property
    def bootstrap_user(self) -> str:
        """The bootstrap admin: the owner of instances nobody else started."""
        return self._layout.user

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

    def of_owner(self, app_id: str, owner: str) -> list[Instance]:
        """The app's instances that belong to ``owner``."""
        return [i for i in self.all() if i.app_id == app_id and i.owner == owner]

    def id_prefix(self, app_id: str, owner: str) -> str:
        """What ``owner``'s instance ids of the app start with: `<appId>-` for the bootstrap
        admin (ids as they always were), `<appId>~<owner>-` for anyone else. Each user numbers
        their own, so a relaunch takes the same id, and so the same data folder, whatever other
        users run. `~` is in neither an app id nor a user id, so no two (app, owner) pairs share
        a prefix."""
        return f"{app_id}-" if owner == self._layout.user else f"{app_id}~{owner}-"

    def owner_of(self, app_id: str, instance_id: str) -> str:
        """The owner an instance id of the app names (`id_prefix` read back)."""
        rest = instance_id.removeprefix(f"{app_id}~")
        if rest == instance_id:
            return self._layout.user
        return rest.rpartition("-")[0] or self._layout.user

    def holds(self, instance: Instance) -> bool:
        """Whether ``instance`` is still live (not removed or forced out meanwhile)."""
        return self._instances.get(instance.id) is instance

    def new_instance(
        self,
        app_id: str,
        wanted: str | None = None,
        data_of: str | None = None,
        owner: str | None = None,
        slug: str | None = None,
        taken_elsewhere: Collection[str] = (),
        *,
        listed: bool = True,
    ) -> Instance:
        """A new instance of the app in `installed`, in the index (not booted). ``data_of``: the
        instance id whose runtime data folder it uses (a headless provider's; default its own).
        ``owner``: the user it belongs to (default the bootstrap admin, ``layout.user``); its
        id is the lowest free of that owner's (`id_prefix`), its data that owner's folder.
        ``taken_elsewhere``: ids other shells of one database hold, taken too. ``listed``:
        False for one put in the index later (`adopt`), once it is this shell's."""
        owner = owner or self._layout.user
        copy = self._registry.get(app_id, owner)  # the copy its owner sees (masking is per user)
        if copy is None or copy.manifest is None:
            raise NotFound("app", app_id)
        prefix = self.id_prefix(app_id, owner)
        taken = set(self._instances) | set(taken_elsewhere)
        if wanted is not None and (wanted in taken or not wanted.startswith(prefix)):
            raise InvalidRequest(f"instance id {wanted!r} is taken or not one of {app_id}'s")
        n = 1
        while f"{prefix}{n}" in taken:
            n += 1
        instance_id = wanted or f"{prefix}{n}"
        instance = Instance(
            id=instance_id,
            app_id=app_id,
            scope=copy.scope,
            app_dir=copy.path,
            data_dir=self._layout.runtime_dir(copy.scope, app_id, data_of or instance_id, owner),
            lock_dir=None
            if data_of is None
            else self._layout.runtime_dir(copy.scope, app_id, instance_id, owner),
            data_of=data_of,
            manifest=copy.manifest,
            slug=slug or new_slug(),  # given: another shell's instance taken over keeps its origin
            bus=self._bus,
            owner=owner,
            lock=self.coordination.instance(instance_id),
        )
        if listed:
            self.adopt(instance)
        return instance

    def adopt(self, instance: Instance) -> None:
        """Put an instance built elsewhere (a trial's) into the index."""
        self._instances[instance.id] = instance
        self._by_slug[instance.slug] = instance
        if self.rows is not None:
            instance.on_change = self.rows.touch

    def drop(self, instance: Instance, *, keep_row: bool = False) -> None:
        """Out of the index (if it is still this instance there); its row in a shared database
        goes too, unless ``keep_row`` (a pod left running for the next shell, which other
        shells still serve)."""
        held = self.holds(instance)
        if held:
            del self._instances[instance.id]
        if self._by_slug.get(instance.slug) is instance:
            del self._by_slug[instance.slug]
        if self.rows is not None and held:
            instance.on_change = None
            if not keep_row:
                self.rows.gone(instance)
