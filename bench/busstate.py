"""Event fan-out on the events table: emit → frame at a subscriber, SQLite vs PostgreSQL, one
shell and two; and what `emit` itself costs its caller.

In process, on one uvloop: an `EventBus` per shell, each on its own `Database` (its own engine and
pool, as two shells have), all on one database. One event at a time: measured from just before
`emit` on shell 1 to the moment a subscriber on shell 1 ("one shell") or on shell 2 ("two
shells": the row is written by shell 1's writer, PostgreSQL's NOTIFY wakes shell 2's reader, which
reads the row and fans it out) has the frame. The in-memory bus (no database: what the shell did
before) is the baseline. A burst of 1,000 emits measures the writer's batching: until the last
frame is at the subscriber. The cost on the caller's path is the time one `emit` call takes
(listeners none), in memory and with a database.

PostgreSQL is Debian's, started for the run from the tests' template (`tests.postgres`) on
loopback, with durable commits (``fsync=on``), as SQLite's ``synchronous=FULL`` is.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Final

from atrium.bus import EventBus, Subscription
from atrium.events import KvChanged
from atrium.state.database import Database
from atrium.state.migrate import upgrade
from tests.postgres import _pg_bin, new_database, running_server

ROUNDS: Final = int(os.environ.get("BENCH_ROUNDS", "300"))
WARMUP: Final = 20
BURST: Final = 1000
CALLS: Final = 20_000


@contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server for this run with durable commits: the URL of its ``postgres``."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (make test installs Debian's postgresql)")
    with running_server(bin_dir, durable=True) as url:
        yield url


@asynccontextmanager
async def shells(url: str | None, count: int) -> AsyncIterator[list[EventBus]]:
    """``count`` buses on the database at ``url`` (None: one in-memory bus)."""
    async with AsyncExitStack() as stack:
        if url is None:
            yield [await stack.enter_async_context(EventBus())]
            return
        buses: list[EventBus] = []
        for n in range(count):
            db = await stack.enter_async_context(Database.open(url))
            if n == 0:
                await upgrade(db)
            buses.append(await stack.enter_async_context(EventBus(db=db)))
        yield buses


async def fan_out(url: str | None, count: int) -> tuple[list[float], float]:
    """Seconds from emit on the first bus to the frame at a subscriber of the last, per event;
    and the seconds a burst of `BURST` took to reach it."""
    async with shells(url, count) as buses:
        sub: Subscription = buses[-1].subscribe()
        samples: list[float] = []
        for n in range(WARMUP + ROUNDS):
            started = time.perf_counter()
            buses[0].emit(KvChanged("os", f"k{n}"))
            frame = await sub.next(wait=10)
            took = time.perf_counter() - started
            assert frame is not None
            if n >= WARMUP:
                samples.append(took)
        started = time.perf_counter()
        for n in range(BURST):
            buses[0].emit(KvChanged("os", f"b{n}"))
        for _ in range(BURST):
            assert await sub.next(wait=30) is not None
        return samples, time.perf_counter() - started


async def emit_cost(url: str | None) -> float:
    """Microseconds one `emit` call takes its caller."""
    async with shells(url, 1) as (bus,):
        started = time.perf_counter()
        for n in range(CALLS):
            bus.emit(KvChanged("os", f"c{n}"))
        took = time.perf_counter() - started
        await bus.flush(60)
    return took / CALLS * 1e6


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def main() -> None:
    rows: list[tuple[str, list[float], float]] = []
    costs: list[tuple[str, float]] = []
    root = Path(tempfile.mkdtemp(prefix="atrium-bench-bus-"))
    try:
        rows.append(("in memory (before)", *await fan_out(None, 1)))
        costs.append(("in memory", await emit_cost(None)))
        sqlite = f"sqlite+aiosqlite:///{root / 'state.sqlite3'}"
        rows.append(("SQLite, one shell", *await fan_out(sqlite, 1)))
        costs.append(("SQLite", await emit_cost(f"sqlite+aiosqlite:///{root / 'cost.sqlite3'}")))
        with postgres() as server:
            rows.append(("PostgreSQL, one shell", *await fan_out(new_database(server), 1)))
            rows.append(("PostgreSQL, two shells", *await fan_out(new_database(server), 2)))
            costs.append(("PostgreSQL", await emit_cost(new_database(server))))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nevent fan-out: emit → frame at a subscriber ({ROUNDS} events one at a time)")
    print(f"{'case':<28} {'p50 ms':>8} {'p99 ms':>8} {f'burst {BURST} ms':>15}")
    for name, samples, burst in rows:
        print(
            f"{name:<28} {statistics.median(samples) * 1000:>8.2f} "
            f"{p99(samples) * 1000:>8.2f} {burst * 1000:>15.1f}"
        )
    print(f"\nemit on the caller's path ({CALLS} calls, no listener)")
    for name, micros in costs:
        print(f"{name:<28} {micros:>8.2f} µs per call")


if __name__ == "__main__":
    asyncio.run(main())
