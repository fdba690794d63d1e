"""A full disk during an update (issue 14 row 3): git add fails for want of space, and the undo
must not need any (it renamed the old record back instead of writing it again). Afterwards the
record, the installed list, the disk and the scope repository agree on the old version, and the
next update really updates. Runs on a small tmpfs mounted as $ATRIUM_HOME (root only)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import MIB, StartShell, fill_disk
from tests.integration.distribution.conftest import MakeApp, installed_ok, write_manifest

pytestmark = pytest.mark.integration
APP = "com.example.bulky"


def test_git_add_on_a_full_disk_fails_cleanly_and_the_next_update_works(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    source = make_app(APP)
    shell = start_shell(runner="process")
    with shell.client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        # v2 carries 3 MiB of incompressible data: the staged copy fits, git's blob does not
        (source / "blob.bin").write_bytes(os.urandom(3 * MIB))
        write_manifest(source, version="2.0.0")
        filler = fill_disk(small_home, int(4.5 * MIB))
        response = api.post(f"/api/dist/update/{APP}", json={})
        text = response.text
        assert "install_failed" in text, text
        assert "No space left" in text or "ENOSPC" in text or "space" in text, text

        scope = small_home / "scopes/global"
        record = json.loads((scope / "records" / f"{APP}.json").read_text())
        manifest = json.loads((scope / "apps" / APP / "app.manifest.json").read_text())
        listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert record["version"] == manifest["version"] == listed["version"] == "1.0.0"
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=scope, capture_output=True, text=True, check=True
        ).stdout
        assert status == "", status

        filler.unlink()
        again = api.post(f"/api/dist/update/{APP}", json={})
        assert "upToDate" not in again.text or '"upToDate": false' in again.text, again.text
        listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert listed["version"] == "2.0.0"


def test_a_read_only_scope_answers_a_storage_error_naming_the_folder(
    home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    source = make_app(APP)
    shell = start_shell(runner="process")
    with shell.client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        write_manifest(source, version="2.0.0")
        staging = home / "scopes/global/.staging"
        bound = subprocess.run(["mount", "--bind", str(staging), str(staging)], capture_output=True)
        if bound.returncode != 0:
            pytest.skip(f"cannot bind-mount here (needs root): {bound.stderr.decode().strip()}")
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(staging)], check=True)
            response = api.post(f"/api/dist/update/{APP}", json={})
        finally:
            subprocess.run(["umount", "-l", str(staging)], check=False)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "storage_failed"
        assert error["path"] == str(staging)
        listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert listed["version"] == "1.0.0"


def test_an_uninstall_on_a_full_disk_fails_cleanly(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    source = make_app(APP)
    shell = start_shell(runner="process")
    with shell.client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        filler = fill_disk(small_home)  # every last block: git cannot write its commit
        response = api.delete(f"/api/dist/uninstall/{APP}")
        assert response.status_code == 507, response.text
        scope = small_home / "scopes/global"
        error = response.json()["error"]
        assert (error["code"], error["path"]) == ("storage_full", str(scope)), error
        assert "No space left on device" in error["message"], error
        listed = next(a for a in api.get("/api/apps").json() if a["id"] == APP)
        assert listed["version"] == "1.0.0"
        assert (scope / "apps" / APP / "app.manifest.json").is_file()
        record = json.loads((scope / "records" / f"{APP}.json").read_text())
        assert record["version"] == "1.0.0"
        filler.unlink()  # (git status itself needs a little space)
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=scope, capture_output=True, text=True, check=True
        ).stdout
        assert status == "", status
        assert api.delete(f"/api/dist/uninstall/{APP}").status_code == 200
