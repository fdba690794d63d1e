"""Backups that survive kills, clocks, damage and full disks (docs/api.md "Backups"), through a real
shell: a prune cut off by SIGKILL leaves no half backup listed, backups are ordered by their
sequence and not by the clock, a backup whose files no longer match its `backup.json` is never
listed nor restored (restore and rollback name it; a rollback falls back to an intact backup of
the version), `atrium doctor` reports it, and a full disk is `507 storage_full` with nothing left
behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import MIB, RunningShell, StartShell, fill_disk, wait_for
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest
from tests.integration.distribution.test_crash import (  # crash: the fixture
    DEADLINE,
    Served,
    crash,  # noqa: F401
    killed_during,
)
from tests.integration.distribution.test_doctor_repair import doctor
from tests.integration.distribution.test_wake_during_operations import BLOCKING, in_background

pytestmark = pytest.mark.integration
APP = "com.example.safe"


def data_dir(home: Path) -> Path:
    return home / "scopes/global/apps" / APP / f"{APP}-1"


def backups_dir(home: Path) -> Path:
    return home / "backups/global" / APP


def with_data(api: httpx.Client, make_app: MakeApp, home: Path, text: str = "one") -> Path:
    """1.0.0 installed, with a runtime data folder holding two files."""
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    data_dir(home).mkdir()
    (data_dir(home) / "notes.txt").write_text(text)
    (data_dir(home) / "more.txt").write_text("more")
    return source


def listed(api: httpx.Client) -> list[dict[str, Any]]:
    response = api.get(f"/api/dist/backups/{APP}")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def take(api: httpx.Client) -> str:
    response = api.post(f"/api/dist/backups/{APP}")
    assert response.status_code == 200, response.text
    backup_id: str = response.json()["id"]
    return backup_id


def damage(home: Path, backup_id: str, how: str) -> None:
    """What a kill in the middle of a removal, a lost write or a stray hand leaves."""
    files = backups_dir(home) / backup_id / "data" / f"{APP}-1"
    if how == "truncated":
        (files / "notes.txt").write_text("")
    elif how == "deleted":
        (files / "more.txt").unlink()
    else:
        (files / "stray.txt").write_text("not backed up")


def rewrite(home: Path, backup_id: str, name: str, **fields: Any) -> str:
    """Rename a backup folder and change fields of its backup.json (None drops a field): what an
    earlier shell, or a clock that ran ahead, would have written."""
    folder = backups_dir(home) / backup_id
    manifest = json.loads((folder / "backup.json").read_text())
    for key, value in fields.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    (folder / "backup.json").write_text(json.dumps(manifest))
    folder.rename(backups_dir(home) / name)
    return name


# -- 7: a kill during pruning ---------------------------------------------------------------------


@pytest.mark.parametrize("finish", ["start", "repair"])
def test_a_prune_killed_midway_lists_no_half_backup(
    finish: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        with_data(api, make_app, home)
        made = [take(api) for _ in range(5)]
    setup.stop()

    crash.append(Served(home, system_apps, "prune-removing"))
    killed_during(crash[-1], "POST", f"/api/dist/backups/{APP}")
    # the oldest backup is out of the listing before any of it is removed
    assert not (backups_dir(home) / made[0]).exists()
    [doomed] = backups_dir(home).glob(".deleting-*")
    assert doomed.name == f".deleting-{made[0]}"
    report = doctor(home)
    assert report.returncode == 1
    assert f"unfinished removal of the backup {doomed}" in report.stdout, report.stdout

    if finish == "repair":
        repaired = doctor(home, "--repair")
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert f"repaired: finished removing the backup {doomed}" in repaired.stdout
        assert not doomed.exists()
    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        backups = listed(api)
        assert [b["id"] for b in backups][1:] == list(reversed(made[1:]))
        assert [p.name for p in backups_dir(home).iterdir() if p.name.startswith(".")] == []
        assert api.post(f"/api/dist/restore/{APP}", json={"backup": made[1]}).status_code == 200
    assert doctor(home).returncode == 0


def test_a_dev_copy_removal_killed_midway_lists_no_half_backup(
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    """A dev copy's backups go with it: each one out of the listing before it is removed, so a
    kill in the middle leaves none listed half, and the next start finishes the removal."""
    user_data = home / "scopes/users/default/apps" / APP / f"{APP}-1"
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{make_app(APP)}", scope="user", dev=True)
        user_data.mkdir()
        (user_data / "notes.txt").write_text("one")
        for _ in range(2):
            made = api.post(f"/api/dist/backups/{APP}", json={"scope": "user"})
            assert made.status_code == 200, made.text
    setup.stop()

    crash.append(Served(home, system_apps, "prune-removing"))
    killed_during(crash[-1], "DELETE", f"/api/dist/uninstall/{APP}?scope=user&devOnly=true")
    folder = home / "backups/user" / APP
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] != []
    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        assert list(folder.glob(".*")) == []
        remaining = api.get(f"/api/dist/backups/{APP}?scope=user").json()
        assert len(remaining) == 1  # the one not reached yet, whole
        notes = folder / remaining[0]["id"] / "data" / f"{APP}-1" / "notes.txt"
        assert notes.read_text() == "one"


# -- 7, 9: a backup whose files do not match its backup.json --------------------------------------


@pytest.mark.parametrize("how", ["truncated", "deleted", "added"])
def test_a_damaged_backup_is_neither_listed_nor_restored(
    how: str, api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    with_data(api, make_app, home)
    damaged, intact = take(api), take(api)
    damage(home, damaged, how)
    assert [b["id"] for b in listed(api)] == [intact]
    history = api.get(f"/api/dist/history/{APP}").json()
    assert [b["id"] for b in history["backups"]] == [intact]

    (data_dir(home) / "notes.txt").write_text("today")
    refused = api.post(f"/api/dist/restore/{APP}", json={"backup": damaged})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["backup"], error["appId"]) == ("backup_damaged", damaged, APP)
    assert damaged in error["message"]
    assert (data_dir(home) / "notes.txt").read_text() == "today"  # nothing changed
    assert [b["id"] for b in listed(api)] == [intact]  # no safety copy taken either
    assert api.post(f"/api/dist/restore/{APP}", json={"backup": intact}).status_code == 200
    assert (data_dir(home) / "notes.txt").read_text() == "one"


@pytest.mark.parametrize("operation", ["restore", "rollback"])
def test_a_backup_damaged_after_its_check_is_not_swapped_in(
    operation: str, api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    """The backup is checked, then the app's instances stop, then its data is copied: a file
    that changes in between (here a backup file truncated while the app's `onStop` is held)
    reaches the copy, which is compared with `backup.json` before anything is exchanged."""
    source = make_app(APP, entrypoint=["python3", "blocking.py"])
    (source / "blocking.py").write_text(BLOCKING)
    installed_ok(api, f"local:{source}")
    launched = api.post("/api/instances", json={"appId": APP}).json()
    assert launched["instanceId"] == f"{APP}-1"
    (data_dir(home) / "notes.txt").write_text("one")
    if operation == "restore":
        backup_id = take(api)
        body: dict[str, Any] = {"backup": backup_id}
    else:  # the update's backup: 1.0.0's data, which the rollback brings back
        write_manifest(source, version="2.0.0", entrypoint=["python3", "blocking.py"])
        backup_id = api.post(f"/api/dist/update/{APP}", json={}).json()["backup"]
        body = {}
    (data_dir(home) / "notes.txt").write_text("today")
    (data_dir(home) / "block-onStop").write_text("")
    with dist_shell.client(timeout=DEADLINE) as client:
        thread, answers = in_background(
            lambda: client.post(f"/api/dist/{operation}/{APP}", json=body)
        )
        wait_for(
            lambda: (data_dir(home) / "in-onStop").exists() or answers,
            "the operation to stop the app",
        )
        assert not answers, answers[0].text
        damage(home, backup_id, "truncated")  # checked already, not yet copied
        (data_dir(home) / "block-onStop").unlink()
        thread.join(DEADLINE)
    [refused] = answers
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["backup"], error["appId"]) == ("backup_damaged", backup_id, APP)
    assert f"data/{APP}-1/notes.txt is 0 bytes" in error["problem"], error
    assert (data_dir(home) / "notes.txt").read_text() == "today"  # the live data untouched
    assert list((home / "scopes/global/.staging").iterdir()) == []
    current = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
    assert current["version"] == ("1.0.0" if operation == "restore" else "2.0.0")
    instance = dist_shell.shell.lifecycle.find(f"{APP}-1")
    assert instance is not None
    assert instance.state.value == "started"  # started again


def test_a_rollback_falls_back_to_the_newest_intact_backup_of_the_version(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = with_data(api, make_app, home, text="older")
    older = take(api)
    (data_dir(home) / "notes.txt").write_text("newer")
    write_manifest(source, version="2.0.0")
    updated = api.post(f"/api/dist/update/{APP}", json={}).json()
    newest = updated["backup"]  # 1.0.0's data as the update left it
    damage(home, newest, "truncated")
    (data_dir(home) / "notes.txt").write_text("two")

    rolled = api.post(f"/api/dist/rollback/{APP}", json={})
    assert rolled.status_code == 200, rolled.text
    answer = rolled.json()
    assert (answer["record"]["version"], answer["dataRestored"]) == ("1.0.0", older)
    assert f"skipped the damaged backup(s) of 1.0.0: {newest} (" in answer["note"]
    assert (data_dir(home) / "notes.txt").read_text() == "older"


def test_a_rollback_onto_a_version_whose_backups_are_all_damaged_is_refused(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = with_data(api, make_app, home)
    write_manifest(source, version="2.0.0")
    only = api.post(f"/api/dist/update/{APP}", json={}).json()["backup"]
    damage(home, only, "deleted")
    (data_dir(home) / "notes.txt").write_text("two")

    refused = api.post(f"/api/dist/rollback/{APP}", json={})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["backup"]) == ("backup_damaged", only)
    assert "no intact backup of 1.0.0 is left" in error["message"]
    assert "keepData" in error["message"]
    current = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
    assert current["version"] == "2.0.0"
    assert list((home / "scopes/global/.staging").iterdir()) == []
    # the code alone can still go back
    kept = api.post(f"/api/dist/rollback/{APP}", json={"keepData": True}).json()
    assert (kept["record"]["version"], kept["dataRestored"]) == ("1.0.0", None)
    assert (data_dir(home) / "notes.txt").read_text() == "two"


def test_doctor_reports_a_damaged_backup_and_repair_sets_it_aside(
    start_shell: StartShell, make_app: MakeApp, home: Path
) -> None:
    shell = start_shell()
    with shell.client(timeout=DEADLINE) as api:
        with_data(api, make_app, home)
        damaged = take(api)
    shell.stop()
    damage(home, damaged, "deleted")
    folder = backups_dir(home) / damaged

    report = doctor(home)
    assert report.returncode == 1, report.stdout
    line = next(x for x in report.stdout.splitlines() if str(folder) in x)
    assert line.startswith(f"damaged backup {folder}: data/{APP}-1/more.txt is missing"), line
    repaired = doctor(home, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert not folder.exists()
    [aside] = (home / "lost+found").glob(f"*/backups/global/{APP}/{damaged}")
    assert (aside / "data" / f"{APP}-1" / "notes.txt").read_text() == "one"  # nothing deleted


# -- 8: ordered by a sequence, not the clock ------------------------------------------------------


def test_a_backup_taken_after_the_clock_went_back_is_the_newest_and_kept(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    with_data(api, make_app, home)
    ahead = [
        rewrite(
            home, take(api), f"2099010100000{n}000000Z-1.0.0", createdAt=f"2099-01-01T00:00:0{n}Z"
        )
        for n in range(5)
    ]
    # the clock is back to today: the new backup is still the newest
    new = take(api)
    order = [b["id"] for b in listed(api)]
    assert order == [new, *reversed(ahead[1:])]
    assert [b["sequence"] for b in listed(api)] == [6, 5, 4, 3, 2]
    assert not (backups_dir(home) / ahead[0]).exists()


def test_backups_from_before_sequences_count_as_older_and_are_still_checked(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    """A backup written before `backup.json` had a sequence and a file list (format 1): ordered
    by its stamp, before every sequenced one; checked by its file count and byte total."""
    with_data(api, make_app, home)
    legacy = [
        rewrite(
            home,
            take(api),
            f"2099010100000{n}000000Z-1.0.0",
            format=1,
            sequence=None,
            sizes=None,
            createdAt=f"2099-01-01T00:00:0{n}Z",
        )
        for n in range(5)
    ]
    assert [b["id"] for b in listed(api)] == list(reversed(legacy))
    new = take(api)
    assert [b["id"] for b in listed(api)] == [new, *reversed(legacy[1:])]
    assert listed(api)[0]["sequence"] == 1
    damage(home, legacy[1], "truncated")
    assert legacy[1] not in [b["id"] for b in listed(api)]
    refused = api.post(f"/api/dist/restore/{APP}", json={"backup": legacy[1]})
    assert refused.json()["error"]["code"] == "backup_damaged", refused.text
    restored = api.post(f"/api/dist/restore/{APP}", json={"backup": legacy[2]})
    assert restored.status_code == 200, restored.text


# -- 9, 13: full disks ----------------------------------------------------------------------------


def test_a_backup_on_a_full_disk_is_507_and_leaves_no_partial(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    shell = start_shell(runner="process")
    with shell.client(timeout=DEADLINE) as api:
        with_data(api, make_app, small_home)
        (data_dir(small_home) / "big.bin").write_bytes(os.urandom(4 * MIB))
        fill_disk(small_home, 2 * MIB)
        response = api.post(f"/api/dist/backups/{APP}")
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert (error["code"], error["path"]) == ("storage_full", str(small_home / "backups"))
        assert list(backups_dir(small_home).iterdir()) == []  # no .partial left behind
        assert listed(api) == []


def test_a_rollback_on_a_full_disk_is_507_naming_the_folder(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    source = make_app(APP)
    (source / "blob.bin").write_bytes(os.urandom(3 * MIB))  # 1.0.0 is big, 2.0.0 is not
    shell = start_shell(runner="process")
    with shell.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        (source / "blob.bin").unlink()
        write_manifest(source, version="2.0.0")
        assert api.post(f"/api/dist/update/{APP}", json={}).json()["ok"] is True
        filler = fill_disk(small_home, MIB)
        response = api.post(f"/api/dist/rollback/{APP}", json={})
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        staging = small_home / "scopes/global/.staging"
        assert (error["code"], error["path"]) == ("storage_full", str(staging)), error
        assert list(staging.iterdir()) == []
        current = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert current["version"] == "2.0.0"
        filler.unlink()
        rolled = api.post(f"/api/dist/rollback/{APP}", json={})
        assert rolled.status_code == 200, rolled.text


def test_an_uninstall_on_a_full_disk_leaves_no_journal_temporary(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    shell = start_shell(runner="process")
    with shell.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{make_app(APP)}")
        filler = fill_disk(small_home)
        response = api.delete(f"/api/dist/uninstall/{APP}")
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert (error["code"], error["path"]) == ("storage_full", str(small_home / "scopes/global"))
        journal = small_home / "scopes/global/.journal"
        assert sorted(p.name for p in journal.iterdir()) == []
        filler.unlink()
        assert api.delete(f"/api/dist/uninstall/{APP}").status_code == 200
