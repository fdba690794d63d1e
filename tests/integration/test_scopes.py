"""Scope repositories and the scopes API, with real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningShell, StartShell

pytestmark = pytest.mark.integration


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_scopes_are_listed_with_paths_counts_and_remotes(
    shell: RunningShell, api: httpx.Client, home: Path, system_apps: Path
) -> None:
    scopes = api.get("/api/scopes").json()
    assert [s["id"] for s in scopes] == ["system", "global", "user"]
    system, global_, user = scopes
    assert system == {
        "id": "system",
        "priority": 0,
        "mutable": False,
        "appsDir": str(system_apps),
        "dataDir": str(home / "scopes/system/apps"),
        "appCount": 3,
        "remote": None,
    }
    assert global_["appsDir"] == str(home / "scopes/global/apps")
    assert (global_["priority"], global_["mutable"], global_["appCount"]) == (1, True, 0)
    assert user["appsDir"] == str(home / "scopes/users/default/apps")
    assert user["priority"] == 2


@pytest.mark.parametrize("scope_dir", ["scopes/global", "scopes/users/default"])
def test_a_mutable_scope_is_a_git_repository_with_a_committed_baseline(
    shell: RunningShell, home: Path, scope_dir: str
) -> None:
    repo = home / scope_dir
    assert git(repo, "log", "--format=%s") == "baseline: Atrium scope"
    assert ".os-scope" in git(repo, "ls-files").splitlines()
    assert git(repo, "config", "user.name") == "Atrium"
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "remote") == ""


def test_setting_a_remote_stores_it_without_pushing(
    api: httpx.Client, home: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(bare)], check=True)
    response = api.put("/api/scopes/global/git-repo", json={"url": f"file://{bare}"})
    assert response.json() == {"scope": "global", "url": f"file://{bare}"}
    assert git(home / "scopes/global", "remote", "get-url", "origin") == f"file://{bare}"
    assert git(bare, "for-each-ref") == ""
    again = api.put("/api/scopes/global/git-repo", json={"url": "https://git.example/u/r.git"})
    assert again.status_code == 200
    scopes = {s["id"]: s for s in api.get("/api/scopes").json()}
    assert scopes["global"]["remote"] == "https://git.example/u/r.git"
    assert scopes["user"]["remote"] is None


def test_the_user_scope_remote_is_set_independently(api: httpx.Client, home: Path) -> None:
    assert api.put("/api/scopes/user/git-repo", json={"url": "git@host.example:me/apps.git"})
    assert git(home / "scopes/users/default", "remote", "get-url", "origin") == (
        "git@host.example:me/apps.git"
    )
    assert git(home / "scopes/global", "remote") == ""


@pytest.mark.parametrize(
    ("scope", "body", "status", "code"),
    [
        ("system", {"url": "https://x.example/r.git"}, 403, "system_scope_immutable"),
        ("galaxy", {"url": "https://x.example/r.git"}, 400, "bad_request"),
        ("global", {"url": "--upload-pack=touch /tmp/pwned"}, 400, "bad_request"),
        ("global", {"url": "has space"}, 400, "bad_request"),
        ("global", {"url": ""}, 400, "bad_request"),
        ("global", {"url": 42}, 400, "bad_request"),
        ("global", {}, 400, "bad_request"),
        ("global", {"url": "https://x.example/r.git", "extra": 1}, 400, "bad_request"),
    ],
)
def test_bad_remote_requests_are_refused_and_change_nothing(
    api: httpx.Client, home: Path, scope: str, body: dict[str, object], status: int, code: str
) -> None:
    response = api.put(f"/api/scopes/{scope}/git-repo", json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert git(home / "scopes/global", "remote") == ""


def test_malformed_json_is_a_clear_400(api: httpx.Client) -> None:
    response = api.put(
        "/api/scopes/global/git-repo",
        content=b"{url:",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_a_stale_git_lock_is_recovered_at_start(start_shell: StartShell, home: Path) -> None:
    first = start_shell()
    first.stop()
    lock = home / "scopes/global/.git/index.lock"
    lock.write_text("")
    second = start_shell()
    assert not lock.exists()
    with second.client() as api:
        assert api.put(
            "/api/scopes/global/git-repo", json={"url": "https://a.example/r"}
        ).is_success
    assert git(home / "scopes/global", "log", "--format=%s") == "baseline: Atrium scope"


def test_an_interrupted_init_is_completed_at_start(start_shell: StartShell, home: Path) -> None:
    repo = home / "scopes/global"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    start_shell()
    assert git(repo, "log", "--format=%s") == "baseline: Atrium scope"


def test_another_user_id_moves_the_user_scope(start_shell: StartShell, home: Path) -> None:
    shell = start_shell(user="alice")
    with shell.client() as api:
        user = api.get("/api/scopes").json()[2]
    assert user["appsDir"] == str(home / "scopes/users/alice/apps")
    assert (home / "scopes/users/alice/.os-scope").is_file()
    assert not (home / "scopes/users/default").exists()
