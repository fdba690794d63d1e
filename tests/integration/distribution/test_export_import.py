"""Export and import (docs/api.md "Export and import"): one app moved between two real shells
with its data; damaged and foreign archives refused with nothing changed."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zstandard

from atrium.distribution.exports import MAX_EXPANDED
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


def test_an_export_larger_than_an_import_takes_is_refused_up_front(
    api: httpx.Client, make_app: MakeApp, home: Path, dist_shell: RunningShell
) -> None:
    """A file of 100 GiB holding nothing (`truncate -s`, no disk) would be packed byte for byte:
    hours of zeros through the digest and zstd, the app's operation lock held, for an archive no
    import takes (more than MAX_EXPANDED). Refused before anything is stopped or copied."""
    source = make_app(APP)
    installed_ok(api, f"local:{source}")
    instance = api.post("/api/instances", json={"appId": APP}).json()["instanceId"]
    data = home / "scopes/global/apps" / APP / instance
    (data / "notes.txt").write_text("kept")
    with (data / "huge.bin").open("wb") as file:
        file.truncate(100 * 1024**3)
    with dist_shell.client(timeout=30) as client:  # (before: still packing zeros)
        answer = client.get(f"/api/dist/export/{APP}")
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "export_too_large"
    assert (error["appId"], error["path"]) == (APP, f"data/{instance}/huge.bin")
    assert error["bytes"] > error["limit"] == MAX_EXPANDED
    assert f"data/{instance}/huge.bin" in error["message"]
    assert list((home / "cache/exports").glob("*")) == []
    assert api.get(f"/api/dist/backups/{APP}").json() == []  # nothing copied
    found = dist_shell.shell.lifecycle.find(instance)
    assert found is not None
    assert found.state.value == "started"  # never stopped
    (data / "huge.bin").unlink()
    assert api.get(f"/api/dist/export/{APP}").status_code == 200


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


def resealed(files: dict[str, bytes], **changes: object) -> bytes:
    """The archive with its export.json changed and its file list recomputed, as an attacker
    would build one (the digests only prove the archive is whole, not who made it)."""
    manifest = json.loads(files["atrium-export/export.json"])
    manifest.update(changes)
    body = {k: v for k, v in files.items() if k != "atrium-export/export.json"}
    manifest["files"] = {
        k.removeprefix("atrium-export/"): hashlib.sha256(v).hexdigest() for k, v in body.items()
    }
    return repack({**body, "atrium-export/export.json": json.dumps(manifest).encode()})


def test_an_archive_naming_a_path_for_its_app_plants_nothing(
    api: httpx.Client, make_app: MakeApp, home: Path, second: RunningShell, tmp_path: Path
) -> None:
    """The record's id names folders: a path there (or an app tree of another id) is refused
    before anything is moved, however well the archive is sealed."""
    archive, _ = exported(api, make_app, home)
    files = members(archive)
    record = json.loads(files["atrium-export/export.json"])["record"]
    planted = tmp_path / "planted"
    other_home = tmp_path / "second-home"
    for app_id, words in [
        ("../../../../apps/com.evil.app", "malformed"),
        (str(planted), "malformed"),
        ("com.example.else", "its app tree is 'com.example.moved'"),
    ]:
        kept = {k: v for k, v in files.items() if "/data/" not in k}  # no data folder to trip on
        body = resealed(kept, appId=app_id, record={**record, "id": app_id})
        with second.client(timeout=60) as other:
            answer = other.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
            assert answer.status_code == 400, (app_id, answer.text)
            assert words in answer.json()["error"]["message"], answer.text
            assert other.get("/api/apps/com.evil.app").status_code == 404
            assert other.get(f"/api/apps/{APP}").status_code == 404
        assert not planted.exists()
        assert not (other_home / "scopes/global/apps/com.evil.app").exists()
        assert not (other_home / "scopes/global/apps" / APP).exists()


def test_an_archive_that_expands_past_the_disk_is_refused_before_it_is_written(
    second: RunningShell, tmp_path: Path
) -> None:
    """A member's header announces its size: one that would not fit is refused before a byte of
    it is written (a few KiB of zstd can announce terabytes)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as zstd:
        info = tarfile.TarInfo("atrium-export/data/com.example.big-1/zeros")
        info.size = 2**40  # 1 TiB announced; only the header is sent
        zstd.write(info.tobuf(format=tarfile.PAX_FORMAT))
        zstd.write(b"\0" * 4096)
    with second.client(timeout=60) as other:
        answer = other.post("/api/dist/import", content=out.getvalue())
    assert answer.status_code == 400, answer.text
    assert "it expands to more than" in answer.json()["error"]["message"]
    staging = tmp_path / "second-home/scopes/global/.staging"
    assert not any(staging.rglob("zeros")) if staging.exists() else True


def test_an_import_over_an_installed_copy_backs_its_data_up_first(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    archive, _ = exported(api, make_app, home)
    live = home / "scopes/global/apps" / APP / f"{APP}-1" / "notes.txt"
    live.write_text("written after the export")
    api.post(f"/api/instances/{APP}-1/stop")
    answer = api.post("/api/dist/import", params={"autoApprove": "1"}, content=archive)
    assert answer.status_code == 200, answer.text
    assert live.read_text() == "carried over"  # the archive's data
    backups = api.get(f"/api/dist/backups/{APP}").json()
    kept = next(b for b in backups if b["reason"] == "import")
    restored = api.post(f"/api/dist/restore/{APP}", json={"backup": kept["id"]})
    assert restored.status_code == 200, restored.text
    assert live.read_text() == "written after the export"


def test_a_folder_among_the_backups_that_names_another_app_is_not_a_backup(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    exported(api, make_app, home)  # installed, with runtime data
    made = api.post(f"/api/dist/backups/{APP}")
    assert made.status_code == 200, made.text
    real = home / "backups/global" / APP / made.json()["id"]
    foreign = home / "backups/global" / APP / "99991231T000000000000Z-1.0.0"
    shutil.copytree(real, foreign)
    meta = json.loads((foreign / "backup.json").read_text())
    (foreign / "data" / f"{APP}-1").rename(foreign / "data" / "com.example.else-1")
    meta.update(appId="com.example.else", folders=["com.example.else-1"])
    (foreign / "backup.json").write_text(json.dumps(meta))
    listed = [b["id"] for b in api.get(f"/api/dist/backups/{APP}").json()]
    assert made.json()["id"] in listed
    assert foreign.name not in listed
    refused = api.post(f"/api/dist/restore/{APP}", json={"backup": foreign.name})
    assert refused.status_code == 404


def zstd_of(*blocks: bytes) -> bytes:
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as zstd:
        for block in blocks:
            zstd.write(block)
        zstd.write(b"\0" * 1024)
    return out.getvalue()


def test_headers_that_lie_about_sizes_or_names_are_refused_at_once(
    second: RunningShell, tmp_path: Path
) -> None:
    """Sizes the budget would add up wrong (negative), headers tarfile would read whole or parse
    for minutes (a pax record of 100 KB, a GNU long name announcing 1 GiB), and names no disk
    takes: each refused with its reason, quickly, with nothing left in staging."""
    negative = tarfile.TarInfo("atrium-export/app/dir")
    negative.type = tarfile.DIRTYPE
    negative.pax_headers = {"size": str(-(2**62))}
    pax = tarfile.TarInfo("atrium-export/app/x")
    pax.pax_headers = {"comment": "1" * 100_000}
    longname = tarfile.TarInfo("././@LongLink")
    longname.type = tarfile.GNUTYPE_LONGNAME
    longname.size = 2**30
    long_file = tarfile.TarInfo("atrium-export/app/" + "a" * 300)
    cases = {
        "negative size": (negative.tobuf(format=tarfile.PAX_FORMAT), "announces a size of -"),
        "pax bomb": (pax.tobuf(format=tarfile.PAX_FORMAT), "extended header of"),
        "long name bomb": (longname.tobuf(format=tarfile.GNU_FORMAT), "extended header of"),
        "long name": (long_file.tobuf(format=tarfile.PAX_FORMAT), "longer path or name"),
    }
    staging = tmp_path / "second-home/scopes/global/.staging"
    with second.client(timeout=60) as other:
        for case, (header, words) in cases.items():
            answer = other.post("/api/dist/import", content=zstd_of(header))
            assert answer.status_code == 400, (case, answer.text)
            assert words in answer.json()["error"]["message"], (case, answer.text)
            assert answer.elapsed.total_seconds() < 5, case
    assert not any(staging.rglob("*")) if staging.exists() else True
