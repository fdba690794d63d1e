"""KV write latency on the state database: SQLite (the embedded default) vs PostgreSQL, one shell
and two.

A real shell (`launch_shell`: `ShellServer` on uvloop in a thread of this process) answers
``PUT /api/kv/os/<key>`` from one client, one write at a time: each is one transaction that writes
the row and appends its ``kv:changed`` event (and, on PostgreSQL, its NOTIFY), then the bus reads
the event back and fans it out. Measured from before the request to its answer. PostgreSQL is
Debian's, started for the run from the tests' template (`tests.postgres`) on loopback, with its
defaults for durability (``fsync=on``, ``synchronous_commit=on``; the tests turn fsync off): a
commit is on disk when answered, as SQLite's ``synchronous=FULL`` is.

Two shells on one PostgreSQL: both in this process (each on its own event loop and thread, as the
tests run them), one client each writing at the same time, so each write also meets the other
shell's on the event counter's row lock, and each shell's reader reads the other's rows (woken by
NOTIFY). Beside it, one shell with two such clients: the difference between the two rows is what
the second shell costs, not the second client.

Printed: median and p99 per case, and the median's ratio to SQLite's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from atrium.state.migrate import upgrade_now
from tests.integration.conftest import launch_shell
from tests.postgres import _pg_bin, new_database, running_server

WRITES: Final = int(os.environ.get("BENCH_ROUNDS", "500"))
WARMUP: Final = 20
VALUE: Final = {"theme": "atrium-dark", "n": 0, "note": "x" * 200}


@contextmanager
def postgres() -> Iterator[str]:
    """A PostgreSQL server for this run with durable commits: the URL of its ``postgres``."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (make test installs Debian's postgresql)")
    with running_server(bin_dir, durable=True) as url:
        yield url


def writes(database_url: str | None, shells: int = 1, clients: int = 1) -> list[float]:
    """Seconds per answered KV write through ``shells`` shells on ``database_url`` (None:
    SQLite), from ``clients`` clients at once (client n writes through shell n mod ``shells``),
    each making `WRITES` sequential writes to keys of its own."""
    root = Path(tempfile.mkdtemp(prefix="atrium-bench-kv-"))
    (root / "apps").mkdir()
    extra = {} if database_url is None else {"database_url": database_url}
    running = [launch_shell(root / f"home{n}", root / "apps", **extra) for n in range(shells)]
    samples: list[list[float]] = [[] for _ in range(clients)]

    def client(c: int) -> None:
        shell = running[c % shells]
        with shell.client() as api:
            for n in range(WARMUP + WRITES):
                started = time.perf_counter()
                answer = api.put(f"/api/kv/os/c{c}-k{n % 50}", json={"value": {**VALUE, "n": n}})
                took = time.perf_counter() - started
                assert answer.status_code == 200, answer.text
                if n >= WARMUP:
                    samples[c].append(took)

    try:
        with ThreadPoolExecutor(clients) as pool:
            for done in [pool.submit(client, c) for c in range(clients)]:
                done.result()
    finally:
        for shell in running:
            shell.stop()
        shutil.rmtree(root, ignore_errors=True)
    return [took for each in samples for took in each]


def p99(samples: list[float]) -> float:
    return sorted(samples)[min(len(samples) - 1, int(len(samples) * 0.99))]


async def main() -> None:
    import asyncio

    rows = [("SQLite (state.sqlite3, synchronous=FULL)", await asyncio.to_thread(writes, None))]
    with postgres() as server:
        url = new_database(server)
        await asyncio.to_thread(upgrade_now, url)
        rows.append(("PostgreSQL (loopback, fsync on)", await asyncio.to_thread(writes, url)))
        url = new_database(server)
        await asyncio.to_thread(upgrade_now, url)
        rows.append(
            ("PostgreSQL, one shell, two clients", await asyncio.to_thread(writes, url, 1, 2))
        )
        url = new_database(server)
        await asyncio.to_thread(upgrade_now, url)
        rows.append(
            ("PostgreSQL, two shells, a client each", await asyncio.to_thread(writes, url, 2, 2))
        )
    base = statistics.median(rows[0][1])
    print(f"\nKV write latency, {WRITES} sequential PUT /api/kv per client (row + event + fan-out)")
    print(f"{'database':<44} {'median ms':>10} {'p99 ms':>9} {'x SQLite':>9}")
    for name, samples in rows:
        median = statistics.median(samples)
        print(
            f"{name:<44} {median * 1000:>10.2f} {p99(samples) * 1000:>9.2f} {median / base:>8.2f}x"
        )
