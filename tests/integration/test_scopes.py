"""Scope repositories and the scopes API, with real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from atrium.git import read_head
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


def test_a_restart_puts_back_the_scope_repositorys_identity_changed_by_hand(
    start_shell: StartShell, home: Path
) -> None:
    """A fresh repository's config is written by the shell itself; on a restart only the values
    that differ are set again (git reads them in one run): both must leave what git says."""
    start_shell().stop()
    repo = home / "scopes/global"
    for key, value in (("user.name", "Atrium"), ("user.email", "atrium@localhost")):
        assert git(repo, "config", key) == value
    assert git(repo, "config", "--type=bool", "commit.gpgsign") == "false"
    git(repo, "config", "user.name", "Someone")
    git(repo, "config", "commit.gpgsign", "true")
    git(repo, "config", "--unset", "user.email")
    start_shell().stop()
    assert git(repo, "config", "--local", "--get-all", "user.name") == "Atrium"
    assert git(repo, "config", "--local", "--get-all", "user.email") == "atrium@localhost"
    assert git(repo, "config", "--local", "--get-all", "commit.gpgsign") == "false"
    assert git(repo, "log", "--format=%s") == "baseline: Atrium scope"


def test_head_read_from_the_files_is_what_git_says_or_left_to_git(tmp_path: Path) -> None:
    """`read_head` answers only where the files say it plainly, and then as `rev-parse`."""
    repo = tmp_path / "repo"
    git(tmp_path, "init", "--quiet", "--initial-branch=main", str(repo))
    assert read_head(repo / ".git") is None  # unborn: git is asked
    (repo / "f").write_text("1\n")
    git(repo, "add", "f")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "1")
    assert read_head(repo / ".git") == git(repo, "rev-parse", "--verify", "HEAD")
    git(repo, "checkout", "--quiet", "--detach")
    assert read_head(repo / ".git") == git(repo, "rev-parse", "--verify", "HEAD")
    git(repo, "checkout", "--quiet", "main")
    git(repo, "pack-refs", "--all")  # no loose ref file any more: git is asked
    assert not (repo / ".git/refs/heads/main").exists()
    assert read_head(repo / ".git") is None
    (repo / ".git/HEAD").write_text("ref: refs/heads/../../config\n")
    assert read_head(repo / ".git") is None


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
