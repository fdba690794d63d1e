"""The write fence (`atrium.state.fence`): a request that arrived before the shell last lost its
database link writes nothing; what it started, and later requests, write as before. The failover
of a real shell whose link is cut is tests/integration/test_failover.py."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import text

from atrium.errors import DatabaseLost
from atrium.state import fence, schema
from atrium.state.database import Database
from atrium.state.schema import sessions
from atrium.users.grants import GrantRole, GrantStore
from atrium.users.model import Role, SessionKind
from atrium.users.store import UserStore


async def write(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.execute(text("UPDATE event_counter SET value = value"))


async def test_a_request_from_before_the_loss_writes_nothing(db: Database) -> None:
    async def request() -> None:
        fence.request_began()
        await write(db)  # no loss yet
        started = asyncio.create_task(write(db))  # a task the request starts
        db.link_lost()
        with pytest.raises(DatabaseLost, match="arrived before the link broke"):
            await write(db)
        await started
        await asyncio.create_task(write(db))  # not the request's own task: not fenced

    async def later_request() -> None:
        fence.request_began()
        await write(db)

    await asyncio.create_task(request())
    await asyncio.create_task(later_request())
    await write(db)  # no request at all


def write_now(database_url: str, sql: str) -> None:
    """``sql`` committed at once, without giving the event loop a turn (another shell's write
    made while this one's tasks wait for theirs)."""
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.split("///", 1)[1]) as conn:
            conn.execute(sql)
        return
    with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(sql)


async def test_a_sessions_use_noted_before_the_loss_is_not_written(db: Database) -> None:
    """The sessions' "last seen" note is written by a task apart from the request: it was not
    fenced, so a request from before the loss wrote its time and address after newer ones."""
    async with UserStore.open(db, bootstrap_admin="default") as store:
        _, session = await store.create_session(
            "default", SessionKind.PASSWORD, address="10.0.0.1", device="d"
        )

        async def request(address: str, *, cut: bool) -> None:
            fence.request_began()
            store.seen(session, address)
            if cut:
                db.link_lost()  # noticed before the note's task had its connection
            await asyncio.gather(*store._tasks)

        async def stored() -> str:
            async with db.connect() as conn:
                query = sa.select(sessions.c.address).where(sessions.c.id == session.id)
                return str((await conn.execute(query)).scalar_one())

        await asyncio.create_task(request("10.0.0.2", cut=True))
        assert await stored() == "10.0.0.1"
        await asyncio.create_task(request("10.0.0.3", cut=False))  # a later request writes
        assert await stored() == "10.0.0.3"
        store.seen(session, "10.0.0.4")  # noted, not written yet (once a minute) ...
        db.link_lost()
    assert await stored() == "10.0.0.3"  # ... nor at close: it came before the loss


async def test_a_removed_users_grants_go_in_the_removal_not_after_it(
    db: Database, database_url: str
) -> None:
    """The grants of a removed user were deleted by a task after the removal, unfenced: a
    shell that lost its link in between deleted them later, when the id may have been given
    again (here by another shell) with new grants."""
    async with (
        UserStore.open(db, bootstrap_admin="default") as users,
        GrantStore.open(db, users) as grants,
    ):

        def forget_grants(user_id: str) -> None:  # as the shell does
            if users.get(user_id) is None:
                grants.forget_user(user_id)

        users.on_change.append(forget_grants)
        await users.add("bob", None, Role.MEMBER)
        await grants.put("default", "i-1", "app", "bob", GrantRole.VIEWER)

        async def request() -> None:
            fence.request_began()
            await users.remove("bob")
            db.link_lost()
            # another shell gives the id again, with a grant
            write_now(
                database_url,
                "INSERT INTO grants (id, owner, instance_id, app_id, user_id, role, created_at,"
                " seq) VALUES ('grt_new', 'default', 'i-2', 'app', 'bob', 'viewer', 'T', 9)",
            )
            await asyncio.gather(*grants._tasks)

        await asyncio.create_task(request())
        await asyncio.sleep(0)
        async with db.connect() as conn:
            left = (await conn.execute(sa.select(schema.grants.c.id))).scalars().all()
        assert left == ["grt_new"]
