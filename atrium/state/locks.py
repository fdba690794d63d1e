"""Coordination between shells that share one state database: a lock per instance, a leader for
the jobs that must run once, and what a shell cut off from the database does.

- PostgreSQL: advisory locks, keyed by `lock_key` (a 64-bit BLAKE2b of a name: the same on every
  shell and every start, unlike Python's salted ``hash``; 2^64 keys make a collision between
  instance ids negligible; the ``atrium:<kind>:`` prefix keeps kinds apart). An instance lock is
  a session lock (``pg_advisory_lock``) on a connection of its own, held for the whole action
  (hooks and boots take seconds, longer than a transaction should stay open), and the writes made
  under it go through that same connection (`InstanceLock.transaction`): when the session ends
  the lock is gone and so is the only way to write under it. The leader lock
  (``pg_try_advisory_lock`` of `LEADER_KEY`) is held by one shell's beacon connection; every
  other shell asks again each second, so one takes over within about a second of the leader's
  session ending.
- A shell cut off from the database stops acting within 5 s: the beacon and every held instance
  lock send ``SELECT 1`` each `PING_EVERY` s and count a reply later than `PING_TIMEOUT` s as
  the session gone (the client keepalives of `database.KEEPALIVES` end a silent socket in about
  4 s as well); then the shell is no longer leader and every instance move is refused
  (`DatabaseLost`). The server ends the cut-off session (and so frees its locks) after its own
  ``tcp_keepalives_*`` (2 s idle, 1 s apart, 2 probes: about 4 s after the last packet), so the
  shell that was cut off has stopped before another can take its locks.
- SQLite: one shell holds the home, so the in-process lock is the whole lock and the shell
  always leads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from atrium.errors import Busy, DatabaseLost

if TYPE_CHECKING:  # SQLAlchemy loads when a shell opens its database
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from atrium.state.database import Database

_LOGGER = logging.getLogger(__name__)
#: seconds between two liveness checks of a lock's session
PING_EVERY: Final = 1.0
#: a check not answered within this many seconds counts as the session gone
PING_TIMEOUT: Final = 1.5
#: seconds between two attempts at the leader lock (and at reconnecting after a loss)
LEADER_RETRY: Final = 1.0
#: seconds a starting shell waits for its shell lock: its last run's session, cut off, holds it
#: until the server ends it (its keepalives: about 5 s); held longer, a living shell has its name
SHELL_WAIT: Final = 15.0
#: seconds a shell reconnected after a loss of its own (or just started) counts no other shell
#: dead (`settled`): what ended its session may have ended every shell's (a restart of the
#: server), and the living ones take their shell locks again within a second or two of it
SETTLE: Final = 5.0


def lock_key(kind: str, name: str) -> int:
    """The advisory-lock key of ``name`` among locks of ``kind``: a signed 64-bit integer
    (PostgreSQL's ``bigint``), stable across shells, starts and Python versions."""
    digest = hashlib.blake2b(f"atrium:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


LEADER_KEY: Final = lock_key("leader", "shell")


def instance_key(instance_id: str) -> int:
    return lock_key("instance", instance_id)


async def _scalar(conn: AsyncConnection, sql: str, **params: Any) -> Any:
    """One statement in its own transaction; TimeoutError when it is not answered within
    `PING_TIMEOUT` s. The statement is not cancelled then but left to fail on its own: psycopg
    answers a cancellation by asking the server to cancel it over a new connection, which on a
    cut link blocks for up to 10 s more, beyond the 5 s promised."""
    from sqlalchemy import text

    async def run() -> Any:
        value = (await conn.execute(text(sql), params)).scalar_one()
        await conn.commit()
        return value

    task = asyncio.ensure_future(run())
    try:
        done, _ = await asyncio.wait({task}, timeout=PING_TIMEOUT)
    finally:
        if not task.done():
            _ABANDONED[task] = conn
            task.add_done_callback(_forget)
    if not done:
        raise TimeoutError(f"the database did not answer within {PING_TIMEOUT} s")
    return task.result()


#: statements given up on, and their connections, kept until they end (a cut link's socket
#: errors after the client keepalives); their connections are closed only then, since closing
#: one under a waiting statement leaves its descriptor in the event loop for the next socket
#: that gets the same number
_ABANDONED: dict[asyncio.Future[Any], AsyncConnection] = {}
_CLOSING: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any]) -> None:
    _ABANDONED.pop(task, None)
    if not task.cancelled():
        task.exception()


async def _discard(conn: AsyncConnection) -> None:
    """Close a connection whose session is gone or unknown, never back into the pool (a session
    that may still hold a lock must end, and its socket with it); once its abandoned
    statement, if any, has ended."""
    pending = next((t for t, c in _ABANDONED.items() if c is conn and not t.done()), None)
    if pending is not None:
        pending.add_done_callback(lambda _: _discard_later(conn))
        return
    with suppress(Exception):
        async with asyncio.timeout(PING_TIMEOUT):
            await conn.invalidate()
    with suppress(Exception):
        async with asyncio.timeout(PING_TIMEOUT):
            await conn.close()


def _discard_later(conn: AsyncConnection) -> None:
    with suppress(RuntimeError):  # the loop is closing: the socket goes with it
        task = asyncio.ensure_future(_discard(conn))
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


async def _unlock(conn: AsyncConnection, key: int) -> None:
    """Free the session lock ``key`` held on ``conn`` and give the connection back to the pool;
    a connection that does not answer is discarded instead (its session ends, and the lock with
    it): a pooled connection must never hold a lock."""
    try:
        if await _scalar(conn, "SELECT pg_advisory_unlock(:k)", k=key):
            await conn.close()
            return
    except (Exception, asyncio.CancelledError) as err:  # noqa: BLE001 - discarded below
        _LOGGER.info("unlocking %d failed (%s): its session is ended instead", key, err)
    await _discard(conn)


def _printable(text: str) -> str:
    """``text`` with each character outside printable ASCII as ``?``: PostgreSQL rewrites such
    bytes of an ``application_name``, and a shell would then look for its own sessions under a
    name none has."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


class Coordination:
    """One shell's part in the coordination: its instance locks, whether it leads, whether it
    still reaches the database. See the module docstring."""

    def __init__(self, db: Database | None = None, engine: AsyncEngine | None = None) -> None:
        """``db``: the state database (None: one shell, nothing shared, as in unit tests);
        ``engine``: the lock sessions' own (PostgreSQL; see `open`)."""
        self._db = db
        self._engine = engine
        self.shared = engine is not None
        #: whether this shell runs the once-only jobs; always on SQLite
        self.is_leader = not self.shared
        self._lost: str | None = None
        self._on_lead: list[Callable[[], None]] = []
        self._on_unlead: list[Callable[[], None]] = []
        self._on_regain: list[Callable[[], Awaitable[None]]] = []
        self._beacon: AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None
        #: the key of this shell's own lock, held by the beacon's session while it lives
        self._shell_key: int | None = None
        self._shell_name = ""
        self._shell_held = False
        self._held = asyncio.Event()
        #: when the beacon last connected (at start, or back after a loss; monotonic)
        self._connected_at: float | None = None
        #: the ``application_name`` of this run's lock sessions (`open`)
        self.session_name = ""
        #: whether a session not of this run was said to hold this shell's name
        self._told_foreign = False

    @classmethod
    @asynccontextmanager
    async def open(cls, db: Database, name: str | None = None) -> AsyncIterator[Coordination]:
        """The coordination over ``db``; `start` begins leading or waiting to lead.

        On PostgreSQL the lock sessions come from an engine of their own: each held instance
        lock keeps a connection for its action, which must neither starve the stores' pool nor
        wait behind it. ``name`` (default ``<host>:<pid>:<run>``, ``<run>`` random for each
        start) is their ``application_name`` after ``atrium lock``, so ``pg_stat_activity``
        and ``pg_locks`` tell which shell holds what, and a shell back after a loss ends only
        its own run's sessions (`_regain`): two containers of one host name both run as pid 1."""
        engine = None
        session_name = ""
        if db.dialect == "postgresql":
            from sqlalchemy.ext.asyncio import create_async_engine

            from atrium.state.database import KEEPALIVES

            if name is None:
                tail = f":{os.getpid()}:{secrets.token_hex(4)}"
                # a long host name is cut, never the run (63 bytes: PostgreSQL's limit)
                name = _printable(socket.gethostname())[: 63 - len("atrium lock ") - len(tail)]
                name += tail
            session_name = _printable(f"atrium lock {name}")[:63]
            engine = create_async_engine(
                db.url,
                connect_args={**KEEPALIVES, "application_name": session_name},
                pool_size=4,
                max_overflow=-1,
            )
        coordination = cls(db, engine)
        coordination.session_name = session_name
        try:
            yield coordination
        finally:
            await coordination.close()
            if engine is not None:
                await engine.dispose()

    @property
    def lost(self) -> str | None:
        """Why this shell counts itself cut off from the database, or None."""
        return self._lost

    def instance(self, instance_id: str) -> InstanceLock:
        """A new lock for the instance ``instance_id`` (one per instance object)."""
        return InstanceLock(instance_key(instance_id), self)

    @asynccontextmanager
    async def operation(self, app_id: str, operation: str) -> AsyncIterator[None]:
        """Hold ``app_id``'s operation lock among the shells for the body: a session lock
        (``pg_try_advisory_lock``) on a connection of its own, never waited for. Busy naming
        the other shell's operation (from ``app_operations``, written by each holder) when
        another shell holds it; DatabaseLost when the database does not answer. Nothing
        without a shared database.

        The lock ends with its session: a shell that dies or is cut off mid-operation frees
        the app for the others' operations, and its own scope writes are refused by then (each
        is fenced on its scope's lock: `atrium.state.scopelocks`). A session ended under a
        shell that goes on (a dropped link, the server's ``idle_session_timeout``, an
        administrator) is noticed within `PING_EVERY` s and the lock taken again on a new one
        (`_OperationHold.keep`)."""
        engine = self._engine
        if engine is None:
            yield
            return
        self.check()
        hold = _OperationHold(engine, app_id, operation, self._shell_name)
        running = await hold.take()
        if running is not None:
            raise Busy(app_id, running[0] or "unknown", elsewhere=True)
        keeping = asyncio.ensure_future(hold.keep())
        try:
            yield
        finally:
            hold.over.set()
            try:
                await asyncio.wait({keeping})  # its statement at most, never cut mid-way
            finally:
                await hold.release()

    def on_lead(self, gained: Callable[[], None], lost: Callable[[], None] | None = None) -> None:
        """Call ``gained`` each time this shell becomes leader, ``lost`` each time it stops."""
        self._on_lead.append(gained)
        if lost is not None:
            self._on_unlead.append(lost)

    def hold_shell(self, name: str) -> None:
        """Hold ``name``'s shell lock on the beacon's session (from `start`, taken again after
        a reconnection): the other shells read whether this shell lives from it
        (`shells_alive`), since its instances are theirs to take over once it is gone."""
        self._shell_key = lock_key("shell", name)
        self._shell_name = name

    async def shells_alive(self, names: set[str]) -> set[str]:
        """Those of ``names`` whose shell lock is held (their shell's session lives)."""
        if not names or self._engine is None:
            return set(names)
        from sqlalchemy import text

        wanted = {name: lock_key("shell", name) for name in names}
        async with self._engine.connect() as conn:
            held = {
                (int(row[0]), int(row[1]))
                for row in await conn.execute(
                    text(
                        "SELECT classid::bigint, objid::bigint FROM pg_locks "
                        "WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                        # advisory locks are per database, but pg_locks lists every
                        # database's: a shell of one name in another database of the server
                        # (another deployment's) is no shell of this one
                        " AND database = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database())"
                    )
                )
            }
        return {
            name
            for name, key in wanted.items()
            if ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF) in held
        }

    @property
    def settled(self) -> bool:
        """Whether this shell has reached the database for `SETTLE` s since it started or last
        came back: only then may a free shell lock mean a dead shell (`shells_alive`). A
        restart of PostgreSQL ends every shell's session at once, and for a moment every
        shell lock is free; the first shell back would have taken every living shell's pods
        over. Every shell's session ended, this one's too: it is back no earlier than the
        server, and gives the others as long again to take their locks."""
        return (
            self._lost is None
            and self._connected_at is not None
            and time.monotonic() - self._connected_at >= SETTLE
        )

    def check(self) -> None:
        """DatabaseLost when this shell is cut off from the database."""
        if self._lost is not None:
            raise DatabaseLost(self._lost)

    async def start(self) -> None:
        """PostgreSQL: one attempt at the leader lock now (a lone shell leads from its start),
        then the beacon goes on in the background; with `hold_shell`, until the shell lock is
        held. Nothing on SQLite.

        A shell that went on without its shell lock (its last run's session still held it)
        adopted its pods while the others could see it dead a moment later, and take the same
        pods over. ConfigError when another session holds it past `SHELL_WAIT` s: a living shell
        of the same name (host name and home)."""
        if not self.shared or self._task is not None:
            return
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._beacon_loop(first), name="coordination beacon")
        await asyncio.shield(first)
        if self._shell_key is None or self._lost is not None:
            return  # cut off from its start: the lock is taken before it counts as back
        try:
            await asyncio.wait_for(self._held.wait(), SHELL_WAIT)
        except TimeoutError:
            from atrium.settings import ConfigError

            raise ConfigError(
                f"another shell holds this shell's name {self._shell_name!r} (its host name and "
                f"home) in the database for more than {SHELL_WAIT:.0f} s: each shell on one "
                "database needs its own host name or home"
            ) from None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        self._set_leader(False)
        beacon, self._beacon = self._beacon, None
        if beacon is not None:
            await _discard(beacon)

    def _set_leader(self, leading: bool) -> None:
        if leading == self.is_leader or not self.shared:
            return
        self.is_leader = leading
        _LOGGER.warning("this shell %s the leader", "is now" if leading else "is no longer")
        for callback in self._on_lead if leading else self._on_unlead:
            try:
                callback()
            except Exception:
                _LOGGER.exception("a leader callback failed")

    def on_regain(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await ``callback`` when this shell reaches the database again after a loss, before
        it acts again (it holds its shell lock by then: see `_regain`)."""
        self._on_regain.append(callback)

    async def _connect(self) -> AsyncConnection:
        engine = self._engine
        if engine is None:  # pragma: no cover - started only when shared
            raise RuntimeError("no lock engine")
        async with asyncio.timeout(PING_TIMEOUT * 2):
            self._beacon = beacon = await engine.connect()
        self._shell_held = False
        self._held.clear()
        if self._lost is not None:
            await self._regain(beacon)
        self._lost = None
        self._connected_at = time.monotonic()
        return beacon

    async def _regain(self, beacon: AsyncConnection) -> None:
        """Back after a loss: the shell lock first (while it was free, another shell may have
        taken this one's instances over, and must not start to while this one acts again),
        then the callbacks (the instances taken over are let go); `lost` stays set meanwhile,
        so nothing acts."""
        key = self._shell_key
        while key is not None and not self._shell_held:
            await self._hold_shell(beacon)
            if not self._shell_held:
                # held by this run's own last session, which the server has not ended yet (a
                # short cut): ended now rather than after its keepalives. Only a session of
                # this run (its application_name): another holder is a second shell of this
                # host name and home, started while this one was cut off, which is not ended
                # for it; this one stays cut off (`lost`) and asks again each turn
                ended = await _scalar(
                    beacon,
                    "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l"
                    " JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
                    " AND l.classid::bigint = :hi AND l.objid::bigint = :lo"
                    " AND l.pid <> pg_backend_pid() AND a.application_name = :name"
                    " AND l.database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())",
                    hi=(key >> 32) & 0xFFFFFFFF,
                    lo=key & 0xFFFFFFFF,
                    name=self.session_name,
                )
                if ended:
                    await asyncio.sleep(0.1)
                    continue
                if not self._told_foreign:
                    self._told_foreign = True
                    _LOGGER.error(
                        "another shell holds this shell's name %r (its host name and home) in "
                        "the database: this one stays cut off until it is gone",
                        self._shell_name,
                    )
                await asyncio.sleep(LEADER_RETRY)
        for callback in self._on_regain:
            await callback()

    async def _hold_shell(self, beacon: AsyncConnection) -> None:
        if self._shell_key is not None and not self._shell_held:
            # its last run's session may linger a moment: asked again each turn
            self._shell_held = bool(
                await _scalar(beacon, "SELECT pg_try_advisory_lock(:k)", k=self._shell_key)
            )
            if self._shell_held:
                self._held.set()

    async def _beacon_loop(self, first: asyncio.Future[None]) -> None:
        while True:
            try:
                self._beacon = await self._connect()
                while True:
                    await self._hold_shell(self._beacon)
                    if self.is_leader:
                        await _scalar(self._beacon, "SELECT 1")
                    elif await _scalar(
                        self._beacon, "SELECT pg_try_advisory_lock(:k)", k=LEADER_KEY
                    ):
                        self._set_leader(True)
                    if not first.done():
                        first.set_result(None)
                    await asyncio.sleep(PING_EVERY if self.is_leader else LEADER_RETRY)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - any failure: the session (or the way to it) is gone
                self._lost = f"the database did not answer: {type(err).__name__}: {err}"[:300]
                if self._db is not None:
                    self._db.link_lost()
                _LOGGER.warning("coordination: %s", self._lost)
                self._set_leader(False)
                beacon, self._beacon = self._beacon, None
                if beacon is not None:
                    await _discard(beacon)
                if not first.done():
                    first.set_result(None)
                await asyncio.sleep(LEADER_RETRY)


class _OperationHold:
    """One operation's hold of its app's lock among the shells (`Coordination.operation`): the
    session that holds it (``conn``, None while none does) and the operation's end (``over``)."""

    def __init__(self, engine: AsyncEngine, app_id: str, operation: str, shell: str) -> None:
        self._engine = engine
        self.app_id, self.operation, self.shell = app_id, operation, shell
        self.key = lock_key("operation", app_id)
        self.conn: AsyncConnection | None = None
        self.over = asyncio.Event()

    async def take(self) -> tuple[str, str] | None:
        """Take the lock on a new session (``conn``): None once held, else the operation
        holding it and its shell. DatabaseLost when the database does not answer."""
        conn: AsyncConnection | None = None
        try:
            async with asyncio.timeout(PING_TIMEOUT * 2):
                conn = await self._engine.connect()
            held = bool(await _scalar(conn, "SELECT pg_try_advisory_lock(:k)", k=self.key))
            if held:
                await _scalar(
                    conn,
                    "INSERT INTO app_operations (app_id, operation, shell) VALUES (:a, :o, :s)"
                    " ON CONFLICT (app_id) DO UPDATE SET operation = excluded.operation,"
                    " shell = excluded.shell RETURNING 1",
                    a=self.app_id,
                    o=self.operation,
                    s=self.shell,
                )
            else:
                running = await _scalar(
                    conn,
                    "SELECT coalesce(max(operation || chr(31) || shell), '') FROM app_operations"
                    " WHERE app_id = :a",
                    a=self.app_id,
                )
        except BaseException as err:
            if conn is not None:
                await _discard(conn)  # may hold the lock: its session ends with it
            if isinstance(err, Exception) and not isinstance(err, DatabaseLost):
                raise DatabaseLost(f"the operation lock could not be taken: {err}"[:300]) from err
            raise
        if held:
            self.conn = conn
            return None
        await conn.close()
        name, _, shell = str(running).partition("\x1f")
        return name, shell

    async def keep(self) -> None:
        """Ask the session each `PING_EVERY` s until ``over``; one that does not answer is
        discarded and the lock taken again on a new session. Another shell that took it
        meanwhile keeps it: this operation is logged as no longer exclusive, as it cannot be
        stopped half-way."""
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(PING_EVERY):
                    await self.over.wait()
                return
            conn = self.conn
            if conn is None:
                return
            try:
                await _scalar(conn, "SELECT 1")
                continue
            except TimeoutError:
                # slow is not gone: its answer is awaited (a session that is gone fails it, its
                # socket erroring after the keepalives); ending a live one would free the lock
                pending = next((t for t, c in _ABANDONED.items() if c is conn), None)
                if pending is not None:
                    await asyncio.wait({pending})
                if pending is None or pending.cancelled() or pending.exception() is None:
                    continue
                err: BaseException = pending.exception()  # type: ignore[assignment]
            except Exception as failed:  # noqa: BLE001 - any other failure: the session is gone
                err = failed
            _LOGGER.warning(
                "the %s of %s lost its lock's session (%s): taking it again",
                self.operation,
                self.app_id,
                err,
            )
            self.conn = None
            await _discard(conn)
            while not self.over.is_set():
                try:
                    running = await self.take()
                except DatabaseLost:
                    await asyncio.sleep(PING_EVERY)
                    continue
                if running == (self.operation, self.shell):
                    # its own last session, not yet ended by the server: asked again
                    await asyncio.sleep(PING_EVERY)
                    continue
                if running is not None:
                    _LOGGER.error(
                        "the %s of %s lost its lock, which another shell took (%s): the two "
                        "run at once",
                        self.operation,
                        self.app_id,
                        running[0] or "unknown",
                    )
                    return
                if self.over.is_set():  # the operation ended meanwhile
                    await self.release()
                    return
                break

    async def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await _unlock(conn, self.key)


class InstanceLock:
    """The lock of one instance: `async with` it around every move. In-process on SQLite (or
    without a database); an advisory session lock besides on PostgreSQL, whose connection the
    writes under it use (`transaction`) and a watchdog checks each `PING_EVERY` s. `check`
    raises DatabaseLost once that session (or the shell's link to the database) is gone."""

    def __init__(self, key: int = 0, coordination: Coordination | None = None) -> None:
        self.key = key
        self._coordination = coordination
        self._local = asyncio.Lock()
        self._conn: AsyncConnection | None = None
        #: the connection is used by one statement at a time (the watchdog and the holder's)
        self._use = asyncio.Lock()
        self._lost: str | None = None
        self._watch: asyncio.Task[None] | None = None

    def locked(self) -> bool:
        return self._local.locked()

    @property
    def held_on(self) -> AsyncConnection | None:
        """The connection whose session holds the advisory lock (None: in-process only)."""
        return self._conn

    def check(self) -> None:
        """Raise DatabaseLost when the lock's session, or this shell's link, is gone: nothing
        may be done on the instance then (another shell may hold its lock already)."""
        if self._lost is not None:
            raise DatabaseLost(self._lost)
        if self._coordination is not None:
            self._coordination.check()

    async def __aenter__(self) -> Self:
        coordination = self._coordination
        if coordination is not None:
            coordination.check()  # a cut-off shell does not even queue
        await self._local.acquire()
        if coordination is None or not coordination.shared:
            return self
        engine = coordination._engine
        self._lost = None
        conn: AsyncConnection | None = None
        try:
            if engine is None:  # pragma: no cover - shared means an engine
                raise RuntimeError("no lock engine")
            conn = await engine.connect()
            from sqlalchemy import text

            # the wait for another shell's hold is unbounded (a boot holds it for as long as it
            # takes); a cut link ends it through the client keepalives
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
            await conn.commit()
        except BaseException as err:
            if conn is not None:
                await _discard(conn)
            self._local.release()
            if isinstance(err, Exception) and not isinstance(err, DatabaseLost):
                raise DatabaseLost(f"the instance lock could not be taken: {err}"[:300]) from err
            raise
        self._conn = conn
        self._watch = asyncio.create_task(self._watchdog(conn), name=f"lock watch {self.key}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.cancel()
                with suppress(asyncio.CancelledError):
                    await watch
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._release(conn)
        finally:
            self._lost = None  # of this hold: the next one takes the lock anew
            self._local.release()

    async def _release(self, conn: AsyncConnection) -> None:
        if self._lost is not None:
            await _discard(conn)
            return
        async with self._use:
            await _unlock(conn, self.key)

    async def _watchdog(self, conn: AsyncConnection) -> None:
        while True:
            await asyncio.sleep(PING_EVERY)
            try:
                async with self._use:
                    await _scalar(conn, "SELECT 1")
            except Exception as err:  # noqa: BLE001 - any failure: the session is gone
                self._lost = f"the instance lock's database session ended: {err}"[:300]
                _LOGGER.warning("%s", self._lost)
                return

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction under the lock: on PostgreSQL on the connection that holds it
        (the caller holds the lock), so a shell that lost the lock cannot write either; on
        SQLite the database's own write transaction."""
        self.check()
        conn = self._conn
        coordination = self._coordination
        if conn is None:
            if coordination is None or coordination._db is None:
                raise RuntimeError("an instance lock without a database has nothing to write to")
            if coordination.shared:
                raise RuntimeError("the instance lock is not held")
            async with coordination._db.transaction() as tx:
                yield tx
            return
        from sqlalchemy.exc import DBAPIError

        async with self._use:
            try:
                async with conn.begin():
                    yield conn
            except DBAPIError as err:
                if err.connection_invalidated or conn.closed or conn.invalidated:
                    self._lost = f"the instance lock's database session ended: {err}"[:300]
                    raise DatabaseLost(self._lost) from err
                raise
