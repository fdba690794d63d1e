"""The event bus on the events table, on both databases: every event is a row with a counter id,
streams and listeners hear each once in id order, a resume reads the table, and two buses on one
PostgreSQL database (two shells) hear each other's events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from atrium.bus import Event, EventBus, Subscription
from atrium.events import AppInstalled, KvChanged, SystemUsage
from atrium.state import events
from atrium.state.database import Database
from atrium.state.migrate import upgrade
from tests.postgres import new_database


def parse(frame: bytes) -> tuple[int, str, dict[str, Any]]:
    id_line, event_line, data_line = frame.decode()[:-2].split("\n")
    data = json.loads(data_line.removeprefix("data: "))
    return int(id_line.removeprefix("id: ")), event_line.removeprefix("event: "), data


async def frames(sub: Subscription, count: int) -> list[tuple[int, str, dict[str, Any]]]:
    """The next ``count`` frames of ``sub`` (heartbeats skipped), failing if they do not come."""
    got: list[tuple[int, str, dict[str, Any]]] = []
    async with asyncio.timeout(20):
        while len(got) < count:
            frame = await sub.next()
            assert frame is not None, f"the stream ended after {got}"
            if not frame.startswith(b":"):
                got.append(parse(frame))
    return got


async def stored(db: Database) -> list[events.StoredEvent]:
    async with db.connect() as conn:
        return await events.after(conn, 0, limit=100_000)


@pytest.fixture
async def bus(db: Database) -> AsyncIterator[EventBus]:
    async with EventBus(db=db) as opened:
        yield opened


async def test_an_emitted_event_is_heard_at_once_and_streamed_with_its_row_id(
    db: Database, bus: EventBus
) -> None:
    heard: list[Event] = []
    bus.listen(None, heard.append)
    sub = bus.subscribe()
    returned = bus.emit(AppInstalled("com.example.notes", "global"))
    assert [e.data for e in heard] == [AppInstalled("com.example.notes", "global")]
    assert returned.id == 0  # not written yet: nothing may rely on it
    ((event_id, topic, data),) = await frames(sub, 1)
    (row,) = await stored(db)
    assert (event_id, topic) == (row.id, "app:installed")
    assert data == {"type": "app:installed", "appId": "com.example.notes", "scope": "global"}
    await bus.flush()
    assert len(heard) == 1  # read back, not heard again


async def test_committed_events_are_heard_once_and_streamed(db: Database, bus: EventBus) -> None:
    heard: list[tuple[int, object]] = []
    bus.listen(("kv:*",), lambda e: heard.append((e.id, e.data)))
    sub = bus.subscribe(("kv:*",))
    change = KvChanged("os", "k", owner="ana")
    async with db.transaction() as tx:
        row = await events.append(tx, change.TOPIC, change.owner, change.wire())
    bus.committed([(row, change)])
    assert heard == [(row.id, change)]
    assert [f[0] for f in await frames(sub, 1)] == [row.id]
    await bus.flush()
    bus.committed([(row, change)])  # told late, after the reader met it: not heard again
    assert heard == [(row.id, change)]


async def test_a_resume_reads_the_table_and_joins_the_live_events_without_gap_or_repeat(
    db: Database, bus: EventBus
) -> None:
    for n in range(30):
        bus.emit(KvChanged("os", f"k{n}"))
    await bus.flush()
    ids = [e.id for e in await stored(db)]
    live = bus.subscribe()
    resumed = bus.subscribe(last_event_id=ids[9])
    for n in range(30, 60):  # emitted while the resume reads the table
        bus.emit(KvChanged("os", f"k{n}"))
    got = await frames(resumed, 50)
    assert [f[0] for f in got] == list(range(ids[10], ids[10] + 50))
    assert [f[2]["key"] for f in got] == [f"k{n}" for n in range(10, 60)]
    assert [f[0] for f in await frames(live, 30)] == list(range(ids[-1] + 1, ids[-1] + 31))
    await bus.flush()
    assert resumed.queue.empty()


async def test_a_resume_hears_only_what_its_filters_admit(db: Database, bus: EventBus) -> None:
    bus.emit(KvChanged("os", "ana's", owner="ana"))
    bus.emit(KvChanged("os", "bob's", owner="bob"))
    bus.emit(AppInstalled("a", "global"))
    await bus.flush()
    sub = bus.subscribe(
        ("kv:*",), last_event_id=0, admit=lambda e: e.data is not None and e.data.owner == "ana"
    )
    bus.emit(KvChanged("os", "ana's 2", owner="ana"))
    assert [f[2]["key"] for f in await frames(sub, 2)] == ["ana's", "ana's 2"]


async def test_a_figure_is_no_row_and_carries_the_id_before_it(db: Database, bus: EventBus) -> None:
    sub = bus.subscribe()
    bus.emit(AppInstalled("a", "global"))
    ((first, _, _),) = await frames(sub, 1)
    bus.emit(SystemUsage({}, [], "now", owner="ana"))
    ((again, topic, _),) = await frames(sub, 1)
    assert (again, topic) == (first, "system:usage")
    assert [e.topic for e in await stored(db)] == ["app:installed"]


async def test_leaving_the_bus_writes_what_was_emitted_and_ends_streams(db: Database) -> None:
    async with EventBus(db=db) as bus:
        sub = bus.subscribe()
        for n in range(500):
            bus.emit(KvChanged("os", f"k{n}"))
    assert [e.data["key"] for e in await stored(db)] == [f"k{n}" for n in range(500)]
    assert sub.closed
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("bus ")]


async def test_a_new_bus_continues_the_ids_and_resumes_across_the_restart(db: Database) -> None:
    async with EventBus(db=db) as first:
        for n in range(3):
            first.emit(KvChanged("os", f"before{n}"))
    (_, second_id, _) = [e.id for e in await stored(db)]
    async with EventBus(db=db) as second:
        sub = second.subscribe(last_event_id=second_id)
        second.emit(KvChanged("os", "after"))
        got = await frames(sub, 2)
    assert [(f[0], f[2]["key"]) for f in got] == [
        (second_id + 1, "before2"),
        (second_id + 2, "after"),
    ]


@pytest.fixture
async def replicas(postgres_server: str) -> AsyncIterator[list[EventBus]]:
    """Four buses on one PostgreSQL database: four shells."""
    url = new_database(postgres_server)
    async with AsyncExitStack() as stack:
        buses: list[EventBus] = []
        for _ in range(4):
            db = await stack.enter_async_context(Database.open(url))
            if not buses:
                await upgrade(db)
            buses.append(await stack.enter_async_context(EventBus(db=db)))
        yield buses


async def test_an_event_of_one_replica_reaches_the_other_once(replicas: list[EventBus]) -> None:
    one, two = replicas[:2]
    heard_one: list[Event] = []
    heard_two: list[Event] = []
    one.listen(None, heard_one.append, others=True)
    two.listen(None, heard_two.append, others=True)
    own_one: list[Event] = []
    one.listen(None, own_one.append)
    sub_one, sub_two = one.subscribe(), two.subscribe()
    one.emit(AppInstalled("com.example.a", "global"))
    two.emit(KvChanged("os", "k", owner="ana"))
    got_one, got_two = await frames(sub_one, 2), await frames(sub_two, 2)
    assert got_one == got_two
    assert [f[1] for f in got_one] in (
        ["app:installed", "kv:changed"],
        ["kv:changed", "app:installed"],
    )
    await one.flush()
    await two.flush()
    await asyncio.sleep(0.2)  # a late duplicate would come now
    assert sub_one.queue.empty()
    assert sub_two.queue.empty()
    # each replica's listeners hear each event once: their own at once, the other's typed
    assert sorted(e.topic for e in heard_one) == ["app:installed", "kv:changed"]
    assert sorted(e.topic for e in heard_two) == ["app:installed", "kv:changed"]
    (foreign,) = [e for e in heard_two if e.topic == "app:installed"]
    assert foreign.data == AppInstalled("com.example.a", "global")
    (foreign,) = [e for e in heard_one if e.topic == "kv:changed"]
    assert foreign.data == KvChanged("os", "k", owner="ana")
    # a listener that did not ask for other shells' events hears only this shell's: the data
    # proxy's routes or the warm pool would take another shell's instance for their own
    assert [e.topic for e in own_one] == ["app:installed"]


async def test_an_own_event_the_reader_read_first_reaches_each_listener_once(
    postgres_server: str,
) -> None:
    """A store's row can be read (woken by NOTIFY) before the store calls `committed`: the
    reader takes it for another shell's; this shell's own listeners must still hear it."""
    async with Database.open(new_database(postgres_server)) as db:
        await upgrade(db)
        async with EventBus(db=db) as one:
            every: list[Event] = []
            own: list[Event] = []
            one.listen(("kv:*",), every.append, others=True)
            one.listen(("kv:*",), own.append)
            sub = one.subscribe()
            data = KvChanged("os", "k", owner="ana")
            async with db.transaction() as tx:
                row = await events.append(tx, "kv:changed", "ana", data.wire())
            await frames(sub, 1)  # the reader has read the row, before the store says so
            one.committed([(row, data)])
            assert [e.id for e in every] == [row.id]
            assert [e.id for e in own] == [row.id]


async def test_a_resume_on_another_replica_gets_every_later_id_once(
    replicas: list[EventBus],
) -> None:
    one, two = replicas[:2]
    sub_one = one.subscribe()
    for n in range(20):
        one.emit(KvChanged("os", f"k{n}"))
    got = await frames(sub_one, 20)
    resume_from = got[4][0]
    resumed = two.subscribe(last_event_id=resume_from)
    for n in range(20, 40):
        one.emit(KvChanged("os", f"k{n}"))
    again = await frames(resumed, 35)
    assert [f[0] for f in again] == list(range(resume_from + 1, resume_from + 36))
    assert [f[2]["key"] for f in again] == [f"k{n}" for n in range(5, 40)]
    await asyncio.sleep(0.2)
    assert resumed.queue.empty()


async def test_events_of_four_concurrent_writers_arrive_in_id_order(
    replicas: list[EventBus],
) -> None:
    watchers = [bus.subscribe() for bus in replicas]

    async def write(bus: EventBus, writer: int) -> None:
        for n in range(50):
            bus.emit(KvChanged("os", f"{writer}.{n}"))
            if n % 7 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(write(bus, w) for w, bus in enumerate(replicas)))
    seen = [await frames(sub, 200) for sub in watchers]
    ids = [f[0] for f in seen[0]]
    assert ids == list(range(ids[0], ids[0] + 200))
    assert all(got == seen[0] for got in seen)
    for writer in range(4):  # each writer's own order kept
        mine = [f[2]["key"] for f in seen[0] if f[2]["key"].startswith(f"{writer}.")]
        assert mine == [f"{writer}.{n}" for n in range(50)]


async def test_a_resume_from_an_id_never_given_out_hears_what_comes_next(
    db: Database, bus: EventBus
) -> None:
    bus.emit(KvChanged("os", "before"))
    await bus.flush()
    sub = bus.subscribe(last_event_id=10**18)
    async with asyncio.timeout(20):
        while sub.resuming:  # it has read the table
            await asyncio.sleep(0.01)
    bus.emit(KvChanged("os", "after"))
    assert [f[2]["key"] for f in await frames(sub, 1)] == ["after"]


def test_the_bus_keeps_as_many_events_as_the_table() -> None:
    """The bus names the table's figure without importing it (SQLAlchemy loads with a shell's
    database, not with `atrium --help`)."""
    from atrium.bus import HISTORY

    assert HISTORY == events.KEEP


async def test_a_new_stream_gets_no_event_emitted_before_it_began(db: Database) -> None:
    """The row of an event emitted just before a stream began is written after: the stream
    must not take it for one of its own (a test waiting for "the next event" met the one
    before it, once git runs got fast enough to open the stream first)."""
    async with EventBus(db=db) as bus:
        bus.emit(KvChanged("os", "before"))
        late = bus.subscribe()
        resumed = bus.subscribe(last_event_id=0)
        bus.emit(KvChanged("os", "after"))
        assert [f[2]["key"] for f in await frames(late, 1)] == ["after"]
        assert [f[2]["key"] for f in await frames(resumed, 2)] == ["before", "after"]
        await bus.flush()
        assert late.queue.empty()
