"""The apps' revoked network egress (`atrium.egress`), in the ``egress_revokes`` table and in
memory: a spawn and `GET /api/apps/{appId}` read memory; a change is written first, then kept.
Another shell's change arrives as its ``app:egress`` event, and `reload` reads that row again.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from atrium.egress import Ask, ask_of, ask_wire
from atrium.state.schema import egress_revokes
from atrium.state.schema import users as user_rows

if TYPE_CHECKING:
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EgressRevokes:
    """Which apps' egress is revoked, by ``(app id, holder)``, with the ask it revoked."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._revoked: dict[tuple[str, str], Ask] = {}

    @classmethod
    async def open(cls, db: Database) -> EgressRevokes:
        store = cls(db)
        async with db.connect() as conn:
            rows = (await conn.execute(sa.select(egress_revokes))).all()
        store._revoked = {(row.app_id, row.holder): ask_of(row.asked) for row in rows}
        return store

    def get(self, app_id: str, holder: str) -> Ask | None:
        """The ask that was revoked, or None (not revoked)."""
        return self._revoked.get((app_id, holder))

    async def revoke(self, app_id: str, holder: str, ask: Ask, by: str) -> None:
        key = (egress_revokes.c.app_id == app_id) & (egress_revokes.c.holder == holder)
        async with self._db.transaction() as tx:
            await tx.execute(sa.delete(egress_revokes).where(key))
            await tx.execute(
                sa.insert(egress_revokes).values(
                    app_id=app_id,
                    holder=holder,
                    asked=ask_wire(ask),
                    revoked_by=by,
                    revoked_at=_now(),
                )
            )
        self._revoked[(app_id, holder)] = ask

    async def grant(self, app_id: str, holder: str) -> None:
        key = (egress_revokes.c.app_id == app_id) & (egress_revokes.c.holder == holder)
        async with self._db.transaction() as tx:
            await tx.execute(sa.delete(egress_revokes).where(key))
        self._revoked.pop((app_id, holder), None)

    async def widen(self, app_id: str, holder: str, ask: Ask) -> None:
        """A revoke of ``(app_id, holder)`` kept, now of ``ask`` (what a version put back
        without an approval asks): `atrium.egress.granted` reads it revoked. An app not revoked
        stays so."""
        key = (egress_revokes.c.app_id == app_id) & (egress_revokes.c.holder == holder)
        async with self._db.transaction() as tx:
            done = await tx.execute(
                sa.update(egress_revokes).where(key).values(asked=ask_wire(ask))
            )
        if done.rowcount:
            self._revoked[(app_id, holder)] = ask

    def forget_holder(self, user_id: str) -> None:
        """A removed user's revokes, gone from memory. Their rows went in the removal's own
        transaction (`UserStore.remove`), on whichever shell made it."""
        for key in [k for k in self._revoked if k[1] == user_id]:
            del self._revoked[key]

    async def forget_missing(self) -> None:
        """At start: the rows of users no longer there (left by an older shell, which kept a
        removed user's revokes), judged by the users table itself in one statement; then the
        revokes read again."""
        known = sa.select(user_rows.c.id)
        async with self._db.transaction() as tx:
            await tx.execute(
                sa.delete(egress_revokes).where(
                    (egress_revokes.c.holder != "") & egress_revokes.c.holder.not_in(known)
                )
            )
            rows = (await tx.execute(sa.select(egress_revokes))).all()
        self._revoked = {(row.app_id, row.holder): ask_of(row.asked) for row in rows}

    async def reload(self, app_id: str, holder: str) -> None:
        """That row read again (another shell changed it)."""
        key = (egress_revokes.c.app_id == app_id) & (egress_revokes.c.holder == holder)
        try:
            async with self._db.connect() as conn:
                row = (await conn.execute(sa.select(egress_revokes).where(key))).first()
        except SQLAlchemyError as err:
            _LOGGER.warning("could not read %s's egress again: %s", app_id, err)
            return
        if row is None:
            self._revoked.pop((app_id, holder), None)
        else:
            self._revoked[(app_id, holder)] = ask_of(row.asked)


__all__ = ["EgressRevokes"]
