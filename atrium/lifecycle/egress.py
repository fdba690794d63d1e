"""The apps' egress grants at work: what `GET /api/apps/{appId}` says of an app's network, a
revoke or a grant written (`atrium.state.egress`) and made true at once for the app's running
instances (`Network.set_egress`), and another shell's change heard on the bus and made true here.

A grant is the install's approval of the manifest's ``network.egress`` (the permission diff asks
for it like an added permission); a revoke takes it back until it is granted again, or until an
update asking more is approved (`atrium.egress.granted`). A shared copy (system, global) is the
admins' to manage (``holder`` ""), a user scope's copy its user's (``holder``: their id).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from atrium.egress import Ask, ask_wire, asked, granted, network_wire, widened
from atrium.events import AppEgress
from atrium.lifecycle.network import Network, resolve
from atrium.scopes import Scope
from atrium.state.egress import EgressRevokes

if TYPE_CHECKING:
    from atrium.bus import Event, EventBus
    from atrium.registry import AppCopy, AppRegistry

_LOGGER = logging.getLogger(__name__)


def holder_of(copy: AppCopy, user: str | None) -> str:
    """Whose grant a copy's is: "" for a shared copy, ``user``'s for their user scope's."""
    return (user or "") if copy.scope is Scope.USER else ""


class EgressGrants:
    """See the module docstring."""

    def __init__(
        self,
        revokes: EgressRevokes,
        registry: AppRegistry,
        bus: EventBus,
        network: Network | None,
    ) -> None:
        self.revokes = revokes
        self._registry = registry
        self._bus = bus
        self._network = network
        self._tasks: set[asyncio.Task[None]] = set()
        if network is not None:
            network.revoked = revokes.get

    def wire(self, copy: AppCopy, user: str | None) -> dict[str, Any]:
        """The app's ``network`` for `GET /api/apps/{appId}`."""
        return network_wire(asked(copy.manifest), self.revokes.get(copy.id, holder_of(copy, user)))

    async def set(self, copy: AppCopy, user: str | None, grant: bool, by: str) -> Ask:
        """Revoke (``grant`` False) or grant again what the copy's manifest asks; stored, made
        true for its running instances, announced (``app:egress``). What is granted now."""
        holder = holder_of(copy, user)
        ask = asked(copy.manifest)
        if grant:
            await self.revokes.grant(copy.id, holder)
        else:
            await self.revokes.revoke(copy.id, holder, ask, by)
        given = await self.apply(copy.id, holder, ask)
        self._bus.emit(AppEgress(copy.id, holder, ask_wire(given), by, owner=holder or None))
        return given

    async def apply(self, app_id: str, holder: str, ask: Ask) -> Ask:
        """The running instances of ``(app_id, holder)`` reach what is granted now."""
        given = granted(ask, self.revokes.get(app_id, holder))
        if self._network is not None:
            egress = False if given is False else await asyncio.to_thread(resolve, given)
            changed = await self._network.set_egress((app_id, holder), egress)
            if changed:
                _LOGGER.info(
                    "%s: egress %s on %d running instance(s)",
                    app_id,
                    "revoked" if given is False else "granted",
                    changed,
                )
        return given

    async def unapproved(self, app_id: str, holder: str, ask: Ask) -> None:
        """A copy asking ``ask`` was put in place approved by no one now (a rollback's version,
        the system copy an uninstall unmasks): a revoke of ``(app_id, holder)`` stays, whatever
        more it asks (only an approved update asking more grants it again). Called before
        anything of the app may start again."""
        revoked = self.revokes.get(app_id, holder)
        if revoked is None or widened(revoked, ask) is False:
            return
        await self.revokes.widen(app_id, holder, ask)
        # the other shells read the row again (their instances get nothing either)
        self._bus.emit(AppEgress(app_id, holder, False, "", owner=holder or None))

    async def uninstalled(self, app_id: str, holder: str) -> None:
        """The holder's last copy of the app is gone: its revoke goes with it, so a later
        install, whose review asks for the egress again, is granted what it was approved."""
        if self.revokes.get(app_id, holder) is None:
            return
        await self.revokes.grant(app_id, holder)
        self._bus.emit(AppEgress(app_id, holder, False, "", owner=holder or None))

    def heard(self, event: Event) -> None:
        """Another shell's ``app:egress``: that row read again, and made true here."""
        if not event.foreign:
            return
        app_id = str(event.payload.get("appId", ""))
        holder = str(event.payload.get("holder", ""))
        task = asyncio.get_running_loop().create_task(self._again(app_id, holder))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _again(self, app_id: str, holder: str) -> None:
        await self.revokes.reload(app_id, holder)
        copy = self._registry.get(app_id, holder or None)
        try:
            await self.apply(app_id, holder, asked(None if copy is None else copy.manifest))
        except OSError as err:
            _LOGGER.warning("%s: another shell's egress change not made here: %s", app_id, err)


__all__ = ["EgressGrants", "holder_of"]
