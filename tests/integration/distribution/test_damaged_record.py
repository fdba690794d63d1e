"""A damaged install record (issue 14 row 8) is listed by `GET /api/dist/installed` as damaged,
with its file and the problem, instead of the app silently missing from the list."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import StartShell
from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration
APP = "com.example.recorded"


def test_a_damaged_record_is_listed_as_damaged(
    home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    source = make_app(APP)
    shell = start_shell(runner="process")
    with shell.client(timeout=60) as api:
        installed_ok(api, f"local:{source}")
        record = home / "scopes/global/records" / f"{APP}.json"
        record.write_bytes(record.read_bytes()[:30])
        listed = api.get("/api/dist/installed").json()
    (item,) = [i for i in listed if i["id"] == APP]
    assert item["damaged"] is True
    assert item["scope"] == "global"
    assert item["path"] == str(record)
    assert item["problem"]
