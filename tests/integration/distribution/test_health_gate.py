"""Health-gated update (docs/api.md "Health-gated update"): the staged version must start before
the switch; a version that does not start is not installed and the old one keeps running."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell
from tests.integration.distribution.conftest import MakeApp, installed_ok, sse, write_manifest

pytestmark = pytest.mark.integration
APP = "com.example.gated"
BROKEN = [
    "python3",
    "-c",
    "import sys; print('boom: cannot read my config', file=sys.stderr); sys.exit(3)",
]


def git(home: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=home / "scopes/global", check=True, capture_output=True, text=True
    ).stdout


def running_v1(api: httpx.Client, make_app: MakeApp) -> tuple[Path, str]:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    instance = api.post("/api/instances", json={"appId": APP}).json()
    assert instance["state"] == "started"
    return source, instance["instanceId"]


def test_a_version_that_does_not_start_is_not_installed(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    source, instance = running_v1(api, make_app)
    pid = api.get(f"/api/instances/{instance}").json()["pid"]
    head = git(home, "rev-parse", "HEAD")
    write_manifest(source, version="2.0.0", entrypoint=BROKEN)
    events = sse(api, "POST", f"/api/dist/update/{APP}", json={})
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["check.start", "error"]
    error = events[-1]
    assert error["code"] == "install_failed"
    assert "version 2.0.0 did not start, the old version stays" in error["message"]
    assert "boom: cannot read my config" in error["message"]  # the app's own last log lines
    # nothing moved: the old instance runs on, disk, record and repository at 1.0.0
    still = api.get(f"/api/instances/{instance}").json()
    assert (still["state"], still["pid"]) == ("started", pid)
    app_dir = home / "scopes/global/apps" / APP
    assert json.loads((app_dir / "app.manifest.json").read_text())["version"] == "1.0.0"
    record = json.loads((home / "scopes/global/records" / f"{APP}.json").read_text())
    assert record["version"] == "1.0.0"
    assert git(home, "rev-parse", "HEAD") == head
    assert git(home, "status", "--porcelain") == ""
    assert [i["instanceId"] for i in api.get("/api/instances").json()] == [instance]
    assert list((home / "scopes/global/.staging").iterdir()) == []


def test_a_version_that_starts_is_switched_to_after_the_check(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    source, instance = running_v1(api, make_app)
    write_manifest(source, version="2.0.0")
    events = sse(api, "POST", f"/api/dist/update/{APP}", json={})
    kinds = [e["type"] for e in events]
    assert kinds.index("check.start") < kinds.index("check.done") < kinds.index("install.start")
    assert next(e for e in events if e["type"] == "check.done")["ms"] > 0
    assert events[-1]["type"] == "result"
    assert events[-1]["record"]["version"] == "2.0.0"
    assert dist_shell.shell.lifecycle.get(instance).manifest.version == "2.0.0"
    assert [i["instanceId"] for i in api.get("/api/instances").json()] == [instance]


def test_the_check_runs_when_running_or_asked(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    write_manifest(source, version="2.0.0")
    quiet = sse(api, "POST", f"/api/dist/update/{APP}", json={})
    assert "check.start" not in [e["type"] for e in quiet]  # nothing runs: nothing to protect
    write_manifest(source, version="3.0.0", entrypoint=BROKEN)
    asked = sse(api, "POST", f"/api/dist/update/{APP}", json={"check": True})
    assert [e["type"] for e in asked][-2:] == ["check.start", "error"]
    record = json.loads((home / "scopes/global/records" / f"{APP}.json").read_text())
    assert record["version"] == "2.0.0"
