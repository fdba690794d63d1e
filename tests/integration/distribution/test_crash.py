"""Crash safety: the real shell (`python -m atrium serve`) kills itself at each journaled step
(ATRIUM_FAULTPOINT); after a restart the scope holds the old or the new version complete with its
data, the record matching it, a clean scope repository and nothing left in staging or the journal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atrium.distribution.journal import FAULTPOINTS
from tests.conftest import REPO_DIR
from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest

pytestmark = pytest.mark.integration
APP = "com.example.crashy"
TOKEN = "crash-test-token-0123456789abcdef"
DEADLINE = 60.0
#: the step from which the new state is in place (recovery finishes); before it, it is undone
FINISHED_FROM = {"install": "swapped", "uninstall": "removed"}


def is_finished(op: str, step: str) -> bool:
    steps = FAULTPOINTS[op]
    return steps.index(step) >= steps.index(FINISHED_FROM[op])


class Served:
    """`atrium serve` as a child process on a free port, found through `$ATRIUM_HOME/run/`."""

    def __init__(self, home: Path, system_apps: Path, faultpoint: str) -> None:
        (home / "run" / "url").unlink(missing_ok=True)
        env = {
            **os.environ,
            "ATRIUM_HOME": str(home),
            "ATRIUM_SYSTEM_APPS": str(system_apps),
            "ATRIUM_RUNNER": "process",
            "ATRIUM_TOKEN": TOKEN,
            "ATRIUM_FAULTPOINT": faultpoint,
        }
        self.log = (home.parent / "serve.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atrium", "serve", "--port", "0"],
            env=env,
            cwd=REPO_DIR,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + DEADLINE
        url_file = home / "run" / "url"
        while not url_file.exists() or not url_file.read_text().strip():
            assert self.proc.poll() is None, "serve exited before it was ready"
            assert time.monotonic() < deadline, "serve did not write its URL in time"
            time.sleep(0.02)
        assert (home / "run" / "token").read_text().strip() == TOKEN
        self.url = url_file.read_text().strip()

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=DEADLINE)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)
        self.log.close()


@pytest.fixture
def crash(home: Path, system_apps: Path) -> Iterator[list[Served]]:
    served: list[Served] = []
    yield served
    for one in served:
        one.close()


def killed_during(served: Served, method: str, path: str, **kwargs: object) -> None:
    """Send the request; the shell must die (SIGKILL) before it answers."""
    with served.client() as client:
        try:
            response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
        except httpx.TransportError:
            pass
        else:
            pytest.fail(f"the shell answered {response.status_code}: {response.text}")
    assert served.proc.wait(timeout=DEADLINE) == -signal.SIGKILL


def git(home: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=home / "scopes/global", check=True, capture_output=True, text=True
    ).stdout


def assert_clean(home: Path) -> None:
    scope = home / "scopes/global"
    assert list((scope / ".journal").glob("*.json")) == []
    assert list((scope / ".staging").iterdir()) == []
    assert git(home, "status", "--porcelain") == ""


def assert_installed(home: Path, api: httpx.Client, version: str, commit: str) -> None:
    """``version`` is in place with its runtime data, its record, and ``commit`` on top."""
    app_dir = home / "scopes/global/apps" / APP
    manifest = json.loads((app_dir / "app.manifest.json").read_text())
    assert manifest["version"] == version
    assert (app_dir / f"{APP}-1" / "data.txt").read_text() == "precious"
    assert (app_dir / "server.py").is_file()
    record = json.loads((home / "scopes/global/records" / f"{APP}.json").read_text())
    assert record["version"] == version
    assert git(home, "log", "-1", "--format=%s").strip() == commit
    listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
    assert (listed["version"], listed["record"]) == (version, record)


@pytest.mark.parametrize("step", FAULTPOINTS["install"])
def test_an_update_killed_at_each_step_recovers_to_old_or_new(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    source = make_app(APP)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
    setup.stop()
    data = home / "scopes/global/apps" / APP / f"{APP}-1"
    data.mkdir()
    (data / "data.txt").write_text("precious")
    write_manifest(source, version="2.0.0")

    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "POST", f"/api/dist/update/{APP}", json={})

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        if is_finished("install", step):
            assert_installed(home, api, "2.0.0", f"update {APP} 2.0.0 (local:{source})")
        else:
            assert_installed(home, api, "1.0.0", f"install {APP} 1.0.0 (local:{source})")
        assert_clean(home)
        # the scope works as before: the next install goes through
        assert installed_ok(api, f"local:{source}")["record"]["version"] == "2.0.0"


@pytest.mark.parametrize("step", [s for s in FAULTPOINTS["install"] if s != "data"])
def test_a_first_install_killed_at_each_step_recovers_to_nothing_or_all(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    source = make_app(APP)
    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "POST", "/api/dist/install", json={"ref": f"local:{source}"})

    finished = is_finished("install", step)
    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        app_dir = home / "scopes/global/apps" / APP
        record = home / "scopes/global/records" / f"{APP}.json"
        if finished:
            assert json.loads((app_dir / "app.manifest.json").read_text())["version"] == "1.0.0"
            assert json.loads(record.read_text())["version"] == "1.0.0"
            assert git(home, "log", "-1", "--format=%s").startswith(f"install {APP} 1.0.0")
        else:
            assert not app_dir.exists()
            assert not record.exists()
            assert git(home, "log", "--format=%s").strip() == "baseline: Atrium scope"
        assert any(a["id"] == APP for a in api.get("/api/apps").json()) is finished
        assert_clean(home)


@pytest.mark.parametrize("step", FAULTPOINTS["uninstall"])
def test_an_uninstall_killed_at_each_step_recovers_to_installed_or_gone(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    source = make_app(APP)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
    setup.stop()
    data = home / "scopes/global/apps" / APP / f"{APP}-1"
    data.mkdir()
    (data / "data.txt").write_text("precious")

    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "DELETE", f"/api/dist/uninstall/{APP}")

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        if is_finished("uninstall", step):
            assert not (home / "scopes/global/apps" / APP).exists()
            assert not (home / "scopes/global/records" / f"{APP}.json").exists()
            assert git(home, "log", "-1", "--format=%s").strip() == f"uninstall {APP} 1.0.0"
            assert all(a["id"] != APP for a in api.get("/api/apps").json())
        else:
            assert_installed(home, api, "1.0.0", f"install {APP} 1.0.0 (local:{source})")
        assert_clean(home)


@pytest.mark.parametrize("op", ["uninstall", "update"])
def test_a_commit_killed_after_git_wrote_its_index_is_finished(
    op: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    """Found by `make chaos`: git killed inside the operation's commit, after it wrote the index
    (the change staged) but before it moved HEAD. Recovery must still commit the change: it
    looked for the app's paths in the index and on disk only, found none after an uninstall,
    and left the deletions staged (a dirty scope repository, `atrium doctor` exit 1)."""
    source = make_app(APP)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
    setup.stop()
    crash.append(Served(home, system_apps, "record"))
    if op == "uninstall":
        killed_during(crash[-1], "DELETE", f"/api/dist/uninstall/{APP}")
    else:
        write_manifest(source, version="2.0.0")
        killed_during(crash[-1], "POST", f"/api/dist/update/{APP}", json={})
    git(home, "add", "--all", "--", f"apps/{APP}", f"records/{APP}.json")  # what git had done

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE):
        assert_clean(home)
        if op == "uninstall":
            assert git(home, "log", "-1", "--format=%s").strip() == f"uninstall {APP} 1.0.0"
            assert git(home, "ls-tree", "-r", "--name-only", "HEAD", "--", f"apps/{APP}") == ""
        else:
            assert git(home, "log", "-1", "--format=%s").strip() == (
                f"update {APP} 2.0.0 (local:{source})"
            )


@pytest.mark.parametrize("step", FAULTPOINTS["install"])
def test_a_rollback_killed_at_each_step_recovers_to_old_or_new(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    """A rollback runs through the install journal: the same points, the same recovery."""
    source = make_app(APP)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        write_manifest(source, version="2.0.0")
        assert api.post(f"/api/dist/update/{APP}", json={}).json()["ok"] is True
    setup.stop()
    data = home / "scopes/global/apps" / APP / f"{APP}-1"
    data.mkdir()
    (data / "data.txt").write_text("precious")
    installed_commit = git(home, "log", "--format=%H", "--", f"apps/{APP}").split()[-1]

    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "POST", f"/api/dist/rollback/{APP}", json={})

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        if is_finished("install", step):
            message = f"rollback {APP} 1.0.0 (from 2.0.0, {installed_commit[:12]})"
            assert_installed(home, api, "1.0.0", message)
        else:
            assert_installed(home, api, "2.0.0", f"update {APP} 2.0.0 (local:{source})")
        assert_clean(home)


def backups_of(home: Path) -> dict[str, str]:
    """Each complete backup of APP and the content of its data.txt."""
    folder = home / "backups/global" / APP
    return {
        b.name: (b / "data" / f"{APP}-1" / "data.txt").read_text()
        for b in sorted(folder.iterdir())
        if (b / "backup.json").is_file()
    }


@pytest.mark.parametrize("step", FAULTPOINTS["restore"])
def test_a_restore_killed_at_each_point_leaves_old_or_restored_data_and_every_backup(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    source = make_app(APP)
    setup = start_shell(runner="process")
    data = home / "scopes/global/apps" / APP / f"{APP}-1"
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        data.mkdir()
        (data / "data.txt").write_text("backed up")
        kept = api.post(f"/api/dist/backups/{APP}").json()["id"]
    setup.stop()
    (data / "data.txt").write_text("current")

    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "POST", f"/api/dist/restore/{APP}", json={"backup": kept})

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        expected = "backed up" if step == "restore-exchanged" else "current"
        assert (data / "data.txt").read_text() == expected
        backups = backups_of(home)
        assert backups[kept] == "backed up"  # never lost
        assert set(backups.values()) == {"backed up", "current"}  # and the safety copy
        assert_clean(home)
        # a restore after recovery works
        answer = api.post(f"/api/dist/restore/{APP}", json={"backup": kept})
        assert answer.status_code == 200, answer.text
        assert (data / "data.txt").read_text() == "backed up"


# no `data` step: the restored data is in the staged tree already, the live data is not moved
@pytest.mark.parametrize("step", [s for s in FAULTPOINTS["install"] if s != "data"])
def test_a_rollback_restoring_data_killed_at_each_step_keeps_data_and_backups(
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],
) -> None:
    source = make_app(APP)
    setup = start_shell(runner="process")
    data = home / "scopes/global/apps" / APP / f"{APP}-1"
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        data.mkdir()
        (data / "data.txt").write_text("precious")
        write_manifest(source, version="2.0.0")
        assert api.post(f"/api/dist/update/{APP}", json={}).json()["ok"] is True
    setup.stop()
    (data / "data.txt").write_text("migrated")
    before = backups_of(home)
    assert list(before.values()) == ["precious"]

    crash.append(Served(home, system_apps, step))
    killed_during(crash[-1], "POST", f"/api/dist/rollback/{APP}", json={})

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE):
        manifest = json.loads((data.parent / "app.manifest.json").read_text())
        if is_finished("install", step):
            assert (manifest["version"], (data / "data.txt").read_text()) == ("1.0.0", "precious")
        else:
            assert (manifest["version"], (data / "data.txt").read_text()) == ("2.0.0", "migrated")
        after = backups_of(home)
        assert all(after[name] == text for name, text in before.items())  # none lost
        assert "migrated" in after.values()  # today's data was backed up before the switch
        assert_clean(home)


def test_a_restore_of_two_folders_killed_between_them_is_finished_at_start(
    start_shell: StartShell, make_app: MakeApp, home: Path, system_apps: Path, crash: list[Served]
) -> None:
    """Each folder is swapped in by its own exchange: a kill after the first left `<app>-1`
    restored and `<app>-2` as it was, the old `<app>-1` in staging, removed at start (a mix of
    two states; found by `make chaos`). The plan written before the first exchange lets the
    start finish the set."""
    source = make_app(APP)
    setup = start_shell(runner="process")
    folders = [home / "scopes/global/apps" / APP / f"{APP}-{n}" for n in (1, 2)]
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        for folder in folders:
            folder.mkdir()
            (folder / "data.txt").write_text("backed up")
        kept = api.post(f"/api/dist/backups/{APP}").json()["id"]
    setup.stop()
    for folder in folders:
        (folder / "data.txt").write_text("current")
    crash.append(Served(home, system_apps, "restore-exchanged"))
    killed_during(crash[-1], "POST", f"/api/dist/restore/{APP}", json={"backup": kept})
    assert [(f / "data.txt").read_text() for f in folders] == ["backed up", "current"]
    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE):
        assert [(f / "data.txt").read_text() for f in folders] == ["backed up", "backed up"]
        assert list((home / "scopes/global/.staging").iterdir()) == []
