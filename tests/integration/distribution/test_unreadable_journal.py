"""An unreadable install journal (issue 14 row 1): the real shell is killed during an update after
the app's runtime data moved into staging, the journal is truncated, and the restarted shell must
keep that data (quarantined), refuse to change the scope with a named error, and remove only the
provably-garbage temporary files of journal writes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_DIR
from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest
from tests.integration.distribution.test_crash import (  # crash: the fixture
    APP,
    DEADLINE,
    Served,
    crash,  # noqa: F401
    killed_during,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_an_unreadable_journal_quarantines_staging_and_the_scope_asks_for_repair(
    damage: str,
    start_shell: StartShell,
    make_app: MakeApp,
    home: Path,
    system_apps: Path,
    crash: list[Served],  # noqa: F811
) -> None:
    source = make_app(APP)
    setup = start_shell(runner="process")
    with setup.client(timeout=DEADLINE) as api:
        installed_ok(api, f"local:{source}")
    setup.stop()
    scope = home / "scopes/global"
    data = scope / "apps" / APP / f"{APP}-1"
    data.mkdir()
    (data / "data.txt").write_text("precious")
    write_manifest(source, version="2.0.0")

    crash.append(Served(home, system_apps, "data"))
    killed_during(crash[-1], "POST", f"/api/dist/update/{APP}", json={})

    (journal,) = (scope / ".journal").glob("*.json")
    op_id = journal.stem
    if damage == "truncate":
        journal.write_bytes(journal.read_bytes()[:40])
    else:  # still valid JSON, but not what was written: only a checksum tells
        journal.write_bytes(journal.read_bytes().replace(b'"data"', b'"swap"'))
    leftover = scope / ".journal" / f".{op_id}.json.tmp"
    leftover.write_bytes(b"{half")

    recovered = start_shell(runner="process")
    with recovered.client(timeout=DEADLINE) as api:
        quarantined = scope / ".staging" / f"{op_id}.quarantined"
        assert (quarantined / APP / f"{APP}-1" / "data.txt").read_text() == "precious"
        assert (scope / ".journal" / f"{op_id}.unreadable").is_file()
        assert not leftover.exists()
        for method, path, body in (
            ("POST", f"/api/dist/update/{APP}", {}),
            ("POST", "/api/dist/install", {"ref": f"local:{source}"}),
            ("DELETE", f"/api/dist/uninstall/{APP}", None),
        ):
            response = api.request(method, path, json=body)
            assert response.status_code == 409, (path, response.text)
            error = response.json()["error"]
            assert error["code"] == "scope_needs_repair"
            assert error["scope"] == "global"
            assert error["journals"] == [str(scope / ".journal" / f"{op_id}.unreadable")]
            assert ".quarantined" in error["message"]
    recovered.stop()

    report = doctor(home)
    assert report.returncode == 1, report.stdout + report.stderr
    assert f"unreadable journal {scope / '.journal' / f'{op_id}.unreadable'}" in report.stdout
    assert str(quarantined) in report.stdout

    # the way out the error names: data back by hand, journal and quarantined folder deleted
    (quarantined / APP / f"{APP}-1").rename(scope / "apps" / APP / f"{APP}-1")
    (scope / ".journal" / f"{op_id}.unreadable").unlink()
    shutil.rmtree(quarantined)
    again = start_shell(runner="process")
    with again.client(timeout=DEADLINE) as api:
        assert installed_ok(api, f"local:{source}")["record"]["version"] == "2.0.0"
    assert (scope / "apps" / APP / f"{APP}-1" / "data.txt").read_text() == "precious"
    again.stop()
    report = doctor(home)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "nothing to repair" in report.stdout


def doctor(home: Path) -> subprocess.CompletedProcess[str]:
    """`atrium doctor` as a real process on the home (no shell running)."""
    return subprocess.run(
        [sys.executable, "-m", "atrium", "doctor"],
        env={**os.environ, "ATRIUM_HOME": str(home)},
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
