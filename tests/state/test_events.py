"""The event log on both databases: an event exists iff its change committed, ids follow commit
order under concurrent writers, a resume after an id gives each later event once, 10,000 kept."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from atrium.state import events
from atrium.state.database import Database
from atrium.state.schema import event_counter, kv
from atrium.state.schema import events as log

WRITERS = 4
EACH = 50


async def put(tx: AsyncConnection, owner: str, key: str, value: str) -> None:
    """A KV upsert, as the store will make it."""
    insert: Any = (postgresql if tx.dialect.name == "postgresql" else sqlite).insert
    statement = insert(kv).values(
        owner=owner, namespace="os", key=key, value=value, updated_at="2026-01-01T00:00:00.000Z"
    )
    await tx.execute(
        statement.on_conflict_do_update(
            index_elements=[kv.c.owner, kv.c.namespace, kv.c.key],
            set_={"value": statement.excluded.value},
        )
    )


async def stored(db: Database) -> list[events.StoredEvent]:
    async with db.connect() as conn:
        return await events.after(conn, 0, limit=100_000)


async def test_an_event_round_trips_with_its_owner_and_data(db: Database) -> None:
    async with db.transaction() as tx:
        first = await events.append(tx, "kv:changed", "ana", {"namespace": "os", "key": "é→"})
        second = await events.append(tx, "app:installed", None, {"appId": "notes"})
    assert second.id == first.id + 1
    assert [(e.id, e.topic, e.owner, e.data) for e in await stored(db)] == [
        (first.id, "kv:changed", "ana", {"namespace": "os", "key": "é→"}),
        (second.id, "app:installed", None, {"appId": "notes"}),
    ]
    assert (await stored(db))[0].at == first.at


async def test_a_rolled_back_change_leaves_no_event_and_no_gap(db: Database) -> None:
    async with db.connect() as conn:
        before = await events.newest_id(conn)

    class Refused(Exception):
        pass

    async def change_then_refuse() -> None:
        async with db.transaction() as tx:
            await put(tx, "ana", "theme", '"dark"')
            await events.append(tx, "kv:changed", "ana", {"namespace": "os", "key": "theme"})
            raise Refused

    with pytest.raises(Refused):
        await change_then_refuse()
    async with db.connect() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(kv))).scalar() == 0
        assert await events.after(conn, 0) == []
        assert await events.newest_id(conn) == before
    async with db.transaction() as tx:
        await put(tx, "ana", "theme", '"light"')
        kept = await events.append(tx, "kv:changed", "ana", {"namespace": "os", "key": "theme"})
    assert kept.id == before + 1
    assert [e.id for e in await stored(db)] == [kept.id]


async def _write(db: Database, writer: int) -> list[int]:
    ids = []
    for n in range(EACH):
        async with db.transaction() as tx:
            await put(tx, f"user{writer}", f"k{n % 5}", str(n))
            event = await events.append(tx, "kv:changed", f"user{writer}", {"n": n})
        ids.append(event.id)
    return ids


async def test_ids_follow_commit_order_under_concurrent_writers(db: Database) -> None:
    heard: list[int] = []
    listening: asyncio.Task[None] | None = None
    if db.dialect == "postgresql":
        notes = events.notified_ids(db)
        assert await anext(notes) == 0  # listening

        async def hear() -> None:
            async for event_id in notes:
                heard.append(event_id)
                if len(heard) == WRITERS * EACH:
                    return

        listening = asyncio.create_task(hear())
    async with db.connect() as conn:
        start = await events.newest_id(conn)
    written = await asyncio.gather(*(_write(db, w) for w in range(WRITERS)))
    every = sorted(i for ids in written for i in ids)
    # no id twice, none skipped: one per committed transaction
    assert every == list(range(start + 1, start + 1 + WRITERS * EACH))
    for ids in written:
        assert ids == sorted(ids)
    assert [e.id for e in await stored(db)] == every
    if listening is not None:
        async with asyncio.timeout(30):
            await listening
        await notes.aclose()
        # the notifications arrive in commit order: every id after the one before it
        assert heard == every


async def test_a_resume_after_an_id_gives_each_later_event_once(db: Database) -> None:
    ids = []
    for n in range(30):
        async with db.transaction() as tx:
            ids.append((await events.append(tx, "data:changed", None, {"n": n})).id)
    for resume_from in (ids[0] - 1, ids[0], ids[13], ids[-2], ids[-1]):
        got: list[int] = []
        cursor = resume_from
        async with db.connect() as conn:
            while page := await events.after(conn, cursor, limit=7):
                got.extend(e.id for e in page)
                cursor = page[-1].id
        assert got == [i for i in ids if i > resume_from]
        assert [e.data["n"] for e in await stored(db) if e.id > resume_from] == [
            ids.index(i) for i in got
        ]


async def test_the_newest_ten_thousand_are_kept(db: Database) -> None:
    async with db.connect() as conn:
        base = await events.newest_id(conn)
    rows = [
        {"id": base + n, "topic": "data:changed", "owner": None, "data": {"n": n}, "at": "x"}
        for n in range(1, events.KEEP + 1)
    ]
    async with db.transaction() as tx:
        await tx.execute(sa.insert(log), rows)
        await tx.execute(sa.update(event_counter).values(value=base + events.KEEP))
    async with db.transaction() as tx:
        newest = await events.append(tx, "data:changed", None, {"n": events.KEEP + 1})
    async with db.connect() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).select_from(log))).scalar()
        assert count == events.KEEP
        assert await events.oldest_id(conn) == base + 2
        assert newest.id == base + events.KEEP + 1


async def test_several_events_at_once_take_consecutive_ids_and_keep_the_newest(
    db: Database,
) -> None:
    async with db.transaction() as tx:
        single = await events.append(tx, "kv:changed", None, {"n": -1})
        many = await events.append_many(
            tx, [("kv:changed", "ana" if n % 2 else None, {"n": n}) for n in range(events.KEEP)]
        )
    assert [e.id for e in many] == list(range(single.id + 1, single.id + 1 + events.KEEP))
    kept = await stored(db)
    assert [(e.id, e.owner, e.data) for e in kept] == [(e.id, e.owner, e.data) for e in many]
    async with db.connect() as conn:
        assert await events.newest_id(conn) == many[-1].id
