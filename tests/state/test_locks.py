"""Locks between shells (`atrium.state.locks`): two `Database` handles on one PostgreSQL stand
for two shells. The instance lock excludes the other shell; a session that ends (a dead shell:
``pg_terminate_backend``) frees its locks, and the shell that held them learns it and stops;
a shell whose link goes silent stops within 5 s; the leader moves. On SQLite the lock is the
in-process one of a single shell, as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import psycopg
import pytest
import sqlalchemy as sa

from atrium.errors import DatabaseLost
from atrium.settings import ConfigError
from atrium.state import locks
from atrium.state.database import Database
from atrium.state.locks import LEADER_KEY, Coordination, instance_key, lock_key
from tests.postgres import new_database

#: the promise: a shell cut off from the database stops acting within this many seconds
STOPS_WITHIN = 5.0


async def until(condition: Callable[[], bool], within: float = STOPS_WITHIN) -> float:
    """Poll ``condition`` until true; the seconds it took (fails after ``within``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > within:
            pytest.fail(f"not within {within} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def holders(url: str, key: int) -> list[tuple[int, bool, str]]:
    """(pid, granted, application_name) of the sessions holding or awaiting advisory ``key``."""
    hi, lo = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        return [
            (int(pid), bool(granted), str(name))
            for pid, granted, name in conn.execute(
                "SELECT l.pid, l.granted, a.application_name FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid "
                "AND l.objsubid = 1 AND l.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (hi, lo),
            )
        ]


def terminate(url: str, shell: str) -> int:
    """End every lock session of the shell named ``shell``, as its death would; how many."""
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"atrium lock {shell}",),
        ).fetchall()
    return len(rows)


def leads(coordination: Coordination) -> bool:
    return coordination.is_leader


@pytest.fixture
def pg_url(postgres_server: str) -> str:
    return new_database(postgres_server)


@asynccontextmanager
async def shell(url: str, name: str, *, start: bool = True) -> AsyncIterator[Coordination]:
    """One shell's coordination over its own Database handle."""
    async with AsyncExitStack() as stack:
        db = await stack.enter_async_context(Database.open(url))
        coordination = await stack.enter_async_context(Coordination.open(db, name))
        if start:
            await coordination.start()
        yield coordination


def test_keys_are_stable_signed_64_bit_and_apart_per_kind() -> None:
    # the same on every shell and start (Python's hash() of a str is salted per process)
    assert instance_key("com.example.notes-1") == lock_key("instance", "com.example.notes-1")
    assert instance_key("com.example.notes-1") == 5685030045854198485
    assert instance_key("com.example.notes-1") != lock_key("scope", "com.example.notes-1")
    assert all(-(2**63) <= k < 2**63 for k in (LEADER_KEY, instance_key("x")))


async def test_sqlite_the_lock_is_in_process_and_the_one_shell_leads(tmp_path: object) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.sqlite3"
    async with shell(url, "a") as a:
        assert not a.shared
        assert leads(a)
        assert a.lost is None
        lock = a.instance("com.example.notes-1")
        order: list[str] = []

        async def second() -> None:
            async with lock:
                order.append("second")

        async with lock:
            task = asyncio.create_task(second())
            await asyncio.sleep(0)
            assert lock.locked()
            assert not task.done()
            async with lock.transaction() as tx:  # the database's own write transaction
                await tx.execute(sa.text("CREATE TABLE fence (n INTEGER)"))
            order.append("first")
        await task
        assert order == ["first", "second"]


async def test_the_instance_lock_excludes_another_shell_until_released(pg_url: str) -> None:
    key = instance_key("com.example.notes-1")
    async with shell(pg_url, "a") as a, shell(pg_url, "b") as b:
        lock_a, lock_b = a.instance("com.example.notes-1"), b.instance("com.example.notes-1")
        await lock_a.__aenter__()
        waiting = asyncio.create_task(lock_b.__aenter__())
        # b's session waits in the server behind a's
        await until(lambda: len(holders(pg_url, key)) == 2)
        assert sorted((g, n) for _, g, n in holders(pg_url, key)) == [
            (False, "atrium lock b"),
            (True, "atrium lock a"),
        ]
        assert not waiting.done()
        await lock_a.__aexit__(None, None, None)
        await asyncio.wait_for(waiting, STOPS_WITHIN)
        assert [(g, n) for _, g, n in holders(pg_url, key)] == [(True, "atrium lock b")]
        await lock_b.__aexit__(None, None, None)
        assert holders(pg_url, key) == []


async def test_a_dead_shell_frees_its_lock_and_learns_it_stops_writing(pg_url: str) -> None:
    with psycopg.connect(conninfo(pg_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE fence (shell text)")
    async with shell(pg_url, "a") as a, shell(pg_url, "b") as b:
        lock_a = a.instance("com.example.notes-1")
        await lock_a.__aenter__()
        async with lock_a.transaction() as tx:
            await tx.execute(sa.text("INSERT INTO fence VALUES ('a, holding')"))
        assert terminate(pg_url, "a") >= 2  # its beacon and its instance lock
        async with b.instance("com.example.notes-1") as lock_b:
            async with lock_b.transaction() as tx:
                await tx.execute(sa.text("INSERT INTO fence VALUES ('b')"))

            def refused() -> bool:
                try:
                    lock_a.check()
                except DatabaseLost:
                    return True
                return False

            await until(refused)
            with pytest.raises(DatabaseLost):
                async with lock_a.transaction() as tx:
                    await tx.execute(sa.text("INSERT INTO fence VALUES ('a, after')"))
        await lock_a.__aexit__(None, None, None)
    with psycopg.connect(conninfo(pg_url)) as conn:
        rows = [r[0] for r in conn.execute("SELECT shell FROM fence")]
    assert rows == ["a, holding", "b"]


async def test_the_leader_moves_when_its_session_ends(pg_url: str) -> None:
    seen: list[str] = []
    async with shell(pg_url, "a") as a:
        assert a.shared
        assert leads(a)
        async with shell(pg_url, "b", start=False) as b:
            b.on_lead(lambda: seen.append("b leads"), lambda: seen.append("b stops"))
            a.on_lead(lambda: seen.append("a leads"), lambda: seen.append("a stops"))
            await b.start()
            assert not leads(b)
            assert [n for _, g, n in holders(pg_url, LEADER_KEY) if g] == ["atrium lock a"]
            terminate(pg_url, "a")
            await until(lambda: b.is_leader)
            assert seen == ["a stops", "b leads"]
            # a reconnects as a follower: b keeps leading
            await until(lambda: a.lost is None)
            assert not leads(a)
            assert leads(b)
        # b's close ended its session: a takes over
        await until(lambda: a.is_leader)
        assert seen == ["a stops", "b leads", "b stops", "a leads"]


class Link:
    """A TCP relay between a shell and the server that can go silent, as a cut cable does: the
    shell's side gets no answer and no reset; the server's side is closed, as the server's
    keepalives end it."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._upstream: list[asyncio.StreamWriter] = []
        self._downstream: list[asyncio.StreamWriter] = []
        self.cut = False
        self.port = 0

    async def __aenter__(self) -> Link:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._upstream + self._downstream:
            writer.close()

    def sever(self) -> None:
        self.cut = True
        for writer in self._upstream:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._downstream.append(writer)
        if self.cut:
            return  # a new connection hangs, unanswered
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._upstream.append(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while chunk := await src.read(65536):
                if self.cut:
                    return
                dst.write(chunk)
                await dst.drain()

        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )


async def test_a_shell_whose_link_goes_silent_stops_within_5_s(pg_url: str) -> None:
    url = sa.make_url(pg_url)
    async with Link(str(url.host), int(url.port or 5432)) as link:
        relayed = url.set(host="127.0.0.1", port=link.port).render_as_string(hide_password=False)
        async with shell(relayed, "a") as a, shell(pg_url, "b") as b:
            assert leads(a)
            assert not leads(b)
            lock_a = a.instance("com.example.notes-1")
            await lock_a.__aenter__()
            link.sever()
            took = await until(lambda: not a.is_leader and a.lost is not None)
            with pytest.raises(DatabaseLost):
                lock_a.check()
            with pytest.raises(DatabaseLost):  # no new move is even queued
                async with a.instance("com.example.notes-2"):
                    pass
            await until(lambda: b.is_leader)
            async with b.instance("com.example.notes-1"):
                pass
            await lock_a.__aexit__(None, None, None)
    assert took < STOPS_WITHIN


async def test_a_shells_own_lock_says_it_lives_and_is_taken_back_before_it_acts_again(
    pg_url: str,
) -> None:
    """The shell lock (`hold_shell`) tells the others a shell lives; back after a loss, a
    shell holds it again, ending a session of its own that still held it (a short cut the
    server had not noticed yet), and runs its regain callbacks, before it counts as back."""
    regained: list[bool] = []
    async with shell(pg_url, "a", start=False) as a, shell(pg_url, "b") as b:
        a.hold_shell("home-a")
        await a.start()
        assert await b.shells_alive({"home-a", "home-b"}) == {"home-a"}

        async def back() -> None:
            regained.append(a.lost is not None)  # still lost while the callbacks run

        a.on_regain(back)
        key = lock_key("shell", "home-a")
        terminate(pg_url, "a")
        # a session of a's run that holds a's name, as its last beacon's would if the server
        # had not ended it yet
        with psycopg.connect(
            conninfo(pg_url), autocommit=True, application_name=a.session_name
        ) as lingering:
            lingering.execute("SELECT pg_advisory_lock(%s)", (key,))
            await until(lambda: a.lost is not None)
            await until(lambda: a.lost is None)
            assert regained == [True]
            assert [g for _, g, n in holders(pg_url, key)] == [True]
            with pytest.raises(psycopg.OperationalError):
                lingering.execute("SELECT 1")
        assert await b.shells_alive({"home-a"}) == {"home-a"}


async def test_a_shell_back_ends_only_its_own_runs_session_holding_its_name(
    pg_url: str,
) -> None:
    """Back after a loss, a shell ended every session holding its shell lock, as its own last
    one (the server had not ended it yet). A second shell of the same host name and home that
    started while the first was cut off holds it too, and had its session ended: both then ran
    on, each taking the lock from the other. Only a session of this run (its
    ``application_name``) is ended now; held by another, the shell stays cut off and asks
    again. The default name carries a per-start id: two containers of one host name both run
    as pid 1."""
    async with shell(pg_url, "a", start=False) as a:
        a.hold_shell("home-a")
        await a.start()
        terminate(pg_url, "a")
        async with shell(pg_url, "a-again", start=False) as again:
            again.hold_shell("home-a")  # the same host name and home: its lock is free now
            await again.start()
            await until(lambda: a.lost is not None)
            await until(lambda: a._told_foreign)  # a is back, found the name held, asked again
            key = lock_key("shell", "home-a")
            assert [(g, n) for _, g, n in holders(pg_url, key)] == [(True, "atrium lock a-again")]
            assert again.lost is None
            assert a.lost is not None
        # the other gone, a holds its name again and is back
        await until(lambda: a.lost is None)
        assert [(g, n) for _, g, n in holders(pg_url, key)] == [(True, "atrium lock a")]
    db_names = set()
    for _ in range(2):
        async with AsyncExitStack() as stack:
            db = await stack.enter_async_context(Database.open(pg_url))
            coordination = await stack.enter_async_context(Coordination.open(db))
            db_names.add(coordination.session_name)
    assert len(db_names) == 2
    assert all(name.startswith("atrium lock ") and len(name) <= 63 for name in db_names)


async def test_a_shell_of_another_database_on_the_server_is_no_shell_of_this_one(
    postgres_server: str,
) -> None:
    """Advisory locks are per database, but `pg_locks` lists every database's. A shell of the
    same name (host name and home) holding its lock in another database on the same server
    (another deployment, or a test's) counted as alive here: its instances were never taken
    over. (A shell back after a loss reads `pg_locks` the same way, now filtered alike; its
    session names are unique per run, so that query could not end another database's.)"""
    here, there = new_database(postgres_server), new_database(postgres_server)
    async with shell(there, "a", start=False) as elsewhere, shell(here, "b") as b:
        elsewhere.hold_shell("home-a")
        await elsewhere.start()
        assert await b.shells_alive({"home-a"}) == set()
        assert [n for _, g, n in holders(here, lock_key("shell", "home-a")) if g] == []
        async with shell(here, "a-here", start=False) as a:
            a.hold_shell("home-a")  # the same name in this database: free
            await a.start()
            assert await b.shells_alive({"home-a"}) == {"home-a"}
        assert elsewhere.lost is None


async def test_a_host_name_beyond_ascii_names_the_sessions_as_the_server_keeps_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL rewrites each byte of an ``application_name`` outside printable ASCII: a
    shell on a host named so looked for its own run's sessions under a name none had, and a
    shell back after a loss waited on its last session's keepalives instead of ending it."""
    monkeypatch.setattr("socket.gethostname", lambda: "hôte-ß")
    async with AsyncExitStack() as stack:
        db = await stack.enter_async_context(Database.open(pg_url))
        coordination = await stack.enter_async_context(Coordination.open(db))
        coordination.hold_shell("home-a")
        await coordination.start()
        names = {n for _, g, n in holders(pg_url, lock_key("shell", "home-a")) if g}
        assert names == {coordination.session_name}, names


async def test_a_shell_starts_only_once_it_holds_its_shell_lock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell that started while its shell lock was still held (its last run's session, cut
    off and not yet ended by the server) went on to adopt its pods without it: the lock freed a
    moment later, the leader saw the shell dead and took over the pods it had just adopted (two
    holders of one pod). `start` returns only once the lock is held, and a shell whose name a
    living shell holds past `SHELL_WAIT` (two shells of one host name and home) does not start."""
    key = lock_key("shell", "home-a")
    monkeypatch.setattr(locks, "SHELL_WAIT", 1.0)
    with psycopg.connect(conninfo(pg_url), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (key,))
        async with shell(pg_url, "a", start=False) as a:
            a.hold_shell("home-a")
            with pytest.raises(ConfigError, match="home-a"):
                await a.start()
    # its last run's session ends while it waits: it starts, holding its lock
    with psycopg.connect(conninfo(pg_url), autocommit=True) as lingering:
        lingering.execute("SELECT pg_advisory_lock(%s)", (key,))
        async with shell(pg_url, "a", start=False) as a:
            a.hold_shell("home-a")
            started = asyncio.ensure_future(a.start())
            await until(
                lambda: any(n == "atrium lock a" for _, _, n in holders(pg_url, LEADER_KEY))
            )
            assert not started.done()
            lingering.execute("SELECT pg_advisory_unlock(%s)", (key,))
            await started
            assert [(g, n) for _, g, n in holders(pg_url, key)] == [(True, "atrium lock a")]
