"""Views: who may show an instance, through one-time tickets and cookies (decisions.md
"Lifecycle"), and the stop that follows the last view's release.

A view is entered through a ticket that works once and lives 60 s; entering sets the view's
cookie on the app origin, and every later request there must carry a live view's cookie. The
cookie is made when the ticket is redeemed, never derived from it: a ticket travels in a URL
(a proxy's request log, the browser's history) and must open nothing once used. With a
database of several shells (`atrium.state.instances`) a ticket is redeemed there, once across
every shell, and the shell that redeems it writes the hash of the cookie it made; the
instance's own shell learns the cookie from that hash when a request first carries it.
Releasing the last view of an instance stops it unless it is a background service; the stop is
the manager's move, reached through the narrow `ViewHost`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

from sqlalchemy.exc import SQLAlchemyError

from atrium.errors import AtriumError, DatabaseUnavailable, InvalidRequest, NotFound, NotServing
from atrium.lifecycle.instance import Instance, View
from atrium.lifecycle.states import SERVING
from atrium.state.instances import InstanceRows, ViewRow, digest

_LOGGER = logging.getLogger(__name__)
TICKET_TTL: Final = 60.0
#: how many released views' ids a shell of several remembers (`ViewDesk._admit`)
DROPPED_KEPT: Final = 4096


async def _nothing_to_reread(_user: str) -> None:
    return None


def is_local_path(path: str) -> bool:
    """A path the app origin may redirect a view to: one a browser cannot read as another
    site's address (``//host``, ``/\\host`` which browsers read alike, or either with tabs,
    newlines or other control characters between, which browsers drop from a URL)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return False
    return not any(ord(char) < 0x20 or ord(char) == 0x7F for char in path)


class ViewHost(Protocol):
    """What views need of the lifecycle manager."""

    def get(self, instance_id: str) -> Instance: ...

    def all(self) -> list[Instance]: ...

    def find(self, instance_id: str) -> Instance | None: ...

    def by_slug(self, slug: str) -> Instance | None: ...

    async def stop_unviewed(self, instance: Instance) -> None:
        """Under the instance's lock: stop it if it is still live, has no view and can stop."""


class ViewDesk:
    """Issues views with tickets, redeems tickets, recognises view cookies, releases views."""

    def __init__(self, host: ViewHost, rows: InstanceRows | None = None) -> None:
        self._host = host
        self._rows = rows
        self._tickets: dict[str, tuple[str, str, float]] = {}
        #: the views released lately (their ids): a read of the table begun before the release
        #: must not bring one back into memory
        self._dropped: dict[str, None] = {}
        #: the reads and stops that another shell's view made or released set going here
        self._tasks: set[asyncio.Task[None]] = set()
        #: whether a user may still see an instance (its owner, or a grantee, enabled): set by
        #: the shell, which holds the users and grants
        self.may_view: Callable[[Instance, str], bool] = lambda _instance, _user: True
        #: read a user's grants again from the database (a revoke made on another shell, heard
        #: here only with its event): set by the shell
        self.reread_access: Callable[[str], Awaitable[None]] = _nothing_to_reread
        if rows is not None:
            rows.on_view.append(self._heard_view)

    async def create(
        self,
        instance_id: str,
        path: str = "/",
        client: str | None = None,
        user: str | None = None,
    ) -> tuple[View, str]:
        """A view and its one-time ticket; the instance must be serving. ``user`` is who opens
        it (the instance's owner when None)."""
        instance = self._host.get(instance_id)
        if not is_local_path(path):
            raise InvalidRequest(
                f"view path {path[:200]!r} must start with a single '/' and hold no '\\' "
                "or control character (a browser would read it as another site's address)"
            )
        viewer = user or instance.owner
        self._may_open(instance, viewer)
        ticket = secrets.token_urlsafe(24)
        view = View(
            id=secrets.token_hex(6),
            cookie="",  # made when the ticket is redeemed
            path=path,
            client=client,
            user=viewer,
        )
        if self._rows is not None:
            await self._rows.add_view(instance, view.id, path, viewer, ticket, TICKET_TTL, client)
            try:
                # other requests ran while the rows were written: a stop, or a revoke of the
                # user's grant (which dropped their views, not this one yet), would leave the
                # view held for nothing, keeping the instance from its stop-when-unviewed
                self._may_open(instance, viewer)
            except AtriumError:
                await self.forget(view.id)
                raise
        else:
            self._tickets[ticket] = (instance.id, view.id, time.monotonic() + TICKET_TTL)
        instance.views[view.id] = view
        return view, ticket

    def _may_open(self, instance: Instance, user: str) -> None:
        """A new view needs an instance that serves and a user who may see it."""
        if not self.may_view(instance, user):
            raise NotFound("instance", instance.id)
        if instance.state not in SERVING:
            raise NotServing(
                instance.id,
                instance.app_id,
                instance.state,
                "a view needs an instance in started, resuming, resumed, pausing or paused",
            )

    async def redeem(self, slug: str, ticket: str) -> View | None:
        """The ticket's view, once; None when unknown, used, expired or for another instance."""
        if self._rows is not None:
            row = await self._rows.redeem(slug, ticket)
            held = self._host.by_slug(slug)
            if row is None or held is None or not row.cookie:
                return None
            # made on another shell, its announcement not heard here yet: it is known now
            view = await self._admit(held, row)
            if view is not None:
                view.cookie = row.cookie
            return view
        entry = self._tickets.pop(ticket, None)
        instance = self._host.by_slug(slug)
        if entry is None or instance is None:
            return None
        instance_id, view_id, expires = entry
        if instance_id != instance.id or time.monotonic() > expires:
            return None
        view = instance.views.get(view_id)
        if view is not None:
            view.cookie = secrets.token_urlsafe(32)
        return view

    async def learn(self, instance: Instance, cookie: str) -> View | None:
        """The view of this shell's instance whose ticket another shell redeemed, known by the
        hash of the cookie that shell made (read once; then in memory like any)."""
        if self._rows is None:
            return None
        row = await self._rows.view_of(instance.slug, cookie)
        if row is None:
            return None
        # a view made on another shell, its announcement not heard here yet, is learnt too
        view = await self._admit(instance, row)
        if view is not None:
            view.cookie = cookie
        return view

    async def _admit(self, instance: Instance, row: ViewRow) -> View | None:
        """The instance's view as its row says: the one in memory, or a new one unless it was
        released since the row was read. A new one is dropped, its row deleted, when the
        instance no longer serves or its user may no longer see it: another shell checked
        both before it wrote the row, and the instance may have stopped (or the grant been
        revoked here) since; held, the view would keep the instance from its
        stop-when-unviewed, with no page to release it. A user this shell's memory refuses is
        asked of the database first: a grant made on another shell is known here only once
        its event is heard, and the view made on that shell may come first."""
        view = instance.views.get(row.id)
        if view is not None or row.id in self._dropped:
            return view
        if instance.state in SERVING and not self.may_view(instance, row.user):
            await self.reread_access(row.user)
            view = instance.views.get(row.id)
            if view is not None or row.id in self._dropped:
                return view  # learnt (or released) by another path meanwhile
        if instance.state not in SERVING or not self.may_view(instance, row.user):
            _LOGGER.info(
                "%s %s: view %s made on another shell dropped (%s)",
                instance.app_id,
                instance.id,
                row.id,
                instance.state
                if instance.state not in SERVING
                else f"{row.user} may no longer see it",
            )
            self._drop(row.id)
            self._spawn(self.forget(row.id))
            return None
        view = instance.views[row.id] = View(row.id, "", row.path, client=row.client, user=row.user)
        return view

    def _drop(self, view_id: str) -> None:
        self._dropped[view_id] = None
        if len(self._dropped) > DROPPED_KEPT:
            del self._dropped[next(iter(self._dropped))]

    def _heard_view(self, instance_id: str, slug: str, view_id: str, gone: bool) -> None:
        """Another shell made (or released) a view of an instance: if it is this shell's, the
        view is learnt (or dropped, and the instance stopped when that was its last view, as a
        release here does). Only this shell acts on its instance. The slug tells it apart from
        an instance another shell numbered alike (ids are each shell's own)."""
        instance = self._host.find(instance_id)
        if instance is None or instance.slug != slug:
            return
        if gone:
            if self._let_go(instance, view_id):
                self._spawn(self._stop_unviewed(instance))
        elif view_id not in instance.views:
            self._spawn(self._adopt(instance, view_id))

    def _let_go(self, instance: Instance, view_id: str) -> bool:
        """Drop a view released on another shell (its rows deleted there), learnt here or
        not yet (then never learnt: `_admit`); whether the instance is left to stop unviewed."""
        self._drop(view_id)
        instance.views.pop(view_id, None)
        return not instance.views and not instance.manifest.background_service

    async def release_asked(self, instance_id: str, view_id: str) -> Instance:
        """A view of this shell's instance released on another shell, which deleted its rows
        and waits for this answer (`asked.RELEASE_VIEW`): once this returns, its cookie is
        refused here too, and the instance has stopped if that was its last view, as a release
        made here does. Whether its `instance:routed` was heard first or not."""
        instance = self._host.get(instance_id)
        if self._let_go(instance, view_id):
            await self._host.stop_unviewed(instance)
        return instance

    async def _stop_unviewed(self, instance: Instance) -> None:
        try:
            await self._host.stop_unviewed(instance)
        except AtriumError as err:
            _LOGGER.warning(
                "%s %s: its last view released on another shell; the stop failed: %s",
                instance.app_id,
                instance.id,
                err.message,
            )

    async def _adopt(self, instance: Instance, view_id: str) -> None:
        if self._rows is None:
            return
        try:
            row = await self._rows.view_by_id(instance.slug, view_id)
        except SQLAlchemyError as err:
            _LOGGER.warning(
                "view %s of %s is learnt at its first request: %s", view_id, instance.id, err
            )
            return
        if row is None:
            return
        try:
            # its state is settled under the lock: a stop under way (its last view released)
            # is over, and the view is not admitted to the stopped instance
            async with instance.lock:
                if self._host.find(instance.id) is instance:
                    await self._admit(instance, row)
        except AtriumError as err:
            _LOGGER.warning(
                "view %s of %s is learnt at its first request: %s", view_id, instance.id, err
            )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name="another shell's view")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def for_cookie(instance: Instance, cookie: str) -> View | None:
        for view in instance.views.values():
            if view.cookie and secrets.compare_digest(view.cookie, cookie):
                return view
            if view.digest is not None and secrets.compare_digest(view.digest, digest(cookie)):
                view.cookie = cookie  # a view taken over from another shell, known by its hash
                return view
        return None

    async def release(self, instance_id: str, view_id: str) -> Instance:
        """Drop a view; dropping the last one stops the instance unless it is a background
        service (docs/api.md "Views": `paused → stopping` when the last view is dropped). With
        several shells its row goes first: DatabaseUnavailable, and the view kept, when the
        database refuses."""
        instance = self._host.get(instance_id)
        view = instance.views.pop(view_id, None)
        if view is None:
            raise NotFound("view", view_id)
        if self._rows is not None:
            try:
                await self._rows.drop_view(view_id)
            except SQLAlchemyError as err:
                # its row would let every other shell go on accepting its cookie: the view
                # stays, here too, rather than be said released
                instance.views.setdefault(view_id, view)
                _LOGGER.warning("view %s stays open: its row was not dropped: %s", view_id, err)
                raise DatabaseUnavailable(
                    "postgresql", f"view {view_id} was not released, and stays open"
                ) from err
            self._drop(view_id)
        if not instance.views and not instance.manifest.background_service:
            await self._host.stop_unviewed(instance)
        return instance

    async def forget(self, view_id: str) -> None:
        """A view dropped from memory goes from the database too: every shell refuses it."""
        if self._rows is None:
            return
        self._drop(view_id)
        try:
            await self._rows.drop_view(view_id)
        except SQLAlchemyError as err:
            _LOGGER.warning("view %s stays open on other shells: %s", view_id, err)

    async def release_user(self, instance_id: str, user: str) -> list[str]:
        """Drop every view ``user`` holds on the instance (a revoked grant): their cookies and
        unused tickets stop working at once. The ids of the views dropped. With several
        shells, also those of the user's views made on another shell that this one has not
        learnt yet: their rows go too (one being written there under the grant finished before
        the revoke; one after is refused there: `InstanceRows.add_view_elsewhere`)."""
        try:
            instance = self._host.get(instance_id)
        except NotFound:
            return []
        dropped = [v.id for v in instance.views.values() if v.user == user]
        for view_id in dropped:
            await self._release_logged(instance, view_id)
        if self._rows is not None:
            try:
                unlearnt = await self._rows.drop_user_views(instance.slug, user)
            except SQLAlchemyError as err:
                _LOGGER.warning(
                    "%s %s: the views of %s made on other shells stay open there: %s",
                    instance.app_id,
                    instance.id,
                    user,
                    err,
                )
                unlearnt = []
            for view_id in unlearnt:
                self._drop(view_id)
            dropped += [v for v in unlearnt if v not in dropped]
        return dropped

    async def release_revoked(self, instance_id: str, user: str) -> list[str]:
        """`release_user` for a grant revoked on another shell: the user's grants are read
        again first, so that a view of theirs this shell learns or makes from now on is refused
        (`_admit`, `create`), not held after the release for a user who may no longer see it."""
        await self.reread_access(user)
        return await self.release_user(instance_id, user)

    async def release_client(self, client: str) -> bool:
        """Release every view held by a host page that has gone away: with several shells, also
        those made on any shell (their rows name the page), each as a release asked of it
        would (`InstanceRows.drop_view_elsewhere`: the instance's shell drops it and stops the
        instance if it was its last view). False when the database refused some of it (a view
        it released whose row is still there): `Presence` asks again later."""
        released: set[str] = set()
        try:
            for instance in self._host.all():
                for view in [v for v in instance.views.values() if v.client == client]:
                    released.add(view.id)
                    await self._release_logged(instance, view.id)
            if self._rows is None:
                return True
            for view_id, slug in await self._rows.views_of_client(client):
                mine = self._host.by_slug(slug)
                if mine is not None:  # this shell's, its view not learnt here yet
                    released.add(view_id)
                    if view_id in mine.views:
                        await self._release_logged(mine, view_id)
                    else:
                        await self.forget(view_id)
                    continue
                held = await self._rows.by_slug(slug)
                if held is not None:
                    released.add(view_id)
                    await self._rows.drop_view_elsewhere(held, view_id)
            # `forget` logs a row it could not drop and goes on
            left = {view_id for view_id, _ in await self._rows.views_of_client(client)}
        except SQLAlchemyError as err:
            _LOGGER.warning("host page %s: some of its views stay open for now: %s", client, err)
            return False
        return not left & released

    async def _release_logged(self, instance: Instance, view_id: str) -> None:
        try:
            await self.release(instance.id, view_id)
        except AtriumError as err:
            _LOGGER.warning(
                "%s %s: releasing view %s failed: %s",
                instance.app_id,
                instance.id,
                view_id,
                err.message,
            )
