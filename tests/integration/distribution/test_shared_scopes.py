"""Two real shells sharing one scope folder (``ATRIUM_SCOPES_DIR``) and one PostgreSQL database:
one writer per scope among them, `scope:changed` for the other to read the scope again, and a
killed writer's journal recovered by the next writer."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atrium.distribution import operations
from atrium.distribution.operations import AppLocks
from atrium.scopes import Scope
from atrium.state.locks import lock_key
from atrium.state.migrate import upgrade_now
from tests.conftest import REPO_DIR
from tests.integration.conftest import RunningShell, SseReader, launch_shell, wait_for
from tests.integration.distribution.conftest import (
    MakeApp,
    install,
    installed_ok,
    operation_held,
    write_manifest,
)
from tests.integration.distribution.test_wake_during_operations import (
    BLOCKING,
    backup_held_in_its_stop,
    in_background,
)
from tests.postgres import new_database

pytestmark = pytest.mark.integration
DEADLINE = 60.0


class Shared:
    """The database and scope folder two shells share; shells are started on them at will."""

    def __init__(self, url: str, scopes: Path, root: Path, system_apps: Path) -> None:
        self.url, self.scopes, self.root, self.system_apps = url, scopes, root, system_apps
        self.running: list[RunningShell] = []

    def start(self, name: str, runner: str = "process") -> RunningShell:
        home = self.root / name
        home.mkdir(mode=0o700)
        shell = launch_shell(
            home,
            self.system_apps,
            database_url=self.url,
            scopes_dir=self.scopes,
            runner=runner,
            token=Served.TOKEN,  # the served shells' ATRIUM_TOKEN: one bootstrap token for all
        )
        self.running.append(shell)
        return shell

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=self.scopes / "global", check=True, capture_output=True, text=True
        ).stdout


@pytest.fixture
def shared(postgres_server: str, tmp_path: Path, system_apps: Path) -> Iterator[Shared]:
    url = new_database(postgres_server)
    upgrade_now(url)
    scopes = tmp_path / "shared-scopes"
    scopes.mkdir()
    each = Shared(url, scopes, tmp_path, system_apps)
    try:
        yield each
    finally:
        for shell in each.running:
            shell.stop()


def listed(api: httpx.Client, app_id: str) -> dict[str, Any] | None:
    return next((a for a in api.get("/api/apps").json() if a["id"] == app_id), None)


def test_an_install_on_one_shell_is_read_by_the_other_once_its_scope_changed_arrives(
    shared: Shared, make_app: MakeApp
) -> None:
    one, two = shared.start("one"), shared.start("two")
    source = make_app("com.example.shared")
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        heard = SseReader(on_two, {"topics": "scope:changed,app:*"})
        assert listed(on_two, "com.example.shared") is None
        installed_ok(on_one, f"local:{source}")
        wait_for(lambda: heard.of("scope:changed"), "scope:changed on the other shell")
        # read right after the event: two read the scope before its stream carried it
        copy = listed(on_two, "com.example.shared")
        assert copy is not None
        assert copy["scope"] == "global"
        assert copy["record"]["ref"] == f"local:{source}"
        assert heard.of("scope:changed")[0].data == {"type": "scope:changed", "scope": "global"}

        # a setting of the scope (its trust store), written on two, read on one
        policy = on_two.put("/api/scopes/global/trust", json={"policy": "warn", "keys": []})
        assert policy.status_code == 200, policy.text
        assert on_one.get("/api/scopes/global/trust").json()["policy"] == "warn"
        wait_for(lambda: len(heard.of("scope:changed")) == 2, "the trust store's scope:changed")
        # the install was announced to the stream once: by the shell that wrote it, never again
        # by the one that read it after (its event came before the trust store's)
        installs = [e for e in heard.of("app:installed") if e.data["appId"] == source.name]
        assert len(installs) == 1


def test_concurrent_installs_from_two_shells_all_land_in_one_clean_repository(
    shared: Shared, make_app: MakeApp
) -> None:
    one, two = shared.start("one"), shared.start("two")
    ids = [f"com.example.race{n}" for n in range(6)]
    sources = {app_id: make_app(app_id) for app_id in ids}
    answers: dict[str, httpx.Response] = {}

    def install_on(shell: RunningShell, app_ids: list[str]) -> None:
        with shell.client(timeout=DEADLINE) as api:
            for app_id in app_ids:
                answers[app_id] = install(api, f"local:{sources[app_id]}", autoApprove=True)

    threads = [
        threading.Thread(target=install_on, args=(one, ids[0::2])),
        threading.Thread(target=install_on, args=(two, ids[1::2])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * DEADLINE)
    for app_id in ids:
        assert answers[app_id].status_code == 200, answers[app_id].text
        assert answers[app_id].json()["ok"] is True, answers[app_id].text
    subjects = shared.git("log", "--format=%s").splitlines()
    assert sorted(s.split()[1] for s in subjects if s.startswith("install ")) == ids
    assert shared.git("status", "--porcelain") == ""
    subprocess.run(["git", "fsck", "--strict"], cwd=shared.scopes / "global", check=True)
    for shell in (one, two):
        with shell.client() as api:

            def every_app(api: httpx.Client = api) -> bool:
                return all(listed(api, i) for i in ids)

            # the other shell's last install reaches this one with its scope:changed
            wait_for(every_app, "every app listed on each shell")


class Served:
    """`atrium serve` as a child process (it kills itself at ``faultpoint``)."""

    TOKEN = "shared-scope-test-token-0123456789"

    def __init__(self, home: Path, shared: Shared, faultpoint: str) -> None:
        home.mkdir(mode=0o700)
        env = {
            **os.environ,
            "ATRIUM_HOME": str(home),
            "ATRIUM_SYSTEM_APPS": str(shared.system_apps),
            "ATRIUM_RUNNER": "process",
            "ATRIUM_TOKEN": self.TOKEN,
            "ATRIUM_DATABASE_URL": shared.url,
            "ATRIUM_SCOPES_DIR": str(shared.scopes),
            "ATRIUM_FAULTPOINT": faultpoint,
        }
        self.log = (home.parent / f"{home.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atrium", "serve", "--port", "0"],
            env=env,
            cwd=REPO_DIR,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        url_file = home / "run" / "url"
        deadline = time.monotonic() + DEADLINE
        while not url_file.exists() or not url_file.read_text().strip():
            assert self.proc.poll() is None, "serve exited before it was ready"
            assert time.monotonic() < deadline, "serve did not write its URL in time"
            time.sleep(0.02)
        self.url = url_file.read_text().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)
        self.log.close()


def test_a_writer_killed_mid_install_is_finished_by_the_next_writer_on_another_shell(
    shared: Shared, make_app: MakeApp, tmp_path: Path
) -> None:
    """The killed shell's app is in place, its record written, not committed: the other shell's
    next write in the scope finishes it under the lock before its own."""
    survivor = shared.start("survivor")
    killed_source, next_source = make_app("com.example.killed"), make_app("com.example.next")
    doomed = Served(tmp_path / "doomed", shared, "record")
    try:
        with (
            httpx.Client(
                base_url=doomed.url,
                headers={"Authorization": f"Bearer {Served.TOKEN}"},
                timeout=DEADLINE,
            ) as on_doomed,
            pytest.raises(httpx.TransportError),
        ):
            install(on_doomed, f"local:{killed_source}", autoApprove=True)
        assert doomed.proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        doomed.close()
    journal = shared.scopes / "global" / ".journal"
    assert list(journal.glob("*.json")), "the killed install left its journal"

    with survivor.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{next_source}")
        assert listed(api, "com.example.killed") is not None
        assert listed(api, "com.example.next") is not None
    subjects = shared.git("log", "--format=%s").splitlines()
    assert subjects[0].startswith("install com.example.next ")
    assert subjects[1].startswith("install com.example.killed ")
    assert list(journal.glob("*.json")) == []
    assert shared.git("status", "--porcelain") == ""
    subprocess.run(["git", "fsck", "--strict"], cwd=shared.scopes / "global", check=True)


def test_a_backup_made_on_one_shell_is_listed_and_restored_on_the_other(
    shared: Shared, make_app: MakeApp
) -> None:
    """The backups are beside the data they copy, in the shared folder: each shell's home kept
    its own, so a backup made through one shell was not listed (nor restorable) through another,
    though the data folder it copied is the same. What kills left there: a prune, which holds
    the app's lock among the shells, drops every snapshot of the app (it dropped only those
    nobody touched for an hour, and so another shell's that took longer); a starting shell,
    which holds none, finishes removals and leaves snapshots (it dropped hour-old ones)."""
    app = "com.example.keptshared"
    one, two = shared.start("one"), shared.start("two")
    source = make_app(app)
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        installed_ok(on_one, f"local:{source}")
        instance = f"{app}-1"  # the data folder an instance of it left
        notes = shared.scopes / "global/apps" / app / instance / "notes.txt"
        notes.parent.mkdir()
        notes.write_text("one")
        taken = on_one.post(f"/api/dist/backups/{app}")
        assert taken.status_code == 200, taken.text
        backup = taken.json()["id"]
        folder = shared.scopes / "backups/global" / app
        assert (folder / backup / "data" / instance / "notes.txt").read_text() == "one"
        wait_for(lambda: listed(on_two, app), "the install read on two")
        assert [b["id"] for b in on_two.get(f"/api/dist/backups/{app}").json()] == [backup]

        notes.write_text("changed")
        restored = on_two.post(f"/api/dist/restore/{app}", json={"backup": backup})
        assert restored.status_code == 200, restored.text
        assert restored.json()["ok"] is True, restored.text
        assert notes.read_text() == "one"

        # what kills left, one made a moment ago and one an hour ago
        an_hour_ago = time.time() - 3700
        partials = [folder / f".2000010{n}T000000000000Z-1.0.0.partial" for n in (1, 2)]
        deleting = folder / ".deleting-y"
        for path in [*partials, deleting]:
            path.mkdir()
        os.utime(partials[1], (an_hour_ago, an_hour_ago))
        again = on_two.post(f"/api/dist/backups/{app}")  # pruned after it is taken
        assert again.status_code == 200, again.text
        assert not any(p.exists() for p in partials)
        assert deleting.is_dir()  # a prune drops snapshots, not removals
        for path in partials:  # snapshots begun after the prune, as far as a start knows
            path.mkdir()
        os.utime(partials[1], (an_hour_ago, an_hour_ago))
    shared.start("three")  # its start finishes the removal, and leaves the snapshots
    assert not deleting.exists()
    assert all(p.is_dir() for p in partials)


def installed_and_launched_on_two(on_one: httpx.Client, on_two: httpx.Client, source: Path) -> str:
    """The app at ``source`` installed through one, read on two, and launched there: its id."""
    installed_ok(on_one, f"local:{source}")
    wait_for(lambda: listed(on_two, source.name), "the install read on two")
    launched = on_two.post("/api/instances", json={"appId": source.name})
    assert launched.status_code == 200, launched.text
    return str(launched.json()["instanceId"])


def test_an_update_on_one_shell_renews_the_instances_of_the_other(
    shared: Shared, make_app: MakeApp
) -> None:
    """An update through one shell stopped and brought back that shell's instances only: the
    other shell's ran the old version on (until closed), and after an uninstall there the app
    ran on. The other shell renews them once it has read the scope again: the same id on the
    new copy, and an uninstalled app's stopped."""
    app = "com.example.renewed"
    one, two = shared.start("one", runner="auto"), shared.start("two", runner="auto")
    source = make_app(app)
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        instance = installed_and_launched_on_two(on_one, on_two, source)
        held = two.shell.lifecycle.get(instance)
        assert held.manifest.version == "1.0.0"

        write_manifest(source, version="2.0.0")
        updated = on_one.post(f"/api/dist/update/{app}", json={})
        assert updated.status_code == 200, updated.text

        def renewed() -> bool:
            now = two.shell.lifecycle.find(instance)
            return (
                now is not None and now.manifest.version == "2.0.0" and now.state.value == "started"
            )

        wait_for(renewed, "two's instance brought back on 2.0.0", DEADLINE)

        removed = on_one.delete(f"/api/dist/uninstall/{app}")
        assert removed.status_code == 200, removed.text
        wait_for(
            lambda: two.shell.lifecycle.find(instance) is None, "two's instance ended", DEADLINE
        )


def test_an_update_heard_while_an_operation_holds_the_app_renews_once_it_is_over(
    shared: Shared, make_app: MakeApp
) -> None:
    """An operation on two held the app when one's update was heard there (a user's backup of
    their own data stops that user's instances only): the renewal left the app to it, and nobody
    looked again, so two's other instances ran the old version until the scope's next change.
    The lock is held here as such an operation holds it, by hand: a real one is over before the
    update is heard."""
    app = "com.example.renewedlater"
    one, two = shared.start("one", runner="auto"), shared.start("two", runner="auto")
    source = make_app(app)
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        instance = installed_and_launched_on_two(on_one, on_two, source)

        locks = two.shell.lifecycle._operations
        assert isinstance(locks, AppLocks)
        over = threading.Event()

        async def operation() -> None:
            # this shell's lock only: a backup here takes the one among shells too, which one's
            # update would have been refused by; the state comes from an operation begun here
            # after one's update committed, before its scope:changed was read here
            async with locks.hold(app, "backup", here=True):
                await asyncio.to_thread(over.wait, DEADLINE)

        assert two.loop is not None
        running = asyncio.run_coroutine_threadsafe(operation(), two.loop)
        wait_for(lambda: locks.operation(app) == "backup", "the operation holds the app")
        write_manifest(source, version="2.0.0")
        updated = on_one.post(f"/api/dist/update/{app}", json={})
        assert updated.status_code == 200, updated.text
        copy = two.shell.registry.get
        wait_for(
            lambda: (c := copy(app)) and c.manifest and c.manifest.version == "2.0.0",
            "the update read",
        )
        for _ in range(2):  # the look the reading started has run (and left the app)
            two.on_loop(asyncio.sleep(0))
        assert two.shell.lifecycle.get(instance).manifest.version == "1.0.0"
        over.set()
        running.result(timeout=DEADLINE)

        def renewed() -> bool:
            now = two.shell.lifecycle.find(instance)
            return (
                now is not None and now.manifest.version == "2.0.0" and now.state.value == "started"
            )

        wait_for(renewed, "two's instance brought back on 2.0.0 once the operation is over", 20)


#: the app `backup_held_in_its_stop` backs up
BLOCKED = "com.example.wakeheld"


def blocking_app_launched_on_one(
    shared: Shared, make_app: MakeApp, on_one: httpx.Client, on_two: httpx.Client
) -> Path:
    """BLOCKED (its hooks wait on files: BLOCKING) installed and launched through one, and read
    on two: its instance's data folder."""
    source = make_app(BLOCKED, entrypoint=["python3", "blocking.py"])
    (source / "blocking.py").write_text(BLOCKING)
    installed_ok(on_one, f"local:{source}")
    launched = on_one.post("/api/instances", json={"appId": BLOCKED})
    assert launched.status_code == 200, launched.text
    wait_for(lambda: listed(on_two, BLOCKED), "the install read on two")
    instance: str = launched.json()["instanceId"]
    return shared.scopes / "global/apps" / BLOCKED / instance


def test_an_operation_through_one_shell_refuses_the_apps_operations_through_the_other(
    shared: Shared, make_app: MakeApp
) -> None:
    """The per-app operation lock was each shell's own: with no stickiness, an uninstall through
    two went ahead while one backed the app up, and removed the data one was copying."""
    app = BLOCKED
    one, two = shared.start("one", runner="auto"), shared.start("two", runner="auto")
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        data = blocking_app_launched_on_one(shared, make_app, on_one, on_two)
        backup, backed_up, client = backup_held_in_its_stop(one, data)
        try:
            refused = [
                on_two.delete(f"/api/dist/uninstall/{app}"),
                on_two.post(f"/api/dist/backups/{app}"),
                on_two.post(f"/api/dist/update/{app}", json={}),
            ]
        finally:
            (data / "block-onStop").unlink()
            backup.join(DEADLINE)
            client.close()
        for answer in refused:
            assert answer.status_code == 409, answer.text
            error = answer.json()["error"]
            assert (error["code"], error["appId"], error["operation"]) == ("busy", app, "backup")
            assert error["elsewhere"] is True
            assert "on another shell" in error["message"]
        assert backed_up[0].status_code == 200, backed_up[0].text
        assert listed(on_two, app) is not None
        # the lock went with the operation: two's own goes ahead now, and one is refused
        with operation_held(two, app):
            busy = on_one.post(f"/api/dist/backups/{app}")
        assert busy.status_code == 409, busy.text
        assert busy.json()["error"]["operation"] == "a test"
        again = on_two.post(f"/api/dist/backups/{app}")
        assert again.status_code == 200, again.text


def operation_sessions(url: str, app_id: str, *, end: bool = False) -> int:
    """How many sessions hold ``app_id``'s operation lock among the shells (``end``: they are
    ended, as a dropped link or the server's ``idle_session_timeout`` ends one)."""
    import psycopg

    key = lock_key("operation", app_id)
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        what = "count(pg_terminate_backend(pid))" if end else "count(*)"
        row = conn.execute(
            f"SELECT {what} FROM pg_locks WHERE locktype = 'advisory' AND granted"  # noqa: S608
            " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_operation_whose_lock_session_ends_takes_the_lock_again_before_the_other_shell(
    shared: Shared, make_app: MakeApp
) -> None:
    """The operation lock is a session lock on an idle connection: a session ended under a
    running operation (a dropped link, ``idle_session_timeout``, an administrator) freed the
    app, and an uninstall through the other shell went ahead while one still backed it up."""
    app = BLOCKED
    one, two = shared.start("one", runner="auto"), shared.start("two", runner="auto")
    with one.client(timeout=DEADLINE) as on_one, two.client(timeout=DEADLINE) as on_two:
        data = blocking_app_launched_on_one(shared, make_app, on_one, on_two)
        backup, backed_up, client = backup_held_in_its_stop(one, data)
        try:
            assert operation_sessions(shared.url, app, end=True) == 1
            wait_for(
                lambda: operation_sessions(shared.url, app) == 1,
                "one to take the backup's lock again",
                10,
            )
            refused = on_two.delete(f"/api/dist/uninstall/{app}")
        finally:
            (data / "block-onStop").unlink()
            backup.join(DEADLINE)
            client.close()
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["elsewhere"] is True
        assert backed_up[0].status_code == 200, backed_up[0].text
        assert operation_sessions(shared.url, app) == 0
        assert listed(on_two, app) is not None


def test_a_staging_folder_under_way_is_kept_by_a_starting_shell_whatever_its_age(
    shared: Shared, make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting shell removes a staging folder nobody touched for an hour: an update through
    one whose fetch or stop took longer (its folder is touched only as its direct entries
    change) had its staged tree removed under it. Touched by the operation meanwhile now (every
    `STAGING_TOUCH_EVERY` s, made short here); the start's clearing is called by hand on two."""
    monkeypatch.setattr(operations, "STAGING_TOUCH_EVERY", 0.05)
    app = "com.example.wakeheld"
    one, two = shared.start("one", runner="auto"), shared.start("two", runner="auto")
    source = make_app(app, entrypoint=["python3", "blocking.py"])
    (source / "blocking.py").write_text(BLOCKING)
    with one.client(timeout=DEADLINE) as on_one:
        installed_ok(on_one, f"local:{source}")
        launched = on_one.post("/api/instances", json={"appId": app})
        assert launched.status_code == 200, launched.text
        data = shared.scopes / "global/apps" / app / launched.json()["instanceId"]
        write_manifest(source, version="2.0.0")
        (data / "block-onStop").write_text("")
        thread, updated = in_background(lambda: on_one.post(f"/api/dist/update/{app}", json={}))
        try:
            wait_for(lambda: (data / "in-onStop").exists(), "the update to stop the instance")
            (entry,) = (shared.scopes / "global/.staging").iterdir()
            hour_ago = time.time() - 2 * 3600
            os.utime(entry, (hour_ago, hour_ago))
            wait_for(lambda: entry.stat().st_mtime > hour_ago, "the update to touch its folder", 3)
            two.shell.dist.installer._clear_staging(Scope.GLOBAL)
            assert entry.is_dir(), "the update's staging folder was removed under it"
        finally:
            (data / "block-onStop").unlink()
            thread.join(DEADLINE)
        assert updated[0].status_code == 200, updated[0].text
        now = listed(on_one, app)
        assert now is not None
        assert now["version"] == "2.0.0", now
