"""The key-value store on SQLite (WAL, one writer thread); every change publishes `kv:changed`.

Namespaces are ``os`` and ``app/<appId>``. Each write is one transaction, synchronous=FULL, so a
write that was answered survives a killed process. Values are JSON. Validators registered for a key
(the theme selection, for one) run before the write and may refuse it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from atrium.bus import EventBus
from atrium.events import KV_CHANGED

MAX_VALUE_BYTES: Final = 1 << 20
T = TypeVar("T")
Validator = Callable[[Any], Any]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class KvEntry:
    """A stored value and when it was last written."""

    value: Any
    updated_at: str

    def wire(self) -> dict[str, Any]:
        return {"value": self.value, "updatedAt": self.updated_at}


class KvStore:
    """Async facade over one SQLite connection owned by one worker thread."""

    def __init__(
        self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, bus: EventBus
    ) -> None:
        self._conn = conn
        self._executor = executor
        self._bus = bus
        self._validators: dict[tuple[str, str], Validator] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, *, bus: EventBus) -> AsyncIterator[KvStore]:
        path.parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv")
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(executor, _connect, path)
        try:
            yield cls(conn, executor, bus)
        finally:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=True)

    def add_validator(self, namespace: str, key: str, validator: Validator) -> None:
        """``validator(value)`` returns the value to store or raises an AtriumError."""
        self._validators[(namespace, key)] = validator

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def get(self, namespace: str, key: str) -> KvEntry | None:
        def read() -> KvEntry | None:
            row = self._conn.execute(
                "SELECT value, updated_at FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
            return None if row is None else KvEntry(json.loads(row[0]), row[1])

        return await self._run(read)

    async def keys(self, namespace: str) -> list[str]:
        def read() -> list[str]:
            rows = self._conn.execute(
                "SELECT key FROM kv WHERE namespace = ? ORDER BY key", (namespace,)
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(read)

    async def set(self, namespace: str, key: str, value: Any) -> KvEntry:
        """Store ``value`` (validated, JSON-encodable, at most 1 MiB) in one transaction."""
        validator = self._validators.get((namespace, key))
        if validator is not None:
            value = validator(value)
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
        if len(encoded.encode()) > MAX_VALUE_BYTES:
            raise ValueError(f"a KV value is at most {MAX_VALUE_BYTES} bytes of JSON")
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

        def write() -> None:
            with self._conn:
                self._conn.execute(
                    "INSERT INTO kv (namespace, key, value, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, "
                    "updated_at = excluded.updated_at",
                    (namespace, key, encoded, now),
                )

        await self._run(write)
        self._bus.publish(KV_CHANGED, {"namespace": namespace, "key": key})
        return KvEntry(json.loads(encoded), now)

    async def delete(self, namespace: str, key: str) -> bool:
        def write() -> bool:
            with self._conn:
                cur = self._conn.execute(
                    "DELETE FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
                )
                return cur.rowcount > 0

        deleted = await self._run(write)
        if deleted:
            self._bus.publish(KV_CHANGED, {"namespace": namespace, "key": key})
        return deleted


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute(_SCHEMA)
    conn.isolation_level = "DEFERRED"
    return conn
