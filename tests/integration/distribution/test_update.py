"""Updates (re-resolving the recorded ref) with running instances, and one operation per app."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TESTS_DIR
from tests.integration.conftest import RunningShell, SseReader, wait_for
from tests.integration.distribution.conftest import MakeApp, install, installed_ok, write_manifest

pytestmark = pytest.mark.integration
APP = "com.example.updated"


def launch(api: httpx.Client, app_id: str) -> dict[str, Any]:
    response = api.post("/api/instances", json={"appId": app_id, "new": True})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_an_update_with_the_same_digest_is_a_no_op(
    api: httpx.Client, make_app: MakeApp, dist_shell: RunningShell, home: Path
) -> None:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    events = SseReader(api, params={"topics": "dist:**"})
    response = api.post(f"/api/dist/update/{APP}")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["ok"], answer["record"], answer["upToDate"]) == (True, None, True)
    wait_for(lambda: events.of("dist:update.complete"), "dist:update.complete")
    assert [e.event for e in events.events] == ["dist:update.complete"]  # not the install's
    assert events.of("dist:update.complete")[0].data == {
        "id": APP,
        "record": None,
        "type": "dist:update.complete",
    }
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=home / "scopes/global", capture_output=True, text=True
    ).stdout.splitlines()
    assert len(log) == 2  # the install and the baseline: no commit for a no-op


def test_an_update_with_the_same_digest_over_a_damaged_tree_installs_it_again(
    api: httpx.Client, make_app: MakeApp, dist_shell: RunningShell, home: Path
) -> None:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    app_dir = home / "scopes/global/apps" / APP
    data = app_dir / f"{APP}-1"
    data.mkdir()
    (data / "kept.txt").write_text("precious")
    server = (app_dir / "server.py").read_text()
    (app_dir / "server.py").write_text("damaged")
    (app_dir / "app.manifest.json").chmod(0o755)  # the executable bit counts too (git's view)
    response = api.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["ok"] is True, answer
    assert "upToDate" not in answer
    assert answer["restored"] == [f"apps/{APP}/app.manifest.json", f"apps/{APP}/server.py"]
    assert answer["record"]["version"] == "1.0.0"
    assert (app_dir / "server.py").read_text() == server
    assert (data / "kept.txt").read_text() == "precious"
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=home / "scopes/global", capture_output=True, text=True
    ).stdout
    assert status == ""
    # and now it is up to date again
    assert api.post(f"/api/dist/update/{APP}").json()["upToDate"] is True


def test_a_real_update_adding_a_permission_keeps_data_and_restarts_instances(
    api: httpx.Client, make_app: MakeApp, dist_shell: RunningShell, home: Path
) -> None:
    source = make_app(APP)
    first = installed_ok(api, f"local:{source}")["record"]
    instance = launch(api, APP)
    data = home / "scopes/global/apps" / APP / instance["instanceId"]
    wait_for(data.is_dir, "the instance's runtime data directory")
    (data / "kept.txt").write_text("precious")
    write_manifest(source, version="1.1.0", permissions=["com.atrium.notes.read"])

    needs = api.post(f"/api/dist/update/{APP}", json={})
    assert needs.json()["needsApproval"] is True
    assert needs.json()["diff"]["versionFrom"] == "1.0.0"
    assert needs.json()["diff"]["permissionsAdded"] == ["com.atrium.notes.read"]
    assert api.get(f"/api/instances/{instance['instanceId']}").json()["pid"] == instance["pid"]

    events = SseReader(api, params={"topics": "dist:**"})
    answer = api.post(f"/api/dist/update/{APP}", json={"autoApprove": True}).json()
    assert answer["ok"] is True
    record = answer["record"]
    assert record["version"] == "1.1.0"
    assert record["installedAt"] == first["installedAt"]
    assert record["digest"] != first["digest"]
    assert (data / "kept.txt").read_text() == "precious"
    restarted = api.get(f"/api/instances/{instance['instanceId']}").json()
    assert restarted["state"] == "started"
    assert restarted["pid"] != instance["pid"]
    live = dist_shell.shell.lifecycle.get(instance["instanceId"])
    assert live.manifest.version == "1.1.0"
    events.wait(1)
    assert events.of("dist:update.complete")[0].data["record"] == record
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=home / "scopes/global", capture_output=True, text=True
    ).stdout.splitlines()
    assert log[0] == f"update {APP} 1.1.0 (local:{source})"
    assert len(log) == 3


def test_updating_an_app_without_a_record_or_a_system_app_is_refused(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    make_app("com.example.byhand", root=home / "scopes/global/apps")
    wait_for(lambda: dist_shell.shell.registry.get("com.example.byhand"), "the hand-placed app")
    by_hand = api.post("/api/dist/update/com.example.byhand")
    assert by_hand.status_code == 404
    assert by_hand.json()["error"]["kind"] == "install record"
    system = api.post("/api/dist/update/com.atrium.notes")
    assert system.status_code == 403
    assert api.post("/api/dist/update/com.example.nothing").status_code == 404
    assert api.post("/api/dist/update/Not-An-Id").status_code == 400


def test_a_second_operation_on_the_same_app_is_409_busy(
    api: httpx.Client, dist_shell: RunningShell, home: Path, tmp_path: Path
) -> None:
    app_id = "test.fault.hookblocks"
    source = tmp_path / "src" / app_id
    shutil.copytree(TESTS_DIR / "apps" / app_id, source)
    installed_ok(api, f"local:{source}")
    instance = launch(api, app_id)
    gate = home / "scopes/global/apps" / app_id / instance["instanceId"] / "block-onStop"
    gate.write_text("")
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(install(api, f"local:{source}")))
    worker.start()
    try:
        wait_for(lambda: dist_shell.shell.dist.locks.is_held(app_id), "the first install")
        second = install(api, f"local:{source}")
        assert second.status_code == 409
        error = second.json()["error"]
        assert (error["code"], error["appId"], error["operation"]) == ("busy", app_id, "install")
        assert api.delete(f"/api/dist/uninstall/{app_id}").status_code == 409
        assert api.post(f"/api/dist/update/{app_id}").status_code == 409
    finally:
        gate.unlink()
        worker.join(timeout=60)
    assert first[0].status_code == 200, first[0].text
    assert first[0].json()["ok"] is True
    assert api.get(f"/api/instances/{instance['instanceId']}").json()["state"] == "started"


def test_uninstall_stops_the_instances_and_removes_their_data(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    instance = launch(api, APP)
    data = home / "scopes/global/apps" / APP / instance["instanceId"]
    wait_for(data.is_dir, "the instance's runtime data directory")
    assert api.delete(f"/api/dist/uninstall/{APP}").json()["unmasked"] is None
    assert api.get(f"/api/instances/{instance['instanceId']}").status_code == 404
    assert not data.exists()


def test_a_masking_install_restarts_running_instances_on_the_new_copy(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    installed_ok(api, f"local:{make_app(APP, root=home.parent / 'g')}")
    instance = launch(api, APP)
    installed_ok(
        api, f"local:{make_app(APP, root=home.parent / 'u', version='3.0.0')}", scope="user"
    )
    restarted = api.get(f"/api/instances/{instance['instanceId']}").json()
    assert (restarted["scope"], restarted["state"]) == ("user", "started")
    assert dist_shell.shell.lifecycle.get(instance["instanceId"]).manifest.version == "3.0.0"


def test_an_update_brings_each_instance_back_under_its_own_id_and_data(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    first = api.post("/api/instances", json={"appId": APP, "new": True}).json()["instanceId"]
    second = api.post("/api/instances", json={"appId": APP, "new": True}).json()["instanceId"]
    assert api.delete(f"/api/instances/{first}").status_code == 200
    data = home / "scopes/global/apps" / APP / second
    wait_for(data.is_dir, "the second instance's runtime data directory")
    (data / "mine.txt").write_text("second's")
    write_manifest(source, version="1.2.0")
    assert api.post(f"/api/dist/update/{APP}", json={"autoApprove": True}).json()["ok"] is True
    listed = [i["instanceId"] for i in api.get("/api/instances").json() if i["appId"] == APP]
    assert listed == [second]
    assert (data / "mine.txt").read_text() == "second's"
