"""A member's own data of a shared (global) app is theirs to back up, restore, export and import
(docs/api.md "Backups", "Export and import"): the admin installs the app globally, each user's
instances keep their data in their own folder
(`scopes/users/<id>/runtime/global/<appId>/<appId>~<id>-<n>`), and each user's data operations
reach that data only. The tree stays the admin's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, installed_ok
from tests.integration.distribution.test_doctor_repair import doctor
from tests.integration.distribution.test_export_import import members
from tests.integration.distribution.test_keeping_per_owner import data_of

pytestmark = pytest.mark.integration
APP = "com.example.shared"


@pytest.fixture
def users(
    dist_shell: RunningShell, api: httpx.Client, make_app: MakeApp
) -> Iterator[dict[str, httpx.Client]]:
    """The app installed globally by the bootstrap admin; the admin, bob and alice (members)."""
    installed_ok(api, f"local:{make_app(APP)}")
    with (
        dist_shell.client(dist_shell.add_user("bob"), timeout=60) as bob,
        dist_shell.client(dist_shell.add_user("alice"), timeout=60) as alice,
    ):
        yield {"default": api, "bob": bob, "alice": alice}


def launched(client: httpx.Client) -> str:
    answer = client.post("/api/instances", json={"appId": APP, "new": True})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["instanceId"])


def notes(home: Path, user: str, instance: str) -> Path:
    """The file ``user``'s instance writes (the bootstrap admin's is in the app's tree)."""
    if user == "default":
        return home / "scopes/global/apps" / APP / instance / "notes.txt"
    return home / "scopes/users" / user / "runtime/global" / APP / instance / "notes.txt"


def written(home: Path, users: dict[str, httpx.Client]) -> dict[str, Path]:
    """Each user launches the app and writes their own name into its data."""
    files = {}
    for user, client in users.items():
        files[user] = notes(home, user, launched(client))
        files[user].write_text(user)
    return files


def test_a_member_backs_up_and_restores_their_own_data_of_a_global_app(
    users: dict[str, httpx.Client], home: Path
) -> None:
    files = written(home, users)
    bob, alice, admin = users["bob"], users["alice"], users["default"]
    taken = bob.post(f"/api/dist/backups/{APP}", json={"scope": "global"})
    assert taken.status_code == 200, taken.text
    backup = taken.json()
    assert backup["folders"] == [f"{APP}~bob-1"], backup
    assert (home / "backups/users/bob/global" / APP / backup["id"]).is_dir()
    listed = bob.get(f"/api/dist/backups/{APP}", params={"scope": "global"})
    assert listed.status_code == 200, listed.text
    assert [b["id"] for b in listed.json()] == [backup["id"]]
    history = bob.get(f"/api/dist/history/{APP}", params={"scope": "global"})
    assert [b["id"] for b in history.json()["backups"]] == [backup["id"]], history.text

    files["bob"].write_text("bob, later")
    restored = bob.post(f"/api/dist/restore/{APP}", json={"backup": backup["id"]})
    assert restored.status_code == 200, restored.text
    assert restored.json()["stopped"] == [f"{APP}~bob-1"], restored.text
    assert {u: f.read_text() for u, f in files.items()} == {u: u for u in files}

    # nobody else sees or restores bob's backup: as a missing one
    for other in (alice, admin):
        assert other.get(f"/api/dist/backups/{APP}").json() == []
        answer = other.post(f"/api/dist/restore/{APP}", json={"backup": backup["id"]})
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "not_found", answer.text
    # the admin's global backups are the bootstrap admin's data, as before
    theirs = admin.post(f"/api/dist/backups/{APP}", json={"scope": "global"})
    assert theirs.json()["folders"] == [f"{APP}-1"], theirs.text
    assert (
        bob.post(f"/api/dist/restore/{APP}", json={"backup": theirs.json()["id"]}).status_code
        == 404
    )
    mine = [b["id"] for b in bob.get(f"/api/dist/backups/{APP}").json()]
    assert backup["id"] in mine, mine
    assert theirs.json()["id"] not in mine, mine


def test_a_members_backup_stops_only_their_own_instances(
    users: dict[str, httpx.Client], home: Path
) -> None:
    written(home, users)
    before = {u: c.get("/api/instances").json() for u, c in users.items()}
    assert users["bob"].post(f"/api/dist/backups/{APP}").status_code == 200
    after = {u: c.get("/api/instances").json() for u, c in users.items()}
    for user in ("default", "alice"):  # the same process, never stopped
        assert [(i["state"], i["pid"]) for i in after[user]] == [
            ("started", i["pid"]) for i in before[user]
        ], user
    assert [i["state"] for i in after["bob"]] == ["started"]
    assert after["bob"][0]["pid"] != before["bob"][0]["pid"]


def test_a_member_exports_and_imports_their_own_data_of_a_global_app(
    users: dict[str, httpx.Client], home: Path
) -> None:
    files = written(home, users)
    bob = users["bob"]
    tree = users["default"].get(f"/api/dist/history/{APP}").json()["entries"]
    archive = bob.get(f"/api/dist/export/{APP}", params={"scope": "global"})
    assert archive.status_code == 200, archive.text
    assert data_of(archive.content) == {f"{APP}-1/notes.txt": b"bob"}
    # the tree goes in without the bootstrap admin's data folders that sit inside it
    assert b"default" not in b"".join(members(archive.content).values())
    alices = users["alice"].get(f"/api/dist/export/{APP}")
    assert data_of(alices.content) == {f"{APP}-1/notes.txt": b"alice"}

    files["bob"].write_text("bob, later")
    answer = bob.post(
        "/api/dist/import", params={"scope": "global", "autoApprove": "1"}, content=archive.content
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["ok"] is True, answer.text
    assert answer.json()["dataOnly"] is True, answer.text
    assert {u: f.read_text() for u, f in files.items()} == {u: u for u in files}
    # the later data was kept first, in bob's own backups
    kept = bob.get(f"/api/dist/backups/{APP}").json()
    assert [b["reason"] for b in kept][:1] == ["import"], kept
    # the tree is the admin's: nothing of the archive's went into it
    assert users["default"].get(f"/api/dist/history/{APP}").json()["entries"] == tree


def test_a_members_import_of_an_app_not_installed_globally_changes_nothing(
    users: dict[str, httpx.Client], home: Path
) -> None:
    written(home, users)
    archive = users["bob"].get(f"/api/dist/export/{APP}").content
    assert users["default"].delete(f"/api/dist/uninstall/{APP}").status_code == 200
    answer = users["bob"].post(
        "/api/dist/import", params={"scope": "global", "autoApprove": "1"}, content=archive
    )
    assert answer.status_code == 404, answer.text
    assert "nothing was changed" in answer.json()["error"]["message"], answer.text
    assert users["bob"].get(f"/api/apps/{APP}").status_code == 404


def test_the_global_tree_stays_the_admins(users: dict[str, httpx.Client]) -> None:
    """As before (a guard, not a defect): a member's data operations change no tree."""
    bob = users["bob"]
    for answer in (
        bob.post("/api/dist/rollback/" + APP, json={"scope": "global"}),
        bob.post(f"/api/dist/update/{APP}", json={}),
        bob.delete(f"/api/dist/uninstall/{APP}", params={"scope": "global"}),
    ):
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "permission_denied", answer.text


def test_doctor_checks_a_members_backups_of_a_shared_app(
    dist_shell: RunningShell, users: dict[str, httpx.Client], home: Path
) -> None:
    """They are walked as backups of the global scope holding that member's folders: an intact
    one is no problem (not taken for an app named `global`), a damaged one is named."""
    written(home, users)
    taken = users["bob"].post(f"/api/dist/backups/{APP}").json()
    users["bob"].close()
    dist_shell.stop()
    report = doctor(home)
    assert "backups/users/bob" not in report.stdout, report.stdout
    folder = home / "backups/users/bob/global" / APP / taken["id"]
    (folder / "data" / f"{APP}~bob-1" / "notes.txt").unlink()
    report = doctor(home)
    assert report.returncode == 1
    assert str(folder) in report.stdout, report.stdout
