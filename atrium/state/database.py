"""The async engine over ``ATRIUM_DATABASE_URL``: SQLite by default, PostgreSQL for several shells.

- SQLite (``sqlite+aiosqlite:///<home>/state.sqlite3``): the file is created 0600, WAL,
  ``synchronous=FULL``, a 5 s busy timeout; a write transaction starts with ``BEGIN IMMEDIATE``,
  so writers queue for the lock at their first statement instead of failing when a read
  transaction tries to become a write one.
- PostgreSQL (``postgresql+psycopg://…``): client TCP keepalives (2 s idle, 1 s apart, 2 probes),
  so a shell cut off from the database learns it within about 5 s (with the server's own
  ``tcp_keepalives_*`` set the same way, its locks are dropped as soon).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from atrium.settings import ConfigError, create_private

#: the file of the embedded default, in the shell's home
SQLITE_FILE: Final = "state.sqlite3"
#: libpq's client keepalives (seconds, probes): see the module docstring
KEEPALIVES: Final = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
}
_IMMEDIATE: Final = "atrium_immediate"
#: seconds one `Database.ping` may take before it is given up (a connection attempt to a cut
#: link would otherwise wait for TCP's retries): the longest a shell stays "not ready" after its
#: database is back, when the ping under way was stuck on the cut
PING_LIMIT: Final = 5.0
Dialect = Literal["sqlite", "postgresql"]


def default_url(home: Path) -> str:
    return f"sqlite+aiosqlite:///{home / SQLITE_FILE}"


def parse_url(url: str) -> URL:
    """The URL if it names a database this shell can use, else a ConfigError naming it (its
    password hidden) and what is accepted."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            "ATRIUM_DATABASE_URL: not a database URL; accepted: sqlite+aiosqlite:///<file> "
            "or postgresql+psycopg://<user>@<host>/<database>"
        ) from None
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+psycopg"):
        raise ConfigError(
            f"ATRIUM_DATABASE_URL {redact(parsed)!r}: driver {parsed.drivername!r} is not "
            f"supported; accepted: sqlite+aiosqlite or postgresql+psycopg"
        )
    if parsed.drivername.startswith("sqlite") and not parsed.database:
        raise ConfigError("ATRIUM_DATABASE_URL: a SQLite URL names its file (no in-memory one)")
    return parsed


def redact(url: URL) -> str:
    """The URL as it may be printed: never its password."""
    return url.render_as_string(hide_password=True)


class Database:
    """One engine; `transaction` for writes, `connect` for reads."""

    def __init__(self, engine: AsyncEngine, url: URL) -> None:
        self.engine = engine
        self.url = url
        self._ping: asyncio.Task[str | None] | None = None

    @property
    def dialect(self) -> Dialect:
        return "postgresql" if self.url.get_backend_name() == "postgresql" else "sqlite"

    @property
    def name(self) -> str:
        """The URL as it may be printed."""
        return redact(self.url)

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str) -> AsyncIterator[Database]:
        """An engine over ``url`` (see `parse_url`); the SQLite file is created 0600 first. No
        connection is made until the first use."""
        parsed = parse_url(url)
        if parsed.get_backend_name() == "sqlite":
            engine = _sqlite_engine(parsed)
        else:
            engine = create_async_engine(parsed, connect_args=dict(KEEPALIVES), pool_pre_ping=True)
        db = cls(engine, parsed)
        try:
            yield db
        finally:
            if db._ping is not None:
                db._ping.cancel()  # a ping left running by callers that stopped waiting
            await engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed when the block ends, rolled back when it raises."""
        async with self.engine.connect() as conn:
            await conn.execution_options(**{_IMMEDIATE: True})
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (one snapshot on SQLite; each statement's on PostgreSQL)."""
        async with self.engine.connect() as conn, conn.begin():
            yield conn

    async def ping(self, seconds: float) -> str | None:
        """A ``SELECT 1`` answered within ``seconds``: None, else why not (for the log).

        Whoever asks while a ping is under way waits for that one, so any number of callers (a
        load balancer's checks, anyone's ``GET /api/ready``) costs one connection at a time. A
        caller stops waiting at its bound, but the ping is not cancelled then: psycopg answers a
        cancellation by asking the server to cancel, which on a cut link waits up to 10 s; the
        ping ends by itself (`PING_LIMIT`, or the client keepalives) and the next caller after
        that starts a new one."""
        if self._ping is None or self._ping.done():
            self._ping = asyncio.ensure_future(self._select_one())
        try:
            return await asyncio.wait_for(asyncio.shield(self._ping), seconds)
        except TimeoutError:
            return f"no answer within {seconds:g} s"

    async def _select_one(self) -> str | None:
        try:
            async with asyncio.timeout(PING_LIMIT), self.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except TimeoutError:
            return f"no answer within {PING_LIMIT:g} s"
        except (SQLAlchemyError, OSError) as err:
            cause = getattr(err, "orig", None) or err
            return (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        return None


def _sqlite_engine(url: URL) -> AsyncEngine:
    path = Path(str(url.database)).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        create_private(path)
    except OSError as err:
        raise ConfigError(f"the database {path} cannot be opened: {err.strerror or err}") from err
    engine = create_async_engine(url)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # the driver's own implicit BEGIN is off: `_on_begin` says which BEGIN
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        for pragma in (
            "busy_timeout=5000",
            "journal_mode=WAL",
            "synchronous=FULL",
            "foreign_keys=ON",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
