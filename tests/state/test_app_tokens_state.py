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
from atrium.identity import token_hash as digest
from atrium.state import apptokens
from atrium.state.apptokens import SharedAppTokens
from atrium.state.database import Database
from atrium.state.schema import app_tokens, events, instances

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


def cut(tokens: SharedAppTokens, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``tokens``' writes fail while the returned flag is up, as with its link to the database
    lost (only its own: the other shell's writes go through)."""
    down = [True]
    write = tokens._write

    async def failing(change: Any) -> Any:
        if down[0]:
            raise OSError("the link to the database is lost")
        return await write(change)

    monkeypatch.setattr(tokens, "_write", failing)
    monkeypatch.setattr(apptokens, "RETRY_SECONDS", 0.05)
    return down


async def own_instance_row(db: Database, instance_id: str, shell: str | None) -> None:
    """The instance's row names ``shell`` (None: no row), as the shell that runs it writes."""
    async with db.transaction() as tx:
        await tx.execute(sa.delete(instances).where(instances.c.id == instance_id))
        if shell is not None:
            await tx.execute(
                sa.insert(instances).values(
                    id=instance_id,
                    app_id=APP,
                    owner="alice",
                    slug=f"slug-{instance_id}",
                    state="started",
                    runner="kubernetes",
                    shell=shell,
                    updated_at="2026-01-01T00:00:00Z",
                )
            )


async def test_a_register_held_up_by_a_cut_writes_nothing_once_another_shell_took_the_pod(
    shells: tuple[SharedAppTokens, ...], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell a adopts a pod at its start while its link is lost: the token's row waits. Shell b
    takes the pod over and its owner removes it (b deletes the row). Back, a's queued write put
    the row again naming a: the removed pod's token acted for its owner on every other shell."""
    a, b = shells
    token = new_token()
    await own_instance_row(db, "notes-1", "host-a:/a")
    down = cut(a, monkeypatch)
    a.register(APP, "notes-1", "alice", token)  # adopted at the start, the link lost
    await own_instance_row(db, "notes-1", "host-b:/b")  # taken over
    b.register(APP, "notes-1", "alice", token)
    await b.flush()
    b.revoke("notes-1")  # removed there
    await b.flush()
    await own_instance_row(db, "notes-1", None)
    down[0] = False
    await a.flush()
    assert await rows(db) == []
    assert await b.find(token) is None


async def test_a_revoke_held_up_by_a_cut_leaves_the_row_of_the_shell_that_took_the_pod(
    shells: tuple[SharedAppTokens, ...], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell a revokes its pod's token while cut off (the delete waits); shell b takes the pod
    over meanwhile and writes its row for the same token. Back, a's delete removed b's row:
    the pod's own calls were refused on every shell but b."""
    a, b = shells
    token = new_token()
    await own_instance_row(db, "notes-1", "host-a:/a")
    a.register(APP, "notes-1", "alice", token)
    await a.flush()
    down = cut(a, monkeypatch)
    a.revoke("notes-1")
    await own_instance_row(db, "notes-1", "host-b:/b")  # taken over
    b.register(APP, "notes-1", "alice", token)
    await b.flush()
    down[0] = False
    await a.flush()
    assert [row.shell for row in await rows(db)] == ["host-b:/b"]
