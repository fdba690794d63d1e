"""Instances, views and view tickets in the database, so that any shell serves any app origin
(docs/deploying.md "Several shells"; with a PostgreSQL database only: one SQLite shell keeps
them in memory as before).

- Each shell writes its own instances' rows (``instances``): `touch` at every state change (the
  one door, `Instance._set`), `gone` when the instance leaves the index. A writer task writes the
  instance as it is then, each row in a transaction that also appends `instance:routed`, so a
  shell that hears the event reads the row as written (a write the database did not take is
  tried again every second, as the instance is then). A row names the shell that runs it; a
  shell changes and deletes only its own, and removes those its earlier run left at start.
- Views and tickets (``views``, ``view_tickets``) hold the sha256 of the cookie and the ticket,
  never the secrets; a ticket is redeemed by a ``DELETE … RETURNING``, so two shells cannot both
  redeem it, and the shell that redeems it makes the view's cookie then, writing its hash in the
  same transaction (until then the row holds the hash of a secret nobody keeps). The cookie is
  never a function of the ticket: a ticket travels in a URL and may be read from a log once
  used. A shell checks the cookie of another shell's instance against the table on every
  request (a view released on any shell is refused at once); its own instances' cookies it
  checks in memory, as with one shell (the hot path reads no row), reading the table once for
  a cookie another shell made.
- `by_slug` (another shell's instance) is remembered until that slug's `instance:routed`.
- A view of another shell's pod may be written and deleted here (`add_view_elsewhere`,
  `drop_view_elsewhere`): its `instance:routed` names the view, and that shell, which alone acts
  on the instance, learns or drops it (`on_view`).
- An action of another shell's pod is asked of its shell through ``instance_requests`` (`ask`,
  `take`, `answer`, `withdraw`; `atrium.lifecycle.asked`), each step with its
  `instance:routed` in the same transaction (`on_request`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Self

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from atrium.errors import DatabaseLost, NotFound
from atrium.events import InstanceRouted
from atrium.lifecycle.calls import AppAddress
from atrium.lifecycle.states import SERVING
from atrium.state.events import StoredEvent, append
from atrium.state.schema import grants, instance_requests, instances, view_tickets, views

if TYPE_CHECKING:
    from types import TracebackType

    from sqlalchemy.ext.asyncio import AsyncConnection

    from atrium.bus import Event, EventBus
    from atrium.lifecycle.instance import Instance
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
#: the network of a server every shell reaches (a pod's address in the cluster)
SHARED_NETWORK: Final = "cluster"
#: how many remembered slugs (another shell's instances) a shell keeps
CACHE_LIMIT: Final = 4096
#: seconds between tries of a row the database did not take (its link lost)
RETRY_SECONDS: Final = 1.0
#: seconds a closing shell waits for its last rows
CLOSE_WAIT: Final = 5.0
#: seconds an answered or withdrawn request of another shell's instance is kept
REQUESTS_KEPT: Final = 3600.0


def digest(secret: str) -> str:
    """What the tables hold of a cookie or ticket."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _write_view(
    tx: AsyncConnection,
    slug: str,
    view_id: str,
    path: str,
    user: str,
    ticket: str,
    ttl: float,
    client: str | None,
) -> None:
    """A view's row and its ticket's, as every shell writes them: hashes only, and no cookie
    opens the view until its ticket is redeemed (`InstanceRows.redeem`). ``client``: the host
    page that holds it, whose going releases it whichever shell saw that page's stream."""
    await tx.execute(
        sa.insert(views).values(
            id=view_id,
            slug=slug,
            hash=digest(secrets.token_urlsafe(32)),  # no cookie opens it yet
            path=path,
            user_id=user,
            created_at=_now(),
            client=client,
        )
    )
    await tx.execute(
        sa.insert(view_tickets).values(
            hash=digest(ticket), slug=slug, view_id=view_id, expires_at=time.time() + ttl
        )
    )


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """Another shell's instance as its row says."""

    id: str
    app_id: str
    owner: str
    slug: str
    state: str
    network: str | None
    host: str | None
    port: int | None
    secret: str | None
    shell: str
    #: the runner that runs it (its shell's: ``kubernetes`` for a pod) and its handle there
    runner: str = ""
    ref: dict[str, Any] | None = None

    @property
    def address(self) -> AppAddress | None:
        """Where every shell reaches its server (a pod's address in the cluster, with the shell
        secret its row keeps); None when only its own shell does, or it has no address yet."""
        if (
            self.network != SHARED_NETWORK
            or self.host is None
            or self.port is None
            or self.secret is None
        ):
            return None
        return AppAddress(self.app_id, self.id, self.host, self.port, self.secret)


@dataclass(frozen=True, slots=True)
class ViewRow:
    """A view as its row says (the cookie only as the request carries it, or as its redemption
    made it)."""

    id: str
    slug: str
    path: str
    user: str
    cookie: str | None = None
    #: the host page that holds the view (None: an API client's)
    client: str | None = None


def _row_values(instance: Instance, runner: str, shell: str) -> dict[str, Any]:
    child = instance.child
    host, port = (child.host, child.port) if child is not None else (instance.host, instance.port)
    network = instance.network
    return {
        "id": instance.id,
        "app_id": instance.app_id,
        "owner": instance.owner,
        "slug": instance.slug,
        "state": instance.state.value,
        "runner": runner,
        "ref": None if child is None else dict(child.ref),
        "network": network,
        "address": f"{host}:{port}" if host and port else None,
        # only the shell's requests carry it, and only to a server every shell reaches
        "secret": instance.secret if network == SHARED_NETWORK and instance.secret else None,
        "shell": shell,
        "updated_at": _now(),
    }


def _split_address(address: str | None) -> tuple[str | None, int | None]:
    if not address:
        return None, None
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else (None, None)


def _still_held(held: InstanceRow) -> sa.ColumnElement[bool]:
    """The row of ``held`` while it still names the shell, and the slug, it was read with."""
    return (
        (instances.c.id == held.id)
        & (instances.c.shell == held.shell)
        & (instances.c.slug == held.slug)
    )


async def _granted(tx: AsyncConnection, held: InstanceRow, user: str) -> bool:
    """Whether the grants table shares ``held`` with ``user``; the grant's row is locked
    (``FOR SHARE``) until the transaction ends, so that its revoke waits for what is written
    under it, and the revoke's release of the user's views (`drop_user_views`) finds it."""
    found = await tx.execute(
        sa.select(grants.c.id)
        .where(
            (grants.c.owner == held.owner)
            & (grants.c.instance_id == held.id)
            & (grants.c.user_id == user)
        )
        .with_for_update(read=True)
    )
    return found.first() is not None


def _instance_row(row: Any) -> InstanceRow:
    host, port = _split_address(row.address)
    return InstanceRow(
        row.id,
        row.app_id,
        row.owner,
        row.slug,
        row.state,
        row.network,
        host,
        port,
        row.secret,
        row.shell,
        row.runner,
        dict(row.ref) if isinstance(row.ref, dict) else None,
    )


class InstanceRows:
    """This shell's instances written to the database, and the other shells' read from it."""

    def __init__(self, db: Database, bus: EventBus, shell: str, runner: str) -> None:
        self._db = db
        self._bus = bus
        self.shell = shell
        self._runner = runner
        #: instance id → (the instance, whether it is still live): written by the writer task
        self._dirty: dict[str, tuple[Instance, bool]] = {}
        #: instance id → the instance whose row this shell inserted: later writes of it only
        #: update that row, and only while it names this shell (`_write`)
        self._written: dict[str, Instance] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: slug → another shell's row (None: no row), until that slug's `instance:routed`
        self._cache: dict[str, InstanceRow | None] = {}
        #: counts the events heard: a read that one overtook is not remembered
        self._heard_count = 0
        self._unlisten: Any = None
        #: told (instance id, view id, gone) of a view another shell made or released
        self.on_view: list[Callable[[str, str, str, bool], None]] = []
        #: told (instance id, slug, request id, answered) of an action another shell asked of
        #: an instance, or answered (`atrium.lifecycle.asked`)
        self.on_request: list[Callable[[str, str, str, bool], None]] = []

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(
            self._write_loop(), name="instance rows"
        )
        self._unlisten = self._bus.listen((InstanceRouted.TOPIC,), self._heard, others=True)
        self._bus.on_fell_behind.append(self._forget_all)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            # what is left unwritten after that (the database is gone) its next start sweeps
            await asyncio.wait_for(self.flush(), CLOSE_WAIT)
        except TimeoutError:
            _LOGGER.warning("%d instance rows left unwritten at shutdown", len(self._dirty))
        if self._unlisten is not None:
            self._unlisten()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- this shell's instances -----------------------------------------------------------------

    def touch(self, instance: Instance) -> None:
        """The instance changed (its state, its address): its row is written soon."""
        self._mark(instance, True)

    def gone(self, instance: Instance) -> None:
        """The instance left this shell: its row, views and tickets are deleted soon."""
        self._mark(instance, False)

    def _mark(self, instance: Instance, live: bool) -> None:
        self._dirty[instance.id] = (instance, live)
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Until every change marked so far is written (or given up)."""
        if self._task is None or self._task.done():
            return
        await self._idle.wait()

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                instance_id = next(iter(self._dirty))
                instance, live = self._dirty.pop(instance_id)
                try:
                    await self._write(instance, live)
                except Exception as err:  # noqa: BLE001 - the writer outlives a lost link
                    _LOGGER.warning(
                        "%s %s: its row was not written (tried again in %.0f s): %s",
                        instance.app_id,
                        instance.id,
                        RETRY_SECONDS,
                        err,
                    )
                    # unless a newer change of it came meanwhile, the same again after a pause
                    self._dirty.setdefault(instance_id, (instance, live))
                    await asyncio.sleep(RETRY_SECONDS)
            self._idle.set()

    async def _write(self, instance: Instance, live: bool) -> None:
        """The instance's row as it is now (``live``), or its row and views deleted.

        Inserted once; after that only updated where it still names this shell. A write
        queued while the link was cut may run once it is back, after another shell took the
        instance over (the row names that shell) and perhaps removed it (no row): inserted
        again, it was a ghost naming this shell, for a pod gone or another's, which kept this
        shell from letting the instance go (`LifecycleManager.let_go_of_taken`)."""
        mine = (instances.c.id == instance.id) & (instances.c.shell == self.shell)
        routed = InstanceRouted(instance.id, instance.app_id, instance.slug, owner=instance.owner)
        values = _row_values(instance, self._runner, self.shell)
        try:
            async with self._db.transaction() as tx:
                if live and self.written(instance):
                    if (await tx.execute(sa.update(instances).where(mine).values(values))).rowcount:
                        stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
                    else:
                        stored = None
                elif live:
                    await tx.execute(sa.delete(instances).where(mine))
                    await tx.execute(sa.insert(instances).values(values))
                    stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
                else:
                    gone = await tx.execute(sa.delete(instances).where(mine))
                    if gone.rowcount or not await self._held_elsewhere(tx, instance.slug):
                        await self._drop_views(tx, instance.slug)
                    stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        except IntegrityError:
            # another shell's instance has this id (a launch numbers past the rows, but an
            # update brings an id back, and a shell cut off numbers alone; `claim` numbers
            # again): this one is served by its own shell only
            _LOGGER.warning(
                "%s %s: another shell's instance has its id; only this shell serves it",
                instance.app_id,
                instance.id,
            )
            return
        if stored is None:
            _LOGGER.warning(
                "%s %s: its row no longer names this shell (taken over while it was cut off):"
                " not written again",
                instance.app_id,
                instance.id,
            )
            return
        if live:
            self._written[instance.id] = instance
        elif self._written.get(instance.id) is instance:
            del self._written[instance.id]
        self._committed(stored, routed)

    async def ids_taken(self, prefix: str) -> set[str]:
        """The ids starting with ``prefix`` (one owner's of one app: `InstanceIndex.id_prefix`)
        that any shell's row holds."""
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(instances.c.id).where(instances.c.id.startswith(prefix, autoescape=True))
            )
            return set(found.scalars())

    async def opened_elsewhere(self, app_id: str, owner: str, prefix: str) -> InstanceRow | None:
        """The owner's instance of the app in a pod of another shell that a page opened: one
        with a view now, or stopped (its page went). Its row does not say pooled or headless:
        a pooled one has no view, a headless provider's id ends in ``provider``."""
        viewed = sa.exists().where(views.c.slug == instances.c.slug)
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(instances)
                .where(
                    (instances.c.app_id == app_id)
                    & (instances.c.owner == owner)
                    & (instances.c.shell != self.shell)
                    & (instances.c.runner == "kubernetes")
                    & (
                        (instances.c.state == "stopped")
                        | (instances.c.state.in_(sorted(s.value for s in SERVING)) & viewed)
                    )
                )
                .order_by(instances.c.id)
            )
            for row in found:
                if row.id.startswith(prefix) and row.id[len(prefix) :].isdigit():
                    return _instance_row(row)
        return None

    async def claim(self, instance: Instance) -> bool:
        """Write a new instance's row now, not soon: False when another shell's row has its id
        (two shells numbered one at once; the id is the table's key, so one row wins)."""
        await self._write(instance, True)
        return self.written(instance)

    def written(self, instance: Instance) -> bool:
        """Whether this shell inserted ``instance``'s row (no row now: another shell removed
        it, having taken it over)."""
        return self._written.get(instance.id) is instance

    @staticmethod
    async def _held_elsewhere(tx: AsyncConnection, slug: str) -> bool:
        """Whether another shell's row has this slug (an instance taken over keeps its slug,
        and its views are that shell's now)."""
        found = await tx.execute(sa.select(instances.c.id).where(instances.c.slug == slug))
        return found.first() is not None

    def _committed(self, stored: StoredEvent, routed: InstanceRouted) -> None:
        self._bus.committed([(stored, routed)])

    @staticmethod
    async def _drop_views(tx: Any, slug: str) -> None:
        await tx.execute(sa.delete(views).where(views.c.slug == slug))
        await tx.execute(sa.delete(view_tickets).where(view_tickets.c.slug == slug))

    async def sweep(self, keep: set[str]) -> int:
        """At start: delete the rows (and their views and tickets) this shell's earlier run
        left, except the instances it adopted (``keep``, their ids), and every view and ticket
        whose instance has no row (an adopted instance has a new slug: its old views ended with
        the shell that held them, as with one shell). How many rows went."""
        await self.flush()  # the adopted instances' rows, with their new slugs
        live = sa.select(instances.c.slug)
        async with self._db.transaction() as tx:
            rows = (
                await tx.execute(
                    sa.select(instances.c.id, instances.c.slug).where(
                        instances.c.shell == self.shell
                    )
                )
            ).all()
            left = [row for row in rows if row.id not in keep]
            for row in left:
                await tx.execute(
                    sa.delete(instances).where(
                        (instances.c.id == row.id) & (instances.c.shell == self.shell)
                    )
                )
                await self._drop_views(tx, row.slug)
            await tx.execute(sa.delete(views).where(views.c.slug.not_in(live)))
            await tx.execute(sa.delete(view_tickets).where(view_tickets.c.slug.not_in(live)))
        return len(left)

    async def shells_of(self, ids: list[str]) -> dict[str, str]:
        """The shell whose row each of ``ids`` has (those with a row)."""
        if not ids:
            return {}
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(instances.c.id, instances.c.shell).where(instances.c.id.in_(ids))
            )
            return {row.id: row.shell for row in found}

    def discard(self, instance_id: str) -> None:
        """Write nothing more of the instance (another shell holds its row now)."""
        self._dirty.pop(instance_id, None)

    def pending(self, instance_id: str) -> bool:
        """Whether a change of the instance is still to be written (its row may not exist yet)."""
        return instance_id in self._dirty

    async def shell_of(self, instance_id: str) -> str | None:
        """The shell whose row the instance has (None: no row)."""
        async with self._db.connect() as conn:
            found: str | None = (
                await conn.execute(
                    sa.select(instances.c.shell).where(instances.c.id == instance_id)
                )
            ).scalar_one_or_none()
        return found

    # -- views ------------------------------------------------------------------------------------

    async def add_view(
        self,
        instance: Instance,
        view_id: str,
        path: str,
        user: str,
        ticket: str,
        ttl: float,
        client: str | None = None,
    ) -> None:
        """A view of this shell's instance and its ticket, with the instance's row as it is
        now (and its `instance:routed`), in one transaction: another shell may redeem the
        ticket at once. The view has no cookie until its ticket is redeemed (`redeem`)."""
        mine = (instances.c.id == instance.id) & (instances.c.shell == self.shell)
        routed = InstanceRouted(instance.id, instance.app_id, instance.slug, owner=instance.owner)
        values = _row_values(instance, self._runner, self.shell)
        inserted = False
        async with self._db.transaction() as tx:
            if self.written(instance):
                # as the writer does (`_write`): a row taken over is not this shell's to write
                if not (await tx.execute(sa.update(instances).where(mine).values(values))).rowcount:
                    raise DatabaseLost(
                        "the instance was taken over by another shell while this one was cut off"
                    )
            else:
                await tx.execute(sa.delete(instances).where(mine))
                try:
                    async with tx.begin_nested():
                        await tx.execute(sa.insert(instances).values(values))
                    inserted = True
                except IntegrityError:
                    pass  # another shell's instance has its id: the view works on this shell only
            await _write_view(tx, instance.slug, view_id, path, user, ticket, ttl, client)
            # expired tickets nobody redeemed
            await tx.execute(sa.delete(view_tickets).where(view_tickets.c.expires_at < time.time()))
            stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        if inserted:
            self._written[instance.id] = instance
        self._committed(stored, routed)

    async def drop_view(self, view_id: str) -> None:
        async with self._db.transaction() as tx:
            await tx.execute(sa.delete(views).where(views.c.id == view_id))
            await tx.execute(sa.delete(view_tickets).where(view_tickets.c.view_id == view_id))

    async def redeem(self, slug: str, ticket: str) -> ViewRow | None:
        """The ticket's view with the cookie made for it now (its hash written in the same
        transaction), once across every shell; None when unknown, used, expired, for another
        instance's origin, or its view is gone."""
        async with self._db.transaction() as tx:
            taken = (
                await tx.execute(
                    sa.delete(view_tickets)
                    .where(view_tickets.c.hash == digest(ticket))
                    .returning(
                        view_tickets.c.slug, view_tickets.c.view_id, view_tickets.c.expires_at
                    )
                )
            ).first()
            if taken is None or taken.slug != slug or time.time() > taken.expires_at:
                return None
            cookie = secrets.token_urlsafe(32)
            row = (
                await tx.execute(
                    sa.update(views)
                    .where((views.c.id == taken.view_id) & (views.c.slug == slug))
                    .values(hash=digest(cookie))
                    .returning(
                        views.c.id, views.c.slug, views.c.path, views.c.user_id, views.c.client
                    )
                )
            ).first()
        if row is None:
            return None
        return ViewRow(row.id, row.slug, row.path, row.user_id, cookie, row.client)

    async def view_of(self, slug: str, cookie: str) -> ViewRow | None:
        """The live view of the slug's instance whose cookie this is."""
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(views).where(
                        (views.c.hash == digest(cookie)) & (views.c.slug == slug)
                    )
                )
            ).first()
        return (
            None
            if row is None
            else ViewRow(row.id, row.slug, row.path, row.user_id, None, row.client)
        )

    # -- other shells' instances ------------------------------------------------------------------

    async def by_id(self, instance_id: str) -> InstanceRow | None:
        """Another shell's instance with this id (None: none, or it is this shell's)."""
        async with self._db.connect() as conn:
            row = (
                await conn.execute(sa.select(instances).where(instances.c.id == instance_id))
            ).first()
        return None if row is None or row.shell == self.shell else _instance_row(row)

    async def add_view_elsewhere(
        self,
        held: InstanceRow,
        view_id: str,
        path: str,
        user: str,
        ticket: str,
        ttl: float,
        client: str | None = None,
    ) -> str | None:
        """A view of another shell's instance and its ticket, written as its own shell writes
        them (`add_view`), with an `instance:routed` naming the view in the same transaction:
        its shell learns it. The state the locked row says (the view is written only when it
        serves: ``held`` was read before the lock, and the instance may have stopped since);
        None when the row no longer says that shell runs it. NotFound when ``user``, not its
        owner, holds no grant on it in the table."""
        routed = InstanceRouted(held.id, held.app_id, held.slug, owner=held.owner, view_id=view_id)
        async with self._db.transaction() as tx:
            state: str | None = (
                await tx.execute(
                    sa.select(instances.c.state).where(_still_held(held)).with_for_update()
                )
            ).scalar_one_or_none()
            if state is None or state not in SERVING:
                return state
            if user != held.owner and not await _granted(tx, held, user):
                # revoked, this shell's memory not told yet (it hears the event): a view written
                # under the grant's lock comes before the revoke, whose release of the user's
                # views then drops it; one after is refused here
                raise NotFound("instance", held.id)
            await _write_view(tx, held.slug, view_id, path, user, ticket, ttl, client)
            stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        self._committed(stored, routed)
        return state

    async def drop_user_views(
        self, slug: str, user: str, held: InstanceRow | None = None
    ) -> list[str]:
        """Delete every view (and ticket) of ``user`` on the slug's instance (after their
        grant's revoke: a view written under the grant, `add_view_elsewhere`, committed before
        it): their ids. With ``held`` (another shell's instance), each with an
        `instance:routed` naming it gone, for that shell to drop it from memory as a release
        made here does."""
        async with self._db.transaction() as tx:
            gone = list(
                (
                    await tx.execute(
                        sa.delete(views)
                        .where((views.c.slug == slug) & (views.c.user_id == user))
                        .returning(views.c.id)
                    )
                ).scalars()
            )
            if not gone:
                return []
            await tx.execute(sa.delete(view_tickets).where(view_tickets.c.view_id.in_(gone)))
            told: list[tuple[StoredEvent, InstanceRouted]] = []
            if held is not None:
                for view_id in gone:
                    routed = InstanceRouted(
                        held.id,
                        held.app_id,
                        held.slug,
                        owner=held.owner,
                        view_id=view_id,
                        view_gone=True,
                    )
                    stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
                    told.append((stored, routed))
        if told:
            self._bus.committed(told)
        return [str(view_id) for view_id in gone]

    async def view_by_id(self, slug: str, view_id: str) -> ViewRow | None:
        """The live view of the slug's instance with this id (no cookie: only its hash is kept)."""
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(views).where((views.c.id == view_id) & (views.c.slug == slug))
                )
            ).first()
        return (
            None
            if row is None
            else ViewRow(row.id, row.slug, row.path, row.user_id, None, row.client)
        )

    async def views_of_client(self, client: str) -> list[tuple[str, str]]:
        """The views (id, slug) the host page ``client`` holds, made on any shell."""
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(views.c.id, views.c.slug).where(views.c.client == client)
            )
            return [(str(row.id), str(row.slug)) for row in found]

    async def drop_view_elsewhere(self, held: InstanceRow, view_id: str) -> bool:
        """Release a view of another shell's instance: its row and tickets go, and an
        `instance:routed` naming it gone tells its shell, which drops it and does what a
        release does there (stop-when-unviewed). False when there was no such view."""
        routed = InstanceRouted(
            held.id, held.app_id, held.slug, owner=held.owner, view_id=view_id, view_gone=True
        )
        async with self._db.transaction() as tx:
            gone = (
                await tx.execute(
                    sa.delete(views)
                    .where((views.c.id == view_id) & (views.c.slug == held.slug))
                    .returning(views.c.id)
                )
            ).first()
            if gone is None:
                return False
            await tx.execute(sa.delete(view_tickets).where(view_tickets.c.view_id == view_id))
            stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        self._committed(stored, routed)
        return True

    async def by_slug(self, slug: str) -> InstanceRow | None:
        """Another shell's instance on this origin (remembered until its `instance:routed`)."""
        if slug in self._cache:
            return self._cache[slug]
        heard = self._heard_count
        async with self._db.connect() as conn:
            row = (await conn.execute(sa.select(instances).where(instances.c.slug == slug))).first()
        found = None
        if row is not None and row.shell != self.shell:
            found = _instance_row(row)
        if heard == self._heard_count:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[slug] = found
        return found

    async def serving_elsewhere(self, app_id: str, owner: str) -> list[InstanceRow]:
        """``owner``'s instances of the app on other shells that serve or may be on their way
        to (`installed` too: a new instance's row is written before it boots; `started` too:
        its `onResume` runs before the move to `resuming`), resumed ones first (a data
        request's provider on another shell: `atrium.dataproxy`)."""
        booting = ("installed", "creating", "created", "starting", "started", "resuming")
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(instances).where(
                    (instances.c.app_id == app_id)
                    & (instances.c.owner == owner)
                    & (instances.c.shell != self.shell)
                    & instances.c.state.in_(("resumed", *booting))
                )
            )
            rows = [_instance_row(row) for row in found]
        return sorted(rows, key=lambda r: (r.state != "resumed", r.id))

    async def used(self, instance_id: str) -> None:
        """Another shell's instance was just sent a data request from here (its idle stop, on
        its own shell, counts it: `used_at`)."""
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.update(instances)
                .where((instances.c.id == instance_id) & (instances.c.shell != self.shell))
                .values(used_at=_now())
            )

    async def used_at(self, instance_id: str) -> str | None:
        """When another shell last sent this shell's instance a data request, by that shell's
        clock: a mark to compare with the last one read, not a time (None: never)."""
        async with self._db.connect() as conn:
            found = (
                await conn.execute(
                    sa.select(instances.c.used_at).where(
                        (instances.c.id == instance_id) & (instances.c.shell == self.shell)
                    )
                )
            ).scalar()
        return None if found is None else str(found)

    async def others(self, owners: Collection[str] | None = None) -> list[InstanceRow]:
        """Every other shell's instance, as its row says; only those of ``owners`` if given
        (a list is read for one user: the database does the filtering)."""
        query = sa.select(instances).where(instances.c.shell != self.shell)
        if owners is not None:
            if not owners:
                return []
            query = query.where(instances.c.owner.in_(sorted(owners)))
        async with self._db.connect() as conn:
            return [_instance_row(row) for row in await conn.execute(query)]

    # -- actions asked of another shell's instance (`atrium.lifecycle.asked`) -------------------

    async def ask(
        self, held: InstanceRow, request_id: str, action: str, body: dict[str, Any] | None = None
    ) -> bool:
        """Ask ``held``'s shell to do ``action``: the request's row and an `instance:routed`
        naming it, in one transaction under a lock on the instance's row, which must still
        name that shell. False when it no longer does (moved or ended meanwhile)."""
        routed = InstanceRouted(
            held.id, held.app_id, held.slug, owner=held.owner, request_id=request_id
        )
        now = time.time()
        async with self._db.transaction() as tx:
            still = (
                await tx.execute(
                    sa.select(instances.c.id).where(_still_held(held)).with_for_update()
                )
            ).first()
            if still is None:
                return False
            await tx.execute(
                sa.delete(instance_requests).where(
                    instance_requests.c.asked_at < now - REQUESTS_KEPT
                )
            )
            await tx.execute(
                sa.insert(instance_requests).values(
                    id=request_id,
                    instance_id=held.id,
                    slug=held.slug,
                    shell=held.shell,
                    action=action,
                    body=body,
                    state="asked",
                    answer=None,
                    asked_at=now,
                )
            )
            stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        self._committed(stored, routed)
        return True

    async def take(
        self, request_id: str, instance_id: str, asked_after: float
    ) -> tuple[str, dict[str, Any]] | None:
        """The action asked of this shell's instance and its body, taken (once; never after it
        was withdrawn, nor when it was asked before ``asked_after``, Unix time: its asker, gone
        or cut off, could not withdraw it, and this shell, behind, heard it only now); None
        when there is none to take."""
        async with self._db.transaction() as tx:
            taken = (
                await tx.execute(
                    sa.update(instance_requests)
                    .where(
                        (instance_requests.c.id == request_id)
                        & (instance_requests.c.instance_id == instance_id)
                        & (instance_requests.c.shell == self.shell)
                        & (instance_requests.c.state == "asked")
                        & (instance_requests.c.asked_at >= asked_after)
                    )
                    .values(state="taken")
                    .returning(instance_requests.c.action, instance_requests.c.body)
                )
            ).first()
        if taken is None:
            return None
        return str(taken.action), dict(taken.body) if isinstance(taken.body, dict) else {}

    async def untaken(self, asked_after: float) -> list[tuple[str, str, str]]:
        """The requests asked of this shell's instances since ``asked_after`` (Unix time) and
        not taken: (request id, instance id, slug) each, for a shell that missed their
        `instance:routed`. One read of the ``asked_at`` index's last seconds."""
        async with self._db.connect() as conn:
            found = await conn.execute(
                sa.select(
                    instance_requests.c.id,
                    instance_requests.c.instance_id,
                    instance_requests.c.slug,
                ).where(
                    (instance_requests.c.asked_at >= asked_after)
                    & (instance_requests.c.shell == self.shell)
                    & (instance_requests.c.state == "asked")
                )
            )
            return [(str(r.id), str(r.instance_id), str(r.slug)) for r in found]

    async def answer(
        self, request_id: str, instance: Instance, state: str, answer: dict[str, Any]
    ) -> None:
        """A taken request's answer (``done`` or ``failed``), and an `instance:routed` saying
        so, in one transaction: its asker hears it. Its body goes (an activity's extras, up to
        a request's 2 MiB): kept the hour the row is, a caller asking in a loop filled the
        database."""
        routed = InstanceRouted(
            instance.id,
            instance.app_id,
            instance.slug,
            owner=instance.owner,
            request_id=request_id,
            answered=True,
        )
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.update(instance_requests)
                .where(instance_requests.c.id == request_id)
                .values(state=state, answer=answer, body=None)
            )
            stored = await append(tx, routed.TOPIC, routed.owner, routed.wire())
        self._committed(stored, routed)

    async def withdraw(self, request_id: str) -> bool:
        """Withdraw a request nobody took (its body goes, as with an answer): True when it
        was still untaken (it is never done now), False when its shell took it meanwhile."""
        async with self._db.transaction() as tx:
            gone = await tx.execute(
                sa.update(instance_requests)
                .where(
                    (instance_requests.c.id == request_id) & (instance_requests.c.state == "asked")
                )
                .values(state="withdrawn", body=None)
            )
        return bool(gone.rowcount)

    async def request(self, request_id: str) -> tuple[str, dict[str, Any] | None]:
        """A request's state and answer."""
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(instance_requests.c.state, instance_requests.c.answer).where(
                        instance_requests.c.id == request_id
                    )
                )
            ).first()
        if row is None:
            return "withdrawn", None
        return str(row.state), row.answer if isinstance(row.answer, dict) else None

    def _forget_all(self) -> None:
        self._heard_count += 1
        self._cache.clear()

    def _heard(self, event: Event) -> None:
        self._heard_count += 1
        slug = event.payload.get("slug")
        if isinstance(slug, str):
            self._cache.pop(slug, None)
        instance_id, view_id = event.payload.get("instanceId"), event.payload.get("viewId")
        request_id = event.payload.get("requestId")
        if isinstance(instance_id, str) and isinstance(slug, str) and isinstance(request_id, str):
            for asked in self.on_request:
                asked(instance_id, slug, request_id, event.payload.get("answered") is True)
        if isinstance(instance_id, str) and isinstance(slug, str) and isinstance(view_id, str):
            for told in self.on_view:
                told(instance_id, slug, view_id, event.payload.get("viewGone") is True)


__all__ = ["InstanceRow", "InstanceRows", "ViewRow", "digest"]
