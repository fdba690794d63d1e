"""The KV store on both databases: a write and its `kv:changed` commit together (the stream's id
is the row's), an older shell's ``kv.sqlite3`` moves in once whatever kill interrupts it, and on
PostgreSQL a lost connection is `storage_failed`."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from atrium.bus import EventBus
from atrium.errors import StorageFailed
from atrium.kv import MOVED_NAMESPACE, MOVED_OWNER, KvStore
from atrium.state import events
from atrium.state.database import Database
from atrium.state.schema import event_counter, kv
from tests.conftest import REPO_DIR

WAIT = 15.0


@pytest.fixture
async def store(db: Database) -> AsyncIterator[KvStore]:
    async with EventBus(db=db) as bus, KvStore.open(db, bus=bus, user="ana") as opened:
        yield opened


async def rows(db: Database) -> list[tuple[str, str, str, str]]:
    async with db.connect() as conn:
        found = await conn.execute(
            sa.select(kv.c.owner, kv.c.namespace, kv.c.key, kv.c.value)
            .where(kv.c.owner != MOVED_OWNER)
            .order_by(kv.c.owner, kv.c.namespace, kv.c.key)
        )
        return [(r[0], r[1], r[2], r[3]) for r in found]


async def logged(db: Database) -> list[events.StoredEvent]:
    async with db.connect() as conn:
        return await events.after(conn, 0, limit=100_000)


async def test_a_write_and_its_event_commit_together_and_the_stream_carries_its_id(
    db: Database,
) -> None:
    async with EventBus(db=db) as bus, KvStore.open(db, bus=bus, user="ana") as store:
        heard = bus.subscribe(("kv:*",))
        await store.set("os", "x", {"n": 1})
        await store.set("global", "g", "all", owner="bob")
        assert await store.delete("os", "x")
        assert not await store.delete("os", "never")  # nothing deleted: no event
        frames = [await heard.next(WAIT) for _ in range(3)]
    log = await logged(db)
    assert [(e.topic, e.owner, dict(e.data)) for e in log] == [
        ("kv:changed", "ana", {"namespace": "os", "key": "x"}),
        ("kv:changed", None, {"namespace": "global", "key": "g"}),
        ("kv:changed", "ana", {"namespace": "os", "key": "x"}),
    ]
    assert [int(f.split(b"\n")[0].removeprefix(b"id: ")) for f in frames if f] == [
        e.id for e in log
    ]
    assert await rows(db) == [("", "global", "g", '"all"')]


async def test_a_write_whose_event_cannot_be_appended_leaves_no_row(
    db: Database, store: KvStore
) -> None:
    async with db.transaction() as tx:
        await tx.execute(sa.delete(event_counter))  # the counter's row gone: append fails
    with pytest.raises(sa.exc.NoResultFound):
        await store.set("os", "x", 1)
    assert await rows(db) == []
    assert await logged(db) == []


OLD_SCHEMA = "CREATE TABLE kv (namespace TEXT, key TEXT, value TEXT, updated_at TEXT, "
OLD_SCHEMA += "PRIMARY KEY (namespace, key)) WITHOUT ROWID"


def older_file(path: Path, count: int) -> dict[str, str]:
    """A ``kv.sqlite3`` as a shell wrote it before rows had owners: ``count`` rows."""
    values = {f"k{n:05d}": json.dumps(f"v{n}") for n in range(count)}
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(OLD_SCHEMA)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO kv VALUES ('os', ?, ?, '2026-01-01T00:00:00.000Z')", values.items()
    )
    conn.execute("COMMIT")
    conn.close()
    return values


async def test_an_older_file_moves_in_once_and_is_renamed_aside(
    db: Database, tmp_path: Path
) -> None:
    path = tmp_path / "kv.sqlite3"
    values = older_file(path, 3)
    async with EventBus() as bus:
        async with KvStore.open(db, bus=bus, user="ana") as store:
            await store.set("os", "k00001", "newer than the file's")  # another shell's write
        async with KvStore.open(db, bus=bus, user="ana", moved_from=path) as store:
            assert (await store.get("os", "k00000")) is not None
        assert await rows(db) == [
            ("ana", "os", "k00000", values["k00000"]),
            ("ana", "os", "k00001", '"newer than the file\'s"'),
            ("ana", "os", "k00002", values["k00002"]),
        ]
        assert not path.exists()
        (aside,) = tmp_path.glob("kv.sqlite3.moved-*")
        # a kill after the move committed and before the rename: the file is where it was, and
        # the shell deleted a moved row since. The next open only renames: nothing comes back
        aside.rename(path)
        async with KvStore.open(db, bus=bus, user="ana") as store:
            assert await store.delete("os", "k00000")
        async with KvStore.open(db, bus=bus, user="ana", moved_from=path) as store:
            assert await store.get("os", "k00000") is None
    assert not path.exists()
    assert len(list(tmp_path.glob("kv.sqlite3.moved-*"))) == 1
    async with db.connect() as conn:
        marks = (await conn.execute(sa.select(kv).where(kv.c.namespace == MOVED_NAMESPACE))).all()
    assert [(m.owner, json.loads(m.value)) for m in marks] == [
        (MOVED_OWNER, {"file": str(path), "rows": 3})
    ]


async def test_another_homes_file_at_the_same_path_moves_too(db: Database, tmp_path: Path) -> None:
    """Two machines sharing one database may keep their homes at the same path: the second
    home's file is not the first's, and its rows move too."""
    path = tmp_path / "kv.sqlite3"
    older_file(path, 2)
    async with EventBus() as bus:
        async with KvStore.open(db, bus=bus, user="ana", moved_from=path):
            pass
        conn = sqlite3.connect(path, isolation_level=None)  # the other machine's file
        conn.execute("CREATE TABLE kv (owner, namespace, key, value, updated_at)")
        conn.execute("INSERT INTO kv VALUES ('bob', 'os', 'b', '1', '2026-02-01T00:00:00.000Z')")
        conn.close()
        async with KvStore.open(db, bus=bus, user="ana", moved_from=path) as store:
            entry = await store.get("os", "b", owner="bob")
    assert entry is not None
    assert entry.value == 1
    assert len(list(tmp_path.glob("kv.sqlite3.moved-*"))) == 2


MOVE = """
import asyncio, sys
from pathlib import Path
from atrium.bus import EventBus
from atrium.kv import KvStore
from atrium.state.database import Database

async def main():
    async with Database.open(sys.argv[1]) as db, EventBus() as bus:
        print("moving", flush=True)
        async with KvStore.open(db, bus=bus, user="ana", moved_from=Path(sys.argv[2])):
            print("moved", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("after", [0.05, 0.4])
async def test_a_move_killed_at_any_point_loses_no_row_and_copies_once(
    db: Database, tmp_path: Path, after: float
) -> None:
    path = tmp_path / "kv.sqlite3"
    values = older_file(path, 5_000)
    url = db.url.render_as_string(hide_password=False)
    mover = subprocess.Popen(
        [sys.executable, "-c", MOVE, url, str(path)],
        cwd=REPO_DIR,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_DIR)},
    )
    assert mover.stdout is not None
    assert mover.stdout.readline() == "moving\n"
    time.sleep(after)  # somewhere in the move (or after it): any point must be safe
    mover.send_signal(signal.SIGKILL)
    mover.wait()
    mover.stdout.close()
    async with EventBus() as bus, KvStore.open(db, bus=bus, user="ana", moved_from=path):
        pass
    assert await rows(db) == [("ana", "os", k, v) for k, v in sorted(values.items())]
    assert not path.exists()
    assert len(list(tmp_path.glob("kv.sqlite3.moved-*"))) == 1


async def test_a_lost_postgresql_connection_is_storage_failed(
    database_url: str, db: Database, store: KvStore
) -> None:
    if db.dialect != "postgresql":
        pytest.skip("SQLite's storage errors are tested through the shell (test_storage)")
    await store.set("os", "x", 1)
    name = db.url.database
    admin = db.url.set(drivername="postgresql", database="postgres")
    import psycopg

    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        with pytest.raises(StorageFailed) as failed:
            await store.set("os", "x", 2)
        assert failed.value.code == "storage_failed"
        assert failed.value.fields["path"] == db.name
        with pytest.raises(StorageFailed):
            await store.get("os", "x")
        conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    await store.set("os", "x", 3)
    entry = await store.get("os", "x")
    assert entry is not None
    assert entry.value == 3


async def test_repair_rebuilds_every_table_of_a_damaged_state_file(tmp_path: Path) -> None:
    """`salvage_state` (what `atrium doctor --repair` runs) keeps the tables it does not know,
    and the event counter is never behind the newest event kept (ids never go back)."""
    from atrium.kv import salvage_state
    from atrium.state.versions import open_checked

    path = tmp_path / "state.sqlite3"
    url = f"sqlite+aiosqlite:///{path}"
    big = "v" * 3000
    async with (
        open_checked(url) as db,
        EventBus() as bus,
        KvStore.open(db, bus=bus, user="ana") as store,
    ):
        for n in range(40):
            await store.set("os", f"k{n:02d}", f"{n:02d}{big}")
        async with db.transaction() as tx:
            await tx.execute(sa.update(event_counter).values(value=0))  # a counter row behind
    data = bytearray(path.read_bytes())
    at = data.index(f'"20{big}'.encode()) // 4096 * 4096
    data[at : at + 4096] = bytes((n * 151 + 7) % 256 for n in range(4096))
    path.write_bytes(bytes(data))
    kept, aside = salvage_state(path, "stamp")
    assert aside.name == "state.sqlite3.damaged-stamp"
    assert kept > 40  # the events, the version row and the KV rows outside the damaged page
    async with (
        open_checked(url) as db,
        EventBus() as bus,
        KvStore.open(db, bus=bus, user="ana") as store,
    ):
        readable = {k: (await store.get("os", k)) for k in await store.keys("os")}
        assert 30 <= len(readable) < 40
        assert all(e is not None and e.value == f"{k[1:]}{big}" for k, e in readable.items())
        newest = max(e.id for e in await logged(db))
        async with db.connect() as conn:
            assert await events.newest_id(conn) == newest
