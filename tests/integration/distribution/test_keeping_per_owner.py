"""Rollback, export and import of a user's own app bring back and carry that user's data, and no
one else's (docs/api.md "Rollback", "Export and import"): a real shell, a member who installs
from `git daemon`, their instances' data where the lifecycle keeps it
(`scopes/users/<id>/runtime/user/<appId>/<appId>~<id>-<n>`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell, launch_shell
from tests.integration.distribution.conftest import (
    GitDaemon,
    GitRepo,
    MakeApp,
    git_daemon,  # noqa: F401 - a fixture these tests use
    git_repo,  # noqa: F401 - a fixture these tests use
    installed_ok,
    write_manifest,
)
from tests.integration.distribution.test_export_import import members, repack

pytestmark = pytest.mark.integration
APP = "com.example.kept"
BOB = "bob"
ROOT = "atrium-export"
#: the app's start and hook deadlines. An update brings the member's instance back; when that
#: relaunch misses the fixtures' 5 s (a loaded machine), the instance is left in `error`, the update
#: still answers ok, and the rollback, which lists only instances not in `error`, answers
#: `stopped: []`. What these tests wait for is the relaunch itself: generous deadlines, not sleeps
DEADLINES = {"startTimeoutMs": 60_000, "hookTimeoutMs": 60_000}


@pytest.fixture(autouse=True)
def reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's `git daemon` listens on loopback, which a member's fetch may reach only when
    the admin allows it."""
    monkeypatch.setenv("ATRIUM_MEMBER_FETCH_HOSTS", "127.0.0.1")


@pytest.fixture
def served(
    make_app: MakeApp,
    git_daemon: GitDaemon,  # noqa: F811
    git_repo: Callable[..., GitRepo],  # noqa: F811
) -> tuple[GitRepo, str]:
    """The app's source in git, and its `git://` URL (a member may not name a local path)."""
    repo = git_repo(make_app(APP, **DEADLINES), base=git_daemon.base / "s")
    return repo, git_daemon.url(f"s/{repo.bare.name}")


@pytest.fixture
def bob(dist_shell: RunningShell) -> Iterator[httpx.Client]:
    with dist_shell.client(dist_shell.add_user(BOB), timeout=60) as client:
        yield client


def launched(client: httpx.Client) -> str:
    answer = client.post("/api/instances", json={"appId": APP, "new": True})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["instanceId"])


def runtime(home: Path, user: str = BOB) -> Path:
    """Where ``user``'s instances of their own user-scope copy keep their data."""
    return home / "scopes/users" / user / "runtime/user" / APP


def data_of(archive: bytes) -> dict[str, bytes]:
    """The archive's data members, by their name under ``data/``."""
    prefix = f"{ROOT}/data/"
    return {k.removeprefix(prefix): v for k, v in members(archive).items() if k.startswith(prefix)}


def test_a_members_rollback_brings_their_data_of_that_version_back(
    dist_shell: RunningShell, bob: httpx.Client, home: Path, served: tuple[GitRepo, str]
) -> None:
    repo, url = served
    installed_ok(bob, url, scope="user")
    instance = launched(bob)
    assert instance == f"{APP}~{BOB}-1"
    notes = runtime(home) / instance / "notes.txt"
    notes.write_text("written with 1.0.0")
    write_manifest(repo.work, version="2.0.0", **DEADLINES)
    repo.commit_and_tag(message="2.0.0")
    updated = bob.post(f"/api/dist/update/{APP}", json={"autoApprove": True})
    assert updated.status_code == 200, updated.text
    assert updated.json()["ok"] is True, updated.text
    assert updated.json()["backup"] is not None, updated.text  # their data, kept
    relaunched = bob.get(f"/api/instances/{instance}").json()
    assert relaunched["state"] == "started", relaunched  # else the rollback has none to stop
    notes.write_text("written with 2.0.0")

    rolled = bob.post(f"/api/dist/rollback/{APP}", json={})
    assert rolled.status_code == 200, rolled.text
    result = rolled.json()
    assert result["ok"] is True, result
    assert result["dataRestored"] is not None, result
    assert result["stopped"] == [instance]
    assert notes.read_text() == "written with 1.0.0"
    # nothing of theirs was put into the app's tree, where no instance of theirs looks
    app_dir = home / "scopes/users" / BOB / "apps" / APP
    assert sorted(p.name for p in app_dir.iterdir() if p.is_dir()) == []
    again = bob.get(f"/api/instances/{instance}").json()
    assert again["state"] == "started", again
    assert dist_shell.shell.lifecycle.get(instance).manifest.version == "1.0.0"
    # and the 2.0.0 data is in the backup the rollback took first
    taken = bob.post(f"/api/dist/restore/{APP}", json={"backup": result["backup"]})
    assert taken.status_code == 200, taken.text
    assert notes.read_text() == "written with 2.0.0"


def test_a_rollback_leaves_no_instance_folder_of_the_newer_version_behind(
    bob: httpx.Client, home: Path, served: tuple[GitRepo, str]
) -> None:
    """As the bootstrap admin's: the data is the old version's set, what a newer instance wrote
    since goes (it is in the backup the rollback takes first)."""
    repo, url = served
    installed_ok(bob, url, scope="user")
    first = launched(bob)
    (runtime(home) / first / "notes.txt").write_text("one")
    write_manifest(repo.work, version="2.0.0", **DEADLINES)
    repo.commit_and_tag(message="2.0.0")
    assert bob.post(f"/api/dist/update/{APP}", json={"autoApprove": True}).json()["ok"] is True
    second = launched(bob)
    (runtime(home) / second / "notes.txt").write_text("two")
    assert bob.post(f"/api/instances/{second}/stop").status_code == 200
    rolled = bob.post(f"/api/dist/rollback/{APP}", json={})
    assert rolled.json()["ok"] is True, rolled.text
    assert (runtime(home) / first / "notes.txt").read_text() == "one"
    assert not (runtime(home) / second / "notes.txt").exists()


def test_each_users_export_carries_their_own_data_only(
    api: httpx.Client,
    bob: httpx.Client,
    home: Path,
    make_app: MakeApp,
    served: tuple[GitRepo, str],
) -> None:
    repo, url = served
    installed_ok(api, f"local:{repo.work}", scope="user")  # the bootstrap admin's own copy
    alices = home / "scopes/users/default/apps" / APP / launched(api) / "notes.txt"
    alices.write_text("alice")
    installed_ok(bob, url, scope="user")
    (runtime(home) / launched(bob) / "notes.txt").write_text("bob")

    theirs = bob.get(f"/api/dist/export/{APP}")
    assert theirs.status_code == 200, theirs.text
    # an export names its data folders `<appId>-<n>`, whoever's they were: any user imports it
    assert data_of(theirs.content) == {f"{APP}-1/notes.txt": b"bob"}
    manifest = json.loads(members(theirs.content)[f"{ROOT}/export.json"])
    assert [k for k in manifest["files"] if k.startswith("data/")] == [f"data/{APP}-1/notes.txt"]
    mine = api.get(f"/api/dist/export/{APP}", params={"scope": "user"})
    assert mine.status_code == 200, mine.text
    assert data_of(mine.content) == {f"{APP}-1/notes.txt": b"alice"}


@pytest.fixture
def second(tmp_path: Path) -> Iterator[RunningShell]:
    system = tmp_path / "second-system"
    system.mkdir()
    shell = launch_shell(tmp_path / "second-home", system)
    yield shell
    shell.stop()


def test_a_members_import_into_a_fresh_shell_gives_their_instance_its_data(
    bob: httpx.Client, home: Path, served: tuple[GitRepo, str], second: RunningShell, tmp_path: Path
) -> None:
    _, url = served
    installed_ok(bob, url, scope="user")
    (runtime(home) / launched(bob) / "notes.txt").write_text("bob")
    archive = bob.get(f"/api/dist/export/{APP}")
    assert archive.status_code == 200, archive.text

    other_home = tmp_path / "second-home"
    with second.client(second.add_user(BOB), timeout=60) as there:
        answer = there.post(
            "/api/dist/import",
            params={"autoApprove": "1", "scope": "user"},
            content=archive.content,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["ok"] is True, answer.text
        instance = launched(there)
        assert instance == f"{APP}~{BOB}-1"
        assert (runtime(other_home) / instance / "notes.txt").read_text() == "bob"
    # none of it where the bootstrap admin's instances (or anyone else's) would look
    app_dir = other_home / "scopes/users" / BOB / "apps" / APP
    assert [p.name for p in app_dir.iterdir() if p.is_dir()] == []
    assert not (other_home / "scopes/global/apps" / APP).exists()


def sealed(files: dict[str, bytes]) -> bytes:
    """The archive with its file list recomputed, as an attacker would build one."""
    manifest = json.loads(files[f"{ROOT}/export.json"])
    body = {k: v for k, v in files.items() if k != f"{ROOT}/export.json"}
    manifest["files"] = {
        k.removeprefix(f"{ROOT}/"): hashlib.sha256(v).hexdigest() for k, v in body.items()
    }
    return repack({**body, f"{ROOT}/export.json": json.dumps(manifest).encode()})


def test_a_members_import_places_nothing_in_another_users_folders(
    dist_shell: RunningShell,
    api: httpx.Client,
    bob: httpx.Client,
    home: Path,
    served: tuple[GitRepo, str],
) -> None:
    """An archive naming another user's instance folders, or a path, is refused whole; one of
    the bootstrap admin's shape (`<appId>-<n>`) is the importer's own."""
    repo, url = served
    installed_ok(bob, url, scope="user")
    (runtime(home) / launched(bob) / "notes.txt").write_text("bob")
    files = members(bob.get(f"/api/dist/export/{APP}").content)
    assert bob.delete(f"/api/dist/uninstall/{APP}", params={"scope": "user"}).status_code == 200
    installed_ok(api, f"local:{repo.work}", scope="user")
    alices = home / "scopes/users/default/apps" / APP / launched(api) / "notes.txt"
    alices.write_text("alice")
    with dist_shell.client(dist_shell.add_user("carol"), timeout=60) as carol:
        installed_ok(carol, url, scope="user")
        carols = runtime(home, "carol") / launched(carol) / "notes.txt"
        carols.write_text("carol")

    body = f"{ROOT}/data/{APP}-1/notes.txt"
    for name in (
        f"{ROOT}/data/{APP}~carol-1/notes.txt",
        f"{ROOT}/data/{APP}~default-1/notes.txt",
        f"{ROOT}/data/{APP}-1/../../../../../default/apps/{APP}/{APP}-1/notes.txt",
        f"/{alices}",
        f"{ROOT}/data/{APP}-1/../{APP}~carol-1/notes.txt",
        # a number that fits as `<appId>-<n>` but not with bob's id added
        f"{ROOT}/data/{APP}-{'1' * (254 - len(APP))}/notes.txt",
    ):
        planted = {k: v for k, v in files.items() if k != body} | {name: b"planted"}
        answer = bob.post(
            "/api/dist/import",
            params={"autoApprove": "1", "scope": "user"},
            content=sealed(planted),
        )
        assert answer.status_code == 400, (name, answer.text)
        assert "nothing was changed" in answer.json()["error"]["message"], answer.text
        assert bob.get(f"/api/apps/{APP}").status_code == 404, name
    assert (alices.read_text(), carols.read_text()) == ("alice", "carol")

    # the real archive: bob's data back in bob's folder, nobody else's touched
    answer = bob.post(
        "/api/dist/import",
        params={"autoApprove": "1", "scope": "user"},
        content=sealed(files),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["ok"] is True, answer.text
    assert (runtime(home) / f"{APP}~{BOB}-1" / "notes.txt").read_text() == "bob"
    assert (alices.read_text(), carols.read_text()) == ("alice", "carol")
    assert not (home / "scopes/users/default/apps" / APP / f"{APP}-2").exists()
