"""A member never makes the shell read a path on its machine through an install record's ref.

`local:` and `git+file://` refs are an admin's to name (docs/api.md "Install"): an import keeps
the archive's recorded ref, and an archive is whatever its uploader sealed, so a member could
import an app whose record names `local:<any folder>`. The update check and an update resolve
that ref with the member's pipeline: they must refuse it as an install does, never hash the
folder nor install from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp, write_manifest
from tests.integration.distribution.test_export_import import (
    APP,
    exported,
    members,
    resealed,
)

pytestmark = pytest.mark.integration


def test_a_member_import_naming_a_local_folder_is_never_resolved(
    start_shell: StartShell, make_app: MakeApp, home: Path, tmp_path: Path
) -> None:
    shell = start_shell()
    bea_token = shell.add_user("bea")
    # a folder of the shell's machine the member may not read: someone's private copy
    private = tmp_path / "private" / APP
    private.mkdir(parents=True)
    make_app(APP, root=tmp_path / "private")
    write_manifest(private, version="9.9.9", description="the private copy")
    with shell.client(timeout=60) as admin, shell.client(bea_token, timeout=60) as bea:
        archive, _ = exported(admin, make_app, home)
        files = members(archive)
        record = json.loads(files["atrium-export/export.json"])["record"]
        kept = {k: v for k, v in files.items() if "/data/" not in k}
        forged = resealed(kept, record={**record, "ref": f"local:{private}"})
        answer = bea.post(
            "/api/dist/import",
            params={"scope": "user", "appId": APP, "autoApprove": "1"},
            content=forged,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["ok"] is True, answer.text

        listed = {
            (row["id"], row["scope"]): row
            for row in bea.get("/api/dist/updates", params={"refresh": "1"}).json()["updates"]
        }
        row = listed[(APP, "user")]
        assert row["available"] is False, row
        assert row["problem"] is not None
        assert "imported from an archive" in row["problem"], row

        update = bea.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
        assert update.status_code == 400, update.text
        assert update.json()["error"]["code"] == "bad_request", update.text
        mine = bea.get(f"/api/apps/{APP}").json()
        assert mine["version"] == "1.0.0", mine
        assert bea.get(f"/api/apps/{APP}").json()["version"] != "9.9.9"


def test_an_admin_import_naming_a_local_folder_or_repository_is_never_resolved(
    start_shell: StartShell, make_app: MakeApp, home: Path, tmp_path: Path
) -> None:
    """An admin may name `local:` and `git+file://` refs, but not through an archive someone
    else sealed: an imported record whose ref names this machine's files is kept to say where
    it came from (`detached`) and never resolved, so "Update" cannot install another user's
    private folder into the global scope."""
    shell = start_shell()
    private = tmp_path / "private" / APP
    private.mkdir(parents=True)
    make_app(APP, root=tmp_path / "private")
    write_manifest(private, version="9.9.9", description="the private copy")
    with shell.client(timeout=60) as admin:
        archive, _ = exported(admin, make_app, home)
        files = members(archive)
        record = json.loads(files["atrium-export/export.json"])["record"]
        kept = {k: v for k, v in files.items() if "/data/" not in k}
        for ref in (f"local:{private}", f"git+file://{private}"):
            forged = resealed(kept, record={**record, "ref": ref})
            answer = admin.post(
                "/api/dist/import",
                params={"scope": "global", "appId": APP, "autoApprove": "1"},
                content=forged,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["record"]["detached"] is True, answer.text

            listed = {
                (row["id"], row["scope"]): row
                for row in admin.get("/api/dist/updates", params={"refresh": "1"}).json()["updates"]
            }
            row = listed[(APP, "global")]
            assert row["available"] is False, row
            assert "imported from an archive" in (row["problem"] or ""), row

            update = admin.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
            assert update.status_code == 400, update.text
            assert update.json()["error"]["ref"] == ref, update.text
            assert admin.get(f"/api/apps/{APP}").json()["version"] == "1.0.0"
