"""Rollback and history (docs/api.md "Rollback"): a real shell, real installs, the scope's git."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader
from tests.integration.distribution.conftest import (
    MakeApp,
    installed_ok,
    operation_held,
    sse,
    write_manifest,
)

pytestmark = pytest.mark.integration
APP = "com.example.rolled"


def git(home: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=home / "scopes/global", check=True, capture_output=True, text=True
    ).stdout


def two_versions(api: httpx.Client, make_app: MakeApp) -> Path:
    """1.0.0 installed, then updated to 2.0.0, which adds a file and a permission."""
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    write_manifest(source, version="2.0.0", permissions=["com.example.extra"])
    (source / "added-in-2.txt").write_text("new")
    updated = api.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
    assert updated.json()["ok"] is True, updated.text
    return source


def test_rollback_puts_the_previous_version_back_with_its_data(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    two_versions(api, make_app)
    app_dir = home / "scopes/global/apps" / APP
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    (app_dir / instance / "data.txt").write_text("precious")
    events = SseReader(api, {"topics": "dist:**"})
    streamed = sse(api, "POST", f"/api/dist/rollback/{APP}", json={})
    assert [e["type"] for e in streamed] == [
        "rollback.start",
        "validate.done",
        "install.start",
        "install.done",
        "result",
    ]
    start, result = streamed[0], streamed[-1]
    installed_commit = git(home, "log", "--format=%H", "--", f"apps/{APP}").split()[-1]
    assert (start["from"], start["to"], start["commit"]) == ("2.0.0", "1.0.0", installed_commit)
    record = result["record"]
    assert (record["version"], record["rollbackOf"]) == ("1.0.0", "2.0.0")
    assert result["stopped"] == [instance]
    # the tree, its data, the record and one commit
    assert json.loads((app_dir / "app.manifest.json").read_text())["version"] == "1.0.0"
    assert not (app_dir / "added-in-2.txt").exists()
    assert (app_dir / instance / "data.txt").read_text() == "precious"
    on_disk = json.loads((home / "scopes/global/records" / f"{APP}.json").read_text())
    assert (on_disk["version"], on_disk["rollbackOf"]) == ("1.0.0", "2.0.0")
    assert git(home, "log", "-1", "--format=%s").strip() == (
        f"rollback {APP} 1.0.0 (from 2.0.0, {installed_commit[:12]})"
    )
    assert git(home, "status", "--porcelain") == ""
    # the instance runs again, on the old version
    again = api.get(f"/api/instances/{instance}").json()
    assert again["state"] == "started"
    assert dist_shell.shell.lifecycle.get(instance).manifest.version == "1.0.0"
    complete = [e for e in events.wait(1) if e.event == "dist:rollback.complete"]
    assert complete[0].data == {"id": APP, "record": record, "type": "dist:rollback.complete"}


def test_history_lists_every_operation_newest_first(api: httpx.Client, make_app: MakeApp) -> None:
    two_versions(api, make_app)
    assert api.post(f"/api/dist/rollback/{APP}", json={}).json()["ok"] is True
    history = api.get(f"/api/dist/history/{APP}").json()
    assert (history["id"], history["scope"], history["current"]) == (APP, "global", "1.0.0")
    rows = [(e["operation"], e["version"], e["rollbackOf"]) for e in history["entries"]]
    assert rows == [
        ("rollback", "1.0.0", "2.0.0"),
        ("update", "2.0.0", None),
        ("install", "1.0.0", None),
    ]
    # rolling back again (no `to`) goes to the version before the current one: 2.0.0
    again = api.post(f"/api/dist/rollback/{APP}", json={}).json()
    assert (again["record"]["version"], again["record"]["rollbackOf"]) == ("2.0.0", "1.0.0")


def test_to_picks_a_version_or_a_commit(api: httpx.Client, make_app: MakeApp, home: Path) -> None:
    source = two_versions(api, make_app)
    write_manifest(source, version="3.0.0", permissions=["com.example.extra"])
    assert api.post(f"/api/dist/update/{APP}", json={}).json()["ok"] is True
    by_version = api.post(f"/api/dist/rollback/{APP}", json={"to": "1.0.0"}).json()
    assert by_version["record"]["version"] == "1.0.0"
    update_commit = git(home, "log", "--format=%H", "--grep", "^update .* 2.0.0").split()[0]
    by_commit = api.post(f"/api/dist/rollback/{APP}", json={"to": update_commit[:10]}).json()
    assert (by_commit["record"]["version"], by_commit["commit"]) == ("2.0.0", update_commit)


def test_what_cannot_be_rolled_back_is_refused_and_changes_nothing(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    head = git(home, "rev-parse", "HEAD")
    nothing = api.post(f"/api/dist/rollback/{APP}")
    assert nothing.status_code == 404
    assert nothing.json()["error"]["kind"] == "earlier version"
    unknown = api.post(f"/api/dist/rollback/{APP}", json={"to": "9.9.9"})
    assert unknown.status_code == 404
    assert "9.9.9" in unknown.json()["error"]["message"]
    system = api.post("/api/dist/rollback/com.atrium.notes")
    assert system.status_code == 403
    assert system.json()["error"]["code"] == "system_scope_immutable"
    assert api.post("/api/dist/rollback/com.example.nothere").status_code == 404
    bad = api.post(f"/api/dist/rollback/{APP}", json={"to": ""})
    assert bad.status_code == 400
    with operation_held(dist_shell, APP):
        busy = api.post(f"/api/dist/rollback/{APP}", json={"to": "1.0.0"})
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "busy"
    assert git(home, "rev-parse", "HEAD") == head
    assert git(home, "status", "--porcelain") == ""
