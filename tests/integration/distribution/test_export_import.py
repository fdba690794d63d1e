"""Export and import (docs/api.md "Export and import"): one app moved between two real shells
with its data; damaged and foreign archives refused with nothing changed."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zstandard

from tests.integration.conftest import RunningShell, launch_shell
from tests.integration.distribution.conftest import MakeApp, installed_ok

pytestmark = pytest.mark.integration
APP = "com.example.moved"


def exported(api: httpx.Client, make_app: MakeApp, home: Path) -> tuple[bytes, str]:
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    (home / "scopes/global/apps" / APP / instance / "notes.txt").write_text("carried over")
    answer = api.get(f"/api/dist/export/{APP}")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/zstd"
    return answer.content, f"local:{source}"


def members(archive: bytes) -> dict[str, bytes]:
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive))
    found = {}
    with tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            file = tar.extractfile(member)
            found[member.name] = file.read() if file else b""
    return found


def repack(files: dict[str, bytes], extra: tarfile.TarInfo | None = None) -> bytes:
    out = io.BytesIO()
    with (
        zstandard.ZstdCompressor().stream_writer(out, closefd=False) as zstd,
        tarfile.open(fileobj=zstd, mode="w|") as tar,
    ):
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        if extra is not None:
            tar.addfile(extra)
    return out.getvalue()


@pytest.fixture
def second(tmp_path: Path) -> Iterator[RunningShell]:
    system = tmp_path / "second-system"
    system.mkdir()
    shell = launch_shell(tmp_path / "second-home", system)
    yield shell
    shell.stop()


def test_an_app_moves_to_another_shell_with_its_data(
    api: httpx.Client, make_app: MakeApp, home: Path, second: RunningShell, tmp_path: Path
) -> None:
    archive, ref = exported(api, make_app, home)
    files = members(archive)
    manifest = json.loads(files["atrium-export/export.json"])
    assert (manifest["format"], manifest["formatVersion"]) == ("atrium-app-export", 1)
    assert f"data/{APP}-1/notes.txt" in manifest["files"]
    assert "app/app.manifest.json" in manifest["files"]
    with second.client(timeout=60) as other:
        answer = other.post("/api/dist/import", params={"autoApprove": "1"}, content=archive)
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["ok"] is True, result
        assert result["events"][0]["type"] == "import.checked"
        assert (result["record"]["version"], result["record"]["ref"]) == ("1.0.0", ref)
        moved = tmp_path / "second-home/scopes/global/apps" / APP
        assert (moved / f"{APP}-1" / "notes.txt").read_text() == "carried over"
        launched = other.post("/api/instances", json={"appId": APP}).json()
        assert (launched["instanceId"], launched["state"]) == (f"{APP}-1", "started")


def test_a_damaged_or_foreign_archive_is_refused_and_changes_nothing(
    api: httpx.Client, make_app: MakeApp, home: Path, second: RunningShell, tmp_path: Path
) -> None:
    archive, _ = exported(api, make_app, home)
    files = members(archive)
    data_name = f"atrium-export/data/{APP}-1/notes.txt"
    manifest = json.loads(files["atrium-export/export.json"])
    newer = {
        **files,
        "atrium-export/export.json": json.dumps({**manifest, "formatVersion": 2}).encode(),
    }
    link = tarfile.TarInfo("atrium-export/app/escape")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    cases = {
        "damaged": (repack({**files, data_name: b"tampered"}), "damaged"),
        "extra file": (repack({**files, "atrium-export/app/added.txt": b"x"}), "not listed"),
        "missing file": (
            repack({k: v for k, v in files.items() if k != data_name}),
            "missing",
        ),
        "newer format": (repack(newer), "format version is 2"),
        "foreign tar": (repack({"something/else.txt": b"hi"}), "outside what an export contains"),
        "link": (repack(files, link), "link or a special file"),
        "not zstd": (b"PK\x03\x04 a zip file", "not a readable zstd"),
        "truncated": (archive[: len(archive) // 2], "not a readable"),
    }
    staging = tmp_path / "second-home/scopes/global/.staging"
    with second.client(timeout=60) as other:
        for case, (body, words) in cases.items():
            answer = other.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
            assert answer.status_code == 400, (case, answer.text)
            assert words in answer.json()["error"]["message"], (case, answer.text)
            assert "nothing was changed" in answer.json()["error"]["message"]
        assert other.get(f"/api/apps/{APP}").status_code == 404
        assert not (tmp_path / "second-home/scopes/global/apps" / APP).exists()
        assert list(staging.iterdir()) == [] if staging.exists() else True
        assert list((tmp_path / "second-home/cache/imports").iterdir()) == []
        empty = other.post("/api/dist/import", content=b"")
        assert empty.status_code == 400
