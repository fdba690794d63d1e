"""One bootstrap token for every shell of one PostgreSQL database (decisions.md "Several shells:
one bootstrap token").

Each shell kept its own (``run/token``): a login link printed by one shell was refused by the
others, so behind a load balancer it worked one time in N, and a shell started with another
token ended the sign-ins the other's login link had made. On PostgreSQL the database keeps the
bootstrap admin's token as its sha256 and its link key (``bootstrap_tokens``), never the token
itself, which whoever reads the database (or a copy of it) could then sign in with.

At start (`settle`), with this shell's own candidate (``ATRIUM_TOKEN``, else its ``run/token``,
else a new one):

- no row yet: the candidate is stored (shells starting at once: the first insert wins, the others
  take it as below);
- the row is the candidate's: nothing changes;
- another token, and ``ATRIUM_TOKEN`` names the candidate: it replaces the stored one, as a new
  ``ATRIUM_TOKEN`` does on one shell: the old login link's sign-ins end on every shell, and every
  other shell refuses the old token once it hears the change (`follow`);
- another token, without ``ATRIUM_TOKEN``: the stored one is taken. This shell knows only its
  hash: it accepts the token and its login link, and prints neither (`UserAuth.known_only`).

On SQLite (one shell) the token is the home's, as before: nothing is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import SQLAlchemyError

from atrium.identity import UserAuth
from atrium.state.schema import bootstrap_tokens
from atrium.users.store import UserStore, now

if TYPE_CHECKING:
    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)


async def settle(
    db: Database, users: UserStore, user_id: str, candidate: str, *, explicit: bool
) -> UserAuth:
    """The bootstrap token of ``user_id`` this shell answers to (see the module);
    ``explicit``: ``candidate`` is ``ATRIUM_TOKEN``."""
    mine = UserAuth(candidate)
    if db.dialect != "postgresql":
        return mine
    row = await _read(db, user_id)
    if row is None:
        async with db.transaction() as tx:
            await tx.execute(
                insert(bootstrap_tokens)
                .values(user_id=user_id, hash=mine.hash, link_key=mine.link_key, set_at=now())
                .on_conflict_do_nothing(index_elements=["user_id"])
            )
        row = await _read(db, user_id)
        assert row is not None  # noqa: S101 - inserted, or another shell's insert won
    if row.hash == mine.hash:
        return mine
    if explicit:
        async with users.change(user_id) as tx:  # every shell hears it (`follow`)
            await tx.execute(
                sa.update(bootstrap_tokens)
                .where(bootstrap_tokens.c.user_id == user_id)
                .values(hash=mine.hash, link_key=mine.link_key, set_at=now())
            )
        _LOGGER.warning(
            "ATRIUM_TOKEN replaced the bootstrap token the shells of this database shared: the "
            "old one and its login link's sign-ins end on every shell"
        )
        return mine
    return UserAuth.known_only(row.hash, row.link_key)


def follow(
    db: Database, users: UserStore, user_id: str, auth: UserAuth
) -> Callable[[], Awaitable[None]]:
    """Read the stored token again whenever another shell changed ``user_id`` (one that
    replaced the token announces it so): ``auth`` becomes the new one. Returns what stops it."""
    tasks: set[asyncio.Task[None]] = set()

    async def reread() -> None:
        try:
            row = await _read(db, user_id)
        except SQLAlchemyError as err:
            _LOGGER.warning("could not read the bootstrap token again: %s", err)
            return
        if row is not None and row.hash != auth.hash:
            auth.become(UserAuth.known_only(row.hash, row.link_key))
            _LOGGER.warning("another shell replaced the bootstrap token: the old one is refused")

    def heard(changed: str) -> None:
        if changed == user_id:
            task = asyncio.get_running_loop().create_task(reread())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def stop() -> None:
        if heard in users.on_heard:
            users.on_heard.remove(heard)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    if db.dialect == "postgresql":
        users.on_heard.append(heard)
    return stop


async def _read(db: Database, user_id: str) -> Any:
    async with db.connect() as conn:
        query = sa.select(bootstrap_tokens).where(bootstrap_tokens.c.user_id == user_id)
        return (await conn.execute(query)).first()
