"""The key-value store on SQLite (WAL, one writer thread); every change publishes `kv:changed`.

Namespaces are ``os`` and ``app/<appId>``. Each write is one transaction, synchronous=FULL, so a
write that was answered survives a killed process. Values are JSON. Validators registered for a key
(the theme selection, for one) run before the write and may refuse it.

The file is the shell's alone: created 0600 (SQLite gives its -wal and -shm the same mode). Opening
it runs ``PRAGMA quick_check``: a damaged file stops start-up (`KvDamaged`, a ConfigError naming the
file and the way out) instead of being served and written around. At run time SQLite's own errors
become storage error codes naming the file: damaged pages `storage_damaged` (and no further write is
made into that file), a full disk `storage_full` (the transaction is rolled back, nothing answered
is lost), any other I/O failure `storage_failed` (decisions.md "Storage").
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from atrium.bus import EventBus
from atrium.errors import StorageDamaged, StorageFailed, StorageFull
from atrium.events import KvChanged
from atrium.settings import ConfigError, create_private

MAX_VALUE_BYTES: Final = 1 << 20
T = TypeVar("T")
Validator = Callable[[Any], Any]
_LOGGER = logging.getLogger(__name__)

#: primary SQLite result codes of a file that is not what SQLite wrote
_DAMAGED: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
#: what Python's sqlite3 says of stored text that is not the UTF-8 the store wrote
_NOT_UTF8: Final = "Could not decode to UTF-8"
#: primary result codes of storage that failed under the database (everything else is a bug)
_FAILED: Final = frozenset(
    {
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOLFS,
        sqlite3.SQLITE_PROTOCOL,
    }
)

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


class KvDamaged(ConfigError):
    """The KV file failed its integrity check at start-up: `atrium serve` stops with one line."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(damaged_message(path, detail))
        self.path = path


def damaged_message(path: Path, detail: str) -> str:
    return (
        f"the KV store {path} is damaged ({detail}); stop the shell and run `atrium doctor "
        f"--repair` (it rebuilds the file from the rows still readable and keeps the original), "
        f"or restore the file from a backup (`sqlite3 {path} .recover` saves what is readable)"
    )


class KvStore:
    """Async facade over one SQLite connection owned by one worker thread."""

    def __init__(
        self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, bus: EventBus, path: Path
    ) -> None:
        self._conn = conn
        self._executor = executor
        self._bus = bus
        self._path = path
        #: set once a damaged page was met: from then on nothing more is written into the file
        self._damage: str | None = None
        self._validators: dict[tuple[str, str], Validator] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, *, bus: EventBus) -> AsyncIterator[KvStore]:
        """Open (creating it 0600) and check the file; raises KvDamaged for a damaged one and
        StorageFailed for one that cannot be opened."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, _connect, path)
        except BaseException:
            executor.shutdown(wait=True)
            raise
        try:
            yield cls(conn, executor, bus, path)
        finally:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=True)

    def add_validator(self, namespace: str, key: str, validator: Validator) -> None:
        """``validator(value)`` returns the value to store or raises an AtriumError."""
        self._validators[(namespace, key)] = validator

    async def _run(self, fn: Callable[[], T], *, writes: bool = False) -> T:
        """Run ``fn`` on the store's thread; SQLite's storage errors become StorageFailed ones."""
        if writes and self._damage is not None:
            raise StorageDamaged(self._damaged(self._damage), path=str(self._path))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.DatabaseError as err:
            mapped = self._storage_error(err)
            if mapped is err:
                raise
            raise mapped from err

    def _storage_error(self, err: sqlite3.DatabaseError) -> Exception:
        code = getattr(err, "sqlite_errorcode", None) or 0
        path = str(self._path)
        if code & 0xFF in _DAMAGED or str(err).startswith(_NOT_UTF8):
            if self._damage is None:
                _LOGGER.error("%s", damaged_message(self._path, str(err)))
            self._damage = str(err)
            return StorageDamaged(self._damaged(str(err)), path=path)
        if code & 0xFF == sqlite3.SQLITE_FULL:
            return StorageFull(
                f"the disk holding the KV store {path} is full; nothing was written: "
                f"free space there and try again",
                path=path,
            )
        if code & 0xFF in _FAILED:
            return StorageFailed(f"the KV store {path} failed: {err}", path=path)
        return err

    def _damaged(self, detail: str) -> str:
        return damaged_message(self._path, detail)

    def _decode(self, text: str) -> Any:
        """A stored value is JSON the store wrote; anything else is damage, never served."""
        try:
            return json.loads(text)
        except ValueError as err:
            damaged = sqlite3.DatabaseError("a stored value is not the JSON that was written")
            damaged.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
            raise damaged from err

    async def get(self, namespace: str, key: str) -> KvEntry | None:
        def read() -> KvEntry | None:
            row = self._conn.execute(
                "SELECT value, updated_at FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
            return None if row is None else KvEntry(self._decode(row[0]), row[1])

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

        await self._run(write, writes=True)
        self._bus.emit(KvChanged(namespace, key))
        return KvEntry(json.loads(encoded), now)

    async def delete(self, namespace: str, key: str) -> bool:
        def write() -> bool:
            with self._conn:
                cur = self._conn.execute(
                    "DELETE FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
                )
                return cur.rowcount > 0

        deleted = await self._run(write, writes=True)
        if deleted:
            self._bus.emit(KvChanged(namespace, key))
        return deleted


def _connect(path: Path) -> sqlite3.Connection:
    """Connect, check the file (``PRAGMA quick_check``) and make sure the table exists."""
    try:
        create_private(path)
        for suffix in ("", "-wal", "-shm"):  # an older shell's file: readable by others
            sibling = path.with_name(path.name + suffix)
            if sibling.is_file():
                sibling.chmod(0o600)
    except OSError as err:
        raise ConfigError(f"the KV store {path} cannot be opened: {err.strerror or err}") from err
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            raise KvDamaged(path, "quick_check: " + "; ".join(problems))
        conn.execute(_SCHEMA)
    except sqlite3.DatabaseError as err:
        conn.close()
        code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _DAMAGED:
            raise KvDamaged(path, str(err)) from err
        raise ConfigError(f"the KV store {path} cannot be opened: {err}") from err
    except BaseException:
        conn.close()
        raise
    conn.isolation_level = "DEFERRED"
    return conn


def salvage(path: Path, stamp: str) -> tuple[int, Path]:
    """Rebuild a damaged store from the rows that can still be read (for `atrium doctor
    --repair`, with no shell running): the original moves aside, with its -wal and -shm, to
    ``<name>.damaged-<stamp>``, and a fresh file holds every readable row. Returns the number of
    rows kept and where the original went. Rows are read by walking the key order forwards and
    then backwards, so one damaged page loses only the rows on it; a row whose text is not UTF-8 or
    whose value is not JSON is left out (the store never wrote such a row)."""
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(aside.with_name(aside.name + suffix))
    rows = _readable_rows(aside)
    create_private(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SCHEMA)
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO kv VALUES (?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return len(rows), aside


def _readable_rows(path: Path) -> list[tuple[str, str, str, str]]:
    found: dict[tuple[str, str], tuple[str, str, str, str]] = {}
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error:
        return []
    conn.text_factory = bytes
    try:
        for order in ("ASC", "DESC"):
            query = (
                "SELECT namespace, key, value, updated_at FROM kv "  # noqa: S608 (a fixed word)
                f"ORDER BY namespace {order}, key {order}"
            )
            try:
                for raw in conn.execute(query):
                    row = _row(raw)
                    if row is not None:
                        found.setdefault((row[0], row[1]), row)
            except sqlite3.Error:
                continue
    finally:
        conn.close()
    return sorted(found.values())


def _row(raw: tuple[Any, ...]) -> tuple[str, str, str, str] | None:
    try:
        namespace, key, value, updated = (
            field.decode() if isinstance(field, bytes) else str(field) for field in raw
        )
        json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    return namespace, key, value, updated
