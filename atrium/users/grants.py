"""Sharing by grant: an instance's owner lets another user look at it (decisions.md "Users:
sharing and who is looking").

A grant is (owner, instance id, grantee, role). Rows live in the ``grants`` table of the state
database, and every lookup is answered from memory: a page request asks `access_to` each time, so
revoking takes effect on the very next request.

Several shells on one database: each change appends a `UserChanged` for the grantee in its own
transaction (the users store's event: what that user may reach changed), and another shell that
hears it reads the grants of that grantee again (`heard`), so a revoke made on one shell is
refused on every other as soon as the event arrives.

`access_to` is the one answer to "what may this caller do with this instance": `owner` for the
user it belongs to (and that user's apps), `editor` or `viewer` for a grantee, else None, which
every route answers exactly as it answers a missing instance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from atrium.identity import AppCaller, Caller, UserCaller
from atrium.state.schema import event_counter, grants
from atrium.state.schema import users as user_rows
from atrium.users.store import UserStore, new_id, now

if TYPE_CHECKING:
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)


class GrantRole(StrEnum):
    """What a grantee may do through a view: look (`viewer`: GET and HEAD page requests only,
    unless the app enforces roles itself) or also change (`editor`)."""

    VIEWER = "viewer"
    EDITOR = "editor"


#: what `access_to` answers for the instance's own user
OWNER: Final = "owner"


class Shared(Protocol):
    """What a grant check needs of an instance."""

    @property
    def id(self) -> str: ...

    @property
    def owner(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """One user's role on one instance of another user's."""

    id: str
    owner: str
    instance_id: str
    app_id: str
    user_id: str
    role: GrantRole
    created_at: str

    def wire(self, user_name: str | None = None) -> dict[str, Any]:
        return {
            "grantId": self.id,
            "instanceId": self.instance_id,
            "appId": self.app_id,
            "owner": self.owner,
            "user": self.user_id,
            "userName": user_name,
            "role": self.role.value,
            "createdAt": self.created_at,
        }


class GrantStore:
    """Grants: the state database for keeps, memory for lookups (by grant id and by (owner,
    instance))."""

    def __init__(self, db: Database, users: UserStore) -> None:
        self._db = db
        self._users = users
        self._by_id: dict[str, Grant] = {}
        #: (grantee, owner, instance id) -> grant: the lookup of every page request
        self._by_key: dict[tuple[str, str, str], Grant] = {}
        #: the order grants were made in (lists keep it; seconds of `created_at` cannot)
        self._seq: dict[str, int] = {}
        #: user id -> their reads of grants under way (`_reread`), only while one is
        self._flights: dict[str, _Flight] = {}
        #: (grantee, owner, instance id) -> the event counter as of which memory holds that
        #: grant (or its absence): a read from an earlier state does not undo it
        self._as_of: dict[tuple[str, str, str], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    @asynccontextmanager
    async def open(cls, db: Database, users: UserStore) -> AsyncIterator[GrantStore]:
        """Read the grants; the changes other shells make are heard through ``users``
        (`UserStore.on_heard`), whose transactions announce this store's changes too."""
        store = cls(db, users)
        async with db.connect() as conn:
            for row in await conn.execute(sa.select(grants).order_by(grants.c.seq)):
                store._keep(_grant(row), row.seq)
        users.on_heard.append(store.heard)
        try:
            yield store
        finally:
            users.on_heard.remove(store.heard)
            for task in list(store._tasks):
                task.cancel()
            await asyncio.gather(*store._tasks, return_exceptions=True)

    def _keep(self, grant: Grant, seq: int) -> None:
        self._by_id[grant.id] = grant
        self._by_key[(grant.user_id, grant.owner, grant.instance_id)] = grant
        self._seq[grant.id] = seq

    def _drop(self, grant: Grant) -> None:
        self._by_id.pop(grant.id, None)
        self._by_key.pop((grant.user_id, grant.owner, grant.instance_id), None)
        self._seq.pop(grant.id, None)

    # ---- other shells' changes -----------------------------------------------------------

    def heard(self, user_id: str) -> None:
        """Another shell changed ``user_id`` (a grant to them or on their instances, among
        others): their grants, both ways, are read again (one read; the ones remembered answer
        until it is done)."""
        task = asyncio.get_running_loop().create_task(self._reread(user_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reread(self, user_id: str) -> None:
        """``user_id``'s grants, both ways, read again now: what another shell changed is known
        here before its event arrives (a revoke whose grantee's views this shell closes; a list
        or a revoke of grants made on another shell)."""
        await self._reread(user_id)

    async def _reread(self, user_id: str) -> None:
        """Wait for a read of ``user_id``'s grants begun after this call. Each user's reads are
        their own: one at a time, the callers that ask while one is under way sharing the next
        (a flood of one user's requests costs two reads at a time, not one each), and nobody
        waits for another user's (decisions.md "Several shells: grants read again per user")."""
        flight = self._flights.get(user_id)
        if flight is None:
            flight = self._flights[user_id] = _Flight()
            task = asyncio.get_running_loop().create_task(
                self._fly(user_id, flight), name=f"grants of {user_id} read again"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if flight.next is None:
            flight.next = asyncio.get_running_loop().create_future()
        await asyncio.shield(flight.next)

    async def _fly(self, user_id: str, flight: _Flight) -> None:
        """Read ``user_id``'s grants for as long as someone asked since the last read began;
        then the user's entry goes (none is kept for a user nobody asks about)."""
        try:
            while flight.next is not None:
                done, flight.next = flight.next, None
                try:
                    await self._read(user_id)
                except asyncio.CancelledError:  # the store closes
                    done.cancel()
                    raise
                except Exception as err:  # a bug: its callers hear it
                    _LOGGER.exception("reading the grants of %r again failed", user_id)
                    done.set_exception(err)
                else:
                    done.set_result(None)
        finally:
            if flight.next is not None and not flight.next.done():
                flight.next.cancel()
            del self._flights[user_id]
            if not self._flights:
                # no read under way: a dropped grant's mark guards against none any more
                self._as_of = {k: n for k, n in self._as_of.items() if k in self._by_key}

    async def _read(self, user_id: str) -> None:
        """One read of ``user_id``'s grants, applied as of the event counter it was read with:
        a grant another read (another user's, the grant's other side) or a change here has
        since set from a later state is left as that one set it. Reads of different users run
        at once and may end in any order; the counter, read in the same statement as the
        grants (one snapshot), says which is newer."""
        mine = sa.or_(grants.c.user_id == user_id, grants.c.owner == user_id)
        query = sa.select(event_counter.c.value.label("as_of"), grants).select_from(
            event_counter.outerjoin(grants, mine)
        )
        try:
            async with self._db.connect() as conn:
                rows = (await conn.execute(query)).all()
        except SQLAlchemyError as err:
            _LOGGER.warning("could not read the grants of %r again: %s", user_id, err)
            return
        as_of = int(rows[0].as_of) if rows else 0
        found = {(r.user_id, r.owner, r.instance_id): r for r in rows if r.id is not None}
        for grant in [g for g in self._by_id.values() if user_id in (g.user_id, g.owner)]:
            key = (grant.user_id, grant.owner, grant.instance_id)
            if key not in found and self._as_of.get(key, -1) <= as_of:
                self._drop(grant)
                self._as_of[key] = as_of
        for key, row in found.items():
            if self._as_of.get(key, -1) > as_of:
                continue  # known here from a later state
            held = self._by_key.get(key)
            if held is not None and held.id != row.id:
                self._drop(held)
            self._keep(_grant(row), row.seq)
            self._as_of[key] = as_of

    # ---- reading -------------------------------------------------------------------------

    def of_instance(self, owner: str, instance_id: str) -> list[Grant]:
        found = [
            g for g in self._by_id.values() if g.owner == owner and g.instance_id == instance_id
        ]
        return sorted(found, key=lambda g: self._seq.get(g.id, 0))

    def owners_sharing_with(self, user_id: str) -> set[str]:
        """The owners of the instances granted to ``user_id``."""
        return {g.owner for g in self._by_id.values() if g.user_id == user_id}

    def role_of(self, user_id: str, instance: Shared) -> GrantRole | None:
        grant = self._by_key.get((user_id, instance.owner, instance.id))
        return None if grant is None else grant.role

    def get(self, owner: str, instance_id: str, grant_id: str) -> Grant | None:
        grant = self._by_id.get(grant_id)
        if grant is None or grant.owner != owner or grant.instance_id != instance_id:
            return None
        return grant

    # ---- changing ------------------------------------------------------------------------

    async def put(
        self, owner: str, instance_id: str, app_id: str, user_id: str, role: GrantRole
    ) -> tuple[Grant, bool]:
        """Grant ``role`` to ``user_id``; a second grant to the same user changes the role of
        the first (same id). Returns the grant and whether it is new."""
        key = sa.and_(
            grants.c.owner == owner,
            grants.c.instance_id == instance_id,
            grants.c.user_id == user_id,
        )
        fresh = Grant(new_id("grt"), owner, instance_id, app_id, user_id, role, now())
        async with self._users.change(user_id, owner) as tx:
            row = (await tx.execute(sa.select(grants).where(key).with_for_update())).first()
            if row is not None:
                grant, seq, new = replace(_grant(row), role=role), row.seq, False
                await tx.execute(
                    sa.update(grants).where(grants.c.id == grant.id).values(role=role.value)
                )
            else:
                last = (await tx.execute(sa.select(sa.func.max(grants.c.seq)))).scalar()
                grant, seq, new = fresh, int(last or 0) + 1, True
                await tx.execute(sa.insert(grants).values({**_grant_row(grant), "seq": seq}))
        self._changed(grant)
        self._keep(grant, seq)
        return grant, new

    async def revoke(self, grant: Grant) -> None:
        async with self._users.change(grant.user_id, grant.owner) as tx:
            await tx.execute(sa.delete(grants).where(grants.c.id == grant.id))
        self._changed(grant)
        self._drop(grant)

    def _changed(self, grant: Grant) -> None:
        """A change of ``grant`` made here has committed (with events up to
        `UserStore.last_committed`): a read from before it, ending later, leaves it."""
        key = (grant.user_id, grant.owner, grant.instance_id)
        self._as_of[key] = max(self._as_of.get(key, -1), self._users.last_committed)

    def forget_user(self, user_id: str) -> list[Grant]:
        """A removed user's grants, both ways (to them and on their instances), gone from memory.
        Their rows went in the removal's own transaction (`UserStore.remove`), on whichever
        shell made it: nothing is written here, after the removal and apart from its request."""
        gone = [g for g in self._by_id.values() if user_id in (g.user_id, g.owner)]
        for grant in gone:
            self._drop(grant)
        return gone

    async def forget_missing(self, exists: Callable[[str], bool]) -> None:
        """At start: drop the grants naming a user who is no longer there, and the rows of such
        grants (left by an older shell, which deleted them after the removal, in a write that
        could fail), judged by the users table itself in one statement."""
        for user_id in {u for g in self._by_id.values() for u in (g.user_id, g.owner)}:
            if not exists(user_id):
                self.forget_user(user_id)
        known = sa.select(user_rows.c.id)
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.delete(grants).where(
                    sa.or_(grants.c.user_id.not_in(known), grants.c.owner.not_in(known))
                )
            )


@dataclass(slots=True)
class _Flight:
    """One user's reads of grants: ``next`` is the read the callers asking now wait for, begun
    once the one under way has ended."""

    next: asyncio.Future[None] | None = None


def _grant(row: Any) -> Grant:
    return Grant(
        row.id,
        row.owner,
        row.instance_id,
        row.app_id,
        row.user_id,
        GrantRole(row.role),
        row.created_at,
    )


def _grant_row(grant: Grant) -> dict[str, object]:
    return {
        "id": grant.id,
        "owner": grant.owner,
        "instance_id": grant.instance_id,
        "app_id": grant.app_id,
        "user_id": grant.user_id,
        "role": grant.role.value,
        "created_at": grant.created_at,
    }


def access_to(caller: Caller | str, instance: Shared, grants: GrantStore) -> str | None:
    """`owner`, `editor`, `viewer` or None: what ``caller`` (a caller or a user id) may do with
    ``instance``. An app acts for its owner and never through grants; an admin gets no more
    than anyone else here."""
    if isinstance(caller, AppCaller):
        return OWNER if caller.owner == instance.owner else None
    if isinstance(caller, UserCaller):
        user_id = caller.user_id
    elif isinstance(caller, str):
        user_id = caller
    else:
        return None
    if user_id == instance.owner:
        return OWNER
    role = grants.role_of(user_id, instance)
    return None if role is None else role.value
