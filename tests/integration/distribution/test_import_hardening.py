"""Import never answers 500 (docs/api.md "Export and import"): archives whose members contradict
each other (a folder and a file of one name, a member under a file, a name twice, a data folder
stored as a file), or carry values no disk takes, are refused with `400 bad_request` naming the
member, with nothing changed; random archives built member by member never get a 5xx. An upload
that does not fit on the disk is `507 storage_full` naming the folder, and leaves nothing; an
upload a killed shell left behind is removed at the next start, reported and removed by
`atrium doctor`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import MIB, RunningShell, StartShell, fill_disk, wait_for
from tests.integration.distribution.conftest import MakeApp, write_manifest
from tests.integration.distribution.test_crash import TOKEN, Served
from tests.integration.distribution.test_doctor_repair import doctor
from tests.integration.distribution.test_export_import import zstd_of

pytestmark = pytest.mark.integration
APP = "com.example.carried"
ROOT = "atrium-export"


def record(source: Path) -> dict[str, Any]:
    return {
        "id": APP,
        "version": "1.0.0",
        "scope": "global",
        "source": "local",
        "ref": f"local:{source}",
        "digest": "sha256:" + "0" * 64,
        "channel": None,
        "installedAt": "2025-01-01T00:00:00Z",
        "updatedAt": "2025-01-01T00:00:00Z",
        "path": f"/elsewhere/{APP}",
    }


def file(name: str, body: bytes = b"x", **fields: Any) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(f"{ROOT}/{name}")
    info.size = len(body)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, body


def folder(name: str, **fields: Any) -> tuple[tarfile.TarInfo, bytes]:
    info, _ = file(name, b"", **fields)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, b""


def sealed(
    members: list[tuple[tarfile.TarInfo, bytes]],
    manifest: dict[str, Any] | None = None,
    whole: object = None,
) -> bytes:
    """The members, then an export.json listing every regular member with its SHA-256 (as an
    attacker would seal an archive: the digests prove it whole, not who made it); ``whole``:
    that JSON value (or those bytes) as export.json instead."""
    files = {
        info.name.removeprefix(f"{ROOT}/"): hashlib.sha256(body).hexdigest()
        for info, body in members
        if info.isreg()
    }
    fields = {"format": "atrium-app-export", "formatVersion": 1, "files": files}
    if isinstance(whole, bytes):
        body = whole
    else:
        body = json.dumps({**fields, **(manifest or {})} if whole is None else whole).encode()
    out = io.BytesIO()
    with (
        zstandard.ZstdCompressor().stream_writer(out, closefd=False) as zstd,
        tarfile.open(fileobj=zstd, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for info, data in [*members, file("export.json", body)]:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def app_tree(source: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [file(f"app/{p.name}", p.read_bytes()) for p in sorted(source.iterdir())]


def assert_nothing_changed(api: httpx.Client, home: Path) -> None:
    assert api.get(f"/api/apps/{APP}").status_code == 404
    assert not (home / "scopes/global/apps" / APP).exists()
    staging = home / "scopes/global/.staging"
    assert list(staging.iterdir()) == [] if staging.exists() else True
    uploads = home / "cache/imports"
    assert list(uploads.iterdir()) == [] if uploads.exists() else True


def refused(api: httpx.Client, body: bytes) -> str:
    answer = api.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "bad_request", answer.text
    assert "nothing was changed" in error["message"], answer.text
    message: str = error["message"]
    return message


CONTRADICTIONS = {
    "a file then a folder of its name": (
        [file("app/extra"), folder("app/extra")],
        f"'{ROOT}/app/extra' is both a file and a folder",
    ),
    "a folder then a file of its name": (
        [folder("app/extra"), file("app/extra")],
        f"'{ROOT}/app/extra' is both a folder and a file",
    ),
    "the data folder stored as a file": (
        [file("data", b"not a folder")],
        f"'{ROOT}/data' is a file, not a folder",
    ),
    "a data folder stored as a file": (
        [file(f"data/{APP}-1", b"not a folder")],
        f"'{ROOT}/data/{APP}-1' is a file, not a runtime data folder",
    ),
}


@pytest.mark.parametrize("case", CONTRADICTIONS)
def test_a_folder_and_a_file_of_one_name_is_refused_naming_the_member(
    case: str, api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app(APP)
    extra, words = CONTRADICTIONS[case]
    body = sealed([*app_tree(source), *extra], {"appId": APP, "record": record(source)})
    assert words in refused(api, body)
    assert_nothing_changed(api, home)


#: JSON nested past what Python's parser takes (it raises RecursionError, not ValueError)
DEEP = b"[" * 100_000 + b"]" * 100_000


def other_shapes(source: Path) -> dict[str, tuple[bytes, str]]:
    """Archives an attacker would try next, each with words of the refusal."""
    tree = app_tree(source)
    top = {"appId": APP, "record": record(source)}

    def of(*extra: tuple[tarfile.TarInfo, bytes], **manifest: Any) -> bytes:
        return sealed([*tree, *extra], {**top, **manifest})

    link = folder("app/lib")[0]
    link.type, link.linkname = tarfile.SYMTYPE, "/etc"
    hard = file("app/copy")[0]
    hard.type, hard.linkname, hard.size = tarfile.LNKTYPE, f"{ROOT}/app/server.py", 0
    sparse = file("app/sparse")[0]
    sparse.type, sparse.size = tarfile.GNUTYPE_SPARSE, 0
    huge = file("export.json")[0]
    huge.size = 2**30  # announced; the bytes never follow
    nul = file("app/x")[0]
    nul.pax_headers = {"path": f"{ROOT}/app/x\0y"}
    return {
        "a member under a file": (
            of(file("app/note"), file("app/note/inner")),
            f"'{ROOT}/app/note/inner' is under '{ROOT}/app/note', a file",
        ),
        "a member twice": (of(file("app/twice"), file("app/twice", b"y")), "twice"),
        "a folder twice": (of(folder("app/d"), folder("app/d")), "twice"),
        "export.json a folder, then the file": (of(folder("export.json")), "export.json"),
        "a link where a folder is expected": (
            of((link, b""), file("app/lib/passwd")),
            "link or a special file",
        ),
        "a hard link": (of((hard, b"")), "link or a special file"),
        "a sparse file": (of((sparse, b"")), "link or a special file"),
        "a dot segment": (of(file("app/./dot")), "app/./dot"),
        "an empty segment": (of(file("app//empty")), "app//empty"),
        "a parent segment": (of(file("app/../escape")), "app/../escape"),
        "an absolute name": (sealed([*tree, file("/" + ROOT + "/app/abs")], top), "outside"),
        "a NUL in a name": (of((nul, b"x")), "NUL character"),
        "a time no clock holds": (of(file("app/late", mtime=10**30)), "app/late"),
        "a time that is not a number": (
            of(file("app/nan", pax_headers={"mtime": "nan"})),
            "app/nan",
        ),
        "a record that is not an object": (of(record=[1, 2]), "install record is malformed"),
        "files that are not an object": (
            sealed(tree, {**top, "files": ["app/server.py"]}),
            "file list",
        ),
        "export.json that is not an object": (
            sealed(tree, whole=[1, 2]),
            "not an Atrium app export",
        ),
        "a huge format version": (of(formatVersion=10**4000), "format version"),
        "a huge appId": (of(appId="x" * 100_000), "appId"),
        "an export.json of a GiB": (zstd_of(huge.tobuf(tarfile.PAX_FORMAT)), "larger than"),
        "export.json nested deeper than a parser goes": (
            sealed(tree, whole=DEEP),
            "no readable atrium-export/export.json",
        ),
        "an app manifest nested deeper than a parser goes": (
            sealed(
                [file("app/app.manifest.json", b'{"id": "%s", "x": %s}' % (APP.encode(), DEEP))],
                top,
            ),
            "no readable app tree",
        ),
    }


def test_other_contradictory_or_impossible_archives_are_refused_never_500(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    source = make_app(APP)
    failures = []
    for case, (body, words) in other_shapes(source).items():
        answer = api.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
        text = answer.text[:400]
        if answer.status_code != 400 or answer.json()["error"]["code"] != "bad_request":
            failures.append(f"{case}: {answer.status_code} {text}")
        elif words not in answer.json()["error"]["message"]:
            failures.append(f"{case}: {text} (expected {words!r})")
    assert failures == [], "\n".join(failures)
    assert_nothing_changed(api, home)


def test_an_app_whose_id_is_a_member_name_is_imported_like_any_other(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """`export.json` is a well-formed app id; the unpacked tree must not be renamed onto the
    archive's own export.json."""
    source = make_app("export.json")
    body = sealed(
        app_tree(source),
        {"appId": "export.json", "record": {**record(source), "id": "export.json"}},
    )
    answer = api.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["ok"] is True, answer.text
    assert api.get("/api/apps/export.json").status_code == 200


def test_a_file_that_becomes_a_folder_installs_by_import_and_by_update(
    api: httpx.Client, make_app: MakeApp, home: Path
) -> None:
    """Found by the random archives below: the scope commit named its paths, and git then read
    each path the last commit held from disk, failing on a file that had become a folder
    (`500 install_failed`), whether an import or an update brought the new tree."""
    source = make_app(APP)
    (source / "notes").write_text("a file in 1.0.0")
    top = {"appId": APP, "record": record(source)}
    first = api.post(
        "/api/dist/import", params={"autoApprove": "1"}, content=sealed(app_tree(source), top)
    )
    assert first.status_code == 200, first.text
    tree = [m for m in app_tree(source) if not m[0].name.endswith("/notes")]
    body = sealed([*tree, file("app/notes/inside", b"a folder now")], top)
    again = api.post("/api/dist/import", params={"autoApprove": "1"}, content=body)
    assert again.status_code == 200, again.text
    installed = home / "scopes/global/apps" / APP
    assert (installed / "notes/inside").read_text() == "a folder now"

    (source / "notes").unlink()
    (source / "notes").mkdir()
    (source / "notes/inside").write_text("a folder in 2.0.0")
    (source / "back").mkdir()
    (source / "back/file").write_text("x")
    write_manifest(source, version="2.0.0")
    # an import keeps a `local:` ref detached (decisions.md "Imports: a ref naming a machine's
    # files"): the install that follows the folder is made by naming it, over the imported copy
    updated = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
    assert updated.status_code == 200, updated.text
    assert updated.json()["ok"] is True, updated.text
    (source / "back/file").unlink()
    (source / "back").rmdir()
    (source / "back").write_text("a file again")
    write_manifest(source, version="3.0.0")
    updated = api.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
    assert updated.status_code == 200, updated.text
    assert (installed / "back").read_text() == "a file again"
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=home / "scopes/global", capture_output=True, text=True
    )
    assert status.stdout == ""


def test_a_manifest_nested_deeper_than_the_parser_goes_is_an_invalid_manifest(
    api: httpx.Client, make_app: MakeApp
) -> None:
    """The same JSON in an app's own folder: `422 invalid_manifest`, from install (and the
    registry's scan, which reads it again) as from publish."""
    source = make_app(APP)
    (source / "app.manifest.json").write_bytes(b'{"id": "%s", "x": %s}' % (APP.encode(), DEEP))
    answer = api.post("/api/dist/install", json={"ref": f"local:{source}", "autoApprove": True})
    assert answer.status_code == 422, answer.text
    assert "unreadable" in answer.text, answer.text
    target = source.parent / "published.git"
    published = api.post(
        "/api/dist/publish", json={"path": str(source), "to": str(target), "tag": "v1"}
    )
    assert published.status_code == 422, published.text
    assert "nested too deeply" in published.text, published.text


# -- random archives, member by member ----------------------------------------------------------

#: where a member goes (mostly where an export's members go) and the names after that (mostly
#: plain, sometimes what a name must not hold); weights by repetition
PLACES = [f"{ROOT}/app/"] * 4 + [f"{ROOT}/data/{APP}-1/"] * 3 + [f"{ROOT}/data/", f"{ROOT}/", ""]
SEGMENTS = ["x", "y", "x", "y", f"{APP}-1", "app.manifest.json", "export.json", "..", ".", ""]
KINDS = [tarfile.REGTYPE] * 3 + [tarfile.DIRTYPE] * 3 + [tarfile.SYMTYPE, tarfile.LNKTYPE]
MTIMES = ["1700000000"] * 5 + ["0", "-1", "1e30", "-1e30", "nan", "inf", str(2**70)]


@st.composite
def members(draw: st.DrawFn) -> tuple[tarfile.TarInfo, bytes]:
    parts = draw(st.lists(st.sampled_from(SEGMENTS), min_size=0, max_size=3))
    info = tarfile.TarInfo(draw(st.sampled_from(PLACES)) + "/".join(parts))
    info.type = draw(st.sampled_from(KINDS))
    body = draw(st.binary(max_size=64)) if info.type == tarfile.REGTYPE else b""
    info.size = len(body)
    info.mode = draw(st.sampled_from([0o644, 0o755, 0, 0o7777]))
    if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        info.linkname = draw(st.sampled_from(["/etc", "..", f"{ROOT}/app/x", "x"]))
    mtime = draw(st.sampled_from(MTIMES))
    info.pax_headers = {"mtime": mtime, "path": info.name}
    return info, body


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture
def fuzzed(start_shell: StartShell, make_app: MakeApp) -> tuple[RunningShell, Path]:
    return start_shell(), make_app(APP)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    extra=st.lists(members(), max_size=6),
    with_tree=st.sampled_from([True, True, True, False]),
    manifest=st.sampled_from(["sealed"] * 4 + ["record", "files", "whole"]),
    junk=JSON,
    approve=st.booleans(),
)
def test_random_archives_never_answer_5xx(
    fuzzed: tuple[RunningShell, Path],
    extra: list[tuple[tarfile.TarInfo, bytes]],
    with_tree: bool,
    manifest: str,
    junk: Any,
    approve: bool,
) -> None:
    shell, source = fuzzed
    tree = app_tree(source) if with_tree else []
    top: dict[str, Any] = {"appId": APP, "record": record(source)}
    if manifest == "record":
        top["record"] = junk
    elif manifest == "files":
        top["files"] = junk
    body = sealed([*tree, *extra], top)
    if manifest == "whole":
        body = sealed([*tree, *extra], whole=junk if junk is not None else {})
    with shell.client(timeout=60) as api:
        answer = api.post("/api/dist/import", params={"autoApprove": str(approve)}, content=body)
    assert answer.status_code < 500, answer.text
    if answer.status_code >= 400:  # the error shape, whatever the reason (400, 409, 422)
        assert set(answer.json()["error"]) >= {"code", "message"}, answer.text
    home = shell.settings.home
    assert list((home / "cache/imports").iterdir()) == []
    staging = home / "scopes/global/.staging"
    assert list(staging.iterdir()) == [] if staging.exists() else True


# -- a full disk, and uploads a killed shell left behind ----------------------------------------


def test_an_upload_on_a_full_disk_is_storage_full_naming_the_folder_and_leaves_nothing(
    small_home: Path, start_shell: StartShell
) -> None:
    shell = start_shell(runner="process")
    filler = fill_disk(small_home, MIB)
    uploads = small_home / "cache/imports"
    with shell.client(timeout=60) as api:
        answer = api.post("/api/dist/import", content=os.urandom(3 * MIB))
        assert answer.status_code == 507, answer.text
        error = answer.json()["error"]
        assert error["code"] == "storage_full", answer.text
        assert error["path"] == str(uploads), answer.text
        assert list(uploads.iterdir()) == []
        filler.unlink()
        # the disk has room again: the next upload is read (and refused for what it is)
        again = api.post("/api/dist/import", content=os.urandom(3 * MIB))
        assert again.status_code == 400, again.text
        assert "not a readable zstd" in again.json()["error"]["message"]


@contextmanager
def uploading(served: Served, home: Path, length: int) -> Iterator[tuple[socket.socket, Path]]:
    """An import announcing ``length`` bytes of body, 1 MiB of them sent: the connection, and
    the upload's file once those bytes reached the disk."""
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        head = (
            "POST /api/dist/import HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {length}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"\0" * MIB)
        uploads = home / "cache/imports"

        def written() -> list[Path]:
            files = sorted(uploads.glob("*")) if uploads.is_dir() else []
            return [p for p in files if p.stat().st_size > 0]

        found: list[Path] = wait_for(written, "the upload to reach the disk")
        yield sock, found[0]


def upload_left_by_a_kill(home: Path, system_apps: Path) -> Path:
    """A real `atrium serve` killed (SIGKILL) while it receives an import: half an upload."""
    served = Served(home, system_apps, "none")
    try:
        with uploading(served, home, 8 * MIB) as (_, left):
            served.proc.kill()
            served.proc.wait(timeout=30)
    finally:
        served.close()
    assert left.exists()
    return left


def test_an_upload_left_by_a_kill_is_removed_at_the_next_start(
    home: Path, system_apps: Path, start_shell: StartShell
) -> None:
    left = upload_left_by_a_kill(home, system_apps)
    reported = doctor(home)
    assert reported.returncode == 1, reported.stdout + reported.stderr
    assert f"import upload {left}" in reported.stdout, reported.stdout
    start_shell()
    assert not left.exists()
    assert list(left.parent.iterdir()) == []


def test_doctor_repair_removes_a_leftover_upload_and_a_live_one_is_never_reported(
    home: Path, system_apps: Path
) -> None:
    left = upload_left_by_a_kill(home, system_apps)
    repaired = doctor(home, "--repair")
    assert f"repaired: removed the import upload {left}" in repaired.stdout, repaired.stdout
    assert not left.exists()
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr

    # a shell receiving an upload: doctor (read-only) must not call it left behind
    served = Served(home, system_apps, "none")
    try:
        with uploading(served, home, 2 * MIB) as (sock, live):
            report = doctor(home)
            assert "import upload" not in report.stdout, report.stdout
            refused_repair = doctor(home, "--repair")
            assert refused_repair.returncode == 2, refused_repair.stdout
            assert live.exists()
            sock.sendall(b"\0" * MIB)  # the rest: the shell reads it, refuses it, removes it
            answer = sock.recv(65536).decode(errors="replace")
            assert " 400 " in answer.split("\r\n", 1)[0], answer
        wait_for(lambda: not live.exists(), "the refused upload to be removed")
    finally:
        served.close()
