"""Each user's own user scope through the real shell: installs, masking, git, admin-only scopes."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningShell, SseReader, StartShell, wait_for
from tests.integration.distribution.conftest import (
    SERVER,
    GitDaemon,
    GitRepo,
    git_daemon,  # noqa: F401 - a fixture these tests use
    git_repo,  # noqa: F401 - a fixture these tests use
    write_manifest,
)

pytestmark = pytest.mark.integration


def make_app(root: Path, app_id: str, **fields: Any) -> Path:
    app_dir = root / app_id
    app_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SERVER, app_dir / "server.py")
    write_manifest(app_dir, **fields)
    return app_dir


#: app folder -> the git:// URL it is served at (a member may not name a local: path)
_SERVED: dict[Path, str] = {}
_SERVER: list[Callable[[Path], str]] = []


@pytest.fixture(autouse=True)
def served(
    git_daemon: GitDaemon,  # noqa: F811
    git_repo: Callable[..., GitRepo],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    """Every app source of these tests is installed from `git daemon`, as a member would; the
    admin allows members' fetches to reach it (a member's fetch reaches no loopback host else)."""
    monkeypatch.setenv("ATRIUM_MEMBER_FETCH_HOSTS", "127.0.0.1")

    def serve(source: Path) -> str:
        base = git_daemon.base / f"s{len(_SERVED)}"
        repo = git_repo(source, base=base)
        return git_daemon.url(f"{base.name}/{repo.bare.name}")

    _SERVER.append(serve)
    yield
    _SERVER.clear()
    _SERVED.clear()


def install(client: httpx.Client, source: Path, scope: str) -> httpx.Response:
    if source not in _SERVED:
        _SERVED[source] = _SERVER[0](source)
    return client.post(
        "/api/dist/install",
        json={"ref": _SERVED[source], "scope": scope, "autoApprove": True},
        timeout=60,
    )


def visible(client: httpx.Client) -> dict[str, str]:
    """Visible app id → the scope it is seen from (problems left out)."""
    return {a["id"]: a["scope"] for a in client.get("/api/apps").json() if not a["problems"]}


def find_instance(client: httpx.Client, instance_id: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = next(
        (i for i in client.get("/api/instances").json() if i["instanceId"] == instance_id), None
    )
    return found


def git_log(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "log", "--format=%s"], cwd=repo, check=True, capture_output=True, text=True
    )
    return out.stdout.splitlines()


def test_a_users_install_into_their_user_scope_is_theirs_alone(
    start_shell: StartShell, home: Path, tmp_path: Path
) -> None:
    shell = start_shell()
    bob = shell.add_user("bob")
    with shell.client() as alice, shell.client(bob) as b:
        answer = install(b, make_app(tmp_path / "b", "com.example.bobs"), "user")
        assert answer.status_code == 200, answer.text
        assert answer.json()["ok"] is True
        assert visible(b).get("com.example.bobs") == "user"
        assert "com.example.bobs" not in visible(alice)
        assert alice.get("/api/apps/com.example.bobs").status_code == 404

        answer = install(alice, make_app(tmp_path / "a", "com.example.alices"), "user")
        assert answer.status_code == 200, answer.text
        assert visible(alice).get("com.example.alices") == "user"
        assert "com.example.alices" not in visible(b)

        # bob's scope is its own git repository, with its own commits
        bobs = home / "scopes/users/bob"
        assert (bobs / ".git").is_dir()
        assert (bobs / "apps/com.example.bobs/app.manifest.json").is_file()
        assert any("com.example.bobs" in line for line in git_log(bobs))
        assert not any(
            "com.example.bobs" in line for line in git_log(home / "scopes/users/default")
        )
        assert not any("com.example.alices" in line for line in git_log(bobs))

        # each sees their own user scope in /api/scopes
        b_scopes = {s["id"]: s for s in b.get("/api/scopes").json()}
        a_scopes = {s["id"]: s for s in alice.get("/api/scopes").json()}
        assert b_scopes["user"]["appsDir"] == str(bobs / "apps")
        assert a_scopes["user"]["appsDir"] == str(home / "scopes/users/default/apps")
        assert (b_scopes["user"]["appCount"], a_scopes["user"]["appCount"]) == (1, 1)

    # a restart keeps bob's scope and what it holds
    shell.stop()
    again = start_shell()
    with again.client() as alice, again.client(bob) as b:
        assert visible(b).get("com.example.bobs") == "user"
        assert "com.example.bobs" not in visible(alice)


def test_a_users_app_masks_a_global_app_for_that_user_only(
    shell: RunningShell, tmp_path: Path
) -> None:
    bob = shell.add_user("bob")
    with shell.client() as alice, shell.client(bob) as b:
        source = make_app(tmp_path / "g", "com.example.shared", version="1.0.0")
        assert install(alice, source, "global").status_code == 200
        assert visible(b)["com.example.shared"] == "global"
        mine = make_app(tmp_path / "b", "com.example.shared", version="2.0.0")
        answer = install(b, mine, "user")
        assert answer.status_code == 200, answer.text
        assert visible(b)["com.example.shared"] == "user"
        assert visible(alice)["com.example.shared"] == "global"
        bobs_view = b.get("/api/apps/com.example.shared").json()
        assert bobs_view["manifest"]["version"] == "2.0.0"
        assert alice.get("/api/apps/com.example.shared").json()["manifest"]["version"] == "1.0.0"


def test_a_member_cannot_change_the_global_scope(shell: RunningShell, tmp_path: Path) -> None:
    bob = shell.add_user("bob")
    source = make_app(tmp_path / "g", "com.example.global")
    with shell.client(bob) as b, shell.client() as alice:
        refused = install(b, source, "global")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        assert "com.example.global" not in visible(b)
        remote = b.put("/api/scopes/global/git-repo", json={"url": "https://git.example/r.git"})
        assert remote.status_code == 403
        assert remote.json()["error"]["code"] == "permission_denied"
        # their own user scope's remote is theirs to set
        own = b.put("/api/scopes/user/git-repo", json={"url": "https://git.example/bob.git"})
        assert own.status_code == 200, own.text
        scopes = {s["id"]: s for s in b.get("/api/scopes").json()}
        assert scopes["user"]["remote"] == "https://git.example/bob.git"
        assert {s["id"]: s for s in alice.get("/api/scopes").json()}["user"]["remote"] is None
        # an admin installs into global; the member may neither update nor uninstall it
        assert install(alice, source, "global").status_code == 200
        gone = b.delete("/api/dist/uninstall/com.example.global")
        assert gone.status_code == 403, gone.text
        assert b.post("/api/dist/update/com.example.global").status_code == 403
        assert "com.example.global" in visible(alice)


def test_the_toolchain_is_an_admins_to_change(shell: RunningShell) -> None:
    bob = shell.add_user("bob")
    git_path = shutil.which("git")
    with shell.client(bob) as b, shell.client() as alice:
        refused = b.put("/api/tools/git", json={"path": git_path})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert "git" not in {t["name"] for t in b.get("/api/tools").json()}
        assert alice.put("/api/tools/git", json={"path": git_path}).status_code == 200
        assert b.delete("/api/tools/git").status_code == 403
        assert "git" in {t["name"] for t in alice.get("/api/tools").json()}


def test_an_install_in_a_users_scope_is_announced_to_that_user_only(
    shell: RunningShell, tmp_path: Path
) -> None:
    bob = shell.add_user("bob")
    topics = {"topics": "app:installed"}
    with shell.client() as alice, shell.client(bob) as b:
        alices_events, bobs_events = SseReader(alice, params=topics), SseReader(b, params=topics)
        assert install(b, make_app(tmp_path / "b", "com.example.bobs"), "user").status_code == 200
        assert (
            install(alice, make_app(tmp_path / "a", "com.example.alices"), "user").status_code
            == 200
        )
        bobs_events.wait(1)
        alices_events.wait(1)
        assert [e.data["appId"] for e in bobs_events.of("app:installed")] == ["com.example.bobs"]
        assert [e.data["appId"] for e in alices_events.of("app:installed")] == [
            "com.example.alices"
        ]


def test_a_users_install_leaves_another_users_instances_running(
    shell: RunningShell, tmp_path: Path
) -> None:
    bob = shell.add_user("bob")
    with shell.client() as alice, shell.client(bob) as b:
        source = make_app(tmp_path / "g", "com.example.shared")
        assert install(alice, source, "global").status_code == 200
        created = alice.post("/api/instances", json={"appId": "com.example.shared"}, timeout=60)
        assert created.status_code in (200, 201), created.text
        instance_id = created.json()["instanceId"]
        assert alice.post(f"/api/instances/{instance_id}/resumed").status_code == 200
        before = find_instance(alice, instance_id)
        mine = make_app(tmp_path / "b", "com.example.shared", version="2.0.0")
        assert install(b, mine, "user").status_code == 200
        assert b.delete("/api/dist/uninstall/com.example.shared?scope=user").status_code == 200
        # the same instance, never stopped or taken over: bob's copy is bob's
        after = find_instance(alice, instance_id)
        assert after is not None, "alice's instance was removed by bob's install"
        assert before is not None
        assert (after["state"], after["pid"], after["owner"]) == (
            before["state"],
            before["pid"],
            "default",
        )


def watched_inodes() -> set[int]:
    """The inodes every inotify instance of this process watches (the shell runs in it): what
    the registry watcher really has armed, read from /proc."""
    found: set[int] = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if str(fd.readlink()) != "anon_inode:inotify":
                continue
            info = Path(f"/proc/self/fdinfo/{fd.name}").read_text()
        except OSError:
            continue  # closed meanwhile
        found.update(
            int(ino, 16) for ino in re.findall(r"^inotify wd:\S+ ino:([0-9a-f]+)", info, re.M)
        )
    return found


def app_version(client: httpx.Client, app_id: str) -> str | None:
    found = [a for a in client.get("/api/apps").json() if a["id"] == app_id and not a["problems"]]
    return found[0]["version"] if found else None


def edit_version(app_dir: Path, version: str) -> None:
    """A hand edit of an installed manifest (its file may be read-only, as installed)."""
    manifest = app_dir / "app.manifest.json"
    data = json.loads(manifest.read_text())
    data["version"] = version
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(data))


def test_hand_edits_in_a_user_scope_made_after_start_are_seen_at_once(
    shell: RunningShell, home: Path, tmp_path: Path
) -> None:
    bob = shell.add_user("bob")  # after start: the watcher found no scope of bob's then
    with shell.client(bob) as b:
        answer = install(b, make_app(tmp_path / "b", "com.example.later"), "user")
        assert answer.status_code == 200, answer.text
        assert app_version(b, "com.example.later") == "1.0.0"
        installed = home / "scopes/users/bob/apps/com.example.later"
        edit_version(installed, "1.0.1")
        wait_for(lambda: app_version(b, "com.example.later") == "1.0.1", "the hand edit")
        shutil.rmtree(installed)
        wait_for(lambda: app_version(b, "com.example.later") is None, "the hand removal")


def test_a_deleted_users_scope_is_no_longer_watched(
    shell: RunningShell, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bob = shell.add_user("bob")
    source = make_app(tmp_path / "b", "com.example.later")
    bobs_apps = home / "scopes/users/bob/apps"
    with caplog.at_level(logging.INFO), shell.client() as alice, shell.client(bob) as b:
        assert install(b, source, "user").status_code == 200
        wait_for(lambda: bobs_apps.stat().st_ino in watched_inodes(), "bob's scope watched")
        answer = alice.delete("/api/users/bob")
        assert answer.status_code == 200, answer.text
        aside = home / answer.json()["lostAndFound"] / "apps"
        assert (aside / "com.example.later").is_dir()
        wait_for(lambda: aside.stat().st_ino not in watched_inodes(), "the watch let go")
        assert "bob" not in shell.shell.registry.users()
        # a hand edit in lost+found is nobody's app
        edit_version(aside / "com.example.later", "9.9.9")

        # the id is free again: a new bob starts empty, with a scope of its own that is watched
        bob = shell.add_user("bob")
        with shell.client(bob) as new_bob:
            assert app_version(new_bob, "com.example.later") is None
            answer = install(new_bob, source, "user")
            assert answer.status_code == 200, answer.text
            assert app_version(new_bob, "com.example.later") == "1.0.0"
            edit_version(bobs_apps / "com.example.later", "1.0.2")
            wait_for(lambda: app_version(new_bob, "com.example.later") == "1.0.2", "the edit")
    assert (aside / "com.example.later").is_dir()  # nothing of the old bob's was touched
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not problems, caplog.text


def test_a_removed_users_egress_revoke_goes_with_them(shell: RunningShell, tmp_path: Path) -> None:
    """A user's revoke of their own copy's egress is theirs alone: once the account is removed
    it goes too, so an account given the same id later is granted what it approves (the new
    bob's approved copy stayed revoked, by the removed bob's revoke)."""
    app = "com.example.reaching"
    source = make_app(tmp_path / "b", app, network={"egress": True})
    with shell.client() as alice:
        for first in (True, False):
            with shell.client(shell.add_user("bob")) as bob:
                answer = install(bob, source, "user")
                assert answer.status_code == 200, answer.text
                assert answer.json()["ok"] is True, answer.text
                egress = bob.get(f"/api/apps/{app}").json()["network"]["egress"]
                assert (egress["granted"], egress["revoked"]) == (True, False), (first, egress)
                if first:
                    assert bob.delete(f"/api/apps/{app}/egress").status_code == 200
            assert alice.delete("/api/users/bob").status_code == 200
