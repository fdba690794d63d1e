"""The app registry over real directories: scanning, masking by priority, the watcher, problems."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for

pytestmark = pytest.mark.integration


def write_app(apps_dir: Path, app_id: str, **fields: Any) -> Path:
    """A minimal valid app directory (manifest + entrypoint) holding ``fields``."""
    app_dir = apps_dir / app_id
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "entrypoint.sh").write_text('#!/bin/sh\nexec python3 -m http.server "$OS_PORT"\n')
    manifest = {"id": app_id, "name": app_id.rsplit(".", 1)[-1], "version": "1.0.0", **fields}
    (app_dir / "app.manifest.json").write_text(json.dumps(manifest))
    return app_dir


def apps_by_id(api: httpx.Client) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in api.get("/api/apps").json() if not a["problems"]}


def test_the_bundled_system_app_is_listed(api: httpx.Client) -> None:
    notes = apps_by_id(api)["com.atrium.notes"]
    assert notes["scope"] == "system"
    assert notes["name"] == "Notes"
    assert notes["masks"] == []
    assert notes["problems"] == []
    assert notes["record"] is None
    assert notes["themeStrategy"] == "inherit"


def test_the_highest_scope_masks_the_others_at_start(
    start_shell: StartShell, home: Path, system_apps: Path
) -> None:
    write_app(system_apps, "com.example.multi", version="1.0.0")
    write_app(home / "scopes/global/apps", "com.example.multi", version="2.0.0")
    write_app(home / "scopes/users/default/apps", "com.example.multi", version="3.0.0")
    shell = start_shell()
    with shell.client() as api:
        app = apps_by_id(api)["com.example.multi"]
    assert (app["scope"], app["version"]) == ("user", "3.0.0")
    assert app["masks"] == ["global", "system"]


def test_removing_copies_by_hand_unmasks_the_next_scope(
    start_shell: StartShell, home: Path, system_apps: Path
) -> None:
    write_app(system_apps, "com.example.multi", version="1.0.0")
    write_app(home / "scopes/global/apps", "com.example.multi", version="2.0.0")
    user_copy = write_app(home / "scopes/users/default/apps", "com.example.multi", version="3.0.0")
    shell = start_shell()
    with shell.client() as api:
        events = SseReader(api, {"topics": "app:*"})
        shutil.rmtree(user_copy)
        wait_for(lambda: apps_by_id(api)["com.example.multi"]["scope"] == "global", "unmask global")
        shutil.rmtree(home / "scopes/global/apps/com.example.multi")
        wait_for(lambda: apps_by_id(api)["com.example.multi"]["scope"] == "system", "unmask system")
        shutil.rmtree(system_apps / "com.example.multi")
        wait_for(lambda: "com.example.multi" not in apps_by_id(api), "removal")
        events.wait(3)
    assert [(e.event, e.data.get("scope")) for e in events.events[:3]] == [
        ("app:installed", "global"),
        ("app:installed", "system"),
        ("app:removed", "system"),
    ]


def test_a_hand_copied_app_appears_and_is_announced_once(
    shell: RunningShell, api: httpx.Client, tmp_path: Path, home: Path
) -> None:
    source = write_app(tmp_path / "src", "com.example.dropped")
    events = SseReader(api, {"topics": "app:**"})
    shutil.copytree(source, home / "scopes/global/apps/com.example.dropped")
    app = wait_for(lambda: apps_by_id(api).get("com.example.dropped"), "the dropped-in app")
    assert app["scope"] == "global"
    events.wait(1)
    assert [e.data for e in events.events] == [
        {"type": "app:installed", "appId": "com.example.dropped", "scope": "global"}
    ]
    wait_for(lambda: shell.shell.registry.get("com.example.dropped") is not None, "registry")
    assert [e.data["appId"] for e in events.of("app:installed")] == ["com.example.dropped"]


def test_an_app_removed_by_hand_disappears(
    api: httpx.Client, home: Path, system_apps: Path
) -> None:
    events = SseReader(api, {"topics": "app:removed"})
    shutil.rmtree(system_apps / "com.atrium.notes")
    wait_for(lambda: "com.atrium.notes" not in apps_by_id(api), "the removal")
    events.wait(1)
    assert events.events[0].data == {
        "type": "app:removed",
        "appId": "com.atrium.notes",
        "scope": "system",
    }


def test_an_invalid_manifest_is_a_problem_and_never_masks_a_valid_copy(
    start_shell: StartShell, home: Path, system_apps: Path
) -> None:
    user_apps = home / "scopes/users/default/apps"
    broken = write_app(user_apps, "com.atrium.notes")
    (broken / "app.manifest.json").write_text('{"id": "com.atrium.notes", "version": "one"}')
    shell = start_shell()
    with shell.client() as api:
        items = api.get("/api/apps").json()
    visible = [a for a in items if a["id"] == "com.atrium.notes" and not a["problems"]]
    invalid = [a for a in items if a["id"] == "com.atrium.notes" and a["problems"]]
    assert visible[0]["scope"] == "system"
    assert invalid[0]["scope"] == "user"
    assert {p["field"] for p in invalid[0]["problems"]} == {"version", "name"}


def test_junk_in_a_scope_directory_is_reported_or_ignored_never_fatal(
    start_shell: StartShell, home: Path
) -> None:
    apps_dir = home / "scopes/global/apps"
    apps_dir.mkdir(parents=True)
    (apps_dir / "README.txt").write_text("not an app")
    (apps_dir / ".hidden").mkdir()
    (apps_dir / "empty-dir").mkdir()
    bad_json = apps_dir / "com.example.badjson"
    bad_json.mkdir()
    (bad_json / "app.manifest.json").write_bytes(b"{not json")
    binary = apps_dir / "com.example.binary"
    binary.mkdir()
    (binary / "app.manifest.json").write_bytes(b"\xff\xfe\x00garbage")
    mismatch = write_app(apps_dir, "com.example.mismatch")
    manifest = json.loads((mismatch / "app.manifest.json").read_text())
    (mismatch / "app.manifest.json").write_text(json.dumps({**manifest, "id": "com.example.other"}))
    no_entry = write_app(apps_dir, "com.example.noentry")
    (no_entry / "entrypoint.sh").unlink()
    shell = start_shell()
    with shell.client() as api:
        problems = {a["id"]: a["problems"] for a in api.get("/api/apps").json() if a["problems"]}
    assert set(problems) == {
        "empty-dir",
        "com.example.badjson",
        "com.example.binary",
        "com.example.mismatch",
        "com.example.noentry",
    }
    assert "missing" in problems["empty-dir"][0]["message"]
    assert "unreadable" in problems["com.example.badjson"][0]["message"]
    assert problems["com.example.mismatch"] == [
        {
            "field": "id",
            "message": "id 'com.example.other' must equal the directory name 'com.example.mismatch'",
        }
    ]
    assert problems["com.example.noentry"][0]["field"] == "entrypoint"


def test_a_fixed_manifest_makes_the_app_visible(api: httpx.Client, home: Path) -> None:
    app_dir = write_app(home / "scopes/user-less", "com.example.fixme")
    target = home / "scopes/global/apps/com.example.fixme"
    shutil.copytree(app_dir, target)
    (target / "app.manifest.json").write_text('{"id": "com.example.fixme"}')
    wait_for(
        lambda: any(
            a["id"] == "com.example.fixme" and a["problems"] for a in api.get("/api/apps").json()
        ),
        "the problem entry",
    )
    (target / "app.manifest.json").write_text(
        json.dumps({"id": "com.example.fixme", "name": "Fix", "version": "1.0.0"})
    )
    wait_for(lambda: "com.example.fixme" in apps_by_id(api), "the fixed app")


def test_runtime_data_written_inside_an_app_directory_changes_nothing(
    shell: RunningShell, api: httpx.Client, home: Path
) -> None:
    write_app(home / "scopes/global/apps", "com.example.busy")
    wait_for(lambda: "com.example.busy" in apps_by_id(api), "the app")
    events = SseReader(api, {"topics": "app:*"})
    data = home / "scopes/global/apps/com.example.busy/com.example.busy-1"
    data.mkdir()
    for n in range(50):
        (data / f"f{n}").write_text("x")
    marker = home / "scopes/global/apps/com.example.later"
    write_app(marker.parent, marker.name)
    wait_for(lambda: "com.example.later" in apps_by_id(api), "a later app")
    events.wait(1)
    assert [e.data["appId"] for e in events.events] == ["com.example.later"]


def test_get_one_app_shows_its_manifest(api: httpx.Client) -> None:
    body = api.get("/api/apps/com.atrium.notes").json()
    assert body["manifest"]["dataProvider"]["authority"] == "notes"
    missing = api.get("/api/apps/com.example.none")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
