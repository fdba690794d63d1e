"""Sharing by grant: an instance's owner lets another user look at it (decisions.md "Users:
sharing and who is looking").

A grant is (owner, instance id, grantee, role). Rows live in the `grants` table of
``$ATRIUM_HOME/users.sqlite3`` (the users store's file, 0600) through the users store's own
connection and writer thread (one writer per file), and every lookup is answered from memory: a
page request asks `access_to` each time, so revoking takes effect on the very next request.

`access_to` is the one answer to "what may this caller do with this instance": `owner` for the
user it belongs to (and that user's apps), `editor` or `viewer` for a grantee, else None, which
every route answers exactly as it answers a missing instance.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final, Protocol, TypeVar

from atrium.identity import AppCaller, Caller, UserCaller
from atrium.users.sqlitefile import SqliteFile
from atrium.users.store import new_id, now

T = TypeVar("T")
_LOGGER = logging.getLogger(__name__)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS grants (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    role TEXT NOT NULL,
    created_at TEXT NOT NULL,
    seq INTEGER NOT NULL,
    UNIQUE (owner, instance_id, user_id)
) WITHOUT ROWID;
"""


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
    """Grants: SQLite for keeps, memory for lookups (by grant id and by (owner, instance))."""

    def __init__(self, file: SqliteFile) -> None:
        self._file = file
        self._conn = file.conn
        self._by_id: dict[str, Grant] = {}
        #: (grantee, owner, instance id) -> grant: the lookup of every page request
        self._by_key: dict[tuple[str, str, str], Grant] = {}
        #: the order grants were made in (lists keep it; seconds of `created_at` cannot)
        self._seq = 0

    @classmethod
    @asynccontextmanager
    async def open(cls, file: SqliteFile) -> AsyncIterator[GrantStore]:
        """The grants table in the users store's file, through its connection and writer
        thread (the users store opens and closes the file)."""
        await file.add_schema("the grants table in", _SCHEMA)
        store = cls(file)
        await store._run(store._load)
        yield store

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._file.run(fn)

    def _load(self) -> None:
        for gid, owner, iid, app_id, uid, role, created, seq in self._conn.execute(
            "SELECT id, owner, instance_id, app_id, user_id, role, created_at, seq FROM grants "
            "ORDER BY seq"
        ):
            self._seq = max(self._seq, seq)
            self._keep(Grant(gid, owner, iid, app_id, uid, GrantRole(role), created))

    def _keep(self, grant: Grant) -> None:
        self._by_id[grant.id] = grant
        self._by_key[(grant.user_id, grant.owner, grant.instance_id)] = grant

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        self._conn.execute(sql, args)  # autocommit: one statement, one transaction

    # ---- reading -------------------------------------------------------------------------

    def of_instance(self, owner: str, instance_id: str) -> list[Grant]:
        return [
            g for g in self._by_id.values() if g.owner == owner and g.instance_id == instance_id
        ]

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
        existing = self._by_key.get((user_id, owner, instance_id))
        if existing is not None:
            changed = replace(existing, role=role)
            await self._run(
                lambda: self._write(
                    "UPDATE grants SET role = ? WHERE id = ?", (role.value, existing.id)
                )
            )
            self._keep(changed)
            return changed, False
        grant = Grant(new_id("grt"), owner, instance_id, app_id, user_id, role, now())
        self._seq += 1
        row = (grant.id, owner, instance_id, app_id, user_id, role.value, grant.created_at)
        seq = self._seq
        await self._run(
            lambda: self._write("INSERT INTO grants VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*row, seq))
        )
        self._keep(grant)
        return grant, True

    async def revoke(self, grant: Grant) -> None:
        await self._run(lambda: self._write("DELETE FROM grants WHERE id = ?", (grant.id,)))
        self._by_id.pop(grant.id, None)
        self._by_key.pop((grant.user_id, grant.owner, grant.instance_id), None)

    def forget_user(self, user_id: str) -> list[Grant]:
        """A removed user's grants, both ways (to them and on their instances): gone from
        memory at once, from the table on the writer thread (`forget_missing` at the next start
        finishes the job should that write fail)."""
        gone = [g for g in self._by_id.values() if user_id in (g.user_id, g.owner)]
        for grant in gone:
            self._by_id.pop(grant.id, None)
            self._by_key.pop((grant.user_id, grant.owner, grant.instance_id), None)
        if gone:
            self._file.submit(
                self._write, "DELETE FROM grants WHERE user_id = ? OR owner = ?", (user_id, user_id)
            )
        return gone

    def forget_missing(self, exists: Callable[[str], bool]) -> None:
        """Drop the grants naming a user who is no longer there."""
        for user_id in {u for g in self._by_id.values() for u in (g.user_id, g.owner)}:
            if not exists(user_id):
                self.forget_user(user_id)


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
