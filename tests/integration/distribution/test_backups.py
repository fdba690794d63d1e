"""Data backups (docs/api.md "Backups"): before updates and rollbacks, on request, restored with a
rollback; real shell, real files, owners kept."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest

pytestmark = pytest.mark.integration
APP = "com.example.kept"


def data_file(home: Path, instance: str) -> Path:
    return home / "scopes/global/apps" / APP / instance / "notes.txt"


def with_data(api: httpx.Client, make_app: MakeApp, home: Path) -> tuple[Path, str]:
    """1.0.0 installed and launched once (its runtime folder exists, owned by the app), holding
    notes.txt = "one"."""
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    data_file(home, instance).write_text("one")
    return source, instance


def test_an_update_backs_up_the_data_and_a_rollback_brings_it_back(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source, instance = with_data(api, make_app, home)
    owner = data_file(home, instance).parent.stat().st_uid
    write_manifest(source, version="2.0.0")
    updated = api.post(f"/api/dist/update/{APP}", json={}).json()
    assert updated["ok"] is True
    [taken] = api.get(f"/api/dist/backups/{APP}").json()
    assert taken["id"] == updated["backup"]
    assert (taken["version"], taken["reason"], taken["folders"]) == ("1.0.0", "update", [instance])
    assert (taken["files"], taken["bytes"]) == (1, 3)
    assert taken["method"] in {"reflink", "copy"}
    # version 2 changes the data; the rollback puts 1's data back and keeps 2's in a backup
    data_file(home, instance).write_text("two")
    rolled = api.post(f"/api/dist/rollback/{APP}", json={}).json()
    assert rolled["dataRestored"] == taken["id"]
    assert data_file(home, instance).read_text() == "one"
    assert data_file(home, instance).parent.stat().st_uid == owner  # the app's again
    history = api.get(f"/api/dist/history/{APP}").json()
    assert [(b["version"], b["reason"]) for b in history["backups"]] == [
        ("2.0.0", "rollback"),
        ("1.0.0", "update"),
    ]
    newest = Path(home / "backups/global" / APP / history["backups"][0]["id"])
    assert (newest / "data" / instance / "notes.txt").read_text() == "two"
    assert api.get(f"/api/instances/{instance}").json()["state"] == "started"


def test_keep_data_rolls_back_the_code_only(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source, instance = with_data(api, make_app, home)
    write_manifest(source, version="2.0.0")
    assert api.post(f"/api/dist/update/{APP}", json={}).json()["ok"] is True
    data_file(home, instance).write_text("two")
    rolled = api.post(f"/api/dist/rollback/{APP}", json={"keepData": True}).json()
    assert (rolled["record"]["version"], rolled["dataRestored"]) == ("1.0.0", None)
    assert data_file(home, instance).read_text() == "two"


def test_manual_backup_and_restore(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    _, instance = with_data(api, make_app, home)
    pid = api.get(f"/api/instances/{instance}").json()["pid"]
    taken = api.post(f"/api/dist/backups/{APP}").json()
    assert (taken["reason"], taken["version"]) == ("manual", "1.0.0")
    assert api.get(f"/api/instances/{instance}").json()["pid"] != pid  # stopped for the copy
    data_file(home, instance).write_text("changed")
    (data_file(home, instance).parent / "extra.txt").write_text("added later")
    answer = api.post(f"/api/dist/restore/{APP}", json={"backup": taken["id"]}).json()
    assert answer["ok"] is True, answer
    assert answer["stopped"] == [instance]
    assert data_file(home, instance).read_text() == "one"
    assert not (data_file(home, instance).parent / "extra.txt").exists()
    safety = next(
        b for b in api.get(f"/api/dist/backups/{APP}").json() if b["id"] == answer["backup"]
    )
    assert safety["reason"] == "restore"
    assert list((home / "scopes/global/.staging").iterdir()) == []
    assert api.get(f"/api/instances/{instance}").json()["state"] == "started"


def test_retention_keeps_the_five_newest(api: httpx.Client, make_app: MakeApp, home: Path) -> None:
    with_data(api, make_app, home)
    made = [api.post(f"/api/dist/backups/{APP}").json()["id"] for _ in range(7)]
    kept = [b["id"] for b in api.get(f"/api/dist/backups/{APP}").json()]
    assert kept == list(reversed(made))[:5]
    assert sorted(p.name for p in (home / "backups/global" / APP).iterdir()) == sorted(kept)


def test_refusals_change_nothing(api: httpx.Client, make_app: MakeApp, home: Path) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    none_yet = api.post(f"/api/dist/backups/{APP}")
    assert none_yet.status_code == 404
    assert none_yet.json()["error"]["kind"] == "runtime data"
    unknown = api.post(f"/api/dist/restore/{APP}", json={"backup": "20260101T000000000000Z-1.0.0"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["kind"] == "backup"
    sneaky = api.post(f"/api/dist/restore/{APP}", json={"backup": "../../../etc"})
    assert sneaky.status_code == 404
    assert api.post("/api/dist/backups/com.atrium.notes").status_code == 403
    assert api.post(f"/api/dist/restore/{APP}", json={}).status_code == 400
    assert not (home / "backups/global" / APP).exists()
