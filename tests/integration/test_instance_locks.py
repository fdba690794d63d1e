"""Locks between shells on one PostgreSQL, through the real shell: a move waits for the instance
lock another shell holds (an advisory lock on the instance id's key), and only the leader fills
the warm pool, which a shell does once it takes the lead. The other shell is a plain session
holding the same advisory keys. A shell cut off from the database (through a relay the test
cuts) does not act, and does what it put off once the link is back."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from atrium.events import DataChanged
from atrium.state.locks import LEADER_KEY, instance_key
from atrium.state.migrate import upgrade_now
from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, StartShell, wait_for
from tests.integration.test_wake import APP, provider
from tests.postgres import new_database
from tests.relay import Relay

pytestmark = pytest.mark.integration


@pytest.fixture
def pg_url(postgres_server: str) -> str:
    url = new_database(postgres_server)
    upgrade_now(url)
    return url


def conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def sessions_on(url: str, key: int) -> list[tuple[bool, str]]:
    """(granted, application_name) of every session holding or awaiting advisory ``key``."""
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT l.granted, a.application_name FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
            "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchall()
    return [(bool(granted), str(name)) for granted, name in rows]


def with_apps(system_apps: Path, *names: str) -> None:
    for name in names:
        shutil.copytree(TESTS_DIR / "apps" / name, system_apps / name)


@pytest.fixture
def other_shell(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A session standing for another shell on the same database."""
    with psycopg.connect(conninfo(pg_url), autocommit=True) as conn:
        yield conn


def test_a_move_waits_for_the_instance_lock_another_shell_holds(
    start_shell: StartShell,
    system_apps: Path,
    pg_url: str,
    other_shell: psycopg.Connection[Any],
) -> None:
    with_apps(system_apps, "test.plain.stdlib")
    shell: RunningShell = start_shell(database_url=pg_url)
    with shell.client(timeout=30) as api:
        created = api.post("/api/instances", json={"appId": "test.plain.stdlib"})
        assert created.status_code == 200, created.text
        iid = created.json()["instanceId"]
        assert created.json()["state"] == "started"
        key = instance_key(iid)
        assert sessions_on(pg_url, key) == []  # held only while a move runs
        other_shell.execute("SELECT pg_advisory_lock(%s)", (key,))
        answers: list[httpx.Response] = []

        def stop() -> None:
            with shell.client(timeout=30) as own:
                answers.append(own.post(f"/api/instances/{iid}/stop"))

        stopping = threading.Thread(target=stop)
        stopping.start()
        # the shell's lock session queues behind the other shell's, and nothing moves meanwhile
        wait_for(
            lambda: any(not granted for granted, _ in sessions_on(pg_url, key)),
            "the shell waiting for the instance lock",
        )
        assert api.get(f"/api/instances/{iid}").json()["state"] == "started"
        assert not answers
        other_shell.execute("SELECT pg_advisory_unlock(%s)", (key,))
        stopping.join(30)
        assert answers[0].status_code == 200, answers[0].text
        assert api.get(f"/api/instances/{iid}").json()["state"] == "stopped"
        wait_for(lambda: sessions_on(pg_url, key) == [], "the lock released after the move")


def test_only_the_leader_fills_the_warm_pool_and_a_new_leader_does(
    start_shell: StartShell,
    system_apps: Path,
    pg_url: str,
    other_shell: psycopg.Connection[Any],
) -> None:
    with_apps(system_apps, "test.sdk.echo")
    other_shell.execute("SELECT pg_advisory_lock(%s)", (LEADER_KEY,))  # the other shell leads
    shell: RunningShell = start_shell(database_url=pg_url)
    with shell.client(timeout=30) as api:

        def pooled() -> list[dict[str, Any]]:
            return [i for i in api.get("/api/instances").json() if i["pooled"]]

        assert pooled() == []
        assert not shell.shell.coordination.is_leader
        other_shell.execute("SELECT pg_advisory_unlock(%s)", (LEADER_KEY,))  # the leader is gone
        wait_for(lambda: shell.shell.coordination.is_leader, "the shell taking the lead")
        wait_for(lambda: [i for i in pooled() if i["state"] == "resumed"], "the pool filled")
        leaders = [name for granted, name in sessions_on(pg_url, LEADER_KEY) if granted]
        assert len(leaders) == 1
        assert leaders[0].startswith("atrium lock ")


def test_a_cut_off_shell_puts_off_an_idle_stop_and_makes_it_once_back(
    start_shell: StartShell, system_apps: Path, pg_url: str
) -> None:
    provider(system_apps, APP, "wakeplain", idleTimeoutMs=2000)
    target = httpx.URL(pg_url.replace("postgresql+psycopg://", "http://"))
    relay = Relay((str(target.host), int(target.port or 5432)))
    shell: RunningShell = start_shell(
        database_url=pg_url.replace(f":{target.port}/", f":{relay.port}/")
    )
    coordination = shell.shell.coordination
    with shell.client(timeout=30) as api:
        assert api.get("/api/data/wakeplain/items").status_code == 200
        iid = f"{APP}-provider"
        woken = shell.shell.lifecycle.headless.record(iid)
        assert woken is not None
        relay.cut()
        wait_for(lambda: coordination.lost is not None, "the shell counting itself cut off")
        # past the idle time while cut off: nothing moves (no hook, no state change)
        deadline = woken.last_used + woken.idle_timeout + 0.5
        wait_for(lambda: time.monotonic() > deadline, "the idle time to pass")
        [still] = [i for i in api.get("/api/instances").json() if i["instanceId"] == iid]
        assert still["state"] == "resumed"
        relay.mend()
        wait_for(lambda: coordination.lost is None, "the link back")
        wait_for(
            lambda: all(i["instanceId"] != iid for i in api.get("/api/instances").json()),
            "the idle stop made once the link is back",
        )


def test_a_launch_refused_while_cut_off_leaves_no_instance_behind(
    start_shell: StartShell, system_apps: Path, pg_url: str
) -> None:
    with_apps(system_apps, "test.plain.stdlib")
    target = httpx.URL(pg_url.replace("postgresql+psycopg://", "http://"))
    relay = Relay((str(target.host), int(target.port or 5432)))
    shell: RunningShell = start_shell(
        database_url=pg_url.replace(f":{target.port}/", f":{relay.port}/")
    )
    coordination = shell.shell.coordination
    with shell.client(timeout=30) as api:
        relay.cut()
        wait_for(lambda: coordination.lost is not None, "the shell counting itself cut off")
        refused = api.post("/api/instances", json={"appId": "test.plain.stdlib"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_lost"
        assert api.get("/api/instances").json() == []
        relay.mend()
        wait_for(lambda: coordination.lost is None, "the link back")
        launched = api.post("/api/instances", json={"appId": "test.plain.stdlib"})
        assert launched.status_code == 200, launched.text
        assert launched.json()["state"] == "started"


def test_a_cut_off_shell_writes_no_event_it_emitted_before_the_link_came_back(
    start_shell: StartShell, pg_url: str
) -> None:
    target = httpx.URL(pg_url.replace("postgresql+psycopg://", "http://"))
    relay = Relay((str(target.host), int(target.port or 5432)))
    shell: RunningShell = start_shell(
        database_url=pg_url.replace(f":{target.port}/", f":{relay.port}/")
    )
    coordination = shell.shell.coordination
    db = shell.shell.db

    async def emit(path: str) -> float:
        shell.shell.bus.emit(DataChanged("fence", path))
        return time.monotonic()

    def paths() -> list[str]:
        with psycopg.connect(conninfo(pg_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT data->>'path' FROM events WHERE topic = 'data:changed' ORDER BY id"
            ).fetchall()
        return [str(path) for (path,) in rows]

    # a stream open on the shell through the cut: it misses what is given up, so it is ended
    # (its client resumes from the table and reads its lists again)
    ended = threading.Event()

    def stream() -> None:
        try:
            with (
                shell.client(timeout=httpx.Timeout(5, read=60)) as client,
                client.stream("GET", "/api/events", params={"topics": "data:changed"}) as answer,
            ):
                for _ in answer.iter_lines():
                    pass
        except httpx.ReadTimeout:
            return  # still open, silent
        except httpx.HTTPError:
            pass  # cut by the shell
        ended.set()

    threading.Thread(target=stream, daemon=True).start()
    wait_for(lambda: shell.shell.bus.subscriber_count == 1, "the stream open")

    relay.cut()
    wait_for(lambda: coordination.lost is not None, "the shell counting itself cut off")
    emitted_at = shell.on_loop(emit("/while-cut"))
    # the shell notes the loss again at each failed check while the link stays cut
    wait_for(lambda: (db.link_lost_at or 0) > emitted_at, "a loss noted after the emit")
    relay.mend()
    wait_for(lambda: coordination.lost is None, "the link back")
    shell.on_loop(emit("/after"))
    wait_for(lambda: "/after" in paths(), "the event emitted after the link came back")
    assert paths() == ["/after"]
    wait_for(ended.is_set, "the stream ended")


def test_only_the_leader_prunes_the_audit_log_and_a_new_leader_does(
    start_shell: StartShell, pg_url: str, other_shell: psycopg.Connection[Any]
) -> None:
    # a record older than any retention, written by some shell long ago
    other_shell.execute(
        "INSERT INTO audit (time, actor, action, target, outcome, status, address, count)"
        " VALUES ('2000-01-01T00:00:00.000Z', 'admin', 'kv.write', 'os/x', 'ok', 200, '', 1)"
    )

    def old_records() -> int:
        row = other_shell.execute("SELECT count(*) FROM audit WHERE time < '2001'").fetchone()
        return int(row[0]) if row else 0

    other_shell.execute("SELECT pg_advisory_lock(%s)", (LEADER_KEY,))  # the other shell leads
    shell: RunningShell = start_shell(database_url=pg_url)
    assert not shell.shell.coordination.is_leader
    assert old_records() == 1  # its start did not prune: the leader does
    other_shell.execute("SELECT pg_advisory_unlock(%s)", (LEADER_KEY,))  # the leader is gone
    wait_for(lambda: shell.shell.coordination.is_leader, "the shell taking the lead")
    wait_for(lambda: old_records() == 0, "the new leader pruning the audit log")
