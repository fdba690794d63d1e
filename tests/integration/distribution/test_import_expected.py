"""An import made from one app's detail names that app (`appId` of `POST /api/dist/import`,
docs/api.md "Export and import"): an archive of another app is refused before anything is
installed, so picking the wrong file in the detail of one app never installs or overwrites
another."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.distribution.conftest import MakeApp, installed_ok
from tests.integration.distribution.test_export_import import APP, exported

pytestmark = pytest.mark.integration
OTHER = "com.example.other"


def test_an_archive_of_another_app_is_refused_when_the_import_names_its_app(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    archive, _ = exported(api, make_app, home)
    installed_ok(api, f"local:{make_app(OTHER)}")
    live = home / "scopes/global/apps" / APP / f"{APP}-1" / "notes.txt"
    live.write_text("written after the export")
    api.post(f"/api/instances/{APP}-1/stop")
    for params in ({"appId": OTHER}, {"appId": OTHER, "dataOnly": "1"}):
        answer = api.post(
            "/api/dist/import", params={"autoApprove": "1", **params}, content=archive
        )
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["appId"], error["expected"]) == ("bad_request", APP, OTHER)
        assert APP in error["message"]
        assert OTHER in error["message"]
    assert live.read_text() == "written after the export"  # nothing imported
    assert [b for b in api.get(f"/api/dist/backups/{APP}").json() if b["reason"] == "import"] == []
    bad = api.post("/api/dist/import", params={"appId": "../x"}, content=archive)
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["code"] == "bad_request"
    # the app it names: imported as before
    named = api.post("/api/dist/import", params={"autoApprove": "1", "appId": APP}, content=archive)
    assert named.status_code == 200, named.text
    assert live.read_text() == "carried over"
