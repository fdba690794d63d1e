"""A backup that could not be written is announced: `backup:failed` reaches its user's stream
(the host page's notifications), not another user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import DEADLINE, MIB, SseReader, StartShell, fill_disk, wait_for
from tests.integration.distribution.conftest import MakeApp
from tests.integration.distribution.test_backup_safety import APP, data_dir, with_data

pytestmark = pytest.mark.integration


def test_a_backup_on_a_full_disk_announces_backup_failed_to_its_user_only(
    small_home: Path, start_shell: StartShell, make_app: MakeApp
) -> None:
    shell = start_shell(runner="process")
    with (
        shell.client(timeout=DEADLINE) as api,
        shell.client(shell.add_user("bob"), timeout=DEADLINE) as bob,
    ):
        with_data(api, make_app, small_home)
        (data_dir(small_home) / "big.bin").write_bytes(os.urandom(4 * MIB))
        mine = SseReader(api, {"topics": "backup:failed,kv:changed"})
        theirs = SseReader(bob, {"topics": "backup:failed,kv:changed"})
        fill_disk(small_home, 2 * MIB)
        response = api.post(f"/api/dist/backups/{APP}")
        assert response.status_code == 507, response.text
        heard = wait_for(lambda: mine.of("backup:failed"), "backup:failed")[0].data
        assert heard == {
            "type": "backup:failed",
            "appId": APP,
            "scope": "global",
            "reason": "manual",
            "message": response.json()["error"]["message"],
        }
        assert api.put("/api/kv/global/marker", json={"value": 1}).status_code == 200
        wait_for(lambda: theirs.of("kv:changed"), "the marker on bob's stream")
        assert theirs.of("backup:failed") == []
