"""Installs from local directories on the real shell: records, commits, scopes, refusals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader, wait_for
from tests.integration.distribution.conftest import MakeApp, app_listing, install, installed_ok

pytestmark = pytest.mark.integration


def scope_log(home: Path, scope_dir: str) -> list[str]:
    out = subprocess.run(
        ["git", "log", "--format=%s"],
        cwd=home / scope_dir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def scope_status(home: Path, scope_dir: str) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"],
        cwd=home / scope_dir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_a_local_install_places_the_app_writes_its_record_and_commits_once(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    source = make_app("com.example.hello")
    (source / ".git").mkdir()  # never part of an app tree
    events = SseReader(api, params={"topics": "dist:**,app:installed"})
    answer = installed_ok(api, f"local:{source}")
    record = answer["record"]
    target = home / "scopes/global/apps/com.example.hello"
    assert record["id"] == "com.example.hello"
    assert record["version"] == "1.0.0"
    assert record["scope"] == "global"
    assert record["source"] == "local"
    assert record["ref"] == f"local:{source}"
    assert record["digest"].startswith("sha256:")
    assert record["channel"] is None
    assert record["installedAt"] == record["updatedAt"]
    assert record["path"] == str(target)
    assert [e["type"] for e in answer["events"]] == [
        "resolve.start",
        "resolve.done",
        "fetch.start",
        "fetch.done",
        "validate.done",
        "install.start",
        "install.done",
    ]
    assert (target / "server.py").is_file()
    assert not (target / ".git").exists()
    stored = json.loads((home / "scopes/global/records/com.example.hello.json").read_text())
    assert stored == record
    # the answer comes once GET /api/apps reflects it
    listed = app_listing(api, "com.example.hello")
    assert listed is not None
    assert (listed["scope"], listed["record"]) == ("global", record)
    assert api.get("/api/dist/installed").json() == [record]
    assert scope_log(home, "scopes/global") == [
        f"install com.example.hello 1.0.0 (local:{source})",
        "baseline: Atrium scope",
    ]
    assert scope_status(home, "scopes/global") == ""
    assert not list((home / "scopes/global/.staging").iterdir())
    events.wait(2)
    assert events.of("dist:install.complete")[0].data["id"] == "com.example.hello"
    assert events.of("dist:install.complete")[0].data["record"] == record
    wait_for(lambda: events.of("app:installed"), "app:installed")
    assert events.of("app:installed")[0].data["appId"] == "com.example.hello"


def test_an_invalid_manifest_is_422_listing_every_problem_and_nothing_is_installed(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app("com.example.broken", version="one", tools=[1], id="com.example.other")
    (source / "com.example.broken-1").mkdir()
    response = install(api, f"local:{source}")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_manifest"
    fields = [p["field"] for p in error["problems"]]
    assert fields == ["version", "tools[0]", "id", "(files)"]
    assert "must equal the directory name 'com.example.broken'" in error["message"]
    assert not (home / "scopes/global/apps/com.example.broken").exists()
    assert not list((home / "scopes/global/.staging").iterdir())
    assert scope_log(home, "scopes/global") == ["baseline: Atrium scope"]


def test_an_authority_declared_by_another_visible_app_is_409(
    api: httpx.Client, make_app: MakeApp
) -> None:
    provider = {"authority": "notes", "providers": [{"path": "/mine"}]}
    source = make_app("com.example.clash", dataProvider=provider)
    response = install(api, f"local:{source}", autoApprove=True)
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["authority"], error["appId"]) == (
        "authority_conflict",
        "notes",
        "com.atrium.notes",
    )
    assert app_listing(api, "com.example.clash") is None


def test_the_system_scope_is_refused(api: httpx.Client, make_app: MakeApp) -> None:
    source = make_app("com.example.hello")
    response = install(api, f"local:{source}", scope="system")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "system_scope_immutable"
    removal = api.delete("/api/dist/uninstall/com.atrium.notes")
    assert removal.status_code == 403
    assert removal.json()["error"]["code"] == "system_scope_immutable"
    removal = api.delete("/api/dist/uninstall/com.atrium.notes", params={"scope": "system"})
    assert removal.status_code == 403


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"ref": "ftp://x.example/y"}, 400, "bad_ref"),
        ({"ref": "local:relative"}, 400, "bad_ref"),
        ({"ref": "local:/nonexistent/com.example.gone"}, 502, "fetch_failed"),
        ({"ref": "com.example.hello", "scope": "everywhere"}, 400, "bad_request"),
        ({"ref": "com.example.hello"}, 404, "not_found"),
        ({"reff": "x"}, 400, "bad_request"),
    ],
)
def test_bad_requests_answer_a_clear_error(
    api: httpx.Client, body: dict[str, str], status: int, code: str
) -> None:
    response = api.post("/api/dist/install", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    if code == "bad_ref":
        assert body["ref"] in error["message"]
    if code == "not_found":
        assert "ATRIUM_INDEX_URL" in error["message"]


def test_a_link_leaving_the_source_directory_is_fetch_failed(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app("com.example.sneaky")
    (source / "secrets").symlink_to("/etc")
    response = install(api, f"local:{source}")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "fetch_failed"
    assert "secrets is a symlink to the absolute path '/etc'" in response.json()["error"]["message"]
    assert not (home / "scopes/global/apps/com.example.sneaky").exists()


def test_only_the_user_may_install(dist_shell: RunningShell) -> None:
    with dist_shell.anonymous() as anonymous:
        assert anonymous.post("/api/dist/install", json={"ref": "x.y"}).status_code == 401
        assert anonymous.get("/api/dist/installed").status_code == 401


def test_install_into_user_masks_global_and_uninstall_unmasks_it(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    global_src = make_app("com.example.twice", root=home.parent / "g", version="1.0.0")
    user_src = make_app("com.example.twice", root=home.parent / "u", version="2.0.0")
    installed_ok(api, f"local:{global_src}")
    installed_ok(api, f"local:{user_src}", scope="user")
    listed = app_listing(api, "com.example.twice")
    assert listed is not None
    assert (listed["scope"], listed["version"], listed["masks"]) == ("user", "2.0.0", ["global"])
    assert listed["record"]["scope"] == "user"
    scopes = {r["scope"] for r in api.get("/api/dist/installed").json()}
    assert scopes == {"user", "global"}

    events = SseReader(api, params={"topics": "app:*,dist:**"})
    answer = api.delete("/api/dist/uninstall/com.example.twice")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "ok": True,
        "id": "com.example.twice",
        "scope": "user",
        "unmasked": "global",
    }
    listed = app_listing(api, "com.example.twice")
    assert listed is not None
    assert (listed["scope"], listed["version"], listed["masks"]) == ("global", "1.0.0", [])
    assert not (home / "scopes/users/default/apps/com.example.twice").exists()
    assert not (home / "scopes/users/default/records/com.example.twice.json").exists()
    assert scope_log(home, "scopes/users/default")[0] == "uninstall com.example.twice 2.0.0"
    assert scope_status(home, "scopes/users/default") == ""
    events.wait(3)
    removed = events.of("app:removed")[0].data
    assert (removed["appId"], removed["scope"]) == ("com.example.twice", "user")
    unmasked = events.of("app:installed")[0].data
    assert (unmasked["appId"], unmasked["scope"]) == ("com.example.twice", "global")
    done = events.of("dist:uninstall.complete")[0].data
    assert (done["id"], done["scope"], done["unmasked"]) == ("com.example.twice", "user", "global")

    final = api.delete("/api/dist/uninstall/com.example.twice", params={"scope": "global"})
    assert final.json()["unmasked"] is None
    assert app_listing(api, "com.example.twice") is None
    missing = api.delete("/api/dist/uninstall/com.example.twice")
    assert missing.status_code == 404


def test_installing_over_an_existing_copy_keeps_installed_at(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app("com.example.again")
    first = installed_ok(api, f"local:{source}")["record"]
    (source / "extra.txt").write_text("more")
    second = installed_ok(api, f"local:{source}")["record"]
    assert second["installedAt"] == first["installedAt"]
    assert second["digest"] != first["digest"]
    assert (home / "scopes/global/apps/com.example.again/extra.txt").read_text() == "more"
    assert len(scope_log(home, "scopes/global")) == 3
