"""Opening the users package's SQLite files (users, grants, audit): one writer connection in WAL
mode, the file and its -wal and -shm owner-only, the schema made, and every failure one
ConfigError naming the file.

`SqliteFile` is one file's connection and the one thread that uses it, shared by every store
keeping tables in that file (the users store and the grants in ``users.sqlite3``): one writer
per file, so their writes queue behind each other instead of contending for SQLite's lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, TypeVar

from atrium.settings import ConfigError, create_private

T = TypeVar("T")


def connect(
    path: Path,
    what: str,
    schema: str,
    *,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    check: bool = False,
) -> sqlite3.Connection:
    """A connection to ``path`` (``what`` names it in errors, e.g. "the users store"), created
    0600 if missing; ``check`` runs ``PRAGMA quick_check`` first and refuses a damaged file."""
    try:
        create_private(path)
        for suffix in ("", "-wal", "-shm"):  # an older shell's file: readable by others
            sibling = path.with_name(path.name + suffix)
            if sibling.is_file():
                sibling.chmod(0o600)
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be opened: {err.strerror or err}") from err
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        if check:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
            if problems != ["ok"]:
                raise ConfigError(f"{what} {path} is damaged: {'; '.join(problems)}")
        conn.executescript(schema)
    except sqlite3.Error as err:
        conn.close()
        raise ConfigError(f"{what} {path} cannot be opened: {err}") from err
    except BaseException:
        conn.close()
        raise
    return conn


class SqliteFile:
    """One SQLite file's connection and its writer thread: every statement on ``conn`` runs on
    that thread (`run`, `submit`)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self.path = path
        self.conn = conn
        self._executor = executor

    @classmethod
    @asynccontextmanager
    async def open(
        cls, path: Path, what: str, schema: str, *, thread: str, check: bool = False
    ) -> AsyncIterator[SqliteFile]:
        """`connect` on a thread of its own (named ``thread``), closed with the block."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread)
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(
                executor, lambda: connect(path, what, schema, check=check)
            )
        except BaseException:
            executor.shutdown(wait=True)
            raise
        try:
            yield cls(path, conn, executor)
        finally:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=True)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn`` on the writer thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def submit(self, fn: Callable[..., object], *args: object) -> Future[object]:
        """``fn(*args)`` on the writer thread, not awaited (a write nobody waits for)."""
        return self._executor.submit(fn, *args)

    async def add_schema(self, what: str, schema: str) -> None:
        """Make another store's tables in this file (``what`` names them in errors)."""

        def make() -> None:
            try:
                self.conn.executescript(schema)
            except sqlite3.Error as err:
                raise ConfigError(f"{what} {self.path} cannot be opened: {err}") from err

        await self.run(make)
