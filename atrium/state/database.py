"""The async engine over ``ATRIUM_DATABASE_URL``: SQLite by default, PostgreSQL for several shells.

- SQLite (``sqlite+aiosqlite:///<home>/state.sqlite3``): the file is created 0600, WAL,
  ``synchronous=FULL``, a 5 s busy timeout; a write transaction starts with ``BEGIN IMMEDIATE``,
  so writers queue for the lock at their first statement instead of failing when a read
  transaction tries to become a write one.
- PostgreSQL (``postgresql+psycopg://…``): client TCP keepalives (2 s idle, 1 s apart, 2 probes),
  so a shell cut off from the database learns it within about 5 s. Each session also sets the
  server's end the same way (``options``: ``tcp_keepalives_*``, whatever the server's own
  configuration says) and both ends a 4 s ``tcp_user_timeout``: keepalives are sent only on a
  socket with nothing unacknowledged, so a session the server had just answered (a transaction
  holding the event counter's row lock, a LISTEN session sent a notification) outlived a cut
  link for the kernel's retransmissions (about 15 minutes), and every other shell's event
  writes waited behind that row lock as long. With it the server ends the session, and drops
  its locks, about 4 s after the link is cut.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

from sqlalchemy import event, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from atrium.errors import DatabaseLost
from atrium.settings import ConfigError, create_private
from atrium.state import fence

#: the file of the embedded default, in the shell's home
SQLITE_FILE: Final = "state.sqlite3"
#: milliseconds data sent on a session's socket may stay unacknowledged before the socket is
#: given up, on either side: keepalives start only on a socket with nothing unacknowledged
TCP_USER_TIMEOUT: Final = 4000
#: libpq's client keepalives (seconds, probes) and the same settings for the server's end of
#: each session (``options``): see the module docstring
KEEPALIVES: Final[dict[str, int | str]] = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": TCP_USER_TIMEOUT,
    "options": (
        "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2"
        f" -c tcp_user_timeout={TCP_USER_TIMEOUT}"
    ),
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
        #: when this shell last found its link to the database broken (monotonic), or None
        self.link_lost_at: float | None = None

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
        if db.dialect == "postgresql":

            @event.listens_for(engine.sync_engine, "handle_error")
            def _disconnected(context: Any) -> None:
                if context.is_disconnect:
                    db.link_lost()

        try:
            yield db
        finally:
            if db._ping is not None:
                db._ping.cancel()  # a ping left running by callers that stopped waiting
            await engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed when the block ends, rolled back when it raises.

        DatabaseLost, before anything is written, when the current task answers a request that
        arrived before this shell last lost its database link (`fence`)."""
        async with self.engine.connect() as conn:
            lost = self.link_lost_at
            if lost is not None and fence.began_before(lost):
                raise DatabaseLost(
                    "this request arrived before the link broke, and its client may have moved "
                    "on; nothing was written, send it again"
                )
            await conn.execution_options(**{_IMMEDIATE: True})
            async with conn.begin():
                yield conn

    def lost_since(self, moment: float) -> bool:
        """Whether this shell found its database link broken at or after ``moment`` (monotonic):
        nothing done on behalf of what happened at ``moment`` is written then (`fence`)."""
        return self.link_lost_at is not None and self.link_lost_at >= moment

    def link_lost(self) -> None:
        """Note that the link to the database was found broken now (a disconnect, or the
        coordination's check of its session failed)."""
        self.link_lost_at = time.monotonic()

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
