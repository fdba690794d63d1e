"""The key-value store on SQLite (WAL, one writer thread); every change publishes `kv:changed`.

Namespaces are ``os`` and ``app/<appId>``, one set per user: every row has an ``owner`` (a user id),
and ``global`` holds the platform's defaults under no user (stored with the owner `PLATFORM`).
A file made before rows had owners is migrated in place when it is opened: every row becomes the
bootstrap admin's, in one transaction (decisions.md "Users: KV, events and theme"). Each write is one transaction, synchronous=FULL, so a
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
#: ``validator(value, owner)``: the value to store in ``owner``'s row (`PLATFORM` in `GLOBAL`)
Validator = Callable[[Any, str], Any]
#: ``validator(value)``: the value to store, whoever's row it is
PlainValidator = Callable[[Any], Any]
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

#: the namespace of platform defaults: one copy, no user's
GLOBAL: Final = "global"
#: the owner stored with `GLOBAL` rows (no user id is empty)
PLATFORM: Final = ""
#: what marks the rows of a removed user (no user id has it): ``<id>#removed-<stamp>``
REMOVED: Final = "#removed-"

_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    owner TEXT NOT NULL,
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (owner, namespace, key)
) WITHOUT ROWID;
"""
_SCHEMA = _TABLE.format(name="kv")


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
        self,
        conn: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        bus: EventBus,
        path: Path,
        user: str,
    ) -> None:
        self._conn = conn
        #: whose rows a call without ``owner`` means: the bootstrap admin (the one-user world)
        self._user = user
        self._executor = executor
        self._bus = bus
        self._path = path
        #: set once a damaged page was met: from then on nothing more is written into the file
        self._damage: str | None = None
        self._validators: dict[tuple[str, str], Validator] = {}

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, *, bus: EventBus, user: str) -> AsyncIterator[KvStore]:
        """Open (creating it 0600) and check the file; raises KvDamaged for a damaged one and
        StorageFailed for one that cannot be opened. ``user`` (the bootstrap admin) receives the
        rows of a file made before rows had owners, and is the owner calls without one mean."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, _connect, path, user)
        except BaseException:
            executor.shutdown(wait=True)
            raise
        try:
            yield cls(conn, executor, bus, path, user)
        finally:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=True)

    @property
    def user(self) -> str:
        """The bootstrap admin: whose rows a call without ``owner`` means."""
        return self._user

    def add_validator(self, namespace: str, key: str, validator: PlainValidator) -> None:
        """``validator(value)`` returns the value to store or raises an AtriumError."""
        self._validators[(namespace, key)] = lambda value, _owner: validator(value)

    def add_owned_validator(self, namespace: str, key: str, validator: Validator) -> None:
        """``validator(value, owner)`` returns the value to store in ``owner``'s row (`PLATFORM`
        in `GLOBAL`) or raises an AtriumError."""
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

    def _owner(self, namespace: str, owner: str | None) -> str:
        """The stored owner of a row: `PLATFORM` in `GLOBAL`, else ``owner`` or the bootstrap
        admin."""
        if namespace == GLOBAL:
            return PLATFORM
        return self._user if owner is None else owner

    async def get(self, namespace: str, key: str, *, owner: str | None = None) -> KvEntry | None:
        """``owner``'s row (None: the bootstrap admin's; ignored in `GLOBAL`)."""
        who = self._owner(namespace, owner)

        def read() -> KvEntry | None:
            row = self._conn.execute(
                "SELECT value, updated_at FROM kv WHERE owner = ? AND namespace = ? AND key = ?",
                (who, namespace, key),
            ).fetchone()
            return None if row is None else KvEntry(self._decode(row[0]), row[1])

        return await self._run(read)

    async def keys(self, namespace: str, *, owner: str | None = None) -> list[str]:
        who = self._owner(namespace, owner)

        def read() -> list[str]:
            rows = self._conn.execute(
                "SELECT key FROM kv WHERE owner = ? AND namespace = ? ORDER BY key",
                (who, namespace),
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(read)

    async def set_aside(self, owner: str, stamp: str) -> int:
        """Move every row of a removed user out of reach, in one transaction: the rows stay in
        the file under the owner ``<owner>#removed-<stamp>`` (no user id has a ``#``), so a new
        user given the same id starts empty and nothing is deleted. Returns the rows moved."""

        def write() -> int:
            with self._conn:
                cur = self._conn.execute(
                    "UPDATE kv SET owner = ? WHERE owner = ?", (f"{owner}{REMOVED}{stamp}", owner)
                )
                return cur.rowcount

        return await self._run(write, writes=True)

    async def set_aside_missing(self, known: Callable[[str], bool], stamp: str) -> list[str]:
        """`set_aside` the rows of every owner ``known`` no longer knows (a removal the shell did
        not live to finish); returns those owners."""

        def read() -> list[str]:
            rows = self._conn.execute("SELECT DISTINCT owner FROM kv").fetchall()
            return [r[0] for r in rows]

        gone = [
            o for o in await self._run(read) if o != PLATFORM and REMOVED not in o and not known(o)
        ]
        for owner in gone:
            await self.set_aside(owner, stamp)
        return gone

    async def owners(self, namespace: str, key: str) -> list[str]:
        """The users who have a row ``namespace``/``key`` (a user's choice over a default)."""

        def read() -> list[str]:
            rows = self._conn.execute(
                "SELECT owner FROM kv WHERE namespace = ? AND key = ? AND owner != ? "
                "ORDER BY owner",
                (namespace, key, PLATFORM),
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(read)

    async def set(
        self, namespace: str, key: str, value: Any, *, owner: str | None = None
    ) -> KvEntry:
        """Store ``value`` (validated, JSON-encodable, at most 1 MiB) in one transaction as
        ``owner``'s row (None: the bootstrap admin's; ignored in `GLOBAL`)."""
        who = self._owner(namespace, owner)
        validator = self._validators.get((namespace, key))
        if validator is not None:
            value = validator(value, who)
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
        if len(encoded.encode()) > MAX_VALUE_BYTES:
            raise ValueError(f"a KV value is at most {MAX_VALUE_BYTES} bytes of JSON")
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

        def write() -> None:
            with self._conn:
                self._conn.execute(
                    "INSERT INTO kv (owner, namespace, key, value, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (owner, namespace, key) DO UPDATE SET value = excluded.value, "
                    "updated_at = excluded.updated_at",
                    (who, namespace, key, encoded, now),
                )

        await self._run(write, writes=True)
        self._bus.emit(KvChanged(namespace, key, owner=who or None))
        return KvEntry(json.loads(encoded), now)

    async def delete(self, namespace: str, key: str, *, owner: str | None = None) -> bool:
        who = self._owner(namespace, owner)

        def write() -> bool:
            with self._conn:
                cur = self._conn.execute(
                    "DELETE FROM kv WHERE owner = ? AND namespace = ? AND key = ?",
                    (who, namespace, key),
                )
                return cur.rowcount > 0

        deleted = await self._run(write, writes=True)
        if deleted:
            self._bus.emit(KvChanged(namespace, key, owner=who or None))
        return deleted


def _connect(path: Path, user: str) -> sqlite3.Connection:
    """Connect, check the file (``PRAGMA quick_check``), make sure the table exists and migrate
    a table made before rows had owners (its rows become ``user``'s)."""
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
        _migrate(conn, user)
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


def _columns(conn: sqlite3.Connection) -> list[str]:
    names = (row[1] for row in conn.execute("PRAGMA table_info(kv)").fetchall())
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


def _migrate(conn: sqlite3.Connection, user: str) -> None:
    """Give the rows of a table made before rows had owners to ``user``, in one transaction: the
    new table is filled, the old one dropped and the new one renamed, or nothing happens (a kill
    or a full disk midway leaves the old table as it was, and the next start migrates again)."""
    if "owner" in _columns(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_TABLE.format(name="kv_owned"))
        conn.execute(
            "INSERT INTO kv_owned (owner, namespace, key, value, updated_at) "
            "SELECT ?, namespace, key, value, updated_at FROM kv",
            (user,),
        )
        conn.execute("DROP TABLE kv")
        conn.execute("ALTER TABLE kv_owned RENAME TO kv")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite already rolled back after some errors (a full disk)
            conn.execute("ROLLBACK")
        raise
    _LOGGER.info("KV store: rows made before users now belong to %r", user)


def salvage(path: Path, stamp: str, user: str) -> tuple[int, Path]:
    """Rebuild a damaged store from the rows that can still be read (for `atrium doctor
    --repair`, with no shell running): the original moves aside, with its -wal and -shm, to
    ``<name>.damaged-<stamp>``, and a fresh file holds every readable row. Returns the number of
    rows kept and where the original went. Rows are read by walking the key order forwards and
    then backwards, so one damaged page loses only the rows on it; a row whose text is not UTF-8 or
    whose value is not JSON is left out (the store never wrote such a row). A file made before
    rows had owners gives its rows to ``user`` (the bootstrap admin), as opening it would."""
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(aside.with_name(aside.name + suffix))
    rows = _readable_rows(aside, user)
    create_private(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO kv (owner, namespace, key, value, updated_at) VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return len(rows), aside


Row = tuple[str, str, str, str, str]


def _readable_rows(path: Path, user: str) -> list[Row]:
    found: dict[tuple[str, str, str], Row] = {}
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error:
        return []
    conn.text_factory = bytes
    try:
        try:
            owned = "owner" in _columns(conn)
        except sqlite3.Error:
            owned = True  # an unreadable schema yields no rows either way
        for order in ("ASC", "DESC"):
            query = (
                # fixed words only: the owner column or the bootstrap admin as a parameter
                f"SELECT {'owner' if owned else '?'}, namespace, key, value, updated_at "  # noqa: S608
                f"FROM kv ORDER BY {'owner ' + order + ', ' if owned else ''}"
                f"namespace {order}, key {order}"
            )
            try:
                for raw in conn.execute(query, () if owned else (user,)):
                    row = _row(raw)
                    if row is not None:
                        found.setdefault((row[0], row[1], row[2]), row)
            except sqlite3.Error:
                continue
    finally:
        conn.close()
    return sorted(found.values())


def _row(raw: tuple[Any, ...]) -> Row | None:
    try:
        owner, namespace, key, value, updated = (
            field.decode() if isinstance(field, bytes) else str(field) for field in raw
        )
        json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    return owner, namespace, key, value, updated
