"""The bootstrap token the shells of one PostgreSQL database share (`atrium.users.bootstrap`);
on SQLite (one shell) the home's token stays the shell's own. Two real shells sharing it:
tests/integration/test_several_shells.py."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from atrium.state.database import Database
from atrium.state.schema import bootstrap_tokens
from atrium.users import bootstrap
from atrium.users.model import SessionKind
from atrium.users.store import UserStore

FIRST, SECOND, THIRD = "a" * 43, "b" * 43, "c" * 43


async def test_the_first_shells_token_is_kept_hashed_and_the_others_take_it(db: Database) -> None:
    async with UserStore.open(db, bootstrap_admin="default") as users:
        first = await bootstrap.settle(db, users, "default", FIRST, explicit=False)
        second = await bootstrap.settle(db, users, "default", SECOND, explicit=False)
        if db.dialect == "sqlite":
            assert second.token == SECOND  # one shell: its home's token, as before
            return
        assert first.token == FIRST
        assert second.token is None  # known by its hash only: no login link to print
        assert second.is_token(FIRST)
        assert not second.is_token(SECOND)
        assert second.link_key == first.link_key
        async with db.connect() as conn:
            stored = (await conn.execute(sa.select(bootstrap_tokens))).one()
        assert FIRST not in tuple(stored)  # never the token itself
        # a shell given the shared token (ATRIUM_TOKEN alike on every shell) knows it
        given = await bootstrap.settle(db, users, "default", FIRST, explicit=True)
        assert given.token == FIRST


async def test_a_new_atrium_token_replaces_the_shared_one_on_every_shell(db: Database) -> None:
    if db.dialect == "sqlite":
        return
    async with (
        UserStore.open(db, bootstrap_admin="default") as one,
        UserStore.open(db, bootstrap_admin="default") as two,
    ):
        on_one = await bootstrap.settle(db, one, "default", FIRST, explicit=False)
        stop = bootstrap.follow(db, one, "default", on_one)
        _, session = await one.create_session(
            "default", SessionKind.LINK, address="a", device="d", link_key=on_one.link_key
        )
        on_two = await bootstrap.settle(db, two, "default", THIRD, explicit=True)
        assert on_two.token == THIRD
        await two.end_link_sessions(keep=on_two.link_key)  # as a starting shell does
        for callback in one.on_heard:  # what shell one's bus delivers: `user:changed`
            callback("default")
        for _ in range(200):
            if on_one.is_token(THIRD):
                break
            await asyncio.sleep(0.01)
        assert on_one.is_token(THIRD)
        assert not on_one.is_token(FIRST)
        assert on_one.token is None
        assert not any(s.id == session.id for s in two.sessions_of("default"))
        await stop()
