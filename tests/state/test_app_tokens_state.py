"""App tokens of several shells (`atrium.state.apptokens`), on both databases: two
`SharedAppTokens` named as two shells share one database and one bus, as two shells share them
through the event log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import sqlalchemy as sa

from atrium.bus import EventBus
from atrium.identity import AppCaller, new_token
from atrium.state import apptokens
from atrium.state.apptokens import SharedAppTokens, digest
from atrium.state.database import Database
from atrium.state.schema import app_tokens, events

APP = "com.example.notes"


@pytest.fixture
async def bus(db: Database) -> AsyncIterator[EventBus]:
    async with EventBus(db=db) as opened:
        yield opened


@pytest.fixture
async def shells(db: Database, bus: EventBus) -> AsyncIterator[tuple[SharedAppTokens, ...]]:
    async with (
        SharedAppTokens(db, bus, "host-a:/a") as a,
        SharedAppTokens(db, bus, "host-b:/b") as b,
    ):
        yield a, b


def count_reads(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many connections the stores open to read (a list of one count)."""
    reads = [0]
    connect: Callable[[], AbstractAsyncContextManager[Any]] = db.connect

    def counted() -> AbstractAsyncContextManager[Any]:
        reads[0] += 1
        return connect()

    monkeypatch.setattr(db, "connect", counted)
    return reads


async def rows(db: Database) -> list[Any]:
    async with db.connect() as conn:
        return list(await conn.execute(sa.select(app_tokens)))


async def test_a_token_is_its_app_on_the_other_shell_until_revoked(
    shells: tuple[SharedAppTokens, ...], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = shells
    token = a.issue(APP, "notes-1", "alice")
    await a.stored(token)
    (row,) = await rows(db)
    assert (row.hash, row.instance_id, row.app_id, row.owner, row.shell) == (
        digest(token),
        "notes-1",
        APP,
        "alice",
        "host-a:/a",
    )
    assert token not in repr(tuple(row))
    reads = count_reads(db, monkeypatch)
    for _ in range(3):
        assert await b.find(token) == AppCaller(APP, "notes-1", "alice")
    assert reads == [1]  # then remembered
    assert await a.find(token) == AppCaller(APP, "notes-1", "alice")  # its own: no read
    assert reads == [1]
    a.revoke("notes-1")
    assert await a.find(token) is None  # at once where it was revoked
    await a.flush()
    assert await rows(db) == []
    assert await b.find(token) is None  # the revoke was heard: read again, and gone
    async with db.connect() as conn:
        told = (
            await conn.execute(
                sa.select(events.c.owner, events.c.data).where(events.c.topic == "instance:token")
            )
        ).all()
    assert [(row.owner, row.data) for row in told] == [
        ("alice", {"instanceId": "notes-1", "appId": APP, "gone": True})
    ]


async def test_a_forged_token_costs_one_read_and_the_unknown_are_bounded(
    shells: tuple[SharedAppTokens, ...], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = shells
    monkeypatch.setattr(apptokens, "UNKNOWN_KEPT", 3)
    reads = count_reads(db, monkeypatch)
    forged = new_token()
    for _ in range(5):
        assert await b.find(forged) is None
    assert reads == [1]
    assert await b.find("not-a-token-of-the-form") is None  # never read
    assert reads == [1]
    for _ in range(5):
        assert await b.find(new_token()) is None
    assert len(b._unknown) == 3  # the oldest dropped


async def test_a_pod_left_running_keeps_its_token_and_a_takeover_writes_it_as_its_own(
    shells: tuple[SharedAppTokens, ...], db: Database
) -> None:
    a, b = shells
    token = a.issue(APP, "notes-1", "alice")
    await a.stored(token)
    # a token refused a moment ago (a pod of a shell from before the table) is found at once
    # when a register writes it: its event forgets every unknown token
    forged_then_held = new_token()
    assert await b.find(forged_then_held) is None
    a.register(APP, "notes-2", "alice", forged_then_held)  # an adopted pod's token
    await a.flush()
    assert await b.find(forged_then_held) == AppCaller(APP, "notes-2", "alice")

    a.forget("notes-1")  # shell a stops, its pod runs on: the row stays
    await a.flush()
    assert await b.find(token) == AppCaller(APP, "notes-1", "alice")
    b.register(APP, "notes-1", "alice", token)  # b takes the pod over
    await b.flush()
    shells_of = {row.hash: row.shell for row in await rows(db)}
    assert shells_of[digest(token)] == "host-b:/b"
    assert await a.find(token) == AppCaller(APP, "notes-1", "alice")  # b's now, valid on a
    b.revoke("notes-1")
    await b.flush()
    assert await a.find(token) is None


async def test_a_shell_started_again_removes_the_rows_of_tokens_it_no_longer_holds(
    db: Database, bus: EventBus
) -> None:
    async with SharedAppTokens(db, bus, "host-a:/a") as before:
        kept = before.issue(APP, "notes-1", "alice")
        dropped = before.issue(APP, "notes-2", "alice")
        await before.stored(dropped)
        before.forget("notes-1")
        before.forget("notes-2")
    async with (
        SharedAppTokens(db, bus, "host-a:/a") as again,
        SharedAppTokens(db, bus, "host-b:/b") as other,
    ):
        assert await other.find(dropped) is not None
        again.register(APP, "notes-1", "alice", kept)  # adopted
        assert await again.sweep() == 1
        assert {row.hash for row in await rows(db)} == {digest(kept)}
        assert await other.find(dropped) is None  # heard the sweep's event
        assert await other.find(kept) is not None
