"""`atrium doctor --repair` through the real CLI on homes a real `atrium serve` left damaged
(issue 14): an unreadable journal at each kind of step, uncommitted changes, a record without its
app, a damaged KV file, a running shell, a stray process. Repair must bring the home to a state
the shell accepts, put runtime data back, and delete nothing (what it sets aside is in
``lost+found/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import StartShell, serving
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest
from tests.integration.distribution.test_crash import (  # crash: the fixture
    APP,
    DEADLINE,
    Served,
    assert_clean,
    crash,  # noqa: F401
    git,
    killed_during,
)
from tests.integration.test_storage import _damage, _fill_kv, _page_of

pytestmark = pytest.mark.integration


def doctor(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atrium", "doctor", *args],
        env={**os.environ, "ATRIUM_HOME": str(home)},
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lost_found(home: Path) -> list[Path]:
    root = home / "lost+found"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def _killed_with_unreadable_journal(
    op: str,
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> Path:
    """v1 installed with runtime data, an update to v2 (or an uninstall) killed at ``step``, its
    journal torn."""
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
    if op == "update":
        killed_during(crash[-1], "POST", f"/api/dist/update/{APP}", json={})
    else:
        killed_during(crash[-1], "DELETE", f"/api/dist/uninstall/{APP}")
    (journal,) = (home / "scopes/global/.journal").glob("*.json")
    journal.write_bytes(journal.read_bytes()[:40])
    return source


@pytest.mark.parametrize(
    ("op", "step"),
    [("update", "data"), ("update", "swapped"), ("update", "record"), ("uninstall", "removed")],
)
def test_repair_after_an_unreadable_journal_puts_data_back_and_the_scope_works(
    op: str,
    step: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    source = _killed_with_unreadable_journal(
        op, step, start_shell, make_app, home, system_apps, crash
    )
    scope = home / "scopes/global"
    # a shell started (and stopped) on it quarantines the staging: the state doctor meets
    quarantine = start_shell(runner="process")
    with quarantine.client(timeout=DEADLINE) as api:
        refused = api.post("/api/dist/install", json={"ref": f"local:{source}"})
        assert refused.json()["error"]["code"] == "scope_needs_repair"
    quarantine.stop()
    assert doctor(home).returncode == 1

    repaired = doctor(home, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "nothing to repair" in repaired.stdout
    assert "unreadable journal" in repaired.stdout
    if step in ("data", "removed"):
        assert f"runtime data {APP}-1 put back" in repaired.stdout
    # back at the last commit: v1, its record, its data; nothing left pending; git clean
    app_dir = scope / "apps" / APP
    assert json.loads((app_dir / "app.manifest.json").read_text())["version"] == "1.0.0"
    assert json.loads((scope / "records" / f"{APP}.json").read_text())["version"] == "1.0.0"
    assert (app_dir / f"{APP}-1" / "data.txt").read_text() == "precious"
    assert list((scope / ".journal").iterdir()) == []
    assert_clean(home)
    # what was set aside is kept, not deleted: the torn journal and (after the swap) the v2 files
    kept = lost_found(home)
    assert any(p.name.endswith(".unreadable") for p in kept), kept
    if op == "update" and step != "data":
        assert any(p.name == "app.manifest.json" and '"2.0.0"' in p.read_text() for p in kept), kept

    again = start_shell(runner="process")
    with again.client(timeout=DEADLINE) as api:
        updated = api.post(f"/api/dist/update/{APP}", json={})
        assert updated.status_code == 200, updated.text
        assert updated.json()["record"]["version"] == "2.0.0"
    again.stop()
    assert (app_dir / f"{APP}-1" / "data.txt").read_text() == "precious"


def test_repair_refuses_while_a_shell_holds_the_home_and_changes_nothing(
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    _killed_with_unreadable_journal(
        "update", "data", start_shell, make_app, home, system_apps, crash
    )
    with serving(home, ATRIUM_SYSTEM_APPS=str(system_apps)) as running:
        journals = sorted((home / "scopes/global/.journal").iterdir())
        staging = sorted((home / "scopes/global/.staging").iterdir())
        refused = doctor(home, "--repair")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"is in use by the shell at {running.url} (pid {running.proc.pid})" in refused.stderr
        assert sorted((home / "scopes/global/.journal").iterdir()) == journals
        assert sorted((home / "scopes/global/.staging").iterdir()) == staging
        assert not (home / "lost+found").exists()


def test_repair_sets_uncommitted_changes_aside_and_keeps_apps_placed_by_hand(
    start_shell: StartShell, make_app: MakeApp, home: Path
) -> None:
    source = make_app(APP)
    other = make_app("com.example.gone")
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
        installed_ok(api, f"local:{other}")
    setup.stop()
    scope = home / "scopes/global"
    server = scope / "apps" / APP / "server.py"
    original = server.read_text()
    server.write_text(original + "\n# edited by hand\n")
    (scope / "records" / "com.example.stray.json").write_text('{"id": "stray"}')
    by_hand = make_app("com.example.byhand", root=scope / "apps")
    # a committed record whose app folder went missing (removed by hand, then committed)
    subprocess.run(["git", "rm", "-rq", "apps/com.example.gone"], cwd=scope, check=True)
    subprocess.run(["git", "commit", "-qm", "by hand"], cwd=scope, check=True)

    report = doctor(home)
    assert report.returncode == 1
    assert "com.example.byhand" not in report.stdout  # placed by hand is not a problem
    assert f"install record {scope / 'records/com.example.gone.json'} but no app folder" in (
        report.stdout
    )

    repaired = doctor(home, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert server.read_text() == original
    assert not (scope / "records/com.example.stray.json").exists()
    assert not (scope / "records/com.example.gone.json").exists()
    assert (by_hand / "app.manifest.json").is_file()
    assert git(home, "status", "--porcelain") == "?? apps/com.example.byhand/\n"
    kept = {p.name: p.read_text() for p in lost_found(home)}
    assert kept["server.py"].endswith("# edited by hand\n")
    assert kept["com.example.stray.json"] == '{"id": "stray"}'
    assert json.loads(kept["com.example.gone.json"])["id"] == "com.example.gone"

    again = start_shell(runner="process")
    with again.client(timeout=DEADLINE) as api:
        ids = {a["id"] for a in api.get("/api/apps").json()}
        assert {APP, "com.example.byhand"} <= ids
        assert "com.example.gone" not in ids
    again.stop()


def test_repair_rebuilds_a_damaged_kv_file_from_its_readable_rows(tmp_path: Path) -> None:
    """The KV rows live in the state database: its file is rebuilt, every table kept."""
    home = tmp_path / "home"
    values = _fill_kv(home, 300, 200)
    kv = home / "state.sqlite3"
    _damage(kv, _page_of(kv, values["k0150"].encode()))
    damaged = kv.read_bytes()
    report = doctor(home)
    assert report.returncode == 1
    assert f"KV database {kv}" in report.stdout

    repaired = doctor(home, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    (aside,) = (
        p for p in home.glob("state.sqlite3.damaged-*") if p.name[-4:] not in ("-wal", "-shm")
    )
    assert aside.read_bytes() == damaged  # the original is kept as it was
    assert f"original kept as {aside}" in repaired.stdout
    with serving(home) as served, served.client() as api:
        readable = {}
        for key in values:
            response = api.get(f"/api/kv/os/{key}")
            assert response.status_code in (200, 404), response.text
            if response.status_code == 200:
                readable[key] = response.json()["value"]
        assert readable == {k: values[k] for k in readable}  # never a wrong value
        assert len(readable) >= 280, len(readable)  # one damaged page loses a few rows at most
        assert api.put("/api/kv/os/after", json={"value": "written"}).status_code == 200


def test_doctor_reports_a_process_left_running_from_the_home(
    start_shell: StartShell, home: Path
) -> None:
    start_shell(runner="process").stop()
    folder = home / "scopes/global/apps"
    stray = subprocess.Popen(["sleep", "60"], cwd=folder)
    try:
        report = doctor(home)
        assert report.returncode == 1
        assert f"process {stray.pid} still runs from" in report.stdout
        assert "sleep 60" in report.stdout
        # while a shell holds the home, its processes are its own: not reported
        with serving(home):
            assert f"process {stray.pid}" not in doctor(home).stdout
    finally:
        stray.kill()
        stray.wait()
