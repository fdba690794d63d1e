"""A copy of an app's data takes no more disk than the data does, through the real shell.

An app can make a file of any length that holds no blocks (`truncate`, a seek past the end): a
copier that reads it as bytes writes every zero, so a file of a few TiB that costs the app
nothing fills the host's disk at its next routine backup (and again at each restore). The
copier copies what the file holds, region by region (SEEK_DATA/SEEK_HOLE), and leaves the holes
as holes; the copy has the same length and the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration

APP = "com.example.sparse"
#: the file's length: 256 MiB, of which two 4 KiB regions hold bytes
LENGTH = 256 << 20
REGIONS = {(17 << 20): b"a" * 4096, LENGTH - 4096: b"z" * 4096}
#: what a copy of it may take on disk: the regions and some metadata, far from its length
MAX_ALLOCATED = 1 << 20


def _sparse(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(LENGTH)
        for offset, data in REGIONS.items():
            file.seek(offset)
            file.write(data)


def _check_copy(path: Path) -> None:
    info = path.stat()
    assert info.st_size == LENGTH
    assert info.st_blocks * 512 <= MAX_ALLOCATED, f"{path}: {info.st_blocks * 512} bytes on disk"
    with path.open("rb") as file:
        for offset, data in REGIONS.items():
            file.seek(offset)
            assert file.read(len(data)) == data
        file.seek(LENGTH // 2)
        assert file.read(4096) == bytes(4096)


def test_backup_and_restore_keep_a_sparse_file_sparse(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    installed_ok(api, f"local:{make_app(APP)}")
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    data = home / "scopes/global/apps" / APP / instance
    _sparse(data / "big")
    os.chown(data / "big", data.stat().st_uid, data.stat().st_gid)
    answer = api.post(f"/api/dist/backups/{APP}")
    assert answer.status_code == 200, answer.text
    backup = answer.json()["id"]
    _check_copy(home / "backups/global" / APP / backup / "data" / instance / "big")
    (data / "big").unlink()
    restored = api.post(f"/api/dist/restore/{APP}", json={"backup": backup})
    assert restored.status_code == 200, restored.text
    _check_copy(data / "big")
