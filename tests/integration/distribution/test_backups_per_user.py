"""A user-scope app's backups belong to the user whose scope it is (docs/api.md "Backups"):
another user lists, sees in history and restores none of them, and backs up and restores their
own copy's data. Real shell, two users."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration
APP = "com.example.mine"
#: an app id nobody has: what B's answers about A's app must look like
NONE = "com.example.none"
BOB = "bob"


def launched(client: httpx.Client) -> str:
    answer = client.post("/api/instances", json={"appId": APP, "new": True})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["instanceId"])


def shape(answer: httpx.Response) -> tuple[int, object]:
    """Status and error code, or the body without the app id it echoes."""
    body = answer.json()
    if isinstance(body, dict):
        body.pop("id", None)
    return answer.status_code, body["error"]["code"] if "error" in body else body


def test_a_user_scope_backup_is_its_user_s_own(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    source = make_app(APP)
    installed_ok(api, f"local:{source}", scope="user")
    alices = home / "scopes/users/default/apps" / APP / launched(api) / "notes.txt"
    alices.write_text("alice")
    mine = api.post(f"/api/dist/backups/{APP}", json={"scope": "user"})
    assert mine.status_code == 200, mine.text
    a_id = mine.json()["id"]
    assert (home / "backups/user" / APP / a_id / "data").is_dir()  # where it always was

    # B an admin (a path install is an admin's): another admin's user scope is still not B's
    with dist_shell.client(dist_shell.add_user(BOB, role="admin")) as bob:
        for path in ("/api/dist/backups/{}?scope=user", "/api/dist/history/{}?scope=user"):
            theirs, none = bob.get(path.format(APP)), bob.get(path.format(NONE))
            assert a_id not in theirs.text
            assert shape(theirs) == shape(none)
        body = {"backup": a_id, "scope": "user"}
        theirs = bob.post(f"/api/dist/restore/{APP}", json=body)
        none = bob.post(f"/api/dist/restore/{NONE}", json=body)
        assert theirs.status_code < 500, theirs.text
        assert shape(theirs) == shape(none)
        assert alices.read_text() == "alice"

        # B's own copy of the same app: B's backups, B's data back
        installed_ok(bob, f"local:{source}", scope="user")
        bobs = home / "scopes/users" / BOB / "runtime/user" / APP / launched(bob) / "notes.txt"
        bobs.write_text("bob")
        taken = bob.post(f"/api/dist/backups/{APP}", json={"scope": "user"})
        assert taken.status_code == 200, taken.text
        b_id = taken.json()["id"]
        assert [b["id"] for b in bob.get(f"/api/dist/backups/{APP}?scope=user").json()] == [b_id]
        listed = bob.get(f"/api/dist/history/{APP}?scope=user").json()["backups"]
        assert [b["id"] for b in listed] == [b_id]
        restored = bob.post(f"/api/dist/restore/{APP}", json=body)
        assert restored.status_code == 404, restored.text  # A's id is no backup of B's
        bobs.write_text("changed")
        restored = bob.post(f"/api/dist/restore/{APP}", json={"backup": b_id, "scope": "user"})
        assert restored.status_code == 200, restored.text
        assert bobs.read_text() == "bob"
    assert alices.read_text() == "alice"
    assert [b["id"] for b in api.get(f"/api/dist/backups/{APP}?scope=user").json()] == [a_id]
    # a deleted user's backups go to lost+found with their scope: a reused id starts with none
    assert api.delete(f"/api/users/{BOB}").status_code == 200
    assert not (home / "backups/users" / BOB).exists()
    [aside] = (home / "lost+found/users").iterdir()
    assert (aside / "backups" / APP / b_id / "backup.json").is_file()
