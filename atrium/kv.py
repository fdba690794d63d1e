"""The key-value store on the state database (`atrium.state`); every change publishes `kv:changed`.

Namespaces are ``os`` and ``app/<appId>``, one set per user: every row has an ``owner`` (a user id),
and ``global`` holds the platform's defaults under no user (stored with the owner `PLATFORM`).
Values are JSON. Validators registered for a key (the theme selection, for one) run before the
write and may refuse it.

Each write is one transaction of the state database that writes the row and appends its
``kv:changed`` event (`atrium.state.events.append`): the event exists if and only if the row
committed, and its id is the one every replica's streams carry. On SQLite the database runs with
``synchronous=FULL``, so a write that was answered survives a killed process; on PostgreSQL a
commit is durable when answered.

A home made by an older shell keeps its rows in ``kv.sqlite3``: opening the store moves them into
the state database once (`MOVED_OWNER` marks the move in the same transaction, so a kill midway
neither loses a row nor copies twice) and renames the file aside to ``kv.sqlite3.moved-<stamp>``.
A file made before rows had owners gives its rows to the bootstrap admin.

Storage errors become error codes naming what failed (decisions.md "Storage"): on SQLite, damaged
pages `storage_damaged` (and no further KV write is made into that file), a full disk
`storage_full` (the transaction is rolled back, nothing answered is lost), any other I/O failure
`storage_failed`; on PostgreSQL a lost connection is `storage_failed`, naming the database.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from atrium.bus import EventBus
from atrium.errors import StorageDamaged, StorageFailed, StorageFull
from atrium.events import KvChanged
from atrium.settings import ConfigError, create_private

if TYPE_CHECKING:  # SQLAlchemy loads when a shell opens, not for `atrium --help`
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import AsyncConnection

    from atrium.state.database import Database
    from atrium.state.events import StoredEvent

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
#: PostgreSQL's SQLSTATE for a full disk
_PG_DISK_FULL: Final = "53100"

#: the namespace of platform defaults: one copy, no user's
GLOBAL: Final = "global"
#: the owner stored with `GLOBAL` rows (no user id is empty)
PLATFORM: Final = ""
#: what marks the rows of a removed user (no user id has it): ``<id>#removed-<stamp>``
REMOVED: Final = "#removed-"
#: the owner of the row that records a moved ``kv.sqlite3`` (namespace `MOVED_NAMESPACE`, key
#: the sha256 of its rows, value its path and row count): no user id has a ``#``, and no API
#: namespace starts with one
MOVED_OWNER: Final = "#atrium"
MOVED_NAMESPACE: Final = "#moved"
#: how many rows one statement of the move inserts
_MOVE_BATCH: Final = 5000

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
    """A KV file failed its integrity check at start-up: `atrium serve` stops with one line."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(damaged_message(path, detail))
        self.path = path


def damaged_message(path: Path | str, detail: str) -> str:
    """One line: SQLite's own report may span several (``*** in database main ***`` then the
    page), and `atrium serve` says a start-up error in one line."""
    detail = " ".join(detail.split())
    return (
        f"the KV store {path} is damaged ({detail}); stop the shell and run `atrium doctor "
        f"--repair` (it rebuilds the file from the rows still readable and keeps the original), "
        f"or restore the file from a backup (`sqlite3 {path} .recover` saves what is readable)"
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class KvStore:
    """Async facade over the state database's ``kv`` table."""

    def __init__(self, db: Database, bus: EventBus, user: str) -> None:
        self._db = db
        #: whose rows a call without ``owner`` means: the bootstrap admin (the one-user world)
        self._user = user
        self._bus = bus
        #: what errors name: the SQLite file, or the PostgreSQL URL without its password
        self._where = sqlite_file(db) or db.name
        #: set once a damaged page was met: from then on nothing more is written into the file
        self._damage: str | None = None
        self._validators: dict[tuple[str, str], Validator] = {}

    @classmethod
    @asynccontextmanager
    async def open(
        cls, db: Database, *, bus: EventBus, user: str, moved_from: Path | None = None
    ) -> AsyncIterator[KvStore]:
        """The store over ``db`` (migrated to this shell's schema). On SQLite the file is checked
        first (``PRAGMA quick_check``: KvDamaged for a damaged one). ``moved_from`` is an older
        shell's ``kv.sqlite3``: its rows move into ``db`` (see the module docstring). ``user`` (the
        bootstrap admin) is the owner calls without one mean."""
        store = cls(db, bus, user)
        path = sqlite_file(db)
        if path is not None:
            await asyncio.to_thread(_tighten, Path(path))
            await store._check(Path(path))
        if moved_from is not None:
            try:
                await store._move(moved_from)
            except StorageFailed as err:  # nothing moved: the next start moves it again
                raise ConfigError(
                    f"the KV store {moved_from} cannot be moved into {store._where}: {err}"
                ) from err
        yield store

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

    async def _check(self, path: Path) -> None:
        import sqlalchemy as sa
        from sqlalchemy.exc import DBAPIError

        try:
            async with self._db.connect() as conn:
                problems = [str(r[0]) for r in await conn.execute(sa.text("PRAGMA quick_check(3)"))]
        except DBAPIError as err:
            code = (getattr(err.orig, "sqlite_errorcode", None) or 0) & 0xFF
            if code in _DAMAGED:
                raise KvDamaged(path, str(err.orig)) from err
            raise ConfigError(f"the KV store {path} cannot be opened: {err.orig}") from err
        if problems != ["ok"]:
            raise KvDamaged(path, "quick_check: " + "; ".join(problems))

    async def _read(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``fn`` in a read transaction; storage errors become StorageFailed ones."""
        return await self._guard(fn, writes=False)

    async def _write(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``fn`` in one write transaction, committed when this returns."""
        return await self._guard(fn, writes=True)

    async def _guard(self, fn: Callable[[AsyncConnection], Awaitable[T]], *, writes: bool) -> T:
        from sqlalchemy.exc import DBAPIError

        if writes and self._damage is not None:
            raise StorageDamaged(damaged_message(self._where, self._damage), path=self._where)
        try:
            if writes:
                async with self._db.transaction() as tx:
                    return await fn(tx)
            async with self._db.connect() as conn:
                return await fn(conn)
        except DBAPIError as err:
            mapped = self._storage_error(err)
            if mapped is None:
                raise
            raise mapped from err

    def _storage_error(self, err: DBAPIError) -> StorageFailed | None:
        from sqlalchemy.exc import OperationalError

        where = self._where
        if self._db.dialect == "postgresql":
            state = getattr(err.orig, "sqlstate", None)
            if state == _PG_DISK_FULL:
                return StorageFull(
                    f"the disk of the database {where} is full; nothing was written: free space "
                    f"there and try again",
                    path=where,
                )
            # a lost or refused connection, a server shutting down, a database closed to
            # connections (a transaction rollback, class 40, would be this shell's bug)
            lost = isinstance(err, OperationalError) and not (state or "").startswith("40")
            if err.connection_invalidated or lost:
                return StorageFailed(
                    f"the KV store lost its database {where}: {err.orig}", path=where
                )
            return None
        orig = err.orig
        code = (getattr(orig, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _DAMAGED or str(orig).startswith(_NOT_UTF8):
            return self._damaged(str(orig))
        if code == sqlite3.SQLITE_FULL:
            return StorageFull(
                f"the disk holding the KV store {where} is full; nothing was written: "
                f"free space there and try again",
                path=where,
            )
        if code in _FAILED:
            return StorageFailed(f"the KV store {where} failed: {orig}", path=where)
        return None

    def _damaged(self, detail: str) -> StorageDamaged:
        if self._damage is None:
            _LOGGER.error("%s", damaged_message(self._where, detail))
        if self._db.dialect == "sqlite":
            self._damage = detail
        return StorageDamaged(damaged_message(self._where, detail), path=self._where)

    def _decode(self, text: str) -> Any:
        """A stored value is JSON the store wrote; anything else is damage, never served."""
        try:
            return json.loads(text)
        except ValueError:
            raise self._damaged("a stored value is not the JSON that was written") from None

    def _owner(self, namespace: str, owner: str | None) -> str:
        """The stored owner of a row: `PLATFORM` in `GLOBAL`, else ``owner`` or the bootstrap
        admin."""
        if namespace == GLOBAL:
            return PLATFORM
        return self._user if owner is None else owner

    def _announce(self, stored: StoredEvent, payload: KvChanged) -> None:
        """Tell the bus about an event that committed (its listeners, this replica's streams)."""
        self._bus.committed([(stored, payload)])

    async def get(self, namespace: str, key: str, *, owner: str | None = None) -> KvEntry | None:
        """``owner``'s row (None: the bootstrap admin's; ignored in `GLOBAL`)."""
        import sqlalchemy as sa

        from atrium.state.schema import kv

        who = self._owner(namespace, owner)
        query = sa.select(kv.c.value, kv.c.updated_at).where(
            kv.c.owner == who, kv.c.namespace == namespace, kv.c.key == key
        )

        async def read(conn: AsyncConnection) -> tuple[str, str] | None:
            row = (await conn.execute(query)).first()
            return None if row is None else (row[0], row[1])

        found = await self._read(read)
        return None if found is None else KvEntry(self._decode(found[0]), found[1])

    async def keys(self, namespace: str, *, owner: str | None = None) -> list[str]:
        import sqlalchemy as sa

        from atrium.state.schema import kv

        who = self._owner(namespace, owner)
        query = (
            sa.select(kv.c.key)
            .where(kv.c.owner == who, kv.c.namespace == namespace)
            .order_by(kv.c.key)
        )

        async def read(conn: AsyncConnection) -> list[str]:
            return [r[0] for r in await conn.execute(query)]

        return await self._read(read)

    async def set_aside(self, owner: str, stamp: str) -> int:
        """Move every row of a removed user out of reach, in one transaction: the rows stay in
        the database under the owner ``<owner>#removed-<stamp>`` (no user id has a ``#``), so a
        new user given the same id starts empty and nothing is deleted. Returns the rows moved."""
        import sqlalchemy as sa

        from atrium.state.schema import kv

        statement = (
            sa.update(kv).where(kv.c.owner == owner).values(owner=f"{owner}{REMOVED}{stamp}")
        )

        async def write(tx: AsyncConnection) -> int:
            return (await tx.execute(statement)).rowcount

        return await self._write(write)

    async def set_aside_missing(self, known: Callable[[str], bool], stamp: str) -> list[str]:
        """`set_aside` the rows of every owner ``known`` no longer knows (a removal the shell did
        not live to finish); returns those owners."""
        import sqlalchemy as sa

        from atrium.state.schema import kv

        async def read(conn: AsyncConnection) -> list[str]:
            return [r[0] for r in await conn.execute(sa.select(kv.c.owner).distinct())]

        gone = [
            o
            for o in await self._read(read)
            if o not in (PLATFORM, MOVED_OWNER) and REMOVED not in o and not known(o)
        ]
        for owner in gone:
            await self.set_aside(owner, stamp)
        return gone

    async def owners(self, namespace: str, key: str) -> list[str]:
        """The users who have a row ``namespace``/``key`` (a user's choice over a default)."""
        import sqlalchemy as sa

        from atrium.state.schema import kv

        query = (
            sa.select(kv.c.owner)
            .where(kv.c.namespace == namespace, kv.c.key == key, kv.c.owner != PLATFORM)
            .order_by(kv.c.owner)
        )

        async def read(conn: AsyncConnection) -> list[str]:
            return [r[0] for r in await conn.execute(query)]

        return await self._read(read)

    async def set(
        self, namespace: str, key: str, value: Any, *, owner: str | None = None
    ) -> KvEntry:
        """Store ``value`` (validated, JSON-encodable, at most 1 MiB) as ``owner``'s row (None:
        the bootstrap admin's; ignored in `GLOBAL`), in one transaction with its event."""
        from atrium.state.events import append

        who = self._owner(namespace, owner)
        validator = self._validators.get((namespace, key))
        if validator is not None:
            value = validator(value, who)
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
        if len(encoded.encode()) > MAX_VALUE_BYTES:
            raise ValueError(f"a KV value is at most {MAX_VALUE_BYTES} bytes of JSON")
        now = _now()
        payload = KvChanged(namespace, key, owner=who or None)
        statement = self._upsert()
        row = _params((who, namespace, key, encoded, now))

        async def write(tx: AsyncConnection) -> StoredEvent:
            await tx.execute(statement, row)
            return await append(tx, payload.TOPIC, payload.owner, payload.wire())

        stored = await self._write(write)
        self._announce(stored, payload)
        return KvEntry(json.loads(encoded), now)

    async def delete(self, namespace: str, key: str, *, owner: str | None = None) -> bool:
        import sqlalchemy as sa

        from atrium.state.events import append
        from atrium.state.schema import kv

        who = self._owner(namespace, owner)
        payload = KvChanged(namespace, key, owner=who or None)
        statement = sa.delete(kv).where(
            kv.c.owner == who, kv.c.namespace == namespace, kv.c.key == key
        )

        async def write(tx: AsyncConnection) -> StoredEvent | None:
            if (await tx.execute(statement)).rowcount == 0:
                return None
            return await append(tx, payload.TOPIC, payload.owner, payload.wire())

        stored = await self._write(write)
        if stored is None:
            return False
        self._announce(stored, payload)
        return True

    def _upsert(self, *, newer_only: bool = False) -> Any:
        """An INSERT of a row (parameters owner, namespace, key, value, updated_at; one or many)
        that overwrites a row with the same key (``newer_only``: only an older one), in the
        database's own dialect."""
        from sqlalchemy.dialects import postgresql, sqlite

        from atrium.state.schema import kv

        insert = (postgresql.insert if self._db.dialect == "postgresql" else sqlite.insert)(kv)
        return insert.on_conflict_do_update(
            index_elements=[kv.c.owner, kv.c.namespace, kv.c.key],
            set_={"value": insert.excluded.value, "updated_at": insert.excluded.updated_at},
            where=(kv.c.updated_at < insert.excluded.updated_at) if newer_only else None,
        )

    async def _move(self, path: Path) -> None:
        """Move an older shell's ``kv.sqlite3`` into the database (module docstring): its rows
        and the `MOVED_OWNER` row in one transaction, then the file renamed aside. A file whose
        move committed before a kill is only renamed; a row the database already holds with a
        newer ``updated_at`` (another shell's) is kept."""
        import sqlalchemy as sa

        from atrium.state.schema import kv

        rows = await asyncio.to_thread(_legacy_rows, path, self._user)
        if rows is None:
            return
        # the file's rows name it, not its path: another home's file at the same path on another
        # machine (one shared database) is another file, and moves too
        digest = hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()
        mark = (MOVED_OWNER, MOVED_NAMESPACE, digest)
        done = sa.select(kv.c.key).where(
            kv.c.owner == mark[0], kv.c.namespace == mark[1], kv.c.key == mark[2]
        )

        async def write(tx: AsyncConnection) -> bool:
            if (await tx.execute(done)).first() is not None:
                return False
            upsert = self._upsert(newer_only=True)
            for start in range(0, len(rows), _MOVE_BATCH):
                await tx.execute(upsert, [_params(r) for r in rows[start : start + _MOVE_BATCH]])
            moved = json.dumps({"file": str(path), "rows": len(rows)})
            await tx.execute(self._upsert(), _params((*mark, moved, _now())))
            return True

        copied = await self._write(write)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = await asyncio.to_thread(_rename_aside, path, f"moved-{stamp}")
        if copied:
            _LOGGER.info("KV store: %d rows of %s moved into %s", len(rows), aside, self._where)


def _params(row: Row) -> dict[str, str]:
    owner, namespace, key, value, updated_at = row
    return {
        "owner": owner,
        "namespace": namespace,
        "key": key,
        "value": value,
        "updated_at": updated_at,
    }


def sqlite_file(db: Database) -> str | None:
    """The file of a SQLite database (None on PostgreSQL)."""
    if db.dialect != "sqlite":
        return None
    return str(Path(str(db.url.database)).expanduser())


def _tighten(path: Path) -> None:
    """Make a SQLite file and its -wal and -shm owner-only (an older shell left them readable
    by others)."""
    for tail in ("", "-wal", "-shm"):
        sibling = path.with_name(path.name + tail)
        try:
            if sibling.is_file():
                sibling.chmod(0o600)
        except OSError as err:
            raise ConfigError(f"the KV store {path} cannot be opened: {err.strerror}") from err


def _rename_aside(path: Path, suffix: str) -> Path:
    """Rename ``path`` with its -wal and -shm to ``<name>.<suffix>``, owner-only: the main file
    last, so a kill midway leaves it where the next start finds it again."""
    aside = path.with_name(f"{path.name}.{suffix}")
    taken = count(1)
    while any(aside.with_name(aside.name + t).exists() for t in ("", "-wal", "-shm")):
        aside = path.with_name(f"{path.name}.{suffix}-{next(taken)}")  # never over a kept file
    for tail in ("-wal", "-shm", ""):
        source = path.with_name(path.name + tail)
        if source.exists():
            source.chmod(0o600)
            source.rename(aside.with_name(aside.name + tail))
    return aside


def _legacy_rows(path: Path, user: str) -> list[Row] | None:
    """Every row of an older shell's file (rows made before owners are ``user``'s; None: no
    file), after its check: KvDamaged for a damaged file (`atrium doctor --repair` rebuilds it,
    then it moves)."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(path, isolation_level=None)
    except sqlite3.Error as err:
        raise ConfigError(f"the KV store {path} cannot be opened: {err}") from err
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            raise KvDamaged(path, "quick_check: " + "; ".join(problems))
        owned = "owner" in _columns(conn)
        query = (
            # fixed words only: the owner column or the bootstrap admin as a parameter
            f"SELECT {'owner' if owned else '?'}, namespace, key, value, updated_at FROM kv"  # noqa: S608
        )
        try:
            found = conn.execute(query, () if owned else (user,)).fetchall()
        except sqlite3.OperationalError as err:
            if "no such table" not in str(err):
                raise
            found = []
        return [(str(a), str(b), str(c), str(d), str(e)) for a, b, c, d, e in found]
    except sqlite3.DatabaseError as err:
        code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _DAMAGED or str(err).startswith(_NOT_UTF8):
            raise KvDamaged(path, str(err)) from err
        raise ConfigError(f"the KV store {path} cannot be read: {err}") from err
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection) -> list[str]:
    names = (row[1] for row in conn.execute("PRAGMA table_info(kv)").fetchall())
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


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


def salvage_state(path: Path, stamp: str) -> tuple[int, Path]:
    """Rebuild a damaged SQLite state database (for `atrium doctor --repair`, with no shell
    running) from what can still be read: the original moves aside, with its -wal and -shm, to
    ``<name>.damaged-<stamp>``; every table is made again from the file's own ``CREATE``
    statement and refilled with the rows readable walking its primary key forwards and then
    backwards, so one damaged page loses only the rows on it. A KV row whose text is not UTF-8 or
    whose value is not JSON is left out (the store never wrote such a row), and the event counter
    is never behind the newest event kept (ids stay increasing). Returns the rows kept and where
    the original went."""
    aside = _rename_aside(path, f"damaged-{stamp}")
    create_private(path)
    source = sqlite3.connect(aside, isolation_level=None)
    source.text_factory = bytes
    target = sqlite3.connect(path, isolation_level=None)
    kept = 0
    try:
        try:
            schema = [
                (str(kind.decode()), str(name.decode()), str(sql.decode()))
                for kind, name, sql in source.execute(
                    "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY type = 'index'"
                )
            ]
        except (sqlite3.Error, UnicodeDecodeError):
            schema = []  # nothing readable: the next start makes the tables afresh
        target.execute("PRAGMA journal_mode=WAL")
        target.execute("PRAGMA synchronous=FULL")
        target.execute("BEGIN")
        tables = []
        for kind, name, sql in schema:
            target.execute(sql)
            if kind == "table":
                tables.append(name)
        for name in tables:
            rows = _readable_table(source, name)
            if rows:
                marks = ", ".join("?" * len(rows[0]))
                target.executemany(f"INSERT OR IGNORE INTO {_q(name)} VALUES ({marks})", rows)  # noqa: S608
            kept += len(rows)
        if {"event_counter", "events"} <= set(tables):
            target.execute(
                "INSERT OR REPLACE INTO event_counter (id, value) VALUES (1, max("
                "coalesce((SELECT value FROM event_counter WHERE id = 1), 0), "
                "coalesce((SELECT max(id) FROM events), 0)))"
            )
        target.execute("COMMIT")
        target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        source.close()
        target.close()
    return kept, aside


def _readable_table(conn: sqlite3.Connection, name: str) -> list[tuple[Any, ...]]:
    """The rows of ``name`` that can be read, whole columns in the table's order."""
    try:
        info = conn.execute(f"PRAGMA table_info({_q(name)})").fetchall()
    except sqlite3.Error:
        return []
    columns = [(row[1].decode(), (row[2] or b"").decode().upper(), int(row[5])) for row in info]
    keys = [c for c, _, pk in sorted(columns, key=lambda c: c[2]) if pk] or ["rowid"]
    found: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    listed = ", ".join(_q(c) for c, _, _ in columns)
    #: a KV row's value must be the JSON the store wrote
    value = [c for c, _, _ in columns].index("value") if name == "kv" else None
    for order in ("ASC", "DESC"):
        ordered = ", ".join(f"{_q(k)} {order}" if k != "rowid" else f"rowid {order}" for k in keys)
        rowid = ", rowid" if keys == ["rowid"] else ""
        query = f"SELECT {listed}{rowid} FROM {_q(name)} ORDER BY {ordered}"  # noqa: S608
        try:
            for raw in conn.execute(query):
                row = _decoded(raw[: len(columns)], [t for _, t, _ in columns])
                if row is None or (value is not None and not _json(row[value])):
                    continue
                key = raw[len(columns) :] or tuple(row[i] for i, c in enumerate(columns) if c[2])
                found.setdefault(tuple(key), row)
        except sqlite3.Error:
            continue
    return list(found.values())


def _q(name: str) -> str:
    """``name`` quoted as an SQL identifier (names come from the damaged file itself)."""
    return '"' + name.replace('"', '""') + '"'


def _decoded(raw: tuple[Any, ...], types: list[str]) -> tuple[Any, ...] | None:
    try:
        return tuple(
            field.decode() if isinstance(field, bytes) and "BLOB" not in kind else field
            for field, kind in zip(raw, types, strict=True)
        )
    except UnicodeDecodeError:
        return None


def _json(text: Any) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True
