"""The users store and the grants on the state database, on SQLite and PostgreSQL: what two
stores on one database (two shells) see of each other's rows, the last-admin rule against the
database rather than a store's memory, and an older home's users.sqlite3 carried in once."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from atrium.errors import LastAdmin
from atrium.state.database import Database
from atrium.state.schema import carried_over, users
from atrium.users.carry import carry_over
from atrium.users.grants import GrantRole, GrantStore
from atrium.users.model import Role, SessionKind
from atrium.users.store import UserStore, new_secret, secret_hash

OLD_SCHEMA = """
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0, password TEXT, created_at TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions (id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    kind TEXT NOT NULL, created_at TEXT NOT NULL, last_seen TEXT NOT NULL, address TEXT NOT NULL,
    device TEXT NOT NULL, link_key TEXT) WITHOUT ROWID;
CREATE TABLE tokens (id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL,
    name TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT) WITHOUT ROWID;
CREATE TABLE identities (issuer TEXT NOT NULL, subject TEXT NOT NULL, user_id TEXT NOT NULL,
    email TEXT, linked_at TEXT NOT NULL, PRIMARY KEY (issuer, subject)) WITHOUT ROWID;
CREATE TABLE grants (id TEXT PRIMARY KEY, owner TEXT NOT NULL, instance_id TEXT NOT NULL,
    app_id TEXT NOT NULL, user_id TEXT NOT NULL, role TEXT NOT NULL, created_at TEXT NOT NULL,
    seq INTEGER NOT NULL, UNIQUE (owner, instance_id, user_id)) WITHOUT ROWID;
"""
T = "2026-01-01T00:00:00Z"


async def test_a_sign_in_made_by_one_store_is_found_by_another_and_unknown_ones_are_not(
    db: Database,
) -> None:
    async with (
        UserStore.open(db, bootstrap_admin="default") as one,
        UserStore.open(db, bootstrap_admin="default") as two,
    ):
        await one.add("carol", None, Role.MEMBER)
        secret, session = await one.create_session(
            "carol", SessionKind.PASSWORD, address="a", device="d"
        )
        token, _ = await one.create_token("carol", "cli", None)
        assert two.session(secret) is None  # not remembered by the other store
        found = await two.find_session(secret)
        assert found is not None
        assert (found[0].id, found[1].id) == ("carol", session.id)
        assert two.get("carol") is not None  # the user came with it
        assert (await two.find_token(token)) is not None
        assert await two.find_session("not a secret") is None
        assert await two.find_session(new_secret()) is None  # well-formed, read, and unknown
        assert await two.find_token("atp_" + new_secret()) is None
        # ended through the other store, whatever it remembers
        assert await two.end_session("carol", session.id)
        assert await one.end_session("carol", session.id) is False
        async with db.connect() as conn:
            assert (await conn.execute(sa.select(sa.func.count()).select_from(users))).scalar() == 2


async def test_the_last_admin_is_checked_in_the_database_not_in_a_stores_memory(
    db: Database,
) -> None:
    async with (
        UserStore.open(db, bootstrap_admin="default") as one,
        UserStore.open(db, bootstrap_admin="default") as two,
    ):
        await one.add("root2", None, Role.ADMIN)
        await two.find_token((await one.create_token("root2", "t", None))[0])
        assert two.get("root2") is not None
        await one.update("default", role=Role.MEMBER)
        # `two` still remembers default as an admin; the database says root2 is the last one
        with pytest.raises(LastAdmin):
            await two.update("root2", disabled=True)
        with pytest.raises(LastAdmin):
            await two.remove("root2")


async def test_an_older_homes_users_file_is_carried_in_once_even_after_a_crash(
    db: Database, tmp_path: Path
) -> None:
    path = tmp_path / "users.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO users VALUES ('default', 'Default', 'admin', 0, NULL, ?)", (T,))
        conn.execute("INSERT INTO users VALUES ('bob', 'Bob', 'member', 1, 'scrypt$x', ?)", (T,))
        conn.execute("INSERT INTO users VALUES ('eve', 'Eve', 'member', 0, NULL, ?)", (T,))
        conn.execute(
            "INSERT INTO sessions VALUES ('ses_1', ?, 'eve', 'password', ?, ?, 'a', 'd', NULL)",
            (secret_hash("eve's cookie"), T, T),
        )
        conn.execute(
            "INSERT INTO tokens VALUES ('tok_1', ?, 'eve', 'cli', ?, NULL)",
            (secret_hash("eve's token"), T),
        )
        conn.execute("INSERT INTO identities VALUES ('https://idp', 'sub', 'eve', NULL, ?)", (T,))
        conn.execute(
            "INSERT INTO grants VALUES ('grt_1', 'eve', 'i-1', 'app', 'bob', 'viewer', ?, 1)", (T,)
        )
    kept = tmp_path / "copy.sqlite3"
    shutil.copy(path, kept)
    audit_file = tmp_path / "audit.sqlite3"
    await carry_over(db, path, audit_file)
    assert not path.exists()
    assert (tmp_path / "users.sqlite3.carried-over").is_file()
    # a crash after the commit, before the rename: the file is there again at the next start
    shutil.copy(kept, path)
    await carry_over(db, path, audit_file)
    assert not path.exists()
    async with db.connect() as conn:
        marks = (await conn.execute(sa.select(carried_over.c.name))).scalars().all()
    assert marks == [str(path.resolve())]
    async with (
        UserStore.open(db, bootstrap_admin="default") as store,
        GrantStore.open(db, store) as grants,
    ):
        assert [u.id for u in store.all()] == ["bob", "default", "eve"]
        bob = store.require("bob")
        assert (bob.disabled, bob.has_password) == (True, True)
        assert store.password_hash("bob") == "scrypt$x"
        assert store.session("eve's cookie") is not None
        assert store.token("eve's token") is not None
        assert store.identity("https://idp", "sub") is not None
        (grant,) = grants.of_instance("eve", "i-1")
        assert (grant.user_id, grant.role) == ("bob", GrantRole.VIEWER)


async def test_two_stores_demoting_the_last_two_admins_at_once_leave_one(db: Database) -> None:
    """Each store's memory has two admins; the database's row locks make one of the two
    demotions wait for the other and see it (on PostgreSQL without a deadlock between them)."""
    async with (
        UserStore.open(db, bootstrap_admin="default") as one,
        UserStore.open(db, bootstrap_admin="default") as two,
    ):
        await one.add("root2", None, Role.ADMIN)
        await two.find_token((await one.create_token("root2", "t", None))[0])
        results = await asyncio.gather(
            one.update("root2", role=Role.MEMBER),
            two.update("default", role=Role.MEMBER),
            return_exceptions=True,
        )
        assert sum(isinstance(r, LastAdmin) for r in results) == 1, results
        async with db.connect() as conn:
            admins = (
                await conn.execute(sa.select(users.c.id).where(users.c.role == "admin"))
            ).all()
        assert len(admins) == 1


async def test_a_store_told_it_fell_behind_reads_every_user_and_grant_again(db: Database) -> None:
    """What the bus reports when rows were gone before its reader read them: the `user:changed`
    of a disable and of a revoke among them never reached store two, whose memory still held
    the token and the grant; after `fell_behind` neither answers."""
    async with (
        UserStore.open(db, bootstrap_admin="default") as one,
        GrantStore.open(db, one) as grants_one,
    ):
        await one.add("bob", None, Role.MEMBER)
        token, _ = await one.create_token("bob", "cli", None)
        grant, _ = await grants_one.put("default", "i-1", "app", "bob", GrantRole.VIEWER)
        async with (
            UserStore.open(db, bootstrap_admin="default") as two,
            GrantStore.open(db, two) as grants_two,
        ):
            assert await two.find_token(token) is not None
            assert grants_two.of_instance("default", "i-1") != []
            await one.update("bob", disabled=True)
            await grants_one.revoke(grant)
            assert two.token(token) is not None  # nothing heard: the stale memory answers
            two.fell_behind()
            for _ in range(200):
                if not grants_two.of_instance("default", "i-1") and two.require("bob").disabled:
                    break
                await asyncio.sleep(0.01)
            assert await two.find_token(token) is None
            assert two.require("bob").disabled
            assert grants_two.of_instance("default", "i-1") == []


async def test_a_store_that_fell_behind_a_removal_tells_of_the_account_made_again_since(
    db: Database,
) -> None:
    """Rows gone before they were read may hold a removal (and its `user:changed` saying the
    account ended): store two reads bob again as an enabled user, but the account is another
    one, made since at another second, and what store two's shell ran for bob was the old
    account's. It tells `on_ended`; a user only changed is not told."""
    async with UserStore.open(db, bootstrap_admin="default") as one:
        await one.add("bob", None, Role.MEMBER)
        await one.add("carol", None, Role.MEMBER)
        async with db.transaction() as tx:  # the old account was made a while ago
            await tx.execute(sa.update(users).where(users.c.id == "bob").values(created_at=T))
        async with UserStore.open(db, bootstrap_admin="default") as two:
            ended: list[str] = []
            two.on_ended.append(ended.append)
            await one.remove("bob")
            await one.add("bob", None, Role.MEMBER)
            await one.update("carol", name="Carol")
            two.fell_behind()
            for _ in range(200):
                if ended:
                    break
                await asyncio.sleep(0.01)
            assert ended == ["bob"]
            assert not two.require("bob").disabled


async def test_an_ended_session_leaves_nothing_in_memory(db: Database) -> None:
    """Every sign-in a shell saw used was remembered with when its use was last written, for
    ever: a member signing in and out in a loop grew the shell's memory without bound."""
    async with UserStore.open(db, bootstrap_admin="default") as store:
        await store.add("bob", None, Role.MEMBER)
        for _ in range(3):
            _, session = await store.create_session(
                "bob", SessionKind.PASSWORD, address="a", device="d"
            )
            store.seen(session, "a")
            assert await store.end_session("bob", session.id)
        _, kept = await store.create_session("bob", SessionKind.PASSWORD, address="a", device="d")
        store.seen(kept, "a")
        await store.set_password("bob", "scrypt$x", end_sessions=True)  # ends it too
        assert store._seen_written == {}
