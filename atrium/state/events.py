"""The event log: an event is a row written in the transaction of the change it announces.

``async with db.transaction() as tx: <the change>; await append(tx, topic, owner, data)``: the
event exists if and only if the change committed. Its id is the one-row counter's next value
(``UPDATE event_counter SET value = value + 1 RETURNING value``): the row lock is held until
commit, so writers take ids in the order they commit and a reader that has seen id N never later
meets a smaller one (a sequence gives ids at insert time, and transactions commit in another
order). A rolled-back transaction gives its id back: ids have no gaps. On PostgreSQL the same
transaction sends ``NOTIFY atrium_events, '<id>'``, delivered at commit, in commit order.

The newest `KEEP` events are kept; `after` reads what followed an id (a stream's resume).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from atrium.state.database import KEEPALIVES, Database
from atrium.state.schema import event_counter, events

#: how many events are kept (the newest)
KEEP: Final = 10_000
#: the PostgreSQL notification channel; the payload is the event's id
CHANNEL: Final = "atrium_events"
#: how many events one `after` call returns at most
PAGE: Final = 1000

_NEXT_ID = (
    sa.update(event_counter)
    .where(event_counter.c.id == 1)
    .values(value=event_counter.c.value + 1)
    .returning(event_counter.c.value)
)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One row of the log; ``data`` is the payload's wire form."""

    id: int
    topic: str
    owner: str | None
    data: Mapping[str, Any]
    at: str


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def append(
    tx: AsyncConnection, topic: str, owner: str | None, data: Mapping[str, Any]
) -> StoredEvent:
    """Write an event in ``tx`` (a `Database.transaction`) and return it with its id; the
    events older than the newest `KEEP` go in the same transaction."""
    event_id = (await tx.execute(_NEXT_ID)).scalar_one()
    stored = StoredEvent(event_id, topic, owner, dict(data), _now())
    await tx.execute(
        sa.insert(events).values(
            id=stored.id, topic=topic, owner=owner, data=stored.data, at=stored.at
        )
    )
    # ids have no gaps (a rollback gives its id back), so this keeps exactly the newest KEEP
    await tx.execute(sa.delete(events).where(events.c.id <= event_id - KEEP))
    if tx.dialect.name == "postgresql":
        await tx.execute(sa.select(sa.func.pg_notify(CHANNEL, str(event_id))))
    return stored


async def append_many(
    tx: AsyncConnection, items: Sequence[tuple[str, str | None, Mapping[str, Any]]]
) -> list[StoredEvent]:
    """`append` for several events ``(topic, owner, data)`` at once, with consecutive ids: four
    statements whatever their number (the bus's writer; one statement each costs a round trip)."""
    if not items:
        return []
    last = (
        await tx.execute(
            sa.update(event_counter)
            .where(event_counter.c.id == 1)
            .values(value=event_counter.c.value + len(items))
            .returning(event_counter.c.value)
        )
    ).scalar_one()
    at = _now()
    written = [
        StoredEvent(last - len(items) + 1 + n, topic, owner, dict(data), at)
        for n, (topic, owner, data) in enumerate(items)
    ]
    await tx.execute(
        sa.insert(events),
        [
            {"id": e.id, "topic": e.topic, "owner": e.owner, "data": e.data, "at": e.at}
            for e in written
        ],
    )
    await tx.execute(sa.delete(events).where(events.c.id <= last - KEEP))
    if tx.dialect.name == "postgresql":
        await tx.execute(sa.select(sa.func.pg_notify(CHANNEL, str(last))))
    return written


async def after(conn: AsyncConnection, last_id: int, limit: int = PAGE) -> list[StoredEvent]:
    """The events after ``last_id``, oldest first, at most ``limit``."""
    rows = await conn.execute(
        sa.select(events).where(events.c.id > last_id).order_by(events.c.id).limit(limit)
    )
    return [StoredEvent(r.id, r.topic, r.owner, r.data, r.at) for r in rows]


async def newest_id(conn: AsyncConnection) -> int:
    """The id of the last event given out (kept or not): where a new stream starts."""
    return int((await conn.execute(sa.select(event_counter.c.value))).scalar_one())


async def oldest_id(conn: AsyncConnection) -> int | None:
    """The oldest event kept (None: none): a resume from before it has missed events."""
    found = (await conn.execute(sa.select(sa.func.min(events.c.id)))).scalar_one()
    return None if found is None else int(found)


async def notified_ids(db: Database) -> AsyncGenerator[int, None]:
    """The ids PostgreSQL announces on `CHANNEL`, in commit order, over a connection of its own
    (a connection that waits for notifications can run nothing else). Yields ``0`` once when it
    listens (what a caller awaits before it relies on hearing), then each id."""
    import psycopg  # the postgresql extra: only here

    conninfo = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    conninfo = psycopg.conninfo.make_conninfo(conninfo, **KEEPALIVES)
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    async with conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        yield 0
        async for note in conn.notifies():
            yield int(note.payload)
